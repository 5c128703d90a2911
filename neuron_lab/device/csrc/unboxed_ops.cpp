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
// same results either way, since both run the same CPU kernel on the same memory.
#include "interceptor.h"
#include "runtime.h"
#include "blas_matmul.h"
#include "cpu_stubs.h"
#include "dense_cat.h"
#include "dense_index_select.h"
#include "dense_layout.h"
#include "layer_norm_direct.h"
#include "small_arith.h"
#include "small_convert.h"
#include "small_isin.h"
#include "small_arange.h"
#include "small_bitwise.h"
#include "small_fill.h"
#include "small_reduce_compare.h"
#include "small_sum.h"
#include "small_unary.h"
#include "small_where.h"

#include <ATen/EmptyTensor.h>
#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE
#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/core/boxing/impl/boxing.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_softmax_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/add_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/any_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/addmm_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/argmax_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/baddbmm_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/bitwise_and_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/bitwise_not_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/bitwise_or_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/bmm_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/_to_copy_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/cat_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/clone_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/cos_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/div_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/eq_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/exp_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/gelu_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/isin_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/mean_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/mm_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/mul_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/neg_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/pow_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/rsqrt_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/sigmoid_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/sin_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/silu_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/sub_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/sum_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/tanh_compositeexplicitautogradnonfunctional_dispatch.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_native.h>
#include <ATen/ops/silu_native.h>
#include <ATen/ops/tanh_native.h>
#include <ATen/ops/sin_native.h>
#include <ATen/ops/cos_native.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_ops.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/_to_copy_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addmm_ops.h>
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
#include <ATen/ops/eq_ops.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/fill_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/index_select_ops.h>
#include <ATen/ops/isin_ops.h>
#include <ATen/ops/max_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/min_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/native_layer_norm_ops.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/pow_ops.h>
#include <ATen/ops/rsqrt_ops.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/silu_ops.h>
#include <ATen/ops/sin_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/tanh_ops.h>
#include <ATen/ops/where_ops.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <array>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>

namespace neuron {
namespace {

// ---- one call's tensors ----------------------------------------------------------

// The neuron tensors of one call, found before anything is made: whether the call can
// take the unboxed path, and what the runtime must make ready for it.
struct CallTensors {
  c10::SmallVector<const at::Tensor*, 8> all;
  c10::SmallVector<const at::Tensor*, 2> written;
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
    if (is_written) written.push_back(&t);
  }
  bool is_written(const at::Tensor& t) const {
    for (const at::Tensor* w : written) {
      if (w->unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return true;
    }
    return false;
  }
};

template <class T>
void collect(CallTensors&, const T&) {}
void collect(CallTensors& c, const at::Tensor& t) { c.add(t, false); }
void collect(CallTensors& c, at::Tensor& t) { c.add(t, true); }  // out= and in-place arguments
void collect(CallTensors& c, const std::optional<at::Tensor>& t) {
  if (t.has_value()) c.add(*t, false);
}
void collect(CallTensors& c, const at::ITensorListRef& list) {
  for (const at::Tensor& t : list) c.add(t, false);
}

// Host aliases of the neuron tensors this thread's recent ops used. A decoding loop passes
// the same weights, caches and masks op after op, and making an alias (a CPU TensorImpl and
// StorageImpl over the same bytes) and dropping it was a third of this path's own cost. An
// alias is reused only while it still describes its tensor exactly (the same bytes, shape,
// strides, dtype) and nothing else holds it; a kernel that resized or restrided it, or a
// tensor freed and its memory given to another, fails that check and gets a new one.
// One slot per tensor address, chosen by hashing it: a token of a small GPT-2 uses ~30
// weights among ~90 tensors, which a 16-entry ring evicted before their next use.
class AliasCache {
 public:
  at::Tensor get(const at::Tensor& t) {
    const c10::TensorImpl* key = t.unsafeGetTensorImpl();
    Entry& slot = entries_[slot_of(key)];
    if (slot.key == key && slot.host.defined() && still_describes(slot.host, t)) return slot.host;
    slot.key = key;
    // A miss recycles the slot's old alias where nothing else holds it: a decode step's
    // fresh intermediates miss two times in three, and a new alias and the old one's
    // destruction cost four allocations.
    if (!slot.host.defined() || !realias(slot.host, t)) slot.host = host_alias(t);
    return slot.host;
  }

