// Greedy rows of the CPU sampler: per row, the first index of the largest allowed logit and its
// log-probability -log(sum over allowed tokens of exp(y - max)), in two vectorized passes over the
// row (torch's argmax and logsumexp took ~1 ms a step at 8 rows x 49,152 tokens on 2 cores).
// The torch reference is sample_ref.greedy_tokens_ref. One AVX2+FMA build (every CPU the int8
// matmuls run on); each row is summed by one thread in one order, so results do not depend on
// the thread count.
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include <cmath>
#include <limits>

#include "avx_math.h"

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Lanes whose bit is set in `bits` (bit j = lane j) all ones, the rest zero.
inline __m256 lane_mask(uint32_t bits) {
  const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i b = _mm256_and_si256(_mm256_set1_epi32(static_cast<int>(bits)), sel);
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(b, sel));
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// Logits x[0..V) with disallowed entries (bit clear in `mask`, if any) read as -inf, 8 at a time.
struct Row {
  const float* x;
  const uint8_t* mask;  // bit j of byte i: token 8i + j
  int64_t V;
  __m256 at(int64_t i) const {  // i a multiple of 8, i + 8 <= V
    const __m256 v = _mm256_loadu_ps(x + i);
    return mask ? _mm256_blendv_ps(_mm256_set1_ps(kNegInf), v, lane_mask(mask[i / 8])) : v;
  }
  float one(int64_t i) const {
    return (!mask || (mask[i / 8] >> (i % 8)) & 1) ? x[i] : kNegInf;
  }
};

void greedy_row(const Row& row, int64_t* id, float* logprob) {
  const int64_t V = row.V, body = V / 8 * 8;
  __m256 vm = _mm256_set1_ps(kNegInf);
  for (int64_t i = 0; i < body; i += 8) vm = _mm256_max_ps(vm, row.at(i));
  float mx = hmax(vm);
  for (int64_t i = body; i < V; ++i) mx = std::fmax(mx, row.one(i));
  if (!(mx > kNegInf)) {  // nothing allowed (or NaN logits)
    *id = -1, *logprob = kNegInf;
    return;
  }
  int64_t first = -1;
  const __m256 target = _mm256_set1_ps(mx);
  for (int64_t i = 0; i < body && first < 0; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(row.at(i), target, _CMP_EQ_OQ));
    if (hit) first = i + __builtin_ctz(static_cast<unsigned>(hit));
  }
  for (int64_t i = body; i < V && first < 0; ++i)
    if (row.one(i) == mx) first = i;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < body; i += 8) acc = _mm256_add_ps(acc, gs::exp8(_mm256_sub_ps(row.at(i), target)));
  float sum = hsum(acc);
  for (int64_t i = body; i < V; ++i) sum += std::exp(row.one(i) - mx);
  *id = first, *logprob = -std::log(sum);
}

}  // namespace

extern "C" {

// logits [B, V] fp32 rows `stride` floats apart; bitmask int32 [B, words] (bit set = allowed) or
// null; writes ids [B] (-1 where nothing is allowed) and logprobs [B] (-inf there).
void gs_greedy(const float* logits, int64_t B, int64_t V, int64_t stride, const int32_t* bitmask,
               int64_t words, int64_t* ids, float* logprobs, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (B > 1 && B * V >= 65536)
  for (int64_t b = 0; b < B; ++b) {
    const Row row{logits + b * stride,
                  bitmask ? reinterpret_cast<const uint8_t*>(bitmask + b * words) : nullptr, V};
    greedy_row(row, ids + b, logprobs + b);
  }
}

}  // extern "C"
