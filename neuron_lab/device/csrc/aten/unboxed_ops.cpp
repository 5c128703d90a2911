// The unboxed path: the hottest ops run now without the boxed fallback's stack.
//
// The boxed fallback (fallback.cpp) serves every op, but it pays for its generality on
// each call: the dispatcher copies the arguments into a stack of IValues, and since
// torch 2.11 a C++ copy of a tensor that only Python holds takes the GIL to keep its
// Python object alive (and again when the stack is dropped), while the op's Python
// binding has released it. For a small op in a decoding loop that costs as much as the
// CPU kernel itself.
//
// The ops below get a kernel of their own signature. When the runtime above would run
// the op at once anyway (blocking mode, or adaptive eager while nothing repeats:
// interceptor().begin_unboxed_op), the kernel gives the CPU kernel host aliases of
// its arguments straight from the caller's references, and maps the results back as
// the fallback does. Otherwise, or when an argument is not a neuron tensor of one
// device, it boxes the call and hands it to the fallback, which may record it: the
// same results either way, since both run the same CPU kernel on the same memory. Where the
// table of fast host kernels (host_kernel_table.h) holds one for the op that takes the call,
// it runs in place of the CPU kernel, with the CPU kernel's bits.
#include "registrations.h"
#include "host_kernel_table.h"
#include "device/csrc/runtime/interceptor.h"
#include "device/csrc/runtime/runtime.h"

#include <ATen/EmptyTensor.h>
#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE
#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/core/boxing/impl/boxing.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_log_softmax_backward_data_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/_log_softmax_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/_softmax_backward_data_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/_softmax_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/_to_copy_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/add_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/addmm_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/all_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/any_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/argmax_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/baddbmm_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/bitwise_and_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/bitwise_not_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/bitwise_or_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/bmm_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/cat_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/clone_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/cos_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/div_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/eq_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/exp_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/gelu_backward_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/gelu_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/isin_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/isneginf_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/mean_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/mm_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/mul_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/neg_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/nll_loss_backward_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/nll_loss_forward_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/pow_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/rsqrt_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/sigmoid_backward_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/sigmoid_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/silu_backward_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/silu_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/sin_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/sub_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/sum_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/tanh_backward_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/threshold_backward_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/tanh_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/tril_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/_foreach_add_ops.h>
#include <ATen/ops/_foreach_sub_ops.h>
#include <ATen/ops/_foreach_mul_ops.h>
#include <ATen/ops/_foreach_div_ops.h>
#include <ATen/ops/_foreach_addcmul_ops.h>
#include <ATen/ops/_foreach_addcdiv_ops.h>
#include <ATen/ops/_foreach_lerp_ops.h>
#include <ATen/ops/_foreach_sqrt_ops.h>
#include <ATen/ops/_foreach_neg_ops.h>
#include <ATen/ops/_foreach_maximum_ops.h>
#include <ATen/ops/_foreach_zero_ops.h>
#include <ATen/ops/_foreach_copy_ops.h>
#include <ATen/ops/_foreach_norm_ops.h>
#include <ATen/ops/_log_softmax_backward_data_ops.h>
#include <ATen/ops/_log_softmax_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_ops.h>
#include <ATen/ops/_softmax_backward_data_ops.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/_to_copy_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/all_ops.h>
#include <ATen/ops/any_ops.h>
#include <ATen/ops/arange_ops.h>
#include <ATen/ops/argmax_ops.h>
#include <ATen/ops/baddbmm_ops.h>
#include <ATen/ops/bitwise_and_ops.h>
#include <ATen/ops/bitwise_not_ops.h>
#include <ATen/ops/bitwise_or_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/cat_ops.h>
#include <ATen/ops/clone_ops.h>
#include <ATen/ops/cos_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/embedding_dense_backward_ops.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/eq_ops.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/fill_ops.h>
#include <ATen/ops/gelu_backward_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/index_select_ops.h>
#include <ATen/ops/isin_ops.h>
#include <ATen/ops/isneginf_ops.h>
#include <ATen/ops/max_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/min_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/native_layer_norm_backward_ops.h>
#include <ATen/ops/native_layer_norm_ops.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/nll_loss_backward_ops.h>
#include <ATen/ops/nll_loss_forward_ops.h>
#include <ATen/ops/pow_ops.h>
#include <ATen/ops/rsqrt_ops.h>
#include <ATen/ops/sigmoid_backward_ops.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/silu_backward_ops.h>
#include <ATen/ops/silu_ops.h>
#include <ATen/ops/sin_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/tanh_backward_ops.h>
#include <ATen/ops/tanh_ops.h>
#include <ATen/ops/threshold_backward_ops.h>
#include <ATen/ops/tril_ops.h>
#include <ATen/ops/where_ops.h>
#include <ATen/ops/zero_ops.h>
// Pointwise math, comparisons, clamps, reductions and activations user models call (the
// class of structured ops below, from the unboxed path's second list).
#include <ATen/ops/addcdiv_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/addcdiv_ops.h>
#include <ATen/ops/addcmul_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/addcmul_ops.h>
#include <ATen/ops/amax_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/amax_ops.h>
#include <ATen/ops/amin_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/amin_ops.h>
#include <ATen/ops/atan2_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/atan2_ops.h>
#include <ATen/ops/ceil_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/ceil_ops.h>
#include <ATen/ops/clamp_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/clamp_ops.h>
#include <ATen/ops/clamp_min_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/clamp_min_ops.h>
#include <ATen/ops/cumsum_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/cumsum_ops.h>
#include <ATen/ops/elu_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/elu_ops.h>
#include <ATen/ops/erf_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/erf_ops.h>
#include <ATen/ops/exp2_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/exp2_ops.h>
#include <ATen/ops/expm1_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/expm1_ops.h>
#include <ATen/ops/floor_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/floor_ops.h>
#include <ATen/ops/gather_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/gather_ops.h>
#include <ATen/ops/ge_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/ge_ops.h>
#include <ATen/ops/gt_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/gt_ops.h>
#include <ATen/ops/hardsigmoid_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/hardsigmoid_ops.h>
#include <ATen/ops/le_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/le_ops.h>
#include <ATen/ops/leaky_relu_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/leaky_relu_ops.h>
#include <ATen/ops/lerp_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/lerp_ops.h>
#include <ATen/ops/log_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/log_ops.h>
#include <ATen/ops/log1p_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/log1p_ops.h>
#include <ATen/ops/log2_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/log2_ops.h>
#include <ATen/ops/lt_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/lt_ops.h>
#include <ATen/ops/maximum_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/maximum_ops.h>
#include <ATen/ops/minimum_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/minimum_ops.h>
#include <ATen/ops/mish_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/mish_ops.h>
#include <ATen/ops/ne_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/ne_ops.h>
#include <ATen/ops/reciprocal_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/reciprocal_ops.h>
#include <ATen/ops/remainder_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/remainder_ops.h>
#include <ATen/ops/round_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/round_ops.h>
#include <ATen/ops/sign_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/sign_ops.h>
#include <ATen/ops/softplus_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/softplus_ops.h>
#include <ATen/ops/sqrt_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/sqrt_ops.h>
#include <ATen/ops/triu_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/triu_ops.h>
#include <ATen/ops/trunc_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/trunc_ops.h>
// Routing, sorting and masking ops of mixture-of-experts and user models (scatter, topk,
// sort, max over a dim) and abs's backward (sgn): on the boxed path they cost 1.2-2.1x the
// CPU's time on small tensors (benchmarks/bench_ops.py).
#include <ATen/ops/max_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/scatter_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/scatter_ops.h>
#include <ATen/ops/sgn_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/sgn_ops.h>
#include <ATen/ops/sort_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/sort_ops.h>
#include <ATen/ops/topk_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/topk_ops.h>
// Indexing (x[idx], x[idx] = v, index_add_), flips, pooling, norms, group norm, variance,
// nearest upsampling and an MSE loss's backward: on the boxed path 1.2-2x the CPU's time on
// small tensors (bench_ops.py). A mixture of experts' grouped matmul (_grouped_mm, whose
// composite kernel on the device read its offsets back to the host, a wait, then ran a matmul
// per group) runs whole, as on the CPU, and its routing's floor division leaves the boxed path. In-place forms of structured ops an optimizer without foreach
// kernels calls (sub_, div_, addcmul_, lerp_, sqrt_ ...) run their CPU kernel in one pass, not
// torch's wrapper's meta function, then the out= kernel.
#include <ATen/ops/_grouped_mm_ops.h>
#include <ATen/ops/_index_put_impl_ops.h>
#include <ATen/ops/floor_divide_ops.h>
#include <ATen/ops/flip_ops.h>
#include <ATen/ops/index_add_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/index_add_ops.h>
#include <ATen/ops/index_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/index_ops.h>
#include <ATen/ops/linalg_vector_norm_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/linalg_vector_norm_ops.h>
#include <ATen/ops/max_pool2d_with_indices_backward_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/max_pool2d_with_indices_backward_ops.h>
#include <ATen/ops/max_pool2d_with_indices_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/max_pool2d_with_indices_ops.h>
#include <ATen/ops/mse_loss_backward_ops.h>
#include <ATen/ops/mse_loss_ops.h>
#include <ATen/ops/native_group_norm_backward_ops.h>
#include <ATen/ops/native_group_norm_ops.h>
#include <ATen/ops/upsample_nearest2d_backward_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/upsample_nearest2d_backward_ops.h>
#include <ATen/ops/upsample_nearest2d_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/upsample_nearest2d_ops.h>
#include <ATen/ops/var_ops.h>
#include <ATen/ops/abs_ops.h>
#include <ATen/ops/convolution_backward_ops.h>
#include <ATen/ops/convolution_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward_ops.h>
#include <ATen/ops/isnan_ops.h>
#include <ATen/ops/logical_not_ops.h>
#include <ATen/ops/masked_fill_ops.h>
#include <ATen/ops/nan_to_num_ops.h>
#include <ATen/ops/relu_ops.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace neuron {
namespace {

// ---- one call's tensors ----------------------------------------------------------

// Which arguments an op writes, by its schema, one bit an argument (bit i: argument i): a
// tensor list's tensors are all written (an in-place foreach op's self) or all read. (A
// tensor argument says it by its type too.)
template <class Op>
uint64_t written_arguments() {
  static const uint64_t written = [] {
    const auto& op = c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
    const auto& arguments = op.schema().arguments();
    TORCH_INTERNAL_ASSERT(arguments.size() <= 64, "neuron: ", Op::name, " has more than 64 arguments");
    uint64_t w = 0;
    for (size_t i = 0; i < arguments.size(); ++i) {
      if (arguments[i].alias_info() != nullptr && arguments[i].alias_info()->isWrite()) w |= uint64_t{1} << i;
    }
    return w;
  }();
  return written;
}

// The neuron tensors of one call, found before anything is made: whether the call can
// take the unboxed path, and what the runtime must make ready for it. In argument order,
// as HostCall aliases them.
struct CallTensors {
  c10::SmallVector<const at::Tensor*, 8> all;
  c10::SmallVector<bool, 8> writes;  // per entry of `all`: whether the op writes it
  c10::DeviceIndex device = -1;
  bool unboxable = true;  // every tensor a neuron tensor of one device

