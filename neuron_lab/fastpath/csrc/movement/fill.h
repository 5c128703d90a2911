// Small fill_(self, value) without ATen's TensorIterator.
//
// torch.full, ones, zeros and scalar_tensor make an empty tensor and fill it: a decoding
// loop's stopping criteria do so with [1] bools several times a step. ATen writes
// value.to<T>() into every element (its scalar fill for one element, its vector loop
// otherwise): the same conversion (its overflow error included) and a plain loop give the
// same bytes. Taken: a row-major tensor of 1 to GRAIN_SIZE elements of bool, an integer type,
// float or double whose bytes are its values, and a real number. Anything else is left to
// ATen's kernel (half and bfloat16 too: ATen converts to them without a range check for one
// element on the CPU, with one otherwise).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>

namespace neuron::fastpath {

// Whether the small kernel takes fill_(self, value).
bool small_fill_takes(const at::Tensor& self, const c10::Scalar& value);

// Writes value.to<T>() into every element of self.
void run_small_fill(const at::Tensor& self, const c10::Scalar& value);

}  // namespace neuron::fastpath
