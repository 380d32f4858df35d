// GEMM over GGUF Q4_1 / Q5_1 / Q8_0 / Q6_K / Q4_K weights with int8 activations, for decode and
// small prefill batches.
//
// y[r, n] = sum_k x[r, k] * w[n, k]. Each block of 32 activations of a row is quantized once per
// call to int8 with its own scale (dx = amax / 127, q = round(x * 127 / amax)), as llama.cpp's Q8
// blocks; the weights keep their GGUF integers, so a block's product is an integer dot product
// scaled by dw * dx, plus an offset term mw * dx * sum(q) (Q4_1: mw = m; Q8_0 on VNNI, whose
// weights are read as unsigned w + 128: mw = -128 * dw). Q6_K has a scale per 16 weights and its
// unsigned 6-bit q stand for q - 32: each half block of 16 adds cvt(dot16) * (d16 * dx) +
// (-32 * d16) * sx16 (sx16: dx * sum16(q), per 16 activations). Not bit-exact with fp32
// activations: the exact path is quant_cpu.cpp (Q4_1 / Q8_0 only).
//
// Weight layout (quant_q8.py: pack_x16): rows in tiles of 16; per tile and block of 32, groups of 4
// consecutive weights of the 16 rows side by side (64 bytes: one 512-bit vector, or two 256-bit
// halves of 8 rows). Q4_1: 4 groups of the block's 16 bytes (low nibbles: elements 4g..4g+3, high
// nibbles: 16+4g..); Q5_1: 5 groups holding the 5-bit values of elements 4j + t (j = 0..7, t
// the byte's place; see q5_values; mw = m as Q4_1); Q8_0: 8 groups of int8. Scales d (and m)
// [tiles, blocks, 16].
// The K-quants keep their super-blocks of 256, so their scales are formed per block in fp32,
// exactly (fp16 times 6 or 8 bits): Q4_K (4.75 bits a weight): nibbles as Q4_1; per tile and
// super-block fp32 d and dmin [2, 16], per block u8 6-bit scale sc and min mn [2, 16]: dw = d * sc
// and mw = -(dmin * mn), so the results equal the Q4_1 repack's (6 bits) bit for bit. Q6_K (6.625
// bits): 6 groups, the nibbles as Q4_1's and 2 groups of high bit pairs (see q6_values); per tile
// and super-block fp32 d [16], per block int8 scales [2, 16] (elements 0-15, 16-31): d16 = d * sc.
// A group of 4 activations is broadcast to every lane and one VPDPBUSD (VNNI; VPMADDUBSW +
// VPMADDWD otherwise) advances 16 output rows by 4 products: no horizontal sums, the result is 16
// contiguous floats.
//
// One source, one build per instruction set (quant_q8.py picks the build at run time):
//   avx2 (-mavx2 -mfma), avx512 (+ F/BW/VL/DQ), avx512vnni (+ VNNI).
#include <cpuid.h>
#include <omp.h>
#include <stdint.h>

#include <cmath>

#include "quant_x16.h"

