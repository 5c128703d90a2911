// native_layer_norm run by ATen's own CPU kernel, below the wrapper that calls it.
//
// A decoding loop normalises one token ([1, 1, 32]) five times a step. ATen's CPU op spends
// most of such a call around its kernel: the input checks, expect_contiguous of three
// tensors, three result allocations through the dispatcher, and two views of the
// statistics. The kernel itself is a DispatchStub (at::native::LayerNormKernel) that reads
// and writes raw memory; called on the caller's tensors it gives ATen's results bit for bit,
// since it is ATen's code. This takes only what that wrapper passes straight through:
//   - float or double input, weight and bias of the input's dtype (mixed dtypes and half
//     precision go through ATen's casts);
//   - every tensor contiguous (ATen would copy it first) with bytes that are its values;
//   - normalized_shape the input's trailing sizes, and weight and bias of that shape;
//   - a non-empty input.
// Anything else is left to ATen's op, with its semantics, warnings and errors.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <optional>

namespace neuron::fastpath {

struct LayerNormPlan {
  int64_t rows;                               // M: the product of the leading sizes
  int64_t row_size;                           // N: the product of normalized_shape
  c10::SmallVector<int64_t, 6> statistics;    // mean's and rstd's sizes: leading sizes, then 1s
};

// The plan for native_layer_norm(input, normalized_shape, weight, bias), or nullopt.
std::optional<LayerNormPlan> plan_layer_norm(const at::Tensor& input, c10::IntArrayRef normalized_shape,
                                             const std::optional<at::Tensor>& weight,
                                             const std::optional<at::Tensor>& bias);

// Runs ATen's CPU kernel into `out` (row-major, the input's sizes), `mean` and `rstd`
// (row-major, plan.statistics), all of the input's dtype. The caller makes memory ready.
void run_layer_norm(const LayerNormPlan& plan, const at::Tensor& input, const std::optional<at::Tensor>& weight,
                    const std::optional<at::Tensor>& bias, double eps, at::Tensor& out, at::Tensor& mean,
                    at::Tensor& rstd);

}  // namespace neuron::fastpath
