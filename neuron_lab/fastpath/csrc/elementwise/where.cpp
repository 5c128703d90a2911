// Small where(condition, self, other) with ATen's bits (where.h says what it takes).
#include "fastpath/csrc/elementwise/where.h"

#include "device/csrc/aten/dense_layout.h"

#include <cstring>

namespace neuron::fastpath {
namespace {

// A bool's byte is read as ATen's kernel reads it: any nonzero byte is true.
template <class Bits>
void select(const ElementwisePlan& plan, const uint8_t* condition, const Bits* self, const Bits* other, Bits* out) {
  for (int64_t i = 0; i < plan.numel; ++i) {
    out[i] = condition[at_period(i, plan.periods[0])] ? self[at_period(i, plan.periods[1])]
                                                            : other[at_period(i, plan.periods[2])];
  }
}

}  // namespace

std::optional<ElementwisePlan> plan_small_where(const at::Tensor& condition, const at::Tensor& self,
                                                const at::Tensor& other) {
  for (const at::Tensor* t : {&condition, &self, &other}) {
    if (is_python_number(*t)) return std::nullopt;
  }
  const at::ScalarType dtype = self.scalar_type();
  if (condition.scalar_type() != at::kBool || other.scalar_type() != dtype || !plain_real_dtype(dtype)) {
    return std::nullopt;
  }
  return plan_elementwise({&condition, &self, &other}, dtype);
}

void run_small_where(const ElementwisePlan& plan, const at::Tensor& condition, const at::Tensor& self,
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

}  // namespace neuron::fastpath
