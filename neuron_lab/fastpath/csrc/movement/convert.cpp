// Small dtype conversions with ATen's values (convert.h says what it takes).
#include "fastpath/csrc/movement/convert.h"

#include "device/csrc/aten/dense_layout.h"

#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE

#include <cstdint>
#include <type_traits>

namespace neuron::fastpath {
namespace {

template <class From, class To>
void convert_as(const void* from, void* to, int64_t n) {
  const auto* src = static_cast<const From*>(from);
  auto* dst = static_cast<To*>(to);
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<From, bool>) {
      // As c10::load reads a bool: any nonzero byte is true.
      dst[i] = static_cast<To>(reinterpret_cast<const uint8_t*>(src)[i] != 0);
    } else {
      dst[i] = static_cast<To>(src[i]);
    }
  }
}

template <class To>
void convert_into(const at::Tensor& self, void* to) {
  const void* from = self.const_data_ptr();
  const int64_t n = self.numel();
  switch (self.scalar_type()) {
    case at::kBool: return convert_as<bool, To>(from, to, n);
    case at::kByte: return convert_as<uint8_t, To>(from, to, n);
    case at::kChar: return convert_as<int8_t, To>(from, to, n);
    case at::kShort: return convert_as<int16_t, To>(from, to, n);
    case at::kInt: return convert_as<int32_t, To>(from, to, n);
    case at::kLong: return convert_as<int64_t, To>(from, to, n);
    case at::kFloat: return convert_as<float, To>(from, to, n);
    case at::kDouble: return convert_as<double, To>(from, to, n);
    default: TORCH_INTERNAL_ASSERT(false, "neuron: small conversion planned from ", self.scalar_type());
  }
}

}  // namespace

bool small_convert_takes(const at::Tensor& self, at::ScalarType dtype) {
  const at::ScalarType from = self.scalar_type();
  return (dtype == at::kFloat || dtype == at::kDouble) && dtype != from && plain_real_dtype(from) &&
         from != at::kHalf && from != at::kBFloat16 && bytes_are_values(self) && self.numel() >= 1 &&
         self.numel() <= at::internal::GRAIN_SIZE;
}

void run_small_convert(const at::Tensor& self, const at::Tensor& out) {
  TORCH_INTERNAL_ASSERT(out.numel() == self.numel(), "neuron: small conversion of unequal sizes");
  switch (out.scalar_type()) {
    case at::kFloat: return convert_into<float>(self, out.mutable_data_ptr());
    case at::kDouble: return convert_into<double>(self, out.mutable_data_ptr());
    default: TORCH_INTERNAL_ASSERT(false, "neuron: small conversion planned into ", out.scalar_type());
  }
}

}  // namespace neuron::fastpath
