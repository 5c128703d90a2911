// The boxed fallback: how every aten op without a native neuron kernel runs.
//
// Device memory is host memory, so an op runs by giving the CPU kernel host
// aliases of its neuron arguments (CPU tensors over the same bytes, no copy).
// Results map back without copies where they can: an output that is an argument
// (in-place and out= ops) returns that argument; an output that views an
// argument's memory becomes a neuron view of it. The kernel allocates its blocks of 64 KiB
// and more in device memory (HostAllocationsOnDevice), so those fresh results are adopted as
// they are; a result over host memory is copied. Either way the allocator accounts for
// every byte of the results.
#include "registrations.h"
#include "device/csrc/runtime/interceptor.h"
#include "device/csrc/runtime/runtime.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>
#include <c10/core/CPUAllocator.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstring>

namespace neuron {

namespace {

// A dense CPU tensor's keys and nothing else (no sparse, quantized, mkldnn or Python keys):
// swapping the backend bit gives what a neuron tensor made here would have.
bool has_plain_cpu_keys(const c10::TensorImpl& impl) {
  constexpr auto kBackend = c10::BackendComponent::CPUBit;
  static const c10::DispatchKeySet plain = c10::DispatchKeySet(c10::DispatchKey::CPU) |
                                           c10::getAutogradRelatedKeySetFromBackend(kBackend) |
                                           c10::getAutocastRelatedKeySetFromBackend(kBackend);
  const c10::DispatchKeySet keys = impl.key_set();
  return keys.has(c10::DispatchKey::CPU) && (keys & plain) == keys;
}

// The bytes of a neuron storage, for a host alias: given memory first if pending.
void* host_bytes_of(const c10::Storage& storage) {
  // FakeTensors and meta tensors (torch.compile tracing) and wrapper subclasses have
  // no device memory: aliasing them would let a kernel read arbitrary host memory.
  TORCH_CHECK(storage.device_type() == kNeuron && (storage.data() != nullptr || storage.nbytes() == 0),
              "neuron: a kernel that needs tensor data got a tensor without neuron memory (storage on ",
              storage.device(), "), e.g. a FakeTensor while torch.compile traces. The op needs a meta "
              "(fake) implementation for tracing; please report the op.");
  materialize(storage);  // a pending result gets its memory before anyone touches it
  return const_cast<void*>(storage.data());
}

// A CPU storage over the bytes of a neuron storage. Resizable with the CPU
// allocator so that out= kernels may resize their output; the fallback then
// moves the new bytes into device memory.
c10::Storage host_storage_of(const c10::Storage& storage) {
  void* data = host_bytes_of(storage);
  return c10::Storage(c10::Storage::use_byte_size_t(), storage.nbytes(),
                      c10::DataPtr(data, c10::Device(c10::kCPU)), c10::GetCPUAllocator(), true);
}

}  // namespace

at::Tensor host_alias_sharing(const at::Tensor& t, c10::Storage host_storage) {
  auto alias = at::detail::make_tensor<c10::TensorImpl>(std::move(host_storage),
                                                        kCpuKeys, t.dtype());
  auto* impl = alias.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  if (t.is_conj()) impl->_set_conj(true);
  if (t.is_neg()) impl->_set_neg(true);
  return alias;
}

at::Tensor host_alias(const at::Tensor& t) { return host_alias_sharing(t, host_storage_of(t.storage())); }

bool realias(at::Tensor& alias, const at::Tensor& t, bool inference_mode) {
  c10::TensorImpl* impl = alias.unsafeGetTensorImpl();
  const c10::Storage& storage = impl->unsafe_storage();
  // Only a plain CPU tensor over a plain CPU storage that nothing but `alias` holds: no
  // Python object, weak reference, autograd metadata or view of it can see the change (an
  // alias never reaches Python, so nothing can hold a weak reference to its storage).
  const bool only_ours = alias.use_count() == 1 && alias.weak_use_count() == 1 && storage &&
                         storage.use_count() == 1;
  // An alias made under inference mode is an inference tensor, and one made outside is not:
  // a kernel that updates it in place through the full dispatch (a foreach op's per-tensor
  // calls) is refused where the mode differs, so it is made anew instead.
  if (!only_ours || !has_plain_cpu_keys(*impl) || impl->autograd_meta() != nullptr || impl->is_wrapped_number() ||
      impl->is_inference() != inference_mode || storage.device_type() != c10::kCPU ||
      !storage.resizable()) {
    return false;
  }
  auto* bytes = storage.unsafeGetStorageImpl();
  // The old DataPtr is the alias's own view of other bytes, or memory an out= kernel
  // resized it into (the fallback copied it back already): either way it may go.
  bytes->set_data_ptr_noswap(c10::DataPtr(host_bytes_of(t.storage()), c10::Device(c10::kCPU)));
  bytes->set_nbytes(t.storage().nbytes());
  bytes->set_allocator(c10::GetCPUAllocator());
  impl->set_storage_and_dtype(c10::Storage(storage), t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  impl->_set_conj(t.is_conj());
  impl->_set_neg(t.is_neg());
  op_counters().aliases_recycled.fetch_add(1, std::memory_order_relaxed);
  return true;
}

namespace {

// Host aliases of the neuron tensors this thread's recent ops used. A decoding loop passes
// the same weights, caches and masks op after op, and making an alias (a CPU TensorImpl and
// StorageImpl over the same bytes) and dropping it was a third of this path's own cost. An
// alias is reused only while it still describes its tensor exactly (the same bytes, shape,
// strides, dtype), was made in the inference mode now in force, and nothing else holds it;
// a kernel that resized or restrided it, or a tensor freed and its memory given to another,
// fails that check and gets a new one.
// One slot per tensor address, chosen by hashing it: a token of a small GPT-2 uses ~30
// weights among ~90 tensors, which a 16-entry ring evicted before their next use.
class AliasCache {
 public:
  at::Tensor get(const at::Tensor& t, bool inference_mode) {
    const c10::TensorImpl* key = t.unsafeGetTensorImpl();
    Entry& slot = entries_[slot_of(key)];
    if (slot.key == key && slot.host.defined() && still_describes(slot.host, t, inference_mode)) {
      op_counters().aliases_reused.fetch_add(1, std::memory_order_relaxed);
      return slot.host;
    }
    slot.key = key;
    // A miss recycles the slot's old alias where nothing else holds it: a decode step's
    // fresh intermediates miss two times in three, and a new alias and the old one's
    // destruction cost four allocations.
    if (!slot.host.defined() || !realias(slot.host, t, inference_mode)) slot.host = host_alias(t);
    return slot.host;
  }

 private:
  struct Entry {
    const c10::TensorImpl* key = nullptr;  // compared, never dereferenced
    at::Tensor host;
  };
  static constexpr int kSlotBits = 10;  // an optimizer passes hundreds of tensors each step
  static size_t slot_of(const c10::TensorImpl* key) {
    // Fibonacci hashing of the address: the product's top bits spread neighbouring allocations.
    return static_cast<size_t>((reinterpret_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull) >> (64 - kSlotBits));
  }
  static bool still_describes(const at::Tensor& host, const at::Tensor& t, bool inference_mode) {
    const c10::TensorImpl* h = host.unsafeGetTensorImpl();
    const c10::StorageImpl* hs = h->unsafe_storage().unsafeGetStorageImpl();
    const c10::StorageImpl* ts = t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
    const bool only_here = host.use_count() == 1 && h->unsafe_storage().use_count() == 1;
    return only_here && hs->data() == ts->data() && hs->nbytes() == ts->nbytes() && h->dtype() == t.dtype() &&
           same_dims(h->sizes(), t.sizes()) && same_dims(h->strides(), t.strides()) &&
           h->storage_offset() == t.storage_offset() && h->is_conj() == t.is_conj() && h->is_neg() == t.is_neg() &&
           host.is_inference() == inference_mode;
  }
  // A tensor's few sizes or strides, compared in place (ArrayRef's == calls memcmp).
  static bool same_dims(c10::IntArrayRef a, c10::IntArrayRef b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i] != b[i]) return false;
    }
    return true;
  }
  std::array<Entry, size_t{1} << kSlotBits> entries_;
};

}  // namespace

