// Small integer arange without ATen's TensorIterator or the boxed fallback.
//
// A decoding loop asks for torch.arange(vocab) and arange(1) every step (a logits
// processor's token ids, cache positions). For int64 ATen computes start + step * i in int64
// arithmetic, exact in any loop, and sizes the result (end - start + step - sign(step)) /
// step, in integer arithmetic too. The kernel takes int64 results of integral start, end and
// step within +-2^53, steps whose sign agrees with the bounds, 0 to GRAIN_SIZE elements, and
// an out= that already has that many elements or none (resized as ATen resizes it); anything
// else (floating bounds, other dtypes, an out= ATen would resize with a warning, the errors
// for a zero or inconsistent step) is left to ATen's kernel.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>

#include <cstdint>
#include <optional>

namespace neuron::fastpath {

// The number of elements arange(start, end, step, out=out) makes, or nullopt when the small
// kernel does not take the call.
std::optional<int64_t> small_arange_size(const c10::Scalar& start, const c10::Scalar& end, const c10::Scalar& step,
                                         const at::Tensor& out);

// Writes start + step * i into every element of `out` (int64, row-major, already sized).
void run_small_arange(const c10::Scalar& start, const c10::Scalar& step, const at::Tensor& out);

}  // namespace neuron::fastpath
