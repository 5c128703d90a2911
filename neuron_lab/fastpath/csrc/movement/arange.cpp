// Small integer arange with ATen's values (arange.h says what it takes).
#include "fastpath/csrc/movement/arange.h"

#include "device/csrc/aten/dense_layout.h"

#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE

namespace neuron::fastpath {
namespace {

constexpr int64_t kExactLimit = int64_t(1) << 53;  // far from int64 overflow in the size formula

std::optional<int64_t> small_integer(const c10::Scalar& s) {
  if (!s.isIntegral(/*includeBool=*/false) || s.isSymbolic()) return std::nullopt;
  const int64_t v = s.toLong();
  if (v <= -kExactLimit || v >= kExactLimit) return std::nullopt;
  return v;
}

}  // namespace

std::optional<int64_t> small_arange_size(const c10::Scalar& start, const c10::Scalar& end, const c10::Scalar& step,
                                         const at::Tensor& out) {
  const auto first = small_integer(start);
  const auto last = small_integer(end);
  const auto stride = small_integer(step);
  if (!first || !last || !stride || *stride == 0) return std::nullopt;
  if ((*stride > 0 && *last < *first) || (*stride < 0 && *last > *first)) return std::nullopt;
  if (out.scalar_type() != at::kLong || !bytes_are_values(out) || !row_major(out)) return std::nullopt;
  const int64_t sign = *stride > 0 ? 1 : -1;
  const int64_t size = (*last - *first + *stride - sign) / *stride;  // ATen's integer formula
  if (size < 0 || size > at::internal::GRAIN_SIZE) return std::nullopt;
  if (out.numel() != size && out.numel() != 0) return std::nullopt;  // ATen warns as it resizes
  return size;
}

void run_small_arange(const c10::Scalar& start, const c10::Scalar& step, const at::Tensor& out) {
  const int64_t first = start.toLong();
  const int64_t stride = step.toLong();
  int64_t* values = out.mutable_data_ptr<int64_t>();
  for (int64_t i = 0; i < out.numel(); ++i) values[i] = first + stride * i;
}

}  // namespace neuron::fastpath
