// Data type table and reduction kernels.
//
// Kernels are one template per (type, op): a plain indexed loop over restrict pointers that
// GCC's -O3 vectoriser turns into SIMD. Rules the kernels keep:
//  - integer Sum/Product wrap modulo 2^bits (two's complement, as NumPy and torch do); they are
//    computed in an unsigned type at least 32 bits wide, so no signed overflow or promotion to
//    int ever happens (uint16 * uint16 would overflow int).
//  - float Min/Max propagate NaN (NumPy's minimum/maximum), which also makes the result the same
//    whatever order the ring reduces in.
//  - float16/bfloat16 are widened to float32 in blocks of kHalfBlock elements on the stack,
//    reduced there, and rounded back once (RNE, common/half.h).
//  - bool: Sum/Max are logical or, Min/Product logical and; outputs are canonical 0/1.
#include "common/dtype.h"

#include <limits>
#include <type_traits>

#include "common/check.h"
#include "common/half.h"

// x86-64 builds add AVX2/F16C half kernels chosen at run time; -DHVD_PORTABLE_KERNELS (or any
// other target) keeps only the portable ones.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(HVD_PORTABLE_KERNELS)
#define HVD_X86_KERNELS 1
#include <immintrin.h>
#endif

namespace hvd::common {
namespace {

constexpr size_t kHalfBlock = 256;

// The block loops below are inlined into per-ISA wrappers, so they must not stay calls.
#if defined(__GNUC__)
#define HVD_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define HVD_ALWAYS_INLINE inline
#endif

struct SumOp {};
struct MinOp {};
struct MaxOp {};
struct ProductOp {};

// Unsigned arithmetic type for wrapping integer Sum/Product.
template <typename T>
using WrapType = std::conditional_t<(sizeof(T) < 4), uint32_t, std::make_unsigned_t<T>>;

template <typename T>
inline T apply(SumOp, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<WrapType<T>>(a) + static_cast<WrapType<T>>(b));
  } else {
    return a + b;
  }
}

template <typename T>
inline T apply(ProductOp, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<WrapType<T>>(a) * static_cast<WrapType<T>>(b));
  } else {
    return a * b;
  }
}

// NaN-propagating: if a is NaN (a != a) keep a; if b is NaN, a < b is false so b is taken.
template <typename T>
inline T apply(MinOp, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return b < a ? b : a;
  } else {
    return (a < b || a != a) ? a : b;
  }
}

template <typename T>
inline T apply(MaxOp, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return a < b ? b : a;
  } else {
    return (a > b || a != a) ? a : b;
  }
}

template <typename T, typename Op>
void reduceLoop(T* __restrict dst, const T* __restrict src, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = apply(Op{}, dst[i], src[i]);
}

// Bool as bytes: or for Sum/Max, and for Min/Product.
void boolOrLoop(uint8_t* __restrict dst, const uint8_t* __restrict src, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = static_cast<uint8_t>((dst[i] | src[i]) != 0);
}

void boolAndLoop(uint8_t* __restrict dst, const uint8_t* __restrict src, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    dst[i] = static_cast<uint8_t>((dst[i] != 0) & (src[i] != 0));
  }
}

// Half types: widen a block of both operands to float32, reduce there, narrow back once.
// A codec is a pair of block converters. The portable codecs are auto-vectorised for the
// baseline ISA; on x86-64 CPUs with AVX2/F16C (checked once at run time) the whole block loop
// is also compiled for AVX2, and float16 uses the hardware conversions vcvtph2ps/vcvtps2ph
// (RNE, same NaN/Inf/subnormal results as common/half.h).
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
struct PortableCodec {
  static HVD_ALWAYS_INLINE void widen(const uint16_t* __restrict src, float* __restrict dst,
                                      size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = ToFloat(src[i]);
  }
  static HVD_ALWAYS_INLINE void narrow(const float* __restrict src, uint16_t* __restrict dst,
                                       size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = FromFloat(src[i]);
  }
};
using Float16Codec = PortableCodec<half::halfToFloatInline, half::floatToHalfInline>;
using Bfloat16Codec = PortableCodec<half::bfloat16ToFloatInline, half::floatToBfloat16Inline>;

