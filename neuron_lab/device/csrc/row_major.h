// Whether a tensor lies in memory exactly as a new contiguous one of its sizes would.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace neuron {

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
