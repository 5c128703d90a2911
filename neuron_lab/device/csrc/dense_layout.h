// What host kernels that read a tensor's bytes directly check of its layout.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Layout.h>

#include <cstdint>

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

}  // namespace neuron
