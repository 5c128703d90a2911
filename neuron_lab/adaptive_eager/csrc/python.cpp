// The Python side of adaptive eager: modes, knobs and counters for
// neuron_lab.adaptive_eager; graph descriptions handed to the background
// compiler (neuron_lab/adaptive_eager/compiler.py); compiled graphs swapped in
// and run on the device threads.
#include "adaptive_eager.h"
#include "storage_state.h"
#include "../../device/csrc/python_submodules.h"

#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <ATen/ops/from_blob.h>

#include <condition_variable>
#include <deque>
#include <unordered_map>

namespace py = pybind11;

namespace neuron::lazy {
namespace {

std::mutex g_graphs_mutex;
std::unordered_map<int64_t, std::weak_ptr<Graph>>& pending_graphs() {
  static auto* m = new std::unordered_map<int64_t, std::weak_ptr<Graph>>();
  return *m;
}

// A graph waiting to be compiled, described without tensors (no references
// that would keep memory alive) and without Python objects (built off the GIL).
struct ArgDesc {
  enum Kind { Tensor, Scalar, Value, List, None } kind = None;
  int storage = 0;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::IValue value;  // Scalar: the number; Value: anything without tensors
  std::vector<ArgDesc> items;
};
struct OpDesc {
  std::string name, overload;
  std::vector<ArgDesc> args, outputs;
};
struct CompileRequest {
  std::shared_ptr<Graph> graph;
  std::vector<std::tuple<int64_t, c10::ScalarType, bool>> storages;  // numel, dtype, dead
  std::vector<OpDesc> ops;
};

std::mutex g_requests_mutex;
std::condition_variable g_requests_ready;
std::deque<CompileRequest>& requests() {
  static auto* q = new std::deque<CompileRequest>();
  return *q;
}
std::atomic<int64_t> g_in_flight{0};  // taken by the compiler, not installed yet
bool g_stopping = false;              // the process is exiting: the compiler thread ends

ArgDesc describe_tensor(const at::Tensor& t, const std::unordered_map<const c10::StorageImpl*, int>& index) {
  ArgDesc d;
  if (!t.defined()) return d;
  if (t.device().type() == kNeuron) {
    d.kind = ArgDesc::Tensor;
    d.storage = index.at(t.storage().unsafeGetStorageImpl());
    d.sizes = t.sizes().vec();
    d.strides = t.strides().vec();
    d.offset = t.storage_offset();
    d.dtype = t.scalar_type();
    return d;
  }
  TORCH_CHECK(t.unsafeGetTensorImpl()->is_wrapped_number(), "a host tensor argument");
  d.kind = ArgDesc::Scalar;
  const auto s = wrapped_number_value(t);
  if (s.isFloatingPoint()) {
    d.value = s.toDouble();
  } else if (s.isBoolean()) {
    d.value = s.toBool();
  } else {
    TORCH_CHECK(s.isIntegral(false), "a complex scalar");
    d.value = s.toLong();
  }
  return d;
}

ArgDesc describe_value(const c10::IValue& v, const std::unordered_map<const c10::StorageImpl*, int>& index) {
  if (v.isTensor()) return describe_tensor(v.toTensor(), index);
  ArgDesc d;
  if (v.isTensorList()) {
    d.kind = ArgDesc::List;
    for (const at::Tensor& t : v.toTensorList()) d.items.push_back(describe_tensor(t, index));
  } else if (v.isList() && !v.isIntList() && !v.isDoubleList() && !v.isBoolList()) {
    d.kind = ArgDesc::List;
    for (const c10::IValue& e : v.toList()) d.items.push_back(describe_value(e, index));
  } else if (!v.isNone()) {
    d.kind = ArgDesc::Value;
    d.value = v;
  }
  return d;
}

py::object to_python(const ArgDesc& d) {
  switch (d.kind) {
    case ArgDesc::Tensor:
      return py::make_tuple("tensor", d.storage, d.sizes, d.strides, d.offset, py::str(c10::toString(d.dtype)));
    case ArgDesc::Scalar:
      return py::make_tuple("scalar", torch::jit::toPyObject(d.value));
    case ArgDesc::Value:
      return torch::jit::toPyObject(d.value);
    case ArgDesc::List: {
      py::list l;
      for (const auto& e : d.items) l.append(to_python(e));
      return l;
    }
    case ArgDesc::None:
      break;
  }
  return py::none();
}

void register_graph(const std::shared_ptr<Graph>& graph) {
  std::lock_guard<std::mutex> lock(g_graphs_mutex);
  pending_graphs()[graph->id] = graph;
}

}  // namespace

// Called by launch() on the recording thread, possibly without the GIL.
void request_compile(const std::shared_ptr<Graph>& graph, const std::vector<Record>& records,
                     const std::vector<StorageUse>& storages) {
  int expected = Graph::Cold;
  if (!graph->state.compare_exchange_strong(expected, Graph::Compiling)) return;
  CompileRequest req;
  req.graph = graph;
  try {
    std::unordered_map<const c10::StorageImpl*, int> index;
    for (size_t i = 0; i < storages.size(); ++i) {
      const auto& u = storages[i];
      index.emplace(u.storage.unsafeGetStorageImpl(), static_cast<int>(i));
      req.storages.emplace_back(static_cast<int64_t>(u.storage.nbytes() / c10::elementSize(u.dtype)), u.dtype, u.dead);
    }
    for (const auto& r : records) {
      OpDesc op;
      op.name = r.op.schema().name();
      op.overload = r.op.schema().overload_name();
      for (const auto& a : r.args) op.args.push_back(describe_value(a, index));
      for (const auto& t : r.outputs) op.outputs.push_back(describe_tensor(t, index));
      req.ops.push_back(std::move(op));
    }
  } catch (const std::exception& e) {
    graph->note = std::string("not compiled: ") + e.what();
    graph->state = Graph::NotCompilable;
    return;
  }
  counters().compiles_requested.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(g_requests_mutex);
    requests().push_back(std::move(req));
  }
  g_requests_ready.notify_one();
}

