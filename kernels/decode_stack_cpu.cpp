// The whole decoder stack of a Llama-family model for one decode step, in one call.
//
// A decode step at a few rows is dominated on a CPU not by its arithmetic but by the number of
// operations: ~25 small torch ops per layer (norms, rotary, K/V writes, the mirror update, SiLU,
// residual adds, slicing) at several microseconds each, for 30 layers. Here every layer runs
//   h += o_proj(attn(rope(qkv_proj(rmsnorm(h)))));  h += down(silu(gate) * up)(rmsnorm(h))
// with the quantized matmuls (quant_q8_cpu.cpp) and the decode attention (decode_attn_cpu.cpp)
// called through function pointers: those are built per instruction set and picked at run time;
// this file only glues them (its loops are small and built for AVX2).
//
// Every new token t (row qb[t] of the decode mirror, mirror position qpos[t], pool slot slots[t])
// writes its K/V to the pool and to the mirror, then attends to the shared prefix (P keys) and to
// its row's first qlen[t] mirror keys. fp32 throughout; h [T, E] is updated in place.
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "avx_math.h"

extern "C" {
// The GEMMs of quant_q8_cpu.cpp: y + its first column, and the row stride ldy of the output.
typedef void (*GemmQ8_0)(const float*, int64_t, int64_t, const int8_t*, const float*, int64_t,
                         float*, int64_t, int, int);
typedef void (*GemmQ4_1)(const float*, int64_t, int64_t, const uint8_t*, const float*,
                         const float*, int64_t, float*, int64_t, int, int);
typedef GemmQ4_1 GemmQ6_K;  // the same arguments (m: the int8 scales)
typedef int (*AttnFn)(const float*, const float*, const float*, int64_t, const float*,
                      const float*, int64_t, const int64_t*, const int64_t*, int64_t, int64_t,
                      int64_t, int64_t, float*, int);

struct GsSegment {  // a PackedWeight (quant_q8.py): n consecutive output rows of a linear
  const void* qs;
  const float* d;
  const float* m;
  int64_t n;
  int32_t kind, levels;  // kind: 0 Q8_0, 1 Q4_1, 2 Q6_K, 3 Q5_1, 4 Q4_K (quant_q8.py: KINDS)
};

struct GsLinear {  // row segments in row order (n: their sum) and an optional bias [n]
  const GsSegment* segs;
  int64_t n_segs;
  const float* bias;
  int64_t n, k;
};

struct GsHead {  // the final RMSNorm and the LM head, applied to the logit rows after the layers
  const float* norm;     // [E]
  GsLinear lin;          // [V, E], no bias
  const int64_t* rows;   // [L] rows of h whose logits are wanted
  int64_t n_rows;
  float* logits;         // [L, V] out
};

struct GsLayer {
  const float* norm1;
  const float* norm2;
  GsLinear qkv, o, gate_up, down;
};

struct GsStep {
  int64_t tokens, hidden, heads, kv_heads, head_dim, inter, layers, S, P;
  float eps;
  int32_t threads;
  const float* cos;  // [T, D] (the two halves equal, as rope_cos_sin gives them)
  const float* sin;
  const int64_t* slots;  // [T] pool slot of each new token
  const int64_t* qb;     // [T] its mirror row
  const int64_t* qpos;   // [T] its mirror position
  const int64_t* qlen;   // [T] mirror keys it sees (qpos + 1)
  float* const* pool_k;  // [layers] -> [slots, KVH, D]
  float* const* pool_v;
  float* const* mirror_k;  // [layers] -> [B, KVH, S/16, D, 16] (tiles of 16 keys)
  float* const* mirror_v;  // [layers] -> [B, KVH, S, D]
  const float* const* kt;  // [layers] -> [KVH, D, P] (P == 0: unused)
  const float* const* vs;  // [layers] -> [KVH, P, D]
  GemmQ8_0 gemm_q8_0;
  GemmQ4_1 gemm_q4_1;
  GemmQ6_K gemm_q6_k;
  GemmQ4_1 gemm_q5_1;  // the same arguments as Q4_1's
  GemmQ4_1 gemm_q4_k;  // the same arguments (m: the u8 scales and mins)
  AttnFn attn;
  double* seconds;  // optional [4]: time added in matmuls, attention, K/V writes, the rest
};
}

