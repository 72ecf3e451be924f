// Inline IEEE half (binary16) and bfloat16 <-> float32 conversions. Pure functions, any thread.
// Written branch-free (masks, not jumps) so the block loops in dtype.cc auto-vectorise.
// Rounding is round-to-nearest-even; NaN stays NaN (quietened), Inf stays Inf, subnormals are
// exact in both directions.
#pragma once

#include <cstdint>
#include <cstring>

namespace hvd::common::half {

inline uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float bitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// binary16 -> float32. Let em = the 15 magnitude bits (5 exponent, 10 mantissa).
//  - normal (exponent 1..30): re-bias the exponent by 127 - 15 = 112 and widen the mantissa:
//    float bits = (em << 13) + (112 << 23).
//  - Inf/NaN (exponent 31): em << 13 already has the exponent bits 0x0f800000; OR-ing in
//    0x7f800000 sets the float exponent to 255 and keeps the mantissa (the NaN payload).
//  - zero/subnormal (exponent 0): the value is m * 2^-24 with m < 1024, exact in float.
inline float halfToFloatInline(uint16_t h) {
  const uint32_t em = h & 0x7fffu;
  const uint32_t normal = (em << 13) + (112u << 23);
  const uint32_t inf_nan = (em << 13) | 0x7f800000u;
  const uint32_t tiny = floatBits(static_cast<float>(static_cast<int32_t>(em)) * 0x1p-24f);
  const int32_t sem = static_cast<int32_t>(em);  // < 2^15: signed compares are exact
  const uint32_t big_mask = 0u - static_cast<uint32_t>(sem >= 0x7c00);
  const uint32_t tiny_mask = 0u - static_cast<uint32_t>(sem < 0x0400);
  uint32_t bits = (inf_nan & big_mask) | (normal & ~big_mask);
  bits = (tiny & tiny_mask) | (bits & ~tiny_mask);
  return bitsFloat(bits | (static_cast<uint32_t>(h & 0x8000u) << 16));
}

// float32 -> binary16, round-to-nearest-even. With a = |f| as bits:
//  - NaN (a > 0x7f800000): exponent 31, top mantissa bits kept, quiet bit forced.
//  - a >= 0x477ff000 (65520, halfway between the largest half 65504 and 2^16, a tie that rounds
//    to the even neighbour 2^16) or Inf: overflow to Inf, 0x7c00.
//  - normal half range (a >= 2^-14 = 0x38800000): re-bias by -112, then drop 13 mantissa bits
//    with RNE: add 0xfff plus the lowest kept bit, shift. A mantissa carry correctly bumps the
//    exponent.
//  - below 2^-14: the result is the subnormal integer round(|f| * 2^24) in 0..1024 (1024 is the
//    smallest normal's encoding, also correct). Scaling by 2^24 is exact; adding 2^23 in float
//    makes the FPU round to an integer with RNE, which is then the low mantissa bits.
inline uint16_t floatToHalfInline(float f) {
  const uint32_t x = floatBits(f);
  const uint32_t a = x & 0x7fffffffu;
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  const uint32_t t = a - (112u << 23);
  const uint32_t normal = (t + 0xfffu + ((t >> 13) & 1u)) >> 13;
  const float scaled = bitsFloat(a) * 0x1p24f + 0x1p23f;
  const uint32_t tiny = floatBits(scaled) - 0x4b000000u;
  // a < 2^31, so signed compares (one SSE2 instruction each) are exact.
  const int32_t sa = static_cast<int32_t>(a);
  const uint32_t normal_mask = 0u - static_cast<uint32_t>(sa >= 0x38800000);
  const uint32_t inf_mask = 0u - static_cast<uint32_t>(sa >= 0x477ff000);
  const uint32_t nan_mask = 0u - static_cast<uint32_t>(sa > 0x7f800000);
  uint32_t r = (normal & normal_mask) | (tiny & ~normal_mask);
  r = (0x7c00u & inf_mask) | (r & ~inf_mask);
  r = (nan & nan_mask) | (r & ~nan_mask);
  return static_cast<uint16_t>(r | sign);
}

// bfloat16 is the top half of a float32.
inline float bfloat16ToFloatInline(uint16_t b) { return bitsFloat(static_cast<uint32_t>(b) << 16); }

// float32 -> bfloat16, RNE on the dropped 16 bits (a carry rounds the largest finite values to
// Inf, as IEEE requires); NaN keeps its top bits with the quiet bit forced.
inline uint16_t floatToBfloat16Inline(float f) {
  const uint32_t x = floatBits(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t nan = (x >> 16) | 0x0040u;
  const bool is_nan = (x & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(is_nan ? nan : rounded);
}

}  // namespace hvd::common::half
