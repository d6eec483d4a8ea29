// NaN and inf: in computed floats (logits, copied weights) and in stored tensors of any float dtype.
#pragma once
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace nextn {

// NaN and ±inf among n values: how many, and the flat index of the first (-1 when none).
struct NonFiniteCount {
  int64_t count = 0, first = -1;
};
NonFiniteCount count_non_finite(const float* x, int64_t n);
// Whether all n floats are finite: one pass the compiler vectorizes (cheap next to the matmul that made them).
bool all_finite(const float* x, int64_t n);
// The lowest index of the largest of x[0, n), or -1 when x holds a NaN or inf: what a model writes for a row
// whose argmax is all the engine reads (BatchSegment::argmax), here and on the GPU alike.
int32_t finite_argmax(const float* x, int64_t n);
// out[r] = finite_argmax(row r) for the rows [rows, n] of x.
void finite_argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* out);
// Throws nextn::Error "<what> hold N non-finite value(s) (NaN or inf), the first at row r, column c" when
// the [rows, cols] matrix x has any.
void require_finite(const float* x, int64_t rows, int64_t cols, const std::string& what);

// Non-finite values of a stored tensor, by its dtype's bit patterns: f32 / f64 / bf16 / f16 exponent all
// ones, e4m3 S.1111.111 (it has no inf), e8m0 0xff. Reads every byte; false for dtypes that hold no
// non-finite values (integers).
bool count_non_finite(const TensorView& t, NonFiniteCount& out);
// Like count_non_finite(DType::F8_E8M0) for raw ue8m0 exponents stored as U8 (FP8 block scales).
NonFiniteCount count_non_finite_ue8m0(const TensorView& t);

}  // namespace nextn
