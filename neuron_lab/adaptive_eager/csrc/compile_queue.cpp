// The queue between the runtime and the background compiler
// (neuron_lab/adaptive_eager/compiler.py), and compiled graphs run on the device threads.
//
// A hot graph is described on the recording thread without tensors (no references that
// would keep memory alive) and without Python objects (no GIL there); the compiler thread
// takes it as a typed CompileRequest: the graph's storages, and each recorded op with its
// arguments as TensorView (a view of one of the storages) or plain Python values, dtypes,
// layouts and memory formats as torch's own objects.
#include "adaptive_eager.h"
#include "device/csrc/python/interpreter.h"

#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <ATen/ops/from_blob.h>

#include <condition_variable>
#include <deque>
#include <optional>
#include <unordered_map>

namespace py = pybind11;

namespace neuron::lazy {
namespace {

// A tensor argument or result: a view of storage `storage` of the graph.
struct TensorView {
  int storage = 0;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
};

// One of the graph's storages: live ones are the compiled code's inputs, in this order.
struct GraphStorage {
  int64_t numel = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  bool dead = false;  // an intermediate nothing outside the graph holds
};

// An argument as recorded, built without the GIL.
struct ArgDesc {
  enum Kind { None, Tensor, Value, List, Dtype, Layout, MemoryFormat } kind = None;
  TensorView tensor;
  c10::IValue value;  // Value: a number or anything without tensors
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Layout layout = c10::kStrided;
  c10::MemoryFormat memory_format = c10::MemoryFormat::Contiguous;
  std::vector<ArgDesc> items;
};

struct OpDesc {
  std::string name, overload;
  std::vector<ArgDesc> args;
  std::vector<TensorView> outputs;
};

struct QueuedRequest {
  std::shared_ptr<Graph> graph;
  std::vector<GraphStorage> storages;
  std::vector<OpDesc> ops;
};

// What Python receives.
struct RecordedOp {
  std::string name, overload;
  py::list args;
  std::vector<TensorView> outputs;
};
struct CompileRequest {
  int64_t graph_id = 0;
  std::vector<GraphStorage> storages;
  std::vector<RecordedOp> ops;
};

// Requests wait here for the compiler thread; a taken one is in flight until its code
// (or its failure) is installed.
class CompileQueue {
 public:
  void push(QueuedRequest req) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queued_.push_back(std::move(req));
    }
    ready_.notify_one();
  }
  // The next request, waiting up to timeout_s; nothing on timeout or once stopping.
  std::optional<QueuedRequest> take(double timeout_s) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!ready_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                         [this] { return stopping_ || !queued_.empty(); }) ||
        stopping_) {
      return std::nullopt;
    }
    QueuedRequest req = std::move(queued_.front());
    queued_.pop_front();
    in_flight_[req.graph->id] = req.graph;
    return req;
  }
  // The graph a taken request was for, if it still exists (it may have been evicted).
  std::shared_ptr<Graph> finish(int64_t graph_id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = in_flight_.find(graph_id);
    if (it == in_flight_.end()) return nullptr;
    auto graph = it->second.lock();
    in_flight_.erase(it);
    return graph;
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
  }
  bool stopping() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stopping_;
  }
  int64_t pending() {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int64_t>(queued_.size() + in_flight_.size());
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<QueuedRequest> queued_;
  std::unordered_map<int64_t, std::weak_ptr<Graph>> in_flight_;  // taken, not installed yet
  bool stopping_ = false;  // the process is exiting: the compiler thread ends
};

CompileQueue& compile_queue() {
  static auto* queue = new CompileQueue();  // leaked: the compiler thread may outlive exit handlers
  return *queue;
}

using StorageIndex = std::unordered_map<const c10::StorageImpl*, int>;

TensorView view_of(const at::Tensor& t, const StorageIndex& index) {
  return {index.at(t.storage().unsafeGetStorageImpl()), t.sizes().vec(), t.strides().vec(), t.storage_offset(),
          t.scalar_type()};
}

