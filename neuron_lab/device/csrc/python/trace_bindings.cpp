// The Python module neuron_lab.device._C.trace: launch records, memory samples,
// running totals and the event log, as plain Python values (trace.h).
#include "device/csrc/runtime/runtime.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/DynamicTypes.h>

#include <cctype>
#include <string>
#include <vector>

namespace py = pybind11;

namespace neuron {
namespace {

// Python's LaunchKind and EventKind: str enums (enum.StrEnum) made here from the C++ kinds'
// names, so that the two sides list the same kinds. A member equals its word (LaunchKind.GRAPH
// == "graph"), so code that compares kinds with their words reads typed values unchanged.
struct KindEnums {
  py::object launch_kind, event_kind;
  std::vector<py::object> launch_members, event_members;  // indexed by the C++ kind
};
KindEnums* g_kinds = nullptr;  // made once by register_trace_bindings, never freed (outlives Python)

template <class Kind>
py::object str_enum(const char* name, int count, const char* (*word)(Kind), std::vector<py::object>& members) {
  py::list items;
  for (int k = 0; k < count; ++k) {
    std::string member = word(static_cast<Kind>(k));
    for (auto& c : member) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    items.append(py::make_tuple(member, word(static_cast<Kind>(k))));
  }
  py::object cls = py::module_::import("enum").attr("StrEnum")(name, items, py::arg("module") = "neuron_lab.device.trace",
                                                                py::arg("qualname") = name);
  for (int k = 0; k < count; ++k) members.push_back(cls(word(static_cast<Kind>(k))));
  return cls;
}

// The C++ kind of a Python EventKind or its word; raises ValueError naming the kinds otherwise.
trace::EventKind event_kind_of(const py::object& kind) {
  const std::string word = py::str(g_kinds->event_kind(kind));
  for (int k = 0; k < trace::kEventKinds; ++k) {
    if (word == trace::event_kind_name(static_cast<trace::EventKind>(k))) return static_cast<trace::EventKind>(k);
  }
  throw py::value_error("neuron: unknown event kind " + word);
}

py::object source_tuple(trace::Source s) {
  if (s.file < 0) return py::none();
  const auto f = trace::frame(s);
  return py::make_tuple(f.file, f.line, f.function);
}

py::object op_value(const trace::OpValue& v) {
  using Kind = trace::OpValue::Kind;
  switch (v.kind) {
    case Kind::Tensor: {
      auto* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<c10::ScalarType>(v.dtype)));
      return py::make_tuple("tensor", py::reinterpret_borrow<py::object>(dtype), py::tuple(py::cast(v.ints)));
    }
    case Kind::Tensors: return py::make_tuple("tensors", v.ints.empty() ? 0 : v.ints.front());
    case Kind::Int: return py::int_(v.ints.empty() ? 0 : v.ints.front());
    case Kind::Double: return py::float_(v.number);
    case Kind::Bool: return py::bool_(v.number != 0);
    case Kind::Ints: return py::list(py::cast(v.ints));
    case Kind::None: return py::none();
    case Kind::Other: break;
  }
  return py::make_tuple("other");
}

py::list op_values(const std::vector<trace::OpValue>& values) {
  py::list out;
  for (const auto& v : values) out.append(op_value(v));
  return out;
}

py::dict launch_dict(const trace::LaunchRecord& r) {
  py::dict d;
  d["id"] = r.id;
  d["kind"] = g_kinds->launch_members[static_cast<size_t>(r.kind)];
  d["name"] = r.name;
  d["device"] = r.device;
  d["stream"] = r.stream;
  d["enqueue_ns"] = r.enqueue_ns;
  d["start_ns"] = r.start_ns.load();
  d["end_ns"] = r.end_ns.load();
  d["n_ops"] = r.n_ops;
  d["graph_id"] = r.graph_id;
  d["tier"] = trace::tier_name(r.tier.load());
  d["status"] = trace::status_name(r.status.load());
  d["bytes_allocated"] = r.bytes_allocated;
  d["source"] = source_tuple(r.source);
  py::list ops;
  for (const auto& o : r.ops) {
    py::dict od;
    od["name"] = o.name;
    od["inputs"] = o.inputs;
    od["source"] = source_tuple(o.source);
    od["host_ns"] = o.host_ns;
    od["device_ns"] = o.device_ns;
    od["overload"] = o.overload;
    od["args"] = op_values(o.args);
    od["results"] = op_values(o.results);
    od["record_start_ns"] = o.record_start_ns;
    od["correlation"] = o.correlation;
    ops.append(std::move(od));
  }
  d["ops"] = std::move(ops);
  d["correlation"] = r.correlation;
  return d;
}

