// addmm and mm as the one BLAS call ATen's CPU kernel makes (blas_matmul.h says what it takes).
#include "fastpath/csrc/matmul/blas_matmul.h"

#include "device/csrc/aten/dense_layout.h"

#include <ATen/Context.h>
#include <c10/util/TypeCast.h>

#include <algorithm>
#include <climits>
#include <cstring>

// MKL's Fortran BLAS, which libtorch_cpu exports and ATen's cpublas::gemm calls.
extern "C" void sgemm_(char* transa, char* transb, int* m, int* n, int* k, float* alpha, const float* a, int* lda,
                       const float* b, int* ldb, float* beta, float* c, int* ldc);
extern "C" void dgemm_(char* transa, char* transb, int* m, int* n, int* k, double* alpha, const double* a, int* lda,
                       const double* b, int* ldb, double* beta, double* c, int* ldc);

namespace neuron::fastpath {
namespace {

bool real_scalar(const c10::Scalar& s, at::ScalarType dtype) {
  if (!(s.isFloatingPoint() || s.isIntegral(/*includeBool=*/false)) || s.isSymbolic()) return false;
  // ATen converts alpha and beta to the op's math type and raises where a float overflows.
  return dtype != at::kFloat || !c10::overflows<float, double>(s.toDouble());
}

// Where ATen would send a float product through oneDNN at reduced precision instead of BLAS.
bool float_matmul_in_ieee() {
  const auto precision = at::globalContext().float32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL);
  return precision != at::Float32Precision::BF16 && precision != at::Float32Precision::TF32;
}

// A bias that expand_size would take to [rows, cols].
bool expands_to(const at::Tensor& bias, int64_t rows, int64_t cols) {
  if (bias.dim() > 2) return false;
  const int64_t target[2] = {rows, cols};
  for (int64_t d = 0; d < bias.dim(); ++d) {
    const int64_t size = bias.size(bias.dim() - 1 - d);
    if (size != 1 && size != target[1 - d]) return false;
  }
  return true;
}

}  // namespace

std::optional<BlasMatmul> plan_blas_matmul(const at::Tensor* bias, const at::Tensor& mat1, const at::Tensor& mat2,
                                           const c10::Scalar& beta, const c10::Scalar& alpha) {
  if (!bytes_are_values(mat1) || !bytes_are_values(mat2) || mat1.dim() != 2 || mat2.dim() != 2) return std::nullopt;
  const at::ScalarType dtype = mat1.scalar_type();
  if ((dtype != at::kFloat && dtype != at::kDouble) || mat2.scalar_type() != dtype) return std::nullopt;
  if (dtype == at::kFloat && !float_matmul_in_ieee()) return std::nullopt;
  const int64_t rows = mat1.size(0), inner = mat1.size(1), cols = mat2.size(1);
  if (mat2.size(0) != inner || rows == 0 || inner == 0 || cols == 0) return std::nullopt;
  if (!real_scalar(alpha, dtype) || !real_scalar(beta, dtype)) return std::nullopt;
  if (bias != nullptr &&
      (!bytes_are_values(*bias) || bias->scalar_type() != dtype || !expands_to(*bias, rows, cols))) {
    return std::nullopt;
  }

  BlasMatmul plan;
  plan.sizes = {rows, cols};
  plan.dtype = dtype;
  plan.alpha = alpha;
  plan.beta = bias != nullptr ? beta : c10::Scalar(0);
  plan.copy_bias = bias != nullptr && beta.toDouble() != 0.0;

  // addmm_impl_cpu_'s choices for a new row-major result (strides [cols, 1], or [1, 1] for one
  // column): BLAS is column-major, so unless the result has one column ATen computes its
  // transpose, mat2^T @ mat1^T.
  const int64_t result_strides[2] = {std::max<int64_t>(cols, 1), 1};
  const bool transpose_c = cols != 1;
  plan.a_is_mat2 = transpose_c;
  const at::Tensor& a = transpose_c ? mat2 : mat1;
  const at::Tensor& b = transpose_c ? mat1 : mat2;
  const int64_t m = transpose_c ? cols : rows, n = transpose_c ? rows : cols, k = inner;
  const int lead = transpose_c ? 1 : 0, other = transpose_c ? 0 : 1;  // a's dims, in BLAS's order
  bool transpose_a, transpose_b;
  if (a.stride(lead) == 1 && a.stride(other) >= std::max<int64_t>(1, m)) {
    transpose_a = false;
  } else if (a.stride(other) == 1 && a.stride(lead) >= std::max<int64_t>(1, k)) {
    transpose_a = true;
  } else {
    return std::nullopt;  // ATen copies it first
  }
  if (b.stride(lead) == 1 && b.stride(other) >= std::max<int64_t>(1, k)) {
    transpose_b = false;
  } else if (b.stride(other) == 1 && b.stride(lead) >= std::max<int64_t>(1, n)) {
    transpose_b = true;
  } else {
    return std::nullopt;
  }
  int64_t lda = a.stride(transpose_a == transpose_c ? 1 : 0);
  int64_t ldb = b.stride(transpose_b == transpose_c ? 1 : 0);
  int64_t ldc = result_strides[transpose_c ? 0 : 1];

  // cpublas::internal::normalize_last_dims: leading dimensions of single rows and columns.
  if (n == 1) ldc = m;
  if (transpose_a) {
    if (m == 1) lda = k;
  } else if (k == 1) {
    lda = m;
  }
  if (transpose_b) {
    if (k == 1) ldb = n;
  } else if (n == 1) {
    ldb = k;
  }
  // cpublas's use_blas_gemm: otherwise ATen runs its own gemm kernel.
  const bool fits = m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
                    ldc <= INT_MAX && lda >= std::max<int64_t>(1, transpose_a ? k : m) &&
                    ldb >= std::max<int64_t>(1, transpose_b ? n : k) && ldc >= std::max<int64_t>(1, m);
  if (!fits) return std::nullopt;
  plan.transa = transpose_a ? 't' : 'n';
  plan.transb = transpose_b ? 't' : 'n';
  plan.m = static_cast<int>(m);
  plan.n = static_cast<int>(n);
  plan.k = static_cast<int>(k);
  plan.lda = static_cast<int>(lda);
  plan.ldb = static_cast<int>(ldb);
  plan.ldc = static_cast<int>(ldc);
  return plan;
}

