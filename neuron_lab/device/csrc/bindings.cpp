// The Python module neuron_lab.device._C: configuration, generators and the
// runtime's counters. Device, stream, event and memory APIs reach Python
// through PyTorch itself (torch.accelerator, torch.Stream, torch.Event), which
// calls the guard, hooks and allocator registered by the other files.
#include "runtime.h"

#include <pybind11/pybind11.h>
#include <torch/csrc/Event.h>
#include <torch/csrc/Generator.h>

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "Native runtime of the emulated NeuronCore (the `neuron` PyTorch device).";
  m.def("configure", &neuron::configure, py::arg("num_cores"), py::arg("capacity_bytes"),
        "Sets the number of emulated cores and the memory capacity of each.");
  m.def("device_count", []() { return static_cast<int>(neuron::device_count()); });
  m.def("core_capacity", &neuron::core_capacity, "Memory capacity of one core, in bytes.");
  m.def("current_device", []() { return static_cast<int>(neuron::current_device()); });
  m.def("set_device", [](int index) { neuron::set_device(static_cast<c10::DeviceIndex>(index)); });
  m.def("rounded_size", &neuron::rounded_size, py::arg("nbytes"),
        "Bytes the allocator reserves for a request of nbytes.");
  m.def(
      "default_generator",
      [](int index) {
        return py::reinterpret_steal<py::object>(
            THPGenerator_Wrap(neuron::default_generator(static_cast<c10::DeviceIndex>(index))));
      },
        py::arg("index"));
  m.def("num_streams", [](int index) { return neuron::num_streams(static_cast<c10::DeviceIndex>(index)); });
  m.def(
      "stream_launches",
      [](int device, int64_t stream_id) {
        auto& stats = neuron::stream_stats(
            c10::Stream(c10::Stream::UNSAFE, c10::Device(neuron::kNeuron, static_cast<c10::DeviceIndex>(device)),
                        stream_id));
        return py::make_tuple(stats.enqueued.load(), stats.completed.load());
      },
      py::arg("device"), py::arg("stream_id"), "(enqueued, completed) launches of one stream.");
  m.def(
      "event_elapsed_time",
      [](py::handle start, py::handle end) {
        // torch.Event.elapsed_time refuses subclasses such as torch.neuron.Event.
        if (!THPEvent_Check(start.ptr()) || !THPEvent_Check(end.ptr())) {
          throw py::type_error("elapsed_time expects two torch.Event objects");
        }
        auto& a = reinterpret_cast<THPEvent*>(start.ptr())->event;
        auto& b = reinterpret_cast<THPEvent*>(end.ptr())->event;
        return a.elapsedTime(b);
      },
      py::arg("start"), py::arg("end"), "Milliseconds between two recorded timing events.");
  m.def("counters", []() {
    auto& c = neuron::op_counters();
    py::dict d;
    d["fallback_ops"] = c.fallback_ops.load();
    d["output_copies"] = c.output_copies.load();
    d["host_to_device_bytes"] = c.host_to_device_bytes.load();
    d["device_to_host_bytes"] = c.device_to_host_bytes.load();
    d["device_to_device_bytes"] = c.device_to_device_bytes.load();
    return d;
  });
}
