// Decode attention on CPU: each query attends to a prefix shared by the whole group (read once
// for all of its queries) and to its own row's keys, with one softmax over both (cascade
// attention, as FlashInfer's, fused: no score matrices leave the core).
//
// Shapes (fp32, contiguous): q [N, H, D] real queries (already scaled by 1/sqrt(D) by the caller);
// shared K transposed kt [KVH, D, P] and V vs [KVH, P, D]; the rows' own K in tiles of 16 keys
// kmt [B, KVH, S/16, D, 16] and V vm [B, KVH, S, D] (the decode mirror; S a multiple of 16);
// qb [N] each query's row b;
// qlen [N] how many of its row's keys it sees (causal). Query heads h*G .. h*G+G-1
// (G = H / KVH) read KV head h. out [N, H, D].
//
// Both parts run attend_block: keys in chunks of one vector width, scores by broadcasting query
// elements against rows of the transposed K (no horizontal sums), vectorized exponentials, online
// softmax, V accumulated in registers. Phase 1, the shared prefix: tasks (KV head, block of QB
// query heads of any queries). Phase 2, per (KV head, block of QB query heads of consecutive
// tokens in one row: a span's tokens fill blocks across their G heads): the row's own keys,
// each query up to its own length, merged with phase 1's partial. No block computes a padded
// query head.
// One source, one build per instruction set (decode_attn.py), like quant_q8_cpu.cpp.
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "avx_math.h"

namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
using VecF = __m512;
using Mask = __mmask16;
inline VecF load(const float* p) { return _mm512_loadu_ps(p); }
inline VecF load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(static_cast<Mask>((1u << n) - 1), p); }
inline void store(float* p, VecF v) { _mm512_storeu_ps(p, v); }
inline VecF bcast(float v) { return _mm512_set1_ps(v); }
inline VecF zero() { return _mm512_setzero_ps(); }
inline VecF fma(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
inline VecF mul(VecF a, VecF b) { return _mm512_mul_ps(a, b); }
inline VecF sub(VecF a, VecF b) { return _mm512_sub_ps(a, b); }
inline float hmax(VecF v) { return _mm512_reduce_max_ps(v); }
inline float hsum(VecF v) { return _mm512_reduce_add_ps(v); }
inline VecF tail_neg_inf(VecF v, int n) {  // lanes >= n set to -inf
  return _mm512_mask_mov_ps(bcast(-std::numeric_limits<float>::infinity()),
                            static_cast<Mask>((1u << n) - 1), v);
}
// exp(x) for x <= 0 (and -inf): 2^k * p(r), x = k ln2 + r, |r| <= ln2 / 2, degree-6 polynomial.
inline VecF vexp(VecF x) {
  x = _mm512_max_ps(x, bcast(-87.f));
  const VecF k = _mm512_roundscale_ps(mul(x, bcast(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
  VecF r = fma(k, bcast(-0.693145752f), x);
  r = fma(k, bcast(-1.42860677e-6f), r);
  VecF p = bcast(1.f / 720);
  p = fma(p, r, bcast(1.f / 120));
  p = fma(p, r, bcast(1.f / 24));
  p = fma(p, r, bcast(1.f / 6));
  p = fma(p, r, bcast(0.5f));
  p = fma(p, r, bcast(1.f));
  p = fma(p, r, bcast(1.f));
  return _mm512_scalef_ps(p, k);
}
#else
constexpr int kLanes = 8;
using VecF = __m256;
inline VecF load(const float* p) { return _mm256_loadu_ps(p); }
inline __m256i lanes_below(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline VecF load_n(const float* p, int n) { return _mm256_maskload_ps(p, lanes_below(n)); }
inline void store(float* p, VecF v) { _mm256_storeu_ps(p, v); }
inline VecF bcast(float v) { return _mm256_set1_ps(v); }
inline VecF zero() { return _mm256_setzero_ps(); }
inline VecF fma(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }
inline VecF mul(VecF a, VecF b) { return _mm256_mul_ps(a, b); }
inline VecF sub(VecF a, VecF b) { return _mm256_sub_ps(a, b); }
inline float hmax(VecF v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
inline float hsum(VecF v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline VecF tail_neg_inf(VecF v, int n) {
  return _mm256_blendv_ps(bcast(-std::numeric_limits<float>::infinity()), v,
                          _mm256_castsi256_ps(lanes_below(n)));
}
inline VecF vexp(VecF x) { return gs::exp8(x); }
#endif

struct Dims {
  int64_t N, H, KVH, G, D, P, S;
};

// Online-softmax attention of QB query vectors qh[0..QB) over the first lens[i] keys each, given
// transposed (kt[e * kstride + c], element e of key c) with values vs [keys, D]. Keys in chunks of
// one vector width: scores by broadcasting query elements against rows of the transposed K (no
// horizontal sums), exponentials vectorized, V accumulated in registers. Returns per query the
// running max m, the sum of exponentials l and the unnormalized output in acc [QB, D].
//
// Each query's result depends only on its own vector and length: its chunks, lanes and sums are
// the same whichever queries share its block (a key row is loaded once for all of them), so
// blocks can mix queries of several tokens (different lengths) with no padded lanes.
constexpr int64_t kTile = 16;  // keys per tile of the mirror's K layout

// Element e of keys c .. c + kLanes - 1: transposed K [D, kstride], or (kTiled) tiles of 16 keys
// [nkeys / 16, D, 16] (one tile is one contiguous read).
template <bool kTiled>
inline const float* key_row(const float* kt, int64_t kstride, int64_t D, int64_t e, int64_t c) {
  if constexpr (kTiled) return kt + (c / kTile) * D * kTile + e * kTile + c % kTile;
  return kt + e * kstride + c;
}

// One chunk of keys c0 .. c0 + n for every query of attend_block: kFull, every query sees all
// kLanes keys of it (the loop over a block's common keys); otherwise query i sees lens[i] - c0
// of them (none: its state is left as it is).
template <int DV, int QB, bool kTiled, bool kFull>
[[gnu::always_inline]] inline void attend_chunk(
    VecF (&acc)[QB][DV], float (&m)[QB], float (&l)[QB], const float* const* qh,
    const int64_t* lens, const float* kt, int64_t kstride, const float* vs, int64_t D,
    int64_t c0, int n) {
  alignas(64) float p[QB][kLanes];
  int ni[QB];  // keys of this chunk query i sees
  int common = kLanes;  // keys of it every query sees
  if constexpr (!kFull) {
    for (int i = 0; i < QB; ++i) {
      ni[i] = static_cast<int>(std::clamp<int64_t>(lens[i] - c0, 0, kLanes));
      common = std::min(common, ni[i]);
    }
  }
  VecF s[QB];
  for (int i = 0; i < QB; ++i) s[i] = zero();
  for (int64_t e = 0; e < D; ++e) {
    const float* kr = key_row<kTiled>(kt, kstride, D, e, c0);
    const VecF krow = kFull || n == kLanes ? load(kr) : load_n(kr, n);
    for (int i = 0; i < QB; ++i) s[i] = fma(bcast(qh[i][e]), krow, s[i]);
  }
  for (int i = 0; i < QB; ++i) {
    if constexpr (!kFull) {
      if (ni[i] == 0) continue;  // past its keys
      if (ni[i] < kLanes) s[i] = tail_neg_inf(s[i], ni[i]);
    }
    const float m_new = std::max(m[i], hmax(s[i]));
    const float corr = std::exp(m[i] - m_new);
    const VecF e = vexp(sub(s[i], bcast(m_new)));
    l[i] = l[i] * corr + hsum(e);
    m[i] = m_new;
    store(p[i], e);
    const VecF cv = bcast(corr);
    for (int v = 0; v < DV; ++v) acc[i][v] = mul(acc[i][v], cv);
  }
  for (int c = 0; c < common; ++c) {
    const float* vrow = vs + (c0 + c) * D;
    VecF vv[DV];
    for (int v = 0; v < DV; ++v) vv[v] = load(vrow + v * kLanes);
    for (int i = 0; i < QB; ++i) {
      const VecF pc = bcast(p[i][c]);
      for (int v = 0; v < DV; ++v) acc[i][v] = fma(pc, vv[v], acc[i][v]);
    }
  }
  if constexpr (!kFull) {
    for (int c = common; c < n; ++c) {  // queries of unequal lengths: each up to its own
      const float* vrow = vs + (c0 + c) * D;
      for (int i = 0; i < QB; ++i) {
        if (c >= ni[i]) continue;
        const VecF pc = bcast(p[i][c]);
        for (int v = 0; v < DV; ++v) acc[i][v] = fma(pc, load(vrow + v * kLanes), acc[i][v]);
      }
    }
  }
}

template <int DV, int QB, bool kTiled>
void attend_block(const float* const* qh, const int64_t* lens, const float* kt, int64_t kstride,
                  const float* vs, int64_t D, float* m_out, float* l_out, float* acc_out) {
  VecF acc[QB][DV];
  float m[QB], l[QB];
  int64_t nkeys = 0, nmin = lens[0];
  for (int i = 0; i < QB; ++i) {
    m[i] = -std::numeric_limits<float>::infinity(), l[i] = 0.f;
    for (int v = 0; v < DV; ++v) acc[i][v] = zero();
    nkeys = std::max(nkeys, lens[i]), nmin = std::min(nmin, lens[i]);
  }
  int64_t c0 = 0;
  for (; c0 + kLanes <= nmin; c0 += kLanes)
    attend_chunk<DV, QB, kTiled, true>(acc, m, l, qh, lens, kt, kstride, vs, D, c0, kLanes);
  for (; c0 < nkeys; c0 += kLanes)
    attend_chunk<DV, QB, kTiled, false>(acc, m, l, qh, lens, kt, kstride, vs, D, c0,
                                        static_cast<int>(std::min<int64_t>(kLanes, nkeys - c0)));
  for (int i = 0; i < QB; ++i) {
    m_out[i] = m[i], l_out[i] = l[i];
    for (int v = 0; v < DV; ++v) store(acc_out + i * D + v * kLanes, acc[i][v]);
  }
}

// attend_block for nq <= QB queries: the build of exactly nq (no padded query computed).
template <int DV, int QB, bool kTiled = false>
void attend(int nq, const float* const* qh, const int64_t* lens, const float* kt,
            int64_t kstride, const float* vs, int64_t D, float* m_out, float* l_out,
            float* acc_out) {
  if constexpr (QB > 1) {
    if (nq < QB) {
      attend<DV, QB - 1, kTiled>(nq, qh, lens, kt, kstride, vs, D, m_out, l_out, acc_out);
      return;
    }
  }
  attend_block<DV, QB, kTiled>(qh, lens, kt, kstride, vs, D, m_out, l_out, acc_out);
}

// Phase 1 for nq <= QB query heads (flat indices j0.. of KV head h: query j / G, head
// h*G + j % G).
template <int DV, int QB>
void shared_block(const Dims& dm, const float* q, const float* kt, const float* vs, int64_t h,
                  int64_t j0, int nq, float* pm, float* pl, float* pacc) {
  const float* qh[QB];
  int64_t lens[QB];
  for (int i = 0; i < nq; ++i) {
    const int64_t j = j0 + i;
    qh[i] = q + ((j / dm.G) * dm.H + h * dm.G + j % dm.G) * dm.D, lens[i] = dm.P;
  }
  attend<DV, QB>(nq, qh, lens, kt + h * dm.D * dm.P, dm.P, vs + h * dm.P * dm.D, dm.D, pm + j0,
                 pl + j0, pacc + j0 * dm.D);
}

// Phase 2's unit of work: query heads j0 .. j0 + nq of KV head h over the tokens n0 .. of one
// run of consecutive tokens in the same mirror row (flat index j: token n0 + j / G, head
// h*G + j % G). Blocks cross token boundaries, so G = 3 fills blocks of 4.
struct OwnTask {
  int64_t n0, h, j0;
  int nq;
};

// Phase 2 for one task: its queries' own keys (the mirror's tiled K, the first qlen[n] of S),
// merged with the shared partial; writes out.
template <int DV, int QB>
void own_and_merge(const Dims& dm, const float* q, const float* kmt, const float* vm,
                   const int64_t* qb, const int64_t* qlen, const float* pm, const float* pl,
                   const float* pacc, const OwnTask& t, float* out) {
  const int64_t D = dm.D, row = qb[t.n0] * dm.KVH + t.h;
  const float* kt = kmt + row * D * dm.S;  // S / 16 tiles of D * 16
  const float* vr = vm + row * dm.S * D;
  float m[QB], l[QB];
  alignas(64) float acc[QB * 128];
  const float* qh[QB];
  int64_t lens[QB], tok[QB], head[QB];
  for (int i = 0; i < t.nq; ++i) {
    tok[i] = t.n0 + (t.j0 + i) / dm.G, head[i] = t.h * dm.G + (t.j0 + i) % dm.G;
    qh[i] = q + (tok[i] * dm.H + head[i]) * D, lens[i] = qlen[tok[i]];
  }
  attend<DV, QB, true>(t.nq, qh, lens, kt, dm.S, vr, D, m, l, acc);
  for (int i = 0; i < t.nq; ++i) {
    const int64_t j = tok[i] * dm.G + head[i] - t.h * dm.G;  // its index in phase 1's partials
    float lo = l[i], cs = 0.f, co = 1.f;
    if (dm.P) {  // one softmax over both parts
      const float mx = std::max(pm[j], m[i]);
      cs = std::exp(pm[j] - mx), co = std::exp(m[i] - mx);
      lo = pl[j] * cs + l[i] * co;
    }
    const VecF inv = bcast(1.f / lo), vcs = bcast(cs), vco = bcast(co);
    for (int v = 0; v < DV; ++v) {
      VecF a = mul(load(acc + i * D + v * kLanes), vco);
      if (dm.P) a = fma(load(pacc + j * D + v * kLanes), vcs, a);
      store(out + (tok[i] * dm.H + head[i]) * D + v * kLanes, mul(a, inv));
    }
  }
}

// Phase 2's tasks: per run of consecutive tokens in one row, each seeing at most one vector
// width of keys more than the one before (a span's tokens: a block's keys are its longest
// query's), per KV head, blocks of QB of the run's tokens x G query heads.
std::vector<OwnTask> own_tasks(const Dims& dm, const int64_t* qb, const int64_t* qlen,
                               int QB) {
  std::vector<OwnTask> tasks;
  for (int64_t n0 = 0, n1; n0 < dm.N; n0 = n1) {
    for (n1 = n0 + 1; n1 < dm.N && qb[n1] == qb[n0] && qlen[n1] >= qlen[n1 - 1] &&
                      qlen[n1] - qlen[n1 - 1] <= kLanes; ++n1) {}
    const int64_t heads = (n1 - n0) * dm.G;
    for (int64_t h = 0; h < dm.KVH; ++h)
      for (int64_t j0 = 0; j0 < heads; j0 += QB)
        tasks.push_back({n0, h, j0, static_cast<int>(std::min<int64_t>(QB, heads - j0))});
  }
  return tasks;
}

template <int DV>
void run(const Dims& dm, const float* q, const float* kt, const float* vs, const float* kmt,
         const float* vm, const int64_t* qb, const int64_t* qlen, float* out, int threads) {
  constexpr int QB = DV * kLanes <= 64 ? 4 : 2;  // query heads per task (registers)
  const int64_t per_head = dm.N * dm.G, blocks = (per_head + QB - 1) / QB;
  std::vector<float> pm(dm.P ? dm.KVH * per_head : 0), pl(pm.size());
  std::vector<float> pacc(dm.P ? dm.KVH * per_head * dm.D : 0);
  if (dm.P) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t task = 0; task < dm.KVH * blocks; ++task) {
      const int64_t h = task / blocks, j0 = (task % blocks) * QB;
      const int nq = static_cast<int>(std::min<int64_t>(QB, per_head - j0));
      shared_block<DV, QB>(dm, q, kt, vs, h, j0, nq, pm.data() + h * per_head,
                           pl.data() + h * per_head, pacc.data() + h * per_head * dm.D);
    }
  }
  const std::vector<OwnTask> tasks = own_tasks(dm, qb, qlen, QB);
  const int64_t ntasks = static_cast<int64_t>(tasks.size());
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < ntasks; ++i) {
    const int64_t h = tasks[i].h;
    own_and_merge<DV, QB>(dm, q, kmt, vm, qb, qlen, pm.data() + h * per_head,
                          pl.data() + h * per_head, pacc.data() + h * per_head * dm.D, tasks[i],
                          out);
  }
}

}  // namespace

extern "C" {

// Returns 0, -1 when head_dim D is not one this build handles (64 or 128), -2 when S is not a
// whole number of tiles.
int gs_decode_attention(const float* q, const float* kt, const float* vs, int64_t P,
                        const float* kmt, const float* vm, int64_t S, const int64_t* qb,
                        const int64_t* qlen, int64_t N, int64_t H, int64_t KVH, int64_t D,
                        float* out, int threads) {
  if (S % kTile) return -2;
  const Dims dm{N, H, KVH, H / KVH, D, P, S};
  if (D == 64) {
    run<64 / kLanes>(dm, q, kt, vs, kmt, vm, qb, qlen, out, threads);
  } else if (D == 128) {
    run<128 / kLanes>(dm, q, kt, vs, kmt, vm, qb, qlen, out, threads);
  } else {
    return -1;
  }
  return 0;
}

}  // extern "C"
