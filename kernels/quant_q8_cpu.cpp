// GEMM over GGUF Q4_1 / Q8_0 weights with int8 activations, for decode and small prefill batches.
//
// y[r, n] = sum_k x[r, k] * w[n, k]. Each block of 32 activations of a row is quantized once per
// call to int8 with its own scale (dx = amax / 127, q = round(x * 127 / amax)), as llama.cpp's Q8
// blocks; the weights keep their GGUF integers, so a block's product is an integer dot product
// scaled by dw * dx, plus an offset term mw * dx * sum(q) (Q4_1: mw = m; Q8_0 on VNNI, whose
// weights are read as unsigned w + 128: mw = -128 * dw). Not bit-exact with fp32 activations: the
// exact path is quant_cpu.cpp.
//
// Weight layout (quant_q8.py: pack_x16): rows in tiles of 16; per tile and block of 32, groups of 4
// consecutive weights of the 16 rows side by side (64 bytes: one 512-bit vector, or two 256-bit
// halves of 8 rows). Q4_1: 4 groups of the block's 16 bytes (low nibbles: elements 4g..4g+3, high
// nibbles: 16+4g..); Q8_0: 8 groups of int8. Scales d (and m) [tiles, blocks, 16]. A group of 4
// activations is broadcast to every lane and one VPDPBUSD (VNNI; VPMADDUBSW + VPMADDWD otherwise)
// advances 16 output rows by 4 products: no horizontal sums, the result is 16 contiguous floats.
//
// One source, one build per instruction set (quant_q8.py picks the build at run time):
//   avx2 (-mavx2 -mfma), avx512 (+ F/BW/VL/DQ), avx512vnni (+ VNNI).
#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <cmath>
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
};

// One block of 32 values to int8 (scale amax / 127); returns the scale, adds sum(q) to *sum and,
// with `q2`, quantizes the residual x - scale * q on the grid scale / 256 into q2 (sum to *sum2).
// Vectorized (a scalar loop of nearbyint calls took ~2 ns a value: a quarter of an 8-row GEMM);
// the same operations in the same order as the scalar reference, so the same integers.
#if defined(__AVX512BW__)
inline float quantize_block(const float* xb, int8_t* q, int* sum, int8_t* q2, int* sum2) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512 x[2] = {_mm512_loadu_ps(xb), _mm512_loadu_ps(xb + 16)};
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x[0]), _mm512_abs_ps(x[1])));
  const float id = amax > 0.f ? 127.f / amax : 0.f, d = amax / 127.f;
  const float id2 = amax > 0.f ? 256.f * 127.f / amax : 0.f;
  __m512i s1 = _mm512_setzero_si512(), s2 = _mm512_setzero_si512();
  for (int h = 0; h < 2; ++h) {
    const __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(x[h], _mm512_set1_ps(id)), kRound);
    const __m512i vi = _mm512_cvtps_epi32(v);
    s1 = _mm512_add_epi32(s1, vi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * h), _mm512_cvtepi32_epi8(vi));
    if (q2) {
      const __m512 rest = _mm512_sub_ps(x[h], _mm512_mul_ps(_mm512_set1_ps(d), v));
      __m512i v2 = _mm512_cvtps_epi32(
          _mm512_roundscale_ps(_mm512_mul_ps(rest, _mm512_set1_ps(id2)), kRound));
      v2 = _mm512_max_epi32(_mm512_set1_epi32(-127), _mm512_min_epi32(_mm512_set1_epi32(127), v2));
      s2 = _mm512_add_epi32(s2, v2);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q2 + 16 * h), _mm512_cvtepi32_epi8(v2));
    }
  }
  *sum += _mm512_reduce_add_epi32(s1);
  if (q2) *sum2 += _mm512_reduce_add_epi32(s2);
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
  __m256i v1[4], v2[4], s1 = _mm256_setzero_si256(), s2 = _mm256_setzero_si256();
  for (int i = 0; i < 4; ++i) {
    const __m256 v = _mm256_round_ps(_mm256_mul_ps(x[i], _mm256_set1_ps(id)), kRound);
    v1[i] = _mm256_cvtps_epi32(v);
    s1 = _mm256_add_epi32(s1, v1[i]);
    if (q2) {
      const __m256 rest = _mm256_sub_ps(x[i], _mm256_mul_ps(_mm256_set1_ps(d), v));
      v2[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(rest, _mm256_set1_ps(id2)), kRound));
      v2[i] = _mm256_max_epi32(_mm256_set1_epi32(-127), _mm256_min_epi32(_mm256_set1_epi32(127), v2[i]));
      s2 = _mm256_add_epi32(s2, v2[i]);
    }
  }
  store_i8(q, v1);
  *sum += hsum_i32(s1);
  if (q2) store_i8(q2, v2), *sum2 += hsum_i32(s2);
  return d;
}
#endif

