// Small neg, rsqrt and pow by 2, 3, -1 or -0.5 with ATen's bits, without ATen's TensorIterator.
//
// An RMSNorm (Llama's) computes pow(x, 2) and rsqrt of a token's [1, 1, hidden] five times a
// decode step, and rotary embeddings negate half of each query and key: tiny ops whose time
// ATen spends building a TensorIterator. These are ops ATen computes with single IEEE
// operations, each rounded once, correctly, in its vector and its scalar loop alike
// (PowKernel.cpp, UnaryOpsKernel.cpp): neg flips the sign bit, rsqrt is 1 / sqrt(x), pow by
// 2 is x * x, by 3 is (x * x) * x, by -1 is 1 / x and by -0.5 is rsqrt. A plain loop of the
// same operations gives ATen's results bit for bit, whatever order it visits the elements in.
// The result's layout is ATen's too: contiguous for a row-major input, and for a strided one
// that is not dense (rotary embedding's half of a transposed query) the layout TensorIterator
// gives it, contiguous in the order of the input's strides. Other exponents (std::pow, or pow
// by -2, whose scalar loop divides in double and whose vector loop does not), integer and
// reduced-precision dtypes, dense but permuted inputs (ATen keeps their strides), inputs with
// broadcast (zero) strides or overlapping elements, conjugate inputs, and more than GRAIN_SIZE
// elements are left to ATen's kernel, with its semantics, warnings and errors.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <optional>

namespace neuron::fastpath {

enum class Unary : uint8_t { Neg, Rsqrt, Square, Cube, Reciprocal };

// The unary op ATen's pow(x, exponent) computes for a float or double x, or nullopt when
// it calls std::pow (or divides in double).
std::optional<Unary> pow_as_unary(const c10::Scalar& exponent);

// The strides of the result ATen makes for a unary op of `self` (self's sizes and dtype), or
// nullopt when the small kernel does not take `self`: float or double, 1 to GRAIN_SIZE
// elements, bytes that are its values, row-major or strided without being dense.
std::optional<c10::SmallVector<int64_t, 6>> plan_small_unary(const at::Tensor& self);

// Writes op(self) into `out` (self's sizes and dtype, the planned strides; when both are
// row-major it may be self's memory).
void run_small_unary(Unary op, const at::Tensor& self, const at::Tensor& out);

}  // namespace neuron::fastpath