namespace {

enum Kind : int { kQ8_0 = 0, kQ4_1 = 1, kQ6_K = 2, kQ5_1 = 3, kQ4_K = 4 };  // decode_stack_cpu.cpp's too

constexpr bool has_min(int k) { return k == kQ4_1 || k == kQ5_1 || k == kQ4_K; }  // d * q + m per 32
constexpr int groups_of(int k) {  // of 64 B per tile and block
  return k == kQ4_1 || k == kQ4_K ? 4 : k == kQ5_1 ? 5 : k == kQ6_K ? 6 : 8;
}

// Q5_1's 8 vectors of 5-bit values u[j] (elements 4j + t of the block, t the byte's place in its
// group) from its 5 groups p[0..4]: u[g] = p[g] & 31; u[4 + g] = p[g] >> 5 (bits 0-2) | bits
// 2g, 2g + 1 of p[4] (bits 3-4). The 16-bit shifts by at most 5 bring no bit of a byte's
// neighbour to the bits kept.
inline void q5_values(const uint8_t* wb, VecI* u) {
  const VecI low5 = bcast_i(0x1F1F1F1F), low3 = bcast_i(0x07070707);
  const VecI h = load_i(wb + 4 * 64);
  const VecI top[4] = {shl16<3>(h), shl16<1>(h), shr16<1>(h), shr16<3>(h)};
  for (int g = 0; g < 4; ++g) {
    const VecI v = load_i(wb + g * 64);
    u[g] = and_(v, low5);
    u[4 + g] = and_(select(low3, shr16<5>(v), top[g]), low5);
  }
}

// Integer dot products of 32 activations `xb` with the kLanes weight rows of one block, as int32
// lanes: `u` the weights as u8 (groups g: elements 4g..4g+3), `w` Q8_0's signed weights.
// `init`: the running sum the block's products are added to (VNNI accumulates in place).
template <int kK>
inline VecI block_dot(const VecI* u, const VecI* w, const int8_t* xb, VecI init) {
  VecI dot;
  if constexpr (kVnni) {
    dot = init;
    for (int g = 0; g < 8; ++g) dot = dpbusd(dot, u[g], bcast_i(group4(xb + 4 * g)));
    return dot;
  } else if constexpr (kK == kQ4_1 || kK == kQ4_K) {  // 8 * 2 * 15 * 127 fits int16
    VecI s16 = maddubs(u[0], bcast_i(group4(xb)));
    for (int g = 1; g < 8; ++g) s16 = add16(s16, maddubs(u[g], bcast_i(group4(xb + 4 * g))));
    dot = madd1(s16);
  } else if constexpr (kK == kQ5_1) {  // 4 * 2 * 31 * 127 fits int16, 8 * ... does not
    VecI s16[2];
    for (int h = 0; h < 2; ++h) {
      s16[h] = maddubs(u[4 * h], bcast_i(group4(xb + 16 * h)));
      for (int g = 1; g < 4; ++g)
        s16[h] = add16(s16[h], maddubs(u[4 * h + g], bcast_i(group4(xb + 16 * h + 4 * g))));
    }
    dot = add32(madd1(s16[0]), madd1(s16[1]));
  } else {  // |w| * (x signed by w) = w * x; 2 * 128 * 127 fits int16, a sum of 8 does not
    dot = madd1(maddubs(u[0], sign8(bcast_i(group4(xb)), w[0])));
    for (int g = 1; g < 8; ++g)
      dot = add32(dot, madd1(maddubs(u[g], sign8(bcast_i(group4(xb + 4 * g)), w[g]))));
  }
  return add32(dot, init);
}

// Rows r0..r0+RT-1 against the kLanes weight rows of (tile, half). G = groups per block.
template <int RT, int kK, bool kTwo>
inline void tile_rows(const Q8Rows& a, int64_t K, int64_t r0, const uint8_t* qt, const float* dt,
                      const float* mt, int half, float* y, int64_t ldy, int64_t n0, int nvalid) {
  constexpr bool kQ4 = has_min(kK);
  constexpr int G = groups_of(kK);
  const int64_t nb = K / 32;
  const auto* sm = reinterpret_cast<const uint8_t*>(mt);  // Q4_K's scales and mins
  VecF acc[RT];
  for (int r = 0; r < RT; ++r) acc[r] = fzero();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = qt + b * G * 64 + half * 32;
    // NOTE: tiles lie one after another, so the lines kPrefetch blocks ahead are this tile's
    // or the next one's (what this thread's static share takes next).
    for (int g = 0; g < G; ++g) _mm_prefetch(reinterpret_cast<const char*>(wb + (kPrefetch * G + g) * 64), _MM_HINT_T0);
    if constexpr (kK == kQ4_K) {  // a line of d / dmin per super-block, of scales per 2 blocks
      _mm_prefetch(reinterpret_cast<const char*>(dt + (b + kPrefetch) / 8 * 2 * kTile), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(sm + (b + kPrefetch) * 2 * kTile), _MM_HINT_T0);
    } else {
      _mm_prefetch(reinterpret_cast<const char*>(dt + (b + kPrefetch) * kTile), _MM_HINT_T0);
      if constexpr (kQ4) _mm_prefetch(reinterpret_cast<const char*>(mt + (b + kPrefetch) * kTile), _MM_HINT_T0);
    }
    VecI u[8], w[8];
    if constexpr (kQ4) {
      if constexpr (kK == kQ5_1) {
        q5_values(wb, u);
      } else {
        for (int g = 0; g < 4; ++g) {
          const VecI v = load_i(wb + g * 64);
          u[g] = nib_lo(v);
          u[4 + g] = nib_hi(v);
        }
      }
    } else {
      for (int g = 0; g < 8; ++g) {
        w[g] = load_i(wb + g * 64);
        u[g] = kVnni ? flip(w[g]) : abs8(w[g]);
      }
    }
    VecF dw, mw;  // Q4_K: mw = dmin * mn, subtracted (fnma) where the others add
    if constexpr (kK == kQ4_K) {
      const float* db = dt + b / 8 * 2 * kTile + half * kLanes;
      const uint8_t* sb = sm + b * 2 * kTile + half * kLanes;
      dw = mul(load_f(db), load_u8_f(sb));
      mw = mul(load_f(db + kTile), load_u8_f(sb + kTile));
    } else {
      dw = load_f(dt + b * kTile + half * kLanes);
      mw = kQ4 ? load_f(mt + b * kTile + half * kLanes) : mul(dw, bcast_f(kVnni ? -128.f : 0.f));
    }
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
        dot[r] = block_dot<kK>(u, w, a.q.data() + rb * 32, izero());
        if constexpr (kTwo) dot[r] = block_dot<kK>(u, w, a.q2.data() + rb * 32, shl8(dot[r]));
      }
    }
    for (int r = 0; r < RT; ++r) {
      const int64_t rb = (r0 + r) * nb + b;
      acc[r] = fma(to_f(dot[r]), mul(dw, bcast_f(a.dx[rb])), acc[r]);
      // fnma(p, s, acc) = acc - p * s, one rounding: Q4_1's fma(-p, s, acc) bit for bit
      if constexpr (kK == kQ4_K) acc[r] = fnma(mw, bcast_f(a.sx[rb]), acc[r]);
      else if (kQ4 || kVnni) acc[r] = fma(mw, bcast_f(a.sx[rb]), acc[r]);
    }
  }
  for (int r = 0; r < RT; ++r) store_f(y + (r0 + r) * ldy + n0, acc[r], nvalid);
}

