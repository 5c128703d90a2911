// Result metadata of convolution and its backward, so that CNN and UNet steps are recorded
// instead of waiting at every convolution (aten::convolution's meta kernel is torch's
// Python code, and convolution_backward's too).
//
// A rule takes only calls it is sure ATen's CPU kernel accepts, with the layout the CPU
// kernel gives: input and weight row-major with every stride as a new tensor has it
// (the CPU kernels then give row-major results, every backend, every dtype taken; a
// channels-last input or weight gives channels-last results, which these rules leave to an
// inline run). Every call ATen might reject runs inline (run_inline), so that its error is
// raised at the op, by the CPU kernel, with its message: the checks below are a superset
// of ATen's, never a copy of its messages.
#include "adaptive_eager.h"

#include <c10/util/strides.h>

#include <optional>
#include <vector>

namespace neuron::lazy {

namespace {

using Sizes = std::vector<int64_t>;

MetaResult run_inline() { return {}; }

const at::Tensor* neuron_tensor(const c10::IValue& v) {
  if (!v.isTensor()) return nullptr;
  const at::Tensor& t = v.toTensor();
  return on_device(t) ? &t : nullptr;
}

bool conv_dtype(c10::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf;
}

// Strides exactly as a new tensor of these sizes has them (size-1 dims included).
bool fresh_layout(const at::Tensor& t) {
  return t.strides() == c10::IntArrayRef(c10::contiguous_strides(t.sizes()));
}

TensorMeta contiguous(Sizes sizes, c10::ScalarType dtype) {
  const auto strides = c10::contiguous_strides(sizes);
  return {std::move(sizes), Sizes(strides.begin(), strides.end()), dtype};
}

// A parameter list of one value per spatial dim, or one value for all of them.
std::optional<Sizes> per_dim(const c10::IValue& v, size_t spatial) {
  if (!v.isIntList()) return std::nullopt;
  Sizes values = v.toIntVector();
  if (values.size() == 1) values.assign(spatial, values[0]);
  if (values.size() != spatial) return std::nullopt;
  return values;
}

// What a convolution call computes, once its arguments are known to be accepted.
struct Plan {
  c10::ScalarType dtype;
  Sizes output;       // the output's sizes
  int64_t out_channels;
  bool batched;
};

// args[first..first+6]: stride, padding, dilation, transposed, output_padding, groups.
std::optional<Plan> plan(const at::Tensor& input, const at::Tensor& weight, const c10::IValue* params) {
  const int64_t k = weight.dim();
  if (k < 3 || k > 5) return std::nullopt;
  const bool batched = input.dim() == k;
  if (!batched && input.dim() != k - 1) return std::nullopt;
  if (input.device() != weight.device() || !conv_dtype(input.scalar_type()) ||
      weight.scalar_type() != input.scalar_type() || !fresh_layout(input) || !fresh_layout(weight)) {
    return std::nullopt;
  }
  const size_t spatial = static_cast<size_t>(k - 2);
  auto stride = per_dim(params[0], spatial);
  auto padding = per_dim(params[1], spatial);
  auto dilation = per_dim(params[2], spatial);
  auto output_padding = per_dim(params[4], spatial);
  if (!stride || !padding || !dilation || !output_padding || !params[3].isBool() || !params[5].isInt()) {
    return std::nullopt;
  }
  const bool transposed = params[3].toBool();
  const int64_t groups = params[5].toInt();
  if (groups <= 0) return std::nullopt;
  for (int64_t s : weight.sizes()) {
    if (s <= 0) return std::nullopt;
  }
  // Batch and channels, then the spatial sizes.
  const int64_t offset = batched ? 0 : 1;
  const int64_t batch = batched ? input.size(0) : 1;
  const int64_t in_channels = input.size(1 - offset);
  if (batch <= 0) return std::nullopt;
  int64_t out_channels = 0;
  if (transposed) {
    if (weight.size(0) != in_channels || in_channels % groups != 0) return std::nullopt;
    out_channels = weight.size(1) * groups;
  } else {
    if (weight.size(0) % groups != 0 || weight.size(1) * groups != in_channels) return std::nullopt;
    out_channels = weight.size(0);
  }
  Sizes output;
  if (batched) output.push_back(batch);
  output.push_back(out_channels);
  for (size_t d = 0; d < spatial; ++d) {
    const int64_t in = input.size(static_cast<int64_t>(d) + 2 - offset);
    const int64_t kernel = weight.size(static_cast<int64_t>(d) + 2);
    const int64_t s = (*stride)[d], p = (*padding)[d], dil = (*dilation)[d], op = (*output_padding)[d];
    if (in <= 0 || s <= 0 || p < 0 || dil <= 0 || op < 0) return std::nullopt;
    int64_t size = 0;
    if (transposed) {
      if (op >= s && op >= dil) return std::nullopt;
      size = (in - 1) * s - 2 * p + dil * (kernel - 1) + op + 1;
    } else {
      if (op != 0) return std::nullopt;
      const int64_t span = dil * (kernel - 1) + 1;
      if (in + 2 * p < span) return std::nullopt;
      size = (in + 2 * p - span) / s + 1;
    }
    if (size <= 0) return std::nullopt;
    output.push_back(size);
  }
  return Plan{input.scalar_type(), std::move(output), out_channels, batched};
}

// convolution(input, weight, bias?, stride, padding, dilation, transposed, output_padding,
// groups): the output, row-major, in the input's dtype.
std::optional<MetaResult> convolution(const c10::IValue* args, size_t n) {
  const at::Tensor* input = neuron_tensor(args[0]);
  const at::Tensor* weight = neuron_tensor(args[1]);
  if (n != 9 || input == nullptr || weight == nullptr) return run_inline();
  auto p = plan(*input, *weight, args + 3);
  if (!p || !p->batched) return run_inline();  // conv1d/2d/3d batch an unbatched input before
  if (!args[2].isNone() && !(args[2].isTensor() && !args[2].toTensor().defined())) {  // bias=None, boxed either way
    const at::Tensor* bias = neuron_tensor(args[2]);
    if (bias == nullptr || bias->device() != input->device() || bias->scalar_type() != p->dtype ||
        bias->dim() != 1 || bias->size(0) != p->out_channels) {
      return run_inline();
    }
  }
  MetaResult r;
  r.ok = true;
  r.returns.push_back({contiguous(std::move(p->output), p->dtype)});
  return r;
}

// convolution_backward(grad_output, input, weight, bias_sizes?, stride, padding, dilation,
// transposed, output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias):
// each one output_mask asks for, row-major in the input's dtype (of the input's, the
// weight's and [out_channels] sizes); the others undefined (no metadata). The execution
// checks that the CPU kernel left exactly those undefined (execute.cpp).
std::optional<MetaResult> convolution_backward(const c10::IValue* args, size_t n) {
  const at::Tensor* grad_output = neuron_tensor(args[0]);
  const at::Tensor* input = neuron_tensor(args[1]);
  const at::Tensor* weight = neuron_tensor(args[2]);
  if (n != 11 || grad_output == nullptr || input == nullptr || weight == nullptr || !args[10].isBoolList()) {
    return run_inline();
  }
  auto p = plan(*input, *weight, args + 4);
  if (!p || !p->batched) return run_inline();
  if (grad_output->device() != input->device() || grad_output->scalar_type() != p->dtype ||
      grad_output->sizes() != c10::IntArrayRef(p->output)) {
    return run_inline();
  }
  const auto mask = args[10].toBoolList();
  // A bias gradient without the weight's: oneDNN's kernel gives the weight's too (float
  // and bfloat16, not double), whatever the mask says; such calls run inline.
  if (mask.size() != 3 || (mask[2] && !mask[1])) return run_inline();
  if (mask[2]) {
    if (!args[3].isIntList() || args[3].toIntVector() != Sizes{p->out_channels}) return run_inline();
  }
  MetaResult r;
  r.ok = true;
  r.returns.resize(3);
  if (mask[0]) r.returns[0].push_back(contiguous(input->sizes().vec(), p->dtype));
  if (mask[1]) r.returns[1].push_back(contiguous(weight->sizes().vec(), p->dtype));
  if (mask[2]) r.returns[2].push_back(contiguous({p->out_channels}, p->dtype));
  return r;
}

}  // namespace

ShapeRule convolution_shape_rule(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  if (!schema.overload_name().empty()) return nullptr;
  if (schema.name() == "aten::convolution") return convolution;
  if (schema.name() == "aten::convolution_backward") return convolution_backward;
  return nullptr;
}

}  // namespace neuron::lazy