py::dict profile_dict(const trace::Profile& p) {
  py::list launches;
  for (const auto& r : p.launches) launches.append(launch_dict(*r));
  py::list memory;
  for (const auto& s : p.memory) memory.append(py::make_tuple(s.time_ns, s.device, s.allocated, s.reserved));
  py::dict d;
  d["launches"] = std::move(launches);
  d["memory"] = std::move(memory);
  d["start_ns"] = p.start_ns;
  d["end_ns"] = p.end_ns;
  return d;
}

trace::OpCost op_cost(const py::handle& value) {
  trace::OpCost c;
  if (value.is_none()) return c;
  auto t = value.cast<py::tuple>();
  c.flops = t[0].cast<double>();
  c.bytes = t[1].cast<double>();
  c.modelled_ns = t[2].cast<double>();
  return c;
}

// The annotator from Python: f(profile dict) -> {"files": {path: name}, "launches":
// {launch id: ((flops, bytes, modelled_ns), [(flops, bytes, modelled_ns) per op])}}.
trace::ProfileNotes call_annotator(const py::object& annotator, const trace::Profile& p) {
  trace::ProfileNotes notes;
  if (!Py_IsInitialized()) return notes;
  py::gil_scoped_acquire gil;
  try {
    py::dict out = annotator(profile_dict(p));
    if (out.contains("files")) {
      for (auto item : out["files"].cast<py::dict>()) {
        notes.file_names[item.first.cast<std::string>()] = item.second.cast<std::string>();
      }
    }
    if (out.contains("launches")) {
      for (auto item : out["launches"].cast<py::dict>()) {
        const auto id = item.first.cast<int64_t>();
        auto pair = item.second.cast<py::tuple>();
        notes.launch_costs[id] = op_cost(pair[0]);
        auto& ops = notes.op_costs[id];
        for (auto op : pair[1].cast<py::list>()) ops.push_back(op_cost(op));
      }
    }
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("neuron_lab: the profile annotator (source names, modelled time) failed");
  } catch (const std::exception& e) {
    PyErr_WarnEx(PyExc_RuntimeWarning, (std::string("neuron_lab: the profile annotator failed: ") + e.what()).c_str(), 1);
  }
  return notes;
}

py::dict event_dict(const trace::Event& e) {
  py::dict d;
  d["time_ns"] = e.time_ns;
  d["duration_ns"] = e.duration_ns;
  d["kind"] = g_kinds->event_members[static_cast<size_t>(e.kind)];
  d["reason"] = e.reason;
  d["what"] = e.what;
  d["detail"] = e.detail;
  d["source"] = source_tuple(e.source);
  d["device"] = e.device;
  d["graph_id"] = e.graph_id;
  d["by_profiler"] = e.by_profiler;
  return d;
}

}  // namespace