at::Tensor cached_host_alias(const at::Tensor& t, bool inference_mode) {
  thread_local AliasCache cache;
  return cache.get(t, inference_mode);
}

at::Tensor host_view(const at::Tensor& t) {
  return t.defined() && t.device().type() == kNeuron ? host_alias(t) : t;
}

at::Tensor to_device(const at::Tensor& cpu_tensor, c10::DeviceIndex device) {
  if (!cpu_tensor.defined() || cpu_tensor.device().type() == kNeuron) return cpu_tensor;
  const auto src = cpu_tensor.resolve_conj().resolve_neg();
  c10::DeviceGuard guard(c10::Device(kNeuron, device));
  const c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  at::Tensor out;
  if (src.is_non_overlapping_and_dense()) {
    out = at::detail::empty_strided_generic(src.sizes(), src.strides(), allocator(), keys, src.scalar_type());
    if (src.numel() > 0) std::memcpy(out.data_ptr(), src.const_data_ptr(), src.nbytes());
  } else if (src.numel() > 0 && std::all_of(src.strides().begin(), src.strides().end(), [](int64_t s) { return s >= 0; })) {
    // The CPU kernel's layout, gaps and overlaps included (LAPACK's column-major results in
    // padded buffers, expanded results): later ops loop over the same strides, and round
    // as they do on the CPU. The bytes its elements span are copied.
    out = at::detail::empty_strided_generic(src.sizes(), src.strides(), allocator(), keys, src.scalar_type());
    std::memcpy(out.data_ptr(), src.const_data_ptr(), out.storage().nbytes());
  } else {
    out = at::detail::empty_generic(src.sizes(), allocator(), keys, src.scalar_type(), std::nullopt);
    host_alias(out).copy_(src);
  }
  op_counters().output_copies += 1;
  return out;
}