  void add(const at::Tensor& t, bool is_written) {
    if (!t.defined()) return;
    // A CPU scalar (`x + 1` wraps its 1 as one) goes to the CPU kernel as it is.
    if (!is_written && t.device().type() == c10::DeviceType::CPU && t.dim() == 0) return;
    if (t.device().type() != kNeuron || (device >= 0 && t.device().index() != device)) {
      unboxable = false;  // the fallback says what is wrong, or takes the CPU scalar
      return;
    }
    device = t.device().index();
    all.push_back(&t);
    writes.push_back(is_written);
  }
};

// `written`: whether the schema marks the argument written (lists, optional tensors and a
// few const references say it only there; a non-const reference is an out= or in-place one).
template <class T>
void collect(CallTensors&, const T&, bool /*written*/) {}
void collect(CallTensors& c, const at::Tensor& t, bool written) { c.add(t, written); }
void collect(CallTensors& c, at::Tensor& t, bool) { c.add(t, true); }
void collect(CallTensors& c, const std::optional<at::Tensor>& t, bool written) {
  if (t.has_value()) c.add(*t, written);
}
void collect(CallTensors& c, const at::ITensorListRef& list, bool) {
  for (const at::Tensor& t : list) c.add(t, false);
}
void collect(CallTensors& c, at::TensorList list, bool written) {
  for (const at::Tensor& t : list) c.add(t, written);
}

// An index op's indices (x[rows, :, cols]): None or a tensor per indexed dim. Each tensor is
// read in place, in the list's own IValue, which outlives the call (as the caller's tensors do).
using OptionalTensorList = c10::List<std::optional<at::Tensor>>;
template <class Visit>
void for_each_index_tensor(const OptionalTensorList& list, Visit&& visit) {
  for (auto it = list.begin(); it != list.end(); ++it) {
    const c10::IValue& element = (*it).get();
    if (element.isTensor()) visit(element.toTensor());
  }
}
void collect(CallTensors& c, const OptionalTensorList& list, bool written) {
  for_each_index_tensor(list, [&](const at::Tensor& t) { c.add(t, written); });
}

// How many tensors an argument holds, at most: a foreach op's lists are reserved for at once.
template <class T>
size_t tensor_count(const T&) {
  return 0;
}
size_t tensor_count(const at::ITensorListRef& list) { return list.size(); }
size_t tensor_count(at::TensorList list) { return list.size(); }
size_t tensor_count(const OptionalTensorList& list) { return list.size(); }

// A dense tensor's storage, read without TensorImpl::storage()'s call and check (the
// tensors here are the caller's neuron tensors and their host aliases: all have one).
inline const c10::Storage& storage_of(const at::Tensor& t) { return t.unsafeGetTensorImpl()->unsafe_storage(); }

// The host aliases of one call, one host storage per neuron storage (CPU kernels then
// see the aliasing, as in x.add_(x)), and the way back from the kernel's results.
class HostCall {
 public:
  explicit HostCall(const CallTensors& tensors) : tensors_(tensors), results_(tensors.device) {
    aliases_.reserve(tensors.all.size());
    if (tensors.all.size() > kScanned) index_storages();
  }

