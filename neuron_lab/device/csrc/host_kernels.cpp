// Where a host kernel faster than ATen's CPU kernel gives the same results bit for bit,
// ops run with it: every path that runs an op's kernel on the host (the fallback, replay,
// tiled runs) goes through run_host_kernel().
//
// The kernels so far are the three checks of `_safe_softmax`, which every attention through
// scaled_dot_product_attention's math path runs on its scores (here an [8, 4, 64, 64]
// tensor, where ATen's softmax itself takes about 97 us):
//   isneginf(scores)             a compare per element; ATen 35 us
//   all(mask, -1, keepdim=True)  a row holds no false exactly when memchr finds no zero
//                                byte in it; ATen's bool reduction 346 us
//   where(rows, 0.0, softmax)    a row is copied or filled whole; ATen 83 us
// Each takes only the inputs it was written for (contiguous, the result's exact dtype, no
// broadcasting beyond a per-row condition, an out= of the result's exact shape that overlaps
// no input, or where's out= over its full-size input exactly); anything else runs ATen's
// kernel, with ATen's semantics, warnings and errors.
#include "dense_layout.h"
#include "runtime.h"
#include "small_arith.h"
#include "vector_clones.h"

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

namespace neuron {
namespace {

using Sizes = c10::SmallVector<int64_t, 6>;

// ---- the result of a functional op, or its out= twin -----------------------------------

// A new tensor for a functional op (of `strides` where given, else contiguous); for an
// out= op, the caller's out, when it
// already is what ATen would make it (an out= that must be resized or cast, or that shares
// memory with an input, declines: ATen's kernel resizes, casts, warns or raises). An
// elementwise kernel may also write over `same_as`, an input of the result's exact layout
// (a recorded graph places a result in the memory of an input that dies with the op).
std::optional<at::Tensor> result_tensor(const c10::IValue* out_arg, c10::IntArrayRef sizes, at::ScalarType dtype,
                                        std::initializer_list<const at::Tensor*> inputs,
                                        const at::Tensor* same_as = nullptr, c10::IntArrayRef strides = {}) {
  if (out_arg == nullptr) {
    const auto options = at::TensorOptions().dtype(dtype).device(c10::kCPU);
    return strides.size() == sizes.size() ? at::empty_strided(sizes, strides, options) : at::empty(sizes, options);
  }
  if (!out_arg->isTensor()) return std::nullopt;
  const at::Tensor& out = out_arg->toTensor();
  if (!out.defined() || out.device().type() != c10::DeviceType::CPU || out.scalar_type() != dtype ||
      !out.is_contiguous() || out.sizes() != sizes) {
    return std::nullopt;
  }
  for (const at::Tensor* input : inputs) {
    if (at::get_overlap_status(out, *input) == at::MemOverlapStatus::No) continue;
    const bool same_memory = input == same_as && input->const_data_ptr() == out.const_data_ptr() &&
                             input->is_contiguous() && input->sizes() == sizes && input->scalar_type() == dtype;
    if (!same_memory) return std::nullopt;
  }
  return out;
}

bool on_host_contiguous(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::CPU && t.is_contiguous() && !t.is_conj() &&
         !t.is_neg();
}

// Pops the op's arguments and pushes its one result, as a boxed kernel returns.
bool finish(torch::jit::Stack* stack, size_t n_args, at::Tensor result) {
  torch::jit::drop(*stack, n_args);
  stack->emplace_back(std::move(result));
  return true;
}

// ---- all(mask, dim=-1) ------------------------------------------------------------------

void all_of_rows(const at::Tensor& self, at::Tensor& out) {
  const auto* in = static_cast<const char*>(self.const_data_ptr());
  auto* result = static_cast<bool*>(out.mutable_data_ptr());
  const auto row = static_cast<size_t>(self.size(-1));
  const int64_t rows = self.numel() / self.size(-1);
  for (int64_t r = 0; r < rows; ++r) result[r] = std::memchr(in + r * row, 0, row) == nullptr;
}

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

// ---- add, sub and mul of small operands (small_arith.h) ------------------------------------

// add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out), sub.out (the same) and
// mul.out(Tensor self, Tensor other, *, Tensor(a!) out): the out= twins a recorded graph runs.
// The out may be the memory of an operand as big as the result (replay places a result over
// an input that dies with the op).
template <Arith op>
bool try_small_arith(const c10::IValue* args, const c10::IValue* out_arg, torch::jit::Stack* stack, size_t n) {
  const bool has_alpha = op != Arith::Mul;
  if (!args[0].isTensor() || !args[1].isTensor() || (has_alpha && !args[2].isScalar())) return false;
  const at::Tensor& self = args[0].toTensor();
  const at::Tensor& other = args[1].toTensor();
  if (self.device().type() != c10::kCPU || other.device().type() != c10::kCPU) return false;
  const auto plan = plan_small_arith(self, other, has_alpha ? args[2].toScalar() : c10::Scalar(1));
  if (!plan.has_value()) return false;
  const at::Tensor* same_as = nullptr;
  if (out_arg != nullptr && out_arg->isTensor()) {
    for (const at::Tensor* operand : {&self, &other}) {
      if (operand->const_data_ptr() == out_arg->toTensor().const_data_ptr()) same_as = operand;
    }
  }
  auto result = result_tensor(out_arg, plan->sizes, plan->dtype, {&self, &other}, same_as, plan->strides);
  if (!result.has_value()) return false;
  run_small_arith(op, *plan, self, other, *result);
  return finish(stack, n, std::move(*result));
}

// ---- the table ----------------------------------------------------------------------------

using FastKernel = bool (*)(const c10::IValue* args, const c10::IValue* out_arg, torch::jit::Stack*, size_t n);

struct Entry {
  c10::OperatorHandle op;
  size_t n_args;  // including out=, the last one when out_variant
  bool out_variant;
  FastKernel kernel;
};

Entry entry(const char* name, const char* overload, size_t n_args, bool out_variant, FastKernel kernel) {
  return {c10::Dispatcher::singleton().findSchemaOrThrow(name, overload), n_args, out_variant, kernel};
}

const std::array<Entry, 9>& fast_kernels() {
  static const std::array<Entry, 9> table{
      entry("aten::all", "dim", 3, false, &try_all_of_rows),
      entry("aten::all", "out", 4, true, &try_all_of_rows),
      entry("aten::isneginf", "", 1, false, &try_isneginf),
      entry("aten::isneginf", "out", 2, true, &try_isneginf),
      entry("aten::where", "self", 3, false, &try_where_rows),
      entry("aten::where", "self_out", 4, true, &try_where_rows),
      entry("aten::add", "out", 4, true, &try_small_arith<Arith::Add>),
      entry("aten::sub", "out", 4, true, &try_small_arith<Arith::Sub>),
      entry("aten::mul", "out", 3, true, &try_small_arith<Arith::Mul>),
  };
  return table;
}

// Runs the op with its fast kernel when there is one and it takes these arguments; false
// otherwise (the stack untouched).
bool try_fast_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  for (const Entry& e : fast_kernels()) {
    if (e.op != op) continue;
    if (stack->size() < e.n_args) return false;
    const c10::IValue* args = &(*stack)[stack->size() - e.n_args];
    if (!e.kernel(args, e.out_variant ? &args[e.n_args - 1] : nullptr, stack, e.n_args)) return false;
    op_counters().host_kernel_ops += 1;
    return true;
  }
  return false;
}

}  // namespace

void run_host_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (!try_fast_kernel(op, stack)) op.redispatchBoxed(kCpuKeys, stack);
}

}  // namespace neuron
