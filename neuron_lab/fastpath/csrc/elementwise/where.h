// Small where(condition, self, other) without ATen's TensorIterator.
//
// A decoding loop's logits processors mask a [1, vocab] row with where() every step. where
// copies one operand's element or the other's: the result's bits are the chosen element's
// bits however the loop is written, so a plain loop gives ATen's results exactly. The
// kernel takes what keeps the result's dtype and layout ATen's: a bool condition; self and
// other of one dtype (no promotion; no Python numbers, whose dtype ATen promotes by its own
// rule; no complex); each operand dense in row-major order (its size-1 dims' strides aside),
// or one element, or a block of the result's trailing dims that the others repeat, or one
// element per run of its trailing dims (a [rows, 1] mask against [rows, cols]); 1 to
// GRAIN_SIZE elements. The result has TensorIterator's strides (the shared elementwise plan, plan.h).
// Anything else is left to ATen's kernel, with its semantics, warnings and errors.
#pragma once

#include "fastpath/csrc/elementwise/plan.h"

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <optional>

namespace neuron::fastpath {

// The plan for where(condition, self, other), or nullopt when the small kernel does not take them.
std::optional<ElementwisePlan> plan_small_where(const at::Tensor& condition, const at::Tensor& self,
                                           const at::Tensor& other);

// Writes the selection into `out`: plan.numel elements of plan.dtype in row-major order (a
// contiguous out, the size-1 dims' strides aside), memory of its own (no operand's).
void run_small_where(const ElementwisePlan& plan, const at::Tensor& condition, const at::Tensor& self,
                     const at::Tensor& other, const at::Tensor& out);

}  // namespace neuron::fastpath
