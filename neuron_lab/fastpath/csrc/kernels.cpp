// Every fast host kernel, registered with the device's table (device/csrc/host_kernel_table.h):
// the at-once kernels of the unboxed path, the empty-result kernels of recorded small
// arithmetic and the boxed kernels of the fallback and replay, each under its name, family and
// the ATen kernel it mirrors (the list at the end; KERNELS.md documents each). The kernels'
// own code lives by kind in the folders beside this file; this file adapts them to each op's
// signature.
#include "device/csrc/aten/dense_layout.h"
#include "device/csrc/aten/host_kernel_table.h"
#include "device/csrc/runtime/interceptor.h"
#include "device/csrc/runtime/runtime.h"
#include "fastpath/csrc/at_once.h"
#include "fastpath/csrc/boxed.h"
#include "fastpath/csrc/elementwise/arith.h"
#include "fastpath/csrc/elementwise/bitwise.h"
#include "fastpath/csrc/elementwise/unary.h"
#include "fastpath/csrc/elementwise/where.h"
#include "fastpath/csrc/matmul/blas_matmul.h"
#include "fastpath/csrc/movement/arange.h"
#include "fastpath/csrc/movement/cat.h"
#include "fastpath/csrc/movement/convert.h"
#include "fastpath/csrc/movement/fill.h"
#include "fastpath/csrc/movement/index_select.h"
#include "fastpath/csrc/reductions/compare.h"
#include "fastpath/csrc/reductions/isin.h"
#include "fastpath/csrc/reductions/sum.h"

#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE
#include <ATen/ops/_to_copy_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/any_ops.h>
#include <ATen/ops/arange_ops.h>
#include <ATen/ops/argmax_ops.h>
#include <ATen/ops/bitwise_and_ops.h>
#include <ATen/ops/bitwise_not_ops.h>
#include <ATen/ops/bitwise_or_ops.h>
#include <ATen/ops/cat_ops.h>
#include <ATen/ops/clone_ops.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/eq_ops.h>
#include <ATen/ops/fill_ops.h>
#include <ATen/ops/index_select_ops.h>
#include <ATen/ops/isin_ops.h>
#include <ATen/ops/max_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/pow_ops.h>
#include <ATen/ops/rsqrt_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/where_ops.h>
#include <c10/util/SmallVector.h>

#include <cstring>
#include <functional>
#include <optional>

namespace neuron::fastpath {
namespace {

// ---- at-once kernels (the unboxed path) ----------------------------------------------------

// Some ops of a decoding loop have a host kernel of their own with ATen's bits, faster than
// ATen's for their token-sized operands (no TensorIterator, no host aliases): small add, sub
// and mul (elementwise/arith.h); neg, rsqrt and pow by 2, 3, -1 or -0.5 (elementwise/unary.h);
// isin of small integer tensors (reductions/isin.h); cat of row-major tensors and index_select
// of contiguous ones (movement/cat.h, movement/index_select.h); addmm and mm as the BLAS call
// ATen's kernel makes (matmul/blas_matmul.h). Their results are new device memory, written when
// the kernel takes the arguments (their memory is ready: begin_unboxed_op made it so); otherwise nullopt, and
// ATen's kernel runs.
template <class Op>
struct AtOnce;

template <Arith op>
std::optional<at::Tensor> small_arith_at_once(c10::DeviceIndex device, const char* name, const at::Tensor& self,
                                              const at::Tensor& other, const c10::Scalar& alpha = 1) {
  const auto plan = plan_small_arith(self, other, alpha);
  if (!plan.has_value()) return std::nullopt;
  return write_new_result(device, name, plan->sizes, plan->strides, plan->dtype,
                          [&](const at::Tensor& out) { run_small_arith(op, *plan, self, other, out); });
}

#define NEURON_SMALL_ARITH(op_struct, arith)                                                   \
  template <>                                                                                \
  struct AtOnce<at::_ops::op_struct> { \
    template <class... A>                                                                    \
    static std::optional<at::Tensor> run(c10::DeviceIndex device, const A&... args) {        \
      return small_arith_at_once<arith>(device, at::_ops::op_struct::name, args...);         \
    }                                                                                        \
  };
NEURON_SMALL_ARITH(add_Tensor, Arith::Add)
NEURON_SMALL_ARITH(sub_Tensor, Arith::Sub)
NEURON_SMALL_ARITH(mul_Tensor, Arith::Mul)
#undef NEURON_SMALL_ARITH

std::optional<at::Tensor> small_unary_at_once(c10::DeviceIndex device, const char* name, Unary op,
                                              const at::Tensor& self) {
  const auto strides = plan_small_unary(self);
  if (!strides.has_value()) return std::nullopt;
  return write_new_result(device, name, self.sizes(), *strides, self.scalar_type(),
                          [&](const at::Tensor& out) { run_small_unary(op, self, out); });
}

#define NEURON_SMALL_UNARY(op_struct, unary)                                                   \
  template <>                                                                                \
  struct AtOnce<at::_ops::op_struct> { \
    static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& self) {  \
      return small_unary_at_once(device, at::_ops::op_struct::name, unary, self);            \
    }                                                                                        \
  };
NEURON_SMALL_UNARY(neg, Unary::Neg)
NEURON_SMALL_UNARY(rsqrt, Unary::Rsqrt)
#undef NEURON_SMALL_UNARY

template <>
struct AtOnce<at::_ops::pow_Tensor_Scalar> {
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& self, const c10::Scalar& exponent) {
    const auto op = pow_as_unary(exponent);
    if (!op.has_value()) return std::nullopt;
    return small_unary_at_once(device, at::_ops::pow_Tensor_Scalar::name, *op, self);
  }
};

