/* fake_nccl_reduce.c: the fake NCCL's reductions, one element at a time in rank order, for
 * every ncclDataType_t and ncclRedOp_t (plus PreMulSum).
 *
 * Note [Reduction arithmetic]: integers wrap (done in the unsigned type); Avg on integers is
 * the sum, then one division by n truncating toward zero (NCCL's SumPostDiv); Avg on floats
 * sums x / n. PreMulSum sums x * scalar. float16 and bfloat16 are computed in float and
 * rounded once, to nearest even, when stored; float32 in float, float64 in double. */
#include <string.h>

#include "fake_nccl.h"

enum { kInt8, kUint8, kInt32, kUint32, kInt64, kUint64, kFloat16, kFloat32, kFloat64, kBf16 };

size_t fn_dtype_size(int dtype) {
  static const size_t sizes[kNumDataTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
  return dtype >= 0 && dtype < kNumDataTypes ? sizes[dtype] : 0;
}

/* ---- half types ---------------------------------------------------------------------------- */

static uint32_t floatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

static float bitsFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

/* Keeps the top bits of `mantissa` after a right shift by `shift`, rounding to nearest even. */
static uint32_t shiftRoundEven(uint32_t mantissa, int shift) {
  const uint32_t kept = mantissa >> shift, rest = mantissa & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return kept + (rest > half || (rest == half && (kept & 1u)));
}

static uint16_t halfFromFloat(float f) {
  const uint32_t x = floatBits(f), mag = x & 0x7fffffffu;
  const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  if (mag > 0x7f800000u) return sign | 0x7e00u;              /* NaN */
  if (mag >= 0x47800000u) return sign | 0x7c00u;             /* >= 65536: infinity */
  if (mag >= 0x38800000u) {                                  /* normal: rebias 127 -> 15 */
    return sign | (uint16_t)shiftRoundEven(mag - 0x38000000u, 13);  /* a carry may reach inf */
  }
  if (mag < 0x33000000u) return sign;                        /* below 2^-25: zero */
  const uint32_t exponent = mag >> 23, mantissa = (mag & 0x7fffffu) | 0x800000u;
  return sign | (uint16_t)shiftRoundEven(mantissa, 126 - (int)exponent);  /* subnormal */
}

static float halfToFloat(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bitsFloat(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    const float value = (float)mantissa * (1.0f / 16777216.0f);  /* mantissa * 2^-24, exact */
    return sign ? -value : value;
  }
  return bitsFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

static uint16_t bf16FromFloat(float f) {
  const uint32_t x = floatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);  /* quiet NaN */
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static float bf16ToFloat(uint16_t h) { return bitsFloat((uint32_t)h << 16); }

/* ---- kernels ------------------------------------------------------------------------------- */

/* Integers: T the type, U its unsigned twin (wrapping arithmetic). */
#define INT_REDUCE(NAME, T, U)                                                                 \
  static void NAME(void* outp, const void* const* in, int n, size_t count,                    \
                   const fn_redop* op) {                                                       \
    T* out = outp;                                                                             \
    const U scalar = (U)op->scalar_int;                                                        \
    for (size_t i = 0; i < count; ++i) {                                                       \
      T acc = ((const T*)in[0])[i];                                                            \
      if (op->kind == kOpPreMulSum) acc = (T)((U)acc * scalar);                                \
      for (int p = 1; p < n; ++p) {                                                            \
        const T x = ((const T*)in[p])[i];                                                      \
        switch (op->kind) {                                                                    \
          case kOpProd: acc = (T)((U)acc * (U)x); break;                                       \
          case kOpMax: acc = x > acc ? x : acc; break;                                         \
          case kOpMin: acc = x < acc ? x : acc; break;                                         \
          case kOpPreMulSum: acc = (T)((U)acc + (U)x * scalar); break;                         \
          default: acc = (T)((U)acc + (U)x); break; /* Sum, Avg */                             \
        }                                                                                      \
      }                                                                                        \
      out[i] = op->kind == kOpAvg ? (T)(acc / (T)n) : acc;                                     \
    }                                                                                          \
  }

/* Floating point: T the stored type, F the compute type, LOAD/STORE convert. */
#define FLOAT_REDUCE(NAME, T, F, LOAD, STORE)                                                  \
  static void NAME(void* outp, const void* const* in, int n, size_t count,                    \
                   const fn_redop* op) {                                                       \
    T* out = outp;                                                                             \
    const F scalar = (F)op->scalar_float, ranks = (F)n;                                        \
    const int sum_like = op->kind == kOpSum || op->kind == kOpAvg || op->kind == kOpPreMulSum; \
    for (size_t i = 0; i < count; ++i) {                                                       \
      F acc = 0;                                                                               \
      for (int p = 0; p < n; ++p) {                                                            \
        F x = LOAD(((const T*)in[p])[i]);                                                      \
        if (op->kind == kOpAvg) x = x / ranks;                                                 \
        if (op->kind == kOpPreMulSum) x = x * scalar;                                          \
        if (p == 0) {                                                                          \
          acc = x;                                                                             \
        } else if (sum_like) {                                                                 \
          acc = acc + x;                                                                       \
        } else if (op->kind == kOpProd) {                                                      \
          acc = acc * x;                                                                       \
        } else if (op->kind == kOpMax) {                                                       \
          acc = x > acc ? x : acc;                                                             \
        } else {                                                                               \
          acc = x < acc ? x : acc;                                                             \
        }                                                                                      \
      }                                                                                        \
      out[i] = STORE(acc);                                                                     \
    }                                                                                          \
  }

#define SAME(x) (x)

INT_REDUCE(reduceInt8, int8_t, uint8_t)
INT_REDUCE(reduceUint8, uint8_t, uint8_t)
INT_REDUCE(reduceInt32, int32_t, uint32_t)
INT_REDUCE(reduceUint32, uint32_t, uint32_t)
INT_REDUCE(reduceInt64, int64_t, uint64_t)
INT_REDUCE(reduceUint64, uint64_t, uint64_t)
FLOAT_REDUCE(reduceFloat16, uint16_t, float, halfToFloat, halfFromFloat)
FLOAT_REDUCE(reduceFloat32, float, float, SAME, SAME)
FLOAT_REDUCE(reduceFloat64, double, double, SAME, SAME)
FLOAT_REDUCE(reduceBfloat16, uint16_t, float, bf16ToFloat, bf16FromFloat)

void fn_reduce(void* out, const void* const* in, int n, size_t count, const fn_redop* op) {
  typedef void (*kernel)(void*, const void* const*, int, size_t, const fn_redop*);
  static const kernel kernels[kNumDataTypes] = {
      reduceInt8,    reduceUint8,   reduceInt32,   reduceUint32,   reduceInt64,
      reduceUint64,  reduceFloat16, reduceFloat32, reduceFloat64, reduceBfloat16};
  kernels[op->dtype](out, in, n, count, op);
}

void fn_read_scalar(const void* scalar, int dtype, fn_redop* op) {
  switch (dtype) {
    case kInt8: op->scalar_int = *(const int8_t*)scalar; break;
    case kUint8: op->scalar_int = *(const uint8_t*)scalar; break;
    case kInt32: op->scalar_int = *(const int32_t*)scalar; break;
    case kUint32: op->scalar_int = *(const uint32_t*)scalar; break;
    case kInt64: op->scalar_int = *(const int64_t*)scalar; break;
    case kUint64: op->scalar_int = (int64_t)*(const uint64_t*)scalar; break;
    case kFloat16: op->scalar_float = halfToFloat(*(const uint16_t*)scalar); break;
    case kFloat32: op->scalar_float = *(const float*)scalar; break;
    case kFloat64: op->scalar_float = *(const double*)scalar; break;
    case kBf16: op->scalar_float = bf16ToFloat(*(const uint16_t*)scalar); break;
    default: break;
  }
}
