// Result metadata in C++ for the ops a transformer's decode step or generate()'s set-up
// records whose meta kernel is torch's Python code: layer norm, embedding's index_select,
// the CPU flash attention kernel, and generate()'s masked_fill_, arange, where and max.
// Calling that Python costs ~0.25M instructions a signature once it is warm and ~0.4-1M
// while it is not, and generation meets new signatures every time the KV cache grows (the
// set-up ops: once, in a first call). Each rule gives the metadata the CPU kernel gives
// (sizes, strides, dtype); for a call ATen's checks reject it says run_inline(), so that
// the error is raised at the op (Python meta kernels check less: index_select's takes a
// 2-d index, and the error would surface at a later wait); any other call it is not sure
// of it declines (std::nullopt), and the meta kernel decides as before.
#include "adaptive_eager.h"

#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/result_type.h>
#include <c10/util/strides.h>

#include "device/csrc/aten/dense_layout.h"

#include <cmath>
#include <limits>

#include <string_view>
#include <utility>

namespace neuron::lazy {

namespace {

using Sizes = std::vector<int64_t>;

TensorMeta contiguous(Sizes sizes, c10::ScalarType dtype) {
  const auto strides = c10::contiguous_strides(sizes);  // ATen's, size-0 dims included
  return {std::move(sizes), Sizes(strides.begin(), strides.end()), dtype};
}

const at::Tensor* tensor_arg(const c10::IValue* args, size_t n, size_t i) {
  if (i >= n || !args[i].isTensor()) return nullptr;
  const at::Tensor& t = args[i].toTensor();
  return t.defined() ? &t : nullptr;
}

bool is_float(c10::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

// The call is one ATen rejects: run it inline, where its error is raised at the op.
MetaResult run_inline() { return {}; }

MetaResult single(std::vector<TensorMeta> metas) {
  MetaResult r;
  r.ok = true;
  for (auto& m : metas) r.returns.push_back({std::move(m)});
  return r;
}

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd).
// The CPU kernel normalises a contiguous copy: out is contiguous in the input's shape;
// mean and rstd are [M] viewed as input.shape[:axis] + [1] * len(normalized_shape), in
// the dtype of ATen's param_scalar_type (the recorder's norm_statistics_dtype).
std::optional<MetaResult> layer_norm(const c10::IValue* args, size_t n) {
  const at::Tensor* input = tensor_arg(args, n, 0);
  if (input == nullptr || n != 5 || !args[1].isIntList()) return std::nullopt;
  if (!is_float(input->scalar_type())) return run_inline();
  const Sizes normalized = args[1].toIntVector();
  const auto dims = static_cast<size_t>(input->dim());
  if (normalized.empty() || normalized.size() > dims) return run_inline();
  const size_t axis = dims - normalized.size();
  for (size_t i = 0; i < normalized.size(); ++i) {
    if (input->sizes()[axis + i] != normalized[i]) return run_inline();
  }
  for (size_t i = 2; i < 4; ++i) {
    if (args[i].isNone()) continue;
    const at::Tensor* param = tensor_arg(args, n, i);
    if (param == nullptr || !is_float(param->scalar_type())) return std::nullopt;
    if (param->sizes() != c10::IntArrayRef(normalized)) return run_inline();
  }
  Sizes statistics(input->sizes().begin(), input->sizes().begin() + static_cast<int64_t>(axis));
  statistics.resize(dims, 1);
  const auto statistics_dtype = norm_statistics_dtype(*input, tensor_arg(args, n, 2), tensor_arg(args, n, 3));
  return single({contiguous(input->sizes().vec(), input->scalar_type()), contiguous(statistics, statistics_dtype),
                 contiguous(statistics, statistics_dtype)});
}

// index_select(self, dim, index): self's shape with index.numel() at dim, contiguous.
std::optional<MetaResult> index_select(const c10::IValue* args, size_t n) {
  const at::Tensor* self = tensor_arg(args, n, 0);
  const at::Tensor* index = tensor_arg(args, n, 2);
  if (self == nullptr || index == nullptr || n != 3 || !args[1].isInt() || self->dim() == 0) return std::nullopt;
  if ((index->scalar_type() != at::kLong && index->scalar_type() != at::kInt) || index->dim() > 1) {
    return run_inline();
  }
  int64_t dim = args[1].toInt();
  if (dim < -self->dim() || dim >= self->dim()) return run_inline();
  if (dim < 0) dim += self->dim();
  Sizes sizes = self->sizes().vec();
  sizes[static_cast<size_t>(dim)] = index->numel();
  return single({contiguous(std::move(sizes), self->scalar_type())});
}

// _scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, attn_mask?,
// scale?) -> (out, logsumexp). out takes q's layout (taken only where q is dense, so
// that its strides are the layout); logsumexp is [B, Lq, H] transposed to [B, H, Lq],
// in float for half and bfloat16 queries.
std::optional<MetaResult> flash_attention_cpu(const c10::IValue* args, size_t n) {
  const at::Tensor* q = tensor_arg(args, n, 0);
  const at::Tensor* k = tensor_arg(args, n, 1);
  const at::Tensor* v = tensor_arg(args, n, 2);
  if (q == nullptr || k == nullptr || v == nullptr || n != 7) return std::nullopt;
  if (q->dim() != 4 || k->dim() != 4 || v->dim() != 4 || !is_float(q->scalar_type())) return run_inline();
  if (k->scalar_type() != q->scalar_type() || v->scalar_type() != q->scalar_type()) return run_inline();
  if (k->size(3) != q->size(3) || v->size(3) != q->size(3)) return run_inline();
  if (!q->is_non_overlapping_and_dense() || q->numel() == 0 || k->numel() == 0) return std::nullopt;
  const int64_t batch = q->size(0), heads = q->size(1), length = q->size(2);
  const auto dtype = at::isReducedFloatingType(q->scalar_type()) ? at::kFloat : q->scalar_type();
  TensorMeta logsumexp = contiguous({batch, length, heads}, dtype);
  std::swap(logsumexp.sizes[1], logsumexp.sizes[2]);  // .transpose(1, 2)
  std::swap(logsumexp.strides[1], logsumexp.strides[2]);
  return single({{q->sizes().vec(), q->strides().vec(), q->scalar_type()}, std::move(logsumexp)});
}

bool same_device(const at::Tensor& a, const at::Tensor& b) { return a.device() == b.device(); }

// masked_fill_.Scalar(self, mask, value): self written in place, its metadata unchanged.
// ATen takes a bool mask that broadcasts to self's shape, into a self whose elements do not
// overlap.
std::optional<MetaResult> masked_fill_scalar_(const c10::IValue* args, size_t n) {
  const at::Tensor* self = tensor_arg(args, n, 0);
  const at::Tensor* mask = tensor_arg(args, n, 1);
  if (self == nullptr || mask == nullptr || n != 3 || !same_device(*self, *mask)) return std::nullopt;
  if (mask->scalar_type() != at::kBool) return run_inline();
  if (!at::is_expandable_to(mask->sizes(), self->sizes())) return run_inline();
  const auto overlap = at::has_internal_overlap(*self);
  if (overlap == at::MemOverlap::Yes) return run_inline();
  if (overlap != at::MemOverlap::No) return std::nullopt;
  return single({});
}

// arange.start_out(start, end, step, out): ATen's arange_out sizes the range as below (in
// double, or in int64 arithmetic for an int64 result) and resizes an out= tensor of another
// element count to [size]. Taken for int64, int32, int16, int8 and uint8 results of
// integer bounds and float and double results; half and bfloat16 (float accumulation) and
// integer results of fractional bounds (truncated bounds in the checks) are declined.
std::optional<MetaResult> arange_start_out(const c10::IValue* args, size_t n) {
  const at::Tensor* out = tensor_arg(args, n, 3);
  if (out == nullptr || n != 4) return std::nullopt;
  for (size_t i = 0; i < 3; ++i) {
    if (!args[i].isInt() && !args[i].isDouble()) return std::nullopt;
  }
  const auto dtype = out->scalar_type();
  const bool integral = at::isIntegralType(dtype, /*includeBool=*/false);
  if (!integral && dtype != at::kFloat && dtype != at::kDouble) return std::nullopt;
  double size_d = 0;
  if (integral) {
    constexpr int64_t kBound = int64_t{1} << 52;  // no overflow below, and exact as doubles
    for (size_t i = 0; i < 3; ++i) {
      if (!args[i].isInt() || args[i].toInt() > kBound || args[i].toInt() < -kBound) return std::nullopt;
    }
    const int64_t start = args[0].toInt(), end = args[1].toInt(), step = args[2].toInt();
    if (step == 0 || (step > 0 && end < start) || (step < 0 && end > start)) return run_inline();
    if (dtype == at::kLong) {
      const int64_t sign = step > 0 ? 1 : -1;
      size_d = std::ceil(static_cast<double>((end - start + step - sign) / step));
    } else {
      size_d = std::ceil((static_cast<double>(end) - static_cast<double>(start)) / static_cast<double>(step));
    }
  } else {
    const double start = args[0].toScalar().to<double>(), end = args[1].toScalar().to<double>(),
                 step = args[2].toScalar().to<double>();
    if (!(step > 0 || step < 0) || !std::isfinite(start) || !std::isfinite(end)) return run_inline();
    if ((step > 0 && end < start) || (step < 0 && end > start)) return run_inline();
    size_d = std::ceil((end - start) / step);
  }
  if (!(size_d >= 0 && size_d <= static_cast<double>(std::numeric_limits<int64_t>::max()))) return run_inline();
  const auto size = static_cast<int64_t>(size_d);
  if (out->numel() == size) return single({});  // no resize
  if (out->numel() != 0) return run_inline();     // ATen warns and resizes: an inline run, as before
  MetaResult r = single({});
  r.resized_empty_outs.push_back({3, contiguous({size}, dtype)});
  return r;
}

// where.self(condition, self, other): the broadcast shape, in ATen's result type of self
// and other, laid out as TensorIterator lays out an elementwise result (taken where every
// operand is dense row-major or one element, and only a 0-dim operand, such as the Python
// number torch.where(mask, -inf, scores) passes, needs a conversion to the result type).
std::optional<MetaResult> where_self(const c10::IValue* args, size_t n) {
  const at::Tensor* condition = tensor_arg(args, n, 0);
  const at::Tensor* self = tensor_arg(args, n, 1);
  const at::Tensor* other = tensor_arg(args, n, 2);
  if (condition == nullptr || self == nullptr || other == nullptr || n != 3) return std::nullopt;
  if (!same_device(*condition, *self) || !same_device(*self, *other)) return std::nullopt;
  if (condition->scalar_type() == at::kByte) return std::nullopt;  // ATen warns and converts it
  if (condition->scalar_type() != at::kBool) return run_inline();
  const auto dtype = at::result_type(*self, *other);
  for (const at::Tensor* t : {condition, self, other}) {
    if (!neuron::bytes_are_values(*t) || !neuron::plain_real_dtype(t->scalar_type())) return std::nullopt;
    if (!neuron::dense_row_major(*t) && t->numel() != 1) return std::nullopt;
  }
  for (const at::Tensor* t : {self, other}) {
    if (t->scalar_type() != dtype && t->dim() != 0) return std::nullopt;
  }
  auto partial = neuron::broadcast(condition->sizes(), self->sizes());
  if (!partial) return run_inline();
  auto sizes = neuron::broadcast(*partial, other->sizes());
  if (!sizes) return run_inline();
  auto strides = neuron::elementwise_result_strides(*sizes, {condition, self, other});
  if (!strides) return std::nullopt;
  return single({{Sizes(sizes->begin(), sizes->end()), Sizes(strides->begin(), strides->end()), dtype}});
}

// native_batch_norm(input, weight?, bias?, running_mean?, running_var?, training, momentum,
// eps) -> (out, save_mean, save_invstd), in training mode: out row-major in the input's
// shape and dtype, the statistics [C] in norm_statistics_dtype (the CPU kernel's, checked
// over float, double and bfloat16, with and without float parameters). Taken where the
// input is a new tensor's layout and every parameter a [C] vector of one dtype; anything
// else, and eval mode (whose saved statistics the CPU kernel leaves empty), runs inline.
std::optional<MetaResult> batch_norm_training(const c10::IValue* args, size_t n) {
  const at::Tensor* input = tensor_arg(args, n, 0);
  if (input == nullptr || n != 8 || !args[5].isBool() || !args[5].toBool()) return run_inline();
  if (!is_float(input->scalar_type()) || input->dim() < 2 || input->numel() == 0 ||
      input->strides() != c10::IntArrayRef(c10::contiguous_strides(input->sizes()))) {
    return run_inline();
  }
  const int64_t channels = input->size(1);
  std::optional<c10::ScalarType> param_dtype;
  int running = 0;
  for (size_t i = 1; i < 5; ++i) {
    if (args[i].isNone() || (args[i].isTensor() && !args[i].toTensor().defined())) continue;  // None, boxed either way
    const at::Tensor* param = tensor_arg(args, n, i);
    if (param == nullptr || !same_device(*param, *input) || param->dim() != 1 || param->size(0) != channels ||
        param->stride(0) != 1) {
      return run_inline();
    }
    if (param_dtype && *param_dtype != param->scalar_type()) return run_inline();
    param_dtype = param->scalar_type();
    running += i >= 3 ? 1 : 0;
  }
  if (running == 1) return run_inline();
  if (param_dtype && *param_dtype != input->scalar_type() &&
      !(at::isReducedFloatingType(input->scalar_type()) && *param_dtype == at::kFloat)) {
    return run_inline();
  }
  const auto statistics = norm_statistics_dtype(*input, tensor_arg(args, n, 1), tensor_arg(args, n, 2));
  const auto running_dtype = norm_statistics_dtype(*input, tensor_arg(args, n, 3), tensor_arg(args, n, 4));
  if (statistics != running_dtype && param_dtype) return run_inline();
  return single({contiguous(input->sizes().vec(), input->scalar_type()), contiguous({channels}, running_dtype),
                 contiguous({channels}, running_dtype)});
}

// max(self): a 0-dim result of self's dtype; ATen rejects an empty self.
std::optional<MetaResult> max_all(const c10::IValue* args, size_t n) {
  const at::Tensor* self = tensor_arg(args, n, 0);
  if (self == nullptr || n != 1 || !neuron::plain_real_dtype(self->scalar_type())) return std::nullopt;
  if (self->numel() == 0) return run_inline();
  return single({contiguous({}, self->scalar_type())});
}

}  // namespace

c10::ScalarType norm_statistics_dtype(const at::Tensor& input, const at::Tensor* weight, const at::Tensor* bias) {
  const bool reduced = at::isReducedFloatingType(input.scalar_type());
  for (const at::Tensor* param : {weight, bias}) {
    if (reduced && param != nullptr && param->scalar_type() == at::kFloat) return at::kFloat;
  }
  return input.scalar_type();
}

ShapeRule shape_rule_for(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  const std::string_view name = schema.name();
  const std::string_view overload = schema.overload_name();
  if (overload.empty()) {
    if (name == "aten::native_layer_norm") return layer_norm;
    if (name == "aten::index_select") return index_select;
    if (name == "aten::_scaled_dot_product_flash_attention_for_cpu") return flash_attention_cpu;
    if (name == "aten::max") return max_all;
    if (name == "aten::native_batch_norm") return batch_norm_training;
  }
  if (name == "aten::masked_fill_" && overload == "Scalar") return masked_fill_scalar_;
  if (name == "aten::arange" && overload == "start_out") return arange_start_out;
  if (name == "aten::where" && overload == "self") return where_self;
  return convolution_shape_rule(op);
}

}  // namespace neuron::lazy
