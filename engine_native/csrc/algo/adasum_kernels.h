// The arithmetic of Adasum's pairwise step (algo/allreduce_adasum.cc), per floating-point dtype:
// dot products and squared norms in double, and the coefficient update a <- alpha a + beta b.
// Pure functions over host memory, any thread; Horovod's (common/ops/adasum/adasum.h) in what
// they compute and in the precision of each step.
#pragma once

#include <cstddef>

#include "common/dtype.h"

namespace hvd::algo {

// Partial sums over one piece of a tensor: own . other, |own|^2 and |other|^2, in double.
struct DotAndNorms {
  double dot = 0.0;
  double own = 0.0;
  double other = 0.0;
};
// Double accumulation of the widened elements: sequential for float32/float64, in four
// interleaved lanes for float16/bfloat16 (Horovod's AVX float16 kernel's order).
DotAndNorms dotAndNorms(const void* own, const void* other, size_t count,
                        common::DataType dtype);

// Horovod's coefficient of a vector with squared norm `norm2` in adasum(a, b):
// 1 - a.b / (2 |x|^2), or 1 when |x|^2 < sqrt(DBL_MIN) (a zero or vanishing vector).
double adasumCoefficient(double dot, double norm2);

// own[i] = own_coeff * own[i] + other_coeff * other[i]. float32/float64: in double, rounded
// once; float16/bfloat16: in float32 with the coefficients rounded to float, the second product
// fused (Horovod's AVX kernel: mul then fmadd), then rounded to nearest even.
void scaledAdd(void* own, double own_coeff, const void* other, double other_coeff, size_t count,
               common::DataType dtype);

}  // namespace hvd::algo
