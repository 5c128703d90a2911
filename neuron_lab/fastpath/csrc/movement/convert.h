// Small dtype conversions (_to_copy to another dtype) without ATen's TensorIterator.
//
// A Llama decode step converts its [1, 1, 1] int64 position to float32 for the rotary
// embedding; ATen's composite _to_copy makes an empty result and copies into it through a
// TensorIterator (~4 us more than the CPU's own call, per token). ATen converts element by
// element with c10::convert (static_cast; a bool is its byte != 0) in its scalar loop, and
// with vector instructions that round alike (to nearest) in its vector loop: a plain loop
// gives the same bits (checked against the CPU for int64 past 2^53, NaNs, signed zeros,
// float32 overflow and subnormals). Taken: bool, the integer types, float and double into
// float or double; a tensor of 1 to GRAIN_SIZE elements whose bytes are its values, read in
// memory order (the caller gives the result the layout that makes that order its own).
#pragma once

#include <ATen/core/Tensor.h>

namespace neuron::fastpath {

// Whether the small kernel converts self into dtype.
bool small_convert_takes(const at::Tensor& self, at::ScalarType dtype);

// Writes self's elements, in memory order, converted, into out's (as many, dtype out's).
void run_small_convert(const at::Tensor& self, const at::Tensor& out);

}  // namespace neuron::fastpath
