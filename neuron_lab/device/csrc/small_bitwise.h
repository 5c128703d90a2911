// Small bitwise and / or / not of bool and integer tensors, without ATen's TensorIterator.
//
// A decoding loop's stopping criteria combine [1] bool masks with | and ~ every step. These
// have one answer however computed: ATen's bool kernels are a && b, a || b and !a, its
// integer ones &, | and ~. The kernel takes bool, int32 or int64 operands of one dtype, or an
// integer and a bool (ATen promotes the bool to the integer's dtype: generate()'s int64
// unfinished-sequence flags & a bool mask), no Python numbers; each dense in row-major order
// (its size-1 dims' strides aside), or one element, or a block of the result's trailing dims
// that the other repeats; 1 to GRAIN_SIZE elements; the result of TensorIterator's strides
// (elementwise_result_strides). Anything else is left to ATen's kernel.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <optional>

namespace neuron {

enum class Bitwise : uint8_t { And, Or, Not };

// How one call runs: the result's sizes, dtype and element count, and how often each
// operand repeats over it (dense_layout.h's period(); other's is 0 for not).
struct SmallBitwise {
  c10::SmallVector<int64_t, 6> sizes;
  c10::SmallVector<int64_t, 6> strides;  // ATen's for a new result
  at::ScalarType dtype;
  int64_t numel;
  int64_t self_period;
  int64_t other_period;
};

// The plan for self & other or self | other (other given), or ~self (other null); nullopt
// when the small kernel does not take them.
std::optional<SmallBitwise> plan_small_bitwise(const at::Tensor& self, const at::Tensor* other);

// Writes the result into `out`: plan.numel elements of plan.dtype in row-major order (a
// contiguous out, the size-1 dims' strides aside), memory of its own.
void run_small_bitwise(Bitwise op, const SmallBitwise& plan, const at::Tensor& self, const at::Tensor* other,
                       const at::Tensor& out);

}  // namespace neuron
