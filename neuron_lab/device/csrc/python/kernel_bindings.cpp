// The Python module neuron_lab.device._C.kernels: what a kernel written in Python
// needs to run as one inline launch over device memory (neuron_lab.kernels and the
// torch.compile backend): wait for the launches using its tensors, CPU aliases of
// device memory (no copies), a launch scope that the profiler and counters see, and
// results adopted into device memory without copies.
#include "device/csrc/runtime/runtime.h"
#include "device/csrc/runtime/interceptor.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>

namespace py = pybind11;

namespace neuron {
namespace {

// `with InlineLaunch(device, name):` counts the block as one launch of the
// current stream (the caller prepared its tensors first). With
// device_memory=True, CPU tensors the block allocates take device memory, so
// that adopt() turns its results into neuron tensors without copies.
// A uint8 tensor over a whole neuron storage given as a Python UntypedStorage: what the
// interceptor's per-tensor calls take.
at::Tensor storage_holder(py::handle storage_object) {
  TORCH_CHECK(THPStorage_Check(storage_object.ptr()), "neuron: expected an UntypedStorage");
  const c10::Storage& storage = THPStorage_Unpack(storage_object.ptr());
  TORCH_CHECK(storage.device_type() == kNeuron, "neuron: expected a neuron storage, got ", storage.device());
  auto holder = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(storage), kNeuronKeys, caffe2::TypeMeta::Make<uint8_t>());
  holder.unsafeGetTensorImpl()->set_sizes_contiguous({static_cast<int64_t>(storage.nbytes())});
  return holder;
}

class InlineLaunch {
 public:
  InlineLaunch(int device, std::string name, bool device_memory)
      : device_(static_cast<c10::DeviceIndex>(device)), name_(std::move(name)), device_memory_(device_memory) {}
  void enter() {
    TORCH_CHECK(!scope_, "neuron: this InlineLaunch is already active");
    scope_ = std::make_unique<LaunchScope>(device_, name_.c_str(), /*synced=*/true);
    if (device_memory_) allocations_ = std::make_unique<HostAllocationsOnDevice>(device_);
  }
  void exit() {
    allocations_.reset();
    scope_.reset();
  }

 private:
  c10::DeviceIndex device_;
  std::string name_;  // outlives the scope, which keeps a pointer to it
  bool device_memory_;
  std::unique_ptr<LaunchScope> scope_;
  std::unique_ptr<HostAllocationsOnDevice> allocations_;
};

}  // namespace

void register_kernel_bindings(py::module& m) {
  m.def(
      "prepare_storage_access",
      [](py::handle storage_object, const std::string& what, bool write) {
        const at::Tensor holder = storage_holder(storage_object);
        {
          py::gil_scoped_release no_gil;
          interceptor().before_host_access(std::vector<at::Tensor>{holder}, Reason::CopyToHost, what);
        }
        if (!write) interceptor().check_readable(holder);
      },
      py::arg("storage"), py::arg("what"), py::arg("write"),
      "Launches what is buffered and waits for every launch that uses this neuron storage, before the "
      "host reads or writes its raw memory (UntypedStorage._write_file / _set_from_file); a read raises "
      "if its values were never computed.");
  m.def(
      "note_storage_written", [](py::handle storage_object) { interceptor().note_written(storage_holder(storage_object)); },
      py::arg("storage"), "Marks a neuron storage as computed after the host wrote its raw memory.");
  m.def("host_allocations_device", [] { return static_cast<int>(host_allocations_device()); },
        "The core whose memory this thread's CPU allocations take now (inside "
        "InlineLaunch(..., device_memory=True)), or -1.");
  m.def(
      "prepare_host_access",
      [](const std::vector<at::Tensor>& reads, const std::vector<at::Tensor>& writes, const std::string& what,
         Reason reason) {
        std::vector<at::Tensor> all(reads);
        all.insert(all.end(), writes.begin(), writes.end());
        {
          py::gil_scoped_release no_gil;
          interceptor().before_host_access(all, reason, what);
        }
        for (const auto& t : reads) interceptor().check_readable(t);
      },
      py::arg("reads"), py::arg("writes"), py::arg("what"), py::arg("reason") = Reason::CustomKernel,
      "Launches what is buffered and waits for every launch using these tensors; "
      "raises if a read tensor was never computed.");
  m.def(
      "host_alias", [](const at::Tensor& t) { return host_view(t); }, py::arg("tensor"),
      "A CPU tensor over the same memory as a neuron tensor (call prepare_host_access first).");
  m.def(
      "note_written",
      [](const std::vector<at::Tensor>& tensors) {
        for (const auto& t : tensors) interceptor().note_written(t);
      },
      py::arg("tensors"), "Marks tensors as computed after a host kernel wrote them.");
  m.def(
      "adopt",
      [](const py::sequence& values, int device, const std::vector<at::Tensor>& host_inputs,
         const std::vector<at::Tensor>& inputs) {
        TORCH_CHECK(host_inputs.size() == inputs.size(), "adopt: host_inputs and inputs differ in length");
        HostResults results(static_cast<c10::DeviceIndex>(device));
        for (size_t i = 0; i < inputs.size(); ++i) results.add_input(host_inputs[i], inputs[i]);
        py::list out;
        for (const auto& v : values) {
          if (THPVariable_Check(v.ptr())) {
            out.append(results.adopt(THPVariable_Unpack(v.ptr())));
          } else {
            out.append(v);
          }
        }
        return out;
      },
      py::arg("values"), py::arg("device"), py::arg("host_inputs") = std::vector<at::Tensor>(),
      py::arg("inputs") = std::vector<at::Tensor>(),
      "A host kernel's results as neuron tensors, without copies where possible: CPU tensors "
      "allocated inside InlineLaunch(..., device_memory=True) keep their memory, views of "
      "host_inputs[i] become views of inputs[i]; other tensors are copied and other values pass.");
  py::class_<InlineLaunch>(m, "InlineLaunch",
                           "with InlineLaunch(device, name, device_memory=False): the block is one launch of "
                           "the current stream; with device_memory=True its CPU allocations take device memory.")
      .def(py::init<int, std::string, bool>(), py::arg("device"), py::arg("name"), py::arg("device_memory") = false)
      .def("__enter__", [](InlineLaunch& l) { l.enter(); return &l; }, py::return_value_policy::reference)
      .def("__exit__", [](InlineLaunch& l, py::object, py::object, py::object) {
        l.exit();
        return false;
      });
}

}  // namespace neuron