Q8Rows alloc_rows(int64_t R, int64_t K, bool two) {
  const int64_t nb = K / 32;
  Q8Rows a;
  a.q.resize(R * K), a.dx.resize(R * nb), a.sx.resize(R * nb);
  if (two) a.q2.resize(R * K);
  return a;
}

// Block rb (row-major blocks of 32) of the activations, into `a`.
void quantize_blocks(const float* x, bool two, int64_t rb, Q8Rows& a) {
  int s1 = 0, s2 = 0;
  const float d = quantize_block(x + rb * 32, a.q.data() + rb * 32, &s1,
                                 two ? a.q2.data() + rb * 32 : nullptr, &s2);
  a.dx[rb] = two ? d / 256.f : d;
  a.sx[rb] = two ? a.dx[rb] * static_cast<float>(256 * s1 + s2) : d * static_cast<float>(s1);
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
inline VecF mul(VecF a, VecF b) { return _mm512_mul_ps(a, b); }
inline VecI add16(VecI a, VecI b) { return _mm512_add_epi16(a, b); }
inline VecI add32(VecI a, VecI b) { return _mm512_add_epi32(a, b); }
inline VecI shl8(VecI v) { return _mm512_slli_epi32(v, 8); }
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
inline VecF mul(VecF a, VecF b) { return _mm256_mul_ps(a, b); }
inline VecI add16(VecI a, VecI b) { return _mm256_add_epi16(a, b); }
inline VecI add32(VecI a, VecI b) { return _mm256_add_epi32(a, b); }
inline VecI shl8(VecI v) { return _mm256_slli_epi32(v, 8); }
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

// Integer dot products of 32 activations `xb` with the kLanes weight rows of one block, as int32
// lanes: `u` the weights as u8 (groups g: elements 4g..4g+3), `w` Q8_0's signed weights.
// `init`: the running sum the block's products are added to (VNNI accumulates in place).
template <bool kQ4>
inline VecI block_dot(const VecI* u, const VecI* w, const int8_t* xb, VecI init) {
  VecI dot;
  if constexpr (kVnni) {
    dot = init;
    for (int g = 0; g < 8; ++g) dot = dpbusd(dot, u[g], bcast_i(group4(xb + 4 * g)));
    return dot;
  } else if constexpr (kQ4) {  // 8 * 2 * 15 * 127 fits int16
    VecI s16 = maddubs(u[0], bcast_i(group4(xb)));
    for (int g = 1; g < 8; ++g) s16 = add16(s16, maddubs(u[g], bcast_i(group4(xb + 4 * g))));
    dot = madd1(s16);
  } else {  // |w| * (x signed by w) = w * x; 2 * 128 * 127 fits int16, a sum of 8 does not
    dot = madd1(maddubs(u[0], sign8(bcast_i(group4(xb)), w[0])));
    for (int g = 1; g < 8; ++g)
      dot = add32(dot, madd1(maddubs(u[g], sign8(bcast_i(group4(xb + 4 * g)), w[g]))));
  }
  return add32(dot, init);
}

// VNNI: RT rows' products with one block (activations of row r at xb + r * stride), added to dot.
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

template <int RT>
inline void rows_dot(const VecI* u, const int8_t* xb, int64_t stride, VecI* dot) {
  for (int g = 0; g < 8; ++g)
    for (int r = 0; r < RT; ++r) dot[r] = dpbusd_group(dot[r], u[g], xb + r * stride + 4 * g);
}

// Rows r0..r0+RT-1 against the kLanes weight rows of (tile, half). G = groups per block.
template <int RT, bool kQ4, bool kTwo>
inline void tile_rows(const Q8Rows& a, int64_t K, int64_t r0, const uint8_t* qt, const float* dt,
                      const float* mt, int half, float* y, int64_t N, int64_t n0, int nvalid) {
  constexpr int G = kQ4 ? 4 : 8;
  const int64_t nb = K / 32;
  VecF acc[RT];
  for (int r = 0; r < RT; ++r) acc[r] = fzero();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = qt + b * G * 64 + half * 32;
    // NOTE: tiles lie one after another, so the lines kPrefetch blocks ahead are this tile's
    // or the next one's (what this thread's static share takes next).
    for (int g = 0; g < G; ++g) _mm_prefetch(reinterpret_cast<const char*>(wb + (kPrefetch * G + g) * 64), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(dt + (b + kPrefetch) * kTile), _MM_HINT_T0);
    if constexpr (kQ4) _mm_prefetch(reinterpret_cast<const char*>(mt + (b + kPrefetch) * kTile), _MM_HINT_T0);
    VecI u[8], w[8];
    if constexpr (kQ4) {
      for (int g = 0; g < 4; ++g) {
        const VecI v = load_i(wb + g * 64);
        u[g] = nib_lo(v);
        u[4 + g] = nib_hi(v);
      }
    } else {
      for (int g = 0; g < 8; ++g) {
        w[g] = load_i(wb + g * 64);
        u[g] = kVnni ? flip(w[g]) : abs8(w[g]);
      }
    }
    const VecF dw = load_f(dt + b * kTile + half * kLanes);
    const VecF mw = kQ4 ? load_f(mt + b * kTile + half * kLanes)
                        : mul(dw, bcast_f(kVnni ? -128.f : 0.f));
    VecI dot[RT];
    if constexpr (kVnni) {  // the rows' chains interleaved: each VPDPBUSD waits on none before it
      for (int r = 0; r < RT; ++r) dot[r] = izero();
      rows_dot<RT>(u, a.q.data() + ((r0 * nb) + b) * 32, nb * 32, dot);
      if constexpr (kTwo) {
        for (int r = 0; r < RT; ++r) dot[r] = shl8(dot[r]);
        rows_dot<RT>(u, a.q2.data() + ((r0 * nb) + b) * 32, nb * 32, dot);
      }
    } else {
      for (int r = 0; r < RT; ++r) {
        const int64_t rb = (r0 + r) * nb + b;
        dot[r] = block_dot<kQ4>(u, w, a.q.data() + rb * 32, izero());
        if constexpr (kTwo) dot[r] = block_dot<kQ4>(u, w, a.q2.data() + rb * 32, shl8(dot[r]));
      }
    }
    for (int r = 0; r < RT; ++r) {
      const int64_t rb = (r0 + r) * nb + b;
      acc[r] = fma(to_f(dot[r]), mul(dw, bcast_f(a.dx[rb])), acc[r]);
      if (kQ4 || kVnni) acc[r] = fma(mw, bcast_f(a.sx[rb]), acc[r]);
    }
  }
  for (int r = 0; r < RT; ++r) store_f(y + (r0 + r) * N + n0, acc[r], nvalid);
}