at::Tensor neuron_view_of(const at::Tensor& neuron_base, const at::Tensor& host_view) {
  auto v = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(neuron_base.storage()),
                                                    neuron_base.key_set(), host_view.dtype());
  v.unsafeGetTensorImpl()->set_sizes_and_strides(host_view.sizes(), host_view.strides(), host_view.storage_offset());
  return v;
}

void write_back(const at::Tensor& original, const at::Tensor& host) {
  if (host.storage().data() != original.storage().data() || host.storage().nbytes() != original.storage().nbytes()) {
    if (host.storage().nbytes() > original.storage().nbytes()) {
      resize_storage_bytes(original.storage(), host.storage().nbytes());
    }
    if (host.storage().nbytes() > 0) {
      std::memcpy(original.storage().mutable_data(), host.storage().data(), host.storage().nbytes());
    }
  }
  if (host.sizes() != original.sizes() || host.strides() != original.strides() ||
      host.storage_offset() != original.storage_offset()) {
    original.unsafeGetTensorImpl()->set_sizes_and_strides(host.sizes(), host.strides(), host.storage_offset());
  }
}

void HostResults::add_input(const at::Tensor& host_alias, const at::Tensor& input) {
  if (!host_alias.defined() || !host_alias.has_storage()) return;
  const auto* key = host_alias.storage().unsafeGetStorageImpl();
  for (const auto& entry : inputs_) {
    if (entry.first == key) return;  // the first input over a storage stands for it
  }
  inputs_.emplace_back(key, input);
}

namespace {

// Whether a host kernel's result can be turned into a neuron tensor at all (else copied).
bool adoptable(const at::Tensor& cpu_tensor) {
  return cpu_tensor.defined() && cpu_tensor.device().type() == c10::kCPU && cpu_tensor.has_storage() &&
         !cpu_tensor.is_conj() && !cpu_tensor.is_neg();
}

}  // namespace

const at::Tensor* HostResults::input_viewed_by(const at::Tensor& cpu_tensor) const {
  const auto* key = cpu_tensor.storage().unsafeGetStorageImpl();
  for (const auto& [input_key, input] : inputs_) {
    if (input_key == key) return &input;
  }
  return nullptr;
}

const c10::Storage* HostResults::adopted_storage(const at::Tensor& cpu_tensor) {
  const auto* key = cpu_tensor.storage().unsafeGetStorageImpl();
  for (const auto& [adopted_key, adopted] : adopted_) {
    if (adopted_key == key) return &adopted;
  }
  c10::Storage fresh = adopt_host_storage(cpu_tensor.storage(), device_);
  if (!fresh) return nullptr;
  return &adopted_.emplace_back(key, std::move(fresh)).second;
}

