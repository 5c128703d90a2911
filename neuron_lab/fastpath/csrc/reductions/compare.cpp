// Small argmax over rows and integer eq with ATen's results (compare.h says
// what they take).
#include "fastpath/csrc/reductions/compare.h"

#include "device/csrc/aten/dense_layout.h"

#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE

#include <cmath>
#include <type_traits>

namespace neuron::fastpath {
namespace {

bool in_small_range(const at::Tensor& t) { return t.numel() >= 1 && t.numel() <= at::internal::GRAIN_SIZE; }

// ATen's ArgMaxOps rule: a NaN beats everything but an earlier NaN; equal values keep the
// earlier index.
template <class T>
bool keeps(T best, T x) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(best)) return true;
    if (std::isnan(x)) return false;
  }
  return best >= x;
}

template <class T>
void argmax_rows(const T* x, int64_t rows, int64_t row, int64_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* v = x + r * row;
    int64_t best = 0;
    for (int64_t i = 1; i < row; ++i) {
      if (!keeps(v[best], v[i])) best = i;
    }
    out[r] = best;
  }
}

template <class T>
void eq_all(const T* x, int64_t n, T value, bool* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] == value;
}

// The result's sizes of a reduction over the last dim (`dim`: -1 or the last) of a row-major
// tensor of 1 to GRAIN_SIZE elements, or nullopt for other dims and layouts.
std::optional<c10::SmallVector<int64_t, 6>> sizes_reduced_over_rows(const at::Tensor& self, int64_t dim,
                                                                     bool keepdim) {
  if (self.dim() < 1 || (dim != -1 && dim != self.dim() - 1) || !bytes_are_values(self) || !row_major(self) ||
      !in_small_range(self)) {
    return std::nullopt;
  }
  c10::SmallVector<int64_t, 6> sizes(self.sizes().begin(), self.sizes().end());
  if (keepdim) {
    sizes.back() = 1;
  } else {
    sizes.pop_back();
  }
  return sizes;
}

// Whether any of n bool bytes is true (ATen reads a bool as nonzero).
bool any_true(const uint8_t* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] != 0) return true;
  }
  return false;
}

template <class T>
T max_of(const T* x, int64_t n) {
  T best = x[0];
  for (int64_t i = 1; i < n; ++i) best = x[i] > best ? x[i] : best;
  return best;
}

}  // namespace

std::optional<c10::SmallVector<int64_t, 6>> plan_small_argmax(const at::Tensor& self, std::optional<int64_t> dim,
                                                              bool keepdim) {
  const at::ScalarType t = self.scalar_type();
  if ((t != at::kFloat && t != at::kDouble && t != at::kInt && t != at::kLong) || !dim.has_value()) {
    return std::nullopt;
  }
  return sizes_reduced_over_rows(self, *dim, keepdim);
}

void run_small_argmax(const at::Tensor& self, const at::Tensor& out) {
  const int64_t row = self.size(-1);
  const int64_t rows = self.numel() / row;
  int64_t* y = out.mutable_data_ptr<int64_t>();
  switch (self.scalar_type()) {
    case at::kFloat: return argmax_rows(self.const_data_ptr<float>(), rows, row, y);
    case at::kDouble: return argmax_rows(self.const_data_ptr<double>(), rows, row, y);
    case at::kInt: return argmax_rows(self.const_data_ptr<int32_t>(), rows, row, y);
    case at::kLong: return argmax_rows(self.const_data_ptr<int64_t>(), rows, row, y);
    default: TORCH_INTERNAL_ASSERT(false, "neuron: small argmax planned for ", self.scalar_type());
  }
}

bool small_eq_takes(const at::Tensor& self, const c10::Scalar& other) {
  const at::ScalarType t = self.scalar_type();
  if ((t != at::kInt && t != at::kLong) || !other.isIntegral(/*includeBool=*/false) || other.isSymbolic() ||
      !bytes_are_values(self) || !row_major(self) || !in_small_range(self)) {
    return false;
  }
  if (t == at::kLong) return true;
  const int64_t v = other.toLong();  // an int32 tensor compares in int32: ATen casts the number
  return v >= INT32_MIN && v <= INT32_MAX;
}

void run_small_eq(const at::Tensor& self, const c10::Scalar& other, const at::Tensor& out) {
  bool* y = out.mutable_data_ptr<bool>();
  if (self.scalar_type() == at::kLong) {
    eq_all(self.const_data_ptr<int64_t>(), self.numel(), other.toLong(), y);
  } else {
    eq_all(self.const_data_ptr<int32_t>(), self.numel(), static_cast<int32_t>(other.toLong()), y);
  }
}

std::optional<c10::SmallVector<int64_t, 6>> plan_small_any(const at::Tensor& self, int64_t dim, bool keepdim) {
  if (self.scalar_type() != at::kBool) return std::nullopt;
  return sizes_reduced_over_rows(self, dim, keepdim);
}

void run_small_any(const at::Tensor& self, const at::Tensor& out) {
  const auto* x = static_cast<const uint8_t*>(self.const_data_ptr());
  bool* y = out.mutable_data_ptr<bool>();
  const int64_t row = self.size(-1);
  const int64_t rows = self.numel() / row;
  for (int64_t r = 0; r < rows; ++r) y[r] = any_true(x + r * row, row);
}

bool small_max_takes(const at::Tensor& self) {
  const at::ScalarType t = self.scalar_type();
  return (t == at::kBool || t == at::kInt || t == at::kLong) && bytes_are_values(self) && row_major(self) &&
         in_small_range(self);
}

void run_small_max(const at::Tensor& self, const at::Tensor& out) {
  const int64_t n = self.numel();
  switch (self.scalar_type()) {
    case at::kBool:
      *out.mutable_data_ptr<bool>() = any_true(static_cast<const uint8_t*>(self.const_data_ptr()), n);
      return;
    case at::kInt: *out.mutable_data_ptr<int32_t>() = max_of(self.const_data_ptr<int32_t>(), n); return;
    case at::kLong: *out.mutable_data_ptr<int64_t>() = max_of(self.const_data_ptr<int64_t>(), n); return;
    default: TORCH_INTERNAL_ASSERT(false, "neuron: small max planned for ", self.scalar_type());
  }
}

}  // namespace neuron::fastpath
