// isin of small integer tensors by a scan, without ATen's TensorIterator.
//
// A decoding loop asks three times a step whether its newest ids are end-of-sequence or
// padding ids (torch.isin of a [1, 1] or [1, L] id tensor against a handful of ids). The
// answer of each element is whether some test element equals it: for integers that has one
// value however it is computed, so ATen's two algorithms (a scan, or sorting when there are
// many test elements) and this scan agree bit for bit. Taken: int64 or int32 elements and
// test elements of the same dtype, contiguous, 1 to GRAIN_SIZE elements against at most 64
// test elements. Anything else (floats, whose NaNs and signed zeros ATen's paths compare in
// their own ways; promotion; more test elements) is left to ATen's kernel.
#pragma once

#include <ATen/core/Tensor.h>

namespace neuron::fastpath {

// Whether the scan takes isin(elements, test_elements).
bool small_isin_takes(const at::Tensor& elements, const at::Tensor& test_elements);

// Writes isin(elements, test_elements) (or its negation) into `out`, a contiguous bool
// tensor of elements' sizes.
void run_small_isin(const at::Tensor& elements, const at::Tensor& test_elements, bool invert, const at::Tensor& out);

}  // namespace neuron::fastpath