 private:
  struct Entry {
    const c10::TensorImpl* key = nullptr;  // compared, never dereferenced
    at::Tensor host;
  };
  static constexpr int kSlotBits = 8;
  static size_t slot_of(const c10::TensorImpl* key) {
    // Fibonacci hashing of the address: the product's top bits spread neighbouring allocations.
    return static_cast<size_t>((reinterpret_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull) >> (64 - kSlotBits));
  }
  static bool still_describes(const at::Tensor& host, const at::Tensor& t) {
    const c10::TensorImpl* h = host.unsafeGetTensorImpl();
    const c10::StorageImpl* hs = h->unsafe_storage().unsafeGetStorageImpl();
    const c10::StorageImpl* ts = t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
    const bool only_here = host.use_count() == 1 && h->unsafe_storage().use_count() == 1;
    return only_here && hs->data() == ts->data() && hs->nbytes() == ts->nbytes() && h->dtype() == t.dtype() &&
           h->sizes() == t.sizes() && h->strides() == t.strides() && h->storage_offset() == t.storage_offset() &&
           h->is_conj() == t.is_conj() && h->is_neg() == t.is_neg();
  }
  std::array<Entry, size_t{1} << kSlotBits> entries_;
};

AliasCache& alias_cache() {
  thread_local AliasCache cache;
  return cache;
}

// The host aliases of one call, one host storage per neuron storage (CPU kernels then
// see the aliasing, as in x.add_(x)), and the way back from the kernel's results.
class HostCall {
 public:
  explicit HostCall(c10::DeviceIndex device) : results_(device) {}

  at::Tensor alias(const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kNeuron) return t;  // a CPU scalar
    const auto* storage = t.storage().unsafeGetStorageImpl();
    for (const auto& a : aliases_) {
      if (a.original->storage().unsafeGetStorageImpl() == storage) {
        return remember(t, host_alias_sharing(t, a.host.storage()));
      }
    }
    return remember(t, alias_cache().get(t));
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
    if (const void* data = host.storage().data(); data != nullptr && !host.is_conj() && !host.is_neg()) {
      for (const auto& a : aliases_) {
        if (a.host.storage().data() == data) return neuron_view_of(*a.original, host);
      }
    }
    return results_.adopt(std::move(host));
  }

  // out= and in-place arguments: a resize or restride of their alias reaches them.
  void write_back_all(const CallTensors& tensors) const {
    for (const auto& a : aliases_) {
      if (tensors.is_written(*a.original)) write_back(*a.original, a.host);
    }
  }

