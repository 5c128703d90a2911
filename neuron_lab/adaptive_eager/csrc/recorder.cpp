// Recording ops and the flush policy.
//
// An op on neuron tensors that can be recorded gets results with correct
// metadata at once (from the structured kernel's own output, or from the op's
// meta kernel) and joins the current stream's buffer. The buffer is launched
// (flushed) as one graph when:
//   - something must wait for its data: an op that cannot be recorded (a host
//     read such as item(), an op whose output shape depends on data), a copy to
//     the host, synchronize, an event, memory statistics;
//   - another thread records on the stream, or the thread switches streams;
//   - an autograd backward pass starts on the recording thread (so a training
//     step's forward is one graph, its backward and optimizer ops the next:
//     stable graphs, wherever the engine runs backward);
//   - it holds policy().max_ops ops;
//   - it starts like a cached graph of at least policy().idle_flush_ops ops and has
//     reached that graph's length: a loop settles on the same graphs every iteration,
//     whatever the device's timing (a buffer following a cached graph is not cut before
//     that length);
//   - otherwise, the device is idle and the buffer holds at least
//     policy().idle_flush_ops ops or (starting no cached graph) policy().idle_flush_bytes
//     of results: an idle device gets work promptly, and computes while the host
//     records the rest;
//   - in eager mode or under torch.use_deterministic_algorithms(True): every op.
#include "adaptive_eager.h"

#include <ATen/Context.h>
#include <ATen/core/enum_tag.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/accumulate.h>
#include <c10/util/strides.h>
#include <c10/core/impl/PyObjectSlot.h>
#include <torch/csrc/autograd/graph_task.h>

#include <Python.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <cstring>
#include <thread>
#include <unordered_map>
#include <unordered_set>

