// Ops that CUDA runs for more dtypes than the CPU kernels do, where code written for
// CUDA relies on it. The emulated NeuronCore computes with the CPU kernels
// (fallback.cpp), so without these a program that runs on CUDA fails on neuron
// with the CPU's "not implemented for 'Int'". Each computes in a wider dtype the CPU
// supports, with exactly the result CUDA gives.
//
//   histc on integer tensors (Hugging Face's mixture-of-experts routing counts the
//   tokens per expert with torch.histc on int32 expert ids off the CPU).
#include "registrations.h"
#include "device/csrc/runtime/runtime.h"

#include <ATen/Operators.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/histc.h>
#include <ATen/ops/histc_ops.h>
#include <torch/library.h>

namespace neuron {
namespace {

bool is_integer(const at::Tensor& t) { return c10::isIntegralType(t.scalar_type(), /*includeBool=*/false); }

// Bin counts are integers, and integer values, min and max are exact in float64
// below 2**53: the counts equal CUDA's integer kernel's.
at::Tensor histc_as_on_cuda(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  if (!is_integer(self)) {
    return at::native::call_fallback_fn<&neuron_fallback, ATEN_OP(histc)>::call(self, bins, min, max);
  }
  return at::histc(self.to(at::kDouble), bins, min, max).to(self.scalar_type());
}

at::Tensor& histc_out_as_on_cuda(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max,
                      at::Tensor& out) {
  if (!is_integer(self)) {
    return at::native::call_fallback_fn<&neuron_fallback, ATEN_OP2(histc, out)>::call(self, bins, min, max, out);
  }
  TORCH_CHECK(out.scalar_type() == self.scalar_type(), "torch.histc: input tensor and output tensor should have "
              "the same dtype, but got input ", self.scalar_type(), " and output ", out.scalar_type());
  auto counts = histc_as_on_cuda(self, bins, min, max);
  at::native::resize_output(out, counts.sizes());
  out.copy_(counts);
  return out;
}

}  // namespace

void register_cuda_parity_kernels(torch::Library& m) {
  m.impl("histc", TORCH_FN(histc_as_on_cuda));
  m.impl("histc.out", TORCH_FN(histc_out_as_on_cuda));
}

}  // namespace neuron
