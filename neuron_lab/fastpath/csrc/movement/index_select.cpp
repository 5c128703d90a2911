// index_select of a contiguous tensor as block copies (index_select.h says what it takes).
#include "fastpath/csrc/movement/index_select.h"

#include "device/csrc/aten/dense_layout.h"

#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE

#include <cstring>

namespace neuron::fastpath {
namespace {

template <class Index>
bool all_in_range(const at::Tensor& index, int64_t size) {
  const Index* values = index.const_data_ptr<Index>();
  for (int64_t i = 0; i < index.numel(); ++i) {
    if (values[i] < 0 || values[i] >= size) return false;
  }
  return true;
}

template <class Index>
void copy_blocks(const char* src, char* dst, const Index* index, int64_t count, int64_t outer, int64_t dim_size,
                 size_t block) {
  for (int64_t o = 0; o < outer; ++o) {
    const char* from = src + o * dim_size * block;
    for (int64_t i = 0; i < count; ++i, dst += block) std::memcpy(dst, from + index[i] * block, block);
  }
}

}  // namespace

std::optional<DenseIndexSelect> plan_dense_index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  if (!bytes_are_values(self) || self.dim() == 0 || !self.is_contiguous()) return std::nullopt;
  if (!bytes_are_values(index) || index.dim() > 1 || !index.is_contiguous()) return std::nullopt;
  const at::ScalarType index_type = index.scalar_type();
  if (index_type != at::kLong && index_type != at::kInt) return std::nullopt;
  if (dim < -self.dim() || dim >= self.dim()) return std::nullopt;
  DenseIndexSelect plan;
  plan.dim = dim < 0 ? dim + self.dim() : dim;
  plan.sizes.assign(self.sizes().begin(), self.sizes().end());
  plan.sizes[plan.dim] = index.numel();
  int64_t numel = 1;
  for (const int64_t s : plan.sizes) numel *= s;
  if (numel == 0 || numel > at::internal::GRAIN_SIZE) return std::nullopt;
  const int64_t dim_size = self.size(plan.dim);
  const bool in_range = index_type == at::kLong ? all_in_range<int64_t>(index, dim_size)
                                                : all_in_range<int32_t>(index, dim_size);
  if (!in_range) return std::nullopt;
  return plan;
}

void run_dense_index_select(const DenseIndexSelect& plan, const at::Tensor& self, const at::Tensor& index,
                            const at::Tensor& out) {
  // Contiguous: the dims before `dim` are `outer` blocks of self; each index entry picks one
  // block of the trailing dims' bytes from each.
  int64_t outer = 1;
  for (int64_t d = 0; d < plan.dim; ++d) outer *= self.size(d);
  size_t block = self.element_size();
  for (int64_t d = plan.dim + 1; d < self.dim(); ++d) block *= static_cast<size_t>(self.size(d));
  const char* src = static_cast<const char*>(self.const_data_ptr());
  char* dst = static_cast<char*>(out.mutable_data_ptr());
  const int64_t count = index.numel(), dim_size = self.size(plan.dim);
  if (index.scalar_type() == at::kLong) {
    copy_blocks(src, dst, index.const_data_ptr<int64_t>(), count, outer, dim_size, block);
  } else {
    copy_blocks(src, dst, index.const_data_ptr<int32_t>(), count, outer, dim_size, block);
  }
}

}  // namespace neuron::fastpath