namespace neuron::lazy {

// ---- mode, policy, counters ---------------------------------------------------------

namespace {
std::atomic<int> g_mode{static_cast<int>(Mode::Adaptive)};
}

Mode mode() { return static_cast<Mode>(g_mode.load(std::memory_order_relaxed)); }

void set_mode(Mode m) {
  synchronize_all(Reason::ModeChange);
  g_mode = static_cast<int>(m);
}

bool lazy_allocation() {
  return mode() != Mode::Blocking && !on_device_thread() && !recording_memory_history();
}

Policy& policy() {
  static auto* p = new Policy();
  return *p;
}

Counters& counters() {
  static auto* c = new Counters();
  return *c;
}

void Counters::count_sync(Reason reason, std::string_view what) {
  std::lock_guard<std::mutex> lock(mutex);
  syncs[what.empty() ? std::string(reason_name(reason)) : std::string(what)] += 1;
}

void Counters::reset() {
  for (auto* c : {&ops_recorded, &launches, &graph_launches, &graphs_built, &cache_hits, &compiles_requested,
                  &compiles_succeeded, &compiles_failed, &compile_ns, &compiled_launches, &replay_launches,
                  &compiled_fallbacks, &compiled_rejected, &compiled_stale, &inline_ops, &dead_intermediate_bytes,
                  &live_result_bytes, &graphs_evicted, &tiled_runs, &tiled_ops}) {
    c->store(0);
  }
  for (auto& c : flushes) c.store(0);
  std::lock_guard<std::mutex> lock(mutex);
  syncs.clear();
  inline_by_op.clear();
}

// ---- which ops can be recorded ----------------------------------------------------------

namespace {

bool is_tensor_type(const c10::TypePtr& t) { return t->kind() == c10::TypeKind::TensorType; }
bool is_tensor_list_type(const c10::TypePtr& t) {
  return t->kind() == c10::TypeKind::ListType && is_tensor_type(t->expectRef<c10::ListType>().getElementType());
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
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name != schema.name() || name.overload_name == schema.overload_name()) continue;
    auto candidate = c10::Dispatcher::singleton().findOp(name);
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

// Whether the op's Meta kernel is Python code of torch itself (the dispatcher's
// registration record names the file).
bool meta_kernel_is_torch_python(const c10::OperatorHandle& op) {
  const std::string state = op.dumpState();
  const std::string marker = "\nMeta: registered at ";
  const auto at = state.find(marker);
  if (at == std::string::npos) return false;
  const auto end = state.find('\n', at + marker.size());
  const std::string where = state.substr(at + marker.size(), end - at - marker.size());
  return where.find(".py:") != std::string::npos &&
         where.find(std::string("torch") + static_cast<char>(std::filesystem::path::preferred_separator)) !=
             std::string::npos;
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
  // embedding_bag's offsets buffers).
  // multilabel_margin_loss's for 1-d inputs: [1] where the CPU gives [].
  for (const char* name : {"aten::native_batch_norm", "aten::_native_batch_norm_legit",
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
  c.python_meta = meta_kernel_is_torch_python(op);
  if (c.functional && std::all_of(c.return_arg.begin(), c.return_arg.end(), [](int a) { return a < 0; })) {
    c.out_twin = out_twin_of(op);
  }
  // In place and out= ops write their tensor arguments; functional ones need a twin.
  c.pointwise = op.hasTag(at::Tag::pointwise) && !op.hasTag(at::Tag::nondeterministic_seeded) &&
                (!c.functional || c.out_twin.has_value());
  return c;
}

// Classes are immutable once made: queued records point at them. An op found
// unrecordable while running (never_record) gets a second, refusing class that
// classify() returns from then on.
std::mutex g_classes_mutex;
std::atomic<size_t> g_demoted_count{0};
std::unordered_map<const void*, OpClass>& op_classes() {
  static auto* classes = new std::unordered_map<const void*, OpClass>();
  return *classes;
}
std::unordered_map<const void*, OpClass>& demoted_classes() {
  static auto* classes = new std::unordered_map<const void*, OpClass>();
  return *classes;
}

const OpClass& classify(const c10::OperatorHandle& op) {
  const void* key = &op.schema();
  std::lock_guard<std::mutex> lock(g_classes_mutex);
  if (g_demoted_count.load(std::memory_order_relaxed) > 0) {
    auto it = demoted_classes().find(key);
    if (it != demoted_classes().end()) return it->second;
  }
  auto& classes = op_classes();
  auto it = classes.find(key);
  if (it != classes.end()) return it->second;
  return classes.emplace(key, classify_uncached(op)).first->second;
}

}  // namespace

namespace {
std::mutex g_refused_twins_mutex;
std::atomic<size_t> g_refused_twins_count{0};
std::unordered_set<const void*>& refused_twins() {
  static auto* s = new std::unordered_set<const void*>();
  return *s;
}
}  // namespace

bool out_twin_refused(const c10::OperatorHandle& op) {
  if (g_refused_twins_count.load(std::memory_order_relaxed) == 0) return false;
  std::lock_guard<std::mutex> lock(g_refused_twins_mutex);
  return refused_twins().count(&op.schema()) > 0;
}

void refuse_out_twin(const c10::OperatorHandle& op) {
  std::lock_guard<std::mutex> lock(g_refused_twins_mutex);
  refused_twins().insert(&op.schema());
  g_refused_twins_count = refused_twins().size();
}

void never_record(const c10::OperatorHandle& op, const std::string& why) {
  std::lock_guard<std::mutex> lock(g_classes_mutex);
  OpClass refused;
  refused.why_not = why;
  demoted_classes().try_emplace(&op.schema(), std::move(refused));
  g_demoted_count = demoted_classes().size();
}

namespace {

// ---- output metadata from the meta kernel, cached per call signature -------------------

struct TensorMeta {
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype;
};
struct MetaResult {
  bool ok = false;
  std::vector<std::vector<TensorMeta>> returns;  // one entry per fresh return (lists hold several)
  // Empty out= arguments the kernel resizes (what a composite factory such as arange
  // passes, at::empty({0}) then arange.out): their new metadata, by argument index.
  std::vector<std::pair<size_t, TensorMeta>> resized_empty_outs;
  bool learn = false;  // not known yet: the caller runs the op inline and learns its metadata
};

template <typename T>
void put(std::string& key, const T& v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void put_tensor(std::string& key, const at::Tensor& t) {
  if (!t.defined()) {
    key.push_back('U');
    return;
  }
  key.push_back(t.device().type() == kNeuron ? 'T' : 'H');
  put(key, t.scalar_type());
  put(key, static_cast<int64_t>(t.dim()));
  for (auto s : t.sizes()) put(key, s);
  for (auto s : t.strides()) put(key, s);
}

// False if the value cannot be part of a signature (the result is then not cached).
bool put_value(std::string& key, const c10::IValue& v) {
  if (v.isTensor()) {
    put_tensor(key, v.toTensor());
  } else if (v.isNone()) {
    key.push_back('N');
  } else if (v.isInt()) {
    key.push_back('i');
    put(key, v.toInt());
  } else if (v.isDouble()) {
    key.push_back('d');
    put(key, v.toDouble());
  } else if (v.isBool()) {
    key.push_back('b');
    put(key, v.toBool());
  } else if (v.isString()) {
    key.push_back('s');
    key.append(v.toStringRef());
    key.push_back('\0');
  } else if (v.isDevice()) {
    key.push_back('D');
    put(key, v.toDevice().type());
  } else if (v.isGenerator()) {
    key.push_back('G');
  } else if (v.isIntList()) {
    key.push_back('I');
    for (auto x : v.toIntVector()) put(key, x);
    key.push_back('|');
  } else if (v.isDoubleList()) {
    key.push_back('F');
    for (auto x : v.toDoubleVector()) put(key, x);
    key.push_back('|');
  } else if (v.isBoolList()) {
    key.push_back('B');
    for (bool x : v.toBoolList()) put(key, x);
    key.push_back('|');
  } else if (v.isTensorList()) {
    key.push_back('L');
    for (const at::Tensor& t : v.toTensorList()) put_tensor(key, t);
    key.push_back('|');
  } else if (v.isList()) {
    key.push_back('O');
    for (const c10::IValue& e : v.toList()) {
      if (!put_value(key, e)) return false;
    }
    key.push_back('|');
  } else {
    return false;
  }
  return true;
}

at::Tensor to_meta(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kNeuron) return t;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
}

c10::IValue to_meta_value(const c10::IValue& v) {
  if (v.isTensor()) return to_meta(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(to_meta(t));
    return out;
  }
  if (v.isList()) {
    auto list = v.toList();
    c10::impl::GenericList out(list.elementType());
    for (const c10::IValue& e : list) out.push_back(e.isTensor() ? c10::IValue(to_meta(e.toTensor())) : e);
    return out;
  }
  if (v.isDevice() && v.toDevice().type() == kNeuron) return c10::Device(c10::kMeta);
  return v;
}

MetaResult compute_meta(const c10::OperatorHandle& op, const OpClass& cls, const c10::IValue* args, size_t n) {
  MetaResult r;
  torch::jit::Stack stack;
  stack.reserve(n);
  for (size_t i = 0; i < n; ++i) stack.push_back(to_meta_value(args[i]));
  // Meta tensors of the written arguments, to see whether the kernel resizes them.
  struct Written {
    size_t index;
    at::Tensor meta;
    std::vector<int64_t> sizes, strides;
  };
  std::vector<Written> written;
  for (size_t i = 0; i < n; ++i) {
    if (cls.write_arg[i] && stack[i].isTensor() && stack[i].toTensor().defined()) {
      const auto& t = stack[i].toTensor();
      written.push_back({i, t, t.sizes().vec(), t.strides().vec()});
    }
  }
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
  } catch (const std::exception&) {
    return r;  // no meta kernel, or it needs data: run the op inline
  }
  // An out= argument the kernel resizes changes metadata the user already holds:
  // only an inline run may do that, unless it is an empty one (try_record checks that
  // nobody but the composite kernel that made it holds it).
  for (const auto& w : written) {
    if (w.meta.sizes() == c10::IntArrayRef(w.sizes) && w.meta.strides() == c10::IntArrayRef(w.strides)) continue;
    if (c10::multiply_integers(w.sizes) != 0 || !cls.has_out_args) return r;
    r.resized_empty_outs.push_back({w.index, {w.meta.sizes().vec(), w.meta.strides().vec(), w.meta.scalar_type()}});
  }
  const size_t num_returns = op.schema().returns().size();
  if (stack.size() != num_returns) return r;
  for (size_t i = 0; i < num_returns; ++i) {
    const auto& v = stack[i];
    if (cls.return_arg[i] >= 0) continue;
    std::vector<TensorMeta> metas;
    auto add = [&](const at::Tensor& t) {
      if (!t.defined() || t.device().type() != c10::kMeta) return false;  // e.g. an output the mask skips
      metas.push_back({t.sizes().vec(), t.strides().vec(), t.scalar_type()});
      return true;
    };
    if (v.isTensor()) {
      if (!add(v.toTensor())) return r;
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) {
        if (!add(t)) return r;
      }
    } else {
      return r;
    }
    r.returns.push_back(std::move(metas));
  }
  r.ok = true;
  return r;
}

using MetaPtr = std::shared_ptr<const MetaResult>;
std::mutex g_meta_mutex;
std::unordered_map<std::string, MetaPtr>& meta_cache() {
  static auto* cache = new std::unordered_map<std::string, MetaPtr>();
  return *cache;
}

void remember_meta(std::string key, MetaPtr result) {
  std::lock_guard<std::mutex> lock(g_meta_mutex);
  if (meta_cache().size() > 100000) meta_cache().clear();
  meta_cache().insert_or_assign(std::move(key), std::move(result));
}

// Whether torch's Python meta kernels are cheap to call: what their first call imports
// (torch._dynamo) is loaded already.
bool python_metas_loaded() {
  static std::atomic<bool> loaded{false};
  if (loaded.load(std::memory_order_relaxed)) return true;
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return false;
  const PyGILState_STATE gil = PyGILState_Ensure();  // ops run without the GIL
  static PyObject* name = PyUnicode_InternFromString("torch._dynamo");  // kept for the process
  PyObject* module = PyImport_GetModule(name);
  if (module == nullptr) {
    PyErr_Clear();
  } else {
    Py_DECREF(module);
    loaded = true;
  }
  PyGILState_Release(gil);
  return loaded.load();
}

// An op refused so that its metadata is learned from an inline run: the signature,
// and its written arguments' metadata before the run (an op that resizes them stays inline).
struct Lesson {
  std::string key;
  const c10::FunctionSchema* schema = nullptr;
  std::vector<std::pair<size_t, std::vector<int64_t>>> written_sizes;
};
thread_local std::optional<Lesson> tl_lesson;

MetaPtr meta_for(const c10::OperatorHandle& op, const OpClass& cls, const c10::IValue* args, size_t n) {
  std::string key;
  key.reserve(128);
  put(key, static_cast<const void*>(&op.schema()));
  bool cacheable = true;
  for (size_t i = 0; i < n && cacheable; ++i) cacheable = put_value(key, args[i]);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(g_meta_mutex);
    auto it = meta_cache().find(key);
    if (it != meta_cache().end()) return it->second;
  }
  if (cls.python_meta && cacheable && !python_metas_loaded()) {
    Lesson lesson{key, &op.schema(), {}};
    for (size_t i = 0; i < n; ++i) {
      if (cls.write_arg[i] && args[i].isTensor() && args[i].toTensor().defined()) {
        lesson.written_sizes.emplace_back(i, args[i].toTensor().sizes().vec());
      }
    }
    tl_lesson = std::move(lesson);
    auto unknown = std::make_shared<MetaResult>();
    unknown->learn = true;
    return unknown;
  }
  auto computed = std::make_shared<const MetaResult>(compute_meta(op, cls, args, n));
  if (cacheable) remember_meta(std::move(key), computed);
  return computed;
}

// ---- the outputs a structured kernel just made ---------------------------------------
// A structured op's functional form creates its outputs with empty_strided and
// then calls the op's out= form: such outputs already have the right shape. They
// have no Python object yet, unlike a tensor a user passes as out=.

thread_local std::array<const c10::TensorImpl*, 4> tl_fresh{};
thread_local size_t tl_fresh_next = 0;

bool just_made_here(const at::Tensor& t) {
  const auto* impl = t.unsafeGetTensorImpl();
  if (impl->pyobj_slot()->load_pyobj() != nullptr) return false;
  for (const auto* f : tl_fresh) {
    if (f == impl) return true;
  }
  return false;
}

bool is_fresh_output(const at::Tensor& t) { return t.numel() > 0 && just_made_here(t); }

}  // namespace