namespace {

// y [R, w.n]: each segment's GEMM writes its columns in place.
void linear(const GsStep& st, const GsLinear& w, const float* x, int64_t R, float* y) {
  int64_t col = 0;
  for (int64_t i = 0; i < w.n_segs; ++i) {
    const GsSegment& s = w.segs[i];
    switch (s.kind) {
      case 1:
        st.gemm_q4_1(x, R, w.k, static_cast<const uint8_t*>(s.qs), s.d, s.m, s.n, y + col, w.n,
                     st.threads, s.levels);
        break;
      case 3:
        st.gemm_q5_1(x, R, w.k, static_cast<const uint8_t*>(s.qs), s.d, s.m, s.n, y + col, w.n,
                     st.threads, s.levels);
        break;
      case 4:
        st.gemm_q4_k(x, R, w.k, static_cast<const uint8_t*>(s.qs), s.d, s.m, s.n, y + col, w.n,
                     st.threads, s.levels);
        break;
      case 2:
        st.gemm_q6_k(x, R, w.k, static_cast<const uint8_t*>(s.qs), s.d, s.m, s.n, y + col, w.n,
                     st.threads, s.levels);
        break;
      default:
        st.gemm_q8_0(x, R, w.k, static_cast<const int8_t*>(s.qs), s.d, s.n, y + col, w.n,
                     st.threads, s.levels);
    }
    col += s.n;
  }
  if (w.bias)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < w.n; ++j) y[r * w.n + j] += w.bias[j];
}

// Rows per step from which the per-row loops below split their rows over the threads (each row
// is still computed by one thread in one order: results do not depend on the thread count).
constexpr int64_t kParallelRows = 16;
constexpr int64_t kParallelKeys = 64;  // tokens

// y = x * rsqrt(mean(x^2) + eps) * w, per row (the fp32 steps of F.rms_norm).
void rmsnorm(const float* x, const float* w, int64_t R, int64_t E, float eps, float* y,
             int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (R >= kParallelRows)
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x + r * E;
    float ss = 0.f;
    for (int64_t i = 0; i < E; ++i) ss += xr[i] * xr[i];
    const float inv = 1.f / std::sqrt(ss / static_cast<float>(E) + eps);
    for (int64_t i = 0; i < E; ++i) y[r * E + i] = xr[i] * inv * w[i];
  }
}

// Rotary embedding ("rotate_half") of the q and k heads of each token's qkv row, in place;
// the q heads are then scaled by 1/sqrt(D) into q [T, H, D] for the attention kernel.
void rope_and_split(const GsStep& st, float* qkv, float* q) {
  const int64_t D = st.head_dim, half = D / 2, width = (st.heads + 2 * st.kv_heads) * D;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
#pragma omp parallel for schedule(static) num_threads(st.threads) if (st.tokens >= kParallelRows)
  for (int64_t t = 0; t < st.tokens; ++t) {
    const float* c = st.cos + t * D;
    const float* s = st.sin + t * D;
    for (int64_t head = 0; head < st.heads + st.kv_heads; ++head) {
      float* x = qkv + t * width + head * D;
      for (int64_t i = 0; i < half; ++i) {
        const float a = x[i], b = x[i + half];
        x[i] = a * c[i] - b * s[i];
        x[i + half] = b * c[i + half] + a * s[i + half];
      }
    }
    for (int64_t i = 0; i < st.heads * D; ++i) q[t * st.heads * D + i] = qkv[t * width + i] * scale;
  }
}

// NOTE: a key's elements go to 64 cache lines of its K tile (stride 16): the writes wait on
// memory, so (token, head) pairs are split over the threads (~4.7 ms of a 64-row step on one).
void write_kv(const GsStep& st, int64_t layer, const float* qkv) {
  const int64_t D = st.head_dim, KVH = st.kv_heads, width = (st.heads + 2 * KVH) * D;
// Serial below a prefill's size: the K mirror's tiles hold 16 keys of one element per line, so
// threads writing a draft's few keys share every line (8 tokens cost ~8x their serial time).
#pragma omp parallel for collapse(2) schedule(static) num_threads(st.threads) \
    if (st.tokens >= kParallelKeys)
  for (int64_t t = 0; t < st.tokens; ++t) {
    for (int64_t h = 0; h < KVH; ++h) {
      const float* k = qkv + t * width + (st.heads + h) * D;
      const float* v = k + KVH * D;
      const int64_t pool_at = (st.slots[t] * KVH + h) * D;
      const int64_t row = st.qb[t] * KVH + h, pos = st.qpos[t];
      // K in tiles of 16 keys [S/16, D, 16]: element i of key pos at stride 16
      float* mk = st.mirror_k[layer] + row * D * st.S + (pos / 16) * D * 16 + pos % 16;
      float* mv = st.mirror_v[layer] + (row * st.S + st.qpos[t]) * D;
      for (int64_t i = 0; i < D; ++i) {
        st.pool_k[layer][pool_at + i] = k[i];
        st.pool_v[layer][pool_at + i] = v[i];
        mk[i * 16] = k[i];
        mv[i] = v[i];
      }
    }
  }
}

