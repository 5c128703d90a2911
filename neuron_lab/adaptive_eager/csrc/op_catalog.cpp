// Which ops can be recorded, and how their results relate to their arguments (OpClass,
// from the schema once per op), plus what running them taught the runtime: ops demoted
// to inline (never_record) and out= twins that resize their outputs (refuse_out_twin).
#include "adaptive_eager.h"

#include <ATen/core/enum_tag.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace neuron::lazy {

// ---- which ops can be recorded ----------------------------------------------------------

namespace {


// The overload names of an operator, from TorchScript's operator registry, which torch keeps
// indexed by name (every dispatcher op is added as it registers, custom ops too): no index of
// our own, and no listener for the dispatcher to tell of every op registered so far when the
// first op of a process is recorded.
std::vector<std::string> overloads_of(const c10::OperatorName& op) {
  std::vector<std::string> names;
  for (const auto& candidate : torch::jit::getAllOperatorsFor(c10::Symbol::fromQualString(op.name))) {
    names.push_back(candidate->schema().overload_name());
  }
  return names;
}

// The out= overload of a functional op whose every result is a plain tensor: the
// same arguments (names and types), then one keyword-only out tensor per result,
// each returned. Structured ops' functional kernels are their out= kernels on fresh
// outputs, so the results are the same, computed in place.
std::optional<c10::OperatorHandle> out_twin_of(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  const auto& rets = schema.returns();
  for (const auto& r : rets) {
    if (!is_tensor_type(r.type())) return std::nullopt;
  }
  for (const auto& overload : overloads_of(schema.operator_name())) {
    if (overload == schema.overload_name()) continue;
    auto candidate = c10::Dispatcher::singleton().findOp({schema.name(), overload});
    if (!candidate.has_value() || !candidate->hasSchema()) continue;
    const auto& cs = candidate->schema();
    const auto& cargs = cs.arguments();
    if (cargs.size() != args.size() + rets.size() || cs.returns().size() != rets.size()) continue;
    bool same = true;
    for (size_t i = 0; i < args.size() && same; ++i) {
      same = cargs[i].name() == args[i].name() && *cargs[i].type() == *args[i].type() &&
             cargs[i].kwarg_only() == args[i].kwarg_only() && cargs[i].alias_info() == nullptr;
    }
    for (size_t k = 0; k < rets.size() && same; ++k) {
      const auto& out = cargs[args.size() + k];
      const auto* alias = out.alias_info();
      const auto* ret_alias = cs.returns()[k].alias_info();
      same = out.kwarg_only() && is_tensor_type(out.type()) && alias != nullptr && alias->isWrite() &&
             ret_alias != nullptr && ret_alias->beforeSets() == alias->beforeSets();
    }
      if (same && candidate->hasKernelForDispatchKey(c10::DispatchKey::CPU)) return candidate;
  }
  return std::nullopt;
}

OpClass classify_uncached(const c10::OperatorHandle& op) {
  OpClass c;
  const auto& schema = op.schema();
  auto refuse = [&](std::string why) {
    c.recordable = false;
    c.why_not = std::move(why);
    return c;
  };
  if (op.hasTag(at::Tag::dynamic_output_shape) || op.hasTag(at::Tag::data_dependent_output)) {
    return refuse("its output depends on data");
  }
  if (op.hasTag(at::Tag::inplace_view)) return refuse("it changes a tensor's metadata in place");
  // Their meta kernels give other shapes than the CPU kernels for some inputs
  // (batch norm's saved statistics in eval mode, FFTs' onesided lengths,
  // embedding_bag's offsets buffers). native_batch_norm has a shape rule instead
  // (shape_rules.cpp), which runs eval mode inline.
  // multilabel_margin_loss's for 1-d inputs: [1] where the CPU gives [].
  for (const char* name : {"aten::_native_batch_norm_legit",
                           "aten::_native_batch_norm_legit_no_training", "aten::_batch_norm_with_update",
                           "aten::_batch_norm_no_update", "aten::_fft_r2c", "aten::_fft_c2r", "aten::_fft_c2c",
                           "aten::_embedding_bag", "aten::_embedding_bag_forward_only",
                           "aten::multilabel_margin_loss_forward"}) {
    if (schema.name() == name) return refuse("its meta kernel does not match its CPU kernel");
  }
  const auto& args = schema.arguments();
  c.write_arg.resize(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const auto* alias = args[i].alias_info();
    c.write_arg[i] = alias != nullptr && alias->isWrite();
    if (c.write_arg[i] && args[i].kwarg_only()) c.has_out_args = true;
    if (args[i].type()->kind() == c10::TypeKind::StorageType) return refuse("it takes a storage");
  }
  for (const auto& ret : schema.returns()) {
    const auto* alias = ret.alias_info();
    const bool tensor = is_tensor_type(ret.type());
    const bool list = is_tensor_list_type(ret.type());
    if (!tensor && !list) return refuse("it returns a value to the host");
    if (alias == nullptr) {
      c.return_arg.push_back(-1);
      c.functional = true;
      continue;
    }
    if (!alias->isWrite()) return refuse("it returns a view");
    int found = -1;
    for (size_t i = 0; i < args.size(); ++i) {
      const auto* a = args[i].alias_info();
      if (a != nullptr && a->isWrite() && a->beforeSets() == alias->beforeSets()) found = static_cast<int>(i);
    }
    if (found < 0) return refuse("its result aliases an argument in an unknown way");
    c.return_arg.push_back(found);
  }
  c.recordable = true;
  c.shape_rule = shape_rule_for(op);
  if (c.functional && std::all_of(c.return_arg.begin(), c.return_arg.end(), [](int a) { return a < 0; })) {
    c.out_twin = out_twin_of(op);
  }
  // In place and out= ops write their tensor arguments; functional ones need a twin.
  c.pointwise = op.hasTag(at::Tag::pointwise) && !op.hasTag(at::Tag::nondeterministic_seeded) &&
                (!c.functional || c.out_twin.has_value());
  // Not out= ops: an empty out= tensor takes the size the op computes (arange.out from
  // its float start, end and step).
  const bool in_place = !c.functional && !c.has_out_args;
  c.float_values_free = op.hasTag(at::Tag::pointwise) || in_place ||
                        std::string_view(schema.name()).rfind("aten::_foreach_", 0) == 0;
  return c;
}

}  // namespace