void note_fresh_output(const at::Tensor& t) {
  tl_fresh[tl_fresh_next] = t.unsafeGetTensorImpl();
  tl_fresh_next = (tl_fresh_next + 1) % tl_fresh.size();
}

// ---- buffers ------------------------------------------------------------------------------

namespace {

struct Buffer {
  std::mutex mutex;
  std::vector<Record> records;
  std::thread::id owner;
  int graph_task = -1;  // the autograd backward pass the records were made in (-1: none)
  int64_t bytes = 0;
  bool first_checked = false;
  int64_t follow_ops = 0;  // the length of the cached graph that starts like this buffer (0: none)
};

std::mutex g_buffers_mutex;
std::unordered_map<StreamState*, std::unique_ptr<Buffer>>& buffers() {
  static auto* b = new std::unordered_map<StreamState*, std::unique_ptr<Buffer>>();
  return *b;
}

Buffer& buffer_of(StreamState& s) {
  thread_local StreamState* last_stream = nullptr;
  thread_local Buffer* last_buffer = nullptr;
  if (last_stream == &s) return *last_buffer;
  std::lock_guard<std::mutex> lock(g_buffers_mutex);
  auto& slot = buffers()[&s];
  if (!slot) slot = std::make_unique<Buffer>();
  last_stream = &s;
  last_buffer = slot.get();
  return *slot;
}

// Locks a buffer; while another thread holds it, the GIL is released so that
// thread can finish (it may need the GIL for a memory-history stack).
std::unique_lock<std::mutex> lock_buffer(Buffer& b) {
  std::unique_lock<std::mutex> lock(b.mutex, std::try_to_lock);
  if (lock.owns_lock()) return lock;
  PyThreadState* state = nullptr;
  if (Py_IsInitialized() && PyGILState_Check()) state = PyEval_SaveThread();
  lock.lock();
  if (state != nullptr) PyEval_RestoreThread(state);
  return lock;
}

// Called with the buffer locked.
void flush_locked(Buffer& b, StreamState& s, Reason reason) {
  if (b.records.empty()) return;
  std::vector<Record> records;
  records.swap(b.records);
  b.bytes = 0;
  b.first_checked = false;
  counters().count_flush(reason);
  const bool use_cache = mode() == Mode::Adaptive && reason != Reason::Eager;
  const int64_t start = trace::now_ns();
  launch(std::move(records), s, use_cache, reason);
  trace::add_record_time(trace::now_ns() - start);
}

// Whether a cached graph starts like this buffer (looked up once per buffer).
bool follows_cached_graph(Buffer& b) {
  if (!b.first_checked) {
    b.follow_ops = cached_graph_length_from(record_hash(b.records.front()));
    b.first_checked = true;
  }
  return b.follow_ops > 0;
}

}  // namespace