 private:
  struct Alias {
    const at::Tensor* original;  // the caller's, alive for the whole call
    at::Tensor host;
  };
  at::Tensor remember(const at::Tensor& original, at::Tensor host) {
    aliases_.push_back({&original, host});
    return host;
  }
  c10::SmallVector<Alias, 8> aliases_;
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
template <class... T>
struct Results<std::tuple<T...>> {
  static constexpr bool fresh = (Results<T>::fresh || ...);
  static std::tuple<T...> wrap(HostCall& call, std::tuple<T...>&& host) {
    return std::apply(
        [&](auto&... h) { return std::tuple<T...>(Results<T>::wrap(call, static_cast<T&&>(h))...); }, host);
  }
};

// ---- ops run at once without a CPU kernel ------------------------------------------------

// Some ops of a decoding loop have a host kernel of their own with ATen's bits, faster than
// ATen's for their token-sized operands (no TensorIterator, no host aliases): small add, sub
// and mul (small_arith.h); neg, rsqrt and pow by 2, 3, -1 or -0.5 (small_unary.h); isin of
// small integer tensors (small_isin.h); cat of row-major tensors and index_select of
// contiguous ones (dense_cat.h, dense_index_select.h); addmm and mm as the BLAS call ATen's
// kernel makes (blas_matmul.h); layer norm by ATen's own kernel below its wrapper
// (layer_norm_direct.h). Their results are new device memory, written when the kernel takes
// the arguments (their memory is ready: begin_unboxed_op made it so); otherwise nullopt, and
// ATen's kernel runs.
template <class Op>
struct AtOnceKernel {
  static constexpr bool exists = false;
};

// New device memory for a host kernel's result.
at::Tensor new_result(c10::IntArrayRef sizes, at::ScalarType dtype) {
  return at::detail::empty_generic(sizes, allocator(), kNeuronKeys, dtype, std::nullopt);
}
at::Tensor new_result(c10::IntArrayRef sizes, c10::IntArrayRef strides, at::ScalarType dtype) {
  return at::detail::empty_strided_generic(sizes, strides, allocator(), kNeuronKeys, dtype);
}

// Runs `make` (which makes and writes the results) as an op run at once on `device`: a
// launch for the profiler, counted as a host kernel's op.
template <class Make>
auto run_host_kernel_at_once(c10::DeviceIndex device, const char* name, Make&& make) {
  c10::DeviceGuard guard(c10::Device(kNeuron, device));
  LaunchScope launch(device, name, /*synced=*/true);
  auto results = make();
  op_counters().at_once_host_kernel_ops.fetch_add(1, std::memory_order_relaxed);
  return results;
}

// A new result on `device`, written by `write` as an op run at once.
template <class Write>
at::Tensor write_new_result(c10::DeviceIndex device, const char* name, c10::IntArrayRef sizes, at::ScalarType dtype,
                            Write&& write) {
  return run_host_kernel_at_once(device, name, [&] {
    at::Tensor out = new_result(sizes, dtype);
    write(out);
    return out;
  });
}
// The same, of the given strides.
template <class Write>
at::Tensor write_new_result(c10::DeviceIndex device, const char* name, c10::IntArrayRef sizes,
                            c10::IntArrayRef strides, at::ScalarType dtype, Write&& write) {
  return run_host_kernel_at_once(device, name, [&] {
    at::Tensor out = new_result(sizes, strides, dtype);
    write(out);
    return out;
  });
}

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
  struct AtOnceKernel<at::_ops::op_struct> {                                                 \
    static constexpr bool exists = true;                                                     \
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
  struct AtOnceKernel<at::_ops::op_struct> {                                                 \
    static constexpr bool exists = true;                                                     \
    static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& self) {  \
      return small_unary_at_once(device, at::_ops::op_struct::name, unary, self);            \
    }                                                                                        \
  };
NEURON_SMALL_UNARY(neg, Unary::Neg)
NEURON_SMALL_UNARY(rsqrt, Unary::Rsqrt)
#undef NEURON_SMALL_UNARY

template <>
struct AtOnceKernel<at::_ops::pow_Tensor_Scalar> {
  static constexpr bool exists = true;
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& self, const c10::Scalar& exponent) {
    const auto op = pow_as_unary(exponent);
    if (!op.has_value()) return std::nullopt;
    return small_unary_at_once(device, at::_ops::pow_Tensor_Scalar::name, *op, self);
  }
};

template <>
struct AtOnceKernel<at::_ops::isin_Tensor_Tensor> {
  static constexpr bool exists = true;
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& elements,
                                       const at::Tensor& test_elements, bool /*assume_unique*/, bool invert) {
    if (!small_isin_takes(elements, test_elements)) return std::nullopt;
    return write_new_result(device, at::_ops::isin_Tensor_Tensor::name, elements.sizes(), at::kBool,
                            [&](const at::Tensor& out) { run_small_isin(elements, test_elements, invert, out); });
  }
};

