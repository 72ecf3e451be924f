// Adasum's element kernels. The loops are plain on purpose: the sums are Horovod's double
// accumulations in Horovod's order (left to right for float32/float64, its AVX kernel's four
// lanes for half types), and Adasum's cost is dominated by its log2(n) exchanges.
#include "algo/adasum_kernels.h"

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "common/check.h"
#include "common/half.h"

namespace hvd::algo {
namespace {

template <typename T, typename Load>
DotAndNorms dotLoop(const T* __restrict own, const T* __restrict other, size_t count, Load load) {
  DotAndNorms s;
  for (size_t i = 0; i < count; ++i) {
    const double a = load(own[i]);
    const double b = load(other[i]);
    s.dot += a * b;
    s.own += a * a;
    s.other += b * b;
  }
  return s;
}

// Horovod's float16 kernel (ComputeDotAndNormSqrdsfp16, AVX): four double lanes, lane k
// summing elements k, k+4, k+8, ... in order (the products of widened halves are exact, so its
// fused multiply-adds round as these adds do), then (l0 + l2) + (l1 + l3).
template <typename Load>
DotAndNorms dotLanes(const uint16_t* __restrict own, const uint16_t* __restrict other,
                     size_t count, Load load) {
  double dot[4] = {}, a2[4] = {}, b2[4] = {};
  for (size_t i = 0; i < count; ++i) {
    const double a = load(own[i]);
    const double b = load(other[i]);
    dot[i % 4] += a * b;
    a2[i % 4] += a * a;
    b2[i % 4] += b * b;
  }
  DotAndNorms s;
  s.dot = (dot[0] + dot[2]) + (dot[1] + dot[3]);
  s.own = (a2[0] + a2[2]) + (a2[1] + a2[3]);
  s.other = (b2[0] + b2[2]) + (b2[1] + b2[3]);
  return s;
}

template <typename T>
void scaledAddWide(T* __restrict own, double own_coeff, const T* __restrict other,
                   double other_coeff, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    own[i] = static_cast<T>(own_coeff * static_cast<double>(own[i]) +
                            other_coeff * static_cast<double>(other[i]));
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void scaledAddHalf(uint16_t* __restrict own, double own_coeff, const uint16_t* __restrict other,
                   double other_coeff, size_t count) {
  const float a_coeff = static_cast<float>(own_coeff);
  const float b_coeff = static_cast<float>(other_coeff);
  for (size_t i = 0; i < count; ++i) {
    own[i] = FromFloat(std::fmaf(b_coeff, ToFloat(other[i]), a_coeff * ToFloat(own[i])));
  }
}

}  // namespace

DotAndNorms dotAndNorms(const void* own, const void* other, size_t count,
                        common::DataType dtype) {
  using common::DataType;
  namespace half = common::half;
  switch (dtype) {
    case DataType::kFloat32:
      return dotLoop(static_cast<const float*>(own), static_cast<const float*>(other), count,
                     [](float v) { return static_cast<double>(v); });
    case DataType::kFloat64:
      return dotLoop(static_cast<const double*>(own), static_cast<const double*>(other), count,
                     [](double v) { return v; });
    case DataType::kFloat16:
      return dotLanes(static_cast<const uint16_t*>(own), static_cast<const uint16_t*>(other),
                      count, [](uint16_t v) { return double{half::halfToFloatInline(v)}; });
    case DataType::kBfloat16:  // Horovod has no bfloat16 Adasum; the float16 kernel's order
      return dotLanes(static_cast<const uint16_t*>(own), static_cast<const uint16_t*>(other),
                      count, [](uint16_t v) { return double{half::bfloat16ToFloatInline(v)}; });
    default: break;
  }
  HVD_CHECK(false && "dotAndNorms: Adasum dtypes are checked at enqueue (algo::checkAdasum)");
  return DotAndNorms{};
}

double adasumCoefficient(double dot, double norm2) {
  static const double kMinNorm2 = std::sqrt(DBL_MIN);
  return norm2 >= kMinNorm2 ? 1.0 - dot / norm2 * 0.5 : 1.0;
}

void scaledAdd(void* own, double own_coeff, const void* other, double other_coeff, size_t count,
               common::DataType dtype) {
  using common::DataType;
  namespace half = common::half;
  switch (dtype) {
    case DataType::kFloat32:
      return scaledAddWide(static_cast<float*>(own), own_coeff, static_cast<const float*>(other),
                           other_coeff, count);
    case DataType::kFloat64:
      return scaledAddWide(static_cast<double*>(own), own_coeff,
                           static_cast<const double*>(other), other_coeff, count);
    case DataType::kFloat16:
      return scaledAddHalf<half::halfToFloatInline, half::floatToHalfInline>(
          static_cast<uint16_t*>(own), own_coeff, static_cast<const uint16_t*>(other),
          other_coeff, count);
    case DataType::kBfloat16:
      return scaledAddHalf<half::bfloat16ToFloatInline, half::floatToBfloat16Inline>(
          static_cast<uint16_t*>(own), own_coeff, static_cast<const uint16_t*>(other),
          other_coeff, count);
    default: break;
  }
  HVD_CHECK(false && "scaledAdd: Adasum dtypes are checked at enqueue (algo::checkAdasum)");
}

}  // namespace hvd::algo
