// Small sum and mean over the last dim with ATen's bits, without ATen's TensorIterator.
//
// An RMSNorm (Llama's) takes mean(x * x, -1) of a token's [1, 1, hidden] five times a decode
// step. ATen's CPU mean is sum_out then div_ by the row length, and its float sum is a
// cascade (SumKernel.cpp): a row is read as vectors of 8 floats (4 doubles: its AVX2 kernel,
// which AVX512 CPUs run too, and its generic one are 32 bytes wide), summed by four
// accumulators in chunks of 16 steps, then the scalar tail, then the vector's lanes one by
// one. Floating-point addition is not associative, so the bits depend on that exact order;
// this kernel performs the same additions in the same order, lane by lane, and so gives
// ATen's bits (at any ATEN_CPU_CAPABILITY).
// Taken: float or double, the result's dtype the input's, one dim that is the last, at least
// 2 elements a row, under GRAIN_SIZE elements (one thread's serial reduction: ATen splits
// bigger ones between threads), bytes that are the values, row-major save size-1 dims, on an
// x86 build (capability DEFAULT, AVX2 or AVX512). Anything else is ATen's kernel.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/OptionalArrayRef.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <optional>

namespace neuron::fastpath {

struct SmallSum {
  c10::SmallVector<int64_t, 6> sizes;  // the result's (contiguous)
  int64_t rows = 0;                    // rows reduced, one result element each
  int64_t row = 0;                     // elements a row
};

// The plan for sum or mean of `self` over `dim`, or nullopt when the small kernel does not take it.
std::optional<SmallSum> plan_small_sum(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                                       std::optional<at::ScalarType> dtype);

// Writes each row's sum (mean: divided by the row's length) into `out`, contiguous of the plan's sizes.
void run_small_sum(const SmallSum& plan, const at::Tensor& self, bool mean, const at::Tensor& out);

}  // namespace neuron::fastpath
