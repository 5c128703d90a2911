// Everything the device registers with torch's dispatcher, in one place: what the device
// does for an op (aten::add, say) is the first of these that names it.
//
//   1. AutocastPrivateUse1   inside torch.autocast("neuron"): the ops of CUDA's lists are
//                            cast (register_autocast_policy); every other op falls through.
//   2. AutogradPrivateUse1   nn.LSTM / GRU / RNN and their cells (register_rnn_as_on_cpu);
//                            every other op gets torch's own autograd.
//   3. PrivateUse1           the kernel one of the lists below registers for the op;
//                            else, for an op with a CPU kernel and a composite decomposition,
//                            the CPU kernel through the fallback (composite_routes.cpp,
//                            registered when the Python module loads, after these);
//                            else the boxed fallback: the CPU kernel over the same memory
//                            (fallback.cpp), recorded by the runtime above when one is
//                            installed (runtime/interceptor.h).
//   Sparse, sparse CSR and quantized neuron tensors: refused, with what to do instead.
//
// For aten::add.Tensor: no autocast entry (it falls through), torch's autograd, then
// register_unboxed_ops's kernel (unboxed_ops.cpp). The dispatcher's own account of an op:
// torch._C._dispatch_dump("aten::add.Tensor").
//
// Outside the dispatcher the device registers, each beside its code: the device guard
// (runtime/device.cpp), the allocator (runtime/allocator.cpp), the PrivateUse1 hooks
// (runtime/hooks.cpp), the attention backend choice's dispatch stub (kernels.cpp), DDP's
// timer (ddp_timer.cpp) and torch.profiler's activity profiler (tracing/kineto_plugin.cpp).
#include "registrations.h"

#include "device/csrc/runtime/runtime.h"

#include <torch/library.h>

namespace neuron {

// ---- the neuron:: ops: dropout's fused pointwise steps and bulk Bernoulli draws ----------
TORCH_LIBRARY(neuron, m) {
  m.def("dropout_apply(Tensor self, Tensor draws, float scale) -> (Tensor, Tensor)");
  m.def("dropout_apply.out(Tensor self, Tensor draws, float scale, *, Tensor(a!) out, Tensor(b!) mask) -> "
        "(Tensor(a!), Tensor(b!))");
  m.def("masked_scale(Tensor self, Tensor mask, float scale) -> Tensor");
  m.def("masked_scale.out(Tensor self, Tensor mask, float scale, *, Tensor(a!) out) -> Tensor(a!)");
  m.def("bernoulli_(Tensor(a!) self, float p, *, Generator? generator=None) -> Tensor(a!)");
}
TORCH_LIBRARY_IMPL(neuron, CPU, m) { register_neuron_ops_cpu_kernels(m); }
TORCH_LIBRARY_IMPL(neuron, Meta, m) { register_neuron_ops_meta_kernels(m); }
// On neuron tensors: the unboxed path (unboxed_ops.cpp), else the fallback below.
TORCH_LIBRARY_IMPL(neuron, PrivateUse1, m) { register_neuron_ops_unboxed(m); }

// ---- every other op on a neuron tensor: its CPU kernel over the same memory --------------
TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>()); }
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&unsupported_layout_fallback>());
}
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&unsupported_layout_fallback>());
}
TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&unsupported_layout_fallback>());
}

// ---- the device's own kernels for aten ops ---------------------------------------------
// No op is in two lists (a second registration would override the first).
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  register_cuda_parity_kernels(m);  // histc
  register_cpu_kernel_routes(m);    // addr, _stack, linalg_lstsq, ...
  register_native_kernels(m);       // empty, _copy_from, views, resize_, set_, convolution_overrideable, ...
  register_random_kernels(m);       // native_dropout, bernoulli_
  register_rnn_as_on_cpu(m);        // lstm, gru, rnn_tanh, rnn_relu and their cells
  register_fused_rnn_cells(m);      // _thnn_fused_lstm_cell, _thnn_fused_gru_cell, backwards
  register_unboxed_ops(m);          // add, mul, matmuls, activations, reductions, masks, cat, _foreach_*, ...
}
// At the autograd key the RNN ops' parts record their own autograd (as a composite op's do).
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { register_rnn_as_on_cpu(m); }

// Conjugate and negative views are resolved by the CPU copy kernel (the host alias keeps
// the bits); without a fallthrough their fallbacks re-enter _copy_from until the stack
// overflows.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) { m.impl("_copy_from", torch::CppFunction::makeFallthrough()); }
TORCH_LIBRARY_IMPL(aten, Negative, m) { m.impl("_copy_from", torch::CppFunction::makeFallthrough()); }

// ---- torch.autocast("neuron") --------------------------------------------------------
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }
TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) { register_autocast_policy(m); }

}  // namespace neuron
