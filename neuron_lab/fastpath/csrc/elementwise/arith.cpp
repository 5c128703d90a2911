// Small elementwise add, sub and mul with ATen's bits (arith.h says what it takes).
#include "fastpath/csrc/elementwise/arith.h"

#include "device/csrc/aten/dense_layout.h"
#include "device/csrc/aten/vector_clones.h"

#include <ATen/TensorIterator.h>

#include <type_traits>

namespace neuron::fastpath {
namespace {

bool kernel_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kInt || t == at::kLong;
}

// The dtype of the result, when the kernel computes in it: both operands of it, or a
// Python number that ATen casts to the tensor's dtype (no promotion).
std::optional<at::ScalarType> common_dtype(const at::Tensor& self, const at::Tensor& other) {
  const bool self_number = is_python_number(self);
  if (self_number == is_python_number(other)) {
    if (self_number || self.scalar_type() != other.scalar_type()) return std::nullopt;
    return kernel_dtype(self.scalar_type()) ? std::optional(self.scalar_type()) : std::nullopt;
  }
  const at::ScalarType tensor = (self_number ? other : self).scalar_type();
  const at::ScalarType number = (self_number ? self : other).scalar_type();
  if (!kernel_dtype(tensor)) return std::nullopt;
  if (number == at::kLong) return tensor;
  if (number == at::kDouble && at::isFloatingType(tensor)) return tensor;
  return std::nullopt;
}

// ---- the loops --------------------------------------------------------------------------

// Integers wrap as ATen's (two's complement) without signed overflow in C++.
template <class T, Arith op>
inline T apply(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    const U x = static_cast<U>(a), y = static_cast<U>(b);
    return static_cast<T>(op == Arith::Add ? x + y : op == Arith::Sub ? x - y : x * y);
  } else {
    return op == Arith::Add ? a + b : op == Arith::Sub ? a - b : a * b;
  }
}

// One rounding per element, whatever the instruction set (vector_clones.h): each loop does
// a single add, subtract or multiply, with nothing to fuse it with.
template <class T, Arith op>
NEURON_VECTOR_CLONES void both_dense(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = apply<T, op>(a[i], b[i]);
}
template <class T, Arith op>
NEURON_VECTOR_CLONES void dense_number(const T* a, T b, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = apply<T, op>(a[i], b);
}
template <class T, Arith op>
NEURON_VECTOR_CLONES void number_dense(T a, const T* b, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = apply<T, op>(a, b[i]);
}

// The one element of t as T, cast as ATen casts a Python number to the tensor's dtype.
template <class T>
T only_element(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kDouble: return static_cast<T>(*t.const_data_ptr<double>());
    case at::kFloat: return static_cast<T>(*t.const_data_ptr<float>());
    case at::kLong: return static_cast<T>(*t.const_data_ptr<int64_t>());
    case at::kInt: return static_cast<T>(*t.const_data_ptr<int32_t>());
    default: TORCH_INTERNAL_ASSERT(false, "neuron: small arithmetic planned for ", t.scalar_type());
  }
}

// Run by run (plan.h's for_each_run): each operand dense or one element over a run. A one-element
// operand may be a Python number of another dtype (only_element casts it as ATen does).
template <class T, Arith op>
void run(const ElementwisePlan& plan, const at::Tensor& self, const at::Tensor& other, const at::Tensor& out) {
  T* dst = out.mutable_data_ptr<T>();
  const T* a = plan.periods[0] > 1 ? self.const_data_ptr<T>() : nullptr;
  const T* b = plan.periods[1] > 1 ? other.const_data_ptr<T>() : nullptr;
  const T only_a = a == nullptr ? only_element<T>(self) : T{};
  const T only_b = b == nullptr ? only_element<T>(other) : T{};
  for_each_run(plan, 2, [&](const ElementwiseRun& r) {
    T* d = dst + r.start;
    if (r.step[0] == 1 && r.step[1] == 1) return both_dense<T, op>(a + r.offset[0], b + r.offset[1], d, r.length);
    const T x = a == nullptr ? only_a : a[r.offset[0]];
    const T y = b == nullptr ? only_b : b[r.offset[1]];
    if (r.step[0] == 1) return dense_number<T, op>(a + r.offset[0], y, d, r.length);
    if (r.step[1] == 1) return number_dense<T, op>(x, b + r.offset[1], d, r.length);
    const T value = apply<T, op>(x, y);
    for (int64_t i = 0; i < r.length; ++i) d[i] = value;
  });
}

template <class T>
void run_op(Arith op, const ElementwisePlan& plan, const at::Tensor& self, const at::Tensor& other,
            const at::Tensor& out) {
  switch (op) {
    case Arith::Add: return run<T, Arith::Add>(plan, self, other, out);
    case Arith::Sub: return run<T, Arith::Sub>(plan, self, other, out);
    case Arith::Mul: return run<T, Arith::Mul>(plan, self, other, out);
  }
}

}  // namespace

std::optional<ElementwisePlan> plan_small_arith(const at::Tensor& self, const at::Tensor& other,
                                                const c10::Scalar& alpha) {
  if (!bytes_are_values(self) || !bytes_are_values(other)) return std::nullopt;
  if (alpha.isBoolean() || alpha.isComplex() || alpha.isSymbolic()) return std::nullopt;
  if (alpha.isIntegral(false) ? alpha.toLong() != 1 : alpha.toDouble() != 1.0) return std::nullopt;
  const auto dtype = common_dtype(self, other);
  if (!dtype.has_value()) return std::nullopt;
  return plan_elementwise({&self, &other}, *dtype);
}

void run_small_arith(Arith op, const ElementwisePlan& plan, const at::Tensor& self, const at::Tensor& other,
                     const at::Tensor& out) {
  switch (plan.dtype) {
    case at::kFloat: return run_op<float>(op, plan, self, other, out);
    case at::kDouble: return run_op<double>(op, plan, self, other, out);
    case at::kInt: return run_op<int32_t>(op, plan, self, other, out);
    case at::kLong: return run_op<int64_t>(op, plan, self, other, out);
    default: TORCH_INTERNAL_ASSERT(false, "neuron: small arithmetic planned for ", plan.dtype);
  }
}

}  // namespace neuron::fastpath