template <typename Codec, typename Op>
HVD_ALWAYS_INLINE void halfReduceBody(uint16_t* __restrict dst, const uint16_t* __restrict src,
                                      size_t count) {
  float a[kHalfBlock];
  float b[kHalfBlock];
  for (size_t base = 0; base < count; base += kHalfBlock) {
    const size_t n = count - base < kHalfBlock ? count - base : kHalfBlock;
    Codec::widen(dst + base, a, n);
    Codec::widen(src + base, b, n);
    for (size_t i = 0; i < n; ++i) a[i] = apply(Op{}, a[i], b[i]);
    Codec::narrow(a, dst + base, n);
  }
}

template <typename Codec, typename Op>
void halfReducePortable(uint16_t* dst, const uint16_t* src, size_t count) {
  halfReduceBody<Codec, Op>(dst, src, count);
}

#if defined(HVD_X86_KERNELS)
#define HVD_AVX2_F16C __attribute__((target("avx2,f16c")))
struct F16cCodec {
  static inline HVD_AVX2_F16C void widen(const uint16_t* src, float* dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; ++i) dst[i] = half::halfToFloatInline(src[i]);
  }
  static inline HVD_AVX2_F16C void narrow(const float* src, uint16_t* dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
    }
    for (; i < n; ++i) dst[i] = half::floatToHalfInline(src[i]);
  }
};

// bfloat16 with AVX2: widening is a shift; narrowing is the RNE of half.h on 8 lanes, NaNs
// quietened, then two vectors of 32-bit results are packed to 16 bits (packus interleaves the
// 128-bit lanes, the permute restores element order).
struct Bfloat16Avx2Codec {
  static inline HVD_AVX2_F16C void widen(const uint16_t* src, float* dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m256i x = _mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16);
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(x));
    }
    for (; i < n; ++i) dst[i] = half::bfloat16ToFloatInline(src[i]);
  }
  static inline HVD_AVX2_F16C __m256i round8(__m256 v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i top = _mm256_srli_epi32(x, 16);
    const __m256i lsb = _mm256_and_si256(top, _mm256_set1_epi32(1));
    const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, bias), 16);
    const __m256i quiet = _mm256_or_si256(top, _mm256_set1_epi32(0x40));
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(rounded, quiet, is_nan);
  }
  static inline HVD_AVX2_F16C void narrow(const float* src, uint16_t* dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m256i lo = round8(_mm256_loadu_ps(src + i));
      const __m256i hi = round8(_mm256_loadu_ps(src + i + 8));
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
    }
    for (; i < n; ++i) dst[i] = half::floatToBfloat16Inline(src[i]);
  }
};

template <typename Codec, typename Op>
HVD_AVX2_F16C void halfReduceAvx2(uint16_t* dst, const uint16_t* src, size_t count) {
  halfReduceBody<Codec, Op>(dst, src, count);
}

bool cpuHasAvx2F16c() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}
#endif

template <typename Op>
void halfDispatch(DataType dtype, void* dst, const void* src, size_t count) {
  using Fn = void (*)(uint16_t*, const uint16_t*, size_t);
#if defined(HVD_X86_KERNELS)
  static const bool fast = cpuHasAvx2F16c();
  static const Fn float16 =
      fast ? halfReduceAvx2<F16cCodec, Op> : halfReducePortable<Float16Codec, Op>;
  static const Fn bfloat16 =
      fast ? halfReduceAvx2<Bfloat16Avx2Codec, Op> : halfReducePortable<Bfloat16Codec, Op>;
#else
  static const Fn float16 = halfReducePortable<Float16Codec, Op>;
  static const Fn bfloat16 = halfReducePortable<Bfloat16Codec, Op>;
#endif
  const Fn fn = dtype == DataType::kFloat16 ? float16 : bfloat16;
  fn(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), count);
}