template <>
struct AtOnce<at::_ops::isin_Tensor_Tensor> {
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& elements,
                                       const at::Tensor& test_elements, bool /*assume_unique*/, bool invert) {
    if (!small_isin_takes(elements, test_elements)) return std::nullopt;
    return write_new_result(device, at::_ops::isin_Tensor_Tensor::name, elements.sizes(), at::kBool,
                            [&](const at::Tensor& out) { run_small_isin(elements, test_elements, invert, out); });
  }
};

template <>
struct AtOnce<at::_ops::where_self> {
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& condition, const at::Tensor& self,
                                       const at::Tensor& other) {
    const auto plan = plan_small_where(condition, self, other);
    if (!plan.has_value()) return std::nullopt;
    return write_new_result(device, at::_ops::where_self::name, plan->sizes, plan->strides, plan->dtype,
                            [&](const at::Tensor& out) { run_small_where(*plan, condition, self, other, out); });
  }
};

// In place: the result is self, returned by reference.
template <>
struct AtOnce<at::_ops::fill__Scalar> {
  static std::optional<std::reference_wrapper<at::Tensor>> run(c10::DeviceIndex device, at::Tensor& self,
                                                               const c10::Scalar& value) {
    if (!small_fill_takes(self, value)) return std::nullopt;
    run_at_once(device, at::_ops::fill__Scalar::name, [&] {
      run_small_fill(self, value);
      return true;
    });
    return std::ref(self);
  }
};

// out= form (arange() makes an empty out and calls it): the result is out, sized here as
// ATen's kernel sizes an empty one.
template <>
struct AtOnce<at::_ops::arange_start_out> {
  static std::optional<std::reference_wrapper<at::Tensor>> run(c10::DeviceIndex device, const c10::Scalar& start,
                                                               const c10::Scalar& end, const c10::Scalar& step,
                                                               at::Tensor& out) {
    const auto size = small_arange_size(start, end, step, out);
    if (!size.has_value()) return std::nullopt;
    run_at_once(device, at::_ops::arange_start_out::name, [&] {
      if (out.numel() != *size) out.resize_({*size});
      run_small_arange(start, step, out);
      return true;
    });
    return std::ref(out);
  }
};

std::optional<at::Tensor> small_bitwise_at_once(c10::DeviceIndex device, const char* name, Bitwise op,
                                                const at::Tensor& self, const at::Tensor* other) {
  const auto plan = plan_small_bitwise(self, other);
  if (!plan.has_value()) return std::nullopt;
  return write_new_result(device, name, plan->sizes, plan->strides, plan->dtype,
                          [&](const at::Tensor& out) { run_small_bitwise(op, *plan, self, other, out); });
}

#define NEURON_SMALL_BITWISE(op_struct, bitwise)                                                          \
  template <>                                                                                           \
  struct AtOnce<at::_ops::op_struct> { \
    static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& self,               \
                                         const at::Tensor& other) {                                     \
      return small_bitwise_at_once(device, at::_ops::op_struct::name, bitwise, self, &other);           \
    }                                                                                                   \
  };
NEURON_SMALL_BITWISE(bitwise_and_Tensor, Bitwise::And)
NEURON_SMALL_BITWISE(bitwise_or_Tensor, Bitwise::Or)
#undef NEURON_SMALL_BITWISE

