// The plan the small elementwise kernels share (arith, bitwise, where): how one call of an
// elementwise op over 1 to 3 operands runs without ATen's TensorIterator.
//
// Each operand is read as dense row-major memory (device/csrc/dense_layout.h): as big as the
// result, one element, a block of the result's trailing dims that repeats, or one element per
// run of the result's trailing dims (a [rows, 1] statistic against [rows, cols]). The
// result has the sizes of the operands broadcast together, 1 to GRAIN_SIZE elements (ATen
// splits larger ones over threads, in chunks whose order a plain loop would not follow), and
// the strides ATen's TensorIterator gives a new result (elementwise_result_strides). Each
// kernel adds its own rules (dtypes, Python numbers) before planning.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
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
  // How many consecutive result elements read each element of an operand: 1, or for an
  // operand whose trailing dims are 1 where the result's are not ([rows, 1] against
  // [rows, cols]: a row's statistic, as in an RMSNorm's x * rsqrt(variance)) the product of
  // those dims. Result element i reads element (i / repeats) % period of the operand.
  std::array<int64_t, 3> repeats{1, 1, 1};
};

// The plan for `operands` (1 to 3, none null) whose result has `dtype`, or nullopt where an
// operand's bytes are not its values, the shapes do not broadcast, the result is empty or
// larger than GRAIN_SIZE, or an operand cannot be read as dense row-major memory.
std::optional<ElementwisePlan> plan_elementwise(std::initializer_list<const at::Tensor*> operands,
                                                at::ScalarType dtype);

// A run of the result's elements within which every operand either advances one element a
// step (step 1) or stays on one element (step 0), from element `offset` of its own memory.
struct ElementwiseRun {
  int64_t start;   // the run's first element of the result
  int64_t length;
  std::array<int64_t, 3> offset{0, 0, 0};
  std::array<int64_t, 3> step{0, 0, 0};
};

// Calls run(ElementwiseRun) for the runs that cover the plan's result, in order. An operand
// advances over runs within its period (when it does not repeat) and stays on one element
// within its repeats; both are products of the result's trailing sizes, so each divides every
// larger one, and runs as long as the shortest of them tile the result: one division an
// operand a run instead of one an element (a division costs more than the element's work).
template <class Run>
void for_each_run(const ElementwisePlan& plan, size_t operands, Run&& run) {
  int64_t length = plan.numel;
  ElementwiseRun r{0, 0};
  for (size_t k = 0; k < operands; ++k) {
    const bool advances = plan.repeats[k] == 1 && plan.periods[k] > 1;
    if (advances) length = std::min(length, plan.periods[k]);
    if (plan.repeats[k] > 1) length = std::min(length, plan.repeats[k]);
    r.step[k] = advances ? 1 : 0;
  }
  r.length = length;
  for (r.start = 0; r.start < plan.numel; r.start += length) {
    for (size_t k = 0; k < operands; ++k) r.offset[k] = (r.start / plan.repeats[k]) % plan.periods[k];
    run(static_cast<const ElementwiseRun&>(r));
  }
}

// Whether t is a Python number that ATen wrapped as a 0-dim tensor (its dtype promotes by
// ATen's rule for numbers).
inline bool is_python_number(const at::Tensor& t) { return t.unsafeGetTensorImpl()->is_wrapped_number(); }

}  // namespace neuron::fastpath
