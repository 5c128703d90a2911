// The Python side of adaptive eager (neuron_lab.device._C.adaptive): modes, knobs and
// counters for neuron_lab.adaptive_eager; the compile queue's bindings are in
// compile_queue.cpp.
#include "adaptive_eager.h"
#include "storage_state.h"
#include "device/csrc/python/python_submodules.h"

#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <variant>


namespace py = pybind11;

namespace neuron::lazy {

// The compile queue's bindings (compile_queue.cpp).
void register_compile_bindings(py::module& m);

namespace {

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
                        bool capture_source, int64_t graph_cache_size, int64_t idle_flush_ops,
                        bool run_unrepeated_at_once, int64_t max_bytes, bool run_at_once_on_host,
                        bool run_at_once_if_cheaper) {
    auto& p = policy();
    p.run_at_once_on_host = run_at_once_on_host;
    p.run_at_once_if_cheaper = run_at_once_if_cheaper;
    p.max_bytes = max_bytes;
    p.run_unrepeated_at_once = run_unrepeated_at_once;
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
    d["max_bytes"] = p.max_bytes.load();
    d["idle_flush_bytes"] = p.idle_flush_bytes.load();
    d["compile_after"] = p.compile_after.load();
    d["compile"] = p.compile.load();
    d["capture_source"] = p.capture_source.load();
    d["graph_cache_size"] = p.graph_cache_size.load();
    d["idle_flush_ops"] = p.idle_flush_ops.load();
    d["run_unrepeated_at_once"] = p.run_unrepeated_at_once.load();
    d["run_at_once_on_host"] = p.run_at_once_on_host.load();
    d["run_at_once_if_cheaper"] = p.run_at_once_if_cheaper.load();
    return d;
  });
  m.def("counters", []() {
    auto& c = counters();
    py::dict d;
    for (const auto& [name, value] : c.read()) {
      std::visit([&d, name = name](auto v) { d[name] = v; }, value);
    }
    d["graphs_unrepeated"] = repeats().unrepeated();
    d["unrepeated_ops_small"] = repeats().ops_are_small();  // false while ops are recorded
    d["scratch_cached_bytes"] = scratch_cached_bytes();
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
  m.def("ops_checked_at_first_call", []() { return ops_checked_at_first_call(); },
        "{op: how its meta kernel disagrees with its CPU kernel (a check it misses, a result's metadata)}: "
        "the first call of each signature runs at once, so that the checks raise at the op and the "
        "results' metadata is the CPU kernel's.");
  m.def("set_ops_checked_at_first_call",
        [](const std::map<std::string, std::string>& ops) { set_ops_checked_at_first_call(ops); }, py::arg("ops"),
        "Replaces the list (tests check that each entry is still needed).");
  m.def("reset_counters", []() { counters().reset(); });
  m.def("forget_repeats", []() { repeats().reset(); },
        "Forgets whether recent graphs repeated: recording resumes at once.");
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
  register_compile_bindings(m);
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

}  // namespace

// neuron_lab.device._C.adaptive, added when the extension loads.
[[maybe_unused]] const bool kBound = add_python_submodule("adaptive", "The adaptive-eager recorder (neuron_lab.adaptive_eager).",
                                                          &register_bindings);

}  // namespace neuron::lazy
