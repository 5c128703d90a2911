// Boxed kernels for the three checks of `_safe_softmax`, which every attention through
// scaled_dot_product_attention's math path runs on its scores (an [8, 4, 64, 64] tensor,
// where ATen's softmax itself takes about 97 us, measured when they were written):
//   isneginf(scores)             a compare per element; ATen 35 us
//   all(mask, -1, keepdim=True)  a row holds no false exactly when memchr finds no zero
//                                byte in it; ATen's bool reduction 346 us
//   where(rows, 0.0, softmax)    a row is copied or filled whole; ATen 83 us
// Each takes only the inputs it was written for (contiguous, the result's exact dtype, no
// broadcasting beyond a per-row condition, an out= of the result's exact shape that overlaps
// no input, or where's out= over its full-size input exactly); anything else runs ATen's
// kernel, with ATen's semantics, warnings and errors. Each is a BoxedHostKernel
// (device/csrc/host_kernel_table.h) of the op and its out= form.
#pragma once

#include <ATen/core/stack.h>

namespace neuron::fastpath {

// all.dim(Tensor self, int dim, bool keepdim=False) and all.out(..., *, Tensor(a!) out)
bool try_all_of_rows(const c10::IValue* args, const c10::IValue* out_arg, torch::jit::Stack* stack, size_t n);
// isneginf(Tensor self) and isneginf.out(Tensor self, *, Tensor(a!) out)
bool try_isneginf(const c10::IValue* args, const c10::IValue* out_arg, torch::jit::Stack* stack, size_t n);
// where.self(Tensor condition, Tensor self, Tensor other) and where.self_out(..., *, out)
bool try_where_rows(const c10::IValue* args, const c10::IValue* out_arg, torch::jit::Stack* stack, size_t n);

}  // namespace neuron::fastpath
