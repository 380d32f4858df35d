// Peak-throughput probes for bench_roofline.py: fp32 FMA GFLOP/s with the build's vector width
// (independent accumulator chains, registers only) and int8 dot-product GOP/s (VPDPBUSD where the
// build has AVX-512 VNNI, VPMADDUBSW + VPMADDWD otherwise). Built once per instruction set.
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

extern "C" {

// Runs `iters` rounds of 12 independent FMA chains per thread; returns a checksum (keeps the
// work alive). FLOPs = threads * iters * 12 * lanes * 2.
float gs_peak_fma(int64_t iters, int threads) {
  float total = 0.f;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
#if defined(__AVX512F__)
    __m512 a[12];
    const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-3f);
    for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(static_cast<float>(i));
    for (int64_t it = 0; it < iters; ++it)
      for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], x, y);
    for (int i = 0; i < 12; ++i) total += _mm512_reduce_add_ps(a[i]);
#else
    __m256 a[12];
    const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-3f);
    for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(static_cast<float>(i));
    for (int64_t it = 0; it < iters; ++it)
      for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], x, y);
    alignas(32) float t[8];
    for (int i = 0; i < 12; ++i) {
      _mm256_store_ps(t, a[i]);
      for (float v : t) total += v;
    }
#endif
  }
  return total;
}

// int8 multiply-adds: OPs = threads * iters * 12 * lanes * 4 * 2 (u8 x s8 products and sums).
// Without VNNI the accumulator is also the signed operand, so the compiler cannot hoist the
// multiply out of the loop.
int gs_peak_int8(int64_t iters, int threads) {
  int total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
#if defined(__AVX512BW__)
    __m512i a[12];
    const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
    for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_epi32(i);
    for (int64_t it = 0; it < iters; ++it)
      for (int i = 0; i < 12; ++i)
#if defined(__AVX512VNNI__)
        a[i] = _mm512_dpbusd_epi32(a[i], u, s);
#else
        a[i] = _mm512_add_epi32(a[i], _mm512_madd_epi16(_mm512_maddubs_epi16(u, a[i]),
                                                        _mm512_set1_epi16(1)));
#endif
    for (int i = 0; i < 12; ++i) total += _mm512_reduce_add_epi32(a[i]);
#else
    __m256i a[12];
    const __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2);
    for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_epi32(i);
    for (int64_t it = 0; it < iters; ++it)
      for (int i = 0; i < 12; ++i)
        a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(_mm256_maddubs_epi16(u, a[i]),
                                                        _mm256_set1_epi16(1)));
    alignas(32) int t[8];
    for (int i = 0; i < 12; ++i) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(t), a[i]);
      for (int v : t) total += v;
    }
#endif
  }
  return total;
}

// Memory read: every thread reads its share of `n` floats as `streams` interleaved sequential
// streams (sub-ranges read side by side, as attention reads K and V of several rows), with 256-bit
// loads into independent accumulators (the adds keep the loads alive; they cost far less than the
// bytes) and, with `prefetch`, software prefetches 1 KB ahead on each stream.
float gs_peak_read(const float* p, int64_t n, int threads, int streams, int prefetch) {
  float total = 0.f;
  streams = streams < 1 ? 1 : (streams > 8 ? 8 : streams);
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t per = (n / nt / streams) & ~int64_t{63};
    const float* base = p + t * per * streams;
    __m256 a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < per; j += 16) {
      for (int s = 0; s < streams; ++s) {
        const float* q = base + s * per + j;
        if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(q + 256), _MM_HINT_T0);
        a[2 * (s & 3)] = _mm256_add_ps(a[2 * (s & 3)], _mm256_loadu_ps(q));
        a[2 * (s & 3) + 1] = _mm256_add_ps(a[2 * (s & 3) + 1], _mm256_loadu_ps(q + 8));
      }
    }
    alignas(32) float r[8];
    for (int i = 1; i < 8; ++i) a[0] = _mm256_add_ps(a[0], a[i]);
    _mm256_store_ps(r, a[0]);
    for (float v : r) total += v;
  }
  return total;
}

}  // extern "C"
