// torch.autocast(device_type="neuron"): CUDA's policy, op for op.
//
// PyTorch publishes CUDA's op lists as X-macros (ATen/autocast_mode.h) so that
// other backends can reuse them: matmuls and convolutions run in the autocast
// dtype (bfloat16 or float16), reductions, norms and losses in float32, and
// mixed-dtype ops promote to the widest input. Every other op falls through.
#include "registrations.h"

#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace neuron {
namespace {

using namespace at;  // the list macros name ops unqualified, as CUDA's registration does
using at::autocast::CastPolicy;

Tensor binary_cross_entropy_banned(const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast on neuron "
              "(as on CUDA): a sigmoid before them loses precision in low-precision dtypes. Combine the two "
              "with torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss, which "
              "are safe to autocast, or run this op outside the autocast region.");
}

}  // namespace

void register_autocast_policy(torch::Library& m) {
  using namespace at;  // as above: the lists' macros name ops and policies unqualified
  using at::autocast::CastPolicy;
#define NEURON_LOWER_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NEURON_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NEURON_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NEURON_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(NEURON_LOWER_PRECISION)
  AT_FORALL_FP32(NEURON_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NEURON_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(NEURON_PROMOTE)
  // (PyTorch itself registers the fused RNN cells for AutocastPrivateUse1.) nn.LSTM, GRU and
  // RNN run as the CPU runs them (rnn_as_on_cpu.cpp), in the autocast dtype: as CUDA casts
  // the arguments of its cuDNN RNN.
  KERNEL_PRIVATEUSEONE(lstm, input, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(lstm, data, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(gru, input, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(gru, data, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(rnn_tanh, input, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(rnn_tanh, data, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(rnn_relu, input, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(rnn_relu, data, lower_precision_fp)
  // Unsafe under autocast, as on CUDA: use binary_cross_entropy_with_logits.
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"),
         TORCH_FN(binary_cross_entropy_banned));
#undef NEURON_LOWER_PRECISION
#undef NEURON_FP32
#undef NEURON_FP32_SET_OPT_DTYPE
#undef NEURON_PROMOTE
}

}  // namespace neuron
