// Dequantize a row range of an x16-layout weight (quant_q8.py: pack_x16; Q8_0, Q4_1, Q6_K, Q4_K) into a
// dense row-major [rows, K] panel, fp32 or bf16, for prefill GEMMs in torch (quant_panel.py).
//
// The fp32 values equal quant.py's dequantize bit for bit: Q8_0 d * q, Q6_K (d * sc) * (q - 32)
// (each one rounding of an exact product), Q4_1 (d * q) + m (two roundings, no FMA: built with
// -ffp-contract=off, as GCC would otherwise fuse the intrinsics' vector expressions). bf16 is the
// round-to-nearest-even of that fp32 value (torch's .bfloat16() for finite values).
//
// x16 layout: per tile of 16 rows and block of 32, G groups (Q4_1, Q4_K: 4, Q6_K: 6, Q8_0: 8) of 64 bytes, each
// holding 4 consecutive bytes of each of the 16 rows (row r at byte 4r). A row's bytes of a block
// are one gather of G dwords at stride 64. Q4_1's 16 bytes hold elements 0-15 in their low nibbles
// and 16-31 in their high nibbles; Q8_0's 32 are int8; d and m [tiles, blocks, 16]. Q6_K: the
// nibbles as Q4_1's, then 2 groups of high bit pairs (quant_q8.py: _q6_groups), fp32 d [tiles,
// K/256, 16], int8 scales [tiles, blocks, 2, 16] (elements 0-15, 16-31). Q4_K: nibbles as Q4_1,
// fp32 d and dmin [tiles, K/256, 2, 16], u8 scale and min [tiles, blocks, 2, 16]; a value is
// (d * sc) * q - dmin * mn, each product exact, as quant.py's dequantize.
//
// One source, two builds (quant_panel.py): avx2 (-mavx2 -mfma), avx512 (+ F/BW/VL/DQ).
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include <algorithm>

namespace {

constexpr int kTile = 16;
enum Kind : int { kQ8_0 = 0, kQ4_1 = 1, kQ6_K = 2, kQ4_K = 4 };  // quant_q8.py's KINDS order

#if defined(__AVX512F__)
constexpr int kLanes = 16;
using VecF = __m512;
using VecI = __m512i;
inline VecI widen_i8(__m128i b) { return _mm512_cvtepi8_epi32(b); }
inline VecI widen_u8(__m128i b) { return _mm512_cvtepu8_epi32(b); }
inline VecF to_f(VecI v) { return _mm512_cvtepi32_ps(v); }
inline VecI sub32(VecI v, int c) { return _mm512_sub_epi32(v, _mm512_set1_epi32(c)); }
inline VecF bcast(float v) { return _mm512_set1_ps(v); }
inline VecF mul(VecF a, VecF b) { return _mm512_mul_ps(a, b); }
inline VecF add(VecF a, VecF b) { return _mm512_add_ps(a, b); }
inline VecF sub(VecF a, VecF b) { return _mm512_sub_ps(a, b); }
inline void store(float* p, VecF v) { _mm512_storeu_ps(p, v); }
inline void store(uint16_t* p, VecF v) {  // round to nearest even, keep the high 16 bits
  const VecI u = _mm512_castps_si512(v);
  const VecI odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const VecI r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
#else
constexpr int kLanes = 8;
using VecF = __m256;
using VecI = __m256i;
inline VecI widen_i8(__m128i b) { return _mm256_cvtepi8_epi32(b); }  // the low 8 bytes
inline VecI widen_u8(__m128i b) { return _mm256_cvtepu8_epi32(b); }
inline VecF to_f(VecI v) { return _mm256_cvtepi32_ps(v); }
inline VecI sub32(VecI v, int c) { return _mm256_sub_epi32(v, _mm256_set1_epi32(c)); }
inline VecF bcast(float v) { return _mm256_set1_ps(v); }
inline VecF mul(VecF a, VecF b) { return _mm256_mul_ps(a, b); }
inline VecF add(VecF a, VecF b) { return _mm256_add_ps(a, b); }
inline VecF sub(VecF a, VecF b) { return _mm256_sub_ps(a, b); }
inline void store(float* p, VecF v) { _mm256_storeu_ps(p, v); }
inline void store(uint16_t* p, VecF v) {
  const VecI u = _mm256_castps_si256(v);
  const VecI odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const VecI r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  // packus works per 128-bit lane: qwords 0 and 2 hold values 0-3 and 4-7
  const __m256i p16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(p16));
}
#endif

// 16 values of a row from 16 bytes `b` (bytes as int8 or u8) into out[0..16).
template <Kind K, typename T>
inline void emit16(__m128i b, float d, float m, T* out) {
  for (int c = 0; c < kTile / kLanes; ++c) {
    const __m128i part = c == 0 ? b : _mm_srli_si128(b, 8);  // AVX2: the high 8 bytes
    VecF v;
    if constexpr (K == kQ8_0) {
      v = mul(bcast(d), to_f(widen_i8(part)));
    } else if constexpr (K == kQ6_K) {
      v = mul(bcast(d), to_f(sub32(widen_u8(part), 32)));
    } else if constexpr (K == kQ4_K) {  // m: dmin * mn, subtracted
      v = sub(mul(bcast(d), to_f(widen_u8(part))), bcast(m));
    } else {
      v = add(mul(bcast(d), to_f(widen_u8(part))), bcast(m));
    }
    store(out + c * kLanes, v);
  }
}

// Row `lane` of one tile and block: 32 values into out. Q4_1: db, mb the block's d and m;
// Q4_K: db the super-block's d then (kTile on) dmin, mb the u8 scales then (kTile on) mins.
template <Kind K, typename T>
inline void row_block(const uint8_t* qb, const float* db, const void* mb, int lane, T* out) {
  const int* p = reinterpret_cast<const int*>(qb + 4 * lane);
  if constexpr (K == kQ4_1 || K == kQ4_K) {
    const __m128i b = _mm_i32gather_epi32(p, _mm_setr_epi32(0, 64, 128, 192), 1);
    const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    float d, m;
    if constexpr (K == kQ4_K) {
      const auto* sm = static_cast<const uint8_t*>(mb);
      d = db[lane] * static_cast<float>(sm[lane]);
      m = db[kTile + lane] * static_cast<float>(sm[kTile + lane]);
    } else {
      d = db[lane], m = static_cast<const float*>(mb)[lane];
    }
    emit16<K>(lo, d, m, out);
    emit16<K>(hi, d, m, out + 16);
  } else if constexpr (K == kQ6_K) {
    // nibbles as Q4_1's; bits 4-5 of element 4j + t: bits 2(j % 4), +1 of byte t of dword 4 + j / 4
    const __m128i b = _mm_i32gather_epi32(p, _mm_setr_epi32(0, 64, 128, 192), 1);
    const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    const __m128i shifts = _mm_setr_epi32(0, 2, 4, 6), three = _mm_set1_epi8(3);
    const __m128i top0 = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(p[64]), shifts), three);
    const __m128i top1 = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(p[80]), shifts), three);
    const auto* sc = static_cast<const int8_t*>(mb);
    const float d0 = db[lane] * static_cast<float>(sc[lane]);  // exact: fp16 times int8
    const float d1 = db[lane] * static_cast<float>(sc[kTile + lane]);
    emit16<K>(_mm_or_si128(lo, _mm_slli_epi16(top0, 4)), d0, 0.f, out);
    emit16<K>(_mm_or_si128(hi, _mm_slli_epi16(top1, 4)), d1, 0.f, out + 16);
  } else {
    const __m256i b = _mm256_i32gather_epi32(p, _mm256_setr_epi32(0, 64, 128, 192, 256, 320, 384, 448), 1);
    emit16<K>(_mm256_castsi256_si128(b), db[lane], 0.f, out);
    emit16<K>(_mm256_extracti128_si256(b, 1), db[lane], 0.f, out + 16);
  }
}

