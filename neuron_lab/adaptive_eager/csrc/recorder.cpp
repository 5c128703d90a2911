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
//   - the device is idle, the buffer holds at least policy().idle_flush_bytes
//     of results, and no cached graph starts like it (the first time a region
//     runs, an idle device gets work promptly; afterwards graphs follow the
//     cache, so a loop settles on the same graphs every iteration);
//   - in eager mode or under torch.use_deterministic_algorithms(True): every op.
#include "adaptive_eager.h"

#include <ATen/Context.h>
#include <ATen/core/enum_tag.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/impl/PyObjectSlot.h>
#include <torch/csrc/autograd/graph_task.h>

#include <Python.h>

#include <algorithm>
#include <array>
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
  synchronize_all("mode change");
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

void Counters::count_flush(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex);
  flushes[reason] += 1;
}

void Counters::count_sync(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex);
  syncs[reason] += 1;
}

void Counters::reset() {
  for (auto* c : {&ops_recorded, &launches, &graph_launches, &graphs_built, &cache_hits, &compiles_requested,
                  &compiles_succeeded, &compiles_failed, &compile_ns, &compiled_launches, &replay_launches,
                  &compiled_fallbacks, &compiled_rejected, &compiled_stale, &inline_ops, &dead_intermediate_bytes,
                  &live_result_bytes}) {
    c->store(0);
  }
  std::lock_guard<std::mutex> lock(mutex);
  flushes.clear();
  syncs.clear();
  inline_by_op.clear();
}

// ---- which ops can be recorded ----------------------------------------------------------

namespace {

bool draws_from_cpu_default_generator(const c10::FunctionSchema& schema) {
  return schema.name() == "aten::native_dropout";
}

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
  if (draws_from_cpu_default_generator(schema)) return refuse("it draws from the host's default generator");
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
  if (c.functional && std::all_of(c.return_arg.begin(), c.return_arg.end(), [](int a) { return a < 0; })) {
    c.out_twin = out_twin_of(op);
  }
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
    at::Tensor meta;
    std::vector<int64_t> sizes, strides;
  };
  std::vector<Written> written;
  for (size_t i = 0; i < n; ++i) {
    if (cls.write_arg[i] && stack[i].isTensor() && stack[i].toTensor().defined()) {
      const auto& t = stack[i].toTensor();
      written.push_back({t, t.sizes().vec(), t.strides().vec()});
    }
  }
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
  } catch (const std::exception&) {
    return r;  // no meta kernel, or it needs data: run the op inline
  }
  // An out= argument the kernel resizes changes metadata the user already
  // holds: only an inline run may do that.
  for (const auto& w : written) {
    if (w.meta.sizes() != c10::IntArrayRef(w.sizes) || w.meta.strides() != c10::IntArrayRef(w.strides)) return r;
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

const MetaResult& meta_for(const c10::OperatorHandle& op, const OpClass& cls, const c10::IValue* args, size_t n,
                           MetaResult& scratch) {
  static std::mutex mutex;
  static auto* cache = new std::unordered_map<std::string, MetaResult>();
  std::string key;
  key.reserve(128);
  put(key, static_cast<const void*>(&op.schema()));
  bool cacheable = true;
  for (size_t i = 0; i < n && cacheable; ++i) cacheable = put_value(key, args[i]);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache->find(key);
    if (it != cache->end()) return it->second;
  }
  scratch = compute_meta(op, cls, args, n);
  if (!cacheable) return scratch;
  std::lock_guard<std::mutex> lock(mutex);
  if (cache->size() > 100000) cache->clear();
  return cache->emplace(std::move(key), scratch).first->second;
}

// ---- the outputs a structured kernel just made ---------------------------------------
// A structured op's functional form creates its outputs with empty_strided and
// then calls the op's out= form: such outputs already have the right shape. They
// have no Python object yet, unlike a tensor a user passes as out=.

thread_local std::array<const c10::TensorImpl*, 4> tl_fresh{};
thread_local size_t tl_fresh_next = 0;

