// Deterministic mode fills new memory as the CPU and CUDA do.
//
// With torch.use_deterministic_algorithms(True) and
// torch.utils.deterministic.fill_uninitialized_memory (on by default), the CPU's and CUDA's
// empty kernels fill what they allocate with NaN (floating and complex dtypes) or the
// dtype's largest value (integers, bool), so that a read of memory nobody wrote is
// reproducible; resize_ fills what it grows. A pending tensor's fill is an op like any
// other: recorded, as the op that writes it would be.
//
// The CPU's and CUDA's structured kernels make their results without the dispatcher, and
// leave them unfilled (they write them whole). The device makes a structured op's result
// through its empty kernels, from inside the op's kernel, like any empty tensor, and no
// state of the thread tells the two apart (torch.empty's own binding excludes the autograd
// keys too): in this mode those results are filled as well, then written by the op. The
// same values, at the cost of one fill per result.
#include "device/csrc/runtime/runtime.h"

#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>

namespace neuron {

bool fills_uninitialized_memory() {
  const auto& context = at::globalContext();
  return context.deterministicAlgorithms() && context.deterministicFillUninitializedMemory();
}

at::Tensor filled_if_deterministic(at::Tensor t) {
  if (C10_UNLIKELY(fills_uninitialized_memory())) at::native::fill_empty_deterministic_(t);
  return t;
}

void fill_grown_if_deterministic(const at::Tensor& t, int64_t old_storage_nbytes) {
  if (C10_UNLIKELY(fills_uninitialized_memory())) at::native::fill_resize_deterministic_(t, old_storage_nbytes);
}

}  // namespace neuron