template <bool kQ4, bool kTwo>
void gemm(const float* x, int64_t R, int64_t K, const uint8_t* qs, const float* d,
          const float* m, int64_t N, float* y, int threads) {
  const int64_t nb = K / 32, tiles = (N + kTile - 1) / kTile;
  const int64_t tile_bytes = nb * (kQ4 ? 4 : 8) * 64;
  Q8Rows a = alloc_rows(R, K, kTwo);
  // One parallel region: the activations are quantized by all threads, then (after the implicit
  // barrier) the weight tiles are shared out; a decode step runs ~120 of these, each small.
  // Rows in chunks whose activations stay in L2 while every weight tile passes over them. The
  // result of a row does not depend on the chunking (each row's sums run in the same order).
  constexpr int64_t kChunk = 64;
#pragma omp parallel num_threads(threads)
  {
  if (R * nb >= 64) {  // (the same branch on every thread)
#pragma omp for schedule(static)
    for (int64_t rb = 0; rb < R * nb; ++rb) quantize_blocks(x, kTwo, rb, a);
  } else {
#pragma omp single
    for (int64_t rb = 0; rb < R * nb; ++rb) quantize_blocks(x, kTwo, rb, a);
  }
  for (int64_t c0 = 0; c0 < R; c0 += kChunk) {
    const int64_t c1 = c0 + kChunk < R ? c0 + kChunk : R;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) {
      const uint8_t* qt = qs + t * tile_bytes;
      const float* dt = d + t * nb * kTile;
      const float* mt = kQ4 ? m + t * nb * kTile : nullptr;
      for (int h = 0; h < kHalves; ++h) {
        const int64_t n0 = t * kTile + h * kLanes;
        if (n0 >= N) break;
        const int nv = static_cast<int>(N - n0 < kLanes ? N - n0 : kLanes);
        int64_t r = c0;
        for (; r + 8 <= c1; r += 8) tile_rows<8, kQ4, kTwo>(a, K, r, qt, dt, mt, h, y, N, n0, nv);
        // The rest in one pass: a pass per leftover row would run its VPDPBUSD chain alone
        // (latency-bound), so a 7-row draft cost more than an 8-row one.
        switch (c1 - r) {
          case 7: tile_rows<7, kQ4, kTwo>(a, K, r, qt, dt, mt, h, y, N, n0, nv); break;
          case 6: tile_rows<6, kQ4, kTwo>(a, K, r, qt, dt, mt, h, y, N, n0, nv); break;
          case 5: tile_rows<5, kQ4, kTwo>(a, K, r, qt, dt, mt, h, y, N, n0, nv); break;
          case 4: tile_rows<4, kQ4, kTwo>(a, K, r, qt, dt, mt, h, y, N, n0, nv); break;
          case 3: tile_rows<3, kQ4, kTwo>(a, K, r, qt, dt, mt, h, y, N, n0, nv); break;
          case 2: tile_rows<2, kQ4, kTwo>(a, K, r, qt, dt, mt, h, y, N, n0, nv); break;
          case 1: tile_rows<1, kQ4, kTwo>(a, K, r, qt, dt, mt, h, y, N, n0, nv); break;
          default: break;
        }
      }
    }
  }
  }
}

}  // namespace

