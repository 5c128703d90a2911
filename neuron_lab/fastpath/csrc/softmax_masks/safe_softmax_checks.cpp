// The three checks of `_safe_softmax` (safe_softmax_checks.h says what each takes).
#include "fastpath/csrc/softmax_masks/safe_softmax_checks.h"

#include "device/csrc/aten/dense_layout.h"
#include "device/csrc/aten/vector_clones.h"
#include "fastpath/csrc/boxed.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/WrapDimMinimal.h>
#include <c10/util/bit_cast.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>

namespace neuron::fastpath {
namespace {

using Sizes = c10::SmallVector<int64_t, 6>;

// ---- all(mask, dim=-1) ------------------------------------------------------------------

void all_of_rows(const at::Tensor& self, at::Tensor& out) {
  const auto* in = static_cast<const char*>(self.const_data_ptr());
  auto* result = static_cast<bool*>(out.mutable_data_ptr());
  const auto row = static_cast<size_t>(self.size(-1));
  const int64_t rows = self.numel() / self.size(-1);
  for (int64_t r = 0; r < rows; ++r) result[r] = std::memchr(in + r * row, 0, row) == nullptr;
}

}  // namespace

// all.dim(Tensor self, int dim, bool keepdim=False) and all.out(..., *, Tensor(a!) out)
bool try_all_of_rows(const c10::IValue* args, const c10::IValue* out_arg, torch::jit::Stack* stack, size_t n) {
  if (!args[0].isTensor() || !args[1].isInt() || !args[2].isBool()) return false;
  const at::Tensor& self = args[0].toTensor();
  if (!on_host_contiguous(self) || self.scalar_type() != at::kBool || self.dim() == 0 || self.numel() == 0 ||
      c10::maybe_wrap_dim(args[1].toInt(), self.dim()) != self.dim() - 1) {
    return false;
  }
  Sizes sizes(self.sizes().begin(), self.sizes().end() - 1);
  if (args[2].toBool()) sizes.push_back(1);
  auto result = result_tensor(out_arg, sizes, at::kBool, {&self});
  if (!result.has_value()) return false;
  all_of_rows(self, *result);
  return finish(stack, n, std::move(*result));
}

namespace {

// ---- isneginf(x) -------------------------------------------------------------------------

// Compared as bit patterns: -inf has exactly one, and no NaN has it. Blocks of 16 with a
// fixed trip count are what GCC vectorizes at -O2 (a plain loop stays scalar: 3x slower),
// in AVX2 or AVX-512 where the CPU has them.
template <class Bits>
NEURON_VECTOR_CLONES void is_pattern(const Bits* __restrict in, bool* __restrict out, int64_t n, Bits pattern) {
  constexpr int64_t kBlock = 16;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    for (int64_t k = 0; k < kBlock; ++k) out[i + k] = in[i + k] == pattern;
  }
  for (; i < n; ++i) out[i] = in[i] == pattern;
}

}  // namespace

// isneginf(Tensor self) and isneginf.out(Tensor self, *, Tensor(a!) out)
bool try_isneginf(const c10::IValue* args, const c10::IValue* out_arg, torch::jit::Stack* stack, size_t n) {
  if (!args[0].isTensor()) return false;
  const at::Tensor& self = args[0].toTensor();
  const auto dtype = self.scalar_type();
  if (!on_host_contiguous(self) || (dtype != at::kFloat && dtype != at::kDouble)) return false;
  auto result = result_tensor(out_arg, self.sizes(), at::kBool, {&self});
  if (!result.has_value()) return false;
  auto* out = static_cast<bool*>(result->mutable_data_ptr());
  if (dtype == at::kFloat) {
    is_pattern(static_cast<const uint32_t*>(self.const_data_ptr()), out, self.numel(),
               c10::bit_cast<uint32_t>(-std::numeric_limits<float>::infinity()));
  } else {
    is_pattern(static_cast<const uint64_t*>(self.const_data_ptr()), out, self.numel(),
               c10::bit_cast<uint64_t>(-std::numeric_limits<double>::infinity()));
  }
  return finish(stack, n, std::move(*result));
}

namespace {

// ---- where(rows, scalar, x) ----------------------------------------------------------------

template <class Bits>
void fill_bits(void* dst, const void* value, int64_t n) {
  Bits v;
  std::memcpy(&v, value, sizeof v);
  std::fill_n(static_cast<Bits*>(dst), n, v);
}

// Fills n elements of `elem` bytes each with the bytes at `value`.
void fill_elements(void* dst, const void* value, size_t elem, int64_t n) {
  switch (elem) {
    case 1: fill_bits<uint8_t>(dst, value, n); break;
    case 2: fill_bits<uint16_t>(dst, value, n); break;
    case 4: fill_bits<uint32_t>(dst, value, n); break;
    case 8: fill_bits<uint64_t>(dst, value, n); break;
    default:
      for (int64_t i = 0; i < n; ++i) std::memcpy(static_cast<char*>(dst) + i * elem, value, elem);
  }
}

}  // namespace

// where.self(Tensor condition, Tensor self, Tensor other) and where.self_out(..., *, out):
// a condition of one bool per row (the result's sizes with a last dim of 1), one of self and
// other a 0-dim tensor and the other the result itself, both of one dtype (so no promotion).
bool try_where_rows(const c10::IValue* args, const c10::IValue* out_arg, torch::jit::Stack* stack, size_t n) {
  if (!args[0].isTensor() || !args[1].isTensor() || !args[2].isTensor()) return false;
  const at::Tensor& cond = args[0].toTensor();
  const at::Tensor& a = args[1].toTensor();
  const at::Tensor& b = args[2].toTensor();
  const bool scalar_when_true = a.dim() == 0;
  const at::Tensor& scalar = scalar_when_true ? a : b;
  const at::Tensor& full = scalar_when_true ? b : a;
  if (!on_host_contiguous(cond) || !on_host_contiguous(scalar) || !on_host_contiguous(full) ||
      cond.scalar_type() != at::kBool || scalar.dim() != 0 || full.dim() == 0 || full.numel() == 0 ||
      scalar.scalar_type() != full.scalar_type() || cond.dim() != full.dim() || cond.size(-1) != 1 ||
      cond.sizes().slice(0, cond.dim() - 1) != full.sizes().slice(0, full.dim() - 1)) {
    return false;
  }
  // A new result takes TensorIterator's strides: full's size-1 dims may move them.
  const auto strides = elementwise_result_strides(full.sizes(), {&cond, &a, &b});
  if (!strides.has_value()) return false;
  auto result = result_tensor(out_arg, full.sizes(), full.scalar_type(), {&cond, &a, &b}, &full, *strides);
  if (!result.has_value()) return false;
  const auto* rows_true = static_cast<const bool*>(cond.const_data_ptr());
  const auto* src = static_cast<const char*>(full.const_data_ptr());
  const void* value = scalar.const_data_ptr();
  auto* dst = static_cast<char*>(result->mutable_data_ptr());
  const int64_t row = full.size(-1);
  const int64_t rows = full.numel() / row;
  const size_t elem = full.element_size();
  const size_t row_bytes = static_cast<size_t>(row) * elem;
  for (int64_t r = 0; r < rows; ++r) {
    char* out_row = dst + r * row_bytes;
    if (rows_true[r] == scalar_when_true) {
      fill_elements(out_row, value, elem, row);
    } else if (out_row != src + r * row_bytes) {  // else: written over `full`, the row is in place
      std::memcpy(out_row, src + r * row_bytes, row_bytes);
    }
  }
  return finish(stack, n, std::move(*result));
}

}  // namespace neuron::fastpath
