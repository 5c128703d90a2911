// native_layer_norm through ATen's LayerNormKernel stub (layer_norm.h says what it takes).

// A DispatchStub's lookup takes one pointer per CPU capability torch was built with, and its
// header lists them by these macros, which torch's build defines and an extension's does
// not: on x86-64 torch builds its kernels for AVX2 and AVX512 (libtorch_cpu exports
// DispatchStubImpl::get_call_ptr with those two). Defined here, before any ATen header, for
// this file only; another torch fails at import with an undefined symbol, not silently.
#if defined(__x86_64__)
#define HAVE_AVX512_CPU_DEFINITION
#define HAVE_AVX2_CPU_DEFINITION
#endif

#include "fastpath/csrc/aten_direct/layer_norm.h"

#include "device/csrc/aten/dense_layout.h"

#include <ATen/native/layer_norm.h>

namespace neuron::fastpath {
namespace {

// What the wrapper's expect_contiguous() passes to the kernel as it is.
bool takes(const at::Tensor& t, at::ScalarType dtype) {
  return bytes_are_values(t) && t.scalar_type() == dtype && t.is_contiguous();
}

}  // namespace

std::optional<LayerNormPlan> plan_layer_norm(const at::Tensor& input, c10::IntArrayRef normalized_shape,
                                             const std::optional<at::Tensor>& weight,
                                             const std::optional<at::Tensor>& bias) {
  const at::ScalarType dtype = input.scalar_type();
  if ((dtype != at::kFloat && dtype != at::kDouble) || !takes(input, dtype)) return std::nullopt;
  const int64_t dims = input.dim();
  const auto normalized_dims = static_cast<int64_t>(normalized_shape.size());
  if (normalized_dims == 0 || normalized_dims > dims) return std::nullopt;
  const int64_t axis = dims - normalized_dims;
  if (input.sizes().slice(axis) != normalized_shape) return std::nullopt;
  for (const auto* param : {&weight, &bias}) {
    if (!param->has_value() || !(*param)->defined()) continue;
    if (!takes(**param, dtype) || (*param)->sizes() != normalized_shape) return std::nullopt;
  }
  LayerNormPlan plan;
  plan.rows = 1;
  plan.row_size = 1;
  for (int64_t d = 0; d < dims; ++d) {
    (d < axis ? plan.rows : plan.row_size) *= input.size(d);
    plan.statistics.push_back(d < axis ? input.size(d) : 1);
  }
  if (plan.rows == 0 || plan.row_size == 0) return std::nullopt;
  return plan;
}

void run_layer_norm(const LayerNormPlan& plan, const at::Tensor& input, const std::optional<at::Tensor>& weight,
                    const std::optional<at::Tensor>& bias, double eps, at::Tensor& out, at::Tensor& mean,
                    at::Tensor& rstd) {
  static const at::Tensor undefined;
  const at::Tensor& gamma = weight.has_value() ? *weight : undefined;
  const at::Tensor& beta = bias.has_value() ? *bias : undefined;
  at::native::LayerNormKernel(c10::kCPU, input, gamma, beta, plan.rows, plan.row_size, eps, &out, &mean, &rstd);
}

}  // namespace neuron::fastpath