void flush_stream_buffer(c10::Stream stream, Reason reason) {
  auto& s = stream_state(stream);
  auto& b = buffer_of(s);
  auto lock = lock_buffer(b);
  flush_locked(b, s, reason);
}

void flush_device_buffers(c10::DeviceIndex device, Reason reason) {
  std::vector<std::pair<StreamState*, Buffer*>> all;
  {
    std::lock_guard<std::mutex> lock(g_buffers_mutex);
    for (auto& [s, b] : buffers()) {
      if (device < 0 || stream_of(*s).device_index() == device) all.emplace_back(s, b.get());
    }
  }
  for (auto& [s, b] : all) {
    auto lock = lock_buffer(*b);
    flush_locked(*b, *s, reason);
  }
}

// ---- recording --------------------------------------------------------------------------

namespace {

bool is_optional_generator(const c10::Argument& arg) {
  const auto& type = arg.type();
  if (type->kind() == c10::TypeKind::GeneratorType) return true;
  if (type->kind() != c10::TypeKind::OptionalType) return false;
  return type->expectRef<c10::OptionalType>().getElementType()->kind() == c10::TypeKind::GeneratorType;
}

// What one scan of the arguments finds.
struct Scan {
  c10::DeviceIndex device = -1;
  bool ok = true;
  bool host_tensor = false;
  int64_t written_bytes = 0;
  bool out_args_fresh = true;
};

void scan_tensor(Scan& scan, const at::Tensor& t, bool write, bool out_arg) {
  if (!t.defined()) return;
  if (t.device().type() == kNeuron) {
    if (scan.device < 0) {
      scan.device = t.device().index();
    } else if (scan.device != t.device().index()) {
      scan.ok = false;  // the inline path raises the device-mismatch error
    }
    if (write) scan.written_bytes += static_cast<int64_t>(t.numel()) * t.element_size();
    if (out_arg && !is_fresh_output(t)) scan.out_args_fresh = false;
    return;
  }
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) return;
  if (t.dim() == 0 && !write && t.device().type() == c10::kCPU) {
    scan.host_tensor = true;  // a CPU scalar: its value is copied into the record
    return;
  }
  scan.ok = false;  // host memory in a device op: inline (error, or index ops' host indices)
}

}  // namespace

