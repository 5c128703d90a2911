// The PrivateUse1 hooks: what torch.accelerator, torch.Generator and the
// autograd engine ask of a backend.
#include "runtime.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>

namespace neuron {
namespace {

struct NeuronHooks final : public at::PrivateUse1HooksInterface {
  void init() const override {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex /*device_index*/) const override { return true; }
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
  bool isPinnedPtr(const void* /*data*/) const override { return false; }
  at::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
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