at::Tensor HostResults::adopt(const at::Tensor& cpu_tensor) {
  if (!adoptable(cpu_tensor)) return to_device(cpu_tensor, device_);
  if (const at::Tensor* input = input_viewed_by(cpu_tensor)) {
    // A view of an input: a view of the neuron input (sharing its version counter).
    at::NoGradGuard no_grad;
    return input->as_strided(cpu_tensor.sizes(), cpu_tensor.strides(), cpu_tensor.storage_offset());
  }
  const c10::Storage* storage = adopted_storage(cpu_tensor);
  if (storage == nullptr) return to_device(cpu_tensor, device_);
  auto out = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(*storage), kNeuronKeys, cpu_tensor.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(cpu_tensor.sizes(), cpu_tensor.strides(),
                                                   cpu_tensor.storage_offset());
  return out;
}

at::Tensor HostResults::adopt(at::Tensor&& cpu_tensor) {
  c10::TensorImpl* impl = cpu_tensor.unsafeGetTensorImpl();
  const bool only_ours = cpu_tensor.defined() && cpu_tensor.use_count() == 1 && cpu_tensor.weak_use_count() == 1;
  if (!only_ours || !adoptable(cpu_tensor) || !has_plain_cpu_keys(*impl) || input_viewed_by(cpu_tensor) != nullptr) {
    return adopt(static_cast<const at::Tensor&>(cpu_tensor));
  }
  // A storage only this result holds turns into the neuron storage itself (no new
  // StorageImpl a result); shared ones are adopted once for all their tensors.
  c10::Storage storage = impl->storage();
  if (storage.use_count() != 2 || !adopt_host_storage_in_place(*storage.unsafeGetStorageImpl(), device_)) {
    const c10::Storage* adopted = adopted_storage(cpu_tensor);
    if (adopted == nullptr) return to_device(cpu_tensor, device_);
    storage = *adopted;
  }
  const c10::Device device = storage.device();
  impl->set_storage_keep_dtype(std::move(storage));  // also makes the tensor's device the storage's
  impl->_change_backend_component_keys(device);
  return std::move(cpu_tensor);
}

namespace {

struct Aliased {
  at::Tensor original;  // the neuron tensor the caller passed
  at::Tensor host;      // its host alias handed to the CPU kernel
  bool is_write;        // the schema says the op may mutate it
};

// Collects what the fallback needs to know about one call.
class Call {
 public:
  // `tensors`: how many tensors the call passes, so that its aliases are stored without regrowing.
  Call(const c10::OperatorHandle& op, size_t tensors) : op_(op) { aliased_.reserve(tensors); }

  at::Tensor unwrap(const at::Tensor& t, bool is_write, const c10::Argument& arg) {
    if (!t.defined()) return t;
    if (t.device().type() == kNeuron) {
      note_device(t.device(), arg);
      aliased_.push_back({t, host_alias_for(t), is_write});
      return aliased_.back().host;
    }
    // CPU scalars (0-dim) mix with device tensors as in CUDA; anything else must move.
    if (t.dim() > 0 || is_write) note_device(t.device(), arg);
    return t;
  }

  // Arguments that share a neuron storage get host aliases that share one CPU
  // storage, so kernels see the aliasing (in-place overlap checks, x.add_(x)). The first
  // alias of a storage comes from this thread's cache: an optimizer's foreach ops pass the
  // same hundreds of parameters and states every step.
  at::Tensor host_alias_for(const at::Tensor& t) {
    const Aliased* a = find(Key::NeuronStorage, t.storage().unsafeGetStorageImpl());
    return a != nullptr ? host_alias_sharing(t, a->host.storage()) : cached_host_alias(t, inference_mode_);
  }

  void note_device(c10::Device d, const c10::Argument& arg) {
    if (!device_.has_value()) {
      device_ = d;
    } else if (*device_ != d && mismatch_.empty()) {
      mismatch_ = arg.name();
      mismatch_device_ = d;
    }
  }