// Q6_K's 6-bit values u[g] of elements 4(4h + g) + t (half h of the block: elements 16h..16h+15)
// from its 6 groups p[0..5]: the low nibbles as Q4_1's (p[g] & 15 for h = 0, p[g] >> 4 for
// h = 1), bits 4-5 from bits 2g, 2g + 1 of p[4 + h]. The 16-bit shifts by at most 4 bring no bit
// of a byte's neighbour into bits 4-5. One half at a time: 4 live vectors, as the u8 layout had.
inline void q6_values(const uint8_t* wb, int h, VecI* u) {
  const VecI low4 = bcast_i(0x0F0F0F0F), top2 = bcast_i(0x30303030);
  const VecI p = load_i(wb + (4 + h) * 64);
  const VecI top[4] = {shl16<4>(p), shl16<2>(p), p, shr16<2>(p)};
  for (int g = 0; g < 4; ++g) {
    const VecI v = load_i(wb + g * 64);
    u[g] = select(top2, top[g], and_(h ? shr16<4>(v) : v, low4));
  }
}

// Q6_K: 16 activations `xh` with the kLanes weight rows' 6-bit values of groups u[0..3], added
// to init (not VNNI). A VPMADDUBSW pair is at most 2 * 63 * 127, so two fit int16, four do not.
inline VecI half_dot_q6(const VecI* u, const int8_t* xh, VecI init) {
  VecI dot = init;
  for (int g = 0; g < 4; g += 2)
    dot = add32(dot, madd1(add16(maddubs(u[g], bcast_i(group4(xh + 4 * g))),
                                 maddubs(u[g + 1], bcast_i(group4(xh + 4 * g + 4))))));
  return dot;
}