void register_trace_bindings(py::module& m) {
  g_kinds = new KindEnums();
  g_kinds->launch_kind = str_enum<trace::LaunchKind>("LaunchKind", trace::kLaunchKinds, &trace::launch_kind_name,
                                                     g_kinds->launch_members);
  g_kinds->event_kind = str_enum<trace::EventKind>("EventKind", trace::kEventKinds, &trace::event_kind_name,
                                                   g_kinds->event_members);
  m.attr("LaunchKind") = g_kinds->launch_kind;
  m.attr("EventKind") = g_kinds->event_kind;
  // Why the host waited or a buffer was launched; str(reason) is its words ("copy to host").
  py::enum_<Reason> reason(m, "Reason", "Why the host waits for the device or the runtime launches its buffer.");
  reason.value("NONE", Reason::None);
  reason.value("HOST_READ", Reason::HostRead);
  reason.value("COPY_TO_HOST", Reason::CopyToHost);
  reason.value("COPY_FROM_HOST", Reason::CopyFromHost);
  reason.value("COPY_BETWEEN_CORES", Reason::CopyBetweenCores);
  reason.value("INLINE_OP", Reason::InlineOp);
  reason.value("METADATA_CHANGE", Reason::MetadataChange);
  reason.value("CUSTOM_KERNEL", Reason::CustomKernel);
  reason.value("COMPILED_GRAPH", Reason::CompiledGraph);
  reason.value("COLLECTIVE", Reason::Collective);
  reason.value("SYNCHRONIZE", Reason::Synchronize);
  reason.value("EVENT_SYNCHRONIZE", Reason::EventSynchronize);
  reason.value("EVENT_RECORD", Reason::EventRecord);
  reason.value("STREAM_QUERY", Reason::StreamQuery);
  reason.value("STREAM_WAIT", Reason::StreamWait);
  reason.value("STREAM_SWITCH", Reason::StreamSwitch);
  reason.value("MEMORY_STATISTICS", Reason::MemoryStatistics);
  reason.value("MEMORY_SNAPSHOT", Reason::MemorySnapshot);
  reason.value("OUT_OF_MEMORY", Reason::OutOfMemory);
  reason.value("RANDOM_STATE", Reason::RandomState);
  reason.value("RANDOM_OP", Reason::RandomOp);
  reason.value("MODE_CHANGE", Reason::ModeChange);
  reason.value("EXIT", Reason::Exit);
  reason.value("EXPLICIT_FLUSH", Reason::ExplicitFlush);
  reason.value("EAGER", Reason::Eager);
  reason.value("OP_LIMIT", Reason::OpLimit);
  reason.value("THREAD_SWITCH", Reason::ThreadSwitch);
  reason.value("BACKWARD_START", Reason::BackwardStart);
  reason.value("CACHED_GRAPH_END", Reason::CachedGraphEnd);
  reason.value("DEVICE_IDLE", Reason::DeviceIdle);
  reason.value("RESULT_BYTES", Reason::ResultBytes);
  reason.value("PROBE_MISS", Reason::ProbeMiss);
  reason.value("COMPILED_GRAPH_END", Reason::CompiledGraphEnd);
  reason.def_property_readonly("words", [](Reason r) { return reason_name(r); },
                               "The reason in words, as counters and explanations show it.");
  m.def("now_ns", &trace::now_ns, "The runtime's clock (time.monotonic_ns()).");
  m.def(
      "set_library_prefixes", [](std::vector<std::string> prefixes) { trace::set_library_prefixes(std::move(prefixes)); },
      py::arg("prefixes"), "Files under these prefixes are library code, skipped when looking for the user's line.");
  m.def("start_profile", &trace::start_profile, "Starts collecting launch records; returns a handle.");
  m.def(
      "stop_profile",
      [](int handle) {
        trace::Profile p;
        {
          py::gil_scoped_release no_gil;
          p = trace::stop_profile(handle);
        }
        return profile_dict(p);
      },
      py::arg("handle"), "Stops a profile: its launches and memory samples.");
  m.def("last_torch_profile", []() { return profile_dict(trace::last_torch_profile()); },
        "The launches and memory samples of torch.profiler's latest trace of the device (its device lanes).");
  m.def(
      "set_profile_annotator",
      [](py::object annotator) {
        if (annotator.is_none()) {
          trace::set_profile_annotator(nullptr);
          return;
        }
        // Kept for the life of the process: torch.profiler may stop a trace during shutdown.
        auto* kept = new py::object(std::move(annotator));
        trace::set_profile_annotator([kept](const trace::Profile& p) { return call_annotator(*kept, p); });
      },
      py::arg("annotator"),
      "Registers f(profile dict) -> {'files': {path: name}, 'launches': {id: (cost, [op costs])}} for "
      "torch.profiler's device lanes (cost: (flops, bytes, modelled_ns)); None unregisters it.");
  m.def("enter_profiler_waits", &trace::enter_profiler_waits,
        "From now until exit_profiler_waits(), host waits on this thread are the profiler's own.");
  m.def("exit_profiler_waits", []() {
    TORCH_CHECK(trace::profiler_waits(), "neuron: exit_profiler_waits() without enter_profiler_waits()");
    trace::exit_profiler_waits();
  });
  m.def(
      "events_since",
      [](int64_t since) {
        py::list out;
        for (const auto& e : trace::events_since(since)) out.append(event_dict(e));
        return out;
      },
      py::arg("since_ns"), "Logged events (syncs, new graphs, inline ops, compiles) since a time.");
  m.def(
      "log_event",
      [](const py::object& kind, std::string what, std::string detail, int64_t duration_ns, int64_t graph_id,
         int device, Reason reason) {
        trace::Event e;
        e.kind = event_kind_of(kind);
        e.duration_ns = duration_ns;
        e.time_ns = trace::now_ns() - duration_ns;
        e.reason = reason;
        e.what = std::move(what);
        e.detail = std::move(detail);
        e.source = trace::capture();
        e.graph_id = graph_id;
        e.device = device;
        trace::log_event(std::move(e));
      },
      py::arg("kind"), py::arg("what"), py::arg("detail"), py::arg("duration_ns") = 0, py::arg("graph_id") = -1,
      py::arg("device") = -1, py::arg("reason") = Reason::None,
      "Logs an event (e.g. a torch.compile graph build) at the caller's user line; it began duration_ns ago.");
  m.def("totals", []() {
    const auto t = trace::totals();
    py::dict d;
    std::vector<int64_t> busy(t.device_busy_ns.begin(), t.device_busy_ns.begin() + device_count());
    d["device_busy_ns"] = busy;
    d["record_ns"] = t.record_ns;
    d["wait_ns"] = t.wait_ns;
    d["profiler_wait_ns"] = t.profiler_wait_ns;
    return d;
  });
  m.def("thread_phases", []() {
    const auto ns = trace::thread_phase_ns();
    py::dict d;
    d["recording_ns"] = ns[static_cast<int>(trace::HostPhase::Recording)];
    d["waiting_ns"] = ns[static_cast<int>(trace::HostPhase::Waiting)];
    d["running_ops_ns"] = ns[static_cast<int>(trace::HostPhase::RunningOps)];
    return d;
  }, "The calling thread's host time so far: recording, waiting for the device, running ops at once (ns).");
  m.def("busy_union_ns", &trace::busy_union_ns,
        "Wall time so far during which at least one launch ran on any core or stream (ns).");
  m.def(
      "set_source_name",
      [](const std::string& file, const std::string& name, std::vector<std::string> lines) {
        trace::set_source_name(file, name, std::move(lines));
      },
      py::arg("file"), py::arg("name"), py::arg("lines"),
      "Names a source file to the user (IPython's 'Cell In[7]') and gives its text.");
  m.def("async_failures", []() {
    auto frame_tuple = [](const trace::SourceFrame& f) { return py::make_tuple(f.file, f.line, f.function); };
    py::list out;
    for (const auto& f : trace::async_failures()) {
      py::dict d;
      d["context"] = f.context;
      d["op"] = f.op;
      d["recorded"] = frame_tuple(f.recorded);
      py::list not_run;
      for (const auto& [op, where] : f.not_run) not_run.append(py::make_tuple(op, frame_tuple(where)));
      d["not_run"] = std::move(not_run);
      d["time_ns"] = f.time_ns;
      out.append(std::move(d));
    }
    return out;
  }, "The last few ops that failed in a launch: their message context, op, line and the ops not run after them.");
  m.def("launch_times", []() {
    py::dict d;
    for (int k = 0; k < trace::kTimedLaunchKinds; ++k) {
      uint64_t total = 0;
      auto times = trace::launch_times(static_cast<trace::LaunchKind>(k), &total);
      d[g_kinds->launch_members[static_cast<size_t>(k)]] = py::make_tuple(total, times);
    }
    return d;
  }, "Per launch kind: (launches so far, the last <= 8192 execution times in ns).");
  m.def("reset_launch_times", &trace::reset_launch_times);
  m.def("allocated", []() {
    auto bytes = trace::allocated_now();
    bytes.resize(static_cast<size_t>(device_count()));
    return bytes;
  }, "Allocated bytes per core as of the allocator's last change (does not wait for the device).");
  m.def("open_watermark", &trace::open_watermark, "Starts tracking peak allocated bytes per core.");
  m.def(
      "close_watermark",
      [](int handle) {
        auto peaks = trace::close_watermark(handle);
        peaks.resize(static_cast<size_t>(device_count()));
        return peaks;
      },
      py::arg("handle"), "Peak allocated bytes per core since open_watermark().");
}

}  // namespace neuron