template <typename T, typename Op>
void reduceAs(void* dst, const void* src, size_t count) {
  reduceLoop<T, Op>(static_cast<T*>(dst), static_cast<const T*>(src), count);
}

template <typename Op>
void reduceTyped(void* dst, const void* src, size_t count, DataType dtype) {
  switch (dtype) {
    case DataType::kUint8: return reduceAs<uint8_t, Op>(dst, src, count);
    case DataType::kInt8: return reduceAs<int8_t, Op>(dst, src, count);
    case DataType::kInt16: return reduceAs<int16_t, Op>(dst, src, count);
    case DataType::kInt32: return reduceAs<int32_t, Op>(dst, src, count);
    case DataType::kInt64: return reduceAs<int64_t, Op>(dst, src, count);
    case DataType::kFloat32: return reduceAs<float, Op>(dst, src, count);
    case DataType::kFloat64: return reduceAs<double, Op>(dst, src, count);
    case DataType::kFloat16:
    case DataType::kBfloat16: return halfDispatch<Op>(dtype, dst, src, count);
    case DataType::kBool: break;
  }
  HVD_CHECK(false && "reduceTyped: bool and invalid dtypes are dispatched elsewhere");
}

// Scaling, as Horovod 0.28.1's CPU ScaleBuffer (common/ops/collective_operations.{h,cc},
// ScaleBufferCPUImpl): `output = factor * input` with the factor in the type Horovod passes.
// float32 multiplies in float by (float)factor; float16 (and bfloat16, which Horovod lacks)
// through float32 by (float)factor, rounded back to nearest even; float64 and the integers
// multiply in double. An integer product is truncated toward zero; where Horovod's conversion
// is undefined (out of range, NaN) it saturates here, NaN giving 0.
template <typename T>
inline T saturatingCast(double v) {
  constexpr double lo = static_cast<double>(std::numeric_limits<T>::min());
  constexpr double hi = static_cast<double>(std::numeric_limits<T>::max());
  if (v != v) return T(0);
  if (v <= lo) return std::numeric_limits<T>::min();
  if (v >= hi) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

template <typename T>
void scaleIntegers(T* __restrict buf, size_t count, double factor) {
  for (size_t i = 0; i < count; ++i) {
    buf[i] = saturatingCast<T>(factor * static_cast<double>(buf[i]));
  }
}

template <typename T>
void scaleFloats(T* __restrict buf, size_t count, T factor) {
  for (size_t i = 0; i < count; ++i) buf[i] = factor * buf[i];
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void halfScaleLoop(uint16_t* __restrict buf, size_t count, float factor) {
  for (size_t i = 0; i < count; ++i) buf[i] = FromFloat(factor * ToFloat(buf[i]));
}

}  // namespace

bool isValidDataType(int32_t code) { return code >= 0 && code < kNumDataTypes; }

size_t dataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kUint8: case DataType::kInt8: case DataType::kBool: return 1;
    case DataType::kInt16: case DataType::kFloat16: case DataType::kBfloat16: return 2;
    case DataType::kInt32: case DataType::kFloat32: return 4;
    case DataType::kInt64: case DataType::kFloat64: return 8;
  }
  return 0;
}

const char* dataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kUint8: return "uint8";
    case DataType::kInt8: return "int8";
    case DataType::kInt16: return "int16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kFloat16: return "float16";
    case DataType::kBfloat16: return "bfloat16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kBool: return "bool";
  }
  return "invalid";
}

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAverage: return "AVERAGE";
    case ReduceOp::kSum: return "SUM";
    case ReduceOp::kAdasum: return "ADASUM";
    case ReduceOp::kMin: return "MIN";
    case ReduceOp::kMax: return "MAX";
    case ReduceOp::kProduct: return "PRODUCT";
  }
  return "INVALID";
}

bool isFloatingPoint(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBfloat16 ||
         dtype == DataType::kFloat32 || dtype == DataType::kFloat64;
}