template <>
struct AtOnce<at::_ops::bitwise_not> {
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& self) {
    return small_bitwise_at_once(device, at::_ops::bitwise_not::name, Bitwise::Not, self, nullptr);
  }
};

template <>
struct AtOnce<at::_ops::argmax> {
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& self, std::optional<int64_t> dim,
                                       bool keepdim) {
    const auto sizes = plan_small_argmax(self, dim, keepdim);
    if (!sizes.has_value()) return std::nullopt;
    return write_new_result(device, at::_ops::argmax::name, *sizes, at::kLong,
                            [&](const at::Tensor& out) { run_small_argmax(self, out); });
  }
};

// sum and mean over the last dim (an RMSNorm's mean of squares, five a Llama decode step).
template <class Op, bool kMean>
struct SmallSumKernel {
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& self, at::OptionalIntArrayRef dim,
                                       bool keepdim, std::optional<at::ScalarType> dtype) {
    const auto plan = plan_small_sum(self, dim, keepdim, dtype);
    if (!plan.has_value()) return std::nullopt;
    return write_new_result(device, Op::name, plan->sizes, self.scalar_type(),
                            [&](const at::Tensor& out) { run_small_sum(*plan, self, kMean, out); });
  }
};
template <>
struct AtOnce<at::_ops::mean_dim> : SmallSumKernel<at::_ops::mean_dim, /*kMean=*/true> {};
template <>
struct AtOnce<at::_ops::sum_dim_IntList> : SmallSumKernel<at::_ops::sum_dim_IntList, /*kMean=*/false> {};

template <>
struct AtOnce<at::_ops::any_dim> {
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& self, int64_t dim, bool keepdim) {
    const auto sizes = plan_small_any(self, dim, keepdim);
    if (!sizes.has_value()) return std::nullopt;
    return write_new_result(device, at::_ops::any_dim::name, *sizes, at::kBool,
                            [&](const at::Tensor& out) { run_small_any(self, out); });
  }
};

template <>
struct AtOnce<at::_ops::max> {
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& self) {
    if (!small_max_takes(self)) return std::nullopt;
    return write_new_result(device, at::_ops::max::name, {}, self.scalar_type(),
                            [&](const at::Tensor& out) { run_small_max(self, out); });
  }
};

template <>
struct AtOnce<at::_ops::eq_Scalar> {
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& self, const c10::Scalar& other) {
    if (!small_eq_takes(self, other)) return std::nullopt;
    return write_new_result(device, at::_ops::eq_Scalar::name, self.sizes(), at::kBool,
                            [&](const at::Tensor& out) { run_small_eq(self, other, out); });
  }
};

template <>
struct AtOnce<at::_ops::cat> {
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::ITensorListRef& tensors, int64_t dim) {
    const auto plan = plan_dense_cat(tensors, dim);
    if (!plan.has_value()) return std::nullopt;
    return write_new_result(device, at::_ops::cat::name, plan->sizes, tensors.front().scalar_type(),
                            [&](const at::Tensor& out) { run_dense_cat(*plan, tensors, out); });
  }
};

template <>
struct AtOnce<at::_ops::index_select> {
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& self, int64_t dim,
                                       const at::Tensor& index) {
    const auto plan = plan_dense_index_select(self, dim, index);
    if (!plan.has_value()) return std::nullopt;
    return write_new_result(device, at::_ops::index_select::name, plan->sizes, self.scalar_type(),
                            [&](const at::Tensor& out) { run_dense_index_select(*plan, self, index, out); });
  }
};

template <>
struct AtOnce<at::_ops::addmm> {
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& bias, const at::Tensor& mat1,
                                       const at::Tensor& mat2, const c10::Scalar& beta, const c10::Scalar& alpha) {
    const auto plan = plan_blas_matmul(&bias, mat1, mat2, beta, alpha);
    if (!plan.has_value()) return std::nullopt;
    return write_new_result(device, at::_ops::addmm::name, plan->sizes, plan->dtype,
                            [&](const at::Tensor& out) { run_blas_matmul(*plan, &bias, mat1, mat2, out); });
  }
};

template <>
struct AtOnce<at::_ops::mm> {
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& mat1, const at::Tensor& mat2) {
    const auto plan = plan_blas_matmul(nullptr, mat1, mat2, 0, 1);
    if (!plan.has_value()) return std::nullopt;
    return write_new_result(device, at::_ops::mm::name, plan->sizes, plan->dtype,
                            [&](const at::Tensor& out) { run_blas_matmul(*plan, nullptr, mat1, mat2, out); });
  }
};