// tile_rows for Q6_K: each half block (16 elements, its own scale d * sc: exact in fp32) is
// folded into acc before the next one's products. `sc`: the tile's int8 scales [blocks, 2, 16].
template <int RT, bool kTwo>
inline void tile_rows_q6(const Q8Rows& a, int64_t K, int64_t r0, const uint8_t* qt,
                         const float* dt, const int8_t* sc, int half, float* y, int64_t ldy,
                         int64_t n0, int nvalid) {
  const int64_t nb = K / 32;
  VecF acc[RT];
  for (int r = 0; r < RT; ++r) acc[r] = fzero();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = qt + b * 6 * 64 + half * 32;
    for (int g = 0; g < 6; ++g) _mm_prefetch(reinterpret_cast<const char*>(wb + (kPrefetch * 6 + g) * 64), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(dt + (b + kPrefetch) / 8 * kTile), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(sc + (b + kPrefetch) * 2 * kTile), _MM_HINT_T0);
    const VecF dsb = load_f(dt + b / 8 * kTile + half * kLanes);
    for (int h = 0; h < 2; ++h) {
      VecI u[4];
      q6_values(wb, h, u);
      const VecF dw = mul(dsb, load_i8_f(sc + (2 * b + h) * kTile + half * kLanes));
      const VecF mw = mul(dw, bcast_f(-32.f));  // exact
      VecI dot[RT];
      if constexpr (kVnni) {
        for (int r = 0; r < RT; ++r) dot[r] = izero();
        rows_dot<RT, 4>(u, a.q.data() + ((r0 * nb) + b) * 32 + 16 * h, nb * 32, dot);
        if constexpr (kTwo) {  // 16 * 63 * 127 * 257 < 2^31
          for (int r = 0; r < RT; ++r) dot[r] = shl8(dot[r]);
          rows_dot<RT, 4>(u, a.q2.data() + ((r0 * nb) + b) * 32 + 16 * h, nb * 32, dot);
        }
      } else {
        for (int r = 0; r < RT; ++r) {
          const int64_t at = ((r0 + r) * nb + b) * 32 + 16 * h;
          dot[r] = half_dot_q6(u, a.q.data() + at, izero());
          if constexpr (kTwo) dot[r] = half_dot_q6(u, a.q2.data() + at, shl8(dot[r]));
        }
      }
      for (int r = 0; r < RT; ++r) {
        const int64_t rb = (r0 + r) * nb + b;
        acc[r] = fma(to_f(dot[r]), mul(dw, bcast_f(a.dx[rb])), acc[r]);
        acc[r] = fma(mw, bcast_f(a.sx16[2 * rb + h]), acc[r]);
      }
    }
  }
  for (int r = 0; r < RT; ++r) store_f(y + (r0 + r) * ldy + n0, acc[r], nvalid);
}

template <int RT, int kK, bool kTwo>
inline void rows_pass(const Q8Rows& a, int64_t K, int64_t r0, const uint8_t* qt, const float* dt,
                      const float* mt, int half, float* y, int64_t ldy, int64_t n0, int nvalid) {
  if constexpr (kK == kQ6_K)
    tile_rows_q6<RT, kTwo>(a, K, r0, qt, dt, reinterpret_cast<const int8_t*>(mt), half, y, ldy, n0, nvalid);
  else tile_rows<RT, kK, kTwo>(a, K, r0, qt, dt, mt, half, y, ldy, n0, nvalid);
}

