// What the fast path's boxed kernels share: the result of a functional op or its out= twin,
// and the stack a boxed kernel leaves (device/csrc/host_kernel_table.h's BoxedHostKernel).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>

#include <initializer_list>
#include <optional>

namespace neuron::fastpath {

// A new CPU tensor for a functional op (of `strides` where given, else contiguous); for an
// out= op, the caller's out, when it already is what ATen would make it (an out= that must be
// resized or cast, or that shares memory with an input, declines: ATen's kernel resizes,
// casts, warns or raises). An elementwise kernel may also write over `same_as`, an input of
// the result's exact layout (a recorded graph places a result in the memory of an input that
// dies with the op).
std::optional<at::Tensor> result_tensor(const c10::IValue* out_arg, c10::IntArrayRef sizes, at::ScalarType dtype,
                                        std::initializer_list<const at::Tensor*> inputs,
                                        const at::Tensor* same_as = nullptr, c10::IntArrayRef strides = {});

// Pops the op's `n_args` arguments and pushes its one result, as a boxed kernel returns.
bool finish(torch::jit::Stack* stack, size_t n_args, at::Tensor result);

}  // namespace neuron::fastpath