ArgDesc describe_tensor(const at::Tensor& t, const StorageIndex& index) {
  ArgDesc d;
  if (!t.defined()) return d;
  if (t.device().type() == kNeuron) {
    d.kind = ArgDesc::Tensor;
    d.tensor = view_of(t, index);
    return d;
  }
  TORCH_CHECK(t.unsafeGetTensorImpl()->is_wrapped_number(), "a host tensor argument");
  d.kind = ArgDesc::Value;
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

// The kind of value an argument of this schema type holds when it is an int.
c10::TypeKind enum_kind(const c10::TypePtr& real_type) {
  auto type = real_type;
  if (type->kind() == c10::TypeKind::OptionalType) type = type->expectRef<c10::OptionalType>().getElementType();
  return type->kind();
}

ArgDesc describe_value(const c10::IValue& v, c10::TypeKind kind, const StorageIndex& index) {
  if (v.isTensor()) return describe_tensor(v.toTensor(), index);
  ArgDesc d;
  if (v.isTensorList()) {
    d.kind = ArgDesc::List;
    for (const at::Tensor& t : v.toTensorList()) d.items.push_back(describe_tensor(t, index));
  } else if (v.isList() && !v.isIntList() && !v.isDoubleList() && !v.isBoolList()) {
    d.kind = ArgDesc::List;
    for (const c10::IValue& e : v.toList()) d.items.push_back(describe_value(e, c10::TypeKind::AnyType, index));
  } else if (v.isInt() && kind == c10::TypeKind::ScalarTypeType) {
    d.kind = ArgDesc::Dtype;
    d.dtype = static_cast<c10::ScalarType>(v.toInt());
  } else if (v.isInt() && kind == c10::TypeKind::LayoutType) {
    d.kind = ArgDesc::Layout;
    d.layout = static_cast<c10::Layout>(v.toInt());
  } else if (v.isInt() && kind == c10::TypeKind::MemoryFormatType) {
    d.kind = ArgDesc::MemoryFormat;
    d.memory_format = static_cast<c10::MemoryFormat>(v.toInt());
  } else if (!v.isNone()) {
    d.kind = ArgDesc::Value;
    d.value = v;
  }
  return d;
}

py::object to_python(const ArgDesc& d) {
  switch (d.kind) {
    case ArgDesc::Tensor: return py::cast(d.tensor);
    case ArgDesc::Value: return torch::jit::toPyObject(d.value);
    case ArgDesc::Dtype: return py::cast(d.dtype);
    case ArgDesc::Layout: return py::cast(d.layout);
    case ArgDesc::MemoryFormat: return py::cast(d.memory_format);
    case ArgDesc::List: {
      py::list l;
      for (const auto& e : d.items) l.append(to_python(e));
      return l;
    }
    case ArgDesc::None: break;
  }
  return py::none();
}

CompileRequest to_python(const QueuedRequest& queued) {
  CompileRequest req;
  req.graph_id = queued.graph->id;
  req.storages = queued.storages;
  for (const auto& op : queued.ops) {
    RecordedOp out{op.name, op.overload, py::list(), op.outputs};
    for (const auto& a : op.args) out.args.append(to_python(a));
    req.ops.push_back(std::move(out));
  }
  return req;
}

}  // namespace

// Called by launch() on the recording thread, possibly without the GIL.
void request_compile(const std::shared_ptr<Graph>& graph, const std::vector<Record>& records,
                     const std::vector<StorageUse>& storages) {
  int expected = Graph::Cold;
  if (!graph->state.compare_exchange_strong(expected, Graph::Compiling)) return;
  QueuedRequest req;
  req.graph = graph;
  try {
    StorageIndex index;
    for (size_t i = 0; i < storages.size(); ++i) {
      const auto& u = storages[i];
      index.emplace(u.storage.unsafeGetStorageImpl(), static_cast<int>(i));
      req.storages.push_back({static_cast<int64_t>(u.storage.nbytes() / c10::elementSize(u.dtype)), u.dtype, u.dead});
    }
    for (const auto& r : records) {
      const auto& schema = r.op.schema();
      OpDesc op;
      op.name = schema.name();
      op.overload = schema.overload_name();
      for (size_t i = 0; i < r.args.size(); ++i) {
        const auto kind = i < schema.arguments().size() ? enum_kind(schema.arguments()[i].real_type())
                                                        : c10::TypeKind::AnyType;
        op.args.push_back(describe_value(r.args[i], kind, index));
      }
      for (const auto& t : r.outputs) op.outputs.push_back(view_of(t, index));
      req.ops.push_back(std::move(op));
    }
  } catch (const std::exception& e) {
    graph->note = std::string("not compiled: ") + e.what();
    graph->state = Graph::NotCompilable;
    return;
  }
  counters().compiles_requested.fetch_add(1);
  compile_queue().push(std::move(req));
}

