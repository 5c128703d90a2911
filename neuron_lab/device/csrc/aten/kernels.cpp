// The aten kernels the neuron device must implement natively: tensor creation in
// device memory, copies between devices, metadata-only views, resizing and
// storage swaps, and convolution (its two ops routed to the fallback, and the two entry
// points PyTorch reserves for out-of-tree backends). Everything else goes through the
// fallback (fallback.cpp).
#include "device/csrc/runtime/runtime.h"
#include "dense_layout.h"
#include "registrations.h"
#include "device/csrc/runtime/interceptor.h"
#include "device/csrc/runtime/segment_memory.h"

#include <ATen/EmptyTensor.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/_local_scalar_dense_ops.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/MemoryFormat.h>
#include <c10/util/accumulate.h>
#include <c10/util/strides.h>
#include <torch/library.h>

#include <cstring>

namespace neuron {
namespace {

void check_sizes(c10::IntArrayRef sizes);
std::vector<int64_t> strides_for(c10::IntArrayRef sizes, c10::MemoryFormat memory_format);

c10::DeviceIndex target_device(std::optional<c10::Device> device) {
  if (!device.has_value() || !device->has_index()) return current_device();
  TORCH_CHECK(device->type() == kNeuron, "neuron: expected a neuron device, got ", *device);
  check_device_index(device->index());
  return device->index();
}

void check_creation_options(std::optional<c10::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK_NOT_IMPLEMENTED(!layout.has_value() || *layout == c10::kStrided,
                              "neuron: only strided (dense) tensors can live on the neuron device, "
                              "got layout ", *layout, "; create the tensor on the CPU instead");
  TORCH_CHECK(!pin_memory.value_or(false),
              "neuron: only CPU tensors can be pinned; drop pin_memory=True for neuron tensors");
}

at::Tensor empty_unfilled(c10::SymIntArrayRef size, std::optional<c10::ScalarType> dtype,
                          std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                          std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  check_creation_options(layout, pin_memory);
  const auto index = target_device(device);
  if (interceptor().defers_allocation()) {
    const auto sizes = C10_AS_INTARRAYREF_SLOW(size);
    check_sizes(sizes);
    const auto strides = strides_for(sizes, memory_format.value_or(c10::MemoryFormat::Contiguous));
    auto t = empty_pending(sizes, strides, c10::dtype_or_default(dtype), index);
    interceptor().note_fresh_output(t);
    return t;
  }
  c10::DeviceGuard guard(c10::Device(kNeuron, index));
  return at::detail::empty_generic(C10_AS_INTARRAYREF_SLOW(size), allocator(), kNeuronKeys,
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_memory_format(c10::SymIntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  return filled_if_deterministic(empty_unfilled(size, dtype, layout, device, pin_memory, memory_format));
}

at::Tensor empty_strided(c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  check_creation_options(layout, pin_memory);
  const auto index = target_device(device);
  if (interceptor().defers_allocation()) {
    const auto sizes = C10_AS_INTARRAYREF_SLOW(size);
    check_sizes(sizes);
    auto t = empty_pending(sizes, C10_AS_INTARRAYREF_SLOW(stride), c10::dtype_or_default(dtype), index);
    interceptor().note_fresh_output(t);
    return filled_if_deterministic(std::move(t));
  }
  c10::DeviceGuard guard(c10::Device(kNeuron, index));
  return filled_if_deterministic(at::detail::empty_strided_generic(
      C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride), allocator(), kNeuronKeys,
      c10::dtype_or_default(dtype)));
}

at::Tensor efficient_zero_tensor(c10::SymIntArrayRef size, std::optional<c10::ScalarType> dtype,
                                 std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                 std::optional<bool> pin_memory) {
  // Autograd's memory-less zero tensors become real zeros: every neuron tensor
  // must have readable memory.
  auto out = empty_unfilled(size, dtype, layout, device, pin_memory, std::nullopt);
  return out.zero_();
}

// dst.copy_(src) where either side is a neuron tensor: one launch on dst's core
// (or src's, when dst is on the host).
const c10::OperatorHandle& copy_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
  return op;
}

// Whether dst.copy_(src) is a plain copy of bytes: one dtype, the same sizes and strides
// over memory the elements fill without gaps or overlaps (a clone, a .to() of the same
// dtype, a KV cache written whole), no conjugate or negative bit to resolve. Storages that
// alias each other are left to ATen (its overlap checks and errors).
bool copies_bytes(const at::Tensor& src, const at::Tensor& dst) {
  return bytes_are_values(src) && bytes_are_values(dst) && src.scalar_type() == dst.scalar_type() &&
         src.sizes() == dst.sizes() && src.strides() == dst.strides() && src.is_non_overlapping_and_dense() &&
         !src.storage().is_alias_of(dst.storage());
}

// The bytes of `t`'s elements, which copies_bytes() said are one block from its first element.
size_t element_bytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

// The copy itself, on the calling thread, once both sides' memory is ready.
void copy_now(const at::Tensor& self, const at::Tensor& dst, c10::DeviceIndex device) {
  interceptor().check_readable(self);
  {
    LaunchScope launch(device, "copy_", /*synced=*/true);
    if (copies_bytes(self, dst)) {
      // ATen's copy_ would build a TensorIterator over host aliases of both to do the same.
      for (const at::Tensor* t : {&self, &dst}) {
        if (t->device().type() == kNeuron) materialize(t->storage());
      }
      if (dst.numel() > 0) std::memcpy(dst.mutable_data_ptr(), self.const_data_ptr(), element_bytes(dst));
    } else if (self.device().type() == kNeuron && dst.device().type() == kNeuron &&
               self.storage().is_alias_of(dst.storage())) {
      // One host storage for both, so the CPU kernel sees the overlap.
      auto host_dst = host_alias(dst);
      host_dst.copy_(host_alias_sharing(self, host_dst.storage()));
    } else {
      host_view(dst).copy_(host_view(self));
    }
  }
  interceptor().note_written(dst);
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  const bool src_on_device = self.device().type() == kNeuron;
  const bool dst_on_device = dst.device().type() == kNeuron;
  const auto device = dst_on_device ? dst.device().index() : self.device().index();
  auto& counters = op_counters();
  auto& copied = src_on_device && dst_on_device ? counters.device_to_device_bytes
                 : dst_on_device                ? counters.host_to_device_bytes
                                                : counters.device_to_host_bytes;
  const auto bytes = static_cast<uint64_t>(dst.numel()) * dst.element_size();
  // Into one core, where the runtime runs ops at once: the copy runs now, as the unboxed
  // path runs its ops (unboxed_ops.cpp), without a boxed stack to decide it or a staging
  // copy of host memory. (In blocking mode the path below counts it by its reason.)
  if (dst_on_device && (!src_on_device || self.device().index() == device) && interceptor().active()) {
    const at::Tensor* both[] = {&dst, &self};
    if (interceptor().begin_unboxed_op(c10::ArrayRef<const at::Tensor*>(both, src_on_device ? 2 : 1),
                                       "aten::copy_")) {
      UnboxedOpScope scope;
      copy_now(self, dst, device);
      copied += bytes;
      return dst;
    }
  }
  if (src_on_device && dst_on_device) {
    // Within the device: an op like any other, recorded on the current stream.
    torch::jit::Stack stack{dst, self, false};
    if (interceptor().try_record(copy_op(), &stack)) {
      copied += bytes;
      return dst;
    }
  } else if (dst_on_device && interceptor().try_copy_from_host(dst, self)) {
    copied += bytes;  // without waiting for the device
    return dst;
  }
  // Host memory is involved: the copy happens now, after the launches that use
  // the device memory (a read of results from the host waits for them).
  interceptor().before_host_access(
      {self, dst},
      dst_on_device ? (src_on_device ? Reason::CopyBetweenCores : Reason::CopyFromHost) : Reason::CopyToHost, {});
  copy_now(self, dst, device);
  copied += bytes;
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

// ---- item(): one element read by the host -----------------------------------------

// The boxed fallback's steps for a host read (the runtime's say first, a wait for what
// writes the tensor, one inline launch, the CPU's kernel), without boxing the call or
// making a host alias: generate() reads a value back every token.
c10::Scalar local_scalar_dense(const at::Tensor& self) {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::_local_scalar_dense", "");
  torch::jit::Stack stack{self};
  TORCH_INTERNAL_ASSERT(!interceptor().try_record(op, &stack), "neuron: item() cannot be recorded");
  interceptor().before_host_access({self}, Reason::HostRead, op.schema().name());
  interceptor().check_readable(self);
  c10::Scalar value;
  {
    c10::DeviceGuard guard(self.device());
    LaunchScope launch(self.device().index(), op.schema().name().c_str(), /*synced=*/true);
    // ATen's CPU kernel reads the element through the data pointer: host memory.
    value = at::_ops::_local_scalar_dense::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), self);
  }
  op_counters().fallback_ops += 1;
  interceptor().after_inline_run(op, stack);
  return value;
}

// ---- views: metadata only, never a copy -----------------------------------------

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  std::optional<int64_t> offset;
  if (storage_offset.has_value()) offset = storage_offset->expect_int();
  return at::native::as_strided_tensorimpl(self, C10_AS_INTARRAYREF_SLOW(size),
                                           C10_AS_INTARRAYREF_SLOW(stride), offset);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

// ---- resizing and storage swaps ---------------------------------------------------

void check_sizes(c10::IntArrayRef sizes) {
  for (auto d : sizes) {
    TORCH_CHECK(d >= 0, "Trying to create tensor with negative dimension ", d, ": ", sizes);
  }
}

// Strides for `sizes` laid out in `memory_format` (throws for a rank that does not fit).
std::vector<int64_t> strides_for(c10::IntArrayRef sizes, c10::MemoryFormat memory_format) {
  switch (memory_format) {
    case c10::MemoryFormat::Contiguous: {
      auto strides = c10::contiguous_strides(sizes);
      return {strides.begin(), strides.end()};
    }
    case c10::MemoryFormat::ChannelsLast:
      TORCH_CHECK(sizes.size() == 4, "required rank 4 tensor to use channels_last format");
      return c10::get_channels_last_strides_2d(sizes);
    case c10::MemoryFormat::ChannelsLast3d:
      TORCH_CHECK(sizes.size() == 5, "required rank 5 tensor to use channels_last_3d format");
      return c10::get_channels_last_strides_3d(sizes);
    default:
      TORCH_CHECK(false, "neuron: unsupported memory format for resize_: ", memory_format);
  }
}

// Every check, and the storage growth (which may raise OutOfMemoryError), comes
// before the tensor's metadata changes: a failed call leaves the tensor as it was.
void grow_storage_for(const c10::Storage& storage, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                      size_t itemsize, int64_t offset) {
  TORCH_CHECK(offset >= 0, "Tensor: invalid storage offset ", offset);
  const size_t needed = at::detail::computeStorageNbytes(sizes, strides, itemsize, offset);
  if (c10::multiply_integers(sizes) > 0 && needed > storage.nbytes()) resize_storage_bytes(storage, needed);
}

// In-place metadata changes (transpose_, unsqueeze_, ..., resize_, set_): the
// launches that use the tensor read its metadata when they run, so they finish
// first. Then the CPU's metadata-only kernel.
void sync_then_change_metadata(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  std::vector<at::Tensor> tensors;
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    if ((*stack)[i].isTensor()) tensors.push_back((*stack)[i].toTensor());
  }
  if (interceptor().active()) {
    interceptor().before_host_access(tensors, Reason::MetadataChange, op.schema().operator_name().name);
  }
  op.redispatchBoxed(kCpuKeys, stack);
}

