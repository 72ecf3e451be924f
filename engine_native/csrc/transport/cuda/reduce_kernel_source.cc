// The device reductions' CUDA C++ source (reduce_kernel_source.h). It must compile with NVRTC
// (no headers: only built-in types, __float_as_uint/__uint_as_float) and with a host C++17
// compiler behind the fake's prelude (tests/fakecuda/fake_nvrtc.cc defines __global__,
// __device__, threadIdx, ... for that), so it uses nothing else of CUDA.
//
// Each element i is reduced by one thread of a grid-stride loop; no shared memory or
// __syncthreads is needed, and dst may alias a source because thread i reads every srcs[k][i]
// before it writes dst[i]. The arithmetic is common/dtype.cc's, in the same order:
//  - integers: prescale and postscale as saturatingCast<T>(factor * double(x)) when the factor
//    is not 1; Sum/Product wrap in an unsigned type at least 32 bits wide; Min/Max compare.
//  - float32/float64: multiply by the factor in the element type; Min/Max propagate NaN.
//  - float16/bfloat16: widened to float32 (common/half.h's conversions, written again below),
//    prescaled, reduced across all sources and postscaled in float32, rounded once (RNE).
//  - bool: Sum/Max are or, Min/Product and, giving 0/1; a factor keeps nonzero unless it is 0.
//  - one source and no scaling copies the bits, as the CPU path copies its input.
// Sources are folded in order k = 0, 1, ..., so float results equal the CPU's pairwise
// reduceInto in the same order bit for bit (device_kernels.cc compiles with --fmad=false).
#include "transport/cuda/reduce_kernel_source.h"