namespace {
thread_local bool tl_in_torch_compile_graph = false;  // see set_recording_torch_compile_graph
// Why the last op this thread could not record runs inline (for explain()).
thread_local const char* tl_inline_why = nullptr;
thread_local const std::string* tl_inline_why_string = nullptr;

// Adds the host time of one try_record call to the tracing total.
struct RecordTimer {
  int64_t start = trace::now_ns();
  ~RecordTimer() { trace::add_record_time(trace::now_ns() - start); }
};

bool refuse(const char* why) {
  tl_inline_why = why;
  tl_inline_why_string = nullptr;
  return false;
}
}  // namespace

bool try_record(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  tl_lesson.reset();  // a lesson belongs to the call that set it, and no later one
  if (mode() == Mode::Blocking || on_device_thread()) return refuse(nullptr);
  RecordTimer timer;
  const OpClass& cls = classify(op);
  if (!cls.recordable) {
    tl_inline_why = nullptr;
    tl_inline_why_string = &cls.why_not;  // classes are cached for the life of the process
    return false;
  }
  const auto& schema = op.schema();
  const auto& arg_defs = schema.arguments();
  const size_t n = arg_defs.size();
  const size_t begin = stack->size() - n;
  Scan scan;
  for (size_t i = 0; i < n && scan.ok; ++i) {
    const auto& v = (*stack)[begin + i];
    const bool write = cls.write_arg[i];
    // Written arguments other than a structured op's fresh outputs may be
    // resized by the kernel (addbmm_ resizes self): the meta check says.
    const bool out_arg = write;
    if (v.isTensor()) {
      scan_tensor(scan, v.toTensor(), write, out_arg);
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) scan_tensor(scan, t, write, out_arg);
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toList()) {
        if (e.isTensor()) scan_tensor(scan, e.toTensor(), write, out_arg);
      }
    } else if (v.isGenerator()) {
      if (v.toGenerator().device().type() != kNeuron) scan.ok = false;
    } else if (v.isDevice()) {
      const auto d = v.toDevice();
      if (d.type() != kNeuron || (d.has_index() && scan.device >= 0 && d.index() != scan.device)) scan.ok = false;
    }
  }
  if (!scan.ok) return refuse("it mixes devices or reads host memory");
  if (scan.device < 0) return refuse("none of its arguments is on a neuron device");

  MetaPtr meta;
  if (cls.functional || !scan.out_args_fresh) {
    meta = meta_for(op, cls, stack->data() + begin, n);
    if (meta->learn) {
      return refuse("its result shapes are learned from this first run: its meta kernel is torch's Python code, "
                    "whose first call imports torch._dynamo");
    }
    if (!meta->ok) return refuse("its result shapes cannot be known without running it (data-dependent or no meta kernel)");
    for (const auto& [index, m] : meta->resized_empty_outs) {
      const auto& v = (*stack)[begin + index];
      if (!v.isTensor() || !just_made_here(v.toTensor()) || v.toTensor().storage().use_count() != 1) {
        return refuse("it resizes an out= tensor that others may hold");
      }
    }
    // Empty outputs a composite kernel just made take the size the kernel will give
    // them, in new pending memory (nobody else holds them).
    for (const auto& [index, m] : meta->resized_empty_outs) {
      const auto& t = (*stack)[begin + index].toTensor();
      auto sized = empty_pending(m.sizes, m.strides, t.scalar_type(), scan.device);
      t.unsafeGetTensorImpl()->set_storage_keep_dtype(sized.storage());
      t.unsafeGetTensorImpl()->set_sizes_and_strides(m.sizes, m.strides);
    }
  }

  Record r{op};
  r.cls = &cls;
  r.args.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    auto& v = (*stack)[begin + i];
    if (v.isGenerator()) {
      v = host_generator(v.toGenerator());
      r.random = true;
    } else if (v.isNone() && is_optional_generator(arg_defs[i])) {
      v = host_generator(default_generator(scan.device));
      r.random = true;
    } else if (scan.host_tensor && v.isTensor() && v.toTensor().defined() &&
               v.toTensor().device().type() == c10::kCPU && !v.toTensor().unsafeGetTensorImpl()->is_wrapped_number()) {
      v = v.toTensor().clone();  // the value at record time, as eager would read it
      r.has_host_tensor = true;
    }
    r.args.push_back(std::move(v));
  }
  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(begin), stack->end());
  r.written_bytes = scan.written_bytes;
  if (meta != nullptr) {
    for (const auto& ret : meta->returns) {
      for (const auto& m : ret) {
        r.outputs.push_back(empty_pending(m.sizes, m.strides, m.dtype, scan.device));
        r.written_bytes += static_cast<int64_t>(r.outputs.back().nbytes());
      }
    }
  }
  // Results: in-place and out= results are the arguments; fresh ones the outputs.
  size_t next_output = 0;
  size_t next_fresh = 0;
  for (size_t i = 0; i < cls.return_arg.size(); ++i) {
    const int a = cls.return_arg[i];
    if (a >= 0) {
      stack->push_back(r.args[static_cast<size_t>(a)]);
      continue;
    }
    const size_t count = meta->returns[next_fresh++].size();
    if (is_tensor_type(schema.returns()[i].type())) {
      stack->push_back(r.outputs[next_output++]);
    } else {
      c10::List<at::Tensor> list;
      for (size_t k = 0; k < count; ++k) list.push_back(r.outputs[next_output++]);
      stack->push_back(std::move(list));
    }
  }
  if (policy().capture_source.load(std::memory_order_relaxed)) r.source = trace::capture();
  r.in_torch_compile_graph = tl_in_torch_compile_graph;
  tl_fresh.fill(nullptr);
  counters().ops_recorded.fetch_add(1, std::memory_order_relaxed);

  // Into the buffer of the current stream, then the flush policy.
  auto& s = stream_state(current_stream(scan.device));
  auto& b = buffer_of(s);
  auto lock = lock_buffer(b);
  const auto me = std::this_thread::get_id();
  const int graph_task = torch::autograd::get_current_graph_task_id();
  if (!b.records.empty() && b.owner != me) {
    flush_locked(b, s, Reason::ThreadSwitch);
  } else if (!b.records.empty() && graph_task != -1 && b.graph_task != graph_task) {
    // A backward pass starts: the forward runs while the host records the backward,
    // whose graph goes on with the optimizer's ops.
    flush_locked(b, s, Reason::BackwardStart);
  }
  b.owner = me;
  b.graph_task = graph_task;
  b.bytes += r.written_bytes;
  r.record_ns = trace::now_ns() - timer.start;
  b.records.push_back(std::move(r));
  const bool per_op = mode() == Mode::Eager || at::globalContext().deterministicAlgorithms();
  if (per_op) {
    flush_locked(b, s, Reason::Eager);
  } else if (static_cast<int64_t>(b.records.size()) >= policy().max_ops.load()) {
    flush_locked(b, s, Reason::OpLimit);
  } else if (!tl_in_torch_compile_graph) {
    // A buffer that starts like a cached graph follows it: held to that graph's length
    // whatever the device does meanwhile, and launched there when the graph is long
    // enough to be worth keeping (a short one, cut early by an idle device, grows past
    // it), so a loop settles on the same graphs every iteration. Otherwise an idle device
    // gets the buffered work now and computes while the host records the rest (generate()
    // reads a token back every step). A torch.compile graph is launched whole at its end.
    const int64_t n = static_cast<int64_t>(b.records.size());
    const int64_t enough_ops = policy().idle_flush_ops.load();
    const bool follows = follows_cached_graph(b);
    if (follows && n == b.follow_ops && n >= enough_ops) {
      flush_locked(b, s, Reason::CachedGraphEnd);
    } else if ((!follows || n > b.follow_ops) && stream_idle(s) &&
               (n >= enough_ops || (!follows && b.bytes >= policy().idle_flush_bytes.load()))) {
      flush_locked(b, s, Reason::DeviceIdle);
    }
  }
  return true;
}

