// Small where(condition, self, other) with ATen's bits (where.h says what it takes).
#include "fastpath/csrc/elementwise/where.h"

#include "device/csrc/aten/dense_layout.h"
#include "device/csrc/aten/vector_clones.h"

#include <cstring>

namespace neuron::fastpath {
namespace {

// A bool's byte is read as ATen's kernel reads it: any nonzero byte is true. A selection
// copies bits, so every instruction set gives ATen's result.
template <class Bits>
NEURON_VECTOR_CLONES void select_dense(const uint8_t* condition, const Bits* self, const Bits* other, Bits* out,
                                       int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = condition[i] != 0 ? self[i] : other[i];
}
// Some operand stays on one element (step 0) over the run.
template <class Bits>
void select_stepped(const uint8_t* condition, const Bits* self, const Bits* other, Bits* out, int64_t n,
                    const std::array<int64_t, 3>& step) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = condition[i * step[0]] != 0 ? self[i * step[1]] : other[i * step[2]];
  }
}

template <class Bits>
void select(const ElementwisePlan& plan, const uint8_t* condition, const Bits* self, const Bits* other, Bits* out) {
  for_each_run(plan, 3, [&](const ElementwiseRun& r) {
    const uint8_t* c = condition + r.offset[0];
    const Bits* a = self + r.offset[1];
    const Bits* b = other + r.offset[2];
    if (r.step[0] == 1 && r.step[1] == 1 && r.step[2] == 1) {
      select_dense(c, a, b, out + r.start, r.length);
    } else {
      select_stepped(c, a, b, out + r.start, r.length, r.step);
    }
  });
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
