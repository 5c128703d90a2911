// The Python module neuron_lab.device._C.kernels: what a kernel written in Python
// needs to run as one inline launch over device memory (neuron_lab.kernels and the
// torch.compile backend): wait for the launches using its tensors, CPU aliases of
// device memory (no copies), and a launch scope that the profiler and counters see.
#include "runtime.h"
#include "../../adaptive_eager/csrc/adaptive_eager.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>

namespace py = pybind11;

namespace neuron {
namespace {

// `with InlineLaunch(device, name):` counts the block as one launch of the
// current stream (the caller prepared its tensors first).
class InlineLaunch {
 public:
  InlineLaunch(int device, std::string name) : device_(static_cast<c10::DeviceIndex>(device)), name_(std::move(name)) {}
  void enter() {
    TORCH_CHECK(!scope_, "neuron: this InlineLaunch is already active");
    scope_ = std::make_unique<LaunchScope>(device_, name_.c_str(), /*synced=*/true);
  }
  void exit() { scope_.reset(); }

 private:
  c10::DeviceIndex device_;
  std::string name_;  // outlives the scope, which keeps a pointer to it
  std::unique_ptr<LaunchScope> scope_;
};

}  // namespace

void register_kernel_bindings(py::module& m) {
  m.def(
      "prepare_host_access",
      [](const std::vector<at::Tensor>& reads, const std::vector<at::Tensor>& writes, const std::string& reason) {
        std::vector<at::Tensor> all(reads);
        all.insert(all.end(), writes.begin(), writes.end());
        {
          py::gil_scoped_release no_gil;
          sync_tensors(all, reason);
        }
        for (const auto& t : reads) lazy::check_readable(t);
      },
      py::arg("reads"), py::arg("writes"), py::arg("reason"),
      "Launches what is buffered and waits for every launch using these tensors; "
      "raises if a read tensor was never computed.");
  m.def(
      "host_alias", [](const at::Tensor& t) { return host_view(t); }, py::arg("tensor"),
      "A CPU tensor over the same memory as a neuron tensor (call prepare_host_access first).");
  m.def(
      "note_written",
      [](const std::vector<at::Tensor>& tensors) {
        for (const auto& t : tensors) lazy::note_written(t);
      },
      py::arg("tensors"), "Marks tensors as computed after a host kernel wrote them.");
  m.def(
      "to_device",
      [](const at::Tensor& cpu_tensor, int device) {
        return to_device(cpu_tensor, static_cast<c10::DeviceIndex>(device));
      },
      py::arg("tensor"), py::arg("device"),
      "A new neuron tensor (with device memory) holding a copy of a CPU kernel's result.");
  py::class_<InlineLaunch>(m, "InlineLaunch",
                           "with InlineLaunch(device, name): the block is one launch of the current stream.")
      .def(py::init<int, std::string>(), py::arg("device"), py::arg("name"))
      .def("__enter__", [](InlineLaunch& l) { l.enter(); return &l; }, py::return_value_policy::reference)
      .def("__exit__", [](InlineLaunch& l, py::object, py::object, py::object) {
        l.exit();
        return false;
      });
}

}  // namespace neuron
