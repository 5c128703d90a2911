// The shared elementwise plan (plan.h).
#include "fastpath/csrc/elementwise/plan.h"

#include "device/csrc/aten/dense_layout.h"

#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE

namespace neuron::fastpath {

std::optional<ElementwisePlan> plan_elementwise(std::initializer_list<const at::Tensor*> operands,
                                                at::ScalarType dtype) {
  TORCH_INTERNAL_ASSERT(operands.size() >= 1 && operands.size() <= 3);
  c10::SmallVector<int64_t, 6> sizes;
  bool first = true;
  for (const at::Tensor* t : operands) {
    if (!bytes_are_values(*t)) return std::nullopt;
    if (first) {
      sizes.assign(t->sizes().begin(), t->sizes().end());
      first = false;
      continue;
    }
    auto both = broadcast(sizes, t->sizes());
    if (!both.has_value()) return std::nullopt;
    sizes = std::move(*both);
  }
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  if (numel < 1 || numel > at::internal::GRAIN_SIZE) return std::nullopt;
  ElementwisePlan plan{sizes, {}, dtype, numel};
  size_t k = 0;
  for (const at::Tensor* t : operands) {
    plan.periods[k] = period(*t, sizes, numel);
    if (plan.periods[k++] == 0) return std::nullopt;
  }
  auto strides = elementwise_result_strides(sizes, operands);
  if (!strides.has_value()) return std::nullopt;
  plan.strides = std::move(*strides);
  return plan;
}

}  // namespace neuron::fastpath
