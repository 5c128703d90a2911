// Result metadata of a recorded op: what its results will look like, so that they can be
// handed out before the op runs. From the op's meta kernel, cached per call signature;
// for ops whose meta kernel is torch's Python code, learned from one inline run until
// that code is loaded anyway (its first call imports torch._dynamo).
#include "adaptive_eager.h"
#include "device/csrc/python/interpreter.h"

#include <ATen/ops/empty_strided.h>
#include <c10/util/accumulate.h>

#include <Python.h>

#include <optional>
#include <unordered_map>

namespace neuron::lazy {

namespace {

// ---- output metadata from the meta kernel, cached per call signature -------------------

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
// Floating-point values are keyed by their type only when they cannot change the
// results' metadata (OpClass::float_values_free).
bool put_value(std::string& key, const c10::IValue& v, bool float_values_free) {
  if (v.isTensor()) {
    put_tensor(key, v.toTensor());
  } else if (v.isNone()) {
    key.push_back('N');
  } else if (v.isInt()) {
    key.push_back('i');
    put(key, v.toInt());
  } else if (v.isDouble()) {
    key.push_back('d');
    if (!float_values_free) put(key, v.toDouble());
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
    if (float_values_free) {
      put(key, v.toDoubleVector().size());
    } else {
      for (auto x : v.toDoubleVector()) put(key, x);
    }
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
      if (!put_value(key, e, float_values_free)) return false;
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

// The CPU kernels of layer and group norm keep their saved statistics (mean, rstd) in
// the input's dtype, or in float32 when a reduced-precision input comes with float32
// weight or bias (ATen's param_scalar_type). Their meta kernels say float32 always
// (layer norm) or the input's dtype always (group norm), so a bf16 norm's recorded
// statistics would have the wrong dtype: the CPU kernel's dtype is the one replayed.
void correct_norm_statistics(const c10::OperatorHandle& op, const c10::IValue* args, size_t n, MetaResult& r) {
  const auto& name = op.schema().name();
  size_t weight = 0;
  if (name == "aten::native_layer_norm") {
    weight = 2;
  } else if (name == "aten::native_group_norm") {
    weight = 1;
  } else {
    return;
  }
  if (n < weight + 2 || !args[0].isTensor() || r.returns.size() != 3) return;
  auto param = [&](size_t i) {
    return args[i].isTensor() && args[i].toTensor().defined() ? &args[i].toTensor() : nullptr;
  };
  const auto statistics = norm_statistics_dtype(args[0].toTensor(), param(weight), param(weight + 1));
  for (size_t k = 1; k < 3; ++k) {
    for (auto& meta : r.returns[k]) meta.dtype = statistics;
  }
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
  correct_norm_statistics(op, args, n, r);
  r.ok = true;
  return r;
}

// Result metadata by call signature (the op, and its arguments' dtypes, shapes, strides
// and values), from the meta kernel or learned from an inline run. Bounded: past
// kMaxEntries it starts over (signatures are recomputed on their next call).
class MetaCache {
 public:
  MetaPtr find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : it->second;
  }
  void remember(std::string key, MetaPtr result) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (entries_.size() > kMaxEntries) {
      entries_.clear();
      forget_checked_signatures();  // their learned metadata is gone with it
    }
    entries_.insert_or_assign(std::move(key), std::move(result));
  }

 private:
  static constexpr size_t kMaxEntries = 100000;
  std::mutex mutex_;
  std::unordered_map<std::string, MetaPtr> entries_;
};

MetaCache& meta_cache() {
  static auto* cache = new MetaCache();
  return *cache;
}

// Whether torch's Python meta kernels are cheap to call: what their first call imports
// (torch._dynamo) is loaded already.
bool python_metas_loaded() {
  static std::atomic<bool> loaded{false};
  if (loaded.load(std::memory_order_relaxed)) return true;
  if (!neuron::python_can_run()) return false;
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

}  // namespace

bool call_signature(std::string& key, const c10::OperatorHandle& op, const OpClass& cls, const c10::IValue* args,
                    size_t n) {
  put(key, static_cast<const void*>(&op.schema()));
  for (size_t i = 0; i < n; ++i) {
    if (!put_value(key, args[i], cls.float_values_free)) return false;
  }
  return true;
}

MetaPtr meta_for(const c10::OperatorHandle& op, const OpClass& cls, const c10::IValue* args, size_t n) {
  thread_local std::string key;  // reused: no allocation per op once it has grown
  key.clear();
  const bool cacheable = call_signature(key, op, cls, args, n);
  if (cacheable) {
    if (auto known = meta_cache().find(key)) return known;
  }
  std::optional<MetaResult> ruled = cls.shape_rule != nullptr ? cls.shape_rule(args, n) : std::nullopt;
  if (!ruled && cacheable && !python_metas_loaded() && meta_kernel_is_torch_python(op)) {
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
  counters().metas_computed.fetch_add(1, std::memory_order_relaxed);
  auto computed = std::make_shared<const MetaResult>(ruled ? std::move(*ruled) : compute_meta(op, cls, args, n));
  if (cacheable) meta_cache().remember(key, computed);
  return computed;
}

void forget_lesson() { tl_lesson.reset(); }

void learn_metadata_at_this_run(const c10::OperatorHandle& op, const OpClass& cls, const c10::IValue* args,
                                size_t n) {
  Lesson lesson{{}, &op.schema(), {}};
  if (!call_signature(lesson.key, op, cls, args, n)) return;
  for (size_t i = 0; i < n; ++i) {
    if (cls.write_arg[i] && args[i].isTensor() && args[i].toTensor().defined()) {
      lesson.written_sizes.emplace_back(i, args[i].toTensor().sizes().vec());
    }
  }
  tl_lesson = std::move(lesson);
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
  meta_cache().remember(std::move(lesson.key), std::make_shared<const MetaResult>(std::move(learned)));
}


}  // namespace neuron::lazy