extern "C" {

// What the CPU and the OS support, as the same levels (0: not even AVX2+FMA). cpuid says what the
// CPU has; XGETBV says whether the OS saves the YMM (and for AVX-512 the ZMM/opmask) state.
// NOTE: call it from the avx2 build only: another build may use wider instructions anywhere.
int gs_cpu_level() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  const bool osxsave = c & (1u << 27), fma = c & (1u << 12), avx = c & (1u << 28);
  if (!osxsave || !avx || !fma) return 0;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 0x6) != 0x6) return 0;  // XMM and YMM state
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
  if (!(b & (1u << 5))) return 0;  // AVX2
  const bool zmm_os = (lo & 0xE0) == 0xE0;  // opmask, ZMM0-15 upper halves, ZMM16-31
  const bool f = b & (1u << 16), bw = b & (1u << 30), vl = b & (1u << 31);
  if (!(zmm_os && f && bw && vl)) return 1;
  return (c & (1u << 11)) ? 3 : 2;  // AVX512_VNNI
}

// x [R, K] fp32 row-major, y [R, N] fp32 row-major; K a multiple of 32; weights in x16 layout;
// `levels` 1 (int8 activations) or 2 (int8 plus the int8 residual).
void gs_q4_1_gemm_q8(const float* x, int64_t R, int64_t K, const uint8_t* qs, const float* d,
                     const float* m, int64_t N, float* y, int threads, int levels) {
  if (levels == 2) return gemm<true, true>(x, R, K, qs, d, m, N, y, threads);
  gemm<true, false>(x, R, K, qs, d, m, N, y, threads);
}

void gs_q8_0_gemm_q8(const float* x, int64_t R, int64_t K, const int8_t* qs, const float* d,
                     int64_t N, float* y, int threads, int levels) {
  const auto* q = reinterpret_cast<const uint8_t*>(qs);
  if (levels == 2) return gemm<false, true>(x, R, K, q, d, nullptr, N, y, threads);
  gemm<false, false>(x, R, K, q, d, nullptr, N, y, threads);
}

}  // extern "C"