  // The CPU generator a random op draws from: the neuron generator's (the core's default
  // one where the caller passed none), as the fallback maps it; a CPU generator stays. It
  // draws as many numbers as the op's largest tensor has elements.
  std::optional<at::Generator> generator(const std::optional<at::Generator>& given) const {
    const at::Generator& g = given.has_value() && given->defined() ? *given : default_generator(tensors_.device);
    if (g.device().type() != kNeuron) return g;
    int64_t span = 1;
    for (const at::Tensor* t : tensors_.all) span = std::max<int64_t>(span, t->numel());
    return generator_for_draw(g, span);
  }

  at::Tensor alias(const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kNeuron) return t;  // a CPU scalar
    if (const Alias* shared = alias_of_storage(storage_of(t).unsafeGetStorageImpl())) {
      return remember(t, host_alias_sharing(t, shared->host.storage()));
    }
    return remember(t, cached_host_alias(t, inference_mode_));
  }

  // The caller's tensor behind a host alias the kernel returned, if it is one.
  const at::Tensor* original_of(const at::Tensor& host) const {
    for (const auto& a : aliases_) {
      if (a.host.unsafeGetTensorImpl() == host.unsafeGetTensorImpl()) return a.original;
    }
    return nullptr;
  }

  // A result of the kernel as a neuron tensor: an argument, a view of one, or new memory
  // (adopted when the kernel allocated it in device memory, else copied).
  at::Tensor wrap(at::Tensor&& host) {
    if (!host.defined() || host.device().type() == kNeuron) return std::move(host);
    if (const at::Tensor* original = original_of(host)) return *original;
    if (const void* data = storage_of(host).data(); data != nullptr && !host.is_conj() && !host.is_neg()) {
      for (const auto& a : aliases_) {
        if (storage_of(a.host).data() == data) return neuron_view_of(*a.original, host);
      }
    }
    return results_.adopt(std::move(host));
  }

  // out= and in-place arguments: a resize or restride of their alias reaches them. The
  // aliases were made in the order of `tensors` (both in argument order).
  void write_back_all(const CallTensors& tensors) const {
    TORCH_INTERNAL_ASSERT(aliases_.size() == tensors.all.size());
    for (size_t i = 0; i < aliases_.size(); ++i) {
      if (tensors.writes[i]) write_back(*aliases_[i].original, aliases_[i].host);
    }
  }

 private:
  struct Alias {
    const at::Tensor* original;  // the caller's, alive for the whole call
    at::Tensor host;
  };
  // A call has a few tensors, found by a scan; a foreach op's lists have hundreds: past
  // kScanned, each tensor's first tensor of the same storage is found up front, by sorting.
  static constexpr size_t kScanned = 16;
  void index_storages() {
    const auto& all = tensors_.all;
    std::vector<std::pair<const c10::StorageImpl*, uint32_t>> order(all.size());
    for (size_t i = 0; i < all.size(); ++i) order[i] = {storage_of(*all[i]).unsafeGetStorageImpl(), i};
    std::sort(order.begin(), order.end());
    first_of_.resize(all.size());
    for (size_t i = 0; i < order.size(); ++i) {
      const bool starts_group = i == 0 || order[i].first != order[i - 1].first;
      first_of_[order[i].second] = starts_group ? order[i].second : first_of_[order[i - 1].second];
    }
  }
  // The alias of an earlier tensor over the same storage, if any. Aliases are made in the
  // order of tensors_.all (both in argument order): the next one made is for all[aliases_.size()].
  const Alias* alias_of_storage(const c10::StorageImpl* storage) const {
    if (!first_of_.empty()) {
      const size_t first = first_of_[aliases_.size()];
      return first < aliases_.size() ? &aliases_[first] : nullptr;
    }
    for (const auto& a : aliases_) {
      if (storage_of(*a.original).unsafeGetStorageImpl() == storage) return &a;
    }
    return nullptr;
  }
  at::Tensor remember(const at::Tensor& original, at::Tensor host) {
    aliases_.push_back({&original, host});
    return host;
  }
  const CallTensors& tensors_;  // the call's, alive for the whole call
  const bool inference_mode_ = c10::InferenceMode::is_enabled();  // read once a call
  c10::SmallVector<Alias, 8> aliases_;
  std::vector<uint32_t> first_of_;  // past kScanned tensors: each one's first tensor of its storage
  HostResults results_;
};

// ---- arguments: the caller's, as the CPU kernel takes them ---------------------------

// Anything but a tensor passes as it is.
template <class A>
struct HostArg {
  HostArg(HostCall&, A value) : value(value) {}
  A get() { return value; }
  A value;
};
template <>
struct HostArg<const at::Tensor&> {
  HostArg(HostCall& call, const at::Tensor& t) : host(call.alias(t)) {}
  const at::Tensor& get() { return host; }
  at::Tensor host;
};
template <>
struct HostArg<at::Tensor&> {
  HostArg(HostCall& call, at::Tensor& t) : host(call.alias(t)) {}
  at::Tensor& get() { return host; }
  at::Tensor host;
};
template <>
struct HostArg<const std::optional<at::Tensor>&> {
  HostArg(HostCall& call, const std::optional<at::Tensor>& t) {
    if (t.has_value()) host = call.alias(*t);
  }
  const std::optional<at::Tensor>& get() { return host; }
  std::optional<at::Tensor> host;
};
template <>
struct HostArg<const at::ITensorListRef&> {
  HostArg(HostCall& call, const at::ITensorListRef& list) {
    hosts.reserve(list.size());
    for (const at::Tensor& t : list) hosts.push_back(call.alias(t));
  }
  at::ITensorListRef get() { return at::ITensorListRef(at::ArrayRef<at::Tensor>(hosts)); }
  std::vector<at::Tensor> hosts;
};
template <>
struct HostArg<at::TensorList> {  // a foreach op's list
  HostArg(HostCall& call, at::TensorList list) {
    hosts.reserve(list.size());
    for (const at::Tensor& t : list) hosts.push_back(call.alias(t));
  }
  at::TensorList get() { return hosts; }
  std::vector<at::Tensor> hosts;
};

template <>
struct HostArg<const OptionalTensorList&> {  // an index op's indices, None where a dim is not indexed
  HostArg(HostCall& call, const OptionalTensorList& list) {
    hosts.reserve(list.size());
    for (auto it = list.begin(); it != list.end(); ++it) {
      const c10::IValue& element = (*it).get();
      hosts.push_back(element.isTensor() ? std::optional<at::Tensor>(call.alias(element.toTensor())) : std::nullopt);
    }
  }
  const OptionalTensorList& get() { return hosts; }
  OptionalTensorList hosts;
};