  void check_devices() const {
    if (mismatch_.empty()) return;
    const auto name = op_.schema().name();
    // CUDA accepts host index tensors for indexing ops; so do we.
    if (name == "aten::index" || name == "aten::index_put_" || name == "aten::_index_put_impl_" ||
        name == "aten::index_put") {
      if (device_->type() == kNeuron && mismatch_device_.type() == c10::kCPU) return;
    }
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
                *device_, " and ", mismatch_device_, "! (when checking argument for argument ", mismatch_,
                " in method ", op_.schema().operator_name(), "). Move them with .to(", *device_, ").");
  }

  c10::DeviceIndex device() const {
    if (device_.has_value() && device_->type() == kNeuron) return device_->index();
    return explicit_device_.value_or(current_device());
  }

  void note_explicit_device(const c10::Device& d) {
    if (d.type() == kNeuron) explicit_device_ = d.has_index() ? d.index() : current_device();
  }

  // Maps a result of the CPU kernel back to the neuron device: an argument, a view of one,
  // or new memory (adopted when the kernel allocated it in device memory, else copied).
  at::Tensor wrap(const at::Tensor& t, HostResults& fresh) {
    if (!t.defined() || t.device().type() == kNeuron) return t;
    if (const Aliased* a = find(Key::HostTensor, t.unsafeGetTensorImpl())) return a->original;
    TORCH_CHECK_NOT_IMPLEMENTED(t.layout() == c10::kStrided, op_.schema().operator_name(),
                                " produced a ", t.layout(),
                                " tensor, but the neuron device holds only strided (dense) tensors. "
                                "Run it on the CPU instead: move the inputs with .cpu().");
    const void* data = t.storage().data();
    if (data != nullptr) {
      if (const Aliased* a = find(Key::HostData, data)) return neuron_view_of(a->original, t);
    }
    return fresh.adopt(t);
  }

  // After the kernel: an out= or in-place argument whose host alias was
  // resized or restrided gets the same change on the device.
  void write_back() {
    for (auto& a : aliased_) {
      if (a.is_write) neuron::write_back(a.original, a.host);
    }
  }

 private:
  // The aliases are looked up by the neuron storage they alias (arguments sharing memory
  // share a host storage), by the host tensor a result may be, and by the bytes a result
  // may view. The first alias that matches answers, as a scan in argument order would.
  enum Key { NeuronStorage, HostTensor, HostData, kKeys };
  static std::array<const void*, kKeys> keys_of(const Aliased& a) {
    return {a.original.storage().unsafeGetStorageImpl(), a.host.unsafeGetTensorImpl(), a.host.storage().data()};
  }
  // Most ops alias a few tensors: a scan. A foreach op aliases every tensor of its lists
  // (an optimizer's hundreds of parameters, several lists each), where scanning for each
  // tensor made the call quadratic (600 parameters: 3.7x the CPU's time for an AdamW-like
  // step, 1.75x for 28): past kScanned aliases they are hashed. Each index catches up with
  // the aliases made since its last use, so one that is never asked for is never built
  // (unwrapping asks only by storage; results, by host tensor and data, when there are any).
  static constexpr size_t kScanned = 16;
  const Aliased* find(Key key, const void* value) {
    if (aliased_.size() <= kScanned) {
      for (const auto& a : aliased_) {
        if (keys_of(a)[key] == value) return &a;
      }
      return nullptr;
    }
    auto& index = index_[key];
    // emplace keeps the first alias of a key, as a scan in argument order finds it.
    for (size_t& i = indexed_[key]; i < aliased_.size(); ++i) index.emplace(keys_of(aliased_[i])[key], i);
    const auto it = index.find(value);
    return it == index.end() ? nullptr : &aliased_[it->second];
  }

  const c10::OperatorHandle& op_;
  const bool inference_mode_ = c10::InferenceMode::is_enabled();  // read once a call
  c10::SmallVector<Aliased, 8> aliased_;
  std::array<ska::flat_hash_map<const void*, size_t>, kKeys> index_;
  std::array<size_t, kKeys> indexed_{};  // how many of aliased_ each index holds
  std::optional<c10::Device> device_;
  std::string mismatch_;
  c10::Device mismatch_device_{c10::kCPU};
  std::optional<c10::DeviceIndex> explicit_device_;
};

