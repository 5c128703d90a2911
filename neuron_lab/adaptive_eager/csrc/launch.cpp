// From a flushed buffer to device work.
//
// launch() runs on the recording thread: it decides which results are alive
// (the user, autograd or another buffer holds them) and gives those device
// memory; dead intermediates get none. It looks the graph up in the cache by
// its structure and enqueues one launch on the stream, which the stream's device
// thread executes (execute.h), and notes which storages the launch uses
// (storage_state.h), so that a host access waits for exactly those launches.
#include "execute.h"
#include "storage_state.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <Python.h>
#include <c10/core/impl/PyObjectSlot.h>

#include <algorithm>
#include <unordered_map>

namespace neuron::lazy {

namespace {

// The operators of a launch in order, shapes aside: a program whose shapes grow
// (generate()) launches the same sequence with new shapes (RepeatTracker).
uint64_t operator_sequence_hash(const std::vector<Record>& records) {
  uint64_t h = records.size();
  for (const auto& r : records) {
    h = (h ^ reinterpret_cast<uintptr_t>(&r.op.schema())) * 0x100000001b3ULL;  // FNV-1a's prime
  }
  return h;
}

// References to a tensor or storage from C++, not counting its Python wrapper's
// own; `python_holds` is set when Python code holds the wrapper. (While C++
// holds the object it holds one reference to the wrapper: see intrusive_ptr's
// note on PyObject preservation. Read without the GIL: a stale count can only
// make a result look alive.)
template <typename T>
uint32_t cpp_refs(const T* target, bool& python_holds) {
  auto* t = const_cast<T*>(target);
  uint32_t n = c10::raw::intrusive_ptr::use_count(t);
  PyObject* obj = t->pyobj_slot()->load_pyobj();
  if (obj != nullptr && n > 0) {
    n -= 1;
    python_holds = python_holds || Py_REFCNT(obj) > (n > 0 ? 1 : 0);
  }
  return n;
}

// An argument or result as the profiler's cost model reads it: a tensor's dtype and shape,
// a number, a list of ints (never a tensor's values: they may not be computed yet).
trace::OpValue op_value(const c10::IValue& v) {
  using Kind = trace::OpValue::Kind;
  trace::OpValue out;
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    if (!t.defined()) {
      out.kind = Kind::None;
    } else if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
      out.kind = Kind::Double;  // a Python number (x * 3); its value does not change the cost
    } else {
      out.kind = Kind::Tensor;
      out.dtype = static_cast<int8_t>(t.scalar_type());
      out.ints.assign(t.sizes().begin(), t.sizes().end());
    }
  } else if (v.isTensorList()) {
    out.kind = Kind::Tensors;
    out.ints = {static_cast<int64_t>(v.toTensorList().size())};
  } else if (v.isNone()) {
    out.kind = Kind::None;
  } else if (v.isInt()) {
    out.kind = Kind::Int;
    out.ints = {v.toInt()};
  } else if (v.isDouble()) {
    out.kind = Kind::Double;
    out.number = v.toDouble();
  } else if (v.isBool()) {
    out.kind = Kind::Bool;
    out.number = v.toBool() ? 1 : 0;
  } else if (v.isIntList()) {
    out.kind = Kind::Ints;
    out.ints = v.toIntVector();
  }
  return out;
}

// A recorded op as the profiler keeps it.
trace::OpRecord op_record(const Record& r) {
  trace::OpRecord o;
  const auto& name = r.op.schema().operator_name();
  o.name = name.name;
  o.overload = name.overload_name;
  o.inputs = shapes_of(r);
  o.source = r.source;
  o.host_ns = r.record_ns;
  o.record_start_ns = r.record_start_ns;
  o.correlation = r.correlation;
  o.host_tid = r.host_tid;
  o.args.reserve(r.args.size());
  for (const auto& a : r.args) o.args.push_back(op_value(a));
  for (const auto& t : r.outputs) o.results.push_back(op_value(t));
  if (r.outputs.empty()) {  // in-place and out= ops: what they write
    for (size_t i = 0; i < r.args.size(); ++i) {
      if (r.cls->write_arg[i]) o.results.push_back(op_value(r.args[i]));
    }
  }
  return o;
}

}  // namespace


