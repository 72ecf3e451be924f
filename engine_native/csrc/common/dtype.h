// Data types and reduction kernels. Pure functions, safe on any thread.
// Half types (float16, bfloat16) are reduced with float32 accumulation per call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace hvd::common {

// Codes are part of the Python binding contract (engine_native/_dtypes.py mirrors them).
enum class DataType : int32_t {
  kUint8 = 0, kInt8 = 1, kInt16 = 2, kInt32 = 3, kInt64 = 4,
  kFloat16 = 5, kBfloat16 = 6, kFloat32 = 7, kFloat64 = 8, kBool = 9,
};
constexpr int kNumDataTypes = 10;

// Codes match Horovod's ReduceOp numbering (Average=0, Sum=1, Adasum=2, Min=3, Max=4, Product=5).
enum class ReduceOp : int32_t { kAverage = 0, kSum = 1, kAdasum = 2, kMin = 3, kMax = 4, kProduct = 5 };

bool isValidDataType(int32_t code);
size_t dataTypeSize(DataType dtype);
const char* dataTypeName(DataType dtype);    // "float32", ...
const char* reduceOpName(ReduceOp op);       // "SUM", ...
bool isFloatingPoint(DataType dtype);

// Checks that `op` can reduce `dtype` element by element (e.g. Average on bool is rejected, and
// Adasum, which is not element-wise: algo::checkAdasum has its rules). Returns TypeError.
Status checkReducible(DataType dtype, ReduceOp op);

// dst[i] = dst[i] (op) src[i] for i in [0, count). Average reduces like Sum (scaling is separate).
// Bool: Sum/Max = logical or, Min/Product = logical and.
void reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op);

// buf[i] = factor * buf[i], bit for bit as Horovod's CPU ScaleBuffer: float32 and the half
// types multiply in float32 by (float)factor, float64 and integers in double; integers
// truncate toward zero (saturating where Horovod's cast is undefined). Bool keeps nonzero
// values unless factor is 0.
void scaleInPlace(void* buf, size_t count, DataType dtype, double factor);

// Half conversions, exposed for tests and fusion code.
float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float bfloat16ToFloat(uint16_t b);
uint16_t floatToBfloat16(float f);

}  // namespace hvd::common
