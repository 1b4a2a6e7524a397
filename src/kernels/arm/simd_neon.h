// Vector traits of the Arm levels (neon, neon_bf16): 4 f32 lanes in an
// AdvSIMD q register, 32 registers. Same members as x86/simd_avx2.h and
// x86/simd_avx512.h; the kernels (simd/gemm_impl.h, simd/rows_impl.h) are
// written once over them. Tails go through a small zeroed buffer (AdvSIMD has
// no masked loads). No non-temporal stores: kStreamAlign is not 64, so the
// GEMM never asks for them (stream() is a plain store, fence() nothing).
#pragma once

#include <arm_neon.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moe/dtype.h"

namespace moe::arm {

struct Neon {
  static constexpr int L = 4;
  using F = float32x4_t;
  using I = uint32x4_t;

  static F zero() { return vdupq_n_f32(0.0f); }
  static F set1(float f) { return vdupq_n_f32(f); }
  static F add(F a, F b) { return vaddq_f32(a, b); }
  static F mul(F a, F b) { return vmulq_f32(a, b); }
  static F fma(F a, F b, F c) { return vfmaq_f32(c, a, b); }  // a * b + c, one rounding

  static F load(const float* p) { return vld1q_f32(p); }
  static F load_n(const float* p, int64_t n) {
    if (n >= L) return load(p);
    float tmp[L] = {};
    if (n > 0) std::memcpy(tmp, p, size_t(n) * 4);
    return vld1q_f32(tmp);
  }
  static void store(float* p, F v) { vst1q_f32(p, v); }
  static void store_n(float* p, F v, int64_t n) {
    if (n >= L) return store(p, v);
    float tmp[L];
    vst1q_f32(tmp, v);
    if (n > 0) std::memcpy(p, tmp, size_t(n) * 4);
  }
  static void stream(float* p, F v) { vst1q_f32(p, v); }
  static void fence() {}
  static constexpr int kStreamAlign = 16;

  // bf16 rows: widened exactly to f32 (a 16-bit shift into the high half).
  static F load_bf16(const bf16* p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p)), 16));
  }
  static F load_bf16_n(const bf16* p, int64_t n) {
    if (n >= L) return load_bf16(p);
    uint16_t tmp[L] = {};
    if (n > 0) std::memcpy(tmp, p, size_t(n) * 2);
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(tmp), 16));
  }
  // Round to nearest even exactly as moe::to_bf16 (integer steps: BFCVTN would
  // flush denormals at neon_bf16 and does not exist at neon).
  static uint16x4_t round_bf16(F v) {
    const I u = vreinterpretq_u32_f32(v);
    const I hi = vshrq_n_u32(u, 16);
    const I lsb = vandq_u32(hi, vdupq_n_u32(1));
    const I rounded = vshrq_n_u32(vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7fff)), lsb), 16);
    const I nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffff)), vdupq_n_u32(0x7f800000));
    return vmovn_u32(vbslq_u32(nan, vorrq_u32(hi, vdupq_n_u32(0x40)), rounded));
  }
  static void store_bf16(bf16* p, F v) { vst1_u16(reinterpret_cast<uint16_t*>(p), round_bf16(v)); }
  static void store_bf16_n(bf16* p, F v, int64_t n) {
    if (n >= L) return store_bf16(p, v);
    uint16_t tmp[L];
    vst1_u16(tmp, round_bf16(v));
    if (n > 0) std::memcpy(p, tmp, size_t(n) * 2);
  }

  // A 32-bit word in every lane, and the two bf16 halves of such words widened to f32.
  static F bcast_word(uint32_t w) { return vreinterpretq_f32_u32(vdupq_n_u32(w)); }
  static F low_bf16(F w) { return vreinterpretq_f32_u32(vshlq_n_u32(vreinterpretq_u32_f32(w), 16)); }
  static F high_bf16(F w) {
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(w), vdupq_n_u32(0xffff0000u)));
  }

  // Packing: L 32-bit words (byte loads: the source may be only 2-byte aligned).
  static I words(const void* p) { return vreinterpretq_u32_u8(vld1q_u8(static_cast<const uint8_t*>(p))); }
  static I words_n(const void* p, int64_t nbytes) {  // the first nbytes bytes, the rest zero
    if (nbytes >= 4 * L) return words(p);
    uint8_t tmp[4 * L] = {};
    if (nbytes > 0) std::memcpy(tmp, p, size_t(nbytes));
    return vreinterpretq_u32_u8(vld1q_u8(tmp));
  }
  static I u16_n(const uint16_t* p, int64_t n) {  // lane j = p[j] zero-extended, j < n; else 0
    if (n >= L) return vmovl_u16(vld1_u16(p));
    uint16_t tmp[L] = {};
    if (n > 0) std::memcpy(tmp, p, size_t(n) * 2);
    return vmovl_u16(vld1_u16(tmp));
  }
  static I shl16(I v) { return vshlq_n_u32(v, 16); }
  static I or_(I a, I b) { return vorrq_u32(a, b); }
  static I zero_words() { return vdupq_n_u32(0); }
  static void store_words(uint32_t* p, I v) { vst1q_u32(p, v); }

  // In-register transpose of 4 rows of 4 words: r[c] becomes column c.
  static void transpose(I r[L]) {
    const I t0 = vtrn1q_u32(r[0], r[1]), t1 = vtrn2q_u32(r[0], r[1]);  // a0 b0 a2 b2 | a1 b1 a3 b3
    const I t2 = vtrn1q_u32(r[2], r[3]), t3 = vtrn2q_u32(r[2], r[3]);
    auto lo = [](I a, I b) {
      return vreinterpretq_u32_u64(vtrn1q_u64(vreinterpretq_u64_u32(a), vreinterpretq_u64_u32(b)));
    };
    auto hi = [](I a, I b) {
      return vreinterpretq_u32_u64(vtrn2q_u64(vreinterpretq_u64_u32(a), vreinterpretq_u64_u32(b)));
    };
    r[0] = lo(t0, t2), r[1] = lo(t1, t3), r[2] = hi(t0, t2), r[3] = hi(t1, t3);
  }
};

}  // namespace moe::arm
