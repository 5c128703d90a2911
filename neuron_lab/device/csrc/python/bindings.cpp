// The Python module neuron_lab.device._C: configuration, generators and the
// runtime's counters. Device, stream, event and memory APIs reach Python
// through PyTorch itself (torch.accelerator, torch.Stream, torch.Event), which
// calls the guard, hooks and allocator registered by the other files.
#include "device/csrc/aten/composite_routes.h"
#include "interpreter.h"
#include "python_submodules.h"
#include "device/csrc/runtime/runtime.h"

#include <ATen/ops/mul.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/zeros.h>
#include <c10/core/AutogradState.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Event.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/Generator.h>

namespace py = pybind11;

namespace neuron {
void register_trace_bindings(py::module& m);   // trace_bindings.cpp
void register_kernel_bindings(py::module& m);  // kernel_bindings.cpp

namespace {
struct Submodule {
  const char* name;
  const char* doc;
  SubmoduleBinder bind;
};
std::vector<Submodule>& submodules() {
  static auto* all = new std::vector<Submodule>();
  return *all;
}
}  // namespace

bool add_python_submodule(const char* name, const char* doc, SubmoduleBinder bind) {
  submodules().push_back({name, doc, bind});
  return true;
}
}  // namespace neuron

namespace {

// One backward pass on autograd's device thread of each core (neuron_lab.device.
// autograd_threads.drain_device_threads): made in C++, so that nothing it holds has a
// Python object the device thread would have to let go of after the caller returned.
void drain_autograd_device_threads() {
  auto& autograd = c10::AutogradState::get_tls_state();
  const bool previous = autograd.get_multithreading_enabled();
  autograd.set_multithreading_enabled(true);  // on the device thread, not this one
  try {
    for (c10::DeviceIndex d = 0; d < neuron::device_count(); ++d) {
      at::AutoGradMode grad(true);
      auto leaf = at::zeros({}, at::TensorOptions().device(c10::Device(neuron::kNeuron, d))).requires_grad_(true);
      auto output = leaf.mul(1.0);
      torch::autograd::backward(torch::autograd::variable_list{output},
                                torch::autograd::variable_list{at::ones_like(output)});
    }
  } catch (...) {
    autograd.set_multithreading_enabled(previous);
    throw;
  }
  autograd.set_multithreading_enabled(previous);
}

// The Python stack of the calling thread, innermost frame first (as CUDA's
// snapshots list them). Takes the GIL; the allocator calls it outside its locks.
neuron::Frames capture_python_stack() {
  if (!neuron::python_can_run()) return nullptr;
  py::gil_scoped_acquire gil;
  auto frames = std::make_shared<std::vector<neuron::Frame>>();
  PyFrameObject* frame = PyEval_GetFrame();
  Py_XINCREF(frame);
  for (int depth = 0; frame != nullptr && depth < 64; ++depth) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    const char* filename = PyUnicode_AsUTF8(code->co_filename);
    const char* name = PyUnicode_AsUTF8(code->co_name);
    frames->push_back({filename ? filename : "?", PyFrame_GetLineNumber(frame), name ? name : "?"});
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  PyErr_Clear();
  return frames;
}

py::list frames_to_list(const neuron::Frames& frames) {
  py::list out;
  if (!frames) return out;
  for (const auto& f : *frames) {
    py::dict d;
    d["filename"] = f.filename;
    d["line"] = f.line;
    d["name"] = f.name;
    out.append(d);
  }
  return out;
}

py::dict snapshot_to_dict(const neuron::MemorySnapshot& snap) {
  py::list segments;
  for (const auto& seg : snap.segments) {
    py::list blocks;
    for (const auto& b : seg.blocks) {
      py::dict block;
      block["address"] = b.address;
      block["size"] = b.size;
      block["requested_size"] = b.requested_size;
      block["state"] = b.state;
      block["frames"] = frames_to_list(b.frames);
      blocks.append(block);
    }
    py::dict d;
    d["device"] = seg.device;
    d["address"] = seg.address;
    d["total_size"] = seg.total_size;
    d["allocated_size"] = seg.allocated_size;
    d["active_size"] = seg.active_size;
    d["requested_size"] = seg.requested_size;
    d["stream"] = seg.stream;
    d["segment_type"] = seg.segment_type;
    d["segment_pool_id"] = py::make_tuple(0, 0);
    d["is_expandable"] = false;
    d["frames"] = py::list();
    d["blocks"] = blocks;
    segments.append(d);
  }
  py::list traces;
  for (const auto& device_trace : snap.device_traces) {
    py::list entries;
    for (const auto& e : device_trace) {
      py::dict d;
      d["action"] = e.action;
      if (e.action != "oom") d["addr"] = e.addr;
      d["size"] = e.size;
      d["stream"] = e.stream;
      d["time_us"] = e.time_us;
      if (e.action == "oom") d["device_free"] = e.device_free;
      d["frames"] = frames_to_list(e.frames);
      entries.append(d);
    }
    traces.append(entries);
  }
  py::dict out;
  out["segments"] = segments;
  out["device_traces"] = traces;
  py::dict settings;
  settings["PYTORCH_NEURON_ALLOC_CONF"] = "rounding to 512 bytes, exact-size block reuse, no splitting";
  out["allocator_settings"] = settings;
  return out;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "Native runtime of the emulated NeuronCore (the `neuron` PyTorch device).";
  // Every kernel of the extension is registered by now (static initializers run first).
  neuron::route_composites_to_cpu_kernels();
  // The device's own submodules first: the layers above use their types (trace.Reason).
  auto trace = m.def_submodule("trace", "Launch records and the event log (neuron_lab.observability).");
  neuron::register_trace_bindings(trace);
  auto kernels = m.def_submodule("kernels", "Host kernels over device memory (neuron_lab.kernels, torch.compile).");
  neuron::register_kernel_bindings(kernels);
  for (const auto& sub : neuron::submodules()) {
    auto module = m.def_submodule(sub.name, sub.doc);
    sub.bind(module);
  }
  m.def("configure", &neuron::configure, py::arg("num_cores"), py::arg("capacity_bytes"),
        "Sets the number of emulated cores and the memory capacity of each.");
  m.def("device_count", []() { return static_cast<int>(neuron::device_count()); });
  m.def(
      "start_device_thread",
      [](int device) {
        py::gil_scoped_release no_gil;
        neuron::start_device_thread(static_cast<c10::DeviceIndex>(device));
      },
      py::arg("device"),
      "Starts the device thread of a core's default stream now (the device's first use) rather "
      "than at its first launch.");
  m.def("in_bad_fork", &neuron::in_bad_fork,
        "Whether this process was forked after its parent started the device (which it then cannot use).");
  m.def("check_not_forked", &neuron::check_not_forked,
        "Raises the device's error in a process forked after its parent started the device.");
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
        auto& s = neuron::stream_state(
            c10::Stream(c10::Stream::UNSAFE, c10::Device(neuron::kNeuron, static_cast<c10::DeviceIndex>(device)),
                        stream_id));
        const uint64_t ran_inline = neuron::stream_ran_inline(s);
        return py::make_tuple(neuron::stream_enqueued(s) + ran_inline, neuron::stream_completed(s) + ran_inline);
      },
      py::arg("device"), py::arg("stream_id"),
      "(enqueued, completed) launches of one stream, ops run at once on a host thread included.");
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
  m.def(
      "record_memory_history",
      [](bool enabled, bool trace, bool stacks, size_t max_entries, bool clear) {
        neuron::set_stack_capturer(&capture_python_stack);
        neuron::record_memory_history(enabled, trace, stacks, max_entries, clear);
      },
      py::arg("enabled"), py::arg("trace"), py::arg("stacks"), py::arg("max_entries"), py::arg("clear"));
  m.def(
      "memory_snapshot",
      []() {
        neuron::MemorySnapshot snap;
        {
          py::gil_scoped_release no_gil;  // allocations on other threads may need the GIL
          snap = neuron::memory_snapshot();
        }
        return snapshot_to_dict(snap);
      },
      "The allocator's segments, blocks and history, as torch.cuda.memory._snapshot() returns them.");
  m.def("drain_autograd_device_threads", &drain_autograd_device_threads, py::call_guard<py::gil_scoped_release>(),
        "Runs one backward pass, made in C++, on autograd's device thread of each core.");
  m.def(
      "cpu_kernel_routes",
      []() {
        py::dict kept;
        for (const auto& k : neuron::kept_composites()) kept[k.op] = k.reason;
        return py::make_tuple(neuron::cpu_kernel_routes(), kept);
      },
      "(ops that run their CPU kernel in place of their CompositeImplicitAutograd decomposition, "
      "{op: why it keeps its decomposition}).");
  m.def(
      "set_launch_runner",
      [](const std::string& name) {
        const neuron::LaunchRunner runner = name == "host"            ? neuron::LaunchRunner::Host
                                            : name == "device_thread" ? neuron::LaunchRunner::DeviceThread
                                            : name == "auto"          ? neuron::LaunchRunner::Auto
                                                                      : throw py::value_error(name);
        neuron::set_launch_runner(runner);
      },
      "Where launches run: 'auto', 'device_thread' or 'host' (neuron_lab/device/launches.py).");
  m.def(
      "launch_runner",
      []() -> std::string {
        switch (neuron::launch_runner()) {
          case neuron::LaunchRunner::Host: return "host";
          case neuron::LaunchRunner::DeviceThread: return "device_thread";
          case neuron::LaunchRunner::Auto: break;
        }
        return "auto";
      });
  m.def("host_runs_launches", &neuron::host_runs_launches, py::arg("intra_op_threads"),
        "Whether a launch whose kernels use this many threads runs on the host thread that launches it.");
  m.def("counters", []() {
    py::dict d;
    for (const auto& [name, value] : neuron::op_counters().read()) d[name] = value;
    return d;
  }, "The device's op and transfer counters (runtime/op_counters.h).");
}
