// Small elementwise add, sub and mul with ATen's bits, without ATen's TensorIterator.
//
// A decoding loop's adds and multiplies are tiny (one token's [1, 1, hidden]): ATen spends
// most of such a call building a TensorIterator, not adding. An IEEE add, subtract or
// multiply is rounded once, correctly, however the loop around it is written, so a plain
// loop gives ATen's results bit for bit (an integer one wraps as ATen's does), save which
// NaN a result carries when both operands are NaN: IEEE 754 leaves that open, and ATen's own
// vector and scalar loops answer it differently (the result is a NaN either way). The kernel
// takes only what keeps that true and the result's layout ATen's:
//   - alpha 1 (with another alpha ATen multiplies first, and may fuse that into an FMA);
//   - one dtype, float, double, int32 or int64, for both operands, or a Python number of
//     the tensor's kind (an int anywhere, a float with a float tensor), cast as ATen casts it;
//   - each operand dense in row-major order (the strides of its size-1 dims aside: a
//     transposed query of one token), or of one element, or a block that the other repeats
//     (a bias [32] against [1, 1, 32]), or one element per row of the result (an RMSNorm's
//     rsqrt(variance) [2, 12, 1] against [2, 12, 32]); no conjugate, negative or zero tensors. The result
//     has the strides ATen's TensorIterator gives it (plan.h's
//     shared elementwise plan), which for such operands differ from row-major's only in
//     size-1 dims;
//   - 1 to GRAIN_SIZE elements (ATen splits larger ones over threads).
// Anything else is left to ATen's kernel, with its semantics, warnings and errors. Tensors
// may be of any device whose memory the host addresses (the caller makes neuron memory ready).
#pragma once

#include "fastpath/csrc/elementwise/plan.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <optional>

namespace neuron::fastpath {

enum class Arith : uint8_t { Add, Sub, Mul };

// The plan for `self op other` (times alpha, 1 for mul), or nullopt when the small kernel
// does not take these operands.
std::optional<ElementwisePlan> plan_small_arith(const at::Tensor& self, const at::Tensor& other,
                                           const c10::Scalar& alpha);

// Writes `self op other` into `out`: `plan.numel` elements of `plan.dtype` in row-major
// order (a contiguous out, the size-1 dims' strides aside), which may be the memory of an
// operand as big as the result (never part of one).
void run_small_arith(Arith op, const ElementwisePlan& plan, const at::Tensor& self, const at::Tensor& other,
                     const at::Tensor& out);

}  // namespace neuron::fastpath