void sync_before_metadata_change(const at::Tensor& self, const char* what) {
  if (interceptor().active()) interceptor().before_host_access({self}, Reason::MetadataChange, what);
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  sync_before_metadata_change(self, "aten::resize_");
  check_sizes(sizes);
  if (self.sizes() == sizes && !memory_format.has_value()) return self;  // as on the CPU: strides kept
  const auto strides = strides_for(sizes, memory_format.value_or(c10::MemoryFormat::Contiguous));
  const auto old_nbytes = static_cast<int64_t>(self.storage().nbytes());
  grow_storage_for(self.storage(), sizes, strides, self.dtype().itemsize(), self.storage_offset());
  self.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
  fill_grown_if_deterministic(self, old_nbytes);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, c10::SymInt storage_offset,
                        c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  TORCH_CHECK(source.device_type() == kNeuron, "neuron: set_() needs a neuron storage, got one on ",
              source.device());
  sync_before_metadata_change(self, "aten::set_");
  auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  check_sizes(sizes);
  const auto offset = storage_offset.expect_int();
  const std::vector<int64_t> strides =
      stride.empty() ? strides_for(sizes, c10::MemoryFormat::Contiguous)
                     : std::vector<int64_t>(C10_AS_INTARRAYREF_SLOW(stride).begin(),
                                            C10_AS_INTARRAYREF_SLOW(stride).end());
  TORCH_CHECK(strides.size() == sizes.size(), "set_: ", sizes.size(), " sizes but ", strides.size(), " strides");
  grow_storage_for(source, sizes, strides, self.dtype().itemsize(), offset);
  auto* impl = self.unsafeGetTensorImpl();
  if (!impl->storage().is_alias_of(source)) impl->set_storage_keep_dtype(std::move(source));
  impl->set_sizes_and_strides(sizes, strides, offset);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  const auto itemsize = static_cast<int64_t>(self.dtype().itemsize());
  const int64_t numel = static_cast<int64_t>(source.nbytes()) / itemsize;
  std::vector<c10::SymInt> size{c10::SymInt(numel)};
  return set_storage(self, std::move(source), 0, size, {});
}

