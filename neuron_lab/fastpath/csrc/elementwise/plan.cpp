// The shared elementwise plan (plan.h).
#include "fastpath/csrc/elementwise/plan.h"

#include "device/csrc/aten/dense_layout.h"

#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE

namespace neuron::fastpath {
namespace {

struct Reading {
  int64_t period;
  int64_t repeats;
};

// How an operand is read over a result of `sizes` (ElementwisePlan's periods and repeats), or
// nullopt where it cannot be read as dense row-major memory: its trailing size-1 dims repeat
// each element over the result's, and what is left must be the result's dims just before them
// (after leading ones): [rows, 1], [1, heads, 1] against [batch, heads, len], [cols], all of it.
std::optional<Reading> reading(const at::Tensor& t, c10::IntArrayRef sizes) {
  const int64_t n = t.numel();
  if (n == 1) return Reading{1, 1};
  if (!dense_row_major(t)) return std::nullopt;
  const size_t rank = sizes.size();
  c10::IntArrayRef own = t.sizes();  // right-aligned against sizes: own.size() <= rank
  int64_t repeats = 1;
  size_t kept = own.size();
  while (kept > 0 && own[kept - 1] == 1) {
    repeats *= sizes[rank - own.size() + kept - 1];
    --kept;
  }
  const size_t before = rank - (own.size() - kept);  // the result's dims before the repeated ones
  own = own.slice(0, kept);
  while (!own.empty() && own.front() == 1) own = own.slice(1);
  if (own.size() > before || sizes.slice(before - own.size(), own.size()) != own) return std::nullopt;
  return Reading{n, repeats};
}

}  // namespace

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
    const auto read = reading(*t, sizes);
    if (!read.has_value()) return std::nullopt;
    plan.periods[k] = read->period;
    plan.repeats[k++] = read->repeats;
  }
  auto strides = elementwise_result_strides(sizes, operands);
  if (!strides.has_value()) return std::nullopt;
  plan.strides = std::move(*strides);
  return plan;
}

}  // namespace neuron::fastpath