template <>
struct HostArg<std::optional<at::Generator>> {  // a random op's
  HostArg(HostCall& call, const std::optional<at::Generator>& given) : generator(call.generator(given)) {}
  std::optional<at::Generator> get() { return generator; }
  std::optional<at::Generator> generator;
};

// Whether an op draws random numbers (takes a generator).
template <class... A>
constexpr bool kDraws = (std::is_same_v<std::decay_t<A>, std::optional<at::Generator>> || ...);

// ---- results: the kernel's, as neuron tensors ------------------------------------------

template <class R>
struct Results;
template <>
struct Results<at::Tensor&> {  // out= and in-place ops return an argument
  static constexpr bool fresh = false;
  static at::Tensor& wrap(HostCall& call, at::Tensor& host) {
    const at::Tensor* original = call.original_of(host);
    TORCH_INTERNAL_ASSERT(original != nullptr, "neuron: an out= kernel returned a tensor that is not its argument");
    return const_cast<at::Tensor&>(*original);  // the caller passed it as a non-const reference
  }
};
template <>
struct Results<at::Tensor> {
  static constexpr bool fresh = true;
  // The kernel's own result, moved in: held only here, it can become the neuron tensor.
  static at::Tensor wrap(HostCall& call, at::Tensor&& host) { return call.wrap(std::move(host)); }
};
template <>
struct Results<std::vector<at::Tensor>> {  // an out-of-place foreach op's
  static constexpr bool fresh = true;
  static std::vector<at::Tensor> wrap(HostCall& call, std::vector<at::Tensor>&& host) {
    for (at::Tensor& t : host) t = call.wrap(std::move(t));
    return std::move(host);
  }
};
template <>
struct Results<void> {  // an in-place foreach op writes its arguments only
  static constexpr bool fresh = false;
};
template <class... T>
struct Results<std::tuple<T...>> {
  static constexpr bool fresh = (Results<T>::fresh || ...);
  static std::tuple<T...> wrap(HostCall& call, std::tuple<T...>&& host) {
    return std::apply(
        [&](auto&... h) { return std::tuple<T...>(Results<T>::wrap(call, static_cast<T&&>(h))...); }, host);
  }
};

// ---- fast host kernels (host_kernel_table.h) -----------------------------------------------

// Validate mode: ATen's CPU kernel runs on the same inputs after a fast kernel took the call,
// and the results must be the same bits. The inputs it reads are host views of the caller's
// (ready: the fast kernel just read them); what the op writes (fill_'s self, arange's out=)
// ATen writes into a fresh CPU tensor of its layout; a device argument naming a neuron core
// names the CPU.
template <class A>
struct ReferenceArg {
  explicit ReferenceArg(A value) : value(value) {}
  A get() { return value; }
  A value;
};
template <>
struct ReferenceArg<const at::Tensor&> {
  explicit ReferenceArg(const at::Tensor& t) : host(host_view(t)) {}
  const at::Tensor& get() { return host; }
  at::Tensor host;
};
template <>
struct ReferenceArg<at::Tensor&> {
  explicit ReferenceArg(at::Tensor& t)
      : host(at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kCPU))) {}
  at::Tensor& get() { return host; }
  at::Tensor host;
};
template <>
struct ReferenceArg<const std::optional<at::Tensor>&> {
  explicit ReferenceArg(const std::optional<at::Tensor>& t) {
    if (t.has_value()) host = host_view(*t);
  }
  const std::optional<at::Tensor>& get() { return host; }
  std::optional<at::Tensor> host;
};
template <>
struct ReferenceArg<const at::ITensorListRef&> {
  explicit ReferenceArg(const at::ITensorListRef& list) {
    for (const at::Tensor& t : list) hosts.push_back(host_view(t));
  }
  at::ITensorListRef get() { return at::ITensorListRef(at::ArrayRef<at::Tensor>(hosts)); }
  std::vector<at::Tensor> hosts;
};
template <>
struct ReferenceArg<const OptionalTensorList&> {
  explicit ReferenceArg(const OptionalTensorList& list) {
    for (const std::optional<at::Tensor>& t : list.vec()) {
      hosts.push_back(t.has_value() ? std::optional<at::Tensor>(host_view(*t)) : std::nullopt);
    }
  }
  const OptionalTensorList& get() { return hosts; }
  OptionalTensorList hosts;
};
template <>
struct ReferenceArg<std::optional<c10::Device>> {
  explicit ReferenceArg(std::optional<c10::Device> d) : value(d) {
    if (value.has_value() && value->type() == kNeuron) value = c10::Device(c10::kCPU);
  }
  std::optional<c10::Device> get() { return value; }
  std::optional<c10::Device> value;
};

// A kernel's results as host tensors, in order, beside ATen's.
inline void collect_results(std::vector<at::Tensor>& out, const at::Tensor& t) { out.push_back(host_view(t)); }
inline void collect_results(std::vector<at::Tensor>& out, const std::reference_wrapper<at::Tensor>& t) {
  out.push_back(host_view(t.get()));
}
template <class... T>
void collect_results(std::vector<at::Tensor>& out, const std::tuple<T...>& results) {
  std::apply([&](const auto&... r) { (collect_results(out, r), ...); }, results);
}
inline void collect_expected(std::vector<at::Tensor>& out, const at::Tensor& t) { out.push_back(t); }
template <class... T>
void collect_expected(std::vector<at::Tensor>& out, const std::tuple<T...>& results) {
  std::apply([&](const auto&... r) { (collect_expected(out, r), ...); }, results);
}

template <class Op, class Value, class R, class... A>
void validate_at_once(const TypedHostKernel& entry, const Value& result, A&... args) {
  const std::string inputs = describe_inputs(c10::impl::boxArgs<A...>(args...));
  std::tuple<ReferenceArg<A>...> reference{ReferenceArg<A>(args)...};
  std::vector<at::Tensor> got, expected;
  collect_results(got, result);
  {
    auto&& aten = std::apply([](auto&... a) -> R { return Op::redispatch(kCpuKeys, a.get()...); }, reference);
    collect_expected(expected, aten);
  }
  TORCH_INTERNAL_ASSERT(got.size() == expected.size());
  const std::string op = c10::toString(c10::OperatorName(Op::name, Op::overload_name));
  if (!got.empty()) apply_test_perturbation(info_of(entry), got.front());
  for (size_t i = 0; i < got.size(); ++i) check_same_bits(info_of(entry), op, inputs, i, got[i], expected[i]);
}

