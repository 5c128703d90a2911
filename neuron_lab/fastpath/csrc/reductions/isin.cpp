// isin of small integer tensors by a scan (isin.h says what it takes).
#include "fastpath/csrc/reductions/isin.h"

#include "device/csrc/aten/dense_layout.h"

#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE

#include <cstdint>

namespace neuron::fastpath {
namespace {

constexpr int64_t kMaxTestElements = 64;

template <class T>
void scan(const T* elements, int64_t n, const T* tests, int64_t m, bool invert, bool* out) {
  for (int64_t i = 0; i < n; ++i) {
    bool found = false;
    for (int64_t j = 0; j < m && !found; ++j) found = elements[i] == tests[j];
    out[i] = found != invert;
  }
}

}  // namespace

bool small_isin_takes(const at::Tensor& elements, const at::Tensor& test_elements) {
  const at::ScalarType dtype = elements.scalar_type();
  return (dtype == at::kLong || dtype == at::kInt) && test_elements.scalar_type() == dtype &&
         bytes_are_values(elements) && bytes_are_values(test_elements) && elements.is_contiguous() &&
         test_elements.is_contiguous() && elements.numel() >= 1 && elements.numel() <= at::internal::GRAIN_SIZE &&
         test_elements.numel() <= kMaxTestElements;
}

void run_small_isin(const at::Tensor& elements, const at::Tensor& test_elements, bool invert, const at::Tensor& out) {
  bool* result = out.mutable_data_ptr<bool>();
  if (elements.scalar_type() == at::kLong) {
    scan(elements.const_data_ptr<int64_t>(), elements.numel(), test_elements.const_data_ptr<int64_t>(),
         test_elements.numel(), invert, result);
  } else {
    scan(elements.const_data_ptr<int32_t>(), elements.numel(), test_elements.const_data_ptr<int32_t>(),
         test_elements.numel(), invert, result);
  }
}

}  // namespace neuron::fastpath
