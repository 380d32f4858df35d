// Skinny GEMM over GGUF Q4_1 / Q8_0 weights for x86 CPUs with AVX2 + FMA.
//
// y[r, n] = sum_k x[r, k] * w[n, k] for a few activation rows r (decode batches), with w kept in
// its 4/8-bit GGUF blocks of 32 and dequantized in registers. Activations and sums stay fp32, so
// the result is the fp32 product with the dequantized weight up to summation order; the weight
// bytes streamed per step drop 6x (Q4_1) / 3.8x (Q8_0), which is what bounds a decode step.
//
// Layout (repacked at load from the GGUF blocks, see grammarserve_kernels/quant.py):
//   Q4_1: qs uint8 [N, K/2] (per block of 32: byte j holds element j in its low nibble and element
//         j+16 in its high nibble, as in GGML), d and m fp32 [N, K/32]; w = d * q + m.
//   Q8_0: qs int8 [N, K], d fp32 [N, K/32]; w = d * q.
// Plain C ABI (called through ctypes); threads come from OpenMP, which resolves to the libgomp
// that torch has already loaded, so the kernel shares torch's thread pool.
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include <type_traits>

namespace {

// Activation rows held in registers at once: 8, or 4 when 8 rows of x would not fit in L1.
inline int64_t tile_rows(int64_t K) { return K * 8 * 4 <= 24 * 1024 ? 8 : 4; }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 u8_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }
inline __m256 i8_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

// One output row n against RT activation rows (x rows r0..r0+RT-1). `dequant(b, w)` fills w[0..3]
// with block b's 32 weights as fp32, so the result is the fp32 product with those exact weights.
template <int RT, typename Dequant>
inline void dot_row(const float* x, int64_t K, Dequant&& dequant, float* y, int64_t N,
                    int64_t n) {
  // Two accumulator chains per row when few rows are in flight, to hide the FMA latency.
  constexpr int A = RT <= 4 ? 2 : 1;
  __m256 acc[RT][A];
  for (int r = 0; r < RT; ++r)
    for (int a = 0; a < A; ++a) acc[r][a] = _mm256_setzero_ps();
  __m256 w[4];
  for (int64_t b = 0; b < K / 32; ++b) {
    dequant(b, w);
    for (int r = 0; r < RT; ++r) {
      const float* xb = x + r * K + b * 32;
      acc[r][0] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xb), acc[r][0]);
      acc[r][A - 1] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xb + 8), acc[r][A - 1]);
      acc[r][0] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xb + 16), acc[r][0]);
      acc[r][A - 1] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xb + 24), acc[r][A - 1]);
    }
  }
  for (int r = 0; r < RT; ++r)
    y[r * N + n] = hsum(A == 2 ? _mm256_add_ps(acc[r][0], acc[r][A - 1]) : acc[r][0]);
}

// Q4_1 block b as d * q + m (two roundings: the values gguf's dequantize gives).
inline void q4_1_block(const uint8_t* qs, const float* d, const float* m, int64_t b,
                       __m256* w) {
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + b * 16));
  const __m128i lo = _mm_and_si128(raw, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
  const __m256 db = _mm256_broadcast_ss(d + b), mb = _mm256_broadcast_ss(m + b);
  w[0] = _mm256_add_ps(_mm256_mul_ps(db, u8_to_ps(lo)), mb);
  w[1] = _mm256_add_ps(_mm256_mul_ps(db, u8_to_ps(_mm_srli_si128(lo, 8))), mb);
  w[2] = _mm256_add_ps(_mm256_mul_ps(db, u8_to_ps(hi)), mb);
  w[3] = _mm256_add_ps(_mm256_mul_ps(db, u8_to_ps(_mm_srli_si128(hi, 8))), mb);
}

// Q8_0 block b as d * q.
inline void q8_0_block(const int8_t* qs, const float* d, int64_t b, __m256* w) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + b * 32));
  const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + b * 32 + 16));
  const __m256 db = _mm256_broadcast_ss(d + b);
  w[0] = _mm256_mul_ps(db, i8_to_ps(a));
  w[1] = _mm256_mul_ps(db, i8_to_ps(_mm_srli_si128(a, 8)));
  w[2] = _mm256_mul_ps(db, i8_to_ps(c));
  w[3] = _mm256_mul_ps(db, i8_to_ps(_mm_srli_si128(c, 8)));
}

template <typename F>
inline void for_tiles(int64_t R, int64_t tile, F&& f) {
  int64_t r0 = 0;
  if (tile == 8)
    for (; r0 + 8 <= R; r0 += 8) f(r0, std::integral_constant<int, 8>{});
  for (; r0 + 4 <= R; r0 += 4) f(r0, std::integral_constant<int, 4>{});
  switch (R - r0) {
    case 3: f(r0, std::integral_constant<int, 3>{}); break;
    case 2: f(r0, std::integral_constant<int, 2>{}); break;
    case 1: f(r0, std::integral_constant<int, 1>{}); break;
    default: break;
  }
}

}  // namespace

extern "C" {

// x [R, K] fp32 row-major, y [R, N] fp32 row-major; K a multiple of 32. `threads` is passed in
// (torch.get_num_threads()) because OpenMP's default is per calling thread, not torch's setting.
void gs_q4_1_gemm(const float* x, int64_t R, int64_t K, const uint8_t* qs, const float* d,
                  const float* m, int64_t N, float* y, int threads) {
  const int64_t nb = K / 32, tile = tile_rows(K);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t n = 0; n < N; ++n) {
    for_tiles(R, tile, [&](int64_t r0, auto rt) {
      constexpr int RT = decltype(rt)::value;
      const uint8_t* qn = qs + n * (K / 2);
      const float *dn = d + n * nb, *mn = m + n * nb;
      dot_row<RT>(x + r0 * K, K, [&](int64_t b, __m256* w) { q4_1_block(qn, dn, mn, b, w); },
                  y + r0 * N, N, n);
    });
  }
}

void gs_q8_0_gemm(const float* x, int64_t R, int64_t K, const int8_t* qs, const float* d,
                  int64_t N, float* y, int threads) {
  const int64_t nb = K / 32, tile = tile_rows(K);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t n = 0; n < N; ++n) {
    const int8_t* qn = qs + n * K;
    const float* dn = d + n * nb;
    for_tiles(R, tile, [&](int64_t r0, auto rt) {
      constexpr int RT = decltype(rt)::value;
      dot_row<RT>(x + r0 * K, K, [&](int64_t b, __m256* w) { q8_0_block(qn, dn, b, w); },
                  y + r0 * N, N, n);
    });
  }
}

}  // extern "C"