// ---- clone and same-device _to_copy of dense tensors: one block, copied or converted ----------

// A decoding step clones its last logits and ids and copies the logits to float32, their
// own dtype. With the memory format preserved, both make empty_strided(self's sizes and
// strides) for a non-overlapping, dense self and copy it; with the contiguous format, a
// row-major result, whose bytes are self's in the same order when self is row-major save its
// size-1 dims (generate()'s last token, [1, 1] with strides (length, 1)). Either way the
// result's bytes are self's, in one block (or its elements in the same order, converted to a
// new dtype movement/convert.h takes). Other calls (another dtype, device or format, conjugate or
// negative bits, strided or empty tensors, ops recorded rather than run at once) take torch's
// own kernels. Returns the result's strides when it is such a copy.
std::optional<c10::SmallVector<int64_t, 6>> one_block_copy_strides(const at::Tensor& self,
                                                                   std::optional<c10::MemoryFormat> format) {
  if (!bytes_are_values(self) || self.numel() == 0 || self.numel() > at::internal::GRAIN_SIZE) return std::nullopt;
  const auto f = format.value_or(c10::MemoryFormat::Preserve);
  if (f == c10::MemoryFormat::Preserve && self.is_non_overlapping_and_dense()) {
    return c10::SmallVector<int64_t, 6>(self.strides().begin(), self.strides().end());
  }
  if (f == c10::MemoryFormat::Contiguous && dense_row_major(self)) return row_major_strides(self.sizes());
  return std::nullopt;
}

// The copy as an op run at once (these kernels ready their tensor themselves, after their plan
// took the call: the unboxed path does not wrap clone and _to_copy): self's bytes in one block, or, to another dtype, its
// elements in the same order converted one by one (movement/convert.h; a Llama step's int64
// position to float32).
std::optional<at::Tensor> block_copy_at_once(const at::Tensor& self, c10::IntArrayRef strides, const char* name,
                                             at::ScalarType dtype) {
  const at::Tensor* inputs[] = {&self};
  if (!interceptor().begin_unboxed_op(inputs, name)) return std::nullopt;
  UnboxedOpScope scope;
  interceptor().check_readable(self);
  return write_new_result(self.device().index(), name, self.sizes(), strides, dtype, [&](const at::Tensor& out) {
    if (dtype != self.scalar_type()) return run_small_convert(self, out);
    std::memcpy(out.mutable_data_ptr(), self.const_data_ptr(), static_cast<size_t>(self.numel()) * self.element_size());
  });
}

template <>
struct AtOnce<at::_ops::clone> {
  static std::optional<at::Tensor> run(c10::DeviceIndex /*device*/, const at::Tensor& self,
                                       std::optional<c10::MemoryFormat> format) {
    const auto strides = one_block_copy_strides(self, format);
    if (!strides.has_value()) return std::nullopt;
    return block_copy_at_once(self, *strides, at::_ops::clone::name, self.scalar_type());
  }
};

template <>
struct AtOnce<at::_ops::_to_copy> {
  static std::optional<at::Tensor> run(c10::DeviceIndex /*device*/, const at::Tensor& self,
                                       std::optional<at::ScalarType> dtype, std::optional<c10::Layout> layout,
                                       std::optional<c10::Device> to_device, std::optional<bool> pin_memory,
                                       bool /*non_blocking*/, std::optional<c10::MemoryFormat> format) {
    const bool same_place = (!layout.has_value() || *layout == c10::kStrided) &&
                            (!to_device.has_value() || *to_device == self.device()) && !pin_memory.value_or(false);
    const bool same_dtype = !dtype.has_value() || *dtype == self.scalar_type();
    if (!same_place || !(same_dtype || small_convert_takes(self, *dtype))) return std::nullopt;
    const auto strides = one_block_copy_strides(self, format);
    if (!strides.has_value()) return std::nullopt;
    return block_copy_at_once(self, *strides, at::_ops::_to_copy::name, dtype.value_or(self.scalar_type()));
  }
};

// ---- empty-result kernels: small add, sub and mul recorded -------------------------------

