// From a flushed buffer to device work.
//
// launch() runs on the recording thread: it decides which results are alive
// (the user, autograd or another buffer holds them) and gives those device
// memory; dead intermediates get none. It looks the graph up in the cache by
// its structure and enqueues one launch on the stream. The stream's device
// thread then executes it, by replaying the recorded ops on the CPU kernels
// (bit-identical to eager mode) or, once the graph is hot and compiled in the
// background, with the compiled code; the faster tier is kept.
#include "adaptive_eager.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <Python.h>
#include <c10/core/impl/PyObjectSlot.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <cstring>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace neuron::lazy {

// Implemented in python.cpp (needs the GIL).
bool run_compiled(Graph& graph, const std::vector<c10::Storage>& inputs, const std::vector<c10::ScalarType>& dtypes);
void request_compile(const std::shared_ptr<Graph>& graph, const std::vector<Record>& records,
                     const std::vector<StorageUse>& storages);

namespace {

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

// ---- which launches touch which memory ----------------------------------------------
// Per storage, the last launch of each stream that used it. An inline op or a
// host read waits for exactly those.

struct Access {
  StreamState* stream;
  uint64_t seq;
};
std::mutex g_access_mutex;
std::unordered_map<const c10::StorageImpl*, std::vector<Access>>& accesses() {
  static auto* a = new std::unordered_map<const c10::StorageImpl*, std::vector<Access>>();
  return *a;
}

void note_access(const c10::StorageImpl* storage, StreamState* stream, uint64_t seq) {
  auto& list = accesses()[storage];
  for (auto& a : list) {
    if (a.stream == stream) {
      a.seq = seq;
      return;
    }
  }
  list.push_back({stream, seq});
}

void sweep_accesses() {
  // Called with g_access_mutex held, when the table grows.
  auto& table = accesses();
  for (auto it = table.begin(); it != table.end();) {
    auto& list = it->second;
    list.erase(std::remove_if(list.begin(), list.end(),
                              [](const Access& a) { return stream_completed(*a.stream) >= a.seq; }),
               list.end());
    it = list.empty() ? table.erase(it) : std::next(it);
  }
}

// ---- results that were never computed ---------------------------------------------
// When an op fails, its results and those of every later op it feeds, or that
// its stream skips, are poisoned: reading them raises instead of returning
// uninitialized memory. A later successful write clears the mark.

std::mutex g_poison_mutex;
std::atomic<size_t> g_poison_count{0};
struct Poison {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;  // keeps the address from being reused
  std::string why;
};
std::unordered_map<const c10::StorageImpl*, Poison>& poison_table() {
  static auto* t = new std::unordered_map<const c10::StorageImpl*, Poison>();
  return *t;
}

void poison(const c10::Storage& storage, const std::string& why) {
  std::lock_guard<std::mutex> lock(g_poison_mutex);
  auto& table = poison_table();
  if (table.size() > 1024) {
    for (auto it = table.begin(); it != table.end();) it = it->second.storage.expired() ? table.erase(it) : std::next(it);
  }
  table.insert_or_assign(storage.unsafeGetStorageImpl(),
                         Poison{c10::weak_intrusive_ptr<c10::StorageImpl>(storage.getWeakStorageImpl()), why});
  g_poison_count = table.size();
}

std::optional<std::string> poisoned(const c10::StorageImpl* storage) {
  if (g_poison_count.load(std::memory_order_relaxed) == 0) return std::nullopt;
  std::lock_guard<std::mutex> lock(g_poison_mutex);
  auto it = poison_table().find(storage);
  if (it == poison_table().end()) return std::nullopt;
  if (it->second.storage.expired()) {
    poison_table().erase(it);
    g_poison_count = poison_table().size();
    return std::nullopt;
  }
  return it->second.why;
}

void unpoison(const c10::StorageImpl* storage) {
  if (g_poison_count.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(g_poison_mutex);
  poison_table().erase(storage);
  g_poison_count = poison_table().size();
}

// Warnings an out= kernel raises are held until it is known whether its results are
// kept (a resize warning means they are not, and the functional kernel runs instead).
class HeldWarnings final : public c10::WarningHandler {
 public:
  HeldWarnings() : previous_(c10::WarningUtils::get_warning_handler()) {}
  void process(const c10::Warning& warning) override { warnings_.push_back(warning); }
  void pass_on() {
    for (const auto& w : warnings_) previous_->process(w);
  }

 private:
  c10::WarningHandler* previous_;
  std::vector<c10::Warning> warnings_;
};

// One launch: what the device thread executes.
struct Launch {
  std::vector<Record> records;
  std::vector<ScratchUse> scratch;         // dead intermediates (replay only)
  bool scratch_given = false;
  std::vector<c10::Storage> inputs;        // the compiled code's inputs: every live storage
  std::vector<c10::ScalarType> input_dtypes;
  std::shared_ptr<Graph> graph;
  bool replay_only = false;  // its scalars differ from those the graph's compiled code has
  c10::DeviceIndex device = 0;
  c10::StreamId stream_id = 0;
  trace::LaunchRecordPtr record;  // while profiling

  template <typename F>
  static void for_each_written(const Record& r, F&& f) {
    for_each_record_tensor(r, [&](const at::Tensor& t, bool write) {
      if (write && on_device(t)) f(t.storage());
    });
  }

  // The first poisoned storage a record reads, if any.
  static std::optional<std::string> poisoned_input(const Record& r) {
    std::optional<std::string> why;
    for_each_record_tensor(r, [&](const at::Tensor& t, bool write) {
      if (!why && !write && on_device(t)) why = poisoned(t.storage().unsafeGetStorageImpl());
    });
    return why;
  }

  void give_scratch_once() {
    if (scratch_given) return;
    scratch_given = true;
    give_scratch(scratch);
  }

  void replay() {
    give_scratch_once();
    for (size_t i = 0; i < records.size();) {
      int64_t numel = 0;
      const size_t end = tileable_run_end(records, i, numel);
      if (end >= i + 2 && !run_reads_poison(i, end)) {
        replay_run_tiled(i, end, numel);
        i = end;
        continue;
      }
      replay_record(i);
      ++i;
    }
  }

  // Whether a record of [begin, end) reads a never-computed result (those replay op by
  // op, which passes the mark on).
  bool run_reads_poison(size_t begin, size_t end) const {
    if (g_poison_count.load(std::memory_order_relaxed) == 0) return false;
    for (size_t i = begin; i < end; ++i) {
      if (poisoned_input(records[i])) return true;
    }
    return false;
  }

  // Marks what records [first, end of launch) write as never computed, because `failed` failed.
  void poison_from(size_t first, const Record& failed) {
    const std::string why = std::string(failed.op.schema().operator_name().name) + " failed (recorded at " +
                            trace::describe(failed.source) + ")";
    for (size_t j = first; j < records.size(); ++j) {
      for_each_written(records[j], [&](const c10::Storage& st) { poison(st, why); });
    }
  }

  void replay_record(size_t i) {
    auto& r = records[i];
    if (auto why = poisoned_input(r)) {
      for_each_written(r, [&](const c10::Storage& st) { poison(st, *why); });
      return;  // its inputs were never computed: so are not its results
    }
    try {
      if (record) {
        const int64_t start = trace::now_ns();
        replay_one(r);
        record->ops[i].device_ns = trace::now_ns() - start;
      } else {
        replay_one(r);
      }
    } catch (...) {
      poison_from(i, r);
      throw;
    }
    if (g_poison_count.load(std::memory_order_relaxed) > 0) {
      for_each_written(r, [&](const c10::Storage& st) { unpoison(st.unsafeGetStorageImpl()); });
    }
  }

  void replay_run_tiled(size_t begin, size_t end, int64_t numel) {
    std::vector<int64_t> op_ns(record ? end - begin : 0, 0);
    size_t failed = end;
    try {
      replay_tiled(records, begin, end, numel, record ? &op_ns : nullptr,
                   [&](const Record& r) { return failure_context(r); }, failed);
    } catch (...) {
      // Tiles of earlier ops of the run may have run: all of the run is suspect.
      poison_from(begin, records[std::min(failed, end - 1)]);
      throw;
    }
    if (record) {
      for (size_t k = 0; k < op_ns.size(); ++k) record->ops[begin + k].device_ns = op_ns[k];
    }
    if (g_poison_count.load(std::memory_order_relaxed) > 0) {
      for (size_t i = begin; i < end; ++i) {
        for_each_written(records[i], [&](const c10::Storage& st) { unpoison(st.unsafeGetStorageImpl()); });
      }
    }
  }

  // Compiled code cannot skip single ops: a launch reading a never-computed
  // result replays instead, op by op.
  bool reads_poison() const {
    if (g_poison_count.load(std::memory_order_relaxed) == 0) return false;
    for (const auto& st : inputs) {
      if (poisoned(st.unsafeGetStorageImpl())) return true;
    }
    return false;
  }

  // The stream skipped this launch after an earlier failure.
  void skipped() {
    const std::string why = "it was skipped because an earlier op on neuron:" + std::to_string(int(device)) +
                            " stream " + std::to_string(stream_id) + " failed";
    for (const auto& r : records) for_each_written(r, [&](const c10::Storage& st) { poison(st, why); });
  }

  void replay_one(Record& r) {
    // Host aliases: one host storage per neuron storage, so kernels see aliasing.
    std::vector<std::pair<const c10::StorageImpl*, c10::Storage>> hosts;
    auto host = [&](const at::Tensor& t) -> at::Tensor {
      if (!on_device(t)) return t;
      const auto* impl = t.storage().unsafeGetStorageImpl();
      for (auto& [k, h] : hosts) {
        if (k == impl) return host_alias_sharing(t, h);
      }
      auto alias = host_alias(t);
      hosts.emplace_back(impl, alias.storage());
      return alias;
    };
    auto arguments = [&]() {
      torch::jit::Stack stack;
      stack.reserve(r.args.size() + r.outputs.size());
      for (const auto& a : r.args) {
        if (a.isTensor()) {
          stack.push_back(host(a.toTensor()));
        } else if (a.isTensorList()) {
          c10::List<at::Tensor> l;
          for (const at::Tensor& t : a.toTensorList()) l.push_back(host(t));
          stack.push_back(std::move(l));
        } else if (a.isList() && !a.isIntList() && !a.isDoubleList() && !a.isBoolList()) {
          auto list = a.toList();
          c10::impl::GenericList l(list.elementType());
          for (const c10::IValue& e : list) l.push_back(e.isTensor() ? c10::IValue(host(e.toTensor())) : e);
          stack.push_back(std::move(l));
        } else {
          stack.push_back(a);
        }
      }
      return stack;
    };
    // The meta kernel that gave a result its metadata disagrees with the CPU kernel:
    // the tensor the program holds has the wrong shape. Never silently.
    auto mispredicted = [&](const at::Tensor& result, const at::Tensor& out) {
      std::ostringstream why;
      why << r.op.schema().operator_name() << "'s CPU kernel returned " << result.scalar_type() << result.sizes()
          << ", but its meta kernel, which gave the recorded result its shape, said " << out.scalar_type()
          << out.sizes();
      never_record(r.op, "its meta kernel gave another result shape than its CPU kernel");
      TORCH_CHECK(false, "neuron: ", why.str(), ". The result was not computed; this op now runs "
                  "inline, so running the code again gives the right result.");
    };
    try {
      c10::DeviceGuard guard(c10::Device(kNeuron, device));
      if (r.cls->out_twin.has_value() && !out_twin_refused(r.op)) {
        // Straight into the results' memory, through the op's out= kernel.
        auto stack = arguments();
        std::vector<at::Tensor> outs;
        std::vector<const void*> memory;
        for (const auto& out : r.outputs) {
          outs.push_back(host(out));
          memory.push_back(outs.back().const_data_ptr());
          stack.push_back(outs.back());
        }
        HeldWarnings held;
        {
          c10::WarningUtils::WarningHandlerGuard hold(&held);
          r.cls->out_twin->redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
        }
        bool kept = true;
        for (size_t k = 0; k < outs.size(); ++k) {
          kept = kept && outs[k].sizes() == r.outputs[k].sizes() && outs[k].strides() == r.outputs[k].strides() &&
                 outs[k].const_data_ptr() == memory[k];
        }
        if (kept) {
          held.pass_on();
          return;
        }
        // The out= kernel resized its output: its semantics are not the functional
        // op's (mse_loss.out). The results come from the functional kernel, now and on.
        refuse_out_twin(r.op);
        hosts.clear();
      }
      auto stack = arguments();
      r.op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
      // Fresh results: copied into the memory the recorder gave them.
      size_t next = 0;
      auto adopt = [&](const at::Tensor& result) {
        const auto& out = r.outputs[next++];
        if (result.sizes() != out.sizes() || result.scalar_type() != out.scalar_type()) mispredicted(result, out);
        host(out).copy_(result);
      };
      for (size_t i = 0; i < r.cls->return_arg.size(); ++i) {
        if (r.cls->return_arg[i] >= 0) continue;
        const auto& v = stack[i];
        if (v.isTensor()) {
          adopt(v.toTensor());
        } else {
          for (const at::Tensor& t : v.toTensorList()) adopt(t);
        }
      }
    } catch (c10::Error& e) {
      e.add_context(failure_context(r));
      throw;
    } catch (const std::exception& e) {
      TORCH_CHECK(false, e.what(), "\n", failure_context(r));
    }
  }

  std::string failure_context(const Record& r) const {
    std::ostringstream out;
    out << "neuron: " << r.op.schema().operator_name() << " failed on neuron:" << int(device) << " (stream "
        << stream_id << ", in a launch of " << records.size() << " recorded op" << (records.size() == 1 ? "" : "s")
        << "); inputs " << shapes_of(r) << "; recorded at " << trace::describe(r.source)
        << ". Results computed before this op keep their values; set "
           "neuron_lab.set_mode('blocking') to raise errors at the op itself.";
    return out.str();
  }

  void execute() {
    const int64_t start = trace::now_ns();
    bool compiled = false;
    if (graph && !replay_only && graph->state.load() == Graph::Compiled && !reads_poison()) {
      compiled = run_compiled(*graph, inputs, input_dtypes);
      if (!compiled) {
        counters().compiled_fallbacks.fetch_add(1);
        trace::Event e;
        e.time_ns = start;
        e.kind = "compiled_fallback";
        e.what = "graph " + std::to_string(graph->id);
        e.detail = "its compiled code failed; the launch was replayed op by op";
        e.device = device;
        e.graph_id = graph->id;
        trace::log_event(std::move(e));
      }
    }
    if (record) record->tier.store(compiled ? trace::LaunchTier::Compiled : trace::LaunchTier::Replay);
    if (!compiled) replay();
    const int64_t elapsed = trace::now_ns() - start;
    (compiled ? counters().compiled_launches : counters().replay_launches).fetch_add(1);
    if (graph) graph->note_run(compiled, elapsed);
  }
};

}  // namespace

// ---- graphs ------------------------------------------------------------------------------

void Graph::note_run(bool compiled, int64_t ns) {
  std::lock_guard<std::mutex> lock(mutex);
  if (compiled) {
    compiled_runs += 1;
    compiled_ns += ns;
    // Keep the compiled code only if it beats replay (it also pays for the GIL).
    if (compiled_runs == kTrialRuns && replay_runs >= 2) {
      const double per_compiled = static_cast<double>(compiled_ns) / compiled_runs;
      const double per_replay = static_cast<double>(replay_ns) / replay_runs;
      if (per_compiled > per_replay * 1.05) {
        state = Rejected;
        note = "compiled code was slower than replay";
        counters().compiled_rejected.fetch_add(1);
      }
    }
  } else {
    replay_runs += 1;
    replay_ns += ns;
  }
}

namespace {
}  // namespace

void launch(std::vector<Record>&& records, StreamState& stream, bool use_cache, Reason reason) {
  auto l = std::make_shared<Launch>();
  l->records = std::move(records);
  const auto stream_handle = stream_of(stream);
  l->device = stream_handle.device_index();
  l->stream_id = stream_handle.id();

  // Storages in order of first use, and how often the records hold each tensor.
  std::unordered_map<const c10::StorageImpl*, int> index;
  std::vector<StorageUse> storages;
  std::unordered_map<const c10::TensorImpl*, int> held;
  for (size_t record_index = 0; record_index < l->records.size(); ++record_index) {
    const auto& r = l->records[record_index];
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
  auto& c = counters();
  int64_t allocated_bytes = 0;
  for (auto& u : storages) {
    if (!is_pending(u.storage)) continue;
    // u.storage itself holds one reference; each tensor of the records another.
    bool python_holds = false;
    bool dead = cpp_refs(u.storage.unsafeGetStorageImpl(), python_holds) == u.impls.size() + 1;
    for (const auto* impl : u.impls) {
      dead = dead && cpp_refs(impl, python_holds) == static_cast<uint32_t>(held[impl]);
    }
    dead = dead && !python_holds;
    u.dead = dead;
    if (!dead) allocated_bytes += static_cast<int64_t>(u.storage.nbytes());
    if (dead) {
      c.dead_intermediate_bytes.fetch_add(u.storage.nbytes(), std::memory_order_relaxed);
    } else {
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
    l->record = trace::new_launch(l->graph ? "graph" : "op",
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
    for (const auto& r : l->records) {
      rec.ops.push_back({std::string(r.op.schema().operator_name().name), shapes_of(r), r.source,
                         r.record_ns, -1});
    }
    work.record = l->record;
  }
  if (torch_profiler_active()) {
    work.name = l->graph ? "neuron: graph " + std::to_string(l->graph->id) + " (" +
                               std::to_string(l->records.size()) + " ops)"
                         : "neuron: " + std::string(first.op.schema().operator_name().name);
  }
  work.run = [l] { l->execute(); };
  work.on_skip = [l] { l->skipped(); };
  work.ops = static_cast<int64_t>(l->records.size());
  work.kind = use_cache ? trace::LaunchKind::Graph : trace::LaunchKind::Op;
  const uint64_t seq = enqueue(stream, std::move(work));
  std::lock_guard<std::mutex> lock(g_access_mutex);
  for (const auto& u : storages) note_access(u.storage.unsafeGetStorageImpl(), &stream, seq);
  if (accesses().size() > 4096) sweep_accesses();
}

void check_readable(const at::Tensor& t) {
  if (!on_device(t)) return;
  if (auto why = poisoned(t.storage().unsafeGetStorageImpl())) {
    TORCH_CHECK(false, "neuron: this tensor's value was never computed: ", *why,
                ". That error was raised at an earlier wait; compute the tensor again.");
  }
}

void note_written(const at::Tensor& t) {
  if (on_device(t)) unpoison(t.storage().unsafeGetStorageImpl());
}

void wait_for_storage(const c10::Storage& storage) {
  std::vector<Access> pending;
  {
    std::lock_guard<std::mutex> lock(g_access_mutex);
    auto it = accesses().find(storage.unsafeGetStorageImpl());
    if (it == accesses().end()) return;
    pending = it->second;
  }
  for (const auto& a : pending) wait_for(*a.stream, a.seq);
}

}  // namespace neuron::lazy