bool is_optional_generator(const c10::Argument& arg) {
  const auto& type = arg.type();
  if (type->kind() == c10::TypeKind::GeneratorType) return true;
  if (type->kind() != c10::TypeKind::OptionalType) return false;
  return type->expectRef<c10::OptionalType>().getElementType()->kind() == c10::TypeKind::GeneratorType;
}

bool is_write(const c10::Argument& arg) { return arg.alias_info() != nullptr && arg.alias_info()->isWrite(); }

// An op whose results are all host values (item(), equal, is_nonzero) reads device
// values on the host; any other op run here needs its inputs now to compute on the host.
Reason access_reason(const c10::FunctionSchema& schema) {
  const auto& returns = schema.returns();
  const bool host_values_only = !returns.empty() && std::none_of(returns.begin(), returns.end(), [](const auto& r) {
    const auto kind = r.type()->kind();
    return kind == c10::TypeKind::TensorType || kind == c10::TypeKind::ListType || kind == c10::TypeKind::OptionalType;
  });
  return host_values_only ? Reason::HostRead : Reason::InlineOp;
}

}  // namespace

// The smallest allocation of a fallback kernel that takes device memory (see below).
constexpr size_t kMinLentBytes = 64 << 10;

void neuron_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  // A CompositeExplicitAutograd kernel also serves the CPU (the foreach ops' is their CPU kernel).
  TORCH_CHECK_NOT_IMPLEMENTED(op.hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
                                  op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd),
                              schema.operator_name(),
                              " has no kernel for the neuron device, nor a CPU kernel to run it with. "
                              "Run it on the CPU: move its inputs there with .cpu().");
  // A runtime that records ops (adaptive eager) may take it, to launch later.
  if (interceptor().try_record(op, stack)) return;
  const auto& args = schema.arguments();
  const size_t num_args = args.size();
  const size_t begin = stack->size() - num_args;
  // Otherwise the op runs here, now: first every launch using its memory finishes.
  // (Small vectors: an op has a few tensors, and this runs for every op run at once.)
  c10::SmallVector<at::Tensor, 8> written;
  size_t num_tensors = 0;
  {
    c10::SmallVector<at::Tensor, 8> touched;
    for (size_t i = 0; i < num_args; ++i) {
      const auto& value = (*stack)[begin + i];
      const size_t first = touched.size();
      if (value.isTensor()) {
        touched.push_back(value.toTensor());
      } else if (value.isTensorList()) {
        for (const at::Tensor& t : value.toTensorList()) touched.push_back(t);
      } else if (value.isList()) {
        for (const c10::IValue& v : value.toList()) {
          if (v.isTensor()) touched.push_back(v.toTensor());
        }
      }
      if (is_write(args[i])) written.append(touched.begin() + first, touched.end());
    }
    num_tensors = touched.size();
    interceptor().before_host_access(touched, access_reason(schema), schema.operator_name().name);
    // Inputs must hold computed values; what the op writes is overwritten. (Sorted: a
    // foreach op writes hundreds of tensors.)
    c10::SmallVector<const c10::TensorImpl*, 8> written_impls;
    for (const auto& w : written) written_impls.push_back(w.unsafeGetTensorImpl());
    std::sort(written_impls.begin(), written_impls.end());
    for (const auto& t : touched) {
      if (!std::binary_search(written_impls.begin(), written_impls.end(), t.unsafeGetTensorImpl())) {
        interceptor().check_readable(t);
      }
    }
  }
  Call call(op, num_tensors);

  for (size_t i = 0; i < num_args; ++i) {
    auto& value = (*stack)[begin + i];
    const auto& arg = args[i];
    if (value.isTensor()) {
      value = call.unwrap(value.toTensor(), is_write(arg), arg);
    } else if (value.isTensorList()) {
      auto list = value.toTensorList();
      c10::List<at::Tensor> host_list;
      host_list.reserve(list.size());
      for (const at::Tensor& t : list) host_list.push_back(call.unwrap(t, is_write(arg), arg));
      value = std::move(host_list);
    } else if (value.isList()) {
      // Tensor?[] (indices): keep Nones, alias the tensors.
      auto list = value.toList();
      c10::impl::GenericList host_list(list.elementType());
      host_list.reserve(list.size());
      for (const c10::IValue& v : list) {
        host_list.push_back(v.isTensor() ? c10::IValue(call.unwrap(v.toTensor(), is_write(arg), arg)) : v);
      }
      value = std::move(host_list);
    } else if (value.isDevice()) {
      call.note_explicit_device(value.toDevice());
    }
  }
  call.check_devices();

  const auto device = call.device();
  // Random ops draw from the neuron generator (its CPU twin, or a generator keyed by its
  // seed and offset), never from the CPU's, and after the recorded random ops before
  // them have drawn (they draw when the device runs them): the same numbers, in the
  // same order, as eager mode. With nothing buffered or running (ops run at once) there
  // is nothing to wait for, and no host wait is counted.
  bool draws = false;
  for (size_t i = 0; i < num_args; ++i) {
    auto& value = (*stack)[begin + i];
    if (value.isGenerator()) {
      const auto& gen = value.toGenerator();
      if (gen.device().type() == kNeuron) {
        value = generator_for_draw(gen, draw_span(args, &(*stack)[begin], num_args));
        draws = true;
      }
    } else if (value.isNone() && is_optional_generator(args[i])) {
      value = generator_for_draw(default_generator(device), draw_span(args, &(*stack)[begin], num_args));
      draws = true;
    }
  }
  if (draws && !on_device_thread() && (interceptor().holds_ops() || !device_quiet())) {
    synchronize_device(device, Reason::RandomOp, schema.operator_name().name);
  }

  {
    c10::DeviceGuard guard(c10::Device(kNeuron, device));
    LaunchScope launch(device, schema.operator_name().name.c_str(), /*synced=*/true);
    // What the kernel allocates (its results, its scratch) takes device memory, as a
    // kernel's workspace does on an accelerator: results become neuron tensors without a
    // copy, and scratch is reused from the device's cache instead of mapped and faulted
    // in on every call. Not under kMinLentBytes: lending, tracking and adopting a small
    // block cost more than copying it (tiny BERT's step 3.1 ms with every block lent, 2.9
    // with none).
    HostAllocationsOnDevice in_device_memory(device, HostAllocationsOnDevice::Lending::Shared, kMinLentBytes);
    run_host_kernel(op, stack);
  }
  op_counters().fallback_ops += 1;
  call.write_back();
  for (const auto& t : written) interceptor().note_written(t);

  const size_t num_returns = schema.returns().size();
  const size_t ret_begin = stack->size() - num_returns;
  HostResults fresh(device);
  for (size_t i = 0; i < num_returns; ++i) {
    auto& value = (*stack)[ret_begin + i];
    if (value.isTensor()) {
      value = call.wrap(value.toTensor(), fresh);
    } else if (value.isTensorList()) {
      auto list = value.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(list.size());
      for (const at::Tensor& t : list) out.push_back(call.wrap(t, fresh));
      value = std::move(out);
    }
  }
  interceptor().after_inline_run(op, *stack);  // the next such call may be recorded
}

