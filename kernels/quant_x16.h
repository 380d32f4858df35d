// Shared pieces of the x16 int8-activation kernels (quant_q8_cpu.cpp): the activations quantized
// per block of 32 (Q8Rows), the vector wrappers of the instruction set the file is built for
// (AVX-512: one 16-lane vector per tile of 16 rows; AVX2: two 8-lane halves), and the VPDPBUSD
// with an embedded broadcast. Built once per instruction set, with the including source.
#pragma once

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include <vector>

namespace {
constexpr int kTile = 16;  // weight rows per tile (lanes of a 512-bit vector of int32/float)
constexpr int kPrefetch = 8;  // blocks of weights fetched ahead

// Activations of R rows, quantized per block of 32, natural order. With two levels, the residual
// x - dx * q is quantized on the fixed finer grid dx / 256 (q2, clamped to +-127): x = dx * q +
// dx / 256 * q2 to ~1/65000 of the block's largest value, against ~1/250 for one level. The fixed
// ratio lets a block's two integer dot products be one: 256 * dot(q) + dot(q2) (int32: at most
// 256 * 32 * 255 * 127 + 32 * 255 * 127 < 2^31), so the second level costs integer work only.
struct Q8Rows {
  std::vector<int8_t> q, q2;  // [R, K]
  std::vector<float> dx;      // [R, nb] block scales (two levels: dx / 256, the scale of the sum)
  std::vector<float> sx;      // [R, nb] dx * sum(q) + dx / 256 * sum(q2)
  std::vector<float> sx16;    // [R, nb, 2] the same per 16 (Q6_K's scale groups), else empty
};

// One block of 32 values to int8 (scale amax / 127); returns the scale, adds sum(q) of elements
// 0-15 and 16-31 to sum[0] and sum[1] and, with `q2`, quantizes the residual x - scale * q on the
// grid scale / 256 into q2 (its sums to sum2[0..1]).
// Vectorized (a scalar loop of nearbyint calls took ~2 ns a value: a quarter of an 8-row GEMM);
// the same operations in the same order as the scalar reference, so the same integers.
#if defined(__AVX512BW__)
inline float quantize_block(const float* xb, int8_t* q, int* sum, int8_t* q2, int* sum2) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512 x[2] = {_mm512_loadu_ps(xb), _mm512_loadu_ps(xb + 16)};
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x[0]), _mm512_abs_ps(x[1])));
  const float id = amax > 0.f ? 127.f / amax : 0.f, d = amax / 127.f;
  const float id2 = amax > 0.f ? 256.f * 127.f / amax : 0.f;
  for (int h = 0; h < 2; ++h) {
    const __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(x[h], _mm512_set1_ps(id)), kRound);
    const __m512i vi = _mm512_cvtps_epi32(v);
    sum[h] += _mm512_reduce_add_epi32(vi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * h), _mm512_cvtepi32_epi8(vi));
    if (q2) {
      const __m512 rest = _mm512_sub_ps(x[h], _mm512_mul_ps(_mm512_set1_ps(d), v));
      __m512i v2 = _mm512_cvtps_epi32(
          _mm512_roundscale_ps(_mm512_mul_ps(rest, _mm512_set1_ps(id2)), kRound));
      v2 = _mm512_max_epi32(_mm512_set1_epi32(-127), _mm512_min_epi32(_mm512_set1_epi32(127), v2));
      sum2[h] += _mm512_reduce_add_epi32(v2);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q2 + 16 * h), _mm512_cvtepi32_epi8(v2));
    }
  }
  return d;
}
#else
inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}
inline void store_i8(int8_t* q, const __m256i* v) {  // 4 x 8 int32 in [-127, 127] -> 32 int8
  const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
  // packs works per 128-bit lane: dwords 0,4,1,5,2,6,3,7 of w hold elements 0-3,4-7,...
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}
inline float quantize_block(const float* xb, int8_t* q, int* sum, int8_t* q2, int* sum2) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 x[4], m = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) x[i] = _mm256_loadu_ps(xb + 8 * i), m = _mm256_max_ps(m, _mm256_andnot_ps(sign, x[i]));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
  const float id = amax > 0.f ? 127.f / amax : 0.f, d = amax / 127.f;
  const float id2 = amax > 0.f ? 256.f * 127.f / amax : 0.f;
  __m256i v1[4], v2[4], s1[2], s2[2];
  for (int h = 0; h < 2; ++h) s1[h] = s2[h] = _mm256_setzero_si256();
  for (int i = 0; i < 4; ++i) {
    const __m256 v = _mm256_round_ps(_mm256_mul_ps(x[i], _mm256_set1_ps(id)), kRound);
    v1[i] = _mm256_cvtps_epi32(v);
    s1[i / 2] = _mm256_add_epi32(s1[i / 2], v1[i]);
    if (q2) {
      const __m256 rest = _mm256_sub_ps(x[i], _mm256_mul_ps(_mm256_set1_ps(d), v));
      v2[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(rest, _mm256_set1_ps(id2)), kRound));
      v2[i] = _mm256_max_epi32(_mm256_set1_epi32(-127), _mm256_min_epi32(_mm256_set1_epi32(127), v2[i]));
      s2[i / 2] = _mm256_add_epi32(s2[i / 2], v2[i]);
    }
  }
  store_i8(q, v1);
  for (int h = 0; h < 2; ++h) sum[h] += hsum_i32(s1[h]);
  if (q2) {
    store_i8(q2, v2);
    for (int h = 0; h < 2; ++h) sum2[h] += hsum_i32(s2[h]);
  }
  return d;
}
#endif