StorageUses storage_uses(const std::vector<Record>& records) {
  StorageUses out;
  auto& storages = out.storages;
  auto& index = out.index;
  // Storages in order of first use, and how often the records hold each tensor.
  std::unordered_map<const c10::TensorImpl*, int> held;
  index.reserve(2 * records.size());
  storages.reserve(2 * records.size());
  held.reserve(3 * records.size());
  for (size_t record_index = 0; record_index < records.size(); ++record_index) {
    const auto& r = records[record_index];
    for_each_record_tensor(r, [&](const at::Tensor& t, bool write) {
      if (!on_device(t)) return;
      held[t.unsafeGetTensorImpl()] += 1;
      const auto* impl = t.storage().unsafeGetStorageImpl();
      auto [it, inserted] = index.emplace(impl, static_cast<int>(storages.size()));
      if (inserted) {
        StorageUse u;
        u.storage = t.storage();
        u.dtype = t.scalar_type();
        u.first_record = static_cast<int64_t>(record_index);
        storages.push_back(std::move(u));
      }
      auto& u = storages[static_cast<size_t>(it->second)];
      u.last_record = static_cast<int64_t>(record_index);
      if (u.dtype != t.scalar_type()) u.mixed_dtypes = true;
      u.written = u.written || write;
      if (std::find(u.impls.begin(), u.impls.end(), t.unsafeGetTensorImpl()) == u.impls.end()) {
        u.impls.push_back(t.unsafeGetTensorImpl());
      }
    });
  }
  // A pending result is dead when nothing but these records holds it: its
  // storage is held only by tensors the records hold, and those only by them.
  for (auto& u : storages) {
    if (!is_pending(u.storage)) continue;
    // u.storage itself holds one reference; each tensor of the records another.
    bool python_holds = false;
    bool dead = cpp_refs(u.storage.unsafeGetStorageImpl(), python_holds) == u.impls.size() + 1;
    for (const auto* impl : u.impls) {
      dead = dead && cpp_refs(impl, python_holds) == static_cast<uint32_t>(held[impl]);
    }
    u.dead = dead && !python_holds;
  }
  return out;
}

int64_t live_pending_bytes(const std::vector<Record>& records) {
  int64_t bytes = 0;
  const auto newest = static_cast<int64_t>(records.size()) - 1;
  for (const auto& u : storage_uses(records).storages) {
    if (is_pending(u.storage) && !u.dead && u.first_record != newest) bytes += static_cast<int64_t>(u.storage.nbytes());
  }
  return bytes;
}

