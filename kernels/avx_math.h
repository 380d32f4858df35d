// Vector math shared by the C++ CPU kernels (included by them; cpu_build.py hashes the local
// headers a source includes, so editing this file rebuilds them).
#pragma once
#include <immintrin.h>

namespace gs {

// exp(x) for 8 lanes (x clamped to [-87, 88]): 2^k * p(r), x = k ln2 + r, |r| <= ln2 / 2,
// degree-6 polynomial.
inline __m256 exp8(__m256 x) {
  static constexpr float kCoef[] = {1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f};
  // NOTE: past ~88.7 the exponent bits below wrap (e.g. to -0); e^88 ~ 1.7e38 is finite.
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.f)), _mm256_set1_ps(88.f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(k, _mm256_set1_ps(-0.693145752f), x);
  r = _mm256_fmadd_ps(k, _mm256_set1_ps(-1.42860677e-6f), r);
  __m256 p = _mm256_set1_ps(1.f / 720);
  for (const float c : kCoef) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

}  // namespace gs
