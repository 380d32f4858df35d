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
// query heads of any queries). Phase 2, per (query, KV head): the row's own keys for its G heads,
// merged with phase 1's partial.
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

// Online-softmax attention of up to QB query vectors qh[0..nq) over `nkeys` keys given transposed
// (kt[e * kstride + c], element e of key c) with values vs [nkeys, D]. Keys in chunks of one
// vector width: scores by broadcasting query elements against rows of the transposed K (no
// horizontal sums), exponentials vectorized, V accumulated in registers. Returns per query the
// running max m, the sum of exponentials l and the unnormalized output in acc [nq, D].
constexpr int64_t kTile = 16;  // keys per tile of the mirror's K layout

// Element e of keys c .. c + kLanes - 1: transposed K [D, kstride], or (kTiled) tiles of 16 keys
// [nkeys / 16, D, 16] (one tile is one contiguous read).
template <bool kTiled>
inline const float* key_row(const float* kt, int64_t kstride, int64_t D, int64_t e, int64_t c) {
  if constexpr (kTiled) return kt + (c / kTile) * D * kTile + e * kTile + c % kTile;
  return kt + e * kstride + c;
}

template <int DV, int QB, bool kTiled = false>
void attend_block(const float* const* qh, int nq, const float* kt, int64_t kstride,
                  const float* vs, int64_t nkeys, int64_t D, float* m_out, float* l_out,
                  float* acc_out) {
  VecF acc[QB][DV];
  float m[QB], l[QB];
  for (int i = 0; i < QB; ++i) {
    m[i] = -std::numeric_limits<float>::infinity(), l[i] = 0.f;
    for (int v = 0; v < DV; ++v) acc[i][v] = zero();
  }
  alignas(64) float p[QB][kLanes];
  for (int64_t c0 = 0; c0 < nkeys; c0 += kLanes) {
    const int n = static_cast<int>(std::min<int64_t>(kLanes, nkeys - c0));
    VecF s[QB];
    for (int i = 0; i < QB; ++i) s[i] = zero();
    for (int64_t e = 0; e < D; ++e) {
      const float* kr = key_row<kTiled>(kt, kstride, D, e, c0);
      const VecF krow = n == kLanes ? load(kr) : load_n(kr, n);
      for (int i = 0; i < QB; ++i) s[i] = fma(bcast(qh[i][e]), krow, s[i]);
    }
    for (int i = 0; i < QB; ++i) {
      if (n < kLanes) s[i] = tail_neg_inf(s[i], n);
      const float m_new = std::max(m[i], hmax(s[i]));
      const float corr = std::exp(m[i] - m_new);
      const VecF e = vexp(sub(s[i], bcast(m_new)));
      l[i] = l[i] * corr + hsum(e);
      m[i] = m_new;
      store(p[i], e);
      const VecF cv = bcast(corr);
      for (int v = 0; v < DV; ++v) acc[i][v] = mul(acc[i][v], cv);
    }
    for (int c = 0; c < n; ++c) {
      const float* vrow = vs + (c0 + c) * D;
      VecF vv[DV];
      for (int v = 0; v < DV; ++v) vv[v] = load(vrow + v * kLanes);
      for (int i = 0; i < QB; ++i) {
        const VecF pc = bcast(p[i][c]);
        for (int v = 0; v < DV; ++v) acc[i][v] = fma(pc, vv[v], acc[i][v]);
      }
    }
  }
  for (int i = 0; i < nq; ++i) {
    m_out[i] = m[i], l_out[i] = l[i];
    for (int v = 0; v < DV; ++v) store(acc_out + i * D + v * kLanes, acc[i][v]);
  }
}

// Phase 1 for QB query heads (flat indices j0.. of KV head h: query j / G, head h*G + j % G).
template <int DV, int QB>
void shared_block(const Dims& dm, const float* q, const float* kt, const float* vs, int64_t h,
                  int64_t j0, int nq, float* pm, float* pl, float* pacc) {
  const float* qh[QB];
  for (int i = 0; i < QB; ++i) {
    const int64_t j = j0 + std::min(i, nq - 1);
    qh[i] = q + ((j / dm.G) * dm.H + h * dm.G + j % dm.G) * dm.D;
  }
  attend_block<DV, QB>(qh, nq, kt + h * dm.D * dm.P, dm.P, vs + h * dm.P * dm.D, dm.P, dm.D,
                       pm + j0, pl + j0, pacc + j0 * dm.D);
}

// Phase 2 for query n, KV head h: its row's own keys (the mirror's tiled K, the first qlen[n] of
// S), merged with the shared partial; writes out.
template <int DV, int QB>
void own_and_merge(const Dims& dm, const float* q, const float* kmt, const float* vm,
                   const int64_t* qb, const int64_t* qlen, const float* pm, const float* pl,
                   const float* pacc, int64_t n, int64_t h, float* out) {
  const int64_t D = dm.D, len = qlen[n];
  const float* kt = kmt + (qb[n] * dm.KVH + h) * D * dm.S;  // S / 16 tiles of D * 16
  const float* vr = vm + (qb[n] * dm.KVH + h) * dm.S * D;
  float m[QB], l[QB];
  alignas(64) float acc[QB * 128];
  for (int64_t g0 = 0; g0 < dm.G; g0 += QB) {
    const int nq = static_cast<int>(std::min<int64_t>(QB, dm.G - g0));
    const float* qh[QB];
    for (int i = 0; i < QB; ++i) qh[i] = q + (n * dm.H + h * dm.G + g0 + std::min(i, nq - 1)) * D;
    attend_block<DV, QB, true>(qh, nq, kt, dm.S, vr, len, D, m, l, acc);
    for (int i = 0; i < nq; ++i) {
      const int64_t g = g0 + i, head = h * dm.G + g, j = n * dm.G + g;
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
        store(out + (n * dm.H + head) * D + v * kLanes, mul(a, inv));
      }
    }
  }
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
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t task = 0; task < dm.N * dm.KVH; ++task) {
    const int64_t n = task / dm.KVH, h = task % dm.KVH;
    own_and_merge<DV, QB>(dm, q, kmt, vm, qb, qlen, pm.data() + h * per_head,
                          pl.data() + h * per_head, pacc.data() + h * per_head * dm.D, n, h, out);
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
