// The Python module neuron_lab.device._C.fast_path: the mode of the table of fast host
// kernels (host_kernel_table.h), what it holds, and its families' switches, for the package
// that registers the kernels (neuron_lab.fastpath), its tests and benchmarks.
#include "device/csrc/aten/host_kernel_table.h"
#include "python_submodules.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace py = pybind11;

namespace neuron {
namespace {

const char* mode_name(FastPath mode) {
  switch (mode) {
    case FastPath::Off: return "off";
    case FastPath::On: return "on";
    case FastPath::Validate: return "validate";
  }
  return "?";
}

const char* path_name(HostKernelPath path) {
  switch (path) {
    case HostKernelPath::Boxed: return "boxed";
    case HostKernelPath::AtOnce: return "at_once";
    case HostKernelPath::EmptyResult: return "empty_result";
  }
  return "?";
}

void bind(py::module_& m) {
  m.def("mode", [] { return std::string(mode_name(fast_path())); }, "'off', 'on' or 'validate'.");
  m.def(
      "set_mode",
      [](const std::string& mode) {
        for (FastPath m : {FastPath::Off, FastPath::On, FastPath::Validate}) {
          if (mode == mode_name(m)) return set_fast_path(m);
        }
        TORCH_CHECK(false, "neuron: the fast path's mode is 'off', 'on' or 'validate', not '", mode, "'");
      },
      py::arg("mode"), "Sets how the table is read (host_kernel_table.h).");
  m.def(
      "kernels",
      [] {
        py::list out;
        for (const auto& k : host_kernel_listing()) {
          py::dict d;
          d["op"] = k.op;
          d["path"] = path_name(k.path);
          d["kernel"] = k.info.kernel;
          d["family"] = k.info.family;
          d["mirrors"] = k.info.mirrors;
          out.append(d);
        }
        return out;
      },
      "Every registered kernel: {op, path, kernel, family, mirrors}.");
  m.def("set_family_enabled", &set_family_enabled, py::arg("family"), py::arg("enabled"),
        "Switches one family of kernels on or off (off: ATen's kernels run).");
  m.def("family_enabled", &family_enabled, py::arg("family"));
  m.def("_perturb_kernel_for_tests", &perturb_kernel_for_tests, py::arg("kernel"),
        "Test hook: validate mode flips a bit of this kernel's results ('' for none).");
}

[[maybe_unused]] const bool registered =
    add_python_submodule("fast_path", "The table of fast host kernels (neuron_lab.fastpath).", &bind);

}  // namespace
}  // namespace neuron