template <>
struct AtOnceKernel<at::_ops::where_self> {
  static constexpr bool exists = true;
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
struct AtOnceKernel<at::_ops::fill__Scalar> {
  static constexpr bool exists = true;
  static std::optional<std::reference_wrapper<at::Tensor>> run(c10::DeviceIndex device, at::Tensor& self,
                                                               const c10::Scalar& value) {
    if (!small_fill_takes(self, value)) return std::nullopt;
    run_host_kernel_at_once(device, at::_ops::fill__Scalar::name, [&] {
      run_small_fill(self, value);
      return true;
    });
    return std::ref(self);
  }
};

// out= form (arange() makes an empty out and calls it): the result is out, sized here as
// ATen's kernel sizes an empty one.
template <>
struct AtOnceKernel<at::_ops::arange_start_out> {
  static constexpr bool exists = true;
  static std::optional<std::reference_wrapper<at::Tensor>> run(c10::DeviceIndex device, const c10::Scalar& start,
                                                               const c10::Scalar& end, const c10::Scalar& step,
                                                               at::Tensor& out) {
    const auto size = small_arange_size(start, end, step, out);
    if (!size.has_value()) return std::nullopt;
    run_host_kernel_at_once(device, at::_ops::arange_start_out::name, [&] {
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
  struct AtOnceKernel<at::_ops::op_struct> {                                                            \
    static constexpr bool exists = true;                                                                \
    static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& self,               \
                                         const at::Tensor& other) {                                     \
      return small_bitwise_at_once(device, at::_ops::op_struct::name, bitwise, self, &other);           \
    }                                                                                                   \
  };
NEURON_SMALL_BITWISE(bitwise_and_Tensor, Bitwise::And)
NEURON_SMALL_BITWISE(bitwise_or_Tensor, Bitwise::Or)
#undef NEURON_SMALL_BITWISE

template <>
struct AtOnceKernel<at::_ops::bitwise_not> {
  static constexpr bool exists = true;
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& self) {
    return small_bitwise_at_once(device, at::_ops::bitwise_not::name, Bitwise::Not, self, nullptr);
  }
};

template <>
struct AtOnceKernel<at::_ops::argmax> {
  static constexpr bool exists = true;
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
  static constexpr bool exists = true;
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& self, at::OptionalIntArrayRef dim,
                                       bool keepdim, std::optional<at::ScalarType> dtype) {
    const auto plan = plan_small_sum(self, dim, keepdim, dtype);
    if (!plan.has_value()) return std::nullopt;
    return write_new_result(device, Op::name, plan->sizes, self.scalar_type(),
                            [&](const at::Tensor& out) { run_small_sum(*plan, self, kMean, out); });
  }
};
template <>
struct AtOnceKernel<at::_ops::mean_dim> : SmallSumKernel<at::_ops::mean_dim, /*kMean=*/true> {};
template <>
struct AtOnceKernel<at::_ops::sum_dim_IntList> : SmallSumKernel<at::_ops::sum_dim_IntList, /*kMean=*/false> {};

template <>
struct AtOnceKernel<at::_ops::any_dim> {
  static constexpr bool exists = true;
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& self, int64_t dim, bool keepdim) {
    const auto sizes = plan_small_any(self, dim, keepdim);
    if (!sizes.has_value()) return std::nullopt;
    return write_new_result(device, at::_ops::any_dim::name, *sizes, at::kBool,
                            [&](const at::Tensor& out) { run_small_any(self, out); });
  }
};

template <>
struct AtOnceKernel<at::_ops::max> {
  static constexpr bool exists = true;
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& self) {
    if (!small_max_takes(self)) return std::nullopt;
    return write_new_result(device, at::_ops::max::name, {}, self.scalar_type(),
                            [&](const at::Tensor& out) { run_small_max(self, out); });
  }
};

template <>
struct AtOnceKernel<at::_ops::eq_Scalar> {
  static constexpr bool exists = true;
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& self, const c10::Scalar& other) {
    if (!small_eq_takes(self, other)) return std::nullopt;
    return write_new_result(device, at::_ops::eq_Scalar::name, self.sizes(), at::kBool,
                            [&](const at::Tensor& out) { run_small_eq(self, other, out); });
  }
};

template <>
struct AtOnceKernel<at::_ops::cat> {
  static constexpr bool exists = true;
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::ITensorListRef& tensors, int64_t dim) {
    const auto plan = plan_dense_cat(tensors, dim);
    if (!plan.has_value()) return std::nullopt;
    return write_new_result(device, at::_ops::cat::name, plan->sizes, tensors.front().scalar_type(),
                            [&](const at::Tensor& out) { run_dense_cat(*plan, tensors, out); });
  }
};

