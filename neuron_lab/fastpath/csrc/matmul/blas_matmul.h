// addmm and mm as ATen's CPU kernel computes them, without ATen's wrapper around the BLAS call.
//
// A decoding loop's matmuls are one token against a weight ([1, 32] @ [32, 96]): ATen's
// CPU addmm spends more on its wrapper (the structured kernel's checks, the dispatcher calls
// that expand the bias and copy it into the result, resolve_conj) than BLAS spends on the
// product. The product itself is one sgemm/dgemm call (LinearAlgebra.cpp's addmm_impl_cpu_
// and CPUBlas.cpp's gemm): the same call with the same arguments gives the same bits, so this
// makes exactly the call ATen would make (its choice of transposes and leading dimensions,
// then normalize_last_dims) on the same bytes, after the same bias copy. It takes only what
// keeps that call ATen's:
//   - float or double, one dtype for all operands (half and bfloat16 go through oneDNN);
//   - for float, MKLDNN matmul precision left at "ieee"/none (bf16 or tf32 would send the
//     product through oneDNN instead);
//   - 2-d matrices whose strides BLAS takes as they are (ATen copies others first), no
//     conjugate, negative or zero-tensor bits, sizes that fit BLAS's int;
//   - a bias that expands to the result (any strides; its values are copied as ATen copies
//     them), or none (mm);
//   - a non-empty product (ATen fills or scales the result of an empty one itself).
// Anything else is left to ATen's kernel, with its semantics, warnings and errors.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <optional>

namespace neuron::fastpath {

// One BLAS call in column-major terms, as CPUBlas.cpp's gemm makes it, plus what feeds it.
struct BlasMatmul {
  c10::SmallVector<int64_t, 2> sizes;  // the result's: [mat1 rows, mat2 columns], row-major
  at::ScalarType dtype;
  char transa, transb;  // 'n' or 't'
  int m, n, k, lda, ldb, ldc;
  bool a_is_mat2;  // ATen swaps the operands when it computes the row-major result's transpose
  bool copy_bias;  // beta != 0: the result starts as the expanded bias
  c10::Scalar alpha, beta;
};

// The plan for addmm(bias, mat1, mat2, beta, alpha), or for mm(mat1, mat2) when `bias` is
// null; nullopt when ATen would not make a single BLAS call of these operands.
std::optional<BlasMatmul> plan_blas_matmul(const at::Tensor* bias, const at::Tensor& mat1, const at::Tensor& mat2,
                                           const c10::Scalar& beta, const c10::Scalar& alpha);

// Writes the product into `out`, a new row-major tensor of `plan.sizes` and `plan.dtype`
// that overlaps no operand. The caller makes the operands' memory ready.
void run_blas_matmul(const BlasMatmul& plan, const at::Tensor* bias, const at::Tensor& mat1, const at::Tensor& mat2,
                     const at::Tensor& out);

}  // namespace neuron::fastpath