bool set_recording_torch_compile_graph(bool on) {
  const bool previous = tl_in_torch_compile_graph;
  tl_in_torch_compile_graph = on;
  return previous;
}

void learn_from_inline_run(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  if (!tl_lesson.has_value()) return;
  Lesson lesson = std::move(*tl_lesson);
  tl_lesson.reset();
  if (lesson.schema != &op.schema()) return;  // another op ran inline in between
  const auto& cls = classify(op);
  const size_t n_args = op.schema().arguments().size();
  const size_t n_returns = op.schema().returns().size();
  MetaResult learned;
  learned.ok = true;
  for (size_t i = 0; i < n_returns && learned.ok; ++i) {
    const auto& v = stack[stack.size() - n_returns + i];
    if (cls.return_arg[i] >= 0) {
      // An out= or in-place result: the op may not change its shape, unless it was an
      // empty out= tensor (a composite factory's), which takes the size the op gives it.
      const size_t arg = static_cast<size_t>(cls.return_arg[i]);
      const auto before = std::find_if(lesson.written_sizes.begin(), lesson.written_sizes.end(),
                                       [&](const auto& w) { return w.first == arg; });
      if (!v.isTensor() || before == lesson.written_sizes.end()) {
        learned.ok = false;
      } else if (v.toTensor().sizes() != c10::IntArrayRef(before->second)) {
        const auto& t = v.toTensor();
        learned.ok = c10::multiply_integers(before->second) == 0 && cls.has_out_args;
        learned.resized_empty_outs.push_back({arg, {t.sizes().vec(), t.strides().vec(), t.scalar_type()}});
      }
      continue;
    }
    std::vector<TensorMeta> metas;
    auto add = [&](const at::Tensor& t) {
      if (!t.defined() || t.device().type() != kNeuron) return false;
      metas.push_back({t.sizes().vec(), t.strides().vec(), t.scalar_type()});
      return true;
    };
    if (v.isTensor()) {
      learned.ok = add(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) learned.ok = learned.ok && add(t);
    } else {
      learned.ok = false;
    }
    learned.returns.push_back(std::move(metas));
  }
  (void)n_args;
  remember_meta(std::move(lesson.key), std::make_shared<const MetaResult>(std::move(learned)));
}