// act[t, i] = silu(gu[t, i]) * gu[t, I + i], silu(g) = g / (1 + exp(-g)).
void silu_mul(const GsStep& st, const float* gu, float* act) {
  const int64_t I = st.inter;
#pragma omp parallel for schedule(static) num_threads(st.threads) if (st.tokens * I >= 32768)
  for (int64_t t = 0; t < st.tokens; ++t) {
    const float* g = gu + t * 2 * I;
    float* a = act + t * I;
    int64_t i = 0;
    for (; i + 8 <= I; i += 8) {
      const __m256 gv = _mm256_loadu_ps(g + i);
      // NOTE: exp8 has no overflow guard (past ~88.7 its exponent bits wrap, e.g. to -0): the
      // argument is capped at 88, whose exp (1.6e38) still makes silu(g) = g / (1 + e^-g) ~ 0.
      const __m256 neg = _mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), gv), _mm256_set1_ps(88.f));
      const __m256 den = _mm256_add_ps(_mm256_set1_ps(1.f), gs::exp8(neg));
      _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_div_ps(gv, den), _mm256_loadu_ps(g + I + i)));
    }
    for (; i < I; ++i) a[i] = g[i] / (1.f + std::exp(-g[i])) * g[I + i];
  }
}

void add_into(float* h, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) h[i] += x[i];
}

}  // namespace

extern "C" {

// Returns 0, -2 (a logit row outside h: nothing is computed), or the attention kernel's error
// (-1: a head size it does not handle). With `head`, also the logits of head->rows (final norm,
// LM head) without a return to Python in between: after the layers have streamed ~100 MB
// through the caches, each torch op there paid cache misses.
int gs_decode_stack(const GsStep* step, const GsLayer* layers, float* h, const GsHead* head) {
  const GsStep& st = *step;
  const int64_t T = st.tokens, E = st.hidden, HD = st.heads * st.head_dim;
  if (head)
    for (int64_t i = 0; i < head->n_rows; ++i)
      if (head->rows[i] < 0 || head->rows[i] >= T) return -2;
  const int64_t width = (st.heads + 2 * st.kv_heads) * st.head_dim;
  std::vector<float> x(T * E), qkv(T * width), q(T * HD), att(T * HD), y(T * E);
  std::vector<float> gu(T * 2 * st.inter), act(T * st.inter);
  using Clock = std::chrono::steady_clock;
  double parts[4] = {0, 0, 0, 0};  // matmul, attention, K/V writes, rest
  auto t = Clock::now();
  auto lap = [&](int part) {
    const auto now = Clock::now();
    parts[part] += std::chrono::duration<double>(now - t).count();
    t = now;
  };
  for (int64_t l = 0; l < st.layers; ++l) {
    const GsLayer& w = layers[l];
    rmsnorm(h, w.norm1, T, E, st.eps, x.data(), st.threads);
    lap(3);
    linear(st, w.qkv, x.data(), T, qkv.data());
    lap(0);
    rope_and_split(st, qkv.data(), q.data());
    lap(3);
    write_kv(st, l, qkv.data());
    lap(2);
    const int rc = st.attn(q.data(), st.kt[l], st.vs[l], st.P, st.mirror_k[l], st.mirror_v[l],
                           st.S, st.qb, st.qlen, T, st.heads, st.kv_heads, st.head_dim,
                           att.data(), st.threads);
    if (rc) return rc;
    lap(1);
    linear(st, w.o, att.data(), T, y.data());
    lap(0);
    add_into(h, y.data(), T * E);
    rmsnorm(h, w.norm2, T, E, st.eps, x.data(), st.threads);
    lap(3);
    linear(st, w.gate_up, x.data(), T, gu.data());
    lap(0);
    silu_mul(st, gu.data(), act.data());
    lap(3);
    linear(st, w.down, act.data(), T, y.data());
    lap(0);
    add_into(h, y.data(), T * E);
    lap(3);
  }
  if (head) {
    const int64_t L = head->n_rows;
    std::vector<float> rows(L * E);
    for (int64_t i = 0; i < L; ++i)
      std::copy(h + head->rows[i] * E, h + (head->rows[i] + 1) * E, rows.data() + i * E);
    rmsnorm(rows.data(), head->norm, L, E, st.eps, rows.data(), st.threads);
    lap(3);
    linear(st, head->lin, rows.data(), L, head->logits);
    lap(0);
  }
  if (st.seconds)
    for (int i = 0; i < 4; ++i) st.seconds[i] += parts[i];
  return 0;
}

}  // extern "C"
