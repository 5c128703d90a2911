// Small fill_(self, value) with ATen's bytes (fill.h says what it takes).
#include "fastpath/csrc/movement/fill.h"

#include "device/csrc/aten/dense_layout.h"

#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE

#include <algorithm>

namespace neuron::fastpath {
namespace {

template <class T>
void fill_as(const at::Tensor& self, const c10::Scalar& value) {
  const T v = value.to<T>();  // ATen's conversion, and its error for a value out of range
  std::fill_n(self.mutable_data_ptr<T>(), self.numel(), v);
}

}  // namespace

bool small_fill_takes(const at::Tensor& self, const c10::Scalar& value) {
  // Half and bfloat16 excluded: ATen converts to them without its range check for one element
  // and with it for more.
  const at::ScalarType dtype = self.scalar_type();
  return !value.isComplex() && !value.isSymbolic() && bytes_are_values(self) && row_major(self) &&
         plain_real_dtype(dtype) && dtype != at::kHalf && dtype != at::kBFloat16 && self.numel() >= 1 &&
         self.numel() <= at::internal::GRAIN_SIZE;
}

void run_small_fill(const at::Tensor& self, const c10::Scalar& value) {
  switch (self.scalar_type()) {
    case at::kBool: return fill_as<bool>(self, value);
    case at::kByte: return fill_as<uint8_t>(self, value);
    case at::kChar: return fill_as<int8_t>(self, value);
    case at::kShort: return fill_as<int16_t>(self, value);
    case at::kInt: return fill_as<int32_t>(self, value);
    case at::kLong: return fill_as<int64_t>(self, value);
    case at::kFloat: return fill_as<float>(self, value);
    case at::kDouble: return fill_as<double>(self, value);
    default: TORCH_INTERNAL_ASSERT(false, "neuron: small fill planned for ", self.scalar_type());
  }
}

}  // namespace neuron::fastpath