template <int kK, bool kTwo>
void gemm(const float* x, int64_t R, int64_t K, const uint8_t* qs, const float* d,
          const float* m, int64_t N, float* y, int64_t ldy, int threads) {
  constexpr bool kQ4 = has_min(kK);
  const int64_t nb = K / 32, tiles = (N + kTile - 1) / kTile;
  // floats of d and bytes of m per tile
  const int64_t d_tile = (kK == kQ6_K ? nb / 8 : kK == kQ4_K ? nb / 4 : nb) * kTile;
  const int64_t m_tile = (kK == kQ4_K || kK == kQ6_K ? 2 : 4) * nb * kTile;
  const int64_t tile_bytes = nb * groups_of(kK) * 64;
  Q8Rows a = alloc_rows(R, K, kTwo, kK == kQ6_K);
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
      const float* dt = d + t * d_tile;
      const float* mt = kQ4 || kK == kQ6_K
                            ? reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(m) + t * m_tile)
                            : nullptr;
      for (int h = 0; h < kHalves; ++h) {
        const int64_t n0 = t * kTile + h * kLanes;
        if (n0 >= N) break;
        const int nv = static_cast<int>(N - n0 < kLanes ? N - n0 : kLanes);
        int64_t r = c0;
        for (; r + 8 <= c1; r += 8) rows_pass<8, kK, kTwo>(a, K, r, qt, dt, mt, h, y, ldy, n0, nv);
        // The rest in one pass: a pass per leftover row would run its VPDPBUSD chain alone
        // (latency-bound), so a 7-row draft cost more than an 8-row one.
        switch (c1 - r) {
          case 7: rows_pass<7, kK, kTwo>(a, K, r, qt, dt, mt, h, y, ldy, n0, nv); break;
          case 6: rows_pass<6, kK, kTwo>(a, K, r, qt, dt, mt, h, y, ldy, n0, nv); break;
          case 5: rows_pass<5, kK, kTwo>(a, K, r, qt, dt, mt, h, y, ldy, n0, nv); break;
          case 4: rows_pass<4, kK, kTwo>(a, K, r, qt, dt, mt, h, y, ldy, n0, nv); break;
          case 3: rows_pass<3, kK, kTwo>(a, K, r, qt, dt, mt, h, y, ldy, n0, nv); break;
          case 2: rows_pass<2, kK, kTwo>(a, K, r, qt, dt, mt, h, y, ldy, n0, nv); break;
          case 1: rows_pass<1, kK, kTwo>(a, K, r, qt, dt, mt, h, y, ldy, n0, nv); break;
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

// x [R, K] fp32 row-major; y: R rows of N fp32 at a stride of ldy >= N floats (a column range
// of a wider output: the caller passes y + its first column; columns past N are not written);
// K a multiple of 32; weights in x16 layout; `levels` 1 (int8 activations) or 2 (int8 plus the
// int8 residual).
void gs_q4_1_gemm_q8(const float* x, int64_t R, int64_t K, const uint8_t* qs, const float* d,
                     const float* m, int64_t N, float* y, int64_t ldy, int threads, int levels) {
  if (levels == 2) return gemm<kQ4_1, true>(x, R, K, qs, d, m, N, y, ldy, threads);
  gemm<kQ4_1, false>(x, R, K, qs, d, m, N, y, ldy, threads);
}

void gs_q8_0_gemm_q8(const float* x, int64_t R, int64_t K, const int8_t* qs, const float* d,
                     int64_t N, float* y, int64_t ldy, int threads, int levels) {
  const auto* q = reinterpret_cast<const uint8_t*>(qs);
  if (levels == 2) return gemm<kQ8_0, true>(x, R, K, q, d, nullptr, N, y, ldy, threads);
  gemm<kQ8_0, false>(x, R, K, q, d, nullptr, N, y, ldy, threads);
}

// Q5_1: qs per tile and block 5 groups of 64 bytes (see q5_values), d and m as Q4_1.
void gs_q5_1_gemm_q8(const float* x, int64_t R, int64_t K, const uint8_t* qs, const float* d,
                     const float* m, int64_t N, float* y, int64_t ldy, int threads, int levels) {
  if (levels == 2) return gemm<kQ5_1, true>(x, R, K, qs, d, m, N, y, ldy, threads);
  gemm<kQ5_1, false>(x, R, K, qs, d, m, N, y, ldy, threads);
}

// Q4_K: qs as Q4_1, d [tiles, K/256, 2, 16] fp32 (d, dmin), m the bytes of u8 [tiles, K/32, 2,
// 16] (6-bit scale, min); K a multiple of 256.
void gs_q4_k_gemm_q8(const float* x, int64_t R, int64_t K, const uint8_t* qs, const float* d,
                     const float* m, int64_t N, float* y, int64_t ldy, int threads, int levels) {
  if (levels == 2) return gemm<kQ4_K, true>(x, R, K, qs, d, m, N, y, ldy, threads);
  gemm<kQ4_K, false>(x, R, K, qs, d, m, N, y, ldy, threads);
}

// Q6_K: qs the 6-bit values in 6 groups per tile and block (see q6_values), d [tiles, K/256, 16]
// fp32, m the bytes of the int8 scales [tiles, K/32, 2, 16]; K a multiple of 256.
void gs_q6_k_gemm_q8(const float* x, int64_t R, int64_t K, const uint8_t* qs, const float* d,
                     const float* m, int64_t N, float* y, int64_t ldy, int threads, int levels) {
  if (levels == 2) return gemm<kQ6_K, true>(x, R, K, qs, d, m, N, y, ldy, threads);
  gemm<kQ6_K, false>(x, R, K, qs, d, m, N, y, ldy, threads);
}

}  // extern "C"
