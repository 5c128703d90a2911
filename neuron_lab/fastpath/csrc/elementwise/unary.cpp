// Small neg, rsqrt and pow by 2, 3, -1 or -0.5 with ATen's bits (unary.h says what it takes).
#include "fastpath/csrc/elementwise/unary.h"

#include "device/csrc/aten/dense_layout.h"
#include "device/csrc/aten/vector_clones.h"

#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE

#include <cmath>
#include <utility>

namespace neuron::fastpath {
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

// The same operation on a strided input and result: an odometer over all dims but the last.
template <class T, Unary op>
void unary_strided(const at::Tensor& self, const at::Tensor& out) {
  const T* x = self.const_data_ptr<T>();
  T* y = out.mutable_data_ptr<T>();
  const int64_t nd = self.dim();
  if (nd == 0) {
    *y = apply<T, op>(*x);
    return;
  }
  const auto sizes = self.sizes();
  const auto in = self.strides();
  const auto res = out.strides();
  const int64_t inner = sizes[nd - 1];
  c10::SmallVector<int64_t, 6> index(nd, 0);
  for (int64_t done = 0; done < self.numel(); done += inner) {
    int64_t xo = 0;
    int64_t yo = 0;
    for (int64_t d = 0; d < nd - 1; ++d) {
      xo += index[d] * in[d];
      yo += index[d] * res[d];
    }
    for (int64_t i = 0; i < inner; ++i) y[yo + i * res[nd - 1]] = apply<T, op>(x[xo + i * in[nd - 1]]);
    for (int64_t d = nd - 2; d >= 0 && ++index[d] == sizes[d]; --d) index[d] = 0;
  }
}

template <class T, Unary op>
void run_as(const at::Tensor& self, const at::Tensor& out) {
  if (row_major(self) && row_major(out)) {
    unary_dense<T, op>(self.const_data_ptr<T>(), out.mutable_data_ptr<T>(), self.numel());
  } else {
    unary_strided<T, op>(self, out);
  }
}

template <class T>
void run_typed(Unary op, const at::Tensor& self, const at::Tensor& out) {
  switch (op) {
    case Unary::Neg: return run_as<T, Unary::Neg>(self, out);
    case Unary::Rsqrt: return run_as<T, Unary::Rsqrt>(self, out);
    case Unary::Square: return run_as<T, Unary::Square>(self, out);
    case Unary::Cube: return run_as<T, Unary::Cube>(self, out);
    case Unary::Reciprocal: return run_as<T, Unary::Reciprocal>(self, out);
  }
}

// The strides TensorIterator gives a unary op's result when `self` is neither contiguous nor
// dense (its fast setup copies a dense input's strides): its dims sorted by stride
// (reorder_dimensions: an insertion sort from the last dim, equal strides ordered by size),
// the result contiguous in that order. nullopt for zero or negative strides, or elements
// that overlap, which the kernel leaves to ATen.
std::optional<c10::SmallVector<int64_t, 6>> strides_by_input_order(const at::Tensor& self) {
  const auto sizes = self.sizes();
  const auto strides = self.strides();
  const int64_t nd = self.dim();
  for (int64_t d = 0; d < nd; ++d) {
    if (strides[d] <= 0 && sizes[d] > 1) return std::nullopt;
  }
  const c10::SmallVector<int64_t, 6> own(strides.begin(), strides.end());
  const auto perm = iteration_order(sizes, {own});  // perm[0]: the innermost dim
  int64_t extent = 1;  // elements of self spanned by the dims inside this one
  for (int64_t d : perm) {
    if (sizes[d] == 1) continue;
    if (strides[d] < extent) return std::nullopt;  // overlaps the dims inside it
    extent = strides[d] * (sizes[d] - 1) + 1;
  }
  return contiguous_in_order(sizes, perm);
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

std::optional<c10::SmallVector<int64_t, 6>> plan_small_unary(const at::Tensor& self) {
  const at::ScalarType dtype = self.scalar_type();
  if ((dtype != at::kFloat && dtype != at::kDouble) || !bytes_are_values(self) || self.numel() < 1 ||
      self.numel() > at::internal::GRAIN_SIZE) {
    return std::nullopt;
  }
  if (row_major(self)) return c10::SmallVector<int64_t, 6>(self.strides().begin(), self.strides().end());
  if (self.is_non_overlapping_and_dense()) return std::nullopt;  // ATen's result keeps its strides
  return strides_by_input_order(self);
}

void run_small_unary(Unary op, const at::Tensor& self, const at::Tensor& out) {
  if (self.scalar_type() == at::kFloat) {
    run_typed<float>(op, self, out);
  } else {
    run_typed<double>(op, self, out);
  }
}

}  // namespace neuron::fastpath