namespace hvd::transport::cuda {
namespace {

const char* const kBody = R"CUDA(
typedef unsigned long long hvd_u64;
struct HvdReduceArgs {  // = hvd::transport::cuda::ReduceArgs
  const void* srcs[16];
  void* dst;
  hvd_u64 count;
  double prescale;
  double postscale;
  int nsrcs;
  int identity;
};

template <typename T> struct HvdLimits;
template <> struct HvdLimits<unsigned char> { static constexpr unsigned char lo = 0, hi = 255; };
template <> struct HvdLimits<signed char> { static constexpr signed char lo = -128, hi = 127; };
template <> struct HvdLimits<short> { static constexpr short lo = -32768, hi = 32767; };
template <> struct HvdLimits<int> { static constexpr int lo = -2147483647 - 1, hi = 2147483647; };
template <> struct HvdLimits<long long> {
  static constexpr long long lo = -9223372036854775807LL - 1, hi = 9223372036854775807LL;
};
template <typename T> struct HvdWrap { typedef unsigned int type; };
template <> struct HvdWrap<long long> { typedef unsigned long long type; };

template <typename T>
__device__ __forceinline__ T hvdSaturate(double v) {
  const double lo = (double)HvdLimits<T>::lo, hi = (double)HvdLimits<T>::hi;
  if (v != v) return T(0);
  if (v <= lo) return HvdLimits<T>::lo;
  if (v >= hi) return HvdLimits<T>::hi;
  return (T)v;
}

// common/half.h's conversions: RNE, NaN quietened, Inf kept, subnormals exact.
__device__ __forceinline__ float hvdHalfToFloat(unsigned short h) {
  const unsigned em = h & 0x7fffu;
  unsigned bits = em >= 0x7c00u ? ((em << 13) | 0x7f800000u) : ((em << 13) + (112u << 23));
  if (em < 0x0400u) bits = __float_as_uint((float)(int)em * 0x1p-24f);
  return __uint_as_float(bits | ((unsigned)(h & 0x8000u) << 16));
}
__device__ __forceinline__ unsigned short hvdFloatToHalf(float f) {
  const unsigned x = __float_as_uint(f);
  const unsigned a = x & 0x7fffffffu;
  const unsigned sign = (x >> 16) & 0x8000u;
  if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);
  if (a >= 0x38800000u) {
    const unsigned t = a - (112u << 23);
    return (unsigned short)(sign | ((t + 0xfffu + ((t >> 13) & 1u)) >> 13));
  }
  const float scaled = __uint_as_float(a) * 0x1p24f + 0x1p23f;
  return (unsigned short)(sign | (__float_as_uint(scaled) - 0x4b000000u));
}
__device__ __forceinline__ float hvdBf16ToFloat(unsigned short b) {
  return __uint_as_float((unsigned)b << 16);
}
__device__ __forceinline__ unsigned short hvdFloatToBf16(float f) {
  const unsigned x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x0040u);
  return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// Ops: how two values combine, per kind of element.
#define HVD_WRAP(T, expr) (T)((typename HvdWrap<T>::type)a expr (typename HvdWrap<T>::type)b)
struct HvdSum {
  template <typename T> __device__ static T ints(T a, T b) { return HVD_WRAP(T, +); }
  template <typename T> __device__ static T floats(T a, T b) { return a + b; }
  __device__ static unsigned char bools(unsigned char a, unsigned char b) { return (a | b) != 0; }
};
struct HvdProduct {
  template <typename T> __device__ static T ints(T a, T b) { return HVD_WRAP(T, *); }
  template <typename T> __device__ static T floats(T a, T b) { return a * b; }
  __device__ static unsigned char bools(unsigned char a, unsigned char b) {
    return (a != 0) & (b != 0);
  }
};
struct HvdMin {
  template <typename T> __device__ static T ints(T a, T b) { return b < a ? b : a; }
  template <typename T> __device__ static T floats(T a, T b) { return (a < b || a != a) ? a : b; }
  __device__ static unsigned char bools(unsigned char a, unsigned char b) {
    return (a != 0) & (b != 0);
  }
};
struct HvdMax {
  template <typename T> __device__ static T ints(T a, T b) { return a < b ? b : a; }
  template <typename T> __device__ static T floats(T a, T b) { return (a > b || a != a) ? a : b; }
  __device__ static unsigned char bools(unsigned char a, unsigned char b) { return (a | b) != 0; }
};

// Codecs: how an element is read (with prescale), combined, and written (with postscale).
template <typename T> struct HvdInts {
  typedef T Store; typedef T Acc;
  __device__ static Acc load(const void* p, hvd_u64 i, double f) {
    const T x = ((const T*)p)[i];
    return f != 1.0 ? hvdSaturate<T>(f * (double)x) : x;
  }
  template <typename Op> __device__ static Acc combine(Acc a, Acc b) { return Op::ints(a, b); }
  __device__ static void store(void* p, hvd_u64 i, Acc a, double f) {
    ((T*)p)[i] = f != 1.0 ? hvdSaturate<T>(f * (double)a) : a;
  }
};
template <typename T> struct HvdFloats {
  typedef T Store; typedef T Acc;
  __device__ static Acc load(const void* p, hvd_u64 i, double f) {
    const T x = ((const T*)p)[i];
    return f != 1.0 ? (T)f * x : x;
  }
  template <typename Op> __device__ static Acc combine(Acc a, Acc b) { return Op::floats(a, b); }
  __device__ static void store(void* p, hvd_u64 i, Acc a, double f) {
    ((T*)p)[i] = f != 1.0 ? (T)f * a : a;
  }
};
template <int kBfloat16> struct HvdHalves {
  typedef unsigned short Store; typedef float Acc;
  __device__ static Acc load(const void* p, hvd_u64 i, double f) {
    const unsigned short h = ((const unsigned short*)p)[i];
    const float x = kBfloat16 ? hvdBf16ToFloat(h) : hvdHalfToFloat(h);
    return f != 1.0 ? (float)f * x : x;
  }
  template <typename Op> __device__ static Acc combine(Acc a, Acc b) { return Op::floats(a, b); }
  __device__ static void store(void* p, hvd_u64 i, Acc a, double f) {
    if (f != 1.0) a = (float)f * a;
    ((unsigned short*)p)[i] = kBfloat16 ? hvdFloatToBf16(a) : hvdFloatToHalf(a);
  }
};
struct HvdBools {
  typedef unsigned char Store; typedef unsigned char Acc;
  __device__ static Acc load(const void* p, hvd_u64 i, double f) {
    const unsigned char x = ((const unsigned char*)p)[i];
    return f != 1.0 ? (unsigned char)((x != 0) & (f != 0.0)) : x;
  }
  template <typename Op> __device__ static Acc combine(Acc a, Acc b) { return Op::bools(a, b); }
  __device__ static void store(void* p, hvd_u64 i, Acc a, double f) {
    ((unsigned char*)p)[i] = f != 1.0 ? (unsigned char)((a != 0) & (f != 0.0)) : a;
  }
};

template <typename Codec, typename Op>
__device__ __forceinline__ void hvdReduce(const HvdReduceArgs& a) {
  typedef typename Codec::Store Store;
  typedef typename Codec::Acc Acc;
  const hvd_u64 stride = (hvd_u64)blockDim.x * gridDim.x;
  for (hvd_u64 i = (hvd_u64)blockIdx.x * blockDim.x + threadIdx.x; i < a.count; i += stride) {
    if (a.identity) {
      ((Store*)a.dst)[i] = ((const Store*)a.srcs[0])[i];
      continue;
    }
    Acc acc = Codec::load(a.srcs[0], i, a.prescale);
    for (int k = 1; k < a.nsrcs; ++k) {
      acc = Codec::template combine<Op>(acc, Codec::load(a.srcs[k], i, a.prescale));
    }
    Codec::store(a.dst, i, acc, a.postscale);
  }
}
)CUDA";