Status checkReducible(DataType dtype, ReduceOp op) {
  if (!isValidDataType(static_cast<int32_t>(dtype))) {
    return typeError("reduction: invalid dtype code " + std::to_string(static_cast<int>(dtype)));
  }
  const int op_code = static_cast<int>(op);
  if (op_code < 0 || op_code > static_cast<int>(ReduceOp::kProduct)) {
    return typeError("reduction: invalid reduce op code " + std::to_string(op_code));
  }
  if (op == ReduceOp::kAdasum) {  // algo/allreduce_adasum.cc has its own checks
    return typeError("reduction: Adasum combines whole tensors, so only allreduce supports it "
                     "(Horovod: reducescatter supports only AVERAGE and SUM); use op=Average or "
                     "op=Sum");
  }
  if (op == ReduceOp::kAverage && dtype == DataType::kBool) {
    return typeError("reduction: Average is not defined for bool tensors; use op=Sum (logical or) "
                     "or op=Min (logical and)");
  }
  return Status::ok();
}

void reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) {
  if (count == 0) return;
  if (dtype == DataType::kBool) {
    auto* d = static_cast<uint8_t*>(dst);
    const auto* s = static_cast<const uint8_t*>(src);
    const bool is_or = op == ReduceOp::kSum || op == ReduceOp::kMax;
    HVD_CHECK(is_or || op == ReduceOp::kMin || op == ReduceOp::kProduct);
    return is_or ? boolOrLoop(d, s, count) : boolAndLoop(d, s, count);
  }
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum: return reduceTyped<SumOp>(dst, src, count, dtype);
    case ReduceOp::kMin: return reduceTyped<MinOp>(dst, src, count, dtype);
    case ReduceOp::kMax: return reduceTyped<MaxOp>(dst, src, count, dtype);
    case ReduceOp::kProduct: return reduceTyped<ProductOp>(dst, src, count, dtype);
    case ReduceOp::kAdasum: break;
  }
  HVD_CHECK(false && "reduceInto: callers must reject the op with checkReducible first");
}

void scaleInPlace(void* buf, size_t count, DataType dtype, double factor) {
  if (count == 0 || factor == 1.0) return;
  switch (dtype) {
    case DataType::kUint8: return scaleIntegers(static_cast<uint8_t*>(buf), count, factor);
    case DataType::kInt8: return scaleIntegers(static_cast<int8_t*>(buf), count, factor);
    case DataType::kInt16: return scaleIntegers(static_cast<int16_t*>(buf), count, factor);
    case DataType::kInt32: return scaleIntegers(static_cast<int32_t*>(buf), count, factor);
    case DataType::kInt64: return scaleIntegers(static_cast<int64_t*>(buf), count, factor);
    case DataType::kFloat32:
      return scaleFloats(static_cast<float*>(buf), count, static_cast<float>(factor));
    case DataType::kFloat64: return scaleFloats(static_cast<double*>(buf), count, factor);
    case DataType::kFloat16:
      return halfScaleLoop<half::halfToFloatInline, half::floatToHalfInline>(
          static_cast<uint16_t*>(buf), count, static_cast<float>(factor));
    case DataType::kBfloat16:
      return halfScaleLoop<half::bfloat16ToFloatInline, half::floatToBfloat16Inline>(
          static_cast<uint16_t*>(buf), count, static_cast<float>(factor));
    case DataType::kBool: {
      auto* b = static_cast<uint8_t*>(buf);
      const uint8_t keep = factor != 0.0 ? 1 : 0;
      for (size_t i = 0; i < count; ++i) b[i] = static_cast<uint8_t>((b[i] != 0) & keep);
      return;
    }
  }
}

float halfToFloat(uint16_t h) { return half::halfToFloatInline(h); }
uint16_t floatToHalf(float f) { return half::floatToHalfInline(f); }
float bfloat16ToFloat(uint16_t b) { return half::bfloat16ToFloatInline(b); }
uint16_t floatToBfloat16(float f) { return half::floatToBfloat16Inline(f); }

}  // namespace hvd::common
