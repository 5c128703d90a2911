// The registration functions of the ATen glue's files, called only by registrations.cpp,
// the one list of what the device registers with the dispatcher.
#pragma once

#include <ATen/core/stack.h>
#include <torch/library.h>

namespace neuron {

// kernels.cpp: the kernels that must be native (empty, copies, views, resize_, set_,
// record_stream, convolution, the attention backend choice, in-place metadata changes).
void register_native_kernels(torch::Library& m);
// fallback.cpp: ops whose neuron entry would be a decomposition that rounds differently
// from their CPU kernel, and the foreach ops, sent whole to the CPU-kernel fallback.
void register_cpu_kernel_routes(torch::Library& m);
// fallback.cpp: refuses an op on a sparse or quantized neuron tensor, saying what to do.
void unsupported_layout_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// unboxed_ops.cpp: the hottest ops, without the boxed fallback's argument stack.
void register_unboxed_ops(torch::Library& m);
// unboxed_ops.cpp: the neuron:: ops (dropout's steps) on the unboxed path.
void register_neuron_ops_unboxed(torch::Library& m);
// cuda_parity.cpp: ops CUDA runs for more dtypes than the CPU kernels (integer histc).
void register_cuda_parity_kernels(torch::Library& m);
// random_kernels.cpp: dropout from the core's generator, and the neuron:: ops' kernels.
void register_random_kernels(torch::Library& m);
void register_neuron_ops_cpu_kernels(torch::Library& m);
void register_neuron_ops_meta_kernels(torch::Library& m);
// rnn_cells.cpp: the fused LSTM / GRU cells nn.LSTM and nn.GRU call on accelerators.
void register_fused_rnn_cells(torch::Library& m);
// rnn_as_on_cpu.cpp: nn.LSTM / GRU / RNN and their cells as the CPU runs them; for both
// the autograd key and the device key.
void register_rnn_as_on_cpu(torch::Library& m);
// autocast.cpp: torch.autocast("neuron")'s policy, CUDA's lists op for op.
void register_autocast_policy(torch::Library& m);

}  // namespace neuron