bool run_compiled(Graph& graph, const std::vector<c10::Storage>& inputs, const std::vector<c10::ScalarType>& dtypes) {
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return false;
  py::gil_scoped_acquire gil;
  try {
    py::list args;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto& s = inputs[i];
      const int64_t numel = static_cast<int64_t>(s.nbytes() / c10::elementSize(dtypes[i]));
      args.append(at::from_blob(s.mutable_data(), {numel}, at::TensorOptions().dtype(dtypes[i])));
    }
    auto fn = py::reinterpret_borrow<py::object>(static_cast<PyObject*>(graph.compiled));
    fn(args);
    return true;
  } catch (py::error_already_set& e) {
    graph.note = std::string("compiled code failed, replaying instead: ") + e.what();
    graph.state = Graph::CompileFailed;
    return false;
  } catch (const std::exception& e) {
    graph.note = std::string("compiled code failed, replaying instead: ") + e.what();
    graph.state = Graph::CompileFailed;
    return false;
  }
}

void register_bindings(py::module& m) {
  install_recorder();  // the device now hands recordable ops to the recorder
  m.def(
      "install_recorder",
      [](bool installed) {
        py::gil_scoped_release no_gil;
        install_recorder(installed);
      },
      py::arg("installed"),
      "Registers (True) or unregisters (False) the recorder as the device's interceptor; "
      "without it every op runs at once, as the device alone runs it.");
  m.def("set_mode", [](int mode) {
    TORCH_CHECK(mode >= 0 && mode <= 2, "unknown mode");
    py::gil_scoped_release no_gil;
    set_mode(static_cast<Mode>(mode));
  });
  m.def("get_mode", []() { return static_cast<int>(mode()); });
  m.def("configure", [](int64_t max_ops, int64_t idle_flush_bytes, int64_t compile_after, bool compile,
                        bool capture_source, int64_t graph_cache_size, int64_t idle_flush_ops) {
    auto& p = policy();
    p.idle_flush_ops = idle_flush_ops;
    p.max_ops = max_ops;
    p.idle_flush_bytes = idle_flush_bytes;
    p.compile_after = compile_after;
    p.compile = compile;
    p.capture_source = capture_source;
    p.graph_cache_size = graph_cache_size;
  });
  m.def("policy", []() {
    auto& p = policy();
    py::dict d;
    d["max_ops"] = p.max_ops.load();
    d["idle_flush_bytes"] = p.idle_flush_bytes.load();
    d["compile_after"] = p.compile_after.load();
    d["compile"] = p.compile.load();
    d["capture_source"] = p.capture_source.load();
    d["graph_cache_size"] = p.graph_cache_size.load();
    d["idle_flush_ops"] = p.idle_flush_ops.load();
    return d;
  });
  m.def("counters", []() {
    auto& c = counters();
    py::dict d;
    d["ops_recorded"] = c.ops_recorded.load();
    d["launches"] = c.launches.load();
    d["graph_launches"] = c.graph_launches.load();
    d["graphs_built"] = c.graphs_built.load();
    d["cache_hits"] = c.cache_hits.load();
    d["compiles_requested"] = c.compiles_requested.load();
    d["compiles_succeeded"] = c.compiles_succeeded.load();
    d["compiles_failed"] = c.compiles_failed.load();
    d["compile_seconds"] = static_cast<double>(c.compile_ns.load()) / 1e9;
    d["compiled_launches"] = c.compiled_launches.load();
    d["replay_launches"] = c.replay_launches.load();
    d["compiled_fallbacks"] = c.compiled_fallbacks.load();
    d["compiled_rejected"] = c.compiled_rejected.load();
    d["compiled_stale"] = c.compiled_stale.load();
    d["inline_ops"] = c.inline_ops.load();
    d["dead_intermediate_bytes"] = c.dead_intermediate_bytes.load();
    d["live_result_bytes"] = c.live_result_bytes.load();
    d["graphs_evicted"] = c.graphs_evicted.load();
    d["tiled_runs"] = c.tiled_runs.load();
    d["tiled_ops"] = c.tiled_ops.load();
    std::lock_guard<std::mutex> lock(c.mutex);
    std::map<std::string, uint64_t> flushes;
    for (int r = 0; r < kReasons; ++r) {
      if (const auto n = c.flushes[static_cast<size_t>(r)].load()) flushes[reason_name(static_cast<Reason>(r))] = n;
    }
    d["flushes"] = flushes;
    d["syncs"] = c.syncs;
    d["inline_by_op"] = c.inline_by_op;
    return d;
  });
  m.def("reset_counters", []() { counters().reset(); });
  m.def("graphs", []() {
    py::list out;
    for (const auto& g : graph_infos()) {
      py::dict d;
      d["id"] = g.id;
      d["ops"] = g.n_ops;
      d["hits"] = g.hits;
      d["tier"] = g.tier;
      d["replay_runs"] = g.replay_runs;
      d["scalar_changes"] = g.scalar_changes;
      d["compiled_runs"] = g.compiled_runs;
      d["replay_ms"] = g.replay_ms;
      d["compiled_ms"] = g.compiled_ms;
      d["first_op"] = g.first_op;
      d["source"] = g.source;
      d["flush_reason"] = g.flush_reason;
      d["cause"] = g.cause;
      d["note"] = g.note;
      out.append(d);
    }
    return out;
  });
  m.def("clear_graph_cache", []() { clear_graph_cache(); });
  m.def(
      "tracked_storages", []() { return py::make_tuple(access_table().size(), poison_table().size()); },
      "(storages with a launch that may still use them, storages marked never computed).");
  m.def(
      "next_compile_request",
      [](double timeout_s) -> py::object {
        CompileRequest req;
        {
          py::gil_scoped_release no_gil;
          std::unique_lock<std::mutex> lock(g_requests_mutex);
          if (!g_requests_ready.wait_for(lock, std::chrono::duration<double>(timeout_s),
                                         [] { return g_stopping || !requests().empty(); }) ||
              g_stopping) {
            return py::none();
          }
          req = std::move(requests().front());
          requests().pop_front();
          g_in_flight.fetch_add(1);
        }
        register_graph(req.graph);
        py::list storages;
        for (const auto& [numel, dtype, dead] : req.storages) {
          storages.append(py::make_tuple(numel, py::str(c10::toString(dtype)), dead));
        }
        py::list ops;
        for (const auto& op : req.ops) {
          py::list args, outputs;
          for (const auto& a : op.args) args.append(to_python(a));
          for (const auto& o : op.outputs) outputs.append(to_python(o));
          ops.append(py::make_tuple(op.name, op.overload, args, outputs));
        }
        return py::make_tuple(req.graph->id, storages, ops);
      },
      py::arg("timeout_s"), "The next graph to compile (waits up to timeout_s), or None.");
  m.def("stop_compiler", []() {
    {
      std::lock_guard<std::mutex> lock(g_requests_mutex);
      g_stopping = true;
    }
    g_requests_ready.notify_all();
  });
  m.def("compiler_stopping", []() {
    std::lock_guard<std::mutex> lock(g_requests_mutex);
    return g_stopping;
  });
  m.def("pending_compiles", []() {
    std::lock_guard<std::mutex> lock(g_requests_mutex);
    return static_cast<int64_t>(requests().size()) + g_in_flight.load();
  });
  m.def("install_compiled", [](int64_t graph_id, py::object fn, std::string error, double seconds) {
    std::shared_ptr<Graph> g;
    {
      std::lock_guard<std::mutex> lock(g_graphs_mutex);
      auto it = pending_graphs().find(graph_id);
      g_in_flight.fetch_sub(1);
      if (it == pending_graphs().end()) return false;
      g = it->second.lock();
      pending_graphs().erase(it);
    }
    if (!g) return false;
    auto& c = counters();
    c.compile_ns.fetch_add(static_cast<uint64_t>(seconds * 1e9));
    {
      trace::Event e;
      e.duration_ns = static_cast<int64_t>(seconds * 1e9);
      e.time_ns = trace::now_ns() - e.duration_ns;
      e.kind = fn.is_none() ? "compile_failed" : "compile";
      e.what = "graph " + std::to_string(g->id) + " (" + std::to_string(g->n_ops) + " ops, from " + g->first_op + ")";
      e.detail = fn.is_none() ? "compile failed, replaying instead: " + error
                              : "compiled with TorchInductor in the background; recorded at " + g->source;
      e.graph_id = g->id;
      trace::log_event(std::move(e));
    }
    if (fn.is_none()) {
      c.compiles_failed.fetch_add(1);
      g->note = "compile failed, replaying instead: " + error;
      g->state = Graph::CompileFailed;
      return true;
    }
    c.compiles_succeeded.fetch_add(1);
    PyObject* previous = static_cast<PyObject*>(g->compiled);  // compiled for other scalars, if any
    g->compiled = fn.release().ptr();  // owned by the graph (run_compiled holds its own reference)
    Py_XDECREF(previous);
    g->state = Graph::Compiled;
    return true;
  });
  m.def("set_recording_torch_compile_graph", [](bool on) { return set_recording_torch_compile_graph(on); },
        "Marks the ops this thread records as a torch.compile graph's; returns the previous value.");
  m.def(
      "flush",
      [](int device, Reason reason) {
        py::gil_scoped_release no_gil;
        flush_device_buffers(static_cast<c10::DeviceIndex>(device), reason);
      },
      py::arg("device"), py::arg("reason") = Reason::ExplicitFlush);
  m.def(
      "synchronize_all",
      [](Reason reason) {
        py::gil_scoped_release no_gil;
        neuron::synchronize_all(reason);
      },
      py::arg("reason") = Reason::Synchronize);
  m.def("in_bad_fork", []() { return neuron::in_bad_fork(); });
  m.def("queue_depth", [](int device, int64_t stream_id) {
    auto& s = neuron::stream_state(
        c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, static_cast<c10::DeviceIndex>(device)), stream_id));
    return neuron::stream_enqueued(s) - neuron::stream_completed(s);
  });
}

// neuron_lab.device._C.adaptive, added when the extension loads.
[[maybe_unused]] const bool kBound = add_python_submodule("adaptive", "The adaptive-eager recorder (neuron_lab.adaptive_eager).",
                                                          &register_bindings);

}  // namespace neuron::lazy
