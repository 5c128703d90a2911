// Small bitwise and / or / not of bool and integer tensors, without ATen's TensorIterator.
//
// A decoding loop's stopping criteria combine [1] bool masks with | and ~ every step. These
// have one answer however computed: ATen's bool kernels are a && b, a || b and !a, its
// integer ones &, | and ~. The kernel takes bool, int32 or int64 operands of one dtype, or an
// integer and a bool (ATen promotes the bool to the integer's dtype: generate()'s int64
// unfinished-sequence flags & a bool mask), no Python numbers; each dense in row-major order
// (its size-1 dims' strides aside), or one element, or a block of the result's trailing dims
// that the other repeats, or one element per run of them ([rows, 1]); 1 to GRAIN_SIZE
// elements; the result of TensorIterator's strides
// (the shared elementwise plan, plan.h). Anything else is left to ATen's kernel.
#pragma once

#include "fastpath/csrc/elementwise/plan.h"

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <optional>

namespace neuron::fastpath {

enum class Bitwise : uint8_t { And, Or, Not };

// The plan for self & other or self | other (other given), or ~self (other null); nullopt
// when the small kernel does not take them.
std::optional<ElementwisePlan> plan_small_bitwise(const at::Tensor& self, const at::Tensor* other);

// Writes the result into `out`: plan.numel elements of plan.dtype in row-major order (a
// contiguous out, the size-1 dims' strides aside), memory of its own.
void run_small_bitwise(Bitwise op, const ElementwisePlan& plan, const at::Tensor& self, const at::Tensor* other,
                       const at::Tensor& out);

}  // namespace neuron::fastpath