// x.set_(y): x becomes a view of y's memory, as on the CPU (the fallback would run the
// CPU's set_ on host aliases and then copy y's bytes into x's own storage).
at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  TORCH_CHECK(source.device() == self.device(), "neuron: set_() needs a tensor on ", self.device(), ", got one on ",
              source.device(), "; move it with .to(\"", self.device(), "\") first");
  TORCH_CHECK(source.dtype() == self.dtype(), "Could not set tensor of type ", source.dtype(), " to a tensor of type ",
              self.dtype());
  if (source.unsafeGetTensorImpl() == self.unsafeGetTensorImpl()) return self;
  return set_storage(self, source.storage(), source.sym_storage_offset(), source.sym_sizes(), source.sym_strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::DeviceGuard guard(self.device());
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, allocator()->allocate(0), allocator(), true);
  std::vector<c10::SymInt> size{c10::SymInt(0)};
  return set_storage(self, std::move(empty), 0, size, {});
}

void record_stream(at::Tensor& self, c10::Stream stream) {
  if (is_opened_ipc_memory(self.storage().data_ptr())) {
    // Memory another process shared: not this allocator's to hold back (CUDA's ignores it too).
    TORCH_CHECK(stream.device() == self.device(), "record_stream: the tensor is on ", self.device(),
                " but the stream is on ", stream.device());
    stream_state(stream);
    return;
  }
  allocator()->recordStream(self.storage().data_ptr(), stream);
}