template <Kind K, typename T>
void dequant(const uint8_t* qs, const float* d, const float* m, int64_t k, int64_t r0, int64_t r1,
             T* out, int64_t ldo, int threads) {
  constexpr int G = K == kQ4_1 || K == kQ4_K ? 4 : K == kQ6_K ? 6 : 8;
  const int64_t nb = k / 32, t0 = r0 / kTile, t1 = (r1 + kTile - 1) / kTile;
  const int64_t d_tile = (K == kQ4_K ? nb / 4 : K == kQ6_K ? nb / 8 : nb) * kTile;  // floats
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t t = t0; t < t1; ++t) {
    const int lo = static_cast<int>(std::max<int64_t>(r0 - t * kTile, 0));
    const int hi = static_cast<int>(std::min<int64_t>(r1 - t * kTile, kTile));
    const uint8_t* qt = qs + t * nb * G * 64;
    const float* dt = d + t * d_tile;
    const auto* mt = reinterpret_cast<const uint8_t*>(m);
    T* rows = out + (t * kTile - r0) * ldo;
    for (int64_t b = 0; b < nb; ++b) {
      const float* db = K == kQ4_K ? dt + b / 8 * 2 * kTile : K == kQ6_K ? dt + b / 8 * kTile : dt + b * kTile;
      const void* mb = K == kQ4_1 ? static_cast<const void*>(m + (t * nb + b) * kTile)
                       : K == kQ4_K || K == kQ6_K ? static_cast<const void*>(mt + (t * nb + b) * 2 * kTile)
                                                  : nullptr;
      for (int lane = lo; lane < hi; ++lane)
        row_block<K>(qt + b * G * 64, db, mb, lane, rows + lane * ldo + b * 32);
    }
  }
}

template <typename T>
void dispatch(int kind, const uint8_t* qs, const float* d, const float* m, int64_t k, int64_t r0,
              int64_t r1, T* out, int64_t ldo, int threads) {
  if (kind == kQ4_1) dequant<kQ4_1>(qs, d, m, k, r0, r1, out, ldo, threads);
  else if (kind == kQ6_K) dequant<kQ6_K>(qs, d, m, k, r0, r1, out, ldo, threads);
  else if (kind == kQ4_K) dequant<kQ4_K>(qs, d, m, k, r0, r1, out, ldo, threads);
  else dequant<kQ8_0>(qs, d, m, k, r0, r1, out, ldo, threads);
}

}  // namespace

extern "C" {

// Rows r0..r1 (r1 <= n) of an x16 weight of `kind` (0 Q8_0, 1 Q4_1, 2 Q6_K: m the bytes of its
// int8 scales, 4 Q4_K: of its u8 scales and mins) with K = k into
// out[(r - r0) * ldo + j], fp32 (`bf16` = 0) or bf16 bits (1).
void gs_x16_dequant(int kind, const uint8_t* qs, const float* d, const float* m, int64_t k,
                    int64_t r0, int64_t r1, void* out, int64_t ldo, int bf16, int threads) {
  if (bf16) dispatch(kind, qs, d, m, k, r0, r1, static_cast<uint16_t*>(out), ldo, threads);
  else dispatch(kind, qs, d, m, k, r0, r1, static_cast<float*>(out), ldo, threads);
}

}  // extern "C"
