// What the fast path's boxed kernels share (boxed.h).
#include "fastpath/csrc/boxed.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>

#include <utility>

namespace neuron::fastpath {

std::optional<at::Tensor> result_tensor(const c10::IValue* out_arg, c10::IntArrayRef sizes, at::ScalarType dtype,
                                        std::initializer_list<const at::Tensor*> inputs,
                                        const at::Tensor* same_as, c10::IntArrayRef strides) {
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

// Pops the op's arguments and pushes its one result, as a boxed kernel returns.
bool finish(torch::jit::Stack* stack, size_t n_args, at::Tensor result) {
  torch::jit::drop(*stack, n_args);
  stack->emplace_back(std::move(result));
  return true;
}

}  // namespace neuron::fastpath