// Op's at-once kernel from the table, where there is one, the mode lets it run and it takes
// the call (validated in validate mode); nullopt otherwise.
template <class Op, class Schema = typename Op::schema>
struct FastAtOnce;
template <class Op, class R, class... A>
struct FastAtOnce<Op, R(A...)> {
  static typename AtOnceSignature<R(A...)>::Result run(c10::DeviceIndex device, A&... args) {
    const TypedHostKernel* entry = usable_at_once_kernel<Op>();
    if (entry == nullptr) return std::nullopt;
    auto result = at_once_function<Op>(*entry)(device, args...);
    if (result.has_value() && fast_path() == FastPath::Validate) {
      validate_at_once<Op, typename AtOnceSignature<R(A...)>::Result::value_type, R, A...>(*entry, *result, args...);
    }
    return result;
  }
};

// ---- the kernel -------------------------------------------------------------------------

// Where a call goes when the runtime does not run it at once: the boxed fallback, which
// may record it.
template <class Op>
struct ToFallback {
  template <class R, class... A>
  static R call(A&&... args) {
    static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
    static const c10::BoxedKernel fallback = c10::BoxedKernel::makeFromFunction<&neuron_fallback>();
    return c10::impl::BoxedKernelWrapper<R(A...)>::call(fallback, op, kNeuronKeys,
                                                        std::forward<A>(args)...);
  }
};

// Inputs on which an op's CPU kernel would end the process instead of raising: rejected
// with an error before the op is recorded or run. Nothing to check for most ops.
template <class Op>
struct InputCheck {
  template <class... A>
  static void check(const A&...) {}
};

// ATen's CPU flash-attention kernel divides by zero (SIGFPE) on an empty query or key length
// or zero heads; F.scaled_dot_product_attention never sends such shapes to it (its math path
// takes them), but a direct call of the op would.
template <>
struct InputCheck<at::_ops::_scaled_dot_product_flash_attention_for_cpu> {
  template <class... Rest>
  static void check(const at::Tensor& q, const at::Tensor& k, const Rest&...) {
    if (q.dim() != 4 || k.dim() != 4) return;  // the kernel's own check raises
    TORCH_CHECK(q.size(1) > 0 && q.size(2) > 0 && k.size(2) > 0,
                "neuron: _scaled_dot_product_flash_attention_for_cpu got query ", q.sizes(), " and key ", k.sizes(),
                ": an empty query or key length, or no heads, on which ATen's CPU kernel divides by zero and ends "
                "the process. Call torch.nn.functional.scaled_dot_product_attention, which takes these shapes.");
  }
};

// max() and min() of all elements raise for an empty tensor; the out= twins that a recorded
// graph replays (max.unary_out, min.unary_out) do not check, and give the reduction's
// identity (INT64_MIN for max of an int64 tensor): the error is raised at the op, as the
// CPU raises it, before the op can be recorded.
template <class Op>
struct AllElementsInputCheck {
  static void check(const at::Tensor& self) {
    TORCH_CHECK(self.numel() > 0, Op::name + 6,  // the name without "aten::"
                "(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with "
                "the 'dim' argument.");
  }
};
template <>
struct InputCheck<at::_ops::max> : AllElementsInputCheck<at::_ops::max> {};
template <>
struct InputCheck<at::_ops::min> : AllElementsInputCheck<at::_ops::min> {};

// Results a fast host kernel may give (host_kernel_table.h's AtOnceValue): foreach ops have none.
template <class R>
constexpr bool kFastKernelsTake = !std::is_void_v<R> && !std::is_same_v<R, std::vector<at::Tensor>>;

template <class Op, class Otherwise = ToFallback<Op>, class Schema = typename Op::schema>
struct Unboxed;

template <class Op, class Otherwise, class R, class... A>
struct Unboxed<Op, Otherwise, R(A...)> {
  static R call(A... args) {
    InputCheck<Op>::check(args...);
    CallTensors tensors;
    if (const size_t listed = (tensor_count(args) + ... + 0); listed > 0) {
      tensors.all.reserve(listed + sizeof...(A));
      tensors.writes.reserve(listed + sizeof...(A));
    }
    {
      const uint64_t written = written_arguments<Op>();
      size_t i = 0;
      (collect(tensors, args, ((written >> i++) & 1) != 0), ...);
    }
    // A random op draws after the random ops buffered or running before it: the fallback
    // waits for them where there are any.
    const bool must_wait = kDraws<A...> && (interceptor().holds_ops() || !device_quiet());
    if (!tensors.unboxable || tensors.all.empty() || must_wait ||
        !interceptor().begin_unboxed_op(tensors.all, Op::name)) {
      return Otherwise::template call<R, A...>(std::forward<A>(args)...);
    }
    UnboxedOpScope scope;
    for (size_t i = 0; i < tensors.all.size(); ++i) {
      // Inputs must hold computed values; what the op writes is overwritten.
      if (!tensors.writes[i]) interceptor().check_readable(*tensors.all[i]);
    }
    const c10::DeviceIndex device = tensors.device;
    if constexpr (kFastKernelsTake<R>) {
      if (auto result = FastAtOnce<Op>::run(device, args...)) {
        note_written_all(tensors);
        return std::move(*result);
      }
    }
    HostCall call(tensors);
    std::tuple<HostArg<A>...> host_args{HostArg<A>(call, args)...};
    c10::OptionalDeviceGuard guard;  // set only where another core is current
    if (current_device() != device) guard.reset_device(c10::Device(kNeuron, device));
    // Fresh results take device memory while the kernel makes them: adopted, not copied.
    // Only this thread's C++ runs until they are adopted: lent privately, off the shared lock.
    HostAllocationsOnDevice allocations(Results<R>::fresh ? device : c10::DeviceIndex(-1),
                                        HostAllocationsOnDevice::Lending::ThreadPrivate);
    LaunchScope launch(device, Op::name, /*synced=*/true);
    const auto run = [&]() -> R {
      return std::apply([](auto&... a) -> R { return Op::redispatch(kCpuKeys, a.get()...); }, host_args);
    };
    const auto finish = [&] {
      op_counters().fallback_ops += 1;
      op_counters().unboxed_ops += 1;
      call.write_back_all(tensors);
      note_written_all(tensors);
    };
    if constexpr (std::is_void_v<R>) {
      run();
      finish();
    } else {
      auto&& host_result = run();
      finish();
      return Results<R>::wrap(call, std::forward<decltype(host_result)>(host_result));
    }
  }

 private:
  static void note_written_all(const CallTensors& tensors) {
    for (size_t i = 0; i < tensors.all.size(); ++i) {
      if (tensors.writes[i]) interceptor().note_written(*tensors.all[i]);
    }
  }
};

// Registers Op's unboxed kernel; returns the name it registered ("add.out").
template <class Op, class Otherwise = ToFallback<Op>>
std::string register_unboxed(torch::Library& m) {
  const std::string qualified(Op::name);
  std::string name = qualified.substr(qualified.find("::") + 2) + (*Op::overload_name ? "." : "") + Op::overload_name;
  m.impl(name.c_str(), torch::CppFunction::makeFromUnboxedFunction(TORCH_FN((Unboxed<Op, Otherwise>::call))));
  return name;
}

