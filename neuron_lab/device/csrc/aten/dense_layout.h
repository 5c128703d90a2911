// What host kernels that read a tensor's bytes directly check of its layout.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Layout.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cstdint>
#include <optional>

namespace neuron {

// A strided tensor whose bytes hold its values as they read: no conjugate, negative or
// zero-tensor bit for ATen to resolve first.
inline bool bytes_are_values(const at::Tensor& t) {
  return t.defined() && t.layout() == c10::kStrided && t.has_storage() && !t.is_conj() && !t.is_neg() &&
         !t._is_zerotensor();
}

// Row-major strides, size-1 dims included (is_contiguous() ignores theirs): host kernels
// that read such a tensor element by element in order, and make their result the same
// way, give the strides ATen's kernel gives.
inline bool row_major(const at::Tensor& t) {
  int64_t expected = 1;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    if (t.stride(d) != expected) return false;
    expected *= t.size(d);
  }
  return true;
}

// bool, the integers, half, bfloat16, float and double: dtypes whose elements are plain
// 1-, 2-, 4- or 8-byte values (no complex, quantized, bit-packed or float8 types).
inline bool plain_real_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBool: case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong:
    case at::kHalf: case at::kBFloat16: case at::kFloat: case at::kDouble:
      return true;
    default:
      return false;
  }
}

// The broadcast of two shapes, or nullopt when they do not broadcast.
inline std::optional<c10::SmallVector<int64_t, 6>> broadcast(c10::IntArrayRef a, c10::IntArrayRef b) {
  const size_t rank = std::max(a.size(), b.size());
  c10::SmallVector<int64_t, 6> sizes(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i + a.size() < rank ? 1 : a[i + a.size() - rank];
    const int64_t db = i + b.size() < rank ? 1 : b[i + b.size() - rank];
    if (da != db && da != 1 && db != 1) return std::nullopt;
    sizes[i] = da == 1 ? db : da;
  }
  return sizes;
}

// Row-major strides save those of size-1 dims, which address nothing (is_contiguous()'s
// rule): the elements lie in memory in row-major order, densely. A transposed query of one
// token ([1, heads, 1, dim], strides [heads * dim, dim, heads * dim, 1]) is such a tensor.
inline bool dense_row_major(const at::Tensor& t) {
  int64_t expected = 1;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    const int64_t size = t.size(d);
    if (size == 1) continue;
    if (t.stride(d) != expected) return false;
    expected *= size;
  }
  return true;
}

// The strides of a new row-major tensor of `sizes`.
inline c10::SmallVector<int64_t, 6> row_major_strides(c10::IntArrayRef sizes) {
  c10::SmallVector<int64_t, 6> strides(sizes.size());
  int64_t contiguous = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    strides[d] = contiguous;
    contiguous *= std::max<int64_t>(sizes[d], 1);
  }
  return strides;
}

// TensorIterator's reorder_dimensions: the dims of an iteration over `sizes`, innermost
// first, ordered by the operands' strides. `strides[i]` holds operand i's strides in bytes
// against `sizes`, 0 where it broadcasts. An insertion sort from the last dim: for each pair
// the first operand whose strides there differ decides, one with a zero stride says nothing,
// and of equal strides the larger dim goes outside.
c10::SmallVector<int64_t, 6> iteration_order(c10::IntArrayRef sizes,
                                             c10::ArrayRef<c10::SmallVector<int64_t, 6>> strides);

// The strides of a new result of `sizes` laid out contiguously in `order` (innermost first):
// what TensorIterator allocates for an output of that iteration order.
c10::SmallVector<int64_t, 6> contiguous_in_order(c10::IntArrayRef sizes, c10::IntArrayRef order);

// The strides ATen's TensorIterator gives the new result of an elementwise op of
// `operands` (each dense_row_major, or of one element) broadcast to `sizes`: row-major when
// every operand has the result's shape and is contiguous (its fast setup) or all are
// row_major, else contiguous in iteration_order() (a one-element operand's strides count).
// Operands read as dense memory can only move size-1 dims, so the elements still lie in
// row-major order; nullopt where they would not (never, but checked).
std::optional<c10::SmallVector<int64_t, 6>> elementwise_result_strides(
    c10::IntArrayRef sizes, std::initializer_list<const at::Tensor*> operands);

}  // namespace neuron
