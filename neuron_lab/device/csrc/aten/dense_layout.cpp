// The layout TensorIterator gives a new elementwise result (dense_layout.h).
#include "dense_layout.h"

#include <utility>

namespace neuron {

c10::SmallVector<int64_t, 6> iteration_order(c10::IntArrayRef sizes,
                                             c10::ArrayRef<c10::SmallVector<int64_t, 6>> strides) {
  const int64_t nd = static_cast<int64_t>(sizes.size());
  // 1 when dim a goes outside dim b, -1 when inside, 0 when no operand's strides say.
  const auto should_swap = [&](int64_t a, int64_t b) {
    for (const auto& s : strides) {
      if (s[a] == 0 || s[b] == 0) continue;
      if (s[a] != s[b]) return s[a] < s[b] ? -1 : 1;
      if (sizes[a] > sizes[b]) return 1;
    }
    return 0;
  };
  c10::SmallVector<int64_t, 6> order(nd);
  for (int64_t i = 0; i < nd; ++i) order[i] = nd - 1 - i;
  for (int64_t i = 1; i < nd; ++i) {
    int64_t moving = i;
    for (int64_t j = i - 1; j >= 0; --j) {
      const int comparison = should_swap(order[j], order[moving]);
      if (comparison > 0) {
        std::swap(order[j], order[moving]);
        moving = j;
      } else if (comparison < 0) {
        break;
      }
    }
  }
  return order;
}

c10::SmallVector<int64_t, 6> contiguous_in_order(c10::IntArrayRef sizes, c10::IntArrayRef order) {
  c10::SmallVector<int64_t, 6> strides(sizes.size());
  int64_t contiguous = 1;
  for (int64_t d : order) {
    strides[d] = contiguous;
    contiguous *= sizes[d];
  }
  return strides;
}

std::optional<c10::SmallVector<int64_t, 6>> elementwise_result_strides(
    c10::IntArrayRef sizes, std::initializer_list<const at::Tensor*> operands) {
  const int64_t nd = static_cast<int64_t>(sizes.size());
  const auto row = row_major_strides(sizes);
  bool same_shape = true, all_row_major = true;
  for (const at::Tensor* t : operands) {
    same_shape = same_shape && t->sizes() == sizes;
    all_row_major = all_row_major && row_major(*t);
  }
  if (same_shape || nd <= 1) return row;  // every operand dense: TensorIterator's fast setup
  if (all_row_major) return row;          // their strides keep TensorIterator's starting order

  // compute_strides: each operand's byte strides against the result's dims, 0 where it
  // broadcasts (a dim it lacks, or a size-1 dim of a larger result dim).
  c10::SmallVector<c10::SmallVector<int64_t, 6>, 3> strides;
  for (const at::Tensor* t : operands) {
    c10::SmallVector<int64_t, 6> s(nd, 0);
    const int64_t offset = nd - t->dim();
    for (int64_t d = 0; d < t->dim(); ++d) {
      if (!(t->size(d) == 1 && sizes[offset + d] != 1)) s[offset + d] = t->stride(d) * t->element_size();
    }
    strides.push_back(std::move(s));
  }
  const auto order = iteration_order(sizes, strides);
  bool kept = true;  // the order TensorIterator starts from: its result is then row-major
  for (int64_t i = 0; i < nd; ++i) kept = kept && order[i] == nd - 1 - i;
  if (kept) return row;
  auto result = contiguous_in_order(sizes, order);
  for (int64_t d = 0; d < nd; ++d) {
    if (sizes[d] != 1 && result[d] != row[d]) return std::nullopt;  // elements out of row-major order
  }
  return result;
}

}  // namespace neuron