template <class... Ops>
std::vector<std::string> register_each_unboxed(torch::Library& m) {
  return {register_unboxed<Ops>(m)...};
}

// ---- clone and same-device _to_copy ------------------------------------------------------

// A fast kernel may take these whole (it readies self itself, after its plan took the call);
// otherwise torch's own kernels run (empty, then copy_: recorded or run at once).
at::Tensor clone(const at::Tensor& self, std::optional<c10::MemoryFormat> format) {
  if (auto copy = FastAtOnce<at::_ops::clone>::run(self.device().index(), self, format)) return std::move(*copy);
  return at::compositeexplicitautograd::clone(self, format);
}

at::Tensor to_copy(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<c10::Layout> layout,
                   std::optional<c10::Device> device, std::optional<bool> pin_memory, bool non_blocking,
                   std::optional<c10::MemoryFormat> format) {
  if (auto copy = FastAtOnce<at::_ops::_to_copy>::run(self.device().index(), self, dtype, layout, device, pin_memory,
                                                      non_blocking, format)) {
    return std::move(*copy);
  }
  return at::compositeexplicitautograd::_to_copy(self, dtype, layout, device, pin_memory, non_blocking, format);
}

// ---- functional and in-place forms of structured ops -----------------------------------

// A structured op's functional form (add.Tensor) reaches a backend without a kernel of its
// own through torch's generated wrapper: the op's meta function (a TensorIterator built to
// size the result), an empty result on the device, then the out= kernel, whose CPU kernel
// builds the TensorIterator again. Run at once, the CPU's functional kernel does it all in
// one pass; otherwise the call takes torch's wrapper as before, and is recorded as before
// (its out= form).
// A fast path's empty-result kernel may size the result instead of the meta function (small
// add, sub and mul): the same empty result, then the same out= call, recorded alike. In
// validate mode its layout is checked against the CPU kernel's, run on CPU tensors of the
// arguments' layouts (not the meta function's: meta gives other strides where a size-1 dim's
// stride is not row-major's, [1, 4, 1, 8] of strides [32, 8, 32, 1] times a number).
template <class T>
T cpu_twin(const T& value) {
  return value;
}
inline at::Tensor cpu_twin(const at::Tensor& t) {
  if (!t.defined() || t.device().type() == c10::kCPU) return t;  // a CPU number stays one
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kCPU));
}

template <class Op, class OutOp, class... A>
std::optional<at::Tensor> record_with_fast_empty_result(const A&... args) {
  const TypedHostKernel* entry = usable_empty_result_kernel<Op>();
  if (entry == nullptr) return std::nullopt;
  auto out = empty_result_function<Op>(*entry)(args...);
  if (!out.has_value()) return std::nullopt;
  if (fast_path() == FastPath::Validate) {
    const at::Tensor expected = Op::redispatch(kCpuKeys, cpu_twin(args)...);
    check_same_layout(info_of(*entry), c10::toString(c10::OperatorName(Op::name, Op::overload_name)),
                      describe_inputs(c10::impl::boxArgs<const A&...>(args...)), *out, expected);
  }
  OutOp::call(args..., *out);
  return out;
}

#define NEURON_STRUCTURED_FAST_EMPTY(op_struct, function, out_op)                                \
  struct op_struct##_as_torch_does {                                                          \
    template <class R, class... A>                                                            \
    static R call(A&&... args) {                                                              \
      if (auto out = record_with_fast_empty_result<at::_ops::op_struct, at::_ops::out_op>(args...)) { \
        return std::move(*out);                                                               \
      }                                                                                       \
      return at::compositeexplicitautogradnonfunctional::function(std::forward<A>(args)...);  \
    }                                                                                         \
  };                                                                                          \
  void register_##op_struct(torch::Library& m) {                                              \
    register_unboxed<at::_ops::op_struct, op_struct##_as_torch_does>(m);                      \
  }
NEURON_STRUCTURED_FAST_EMPTY(add_Tensor, add, add_out)
NEURON_STRUCTURED_FAST_EMPTY(sub_Tensor, sub, sub_out)
NEURON_STRUCTURED_FAST_EMPTY(mul_Tensor, mul, mul_out)
#undef NEURON_STRUCTURED_FAST_EMPTY

#define NEURON_STRUCTURED(op_struct, function)                                                 \
  struct op_struct##_as_torch_does {                                                          \
    template <class R, class... A>                                                            \
    static R call(A&&... args) {                                                              \
      return at::compositeexplicitautogradnonfunctional::function(std::forward<A>(args)...);  \
    }                                                                                         \
  };                                                                                          \
  void register_##op_struct(torch::Library& m) {                                              \
    register_unboxed<at::_ops::op_struct, op_struct##_as_torch_does>(m);                      \
  }

NEURON_STRUCTURED(add__Tensor, add_)
NEURON_STRUCTURED(mul__Tensor, mul_)
NEURON_STRUCTURED(div_Tensor, div)
NEURON_STRUCTURED(div_Tensor_mode, div)
NEURON_STRUCTURED(pow_Tensor_Scalar, pow)
NEURON_STRUCTURED(pow_Tensor_Tensor, pow)
NEURON_STRUCTURED(neg, neg)
NEURON_STRUCTURED(exp, exp)
NEURON_STRUCTURED(rsqrt, rsqrt)
NEURON_STRUCTURED(addmm, addmm)
NEURON_STRUCTURED(mm, mm)
NEURON_STRUCTURED(bmm, bmm)
NEURON_STRUCTURED(baddbmm, baddbmm)
NEURON_STRUCTURED(tanh, tanh)
NEURON_STRUCTURED(gelu, gelu)
NEURON_STRUCTURED(silu, silu)
NEURON_STRUCTURED(sigmoid, sigmoid)
NEURON_STRUCTURED(_softmax, _softmax)
NEURON_STRUCTURED(sum_dim_IntList, sum)
NEURON_STRUCTURED(mean_dim, mean)
NEURON_STRUCTURED(argmax, argmax)
NEURON_STRUCTURED(eq_Scalar, eq)
NEURON_STRUCTURED(eq_Tensor, eq)
NEURON_STRUCTURED(bitwise_or_Tensor, bitwise_or)
NEURON_STRUCTURED(bitwise_and_Tensor, bitwise_and)
NEURON_STRUCTURED(bitwise_not, bitwise_not)
NEURON_STRUCTURED(isin_Tensor_Tensor, isin)
NEURON_STRUCTURED(cat, cat)
NEURON_STRUCTURED(cos, cos)
NEURON_STRUCTURED(sin, sin)
NEURON_STRUCTURED(any_dim, any)
NEURON_STRUCTURED(any, any)
NEURON_STRUCTURED(all, all)
NEURON_STRUCTURED(all_dim, all)
NEURON_STRUCTURED(isneginf, isneginf)
NEURON_STRUCTURED(tril, tril_symint)
NEURON_STRUCTURED(_log_softmax, _log_softmax)
NEURON_STRUCTURED(nll_loss_forward, nll_loss_forward_symint)
NEURON_STRUCTURED(nll_loss_backward, nll_loss_backward_symint)
NEURON_STRUCTURED(_log_softmax_backward_data, _log_softmax_backward_data)
NEURON_STRUCTURED(_softmax_backward_data, _softmax_backward_data)
NEURON_STRUCTURED(tanh_backward, tanh_backward)
NEURON_STRUCTURED(silu_backward, silu_backward)
NEURON_STRUCTURED(gelu_backward, gelu_backward)
NEURON_STRUCTURED(sigmoid_backward, sigmoid_backward)
NEURON_STRUCTURED(threshold_backward, threshold_backward)
NEURON_STRUCTURED(sgn, sgn)
NEURON_STRUCTURED(topk, topk_symint)
NEURON_STRUCTURED(sort_stable, sort)
NEURON_STRUCTURED(max_dim, max)
NEURON_STRUCTURED(scatter_src, scatter)
NEURON_STRUCTURED(scatter_value, scatter)
NEURON_STRUCTURED(scatter__src, scatter_)
NEURON_STRUCTURED(scatter__value, scatter_)
NEURON_STRUCTURED(index_Tensor, index)
NEURON_STRUCTURED(index_add, index_add)
NEURON_STRUCTURED(max_pool2d_with_indices, max_pool2d_with_indices)
NEURON_STRUCTURED(max_pool2d_with_indices_backward, max_pool2d_with_indices_backward)
NEURON_STRUCTURED(linalg_vector_norm, linalg_vector_norm)
NEURON_STRUCTURED(upsample_nearest2d, upsample_nearest2d_symint)
NEURON_STRUCTURED(upsample_nearest2d_backward, upsample_nearest2d_backward_symint)
// In place: an optimizer's per-tensor updates (foreach=False), a model's clamps and masks.
#define NEURON_IN_PLACE_STRUCTURED_OPS(X)                                                            \
  X(sub__Tensor, sub_) X(div__Tensor, div_) X(addcmul_, addcmul_) X(addcdiv_, addcdiv_) X(lerp__Scalar, lerp_) \
  X(sqrt_, sqrt_) X(exp_, exp_) X(clamp_, clamp_) X(clamp_min_, clamp_min_) X(index_add_, index_add_)
