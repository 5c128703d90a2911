// Layers above the device add their Python submodules to neuron_lab.device._C when the
// extension loads (the adaptive-eager runtime adds _C.adaptive), without the device
// knowing them: each registers a binder from a static initializer of its own file.
#pragma once

#include <pybind11/pybind11.h>

namespace neuron {

using SubmoduleBinder = void (*)(pybind11::module_& m);
// Returns true, for use as the value of that static initializer.
bool add_python_submodule(const char* name, const char* doc, SubmoduleBinder bind);

}  // namespace neuron