// ---- convolution ---------------------------------------------------------------------
// aten::convolution and aten::convolution_backward take the boxed fallback (registered
// below), as any op with a CPU kernel does: the CPU's composite kernels then run on host
// memory, with the CPU's checks and bits, and a runtime that records ops can record them
// (its shape rules size their results). Without that, PyTorch's composite kernels call
// the two ops it reserves for out-of-tree backends, here: a call that reaches them directly
// (aten::_convolution) runs the CPU's kernel at once.

at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, c10::SymIntArrayRef stride,
                       c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation, bool transposed,
                       c10::SymIntArrayRef output_padding, c10::SymInt groups) {
  const auto device = input.device().index();
  at::Tensor out;
  {
    LaunchScope launch(device, "convolution");
    std::optional<at::Tensor> host_bias;
    if (bias.has_value() && bias->defined()) host_bias = host_view(*bias);
    out = at::convolution_symint(host_view(input), host_view(weight), host_bias, stride, padding,
                                 dilation, transposed, output_padding, std::move(groups));
  }
  return to_device(out, device);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::SymIntArrayRef stride, c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation,
    bool transposed, c10::SymIntArrayRef output_padding, c10::SymInt groups,
    std::array<bool, 3> output_mask) {
  const auto device = input.device().index();
  // Bias gradient shape: the number of output channels.
  const c10::SymInt out_channels = transposed ? weight.sym_size(1) * groups : weight.sym_size(0);
  std::vector<c10::SymInt> bias_sizes{out_channels};
  at::Tensor gi, gw, gb;
  {
    LaunchScope launch(device, "convolution_backward");
    std::tie(gi, gw, gb) = at::convolution_backward_symint(
        host_view(grad_output), host_view(input), host_view(weight), bias_sizes, stride, padding,
        dilation, transposed, output_padding, std::move(groups), output_mask);
  }
  return {to_device(gi, device), to_device(gw, device), to_device(gb, device)};
}

// ---- module conversion: Parameters keep their identity ---------------------------
// nn.Module._apply and `param.data = t` swap a tensor's data in place (so tied
// weights, optimizers built before the move, lazy modules and parameter attributes
// survive) only when PyTorch calls the old and new tensors shallow-copy compatible.
// It does for dense CPU and CUDA tensors, not for PrivateUse1. A neuron tensor is a
// plain strided TensorImpl over host memory, as a CUDA tensor is over its memory,
// so CPU <-> neuron swaps are as safe as CPU <-> CUDA ones: they get CUDA's answer.
bool is_plain_dense(const at::Tensor& t) {
  const auto keys = t.key_set();
  return t.layout() == c10::kStrided && keys.has(c10::DispatchKey::Dense) &&
         !keys.has_any(c10::python_ks) && (t.device().type() == c10::kCPU || t.device().type() == kNeuron);
}

bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set())) return true;
  return is_plain_dense(self) && is_plain_dense(from);
}