namespace {

// Sparse, sparse-compressed and quantized neuron tensors do not exist: say so.
}  // namespace

void unsupported_layout_fallback(const c10::OperatorHandle& op, torch::jit::Stack* /*stack*/) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op.schema().operator_name(),
                              ": sparse and quantized tensors are not supported on the neuron device; "
                              "only strided (dense) tensors are. Run this op on the CPU: move the "
                              "tensors there with .cpu().");
}

}  // namespace neuron

namespace neuron {
// Ops that have a CPU kernel but whose PrivateUse1 entry would otherwise be a
// generic decomposition (CompositeExplicitAutograd) that rounds differently, or
// a structured wrapper that makes the CPU out= kernel warn about resizing, or a
// composite that picks another algorithm off the CPU (linalg_lstsq: gelsy on the CPU,
// another driver elsewhere). The CPU kernel, through the fallback, keeps results
// identical to the CPU's (the bitwise sweep, test_bitwise.py, finds new ones).
void register_cpu_kernel_routes(torch::Library& m) {
  // (mse_loss and native_group_norm: unboxed_ops.cpp, which also takes them to the CPU kernel.)
  for (const char* name :
       {"addr", "addr.out", "_stack", "_stack.out", "all.dims_out", "any.dims_out", "linalg__powsum", "linalg_lstsq"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
  }
}
}  // namespace neuron