// A structured op's functional form that is recorded sizes its result with the op's meta
// function (a TensorIterator) before recording its out= form. Small add, sub and mul size it
// with elementwise/arith.h's plan instead: the same empty result, without the TensorIterator.
// Only for operands of one core (a CPU number aside): mixed devices get torch's wrapper and
// its error.
std::optional<at::Tensor> empty_small_arith_result(const at::Tensor& self, const at::Tensor& other,
                                                   const c10::Scalar& alpha = 1) {
  const at::Tensor& on_device = self.device().type() == kNeuron ? self : other;
  for (const at::Tensor* t : {&self, &other}) {
    const bool cpu_number = t->device().type() == c10::kCPU && t->dim() == 0;
    if (!cpu_number && t->device() != on_device.device()) return std::nullopt;
  }
  if (on_device.device().type() != kNeuron) return std::nullopt;
  const auto plan = plan_small_arith(self, other, alpha);
  if (!plan.has_value()) return std::nullopt;
  return at::empty_strided(plan->sizes, plan->strides, on_device.options().dtype(plan->dtype));
}

// ---- boxed kernels: the fallback and replay --------------------------------------------

// ---- add, sub and mul of small operands (arith.h) ------------------------------------

// add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out), sub.out (the same) and
// mul.out(Tensor self, Tensor other, *, Tensor(a!) out): the out= twins a recorded graph runs.
// The out may be the memory of an operand as big as the result (replay places a result over
// an input that dies with the op).
template <Arith op>
bool try_small_arith(const c10::IValue* args, const c10::IValue* out_arg, torch::jit::Stack* stack, size_t n) {
  const bool has_alpha = op != Arith::Mul;
  if (!args[0].isTensor() || !args[1].isTensor() || (has_alpha && !args[2].isScalar())) return false;
  const at::Tensor& self = args[0].toTensor();
  const at::Tensor& other = args[1].toTensor();
  if (self.device().type() != c10::kCPU || other.device().type() != c10::kCPU) return false;
  const auto plan = plan_small_arith(self, other, has_alpha ? args[2].toScalar() : c10::Scalar(1));
  if (!plan.has_value()) return false;
  const at::Tensor* same_as = nullptr;
  if (out_arg != nullptr && out_arg->isTensor()) {
    for (const at::Tensor* operand : {&self, &other}) {
      if (operand->const_data_ptr() == out_arg->toTensor().const_data_ptr()) same_as = operand;
    }
  }
  auto result = result_tensor(out_arg, plan->sizes, plan->dtype, {&self, &other}, same_as, plan->strides);
  if (!result.has_value()) return false;
  run_small_arith(op, *plan, self, other, *result);
  return finish(stack, n, std::move(*result));
}

// ---- the list ------------------------------------------------------------------------------

// An op's at-once kernel, adapted to the op's exact signature.
template <class Op, class Kernel = AtOnce<Op>, class Schema = typename Op::schema>
struct AtOnceAdapter;
template <class Op, class Kernel, class R, class... A>
struct AtOnceAdapter<Op, Kernel, R(A...)> {
  static typename AtOnceSignature<R(A...)>::Result run(c10::DeviceIndex device, A... args) {
    return Kernel::run(device, args...);
  }
};
template <class Op>
void at_once(const HostKernelInfo& info) {
  register_at_once_kernel<Op>(&AtOnceAdapter<Op>::run, info);
}

template <class Op, class Schema = typename Op::schema>
struct EmptySmallArith;
template <class Op, class R, class... A>
struct EmptySmallArith<Op, R(A...)> {
  static std::optional<at::Tensor> run(A... args) { return empty_small_arith_result(args...); }
};
template <class Op>
void empty_result(const HostKernelInfo& info) {
  register_empty_result_kernel<Op>(&EmptySmallArith<Op>::run, info);
}

void boxed(const char* op, const char* overload, size_t n_args, bool out_variant, BoxedHostKernel kernel,
           const HostKernelInfo& info) {
  register_boxed_host_kernel(op, overload, n_args, out_variant, kernel, info);
}

// name, family, the ATen kernel whose bits it gives (KERNELS.md says more of each)
constexpr HostKernelInfo kSmallArith{"small_arith", "elementwise",
                                     "BinaryOpsKernel.cpp add/sub/mul kernels (one IEEE operation per element)"};
constexpr HostKernelInfo kSmallUnary{"small_unary", "elementwise",
                                     "UnaryOpsKernel.cpp neg/rsqrt, PowKernel.cpp pow by 2, 3, -1, -0.5"};