NEURON_IN_PLACE_STRUCTURED_OPS(NEURON_STRUCTURED)
// Pointwise math, comparisons, clamps, reductions and activations of user models (a
// transformer's position buckets, masks and clamps, a CNN's activations): structured ops whose
// out= form is <op_struct>_out, both taken by the unboxed path (register_unboxed_ops). One list,
// X(op_struct, the functional kernel's name), defines and registers them.
#define NEURON_USER_MODEL_STRUCTURED_OPS(X) \
  X(lt_Scalar, lt) X(lt_Tensor, lt) X(le_Scalar, le) X(le_Tensor, le) X(gt_Scalar, gt) X(gt_Tensor, gt) \
  X(ge_Scalar, ge) X(ge_Tensor, ge) X(ne_Scalar, ne) X(ne_Tensor, ne) X(sqrt, sqrt) X(log, log) X(log1p, log1p) \
  X(log2, log2) X(reciprocal, reciprocal) X(sign, sign) X(erf, erf) X(floor, floor) X(ceil, ceil) X(trunc, trunc) \
  X(round, round) X(exp2, exp2) X(expm1, expm1) X(minimum, minimum) X(maximum, maximum) X(atan2, atan2) \
  X(remainder_Tensor, remainder) X(clamp, clamp) X(clamp_min, clamp_min) X(lerp_Scalar, lerp) X(addcmul, addcmul) \
  X(addcdiv, addcdiv) X(amax, amax) X(amin, amin) X(cumsum, cumsum) X(leaky_relu, leaky_relu) X(softplus, softplus) \
  X(elu, elu) X(mish, mish) X(hardsigmoid, hardsigmoid) X(gather, gather) X(triu, triu_symint) X(pow_Scalar, pow)
NEURON_USER_MODEL_STRUCTURED_OPS(NEURON_STRUCTURED)
#undef NEURON_STRUCTURED

// ---- the neuron:: ops (registrations.cpp defines them; random_kernels.cpp has their CPU kernels) ----

// A neuron:: op's typed handle, shaped like torch's at::_ops structs for Unboxed.
#define NEURON_OP(op_struct, op_name, overload, ...)                                                \
  struct op_struct {                                                                               \
    using schema = __VA_ARGS__;                                                                    \
    static constexpr const char* name = op_name;                                                   \
    static constexpr const char* overload_name = overload;                                         \
    template <class... A>                                                                          \
    static decltype(auto) redispatch(c10::DispatchKeySet keys, A&&... args) {                      \
      static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload_name).typed<schema>(); \
      return op.redispatch(keys, std::forward<A>(args)...);                                        \
    }                                                                                              \
  };
NEURON_OP(neuron_dropout_apply, "neuron::dropout_apply", "",
          std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, double))
NEURON_OP(neuron_masked_scale, "neuron::masked_scale", "", at::Tensor(const at::Tensor&, const at::Tensor&, double))
NEURON_OP(neuron_bernoulli_, "neuron::bernoulli_", "",
          at::Tensor&(at::Tensor&, double, std::optional<at::Generator>))
#undef NEURON_OP

}  // namespace

// Dropout's three steps, every dropout layer of a training step.
void register_neuron_ops_unboxed(torch::Library& m) {
  register_each_unboxed<neuron_dropout_apply, neuron_masked_scale, neuron_bernoulli_>(m);
}

// Foreach ops (optimizers' multi-tensor updates) would otherwise decompose into one op per
// tensor before reaching the device (their CompositeExplicitAutograd kernel loops over the
// tensors): taken whole, an AdamW step is ~10 records or runs instead of ~10 per parameter,
// each the CPU's foreach kernel. The updates optimizers and clip_grad_norm_ make every step
// take the unboxed path (an in-place one writes its first list: the schema says so); every
// other foreach op, the boxed fallback.
void register_foreach_ops(torch::Library& m) {
  namespace ops = at::_ops;
  const std::vector<std::string> unboxed = register_each_unboxed<
      ops::_foreach_add__Scalar, ops::_foreach_add__List, ops::_foreach_add__ScalarList, ops::_foreach_add__Tensor,
      ops::_foreach_sub__Scalar, ops::_foreach_sub__List, ops::_foreach_mul__Scalar, ops::_foreach_mul__List,
      ops::_foreach_mul__ScalarList, ops::_foreach_mul__Tensor, ops::_foreach_div__Scalar, ops::_foreach_div__List,
      ops::_foreach_div__ScalarList, ops::_foreach_div__Tensor, ops::_foreach_addcmul__Scalar,
      ops::_foreach_addcmul__ScalarList, ops::_foreach_addcmul__Tensor, ops::_foreach_addcdiv__Scalar,
      ops::_foreach_addcdiv__ScalarList, ops::_foreach_addcdiv__Tensor, ops::_foreach_lerp__Scalar,
      ops::_foreach_lerp__List, ops::_foreach_sqrt_, ops::_foreach_neg_, ops::_foreach_maximum__List,
      ops::_foreach_zero_, ops::_foreach_copy_,  // in place
      ops::_foreach_sqrt, ops::_foreach_add_List, ops::_foreach_mul_Scalar, ops::_foreach_mul_Tensor,
      ops::_foreach_div_ScalarList, ops::_foreach_norm_Scalar>(m);  // fresh results
  for (const auto& op : c10::Dispatcher::singleton().getAllOpNames()) {
    if (op.name.rfind("aten::_foreach_", 0) != 0) continue;
    const std::string name = op.name.substr(6) + (op.overload_name.empty() ? "" : "." + op.overload_name);
    if (std::find(unboxed.begin(), unboxed.end(), name) != unboxed.end()) continue;
    m.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
  }
}