namespace {

// result.copy_(bias.expand(rows, cols)) into the row-major result: element bytes as they are.
void copy_expanded_bias(const at::Tensor& bias, int64_t rows, int64_t cols, const at::Tensor& out) {
  const size_t item = bias.element_size();
  // The bias's strides against the result's two dims; 0 where it repeats.
  int64_t stride[2] = {0, 0};
  for (int64_t d = 0; d < bias.dim(); ++d) {
    const int64_t result_dim = 2 - bias.dim() + d;
    if (bias.size(d) != 1) stride[result_dim] = bias.stride(d);
  }
  const char* src = static_cast<const char*>(bias.const_data_ptr());
  char* dst = static_cast<char*>(out.mutable_data_ptr());
  for (int64_t i = 0; i < rows; ++i) {
    char* row = dst + i * cols * item;
    const char* from = src + i * stride[0] * item;
    if (stride[1] == 1) {
      std::memcpy(row, from, cols * item);
    } else {
      for (int64_t j = 0; j < cols; ++j) std::memcpy(row + j * item, from + j * stride[1] * item, item);
    }
  }
}

template <class T, class Gemm>
void call_gemm(const BlasMatmul& plan, const T* a, const T* b, T* c, Gemm gemm) {
  char transa = plan.transa, transb = plan.transb;
  int m = plan.m, n = plan.n, k = plan.k, lda = plan.lda, ldb = plan.ldb, ldc = plan.ldc;
  // As ATen converts them: to the op's math type, the value passed by pointer.
  T alpha = plan.alpha.to<T>(), beta = plan.beta.to<T>();
  gemm(&transa, &transb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
}

}  // namespace

void run_blas_matmul(const BlasMatmul& plan, const at::Tensor* bias, const at::Tensor& mat1, const at::Tensor& mat2,
                     const at::Tensor& out) {
  if (plan.copy_bias) copy_expanded_bias(*bias, plan.sizes[0], plan.sizes[1], out);
  const at::Tensor& a = plan.a_is_mat2 ? mat2 : mat1;
  const at::Tensor& b = plan.a_is_mat2 ? mat1 : mat2;
  if (plan.dtype == at::kFloat) {
    call_gemm(plan, a.const_data_ptr<float>(), b.const_data_ptr<float>(), out.mutable_data_ptr<float>(), sgemm_);
  } else {
    call_gemm(plan, a.const_data_ptr<double>(), b.const_data_ptr<double>(), out.mutable_data_ptr<double>(), dgemm_);
  }
}

}  // namespace neuron::fastpath
