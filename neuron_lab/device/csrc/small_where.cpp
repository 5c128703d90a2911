// Small where(condition, self, other) with ATen's bits (small_where.h says what it takes).
#include "small_where.h"

#include "dense_layout.h"

#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE

#include <cstring>

namespace neuron {
namespace {

bool is_python_number(const at::Tensor& t) { return t.unsafeGetTensorImpl()->is_wrapped_number(); }

// Element i of an operand that repeats every `period` elements of the result.
inline int64_t at_period(int64_t i, int64_t period) { return period == 1 ? 0 : i % period; }

// A bool's byte is read as ATen's kernel reads it: any nonzero byte is true.
template <class Bits>
void select(const SmallWhere& plan, const uint8_t* condition, const Bits* self, const Bits* other, Bits* out) {
  for (int64_t i = 0; i < plan.numel; ++i) {
    out[i] = condition[at_period(i, plan.condition_period)] ? self[at_period(i, plan.self_period)]
                                                            : other[at_period(i, plan.other_period)];
  }
}

}  // namespace

std::optional<SmallWhere> plan_small_where(const at::Tensor& condition, const at::Tensor& self,
                                           const at::Tensor& other) {
  for (const at::Tensor* t : {&condition, &self, &other}) {
    if (!bytes_are_values(*t) || is_python_number(*t)) return std::nullopt;
  }
  const at::ScalarType dtype = self.scalar_type();
  if (condition.scalar_type() != at::kBool || other.scalar_type() != dtype || !plain_real_dtype(dtype)) {
    return std::nullopt;
  }
  auto partial = broadcast(condition.sizes(), self.sizes());
  if (!partial.has_value()) return std::nullopt;
  auto sizes = broadcast(*partial, other.sizes());
  if (!sizes.has_value()) return std::nullopt;
  int64_t numel = 1;
  for (int64_t s : *sizes) numel *= s;
  if (numel < 1 || numel > at::internal::GRAIN_SIZE) return std::nullopt;
  const int64_t condition_period = period(condition, *sizes, numel);
  const int64_t self_period = period(self, *sizes, numel);
  const int64_t other_period = period(other, *sizes, numel);
  if (condition_period == 0 || self_period == 0 || other_period == 0) return std::nullopt;
  auto strides = elementwise_result_strides(*sizes, {&condition, &self, &other});
  if (!strides.has_value()) return std::nullopt;
  return SmallWhere{std::move(*sizes), std::move(*strides), dtype, numel, condition_period, self_period,
                    other_period};
}

void run_small_where(const SmallWhere& plan, const at::Tensor& condition, const at::Tensor& self,
                     const at::Tensor& other, const at::Tensor& out) {
  const auto* c = static_cast<const uint8_t*>(condition.const_data_ptr());
  const void* a = self.const_data_ptr();
  const void* b = other.const_data_ptr();
  void* y = out.mutable_data_ptr();
  switch (self.element_size()) {
    case 1: return select(plan, c, static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b), static_cast<uint8_t*>(y));
    case 2: return select(plan, c, static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), static_cast<uint16_t*>(y));
    case 4: return select(plan, c, static_cast<const uint32_t*>(a), static_cast<const uint32_t*>(b), static_cast<uint32_t*>(y));
    case 8: return select(plan, c, static_cast<const uint64_t*>(a), static_cast<const uint64_t*>(b), static_cast<uint64_t*>(y));
    default: TORCH_INTERNAL_ASSERT(false, "neuron: small where planned for ", plan.dtype);
  }
}

}  // namespace neuron