void launch(std::vector<Record>&& records, StreamState& stream, bool use_cache, Reason reason) {
  auto l = std::make_shared<Launch>();
  l->records = std::move(records);
  const auto stream_handle = stream_of(stream);
  l->device = stream_handle.device_index();
  l->stream_id = stream_handle.id();

  StorageUses uses = storage_uses(l->records);
  auto& storages = uses.storages;
  const auto& index = uses.index;
  auto& c = counters();
  int64_t allocated_bytes = 0;
  for (auto& u : storages) {
    if (!is_pending(u.storage)) continue;
    if (u.dead) {
      c.dead_intermediate_bytes.fetch_add(u.storage.nbytes(), std::memory_order_relaxed);
    } else {
      allocated_bytes += static_cast<int64_t>(u.storage.nbytes());
      c.live_result_bytes.fetch_add(u.storage.nbytes(), std::memory_order_relaxed);
      try {
        materialize(u.storage);
      } catch (c10::Error& e) {
        e.add_context("neuron: raised while giving memory to the results of " + std::to_string(l->records.size()) +
                      " recorded op(s), the first recorded at " + trace::describe(l->records.front().source));
        throw;
      }
    }
  }
  for (auto& u : storages) {
    if (u.dead) {
      l->scratch.push_back({u.storage, u.first_record, u.last_record});
    } else {
      l->inputs.push_back(u.storage);
      l->input_dtypes.push_back(u.dtype);
    }
  }

  bool compile_it = false;
  if (use_cache) {
    GraphKey key = key_of(l->records, storages, index);
    auto scalars = std::move(key.scalars);
    const char* uncompilable = key.uncompilable;
    bool hit = false;
    l->graph = find_or_build_graph(std::move(key), l->records, reason, hit, [&](Graph& g, bool built) {
      if (built) {
        g.from_torch_compile = std::all_of(l->records.begin(), l->records.end(),
                                           [](const Record& r) { return r.in_torch_compile_graph; });
        const char* why = uncompilable;
        for (const auto& r : l->records) {
          if (why != nullptr) break;
          if (r.random) why = "it draws random numbers (replay keeps eager mode's numbers)";
          if (r.has_host_tensor) why = "it reads a host tensor";
        }
        for (const auto& u : storages) {
          if (why == nullptr && u.mixed_dtypes) why = "one memory is viewed with two dtypes";
          if (why == nullptr && u.storage.nbytes() % c10::elementSize(u.dtype) != 0) why = "odd-sized memory";
        }
        if (why != nullptr) {
          g.state = Graph::NotCompilable;
          g.note = why;
        }
      }
      g.hits.fetch_add(1);
      if (g.scalars != scalars) {
        if (g.runs_with_these_scalars > 0) g.scalar_changes += 1;
        g.scalars = std::move(scalars);
        g.runs_with_these_scalars = 0;
      }
      g.runs_with_these_scalars += 1;
      if (g.compiled_scalars != g.scalars) {
        const int state = g.state.load();
        if (state == Graph::Compiling || state == Graph::Compiled) l->replay_only = true;
        int compiled = Graph::Compiled;  // stale constants: recompile once the scalars settle
        if (g.state.compare_exchange_strong(compiled, Graph::Cold)) c.compiled_stale.fetch_add(1);
      }
      if (g.runs_with_these_scalars >= policy().compile_after.load() &&
          (policy().compile.load() || g.from_torch_compile) && g.state.load() == Graph::Cold) {
        g.compiled_scalars = g.scalars;
        compile_it = true;
      }
    });
    (hit ? c.cache_hits : c.graphs_built).fetch_add(1, std::memory_order_relaxed);
    int64_t written_bytes = 0;
    for (const auto& r : l->records) written_bytes += r.written_bytes;
    repeats().note_graph_launch(hit, operator_sequence_hash(l->records),
                                static_cast<int64_t>(l->records.size()), written_bytes);
  }
  if (compile_it) request_compile(l->graph, l->records, storages);
  // Dead intermediates get host scratch now, on this thread, unless compiled
  // code (which keeps them in registers and local buffers) will run the graph.
  if (!l->graph || l->replay_only || l->graph->state.load() != Graph::Compiled) l->give_scratch_once();

  c.launches.fetch_add(1, std::memory_order_relaxed);
  if (use_cache) c.graph_launches.fetch_add(1, std::memory_order_relaxed);
  Work work;
  const auto& first = l->records.front();
  if (trace::profiling()) {
    l->record = trace::new_launch(l->graph ? trace::LaunchKind::Graph : trace::LaunchKind::Op,
                                  l->graph ? "graph " + std::to_string(l->graph->id)
                                           : std::string(first.op.schema().operator_name().name),
                                  l->device, l->stream_id);
  }
  if (l->record) {
    auto& rec = *l->record;
    rec.n_ops = static_cast<int64_t>(l->records.size());
    rec.graph_id = l->graph ? l->graph->id : -1;
    rec.bytes_allocated = allocated_bytes;
    rec.source = first.source;
    rec.ops.reserve(l->records.size());
    for (const auto& r : l->records) rec.ops.push_back(op_record(r));
    work.record = l->record;
  }
  work.run = [l] { l->execute(); };
  work.on_skip = [l] { l->skipped(); };
  work.ops = static_cast<int64_t>(l->records.size());
  work.result_bytes = allocated_bytes;
  work.kind = use_cache ? trace::LaunchKind::Graph : trace::LaunchKind::Op;
  const uint64_t seq = enqueue(stream, std::move(work));
  std::vector<const c10::StorageImpl*> used;
  used.reserve(storages.size());
  for (const auto& u : storages) used.push_back(u.storage.unsafeGetStorageImpl());
  access_table().note(used, stream, seq);
}

void check_readable(const at::Tensor& t) {
  if (!on_device(t)) return;
  if (auto why = poison_table().why(t.storage().unsafeGetStorageImpl())) {
    TORCH_CHECK(false, "neuron: this tensor's value was never computed: ", *why,
                ". That error was raised at an earlier wait; compute the tensor again.");
  }
}

void note_written(const at::Tensor& t) {
  if (on_device(t)) poison_table().clear(t.storage().unsafeGetStorageImpl());
}

void wait_for_storage(const c10::Storage& storage) {
  if (device_quiet()) return;  // the common case between launches: no table look-up
  for (const auto& a : access_table().launches_using(storage.unsafeGetStorageImpl())) wait_for(*a.stream, a.seq);
}

}  // namespace neuron::lazy
