// Where a host kernel faster than ATen's CPU kernel gives the same results bit for bit,
// ops run with it: every path that runs an op's kernel on the host (the fallback, replay,
// tiled runs) goes through run_host_kernel().
//
// One such kernel so far: all() over the last dimension of a contiguous bool tensor.
// ATen's reduction takes about 2.6 ns per element here (346 us for the [8, 4, 64, 64]
// mask of an attention's softmax, 2.7x the softmax itself): `_safe_softmax`, which every
// attention through scaled_dot_product_attention's math path runs, checks each row of
// scores with it. A row holds no false exactly when memchr finds no zero byte in it.
#include "runtime.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/core/WrapDimMinimal.h>

#include <cstring>
#include <optional>

namespace neuron {
namespace {

struct AllOverloads {
  c10::OperatorHandle dim;  // all.dim(Tensor self, int dim, bool keepdim=False) -> Tensor
  c10::OperatorHandle out;  // all.out(Tensor self, int dim, bool keepdim=False, *, Tensor(a!) out)
};

const AllOverloads& all_overloads() {
  static const AllOverloads ops{c10::Dispatcher::singleton().findSchemaOrThrow("aten::all", "dim"),
                                c10::Dispatcher::singleton().findSchemaOrThrow("aten::all", "out")};
  return ops;
}

// The sizes of all(self, last dim, keepdim), when the fast kernel applies to `self`.
std::optional<c10::SmallVector<int64_t, 6>> rows_reduced_sizes(const at::Tensor& self, int64_t dim,
                                                               bool keepdim) {
  if (self.scalar_type() != at::kBool || self.dim() == 0 || self.numel() == 0 || !self.is_contiguous() ||
      c10::maybe_wrap_dim(dim, self.dim()) != self.dim() - 1) {
    return std::nullopt;
  }
  c10::SmallVector<int64_t, 6> sizes(self.sizes().begin(), self.sizes().end() - 1);
  if (keepdim) sizes.push_back(1);
  return sizes;
}

void all_of_rows(const at::Tensor& self, at::Tensor& out) {
  const auto* in = static_cast<const char*>(self.const_data_ptr());
  auto* result = static_cast<bool*>(out.mutable_data_ptr());
  const auto row = static_cast<size_t>(self.size(-1));
  const int64_t rows = self.numel() / self.size(-1);
  for (int64_t r = 0; r < rows; ++r) result[r] = std::memchr(in + r * row, 0, row) == nullptr;
}

// Runs all.dim / all.out on the stack when the fast kernel applies; false otherwise
// (the stack untouched).
bool try_all_of_rows(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& ops = all_overloads();
  const bool out_variant = op == ops.out;
  if (!out_variant && op != ops.dim) return false;
  const size_t n = out_variant ? 4 : 3;
  if (stack->size() < n) return false;
  const c10::IValue* args = &(*stack)[stack->size() - n];
  if (!args[0].isTensor() || !args[1].isInt() || !args[2].isBool()) return false;
  const at::Tensor& self = args[0].toTensor();
  const auto sizes = rows_reduced_sizes(self, args[1].toInt(), args[2].toBool());
  if (!sizes.has_value() || self.device().type() != c10::DeviceType::CPU) return false;
  at::Tensor result;
  if (out_variant) {
    if (!args[3].isTensor()) return false;
    result = args[3].toTensor();
    // An out= that needs resizing or another dtype keeps ATen's semantics (and warnings).
    if (result.scalar_type() != at::kBool || result.device() != self.device() || !result.is_contiguous() ||
        result.sizes() != c10::IntArrayRef(*sizes)) {
      return false;
    }
  } else {
    result = at::empty(*sizes, self.options());
  }
  all_of_rows(self, result);
  torch::jit::drop(*stack, n);
  stack->emplace_back(std::move(result));
  return true;
}

}  // namespace

void run_host_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (!try_all_of_rows(op, stack)) op.redispatchBoxed(kCpuKeys, stack);
}

}  // namespace neuron