template <>
struct AtOnceKernel<at::_ops::index_select> {
  static constexpr bool exists = true;
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& self, int64_t dim,
                                       const at::Tensor& index) {
    const auto plan = plan_dense_index_select(self, dim, index);
    if (!plan.has_value()) return std::nullopt;
    return write_new_result(device, at::_ops::index_select::name, plan->sizes, self.scalar_type(),
                            [&](const at::Tensor& out) { run_dense_index_select(*plan, self, index, out); });
  }
};

template <>
struct AtOnceKernel<at::_ops::addmm> {
  static constexpr bool exists = true;
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& bias, const at::Tensor& mat1,
                                       const at::Tensor& mat2, const c10::Scalar& beta, const c10::Scalar& alpha) {
    const auto plan = plan_blas_matmul(&bias, mat1, mat2, beta, alpha);
    if (!plan.has_value()) return std::nullopt;
    return write_new_result(device, at::_ops::addmm::name, plan->sizes, plan->dtype,
                            [&](const at::Tensor& out) { run_blas_matmul(*plan, &bias, mat1, mat2, out); });
  }
};

template <>
struct AtOnceKernel<at::_ops::mm> {
  static constexpr bool exists = true;
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& mat1, const at::Tensor& mat2) {
    const auto plan = plan_blas_matmul(nullptr, mat1, mat2, 0, 1);
    if (!plan.has_value()) return std::nullopt;
    return write_new_result(device, at::_ops::mm::name, plan->sizes, plan->dtype,
                            [&](const at::Tensor& out) { run_blas_matmul(*plan, nullptr, mat1, mat2, out); });
  }
};

template <>
struct AtOnceKernel<at::_ops::native_layer_norm> {
  static constexpr bool exists = true;
  using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
  static std::optional<Result> run(c10::DeviceIndex device, const at::Tensor& input,
                                   c10::SymIntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                                   const std::optional<at::Tensor>& bias, double eps) {
    const auto shape = c10::asIntArrayRefSlowOpt(normalized_shape);
    if (!shape.has_value()) return std::nullopt;
    const auto plan = plan_layer_norm(input, *shape, weight, bias);
    if (!plan.has_value()) return std::nullopt;
    return run_host_kernel_at_once(device, at::_ops::native_layer_norm::name, [&] {
      const at::ScalarType dtype = input.scalar_type();
      Result results{new_result(input.sizes(), dtype), new_result(plan->statistics, dtype),
                     new_result(plan->statistics, dtype)};
      run_layer_norm(*plan, input, weight, bias, eps, std::get<0>(results), std::get<1>(results),
                     std::get<2>(results));
      return results;
    });
  }
};

// Structured unary ops (rotary embeddings' cos and sin, Llama's silu, GPT-2's tanh) run their
// own structured class on the device's tensors, as the CPU's functional kernel runs it on its
// own: meta builds the TensorIterator and asks for the result, made here on the device in the
// layout the iterator chose (the CPU's), and impl calls the op's dispatch stub, whose device
// entry is the CPU's kernel (cpu_stubs.h). The same iterator, kernel and bytes: the CPU's bits,
// without a host alias of the input and the result mapped back. Floating-point inputs whose
// bytes are their values; anything else keeps the host-alias path.
template <class Structured>
class StructuredOnDevice final : public Structured {
 public:
  void set_output_strided(int64_t index, at::IntArrayRef sizes, at::IntArrayRef strides, at::TensorOptions options) override {
    make_output(index, sizes, strides, options);
  }
  void set_output_raw_strided(int64_t index, at::IntArrayRef sizes, at::IntArrayRef strides,
                              at::TensorOptions options) override {
    make_output(index, sizes, strides, options);
  }
  const at::Tensor& maybe_get_output(int64_t /*index*/) override { return out_; }
  at::Tensor& out() { return out_; }

 private:
  void make_output(int64_t index, at::IntArrayRef sizes, at::IntArrayRef strides, at::TensorOptions options) {
    const at::ScalarType dtype = c10::typeMetaToScalarType(options.dtype());
    out_ = strides.empty() ? new_result(sizes, dtype) : new_result(sizes, strides, dtype);
    Structured::set_output_raw_strided(index, sizes, strides, options);  // the iterator takes it
  }
  at::Tensor out_;
};