// `sums16`: also the sums per 16 (sx16).
Q8Rows alloc_rows(int64_t R, int64_t K, bool two, bool sums16) {
  const int64_t nb = K / 32;
  Q8Rows a;
  a.q.resize(R * K), a.dx.resize(R * nb), a.sx.resize(R * nb);
  if (two) a.q2.resize(R * K);
  if (sums16) a.sx16.resize(R * nb * 2);
  return a;
}

// Block rb (row-major blocks of 32) of the activations, into `a`.
void quantize_blocks(const float* x, bool two, int64_t rb, Q8Rows& a) {
  int s1[2] = {0, 0}, s2[2] = {0, 0};
  const float d = quantize_block(x + rb * 32, a.q.data() + rb * 32, s1,
                                 two ? a.q2.data() + rb * 32 : nullptr, s2);
  a.dx[rb] = two ? d / 256.f : d;
  auto scaled = [&](int q, int q2) {  // the integer sum is exact: one rounding, as the reference
    return two ? a.dx[rb] * static_cast<float>(256 * q + q2) : d * static_cast<float>(q);
  };
  a.sx[rb] = scaled(s1[0] + s1[1], s2[0] + s2[1]);
  if (!a.sx16.empty())
    for (int h = 0; h < 2; ++h) a.sx16[2 * rb + h] = scaled(s1[h], s2[h]);
}

inline int32_t group4(const int8_t* p) {  // 4 activation bytes as one int32 (for broadcasts)
  int32_t v;
  memcpy(&v, p, 4);
  return v;
}