bool try_copy_from_host(const at::Tensor& dst, const at::Tensor& src) {
  if (mode() == Mode::Blocking || on_device_thread() || !lazy_allocation()) return false;
  if (src.layout() != c10::kStrided || dst.layout() != c10::kStrided || src.is_conj() || src.is_neg() ||
      dst.is_conj() || dst.is_neg() || src.device().type() != c10::kCPU) {
    return false;
  }
  RecordTimer timer;
  if (is_pending(dst.storage()) && just_made_here(dst) && dst.storage().use_count() == 1) {
    // A result just made (.to("neuron"), torch.tensor(..., device="neuron")): no launch
    // uses its memory and nobody else holds it, so the copy happens now, on the host.
    materialize(dst.storage());
    host_view(dst).copy_(src);
    tl_fresh.fill(nullptr);
    return true;
  }
  // Any other tensor: the host data is staged in device memory now (the host tensor
  // may change afterwards), and the copy into `dst` takes its place in stream order.
  auto staging = empty_pending(src.sizes(), c10::contiguous_strides(src.sizes()), src.scalar_type(),
                               dst.device().index());
  materialize(staging.storage());
  host_view(staging).copy_(src);
  static const auto copy = c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
  torch::jit::Stack stack{dst, staging, false};
  return try_record(copy, &stack);
}