template <class Op, class Structured>
struct StructuredUnaryKernel {
  static constexpr bool exists = true;
  static std::optional<at::Tensor> run(c10::DeviceIndex device, const at::Tensor& self) {
    if (!device_stubs_run_cpu_kernels() || !bytes_are_values(self) || !at::isFloatingType(self.scalar_type())) {
      return std::nullopt;
    }
    return run_host_kernel_at_once(device, Op::name, [&] {
      StructuredOnDevice<Structured> op;
      op.meta(self);
      op.impl(self, op.out());
      return std::move(op.out());
    });
  }
};
template <>
struct AtOnceKernel<at::_ops::cos> : StructuredUnaryKernel<at::_ops::cos, at::native::structured_cos_out> {};
template <>
struct AtOnceKernel<at::_ops::sin> : StructuredUnaryKernel<at::_ops::sin, at::native::structured_sin_out> {};
template <>
struct AtOnceKernel<at::_ops::tanh> : StructuredUnaryKernel<at::_ops::tanh, at::native::structured_tanh_out> {};
template <>
struct AtOnceKernel<at::_ops::silu> : StructuredUnaryKernel<at::_ops::silu, at::native::structured_silu_out> {};

// The CPU's flash attention (two a decode step) on the device's tensors themselves. ATen's
// CPU function allocates its results with the query's options (on the device, through its
// allocator), calls the kernel through its dispatch stub for the CPU explicitly, and returns
// transposed views: nothing in it asks for a CPU tensor, and the kernel reads the bytes
// through their pointers, host memory. The same function on the same bytes and strides: the
// CPU's bits, without host aliases of the three inputs and the results mapped back.
template <>
struct AtOnceKernel<at::_ops::_scaled_dot_product_flash_attention_for_cpu> {
  static constexpr bool exists = true;
  using Result = std::tuple<at::Tensor, at::Tensor>;
  static std::optional<Result> run(c10::DeviceIndex device, const at::Tensor& query, const at::Tensor& key,
                                   const at::Tensor& value, double dropout_p, bool is_causal,
                                   const std::optional<at::Tensor>& attn_mask, std::optional<double> scale) {
    for (const at::Tensor* t : {&query, &key, &value}) {
      if (!bytes_are_values(*t)) return std::nullopt;
    }
    if (attn_mask.has_value() && attn_mask->defined() &&
        (attn_mask->device() != query.device() || !bytes_are_values(*attn_mask))) {
      return std::nullopt;
    }
    return run_host_kernel_at_once(device, at::_ops::_scaled_dot_product_flash_attention_for_cpu::name, [&] {
      return at::native::_scaled_dot_product_flash_attention_cpu(query, key, value, dropout_p, is_causal, attn_mask,
                                                                 scale);
    });
  }
};