// ---- scaled dot-product attention: pick the backend the CPU would pick ---------
// Without a choice for PrivateUse1, PyTorch takes the unfused math path; with
// the CPU's choice, the fused CPU kernel runs on device memory (fallback).
// torch.compile traces with FakeTensors (neuron tensors over meta storage) and
// functional wrappers (no memory): the choice is made on meta tensors, outside
// the tracer's Python dispatch. The choice looks at requires_grad (e.g. a mask that
// needs a gradient rules out the fused kernels), so they carry it too.
at::Tensor meta_for_choice(const at::Tensor& t) {
  auto m = at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
  if (t.requires_grad()) m.set_requires_grad(true);
  return m;
}

int64_t sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                   const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                   std::optional<double> scale, bool enable_gqa) {
  const bool traced = !query.has_storage() || query.storage().device_type() != kNeuron ||
                      query.storage().data() == nullptr ||
                      query.key_set().has_any(c10::DispatchKeySet({c10::DispatchKey::Python,
                                                                   c10::DispatchKey::Functionalize}));
  if (traced) {
    c10::impl::ExcludeDispatchKeyGuard no_tracer(c10::DispatchKeySet(
        {c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot, c10::DispatchKey::PreDispatch}));
    std::optional<at::Tensor> meta_mask;
    if (attn_mask.has_value() && attn_mask->defined()) meta_mask = meta_for_choice(*attn_mask);
    return at::_fused_sdp_choice(meta_for_choice(query), meta_for_choice(key), meta_for_choice(value), meta_mask,
                                 dropout_p, is_causal, scale, enable_gqa);
  }
  // The CPU's kernel decides on metadata alone (sizes, strides, dtypes, requires_grad; no
  // data, no device check): it takes the neuron tensors as they are, with no host aliases.
  return at::_ops::_fused_sdp_choice::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), query, key, value,
                                                 attn_mask, dropout_p, is_causal, scale, enable_gqa);
}

}  // namespace

void resize_storage_bytes(const c10::Storage& storage, size_t new_size) {
  TORCH_CHECK(storage.resizable(), "neuron: trying to resize a storage that is not resizable");
  auto* impl = storage.unsafeGetStorageImpl();
  if (is_pending(storage) && interceptor().defers_allocation() && new_size >= storage.nbytes()) {
    // Nothing has been written yet: the storage stays pending, in new memory as large, with
    // nothing to copy. (Not smaller: the recorded ops that will write it need its old size
    // when they run.)
    impl->set_data_ptr_noswap(allocate_pending(storage.device().index(), new_size));
    impl->set_nbytes(new_size);
    return;
  }
  // The old bytes are read now: launches that write them finish first.
  auto holder = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), kNeuronKeys,
                                                        caffe2::TypeMeta::Make<uint8_t>());
  interceptor().before_host_access({holder}, Reason::MetadataChange, "resize");
  const auto device = storage.device().index();
  c10::DeviceGuard guard(c10::Device(kNeuron, device));
  c10::DataPtr fresh = allocator()->allocate(new_size);
  const size_t keep = std::min(new_size, storage.nbytes());
  if (keep > 0) std::memcpy(fresh.get(), storage.data(), keep);
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(new_size);
}

}  // namespace neuron

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &neuron::sdp_choice)
}  // namespace at::native

namespace neuron {

void register_native_kernels(torch::Library& m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("_efficientzerotensor", TORCH_FN(efficient_zero_tensor));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("view", TORCH_FN(view));
  m.impl("as_strided", TORCH_FN(as_strided));
  m.impl("_reshape_alias", TORCH_FN(reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage));
  m.impl("set_.source_Storage", TORCH_FN(set_source_storage));
  m.impl("set_.source_Tensor", TORCH_FN(set_source_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("record_stream", TORCH_FN(record_stream));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  m.impl("convolution_overrideable", TORCH_FN(convolution));
  m.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward));
  // convolution and convolution_backward are whole ops on the device (recorded by their shape
  // rules, or run at once): the unboxed path's (unboxed_ops.cpp), not their composite kernels.
  // SDPA asks through the stub below; a direct call (a dispatch mode, a tracer, a user)
  // would otherwise take the fallback, whose host aliases drop requires_grad.
  m.impl("_fused_sdp_choice", TORCH_FN(sdp_choice));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  for (const char* name : {"transpose_", "t_", "squeeze_", "squeeze_.dim", "squeeze_.dims", "unsqueeze_",
                           "as_strided_"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&sync_then_change_metadata>());
  }
}

}  // namespace neuron