void note_sync(Reason reason, std::string_view what) { counters().count_sync(reason, what); }

void prepare_inline(const std::vector<at::Tensor>& tensors, Reason reason, std::string_view what) {
  const std::string trigger = what.empty() ? std::string(reason_name(reason)) : std::string(what);
  auto& c = counters();
  c.inline_ops.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    c.inline_by_op[trigger] += 1;
  }
  // Blocking mode, or a kernel on a device thread: nothing is queued behind this work.
  if (mode() == Mode::Blocking || on_device_thread()) {
    for (const auto& t : tensors) {
      if (t.defined() && t.device().type() == kNeuron) materialize(t.storage());
    }
    return;
  }
  int device = -1;
  for (const auto& t : tensors) {
    if (t.defined() && t.device().type() == kNeuron) device = t.device().index();
  }
  trace::SyncScope scope(reason, trigger, device);
  {
    trace::Event e;
    e.time_ns = trace::now_ns();
    e.kind = "inline_op";
    e.reason = reason;
    e.what = trigger;
    e.detail = tl_inline_why_string != nullptr ? *tl_inline_why_string
               : tl_inline_why != nullptr      ? tl_inline_why
               : reason == Reason::MetadataChange
                   ? "it changes metadata (sizes, strides, storage) that queued launches read when they run"
                   : "a native kernel that needs its inputs' values now";
    e.source = trace::capture();
    e.device = device;
    tl_inline_why = nullptr;
    tl_inline_why_string = nullptr;
    trace::log_event(std::move(e));
  }
  counters().count_sync(reason, trigger);
  flush_device_buffers(-1, reason);
  for (const auto& t : tensors) {
    if (!t.defined() || t.device().type() != kNeuron) continue;
    wait_for_storage(t.storage());
    materialize(t.storage());
  }
}

// ---- the device's interceptor (neuron_lab/device/csrc/interceptor.h) -------------------

namespace {

// What the device asks of the recorder, registered when the extension loads.
class Recorder final : public OpInterceptor {
 public:
  bool active() const override { return mode() != Mode::Blocking; }
  bool try_record(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
    return lazy::try_record(op, stack);
  }
  bool try_copy_from_host(const at::Tensor& dst, const at::Tensor& src) override {
    return lazy::try_copy_from_host(dst, src);
  }
  void before_host_access(const std::vector<at::Tensor>& tensors, Reason reason, std::string_view what) override {
    prepare_inline(tensors, reason, what);
  }
  void check_readable(const at::Tensor& t) override { lazy::check_readable(t); }
  void note_written(const at::Tensor& t) override { lazy::note_written(t); }
  void after_inline_run(const c10::OperatorHandle& op, const torch::jit::Stack& stack) override {
    learn_from_inline_run(op, stack);
  }
  bool defers_allocation() const override { return lazy_allocation(); }
  void note_fresh_output(const at::Tensor& t) override { lazy::note_fresh_output(t); }
  void flush_stream(c10::Stream stream, Reason reason) override { flush_stream_buffer(stream, reason); }
  void flush_device(c10::DeviceIndex device, Reason reason) override { flush_device_buffers(device, reason); }
  void note_sync(Reason reason, std::string_view what) override { lazy::note_sync(reason, what); }
};

}  // namespace

void install_recorder(bool installed) {
  static auto* recorder = new Recorder();
  flush_device_buffers(-1, Reason::ModeChange);  // nothing stays buffered behind the switch
  set_interceptor(installed ? recorder : nullptr);
}

}  // namespace neuron::lazy
