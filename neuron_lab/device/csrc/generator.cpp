// Random number generators of the emulated NeuronCores.
//
// A neuron generator carries its state in a CPU (mt19937) generator: random ops
// run the CPU kernel on device memory and are handed that CPU generator. So a
// seeded neuron program draws exactly the numbers the same program draws on the
// CPU, and each core has its own independent default generator.
#include "runtime.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <memory>
#include <mutex>
#include <vector>

namespace neuron {
namespace {

class NeuronGeneratorImpl final : public c10::GeneratorImpl {
 public:
  NeuronGeneratorImpl(c10::DeviceIndex index, at::Generator host)
      : c10::GeneratorImpl(c10::Device(kNeuron, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        host_(std::move(host)) {}

  // Recorded random ops draw when the device executes them: reading or
  // changing the state first lets every op recorded before draw as in eager.
  void set_current_seed(uint64_t seed) override {
    settle();
    host_.set_current_seed(seed);
  }
  void set_offset(uint64_t offset) override {
    settle();
    host_.set_offset(offset);
  }
  uint64_t get_offset() const override {
    settle();
    return host_.get_offset();
  }
  uint64_t current_seed() const override { return host_.current_seed(); }
  uint64_t seed() override {
    settle();
    return host_.seed();
  }
  void set_state(const c10::TensorImpl& new_state) override {
    settle();
    host_.unsafeGetGeneratorImpl()->set_state(new_state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    settle();
    return host_.unsafeGetGeneratorImpl()->get_state();
  }
  static c10::DeviceType device_type() { return kNeuron; }

  const at::Generator& host() const { return host_; }

 private:
  NeuronGeneratorImpl* clone_impl() const override {
    return new NeuronGeneratorImpl(device().index(), host_.clone());
  }

  static void settle() {
    if (!on_device_thread() && !in_bad_fork()) synchronize_all(Reason::RandomState);
  }

  at::Generator host_;
};

std::once_flag g_defaults_once;
std::vector<at::Generator>* g_defaults = nullptr;  // leaked: generators outlive exit

}  // namespace

at::Generator new_generator(c10::DeviceIndex index) {
  index = resolve_device(index);
  return at::make_generator<NeuronGeneratorImpl>(index, at::detail::createCPUGenerator());
}

const at::Generator& default_generator(c10::DeviceIndex index) {
  index = resolve_device(index);
  std::call_once(g_defaults_once, [] {
    g_defaults = new std::vector<at::Generator>();
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      g_defaults->push_back(at::make_generator<NeuronGeneratorImpl>(
          d, at::detail::createCPUGenerator(c10::default_rng_seed_val)));
    }
  });
  return (*g_defaults)[index];
}

at::Generator host_generator(const at::Generator& neuron_generator) {
  auto* impl = dynamic_cast<NeuronGeneratorImpl*>(neuron_generator.unsafeGetGeneratorImpl());
  TORCH_CHECK(impl != nullptr, "expected a neuron generator, got one on ", neuron_generator.device());
  return impl->host();
}

}  // namespace neuron
