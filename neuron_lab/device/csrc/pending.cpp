// Pending memory: storages of recorded results that have no device memory yet.
//
// Every pending storage points at one read-only region of zero pages reserved
// at start-up (virtual address space only, no physical memory), so a read that
// slips past the runtime's synchronization sees zeros and never crashes the
// process. Memory is given when a launch is flushed (materialize); the runtime
// gives the dead intermediates of a fused graph host scratch outside the allocator.
#include "runtime.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <mutex>
#include <sys/mman.h>

namespace neuron {
namespace {

void no_delete(void* /*ctx*/) {}

struct ZeroRegion {
  void* base = nullptr;
  size_t size = 0;
};

const ZeroRegion& zero_region() {
  static const ZeroRegion region = [] {
    ZeroRegion r;
    r.size = static_cast<size_t>(std::max<int64_t>(core_capacity(), int64_t(1) << 20));
    void* p = mmap(nullptr, r.size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    TORCH_CHECK(p != MAP_FAILED, "neuron: could not reserve ", r.size,
                " bytes of address space for pending tensors; lower NEURON_LAB_CORE_MEMORY");
    r.base = p;
    return r;
  }();
  return region;
}

std::mutex& materialize_mutex() {
  static auto* m = new std::mutex();
  return *m;
}

// Every pending storage, weakly: memory statistics give the live ones memory.
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

c10::DataPtr pending_data_ptr(c10::DeviceIndex device) {
  return c10::DataPtr(zero_region().base, nullptr, &no_delete, c10::Device(kNeuron, device));
}

bool is_pending(const c10::DataPtr& data_ptr) { return data_ptr.get_deleter() == &no_delete; }

bool is_pending(const c10::Storage& storage) {
  return storage.nbytes() > 0 && is_pending(storage.data_ptr());
}

void materialize(const c10::Storage& storage) {
  if (!is_pending(storage)) return;
  std::lock_guard<std::mutex> lock(materialize_mutex());
  if (!is_pending(storage)) return;
  c10::DeviceGuard guard(storage.device());
  auto data = allocator()->allocate(storage.nbytes());
  storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(data));
}

at::Tensor empty_pending(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype,
                         c10::DeviceIndex device) {
  const auto itemsize = c10::elementSize(dtype);
  const size_t nbytes = at::detail::computeStorageNbytes(sizes, strides, itemsize);
  const c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  if (nbytes == 0 || nbytes > zero_region().size || static_cast<int64_t>(nbytes) > core_capacity()) {
    // Empty tensors need no memory; oversized ones get the allocator's OOM error now.
    c10::DeviceGuard guard(c10::Device(kNeuron, device));
    return at::detail::empty_strided_generic(sizes, strides, allocator(), keys, dtype);
  }
  auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                       pending_data_ptr(device), allocator(),
                                                       /*resizable=*/true);
  register_pending(storage);
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), keys,
                                                         c10::scalarTypeToTypeMeta(dtype));
  tensor.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
  return tensor;
}

}  // namespace neuron
