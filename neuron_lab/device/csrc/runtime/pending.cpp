// Pending storages: the results of recorded ops, whose values no launch has computed yet.
//
// A pending storage gets its block of device memory when it is made, as a CUDA tensor
// does, so that its address (data_ptr(), the storage's identity for safetensors,
// torch.save, DDP's buckets and FSDP) is its own and stays the same once the value
// arrives. The block counts in the memory statistics only once the storage is known to
// outlive its launch (materialize), or is read while alive (statistics and snapshots
// materialize every live one): a pending result that nothing outside its fused graph
// holds when the graph launches (a dead intermediate) gives its block back uncounted, and
// the graph computes it in host scratch instead (adaptive_eager/csrc/scratch.cpp), as
// on-chip memory would hold it.
#include "runtime.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <mutex>
#include <vector>

namespace neuron {
namespace {

std::mutex& materialize_mutex() {
  static auto* m = new std::mutex();
  return *m;
}

// Every pending storage, weakly: memory statistics count the live ones.
std::mutex& registry_mutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>>& registry() {
  static auto* r = new std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>>();
  return *r;
}
size_t g_registry_sweep_at = 1024;

void register_pending(const c10::intrusive_ptr<c10::StorageImpl>& storage) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& r = registry();
  if (r.size() >= g_registry_sweep_at) {
    r.erase(std::remove_if(r.begin(), r.end(),
                           [](const auto& w) {
                             if (w.expired()) return true;
                             auto s = w.lock();
                             return !s || !is_pending(c10::Storage(s));
                           }),
            r.end());
    g_registry_sweep_at = std::max<size_t>(1024, 2 * r.size());
  }
  r.emplace_back(storage);
}

// Whether a pending storage of the device is alive (a recorded op's result, which holds its
// block until its launch runs).
bool any_pending_on(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (const auto& w : registry()) {
    auto s = w.lock();
    if (s && s->device().index() == device && is_pending(c10::Storage(std::move(s)))) return true;
  }
  return false;
}

// Device memory for a new pending storage. Recorded ops that nothing holds any more still
// hold their results' memory until their launch runs; out of memory, those launches run
// and give it back (their dead intermediates move to scratch), and the request is tried
// once more before the allocator's OutOfMemoryError reaches the caller (and counts, once,
// in torch.neuron.memory_stats()["num_ooms"]).
c10::DataPtr allocate_pending_or_wait(c10::DeviceIndex device, size_t nbytes) {
  if (on_device_thread()) return allocate_pending(device, nbytes);
  if (c10::DataPtr memory = try_allocate_pending(device, nbytes)) return memory;
  // Nothing queued or recorded holds memory: waiting frees nothing (and would show as a wait).
  if (device_quiet() && !any_pending_on(device)) return allocate_pending(device, nbytes);
  synchronize_device(device, Reason::OutOfMemory);
  release_finished_work();
  return allocate_pending(device, nbytes);
}

}  // namespace

void materialize_all_pending(c10::DeviceIndex device) {
  std::vector<c10::Storage> alive;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto& r = registry();
    std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> keep;
    for (auto& w : r) {
      auto s = w.lock();
      if (!s) continue;
      c10::Storage st(std::move(s));
      if (!is_pending(st)) continue;
      if (st.device().index() == device) {
        alive.push_back(std::move(st));
      } else {
        keep.emplace_back(w);
      }
    }
    r.swap(keep);
  }
  for (auto& st : alive) materialize(st);
}

bool is_pending(const c10::Storage& storage) { return storage.nbytes() > 0 && is_pending(storage.data_ptr()); }

void materialize(const c10::Storage& storage) {
  if (!is_pending(storage)) return;
  std::lock_guard<std::mutex> lock(materialize_mutex());
  mark_computed(storage.unsafeGetStorageImpl()->mutable_data_ptr());
}

at::Tensor empty_pending(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype,
                         c10::DeviceIndex device) {
  const auto itemsize = c10::elementSize(dtype);
  const size_t nbytes = at::detail::computeStorageNbytes(sizes, strides, itemsize);
  const c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  if (nbytes == 0) {  // nothing to compute, nothing to hold
    c10::DeviceGuard guard(c10::Device(kNeuron, device));
    return at::detail::empty_strided_generic(sizes, strides, allocator(), keys, dtype);
  }
  auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                       allocate_pending_or_wait(device, nbytes), allocator(),
                                                       /*resizable=*/true);
  register_pending(storage);
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), keys, c10::scalarTypeToTypeMeta(dtype));
  tensor.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
  return tensor;
}

}  // namespace neuron
