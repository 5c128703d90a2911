// Executing a launch on the device thread (execute.h).
#include "execute.h"
#include "storage_state.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>
#include <sstream>

namespace neuron::lazy {

namespace {

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

template <typename F>
void for_each_written(const Record& r, F&& f) {
  for_each_record_tensor(r, [&](const at::Tensor& t, bool write) {
    if (write && on_device(t)) f(t.storage());
  });
}

// The first poisoned storage a record reads, if any.
std::optional<std::string> poisoned_input(const Record& r) {
  std::optional<std::string> why;
  for_each_record_tensor(r, [&](const at::Tensor& t, bool write) {
    if (!why && !write && on_device(t)) why = poison_table().why(t.storage().unsafeGetStorageImpl());
  });
  return why;
}

}  // namespace

void Launch::give_scratch_once() {
  if (scratch_given) return;
  scratch_given = true;
  give_scratch(scratch);
}

void Launch::replay() {
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
bool Launch::run_reads_poison(size_t begin, size_t end) const {
  if (!poison_table().any()) return false;
  for (size_t i = begin; i < end; ++i) {
    if (poisoned_input(records[i])) return true;
  }
  return false;
}

// Marks what records [first, end of launch) write as never computed, because `failed` failed.
void Launch::poison_from(size_t first, const Record& failed) {
  const std::string why = std::string(failed.op.schema().operator_name().name) + " failed (recorded at " +
                          trace::describe(failed.source) + ")";
  // For the layer that shows the error: the op's line, and what was recorded after it.
  trace::AsyncFailure failure;
  failure.context = failure_context(failed);
  failure.op = failed.op.schema().operator_name().name;
  failure.recorded = trace::frame(failed.source);
  const size_t failed_index = static_cast<size_t>(&failed - records.data());
  for (size_t j = failed_index + 1; j < records.size(); ++j) {
    failure.not_run.emplace_back(records[j].op.schema().operator_name().name, trace::frame(records[j].source));
  }
  trace::note_async_failure(std::move(failure));
  for (size_t j = first; j < records.size(); ++j) {
    for_each_written(records[j], [&](const c10::Storage& st) { poison_table().mark(st, why); });
  }
}

void Launch::replay_record(size_t i) {
  auto& r = records[i];
  if (auto why = poisoned_input(r)) {
    for_each_written(r, [&](const c10::Storage& st) { poison_table().mark(st, *why); });
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
  if (poison_table().any()) {
    for_each_written(r, [&](const c10::Storage& st) { poison_table().clear(st.unsafeGetStorageImpl()); });
  }
}

void Launch::replay_run_tiled(size_t begin, size_t end, int64_t numel) {
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
  if (poison_table().any()) {
    for (size_t i = begin; i < end; ++i) {
      for_each_written(records[i], [&](const c10::Storage& st) { poison_table().clear(st.unsafeGetStorageImpl()); });
    }
  }
}

// Compiled code cannot skip single ops: a launch reading a never-computed
// result replays instead, op by op.
bool Launch::reads_poison() const {
  if (!poison_table().any()) return false;
  for (const auto& st : inputs) {
    if (poison_table().why(st.unsafeGetStorageImpl())) return true;
  }
  return false;
}

// The stream skipped this launch after an earlier failure.
void Launch::skipped() {
  const std::string why = "it was skipped because an earlier op on neuron:" + std::to_string(int(device)) +
                          " stream " + std::to_string(stream_id) + " failed";
  for (const auto& r : records) for_each_written(r, [&](const c10::Storage& st) { poison_table().mark(st, why); });
}

void Launch::replay_one(Record& r) {
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
        run_host_kernel(*r.cls->out_twin, &stack);
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
    run_host_kernel(r.op, &stack);
    // Fresh results: copied into the memory the recorder gave them.
    size_t next = 0;
    auto adopt = [&](const at::Tensor& result) {
      if (next >= r.outputs.size()) {
        never_record(r.op, "its CPU kernel gave more results than its metadata said");
        TORCH_CHECK(false, "neuron: ", r.op.schema().operator_name(), "'s CPU kernel returned a result its "
                    "recorded metadata left undefined. The result was not computed; this op now runs inline, "
                    "so running the code again gives the right result.");
      }
      const auto& out = r.outputs[next++];
      if (result.sizes() != out.sizes() || result.scalar_type() != out.scalar_type()) mispredicted(result, out);
      host(out).copy_(result);
    };
    for (size_t i = 0; i < r.cls->return_arg.size(); ++i) {
      if (r.cls->return_arg[i] >= 0) continue;
      const auto& v = stack[i];
      if (v.isTensor()) {
        if (v.toTensor().defined()) adopt(v.toTensor());  // else one it was not asked for
      } else {
        for (const at::Tensor& t : v.toTensorList()) adopt(t);
      }
    }
    if (next != r.outputs.size()) {
      never_record(r.op, "its CPU kernel left a result undefined that its metadata said it computes");
      TORCH_CHECK(false, "neuron: ", r.op.schema().operator_name(), "'s CPU kernel left a recorded result "
                  "undefined. The result was not computed; this op now runs inline, so running the code again "
                  "gives the right result.");
    }
  } catch (c10::Error& e) {
    e.add_context(failure_context(r));
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, e.what(), "\n", failure_context(r));
  }
}

std::string Launch::failure_context(const Record& r) const {
  std::ostringstream out;
  out << "neuron: " << r.op.schema().operator_name() << " failed on neuron:" << int(device) << " (stream "
      << stream_id << ", in a launch of " << records.size() << " recorded op" << (records.size() == 1 ? "" : "s")
      << "); inputs " << shapes_of(r) << "; recorded at " << trace::describe(r.source);
  const std::string text = trace::source_text(r.source);
  if (!text.empty()) out << ": " << text;
  out << ". Results computed before this op keep their values; set "
         "neuron_lab.set_mode('blocking') to raise errors at the op itself.";
  return out.str();
}

void Launch::execute() {
  const int64_t start = trace::now_ns();
  bool compiled = false;
  if (graph && !replay_only && graph->state.load() == Graph::Compiled && !reads_poison()) {
    compiled = run_compiled(*graph, inputs, input_dtypes);
    if (!compiled) {
      counters().compiled_fallbacks.fetch_add(1);
      trace::Event e;
      e.time_ns = start;
      e.kind = trace::EventKind::CompiledFallback;
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

}  // namespace neuron::lazy
