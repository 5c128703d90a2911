// Ops whose CPU kernel the device runs in place of their composite decomposition
// (composite_routes.cpp).
#pragma once

#include <string>
#include <vector>

namespace neuron {

struct KeptComposite {
  const char* op;      // "aten::name.overload"
  const char* reason;  // why the device keeps the decomposition
};

// Registers the fallback for every op with a CPU kernel and a CompositeImplicitAutograd
// kernel and no neuron kernel, but those kept_composites() lists. Once, after the
// extension's own kernels are registered (the extension's module init).
void route_composites_to_cpu_kernels();
// The ops routed so far ("aten::silu_backward"), and the ones kept composite.
std::vector<std::string> cpu_kernel_routes();
const std::vector<KeptComposite>& kept_composites();

}  // namespace neuron