// Ends what begin_unboxed_op began, however the kernel returns.
struct UnboxedScope {
  ~UnboxedScope() { interceptor().end_unboxed_op(); }
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

template <class Op, class Otherwise = ToFallback<Op>, class Schema = typename Op::schema>
struct Unboxed;

template <class Op, class Otherwise, class R, class... A>
struct Unboxed<Op, Otherwise, R(A...)> {
  static R call(A... args) {
    InputCheck<Op>::check(args...);
    CallTensors tensors;
    (collect(tensors, args), ...);
    if (!tensors.unboxable || tensors.all.empty() || !interceptor().begin_unboxed_op(tensors.all, Op::name)) {
      return Otherwise::template call<R, A...>(std::forward<A>(args)...);
    }
    UnboxedScope scope;
    for (const at::Tensor* t : tensors.all) {
      // Inputs must hold computed values; what the op writes is overwritten.
      if (!tensors.is_written(*t)) interceptor().check_readable(*t);
    }
    const c10::DeviceIndex device = tensors.device;
    if constexpr (AtOnceKernel<Op>::exists) {
      if (auto result = AtOnceKernel<Op>::run(device, args...)) {
        for (const at::Tensor* t : tensors.written) interceptor().note_written(*t);
        return std::move(*result);
      }
    }
    HostCall call(device);
    std::tuple<HostArg<A>...> host_args{HostArg<A>(call, args)...};
    c10::DeviceGuard guard(c10::Device(kNeuron, device));
    // Fresh results take device memory while the kernel makes them: adopted, not copied.
    // Only this thread's C++ runs until they are adopted: lent privately, off the shared lock.
    HostAllocationsOnDevice allocations(Results<R>::fresh ? device : c10::DeviceIndex(-1),
                                        HostAllocationsOnDevice::Lending::ThreadPrivate);
    LaunchScope launch(device, Op::name, /*synced=*/true);
    auto&& host_result = std::apply(
        [](auto&... a) -> R { return Op::redispatch(kCpuKeys, a.get()...); },
        host_args);
    op_counters().fallback_ops += 1;
    op_counters().unboxed_ops += 1;
    call.write_back_all(tensors);
    for (const at::Tensor* t : tensors.written) interceptor().note_written(*t);
    return Results<R>::wrap(call, std::forward<decltype(host_result)>(host_result));
  }
};

template <class Op, class Otherwise = ToFallback<Op>>
void register_unboxed(torch::Library& m) {
  const std::string name = std::string(Op::name).substr(6) + (*Op::overload_name ? "." : "") + Op::overload_name;
  m.impl(name.c_str(), torch::CppFunction::makeFromUnboxedFunction(TORCH_FN((Unboxed<Op, Otherwise>::call))));
}

template <class... Ops>
void register_all(torch::Library& m) {
  (register_unboxed<Ops>(m), ...);
}

// ---- clone and same-device _to_copy of dense tensors: one block, copied or converted -----

// A decoding step clones its last logits and ids and copies the logits to float32, their
// own dtype. With the memory format preserved, both make empty_strided(self's sizes and
// strides) for a non-overlapping, dense self and copy it; with the contiguous format, a
// row-major result, whose bytes are self's in the same order when self is row-major save its
// size-1 dims (generate()'s last token, [1, 1] with strides (length, 1)). Either way the
// result's bytes are self's, in one block (or its elements in the same order, converted to a
// new dtype small_convert takes). Other calls (another dtype, device or format, conjugate or
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

// The copy as an op run at once: self's bytes in one block, or, to another dtype, its
// elements in the same order converted one by one (small_convert.h; a Llama step's int64
// position to float32).
std::optional<at::Tensor> block_copy_at_once(const at::Tensor& self, c10::IntArrayRef strides, const char* name,
                                             at::ScalarType dtype) {
  const at::Tensor* inputs[] = {&self};
  if (!interceptor().begin_unboxed_op(inputs, name)) return std::nullopt;
  UnboxedScope scope;
  interceptor().check_readable(self);
  return write_new_result(self.device().index(), name, self.sizes(), strides, dtype, [&](const at::Tensor& out) {
    if (dtype != self.scalar_type()) return run_small_convert(self, out);
    std::memcpy(out.mutable_data_ptr(), self.const_data_ptr(), static_cast<size_t>(self.numel()) * self.element_size());
  });
}

at::Tensor clone(const at::Tensor& self, std::optional<c10::MemoryFormat> format) {
  if (const auto strides = one_block_copy_strides(self, format)) {
    if (auto copy = block_copy_at_once(self, *strides, at::_ops::clone::name, self.scalar_type())) {
      return std::move(*copy);
    }
  }
  return at::compositeexplicitautograd::clone(self, format);
}

at::Tensor to_copy(const at::Tensor& self, std::optional<at::ScalarType> dtype, std::optional<c10::Layout> layout,
                   std::optional<c10::Device> device, std::optional<bool> pin_memory, bool non_blocking,
                   std::optional<c10::MemoryFormat> format) {
  const bool same_place = (!layout.has_value() || *layout == c10::kStrided) &&
                          (!device.has_value() || *device == self.device()) && !pin_memory.value_or(false);
  const bool same_dtype = !dtype.has_value() || *dtype == self.scalar_type();
  if (same_place && (same_dtype || small_convert_takes(self, *dtype))) {
    if (const auto strides = one_block_copy_strides(self, format)) {
      const auto to = dtype.value_or(self.scalar_type());
      if (auto copy = block_copy_at_once(self, *strides, at::_ops::_to_copy::name, to)) return std::move(*copy);
    }
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
// Small add, sub and mul take the same path with their result sized by small_arith's plan,
// without the TensorIterator: the same empty result, then the same out= call (recorded alike).
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

// The out= call with that result, when there is one ([alpha] for add and sub, none for mul).
template <class OutOp, class... Alpha>
std::optional<at::Tensor> record_small_arith(const at::Tensor& self, const at::Tensor& other, const Alpha&... alpha) {
  auto out = empty_small_arith_result(self, other, alpha...);
  if (out.has_value()) OutOp::call(self, other, alpha..., *out);
  return out;
}

#define NEURON_SMALL_ARITH_RECORDED(op_struct, function, out_op)                                \
  struct op_struct##_as_torch_does {                                                          \
    template <class R, class... A>                                                            \
    static R call(A&&... args) {                                                              \
      if (auto out = record_small_arith<at::_ops::out_op>(args...)) return std::move(*out);   \
      return at::compositeexplicitautogradnonfunctional::function(std::forward<A>(args)...);  \
    }                                                                                         \
  };                                                                                          \
  void register_##op_struct(torch::Library& m) {                                              \
    register_unboxed<at::_ops::op_struct, op_struct##_as_torch_does>(m);                      \
  }
NEURON_SMALL_ARITH_RECORDED(add_Tensor, add, add_out)
NEURON_SMALL_ARITH_RECORDED(sub_Tensor, sub, sub_out)
NEURON_SMALL_ARITH_RECORDED(mul_Tensor, mul, mul_out)
#undef NEURON_SMALL_ARITH_RECORDED

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
#undef NEURON_STRUCTURED

}  // namespace