constexpr HostKernelInfo kSmallBitwise{"small_bitwise", "elementwise",
                                       "BinaryOpsKernel.cpp bitwise_and/or, UnaryOpsKernel.cpp bitwise_not"};
constexpr HostKernelInfo kSmallWhere{"small_where", "elementwise", "TensorCompareKernel.cpp where_kernel"};
constexpr HostKernelInfo kSmallSum{"small_sum", "reductions",
                                   "SumKernel.cpp cascade_sum (mean: ReduceOps.cpp sum, then div_)"};
constexpr HostKernelInfo kSmallArgmax{"small_argmax", "reductions", "ReduceOpsKernel.cpp argmax_kernel_impl"};
constexpr HostKernelInfo kSmallAny{"small_any", "reductions", "ReduceOpsKernel.cpp or_kernel_impl"};
constexpr HostKernelInfo kSmallMax{"small_max", "reductions", "ReduceAllOpsKernel.cpp max_all_kernel_impl"};
constexpr HostKernelInfo kSmallEq{"small_eq", "reductions", "BinaryOpsKernel.cpp eq_kernel"};
constexpr HostKernelInfo kSmallIsin{"small_isin", "reductions", "TensorCompare.cpp isin_default_kernel_cpu"};
constexpr HostKernelInfo kDenseCat{"dense_cat", "movement", "TensorShape.cpp cat_out_cpu"};
constexpr HostKernelInfo kDenseIndexSelect{"dense_index_select", "movement",
                                           "TensorAdvancedIndexing.cpp index_select_out_cpu_"};
constexpr HostKernelInfo kBlockCopy{"block_copy", "movement",
                                    "clone / _to_copy: empty_strided, then Copy.cpp copy_ (c10::convert)"};
constexpr HostKernelInfo kSmallFill{"small_fill", "movement", "FillKernel.cpp fill_kernel"};
constexpr HostKernelInfo kSmallArange{"small_arange", "movement", "RangeFactories.cpp arange_out"};
constexpr HostKernelInfo kBlasMatmul{"blas_matmul", "matmul",
                                     "LinearAlgebra.cpp addmm_impl_cpu_, CPUBlas.cpp gemm"};

void register_every_kernel() {
  namespace ops = at::_ops;
  // elementwise
  at_once<ops::add_Tensor>(kSmallArith);
  at_once<ops::sub_Tensor>(kSmallArith);
  at_once<ops::mul_Tensor>(kSmallArith);
  empty_result<ops::add_Tensor>(kSmallArith);
  empty_result<ops::sub_Tensor>(kSmallArith);
  empty_result<ops::mul_Tensor>(kSmallArith);
  boxed("aten::add", "out", 4, true, &try_small_arith<Arith::Add>, kSmallArith);
  boxed("aten::sub", "out", 4, true, &try_small_arith<Arith::Sub>, kSmallArith);
  boxed("aten::mul", "out", 3, true, &try_small_arith<Arith::Mul>, kSmallArith);
  at_once<ops::neg>(kSmallUnary);
  at_once<ops::rsqrt>(kSmallUnary);
  at_once<ops::pow_Tensor_Scalar>(kSmallUnary);
  at_once<ops::bitwise_and_Tensor>(kSmallBitwise);
  at_once<ops::bitwise_or_Tensor>(kSmallBitwise);
  at_once<ops::bitwise_not>(kSmallBitwise);
  at_once<ops::where_self>(kSmallWhere);
  // reductions
  at_once<ops::sum_dim_IntList>(kSmallSum);
  at_once<ops::mean_dim>(kSmallSum);
  at_once<ops::argmax>(kSmallArgmax);
  at_once<ops::any_dim>(kSmallAny);
  at_once<ops::max>(kSmallMax);
  at_once<ops::eq_Scalar>(kSmallEq);
  at_once<ops::isin_Tensor_Tensor>(kSmallIsin);
  // movement
  at_once<ops::cat>(kDenseCat);
  at_once<ops::index_select>(kDenseIndexSelect);
  at_once<ops::clone>(kBlockCopy);
  at_once<ops::_to_copy>(kBlockCopy);
  at_once<ops::fill__Scalar>(kSmallFill);
  at_once<ops::arange_start_out>(kSmallArange);
  // matmul
  at_once<ops::addmm>(kBlasMatmul);
  at_once<ops::mm>(kBlasMatmul);
}

[[maybe_unused]] const bool kRegistered = (register_every_kernel(), true);

}  // namespace
}  // namespace neuron::fastpath