// The codec each dtype uses, indexed by common::DataType's code.
const char* const kCodecs[common::kNumDataTypes] = {
    "HvdInts<unsigned char>", "HvdInts<signed char>", "HvdInts<short>", "HvdInts<int>",
    "HvdInts<long long>", "HvdHalves<0>", "HvdHalves<1>", "HvdFloats<float>",
    "HvdFloats<double>", "HvdBools"};

struct OpEntry {
  common::ReduceOp op;
  const char* name;    // in the kernel name
  const char* type;    // in the source
};
const OpEntry kOps[] = {{common::ReduceOp::kSum, "sum", "HvdSum"},
                        {common::ReduceOp::kMin, "min", "HvdMin"},
                        {common::ReduceOp::kMax, "max", "HvdMax"},
                        {common::ReduceOp::kProduct, "product", "HvdProduct"}};

const char* opName(common::ReduceOp op) {
  for (const auto& entry : kOps) {
    if (entry.op == op) return entry.name;
  }
  return "unsupported";
}

std::string buildSource() {
  std::string out = "// hvd-magic device reductions (engine_native/csrc/transport/cuda/"
                    "reduce_kernel_source.cc)\n";
  out += kBody;
  for (int code = 0; code < common::kNumDataTypes; ++code) {
    const auto dtype = static_cast<common::DataType>(code);
    for (const auto& entry : kOps) {
      out += std::string("extern \"C\" __global__ void __launch_bounds__(256) ") +
             reduceKernelName(dtype, entry.op) + "(HvdReduceArgs a) { hvdReduce<" +
             kCodecs[code] + ", " + entry.type + ">(a); }\n";
    }
  }
  return out;
}

}  // namespace

const std::string& reduceKernelSource() {
  static const std::string source = buildSource();
  return source;
}

std::string reduceKernelName(common::DataType dtype, common::ReduceOp op) {
  return std::string("hvd_reduce_") + common::dataTypeName(dtype) + "_" + opName(op);
}

}  // namespace hvd::transport::cuda
