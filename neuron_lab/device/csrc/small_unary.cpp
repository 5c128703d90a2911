// Small neg, rsqrt and pow by 2, 3, -1 or -0.5 with ATen's bits (small_unary.h says what it takes).
#include "small_unary.h"

#include "dense_layout.h"
#include "vector_clones.h"

#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE

#include <cmath>

namespace neuron {
namespace {

template <class T, Unary op>
inline T apply(T x) {
  if constexpr (op == Unary::Neg) return -x;
  if constexpr (op == Unary::Rsqrt) return static_cast<T>(1) / std::sqrt(x);
  if constexpr (op == Unary::Square) return x * x;
  if constexpr (op == Unary::Cube) return x * x * x;
  if constexpr (op == Unary::Reciprocal) return static_cast<T>(1) / x;
}

// One IEEE operation (or two, each rounded: x * x * x) per element, nothing to fuse into an FMA.
template <class T, Unary op>
NEURON_VECTOR_CLONES void unary_dense(const T* x, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = apply<T, op>(x[i]);
}

template <class T>
void run_typed(Unary op, const T* x, T* out, int64_t n) {
  switch (op) {
    case Unary::Neg: return unary_dense<T, Unary::Neg>(x, out, n);
    case Unary::Rsqrt: return unary_dense<T, Unary::Rsqrt>(x, out, n);
    case Unary::Square: return unary_dense<T, Unary::Square>(x, out, n);
    case Unary::Cube: return unary_dense<T, Unary::Cube>(x, out, n);
    case Unary::Reciprocal: return unary_dense<T, Unary::Reciprocal>(x, out, n);
  }
}

}  // namespace

std::optional<Unary> pow_as_unary(const c10::Scalar& exponent) {
  if (exponent.isBoolean() || exponent.isComplex() || exponent.isSymbolic()) return std::nullopt;
  const double e = exponent.toDouble();
  if (e == 2.0) return Unary::Square;
  if (e == 3.0) return Unary::Cube;
  if (e == -1.0) return Unary::Reciprocal;
  if (e == -0.5) return Unary::Rsqrt;
  return std::nullopt;
}

bool small_unary_takes(const at::Tensor& self) {
  const at::ScalarType dtype = self.scalar_type();
  return (dtype == at::kFloat || dtype == at::kDouble) && bytes_are_values(self) && row_major(self) &&
         self.numel() >= 1 && self.numel() <= at::internal::GRAIN_SIZE;
}

void run_small_unary(Unary op, const at::Tensor& self, const at::Tensor& out) {
  if (self.scalar_type() == at::kFloat) {
    run_typed<float>(op, self.const_data_ptr<float>(), out.mutable_data_ptr<float>(), self.numel());
  } else {
    run_typed<double>(op, self.const_data_ptr<double>(), out.mutable_data_ptr<double>(), self.numel());
  }
}

}  // namespace neuron