bool run_compiled(Graph& graph, const std::vector<c10::Storage>& inputs, const std::vector<c10::ScalarType>& dtypes) {
  if (!neuron::python_can_run()) return false;
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
  } catch (const std::exception& e) {  // py::error_already_set included
    graph.note = std::string("compiled code failed, replaying instead: ") + e.what();
    graph.state = Graph::CompileFailed;
    return false;
  }
}

void register_compile_bindings(py::module& m) {
  py::class_<TensorView>(m, "TensorView", "A tensor of a recorded graph: a view of one of its storages.")
      .def_readonly("storage", &TensorView::storage, "Index into CompileRequest.storages.")
      .def_property_readonly("sizes", [](const TensorView& t) { return py::tuple(py::cast(t.sizes)); })
      .def_property_readonly("strides", [](const TensorView& t) { return py::tuple(py::cast(t.strides)); })
      .def_readonly("offset", &TensorView::offset)
      .def_property_readonly("dtype", [](const TensorView& t) { return py::cast(t.dtype); })
      .def_property_readonly(
          "key",
          [](const TensorView& t) {
            return py::make_tuple(t.storage, py::tuple(py::cast(t.sizes)), py::tuple(py::cast(t.strides)), t.offset);
          },
          "(storage, sizes, strides, offset): equal for the same view.")
      .def("__repr__", [](const TensorView& t) {
        return "TensorView(storage=" + std::to_string(t.storage) + ", sizes=" + c10::str(c10::IntArrayRef(t.sizes)) +
               ", dtype=" + c10::toString(t.dtype) + ")";
      });
  py::class_<GraphStorage>(m, "GraphStorage", "One storage of a recorded graph.")
      .def_readonly("numel", &GraphStorage::numel)
      .def_property_readonly("dtype", [](const GraphStorage& s) { return py::cast(s.dtype); })
      .def_readonly("dead", &GraphStorage::dead, "An intermediate nothing outside the graph holds (not an input).");
  py::class_<RecordedOp>(m, "RecordedOp", "One recorded op: its schema's name and overload, arguments, results.")
      .def_readonly("name", &RecordedOp::name)
      .def_readonly("overload", &RecordedOp::overload)
      .def_readonly("args", &RecordedOp::args, "Per schema argument: a TensorView, a Python value, or a list.")
      .def_readonly("outputs", &RecordedOp::outputs, "The fresh results (not the op's out= or in-place arguments).");
  py::class_<CompileRequest>(m, "CompileRequest", "A hot graph to compile: its storages and recorded ops.")
      .def_readonly("graph_id", &CompileRequest::graph_id)
      .def_readonly("storages", &CompileRequest::storages)
      .def_readonly("ops", &CompileRequest::ops);

  m.def(
      "next_compile_request",
      [](double timeout_s) -> py::object {
        std::optional<QueuedRequest> req;
        {
          py::gil_scoped_release no_gil;
          req = compile_queue().take(timeout_s);
        }
        if (!req) return py::none();
        return py::cast(to_python(*req));
      },
      py::arg("timeout_s"), "The next graph to compile (a CompileRequest; waits up to timeout_s), or None.");
  m.def("stop_compiler", []() { compile_queue().stop(); });
  m.def("compiler_stopping", []() { return compile_queue().stopping(); });
  m.def("pending_compiles", []() { return compile_queue().pending(); });
  m.def("install_compiled", [](int64_t graph_id, py::object fn, std::string error, double seconds) {
    std::shared_ptr<Graph> g = compile_queue().finish(graph_id);
    if (!g) return false;
    auto& c = counters();
    c.compile_ns.fetch_add(static_cast<uint64_t>(seconds * 1e9));
    {
      trace::Event e;
      e.duration_ns = static_cast<int64_t>(seconds * 1e9);
      e.time_ns = trace::now_ns() - e.duration_ns;
      e.kind = fn.is_none() ? trace::EventKind::CompileFailed : trace::EventKind::Compile;
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
}

}  // namespace neuron::lazy
