// Small bitwise and / or / not with ATen's results (bitwise.h says what it takes).
#include "fastpath/csrc/elementwise/bitwise.h"

#include "device/csrc/aten/dense_layout.h"
#include "device/csrc/aten/vector_clones.h"

#include <type_traits>
#include <utility>

namespace neuron::fastpath {
namespace {

bool kernel_dtype(at::ScalarType t) { return t == at::kBool || t == at::kInt || t == at::kLong; }

// ATen's bool kernels are logical (a && b, a || b, !a), its integer ones bitwise.
template <class T, Bitwise op>
inline T apply(T a, T b) {
  if constexpr (std::is_same_v<T, uint8_t>) {  // bool, read as ATen reads it: nonzero is true
    const bool x = a != 0, y = b != 0;
    return static_cast<uint8_t>(op == Bitwise::And ? (x && y) : op == Bitwise::Or ? (x || y) : !x);
  } else {
    return op == Bitwise::And ? (a & b) : op == Bitwise::Or ? (a | b) : static_cast<T>(~a);
  }
}

// Other's elements are of type U: T, or a bool (uint8_t) that ATen promotes to the integer
// type T (false 0, true 1).
template <class T, class U, Bitwise op>
inline T apply_to(T x, U y) {
  if constexpr (std::is_same_v<T, U>) {
    return apply<T, op>(x, y);
  } else {
    return apply<T, op>(x, static_cast<T>(y != 0));
  }
}

// Integer and logical work only: every instruction set gives the same result.
template <class T, class U, Bitwise op>
NEURON_VECTOR_CLONES void both_dense(const T* x, const U* z, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = apply_to<T, U, op>(x[i], z[i]);
}

template <class T, class U, Bitwise op>
void run_as(const ElementwisePlan& plan, const at::Tensor& self, const at::Tensor* other, const at::Tensor& out) {
  const T* a = static_cast<const T*>(self.const_data_ptr());
  T* y = static_cast<T*>(out.mutable_data_ptr());
  if (other == nullptr) {  // not: self is the result's shape
    for (int64_t i = 0; i < plan.numel; ++i) y[i] = apply<T, op>(a[i], a[i]);
    return;
  }
  const U* b = static_cast<const U*>(other->const_data_ptr());
  for_each_run(plan, 2, [&](const ElementwiseRun& r) {
    const T* x = a + r.offset[0];
    const U* z = b + r.offset[1];
    T* dst = y + r.start;
    if (r.step[0] == 1 && r.step[1] == 1) return both_dense<T, U, op>(x, z, dst, r.length);
    for (int64_t i = 0; i < r.length; ++i) dst[i] = apply_to<T, U, op>(x[i * r.step[0]], z[i * r.step[1]]);
  });
}

template <class T, class U = T>
void run_typed(Bitwise op, const ElementwisePlan& plan, const at::Tensor& self, const at::Tensor* other,
               const at::Tensor& out) {
  switch (op) {
    case Bitwise::And: return run_as<T, U, Bitwise::And>(plan, self, other, out);
    case Bitwise::Or: return run_as<T, U, Bitwise::Or>(plan, self, other, out);
    case Bitwise::Not: return run_as<T, U, Bitwise::Not>(plan, self, other, out);
  }
}

// The dtype of self op other when the kernel computes it: one dtype, or an integer with a
// bool (ATen's promotion: the integer dtype).
std::optional<at::ScalarType> result_dtype(at::ScalarType a, at::ScalarType b) {
  if (a == b) return a;
  if (a == at::kBool && b != at::kBool) return b;
  if (b == at::kBool && a != at::kBool) return a;
  return std::nullopt;
}

}  // namespace

std::optional<ElementwisePlan> plan_small_bitwise(const at::Tensor& self, const at::Tensor* other) {
  if (!bytes_are_values(self) || is_python_number(self) || !kernel_dtype(self.scalar_type())) return std::nullopt;
  if (other == nullptr) {
    auto plan = plan_elementwise({&self}, self.scalar_type());
    if (!plan.has_value() || plan->periods[0] != plan->numel) return std::nullopt;  // not: self is the result's shape
    return plan;
  }
  if (!bytes_are_values(*other) || is_python_number(*other) || !kernel_dtype(other->scalar_type())) return std::nullopt;
  const auto dtype = result_dtype(self.scalar_type(), other->scalar_type());
  if (!dtype.has_value()) return std::nullopt;
  return plan_elementwise({&self, other}, *dtype);
}

void run_small_bitwise(Bitwise op, const ElementwisePlan& plan, const at::Tensor& self, const at::Tensor* other,
                       const at::Tensor& out) {
  if (other != nullptr && self.scalar_type() != other->scalar_type()) {
    // An integer and a bool: & and | commute, so the integer operand goes first.
    const bool self_is_bool = self.scalar_type() == at::kBool;
    const at::Tensor& integer = self_is_bool ? *other : self;
    const at::Tensor& flags = self_is_bool ? self : *other;
    ElementwisePlan swapped = plan;  // the operands' readings in that order
    if (self_is_bool) {
      std::swap(swapped.periods[0], swapped.periods[1]);
      std::swap(swapped.repeats[0], swapped.repeats[1]);
    }
    switch (plan.dtype) {
      case at::kInt: return run_typed<int32_t, uint8_t>(op, swapped, integer, &flags, out);
      case at::kLong: return run_typed<int64_t, uint8_t>(op, swapped, integer, &flags, out);
      default: TORCH_INTERNAL_ASSERT(false, "neuron: small bitwise op planned for ", plan.dtype);
    }
  }
  switch (plan.dtype) {
    case at::kBool: return run_typed<uint8_t>(op, plan, self, other, out);
    case at::kInt: return run_typed<int32_t>(op, plan, self, other, out);
    case at::kLong: return run_typed<int64_t>(op, plan, self, other, out);
    default: TORCH_INTERNAL_ASSERT(false, "neuron: small bitwise op planned for ", plan.dtype);
  }
}

}  // namespace neuron::fastpath