// Classes are immutable once made (queued records point at them), so each thread keeps
// the ones it used last, direct-mapped by schema, and classifies without a lock. An op
// found unrecordable while running (never_record) gets a second, refusing class that
// classify() returns from then on; demoting one bumps the generation, which empties
// every thread's cache.
class OpCatalog {
 public:
  const OpClass& classify(const c10::OperatorHandle& op) {
    const void* key = &op.schema();
    thread_local std::array<std::pair<const void*, const OpClass*>, kCached> cached{};
    thread_local uint64_t cached_generation = 0;
    const uint64_t generation = generation_.load(std::memory_order_acquire);
    if (cached_generation != generation) {
      cached.fill({nullptr, nullptr});
      cached_generation = generation;
    }
    auto& slot = cached[(reinterpret_cast<uintptr_t>(key) >> 4) % kCached];
    if (slot.first == key) return *slot.second;
    const OpClass& found = classify_locked(op, key);
    slot = {key, &found};
    return found;
  }

  void never_record(const c10::OperatorHandle& op, const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex_);
    OpClass refused;
    refused.why_not = why;
    demoted_.try_emplace(&op.schema(), std::move(refused));
    generation_.fetch_add(1, std::memory_order_release);
  }

  bool out_twin_refused(const c10::OperatorHandle& op) {
    if (refused_twins_count_.load(std::memory_order_relaxed) == 0) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    return refused_twins_.count(&op.schema()) > 0;
  }

  void refuse_out_twin(const c10::OperatorHandle& op) {
    std::lock_guard<std::mutex> lock(mutex_);
    refused_twins_.insert(&op.schema());
    refused_twins_count_ = refused_twins_.size();
  }

 private:
  static constexpr size_t kCached = 256;

  const OpClass& classify_locked(const c10::OperatorHandle& op, const void* key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto demoted = demoted_.find(key);
    if (demoted != demoted_.end()) return demoted->second;
    auto it = classes_.find(key);
    if (it != classes_.end()) return it->second;
    return classes_.emplace(key, classify_uncached(op)).first->second;  // node-based: stays put
  }

  std::mutex mutex_;
  std::atomic<uint64_t> generation_{1};
  std::unordered_map<const void*, OpClass> classes_, demoted_;
  std::atomic<size_t> refused_twins_count_{0};
  std::unordered_set<const void*> refused_twins_;
};

namespace {
OpCatalog& catalog() {
  static auto* c = new OpCatalog();  // leaked: queued records point at its classes until exit
  return *c;
}
}  // namespace

const OpClass& classify(const c10::OperatorHandle& op) { return catalog().classify(op); }

bool meta_kernel_is_torch_python(const c10::OperatorHandle& op) {
  static std::mutex mutex;
  static auto* known = new std::unordered_map<const void*, bool>();  // by schema, until exit
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = known->find(&op.schema());
    if (it != known->end()) return it->second;
  }
  // The dispatcher's registration record names the file of each kernel (~0.1M
  // instructions to print them all, once per op).
  const std::string state = op.dumpState();
  const std::string marker = "\nMeta: registered at ";
  bool python = false;
  if (const auto at = state.find(marker); at != std::string::npos) {
    const auto end = state.find('\n', at + marker.size());
    const std::string where = state.substr(at + marker.size(), end - at - marker.size());
    python = where.find(".py:") != std::string::npos &&
             where.find(std::string("torch") + static_cast<char>(std::filesystem::path::preferred_separator)) !=
                 std::string::npos;
  }
  std::lock_guard<std::mutex> lock(mutex);
  known->insert_or_assign(&op.schema(), python);
  return python;
}
bool out_twin_refused(const c10::OperatorHandle& op) { return catalog().out_twin_refused(op); }
void refuse_out_twin(const c10::OperatorHandle& op) { catalog().refuse_out_twin(op); }
void never_record(const c10::OperatorHandle& op, const std::string& why) { catalog().never_record(op, why); }


}  // namespace neuron::lazy