// The ops a transformer's forward pass and a decoding loop run most, on the path they
// take to the device (a structured op's functional form allocates its result and calls
// its out= form here).
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  namespace ops = at::_ops;
  register_all<ops::add_out, ops::sub_out, ops::mul_out, ops::div_out, ops::div_out_mode,  // arithmetic
               ops::pow_Tensor_Scalar_out, ops::pow_Tensor_Tensor_out, ops::neg_out, ops::exp_out, ops::rsqrt_out,
               ops::addmm_out, ops::mm_out, ops::bmm_out, ops::baddbmm_out,  // matmuls
               ops::tanh_out, ops::gelu_out, ops::silu_out, ops::sigmoid_out, ops::_softmax_out,  // activations
               ops::cos_out, ops::sin_out,  // rotary embeddings' tables, every decode step
               ops::native_layer_norm, ops::_scaled_dot_product_flash_attention_for_cpu,
               ops::sum_IntList_out, ops::mean_out, ops::argmax_out, ops::any_out, ops::max, ops::min,  // reductions
               ops::eq_Scalar_out, ops::eq_Tensor_out, ops::bitwise_or_Tensor_out, ops::bitwise_and_Tensor_out,
               ops::bitwise_not_out, ops::where_self, ops::where_self_out, ops::isin_Tensor_Tensor_out,  // masks
               ops::cat_out, ops::index_select, ops::arange_start_out, ops::fill__Scalar>(m);  // data movement
  m.impl("clone", TORCH_FN(clone));
  m.impl("_to_copy", TORCH_FN(to_copy));
  for (auto register_op :
       {register_add_Tensor, register_add__Tensor, register_sub_Tensor, register_mul_Tensor, register_mul__Tensor,
        register_div_Tensor, register_div_Tensor_mode, register_pow_Tensor_Scalar, register_pow_Tensor_Tensor,
        register_neg, register_exp, register_rsqrt, register_addmm, register_mm, register_bmm, register_baddbmm,
        register_tanh, register_gelu, register_silu, register_sigmoid, register__softmax, register_sum_dim_IntList,
        register_mean_dim, register_argmax, register_eq_Scalar, register_eq_Tensor, register_bitwise_or_Tensor,
        register_bitwise_and_Tensor, register_bitwise_not, register_isin_Tensor_Tensor, register_cat, register_cos,
        register_sin, register_any_dim}) {
    register_op(m);
  }
}

}  // namespace neuron