// The ops a transformer's forward pass and a decoding loop run most, on the path they
// take to the device (a structured op's functional form allocates its result and calls
// its out= form here).
void register_unboxed_ops(torch::Library& m) {
  namespace ops = at::_ops;
  register_each_unboxed<ops::add_out, ops::sub_out, ops::mul_out, ops::div_out, ops::div_out_mode,  // arithmetic
               ops::pow_Tensor_Scalar_out, ops::pow_Tensor_Tensor_out, ops::neg_out, ops::exp_out, ops::rsqrt_out,
               ops::addmm_out, ops::mm_out, ops::bmm_out, ops::baddbmm_out,  // matmuls
               ops::tanh_out, ops::gelu_out, ops::silu_out, ops::sigmoid_out, ops::_softmax_out,  // activations
               ops::cos_out, ops::sin_out,  // rotary embeddings' tables, every decode step
               ops::native_layer_norm, ops::_scaled_dot_product_flash_attention_for_cpu,
               ops::sum_IntList_out, ops::mean_out, ops::argmax_out, ops::any_out, ops::max, ops::min,  // reductions
               ops::eq_Scalar_out, ops::eq_Tensor_out, ops::bitwise_or_Tensor_out, ops::bitwise_and_Tensor_out,
               ops::bitwise_not_out, ops::where_self, ops::where_self_out, ops::isin_Tensor_Tensor_out,  // masks
               ops::cat_out, ops::index_select, ops::arange_start_out, ops::fill__Scalar, ops::zero_,  // data movement
               ops::tril_out, ops::isneginf_out, ops::all_out, ops::all_all_out, ops::any_all_out,  // masks' checks
               // a training step's backward and loss
               ops::native_layer_norm_backward, ops::embedding_dense_backward, ops::tanh_backward_grad_input,
               ops::_softmax_backward_data_out, ops::_log_softmax_out, ops::_log_softmax_backward_data_out,
               ops::nll_loss_forward_output, ops::nll_loss_backward_grad_input,
               ops::silu_backward_grad_input, ops::gelu_backward_grad_input, ops::sigmoid_backward_grad_input,
               ops::threshold_backward_grad_input,  // activations' backward
               ops::sgn_out, ops::topk_values, ops::sort_values_stable, ops::max_dim_max,  // routing and sorting
               ops::scatter_src_out, ops::scatter_value_out,
               ops::index_Tensor_out, ops::_index_put_impl_, ops::index_add_out, ops::flip,  // indexing
               ops::max_pool2d_with_indices_out, ops::max_pool2d_with_indices_backward_grad_input,  // a CNN's
               ops::native_group_norm, ops::native_group_norm_backward, ops::upsample_nearest2d_out,  // a UNet's
               ops::upsample_nearest2d_backward_grad_input,
               ops::linalg_vector_norm_out, ops::var_correction, ops::mse_loss, ops::mse_loss_backward,
               ops::_grouped_mm, ops::floor_divide, ops::floor_divide__Tensor, ops::floor_divide_out>(m);
  // User models' structured ops (NEURON_USER_MODEL_STRUCTURED_OPS), functional and out= forms.
#define NEURON_REGISTER_WITH_OUT(op_struct, function) \
  register_##op_struct(m);                          \
  register_unboxed<ops::op_struct##_out>(m);
  NEURON_USER_MODEL_STRUCTURED_OPS(NEURON_REGISTER_WITH_OUT)
#undef NEURON_REGISTER_WITH_OUT
  // User models' other ops: abs, masks and relu, whose functional forms reach their out= forms
  // or have CPU kernels of their own; a CNN's, a ViT's patch embedding's and an audio model's
  // convolutions; attention's backward.
  register_each_unboxed<ops::abs_out, ops::logical_not_out, ops::nan_to_num_out, ops::isnan, ops::relu, ops::relu_,
                        ops::masked_fill__Scalar, ops::convolution, ops::convolution_backward,
                        ops::_scaled_dot_product_flash_attention_for_cpu_backward>(m);
  m.impl("clone", TORCH_FN(clone));
  m.impl("_to_copy", TORCH_FN(to_copy));
  register_foreach_ops(m);
  for (auto register_op :
       {register_add_Tensor, register_add__Tensor, register_sub_Tensor, register_mul_Tensor, register_mul__Tensor,
        register_div_Tensor, register_div_Tensor_mode, register_pow_Tensor_Scalar, register_pow_Tensor_Tensor,
        register_neg, register_exp, register_rsqrt, register_addmm, register_mm, register_bmm, register_baddbmm,
        register_tanh, register_gelu, register_silu, register_sigmoid, register__softmax, register_sum_dim_IntList,
        register_mean_dim, register_argmax, register_eq_Scalar, register_eq_Tensor, register_bitwise_or_Tensor,
        register_bitwise_and_Tensor, register_bitwise_not, register_isin_Tensor_Tensor, register_cat, register_cos,
        register_sin, register_any_dim, register_any, register_all, register_all_dim, register_isneginf, register_tril,
        register__log_softmax, register_nll_loss_forward, register_nll_loss_backward,
        register__log_softmax_backward_data, register__softmax_backward_data, register_tanh_backward,
        register_silu_backward, register_gelu_backward, register_sigmoid_backward, register_threshold_backward,
        register_sgn, register_topk, register_sort_stable, register_max_dim, register_scatter_src,
        register_scatter_value, register_scatter__src, register_scatter__value, register_index_Tensor,
        register_index_add, register_max_pool2d_with_indices, register_max_pool2d_with_indices_backward,
        register_linalg_vector_norm, register_upsample_nearest2d, register_upsample_nearest2d_backward}) {
    register_op(m);
  }
#define NEURON_REGISTER(op_struct, function) register_##op_struct(m);
  NEURON_IN_PLACE_STRUCTURED_OPS(NEURON_REGISTER)
#undef NEURON_REGISTER
}
#undef NEURON_IN_PLACE_STRUCTURED_OPS
#undef NEURON_USER_MODEL_STRUCTURED_OPS

}  // namespace neuron