bool is_fresh_output(const at::Tensor& t) {
  const auto* impl = t.unsafeGetTensorImpl();
  if (t.numel() == 0 || impl->pyobj_slot()->load_pyobj() != nullptr) return false;
  for (const auto* f : tl_fresh) {
    if (f == impl) return true;
  }
  return false;
}

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
  bool first_known = false;  // a cached graph starts with the first record
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
void flush_locked(Buffer& b, StreamState& s, const std::string& reason) {
  if (b.records.empty()) return;
  std::vector<Record> records;
  records.swap(b.records);
  b.bytes = 0;
  b.first_checked = false;
  counters().count_flush(reason);
  const bool use_cache = mode() == Mode::Adaptive && reason != "eager";
  const int64_t start = trace::now_ns();
  launch(std::move(records), s, use_cache, reason);
  trace::add_record_time(trace::now_ns() - start);
}

}  // namespace

}  // namespace neuron::lazy

namespace neuron {

void flush_stream_buffer(c10::Stream stream, const char* reason) {
  auto& s = stream_state(stream);
  auto& b = lazy::buffer_of(s);
  auto lock = lazy::lock_buffer(b);
  lazy::flush_locked(b, s, reason);
}

void flush_device_buffers(c10::DeviceIndex device, const char* reason) {
  std::vector<std::pair<StreamState*, lazy::Buffer*>> all;
  {
    std::lock_guard<std::mutex> lock(lazy::g_buffers_mutex);
    for (auto& [s, b] : lazy::buffers()) {
      if (device < 0 || stream_of(*s).device_index() == device) all.emplace_back(s, b.get());
    }
  }
  for (auto& [s, b] : all) {
    auto lock = lazy::lock_buffer(*b);
    lazy::flush_locked(*b, *s, reason);
  }
}

}  // namespace neuron

namespace neuron::lazy {

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

  MetaResult scratch;
  const MetaResult* meta = nullptr;
  if (cls.functional || !scan.out_args_fresh) {
    meta = &meta_for(op, cls, stack->data() + begin, n, scratch);
    if (!meta->ok) return refuse("its result shapes cannot be known without running it (data-dependent or no meta kernel)");
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
  if (policy().capture_source.load(std::memory_order_relaxed)) r.source = capture_source();
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
    flush_locked(b, s, "thread switch");
  } else if (!b.records.empty() && graph_task != -1 && b.graph_task != graph_task) {
    // A backward pass starts: the forward runs while the host records the backward,
    // whose graph goes on with the optimizer's ops.
    flush_locked(b, s, "backward start");
  }
  b.owner = me;
  b.graph_task = graph_task;
  b.bytes += r.written_bytes;
  r.record_ns = trace::now_ns() - timer.start;
  b.records.push_back(std::move(r));
  const bool per_op = mode() == Mode::Eager || at::globalContext().deterministicAlgorithms();
  if (per_op) {
    flush_locked(b, s, "eager");
  } else if (static_cast<int64_t>(b.records.size()) >= policy().max_ops.load()) {
    flush_locked(b, s, "op limit");
  } else if (b.bytes >= policy().idle_flush_bytes.load() && stream_idle(s)) {
    if (!b.first_checked) {
      b.first_known = graph_starts_with(record_hash(b.records.front()));
      b.first_checked = true;
    }
    if (!b.first_known) flush_locked(b, s, "device idle");
  }
  return true;
}

bool set_recording_torch_compile_graph(bool on) {
  const bool previous = tl_in_torch_compile_graph;
  tl_in_torch_compile_graph = on;
  return previous;
}

void note_sync(const char* reason) { counters().count_sync(reason); }

void prepare_inline(const std::vector<at::Tensor>& tensors, const std::string& reason) {
  auto& c = counters();
  c.inline_ops.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    c.inline_by_op[reason] += 1;
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
  trace::SyncScope scope(reason.c_str(), device);
  {
    trace::Event e;
    e.time_ns = trace::now_ns();
    e.kind = "inline_op";
    e.what = reason;
    e.detail = tl_inline_why_string != nullptr ? *tl_inline_why_string
               : tl_inline_why != nullptr      ? tl_inline_why
                                               : "a native kernel that needs its inputs' values now";
    e.source = trace::capture();
    e.device = device;
    tl_inline_why = nullptr;
    tl_inline_why_string = nullptr;
    trace::log_event(std::move(e));
  }
  counters().count_sync(reason);
  flush_device_buffers(-1, "inline op");
  for (const auto& t : tensors) {
    if (!t.defined() || t.device().type() != kNeuron) continue;
    wait_for_storage(t.storage(), reason.c_str());
    materialize(t.storage());
  }
}

}  // namespace neuron::lazy

namespace neuron {
void sync_tensors(const std::vector<at::Tensor>& tensors, const std::string& reason) {
  lazy::prepare_inline(tensors, reason);
}
}  // namespace neuron
