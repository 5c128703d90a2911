// Ops that run their CPU kernel on the device instead of their composite decomposition.
//
// An op may have both a CPU kernel and a CompositeImplicitAutograd kernel (silu_backward,
// mish_backward: a fused CPU loop, and a decomposition into sigmoid, mul, ...). The
// dispatcher gives a backend without a kernel of its own the decomposition, at its
// autograd key at least, while the CPU (and CUDA) run their kernel: the device's results
// then round differently from the CPU's (silu_backward: half the elements differ in the
// last bit). Registering the fallback for such an op makes the device run the op's CPU
// kernel, and its autograd entry the op's derivative formula, as on the CPU.
//
// The ops are found in the dispatcher when the extension loads (after every kernel of
// this extension is registered), so an op a new torch adds to the class is routed too.
#include "composite_routes.h"
#include "device/csrc/runtime/runtime.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>

namespace neuron {
namespace {

// Ops of the class that keep their decomposition on the device, and why.
const std::vector<KeptComposite>& kept() {
  static const auto* list = new std::vector<KeptComposite>{
      {"aten::native_channel_shuffle",
       "its CPU kernel has no derivative formula (the CPU raises in backward) while CUDA, which has no kernel, "
       "runs the decomposition, which autograd differentiates; it only moves elements, so its bits are the "
       "CPU's either way"},
  };
  return *list;
}

std::string full_name(const c10::OperatorName& name) {
  return name.name + (name.overload_name.empty() ? "" : "." + name.overload_name);
}

bool is_kept(const c10::OperatorName& name) {
  const std::string full = full_name(name);
  for (const auto& k : kept()) {
    if (full == k.op) return true;
  }
  return false;
}

std::mutex& routes_mutex() {
  static auto* m = new std::mutex();
  return *m;
}

std::vector<std::string>& routed() {
  static auto* names = new std::vector<std::string>();
  return *names;
}

}  // namespace

const std::vector<KeptComposite>& kept_composites() { return kept(); }

std::vector<std::string> cpu_kernel_routes() {
  std::lock_guard<std::mutex> lock(routes_mutex());
  return routed();
}

void route_composites_to_cpu_kernels() {
  std::lock_guard<std::mutex> lock(routes_mutex());
  static bool done = false;
  if (done) return;
  done = true;
  // One library per namespace; they live as long as the process (the registrations do).
  static auto* libraries = new std::map<std::string, std::unique_ptr<torch::Library>>();
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getAllOpNames()) {
    const auto op = dispatcher.findOp(name);
    if (!op.has_value()) continue;
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) || is_kept(name)) {
      continue;
    }
    const auto sep = name.name.find("::");
    if (sep == std::string::npos) continue;
    const std::string ns = name.name.substr(0, sep);
    auto& library = (*libraries)[ns];
    if (!library) {
      library = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1,
                                                 __FILE__, __LINE__);
    }
    const std::string unqualified = full_name(name).substr(sep + 2);
    library->impl(unqualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
    routed().push_back(full_name(name));
  }
}

}  // namespace neuron
