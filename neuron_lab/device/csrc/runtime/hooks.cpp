// The PrivateUse1 hooks: what torch.accelerator, torch.Generator and the
// autograd engine ask of a backend.
#include "runtime.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <cstdint>
#include <map>
#include <mutex>

namespace neuron {
namespace {

// Pinned host memory. Device memory is host memory and a copy from the host stages its
// source at once, so any host buffer may feed an asynchronous copy; what pinning adds
// is the answer of is_pinned(), which callers check (DDP's reducer asserts that its
// pinned staging tensor is pinned). This allocator remembers the blocks it handed out.
class PinnedAllocator final : public at::Allocator {
 public:
  at::DataPtr allocate(size_t nbytes) override {
    void* data = nbytes > 0 ? c10::alloc_cpu(nbytes) : nullptr;
    if (data != nullptr) {
      std::lock_guard<std::mutex> lock(mutex());
      blocks()[reinterpret_cast<uintptr_t>(data)] = nbytes;
    }
    return {data, data, &release, c10::Device(c10::kCPU)};
  }
  at::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // Whether `data` points into a block of this allocator (a view's pointer may be inside).
  static bool owns(const void* data) {
    const auto address = reinterpret_cast<uintptr_t>(data);
    std::lock_guard<std::mutex> lock(mutex());
    auto next = blocks().upper_bound(address);
    if (next == blocks().begin()) return false;
    const auto& [start, size] = *std::prev(next);
    return address < start + size;
  }

 private:
  static void release(void* data) {
    {
      std::lock_guard<std::mutex> lock(mutex());
      blocks().erase(reinterpret_cast<uintptr_t>(data));
    }
    c10::free_cpu(data);
  }
  // Never destroyed: tensors may be freed during static destruction.
  static std::mutex& mutex() {
    static auto* m = new std::mutex();
    return *m;
  }
  static std::map<uintptr_t, size_t>& blocks() {
    static auto* b = new std::map<uintptr_t, size_t>();
    return *b;
  }
};

PinnedAllocator& pinned_allocator() {
  static auto* allocator = new PinnedAllocator();
  return *allocator;
}

struct NeuronHooks final : public at::PrivateUse1HooksInterface {
  void init() const override {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  // A child forked after the device started has none (the autograd engine then leaves the
  // device's streams alone in a CPU-only backward).
  bool hasPrimaryContext(c10::DeviceIndex /*device_index*/) const override { return !in_bad_fork(); }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex device) const override { set_device(device); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    auto previous = current_device();
    set_device(device);
    return previous;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    if (device < 0 || device >= device_count()) return current_device();
    return exchangeDevice(device);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return new_generator(device_index);
  }
  at::Device getDeviceFromPtr(void* /*data*/) const override {
    // Device memory is host memory: a bare pointer does not tell which core owns it.
    TORCH_CHECK(false, "neuron: cannot tell the device of a raw pointer; pass a tensor instead");
  }
  bool isPinnedPtr(const void* data) const override { return PinnedAllocator::owns(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override;
};

}  // namespace

void NeuronHooks::resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const {
  resize_storage_bytes(storage, newsize);
}

static bool g_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new NeuronHooks());
  return true;
}();

}  // namespace neuron
