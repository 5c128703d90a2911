// A decoding loop's small reductions and comparisons without ATen's TensorIterator: argmax
// over a row of logits (greedy search's next token), an integer compared with a number, and
// the stopping criteria's any over a row of flags and max of an integer tensor.
//
// Both have one answer however computed. ATen's argmax scans each row keeping the first
// maximum and the first NaN over everything (ArgMaxOps: greater_or_nan, ties to the lower
// index), and a plain scan with the same rule gives its indices. eq of an integer tensor and
// an integer is exact. Taken: argmax over the last dim of a row-major float, double, int32 or
// int64 tensor with at least one element a row and 1 to GRAIN_SIZE elements; eq of a
// row-major int32 or int64 tensor of 1 to GRAIN_SIZE elements and an integral number. Anything
// else (dim=None, other dims, empty rows and their error, float comparisons and their
// promotion) is left to ATen's kernel.
// any over the last dim of a row-major bool tensor, and max of all elements of a row-major
// bool or integer tensor (1 to GRAIN_SIZE elements), are exact too: floats (NaN, signed
// zeros), uint8's legacy any and empty inputs (max's error) are ATen's.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <optional>

namespace neuron::fastpath {

// The result's sizes of argmax(self, dim, keepdim), or nullopt when the small kernel does not take it.
std::optional<c10::SmallVector<int64_t, 6>> plan_small_argmax(const at::Tensor& self, std::optional<int64_t> dim,
                                                              bool keepdim);

// Writes each row's argmax into `out` (int64, contiguous, one element a row of self).
void run_small_argmax(const at::Tensor& self, const at::Tensor& out);

// Whether the small kernel takes eq(self, other) for an integer tensor and a number.
bool small_eq_takes(const at::Tensor& self, const c10::Scalar& other);

// Writes self == other into `out` (bool, contiguous, self's sizes).
void run_small_eq(const at::Tensor& self, const c10::Scalar& other, const at::Tensor& out);

// The result's sizes of any(self, dim, keepdim), or nullopt when the small kernel does not take it.
std::optional<c10::SmallVector<int64_t, 6>> plan_small_any(const at::Tensor& self, int64_t dim, bool keepdim);

// Writes whether each row of self holds a true element into `out` (bool, contiguous).
void run_small_any(const at::Tensor& self, const at::Tensor& out);

// Whether the small kernel takes max(self), the largest of all elements.
bool small_max_takes(const at::Tensor& self);

// Writes max(self) into `out`, a 0-dim tensor of self's dtype.
void run_small_max(const at::Tensor& self, const at::Tensor& out);

}  // namespace neuron::fastpath
