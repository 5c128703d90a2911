// The plan the small elementwise kernels share (arith, bitwise, where): how one call of an
// elementwise op over 1 to 3 operands runs without ATen's TensorIterator.
//
// Each operand is read as dense row-major memory (device/csrc/dense_layout.h's period()): as
// big as the result, one element, or a block of the result's trailing dims that repeats. The
// result has the sizes of the operands broadcast together, 1 to GRAIN_SIZE elements (ATen
// splits larger ones over threads, in chunks whose order a plain loop would not follow), and
// the strides ATen's TensorIterator gives a new result (elementwise_result_strides). Each
// kernel adds its own rules (dtypes, Python numbers) before planning.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>

namespace neuron::fastpath {

struct ElementwisePlan {
  c10::SmallVector<int64_t, 6> sizes;
  c10::SmallVector<int64_t, 6> strides;  // ATen's for a new result
  at::ScalarType dtype;                  // the result's
  int64_t numel;
  // How often each operand (in the order given) repeats over the result's numel elements:
  // numel (as big as the result), 1 (one element), or a trailing block of that many.
  std::array<int64_t, 3> periods{0, 0, 0};
};

// The plan for `operands` (1 to 3, none null) whose result has `dtype`, or nullopt where an
// operand's bytes are not its values, the shapes do not broadcast, the result is empty or
// larger than GRAIN_SIZE, or an operand cannot be read as dense row-major memory.
std::optional<ElementwisePlan> plan_elementwise(std::initializer_list<const at::Tensor*> operands,
                                                at::ScalarType dtype);

// Element i of an operand that repeats every `period` elements of the result.
inline int64_t at_period(int64_t i, int64_t period) { return period == 1 ? 0 : i % period; }

// Whether t is a Python number that ATen wrapped as a 0-dim tensor (its dtype promotes by
// ATen's rule for numbers).
inline bool is_python_number(const at::Tensor& t) { return t.unsafeGetTensorImpl()->is_wrapped_number(); }

}  // namespace neuron::fastpath