#if defined(__AVX512BW__)
constexpr int kLanes = 16;
using VecI = __m512i;
using VecF = __m512;
inline VecI load_i(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline VecF load_f(const float* p) { return _mm512_loadu_ps(p); }
inline VecF bcast_f(float v) { return _mm512_set1_ps(v); }
inline VecI bcast_i(int32_t v) { return _mm512_set1_epi32(v); }
inline VecI izero() { return _mm512_setzero_si512(); }
inline VecF fzero() { return _mm512_setzero_ps(); }
inline VecI nib_lo(VecI v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
inline VecI nib_hi(VecI v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
inline VecI flip(VecI v) { return _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80))); }
inline VecF to_f(VecI v) { return _mm512_cvtepi32_ps(v); }
inline VecF fma(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
inline VecF fnma(VecF a, VecF b, VecF c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a * b
inline VecF load_u8_f(const uint8_t* p) {  // 16 u8 as fp32
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline VecF load_i8_f(const int8_t* p) {  // 16 int8 as fp32
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline VecF mul(VecF a, VecF b) { return _mm512_mul_ps(a, b); }
inline VecI add16(VecI a, VecI b) { return _mm512_add_epi16(a, b); }
inline VecI add32(VecI a, VecI b) { return _mm512_add_epi32(a, b); }
inline VecI shl8(VecI v) { return _mm512_slli_epi32(v, 8); }
template <int S> inline VecI shl16(VecI v) { return _mm512_slli_epi16(v, S); }
template <int S> inline VecI shr16(VecI v) { return _mm512_srli_epi16(v, S); }
inline VecI and_(VecI a, VecI b) { return _mm512_and_si512(a, b); }
inline VecI select(VecI m, VecI a, VecI b) {  // bits of a where m is set, of b elsewhere
  return _mm512_ternarylogic_epi32(m, a, b, 0xCA);
}
inline VecI maddubs(VecI u, VecI s) { return _mm512_maddubs_epi16(u, s); }
inline VecI madd1(VecI v) { return _mm512_madd_epi16(v, _mm512_set1_epi16(1)); }
inline VecI abs8(VecI v) { return _mm512_abs_epi8(v); }
inline VecI sign8(VecI x, VecI w) {  // x negated where w < 0
  return _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
}
inline void store_f(float* y, VecF v, int n) {
  _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << n) - 1), v);
}
#if defined(__AVX512VNNI__)
constexpr bool kVnni = true;
inline VecI dpbusd(VecI acc, VecI u, VecI s) { return _mm512_dpbusd_epi32(acc, u, s); }
#else
constexpr bool kVnni = false;
inline VecI dpbusd(VecI acc, VecI, VecI) { return acc; }  // unused
#endif
#else
constexpr int kLanes = 8;
constexpr bool kVnni = false;
using VecI = __m256i;
using VecF = __m256;
inline VecI load_i(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline VecF load_f(const float* p) { return _mm256_loadu_ps(p); }
inline VecF bcast_f(float v) { return _mm256_set1_ps(v); }
inline VecI bcast_i(int32_t v) { return _mm256_set1_epi32(v); }
inline VecI izero() { return _mm256_setzero_si256(); }
inline VecF fzero() { return _mm256_setzero_ps(); }
inline VecI nib_lo(VecI v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
inline VecI nib_hi(VecI v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
inline VecI flip(VecI v) { return v; }  // unused
inline VecF to_f(VecI v) { return _mm256_cvtepi32_ps(v); }
inline VecF fma(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }
inline VecF fnma(VecF a, VecF b, VecF c) { return _mm256_fnmadd_ps(a, b, c); }  // c - a * b
inline VecF load_u8_f(const uint8_t* p) {  // 8 u8 as fp32
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline VecF load_i8_f(const int8_t* p) {  // 8 int8 as fp32
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline VecF mul(VecF a, VecF b) { return _mm256_mul_ps(a, b); }
inline VecI add16(VecI a, VecI b) { return _mm256_add_epi16(a, b); }
inline VecI add32(VecI a, VecI b) { return _mm256_add_epi32(a, b); }
inline VecI shl8(VecI v) { return _mm256_slli_epi32(v, 8); }
template <int S> inline VecI shl16(VecI v) { return _mm256_slli_epi16(v, S); }
template <int S> inline VecI shr16(VecI v) { return _mm256_srli_epi16(v, S); }
inline VecI and_(VecI a, VecI b) { return _mm256_and_si256(a, b); }
inline VecI select(VecI m, VecI a, VecI b) {  // bits of a where m is set, of b elsewhere
  return _mm256_or_si256(_mm256_and_si256(m, a), _mm256_andnot_si256(m, b));
}
inline VecI maddubs(VecI u, VecI s) { return _mm256_maddubs_epi16(u, s); }
inline VecI madd1(VecI v) { return _mm256_madd_epi16(v, _mm256_set1_epi16(1)); }
inline VecI abs8(VecI v) { return _mm256_sign_epi8(v, v); }
inline VecI sign8(VecI x, VecI w) { return _mm256_sign_epi8(x, w); }
inline VecI dpbusd(VecI acc, VecI, VecI) { return acc; }  // unused
inline void store_f(float* y, VecF v, int n) {
  if (n == 8) return _mm256_storeu_ps(y, v);
  alignas(32) float t[8];
  _mm256_store_ps(t, v);
  for (int i = 0; i < n; ++i) y[i] = t[i];
}
#endif
constexpr int kHalves = kTile / kLanes;  // 1 (AVX-512) or 2 (AVX2) passes per tile

// VNNI: RT rows' products with G groups of a block (activations of row r at xb + r * stride),
// added to dot.
#if defined(__AVX512VNNI__)
// VPDPBUSD with its activation group read by an embedded broadcast ({1to16}): GCC otherwise emits
// a separate VPBROADCASTD per product (128 a block at 8 rows, beside the 128 VPDPBUSD).
inline VecI dpbusd_group(VecI acc, VecI u, const int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}
#else
inline VecI dpbusd_group(VecI acc, VecI u, const int8_t* p) { return dpbusd(acc, u, bcast_i(group4(p))); }
#endif

template <int RT, int G = 8>
inline void rows_dot(const VecI* u, const int8_t* xb, int64_t stride, VecI* dot) {
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < RT; ++r) dot[r] = dpbusd_group(dot[r], u[g], xb + r * stride + 4 * g);
}

}  // namespace
