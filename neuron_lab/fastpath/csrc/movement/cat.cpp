// torch.cat of small row-major tensors as block copies (cat.h says what it takes).
#include "fastpath/csrc/movement/cat.h"

#include "device/csrc/aten/dense_layout.h"

#include <ATen/TensorIterator.h>
#include <c10/core/MemoryFormat.h>

#include <cstring>

namespace neuron::fastpath {
namespace {

// A row-major tensor with nothing to resolve, of which ATen's cat makes a contiguous result.
bool plain(const at::Tensor& t) {
  return bytes_are_values(t) && t.dim() > 0 && row_major(t) &&
         t.suggest_memory_format() == c10::MemoryFormat::Contiguous;
}

}  // namespace

std::optional<DenseCat> plan_dense_cat(const at::ITensorListRef& tensors, int64_t dim) {
  const at::Tensor* first = nullptr;
  DenseCat plan;
  int64_t numel = 0;
  for (const at::Tensor& t : tensors) {
    if (!plain(t)) return std::nullopt;
    if (first == nullptr) {
      first = &t;
      // ATen wraps dim against the first input that is not a legacy empty [0] (and raises
      // when it is out of range): both are ATen's to do.
      if (dim < -t.dim() || dim >= t.dim()) return std::nullopt;
      plan.dim = dim < 0 ? dim + t.dim() : dim;
      plan.sizes.assign(t.sizes().begin(), t.sizes().end());
      plan.sizes[plan.dim] = 0;
    } else if (t.scalar_type() != first->scalar_type() || t.dim() != first->dim()) {
      return std::nullopt;
    }
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (d != plan.dim && t.size(d) != plan.sizes[d]) return std::nullopt;
    }
    plan.sizes[plan.dim] += t.size(plan.dim);
    numel += t.numel();
  }
  if (first == nullptr || numel == 0 || numel > at::internal::GRAIN_SIZE) return std::nullopt;
  return plan;
}

void run_dense_cat(const DenseCat& plan, const at::ITensorListRef& tensors, const at::Tensor& out) {
  // Row-major: the dims before `dim` are `outer` rows; each input adds a block of its own
  // length to every row of the result.
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < plan.dim; ++d) outer *= plan.sizes[d];
  for (size_t d = static_cast<size_t>(plan.dim) + 1; d < plan.sizes.size(); ++d) inner *= plan.sizes[d];
  const size_t item = out.element_size();
  const size_t out_row = static_cast<size_t>(plan.sizes[plan.dim] * inner) * item;
  char* dst = static_cast<char*>(out.mutable_data_ptr());
  size_t offset = 0;
  for (const at::Tensor& t : tensors) {
    const size_t block = static_cast<size_t>(t.size(plan.dim) * inner) * item;
    const char* src = static_cast<const char*>(t.const_data_ptr());
    for (int64_t row = 0; row < outer && block > 0; ++row) {
      std::memcpy(dst + row * out_row + offset, src + row * block, block);
    }
    offset += block;
  }
}

}  // namespace neuron::fastpath
