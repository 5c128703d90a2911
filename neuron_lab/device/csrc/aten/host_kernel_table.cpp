// The table of fast host kernels (host_kernel_table.h) and the boxed path's use of it.
#include "host_kernel_table.h"

#include "device/csrc/runtime/runtime.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <iomanip>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

namespace neuron {

struct TypedHostKernel {
  std::string op;  // "aten::add.Tensor"
  HostKernelPath path;
  table_detail::AnyFunction fn;
  const std::type_info* type;
  HostKernelInfo info;
  const std::atomic<bool>* family_enabled;
};

namespace {

std::atomic<FastPath> g_mode{FastPath::Off};

std::string qualified(const char* op, const char* overload) {
  return *overload != '\0' ? std::string(op) + "." + overload : std::string(op);
}

// Everything registered, kept for the life of the process (call sites keep pointers).
struct Table {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<std::atomic<bool>>> families;  // name -> enabled
  std::deque<TypedHostKernel> typed;
  struct Boxed {
    std::string name, overload;
    size_t n_args;
    bool out_variant;
    BoxedHostKernel kernel;
    HostKernelInfo info;
    const std::atomic<bool>* family_enabled;
  };
  std::vector<Boxed> boxed;
  bool boxed_resolved = false;

  const std::atomic<bool>* family(const char* name) {
    auto& flag = families[name];
    if (!flag) flag = std::make_unique<std::atomic<bool>>(true);
    return flag.get();
  }
};

Table& table() {
  static auto* t = new Table();  // never destroyed: static initializers of other files register into it
  return *t;
}

// A boxed entry with its operator found (at the first boxed call, after every registration).
struct ResolvedBoxed {
  c10::OperatorHandle op;
  const Table::Boxed* entry;
};

const std::vector<ResolvedBoxed>& boxed_entries() {
  static const std::vector<ResolvedBoxed> resolved = [] {
    Table& t = table();
    std::lock_guard<std::mutex> lock(t.mutex);
    t.boxed_resolved = true;
    std::vector<ResolvedBoxed> out;
    for (const auto& b : t.boxed) {
      out.push_back({c10::Dispatcher::singleton().findSchemaOrThrow(b.name.c_str(), b.overload.c_str()), &b});
    }
    return out;
  }();
  return resolved;
}

// ---- describing a call for validation errors ----------------------------------------------

void describe_tensor(std::ostringstream& s, const at::Tensor& t) {
  if (!t.defined()) {
    s << "undefined tensor";
    return;
  }
  s << "Tensor(" << t.scalar_type() << ", sizes " << t.sizes() << ", strides " << t.strides();
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) s << ", a Python number";
  const bool readable = t.device().type() == c10::DeviceType::CPU && t.has_storage() &&
                        t.storage().data() != nullptr && !at::isComplexType(t.scalar_type());
  if (readable && t.numel() > 0 && t.numel() <= 8) {
    const at::Tensor values = t.reshape({-1}).to(at::kDouble).contiguous();
    s << ", values [";
    for (int64_t i = 0; i < values.numel(); ++i) s << (i ? ", " : "") << values.const_data_ptr<double>()[i];
    s << "]";
  }
  s << ")";
}

}  // namespace

std::string describe_inputs(c10::ArrayRef<c10::IValue> inputs) {
  std::ostringstream s;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i) s << ", ";
    const c10::IValue& v = inputs[i];
    if (v.isTensor()) {
      describe_tensor(s, v.toTensor());
    } else if (v.isTensorList()) {
      s << "[";
      const auto list = v.toTensorList();
      for (size_t k = 0; k < list.size(); ++k) {
        if (k) s << ", ";
        describe_tensor(s, list[k]);
      }
      s << "]";
    } else {
      s << v;
    }
  }
  return s.str();
}

namespace {

std::string hex_bytes(const uint8_t* p, size_t n) {
  std::ostringstream s;
  s << "0x";
  for (size_t i = n; i-- > 0;) s << std::hex << std::setw(2) << std::setfill('0') << static_cast<int>(p[i]);
  return s.str();
}

bool both_nan(const uint8_t* a, const uint8_t* b, at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: {
      float x, y;
      std::memcpy(&x, a, 4);
      std::memcpy(&y, b, 4);
      return std::isnan(x) && std::isnan(y);
    }
    case at::kDouble: {
      double x, y;
      std::memcpy(&x, a, 8);
      std::memcpy(&y, b, 8);
      return std::isnan(x) && std::isnan(y);
    }
    default:
      return false;
  }
}

[[noreturn]] void differs(const HostKernelInfo& info, const std::string& op, const std::string& inputs,
                          size_t index, const std::string& what) {
  TORCH_CHECK(false, "neuron fast path: kernel '", info.kernel, "' (family ", info.family, ", mirrors ",
              info.mirrors, ") differs from ATen's kernel on ", op, ": result ", index, " ", what,
              ". Inputs: (", inputs, "). Set NEURON_LAB_FASTPATH=off to run ATen's kernels only, and report this.");
}

std::mutex g_perturb_mutex;
std::string g_perturbed;                  // guarded by g_perturb_mutex
std::atomic<bool> g_any_perturbed{false};

// Replicas of a boxed call's CPU tensors over copies of their storages, one copy per storage
// (an out= over an input stays over it): ATen's kernel then runs on the same bytes, strides
// and aliasing as the fast kernel, and writes nothing the caller sees.
class Replicas {
 public:
  c10::IValue of(const c10::IValue& v) {
    if (v.isTensor()) return of(v.toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorList()) out.push_back(of(t));
      return out;
    }
    return v;
  }

 private:
  at::Tensor of(const at::Tensor& t) {
    if (!t.defined() || !t.has_storage() || t.device().type() != c10::DeviceType::CPU) return t;
    const c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    c10::Storage copy;
    for (const auto& [original, replica] : copies_) {
      if (original == key) copy = replica;
    }
    if (!copy) {
      const size_t nbytes = t.storage().nbytes();
      copy = c10::Storage(c10::Storage::use_byte_size_t(), nbytes, c10::GetCPUAllocator(), /*resizable=*/true);
      if (nbytes > 0 && t.storage().data() != nullptr) std::memcpy(copy.mutable_data(), t.storage().data(), nbytes);
      copies_.emplace_back(key, copy);
    }
    at::Tensor r = at::empty({0}, t.options());
    r.set_(copy, t.storage_offset(), t.sizes(), t.strides());
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) r.unsafeGetTensorImpl()->set_wrapped_number(true);
    r._set_conj(t.is_conj());
    r._set_neg(t.is_neg());
    return r;
  }
  std::vector<std::pair<const c10::StorageImpl*, c10::Storage>> copies_;
};

// Warnings of ATen's reference run, kept from the user (the fast kernel's run is the real one).
class DroppedWarnings final : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override { warned = true; first = first.empty() ? warning.msg() : first; }
  bool warned = false;
  std::string first;
};

// The boxed kernel, and ATen's kernel on replicas of its inputs when it took the call.
bool run_validated(const c10::OperatorHandle& op, const Table::Boxed& e, torch::jit::Stack* stack) {
  const size_t begin = stack->size() - e.n_args;
  const std::string name = c10::toString(op.operator_name());
  const std::string inputs = describe_inputs(c10::ArrayRef<c10::IValue>(&(*stack)[begin], e.n_args));
  torch::jit::Stack reference;
  Replicas replicas;
  for (size_t i = begin; i < stack->size(); ++i) reference.push_back(replicas.of((*stack)[i]));
  const c10::IValue* args = &(*stack)[begin];
  if (!e.kernel(args, e.out_variant ? &args[e.n_args - 1] : nullptr, stack, e.n_args)) return false;
  op_counters().host_kernel_ops += 1;
  DroppedWarnings warnings;
  {
    c10::WarningUtils::WarningHandlerGuard guard(&warnings);
    op.redispatchBoxed(kCpuKeys, &reference);
  }
  const size_t returns = op.schema().returns().size();
  TORCH_INTERNAL_ASSERT(reference.size() == returns && stack->size() >= begin + returns);
  for (size_t i = 0; i < returns; ++i) {
    const c10::IValue& got = (*stack)[begin + i];
    const c10::IValue& expected = reference[i];
    if (got.isTensor() && expected.isTensor()) {
      apply_test_perturbation(e.info, got.toTensor());
      check_same_bits(e.info, name, inputs, i, got.toTensor(), expected.toTensor());
    }
  }
  if (warnings.warned) differs(e.info, name, inputs, 0, "is the same, but ATen's kernel warned: " + warnings.first);
  return true;
}

}  // namespace

FastPath fast_path() noexcept { return g_mode.load(std::memory_order_relaxed); }
void set_fast_path(FastPath mode) { g_mode.store(mode, std::memory_order_relaxed); }

void register_boxed_host_kernel(const char* op, const char* overload, size_t n_args, bool out_variant,
                                BoxedHostKernel kernel, const HostKernelInfo& info) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  TORCH_INTERNAL_ASSERT(!t.boxed_resolved, "neuron: a boxed host kernel registered after the first boxed call");
  t.boxed.push_back({op, overload, n_args, out_variant, kernel, info, t.family(info.family)});
}

namespace table_detail {

void add(const char* op, const char* overload, HostKernelPath path, AnyFunction fn, const std::type_info& type,
         const HostKernelInfo& info) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.typed.push_back({qualified(op, overload), path, fn, &type, info, t.family(info.family)});
}

const TypedHostKernel* find(const char* op, const char* overload, HostKernelPath path, const std::type_info& type) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  const std::string name = qualified(op, overload);
  for (const auto& e : t.typed) {
    if (e.path != path || e.op != name) continue;
    TORCH_INTERNAL_ASSERT(*e.type == type, "neuron: the host kernel registered for ", name,
                          " does not have the op's signature");
    return &e;
  }
  return nullptr;
}

AnyFunction function(const TypedHostKernel& entry) { return entry.fn; }

bool usable(const TypedHostKernel& entry) noexcept {
  return fast_path() != FastPath::Off && entry.family_enabled->load(std::memory_order_relaxed);
}

}  // namespace table_detail

const HostKernelInfo& info_of(const TypedHostKernel& entry) { return entry.info; }

void run_host_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const FastPath mode = fast_path();
  if (mode != FastPath::Off) {
    for (const ResolvedBoxed& r : boxed_entries()) {
      if (r.op != op) continue;
      const Table::Boxed& e = *r.entry;
      if (!e.family_enabled->load(std::memory_order_relaxed) || stack->size() < e.n_args) break;
      if (mode == FastPath::Validate) {
        if (run_validated(op, e, stack)) return;
        break;
      }
      const c10::IValue* args = &(*stack)[stack->size() - e.n_args];
      if (e.kernel(args, e.out_variant ? &args[e.n_args - 1] : nullptr, stack, e.n_args)) {
        op_counters().host_kernel_ops += 1;
        return;
      }
      break;
    }
  }
  op.redispatchBoxed(kCpuKeys, stack);
}

void check_same_layout(const HostKernelInfo& info, const std::string& op, const std::string& inputs,
                       const at::Tensor& got, const at::Tensor& expected) {
  std::ostringstream what;
  if (got.scalar_type() != expected.scalar_type()) {
    what << "has dtype " << got.scalar_type() << ", ATen's " << expected.scalar_type();
  } else if (got.sizes() != expected.sizes()) {
    what << "has sizes " << got.sizes() << ", ATen's " << expected.sizes();
  } else if (got.strides() != expected.strides()) {
    what << "has strides " << got.strides() << ", ATen's " << expected.strides();
  } else {
    return;
  }
  differs(info, op, inputs, 0, what.str());
}

void check_same_bits(const HostKernelInfo& info, const std::string& op, const std::string& inputs,
                     size_t index, const at::Tensor& got, const at::Tensor& expected, bool compare_strides) {
  std::ostringstream what;
  if (got.defined() != expected.defined()) {
    what << (got.defined() ? "is defined, ATen's is not" : "is undefined, ATen's is not");
  } else if (!got.defined()) {
    return;
  } else if (got.scalar_type() != expected.scalar_type()) {
    what << "has dtype " << got.scalar_type() << ", ATen's " << expected.scalar_type();
  } else if (got.sizes() != expected.sizes()) {
    what << "has sizes " << got.sizes() << ", ATen's " << expected.sizes();
  } else if (compare_strides && got.strides() != expected.strides() && got.numel() > 1) {
    what << "has strides " << got.strides() << ", ATen's " << expected.strides();
  } else {
    // Element by element in row-major order, as bytes.
    const at::Tensor a = got.is_conj() || got.is_neg() ? got.resolve_conj().resolve_neg() : got;
    const at::Tensor b = expected.is_conj() || expected.is_neg() ? expected.resolve_conj().resolve_neg() : expected;
    const at::Tensor ca = a.contiguous(), cb = b.contiguous();
    const size_t elem = ca.element_size();
    const auto* pa = static_cast<const uint8_t*>(ca.const_data_ptr());
    const auto* pb = static_cast<const uint8_t*>(cb.const_data_ptr());
    for (int64_t i = 0; i < ca.numel(); ++i) {
      const uint8_t* x = pa + i * elem;
      const uint8_t* y = pb + i * elem;
      if (std::memcmp(x, y, elem) == 0 || both_nan(x, y, ca.scalar_type())) continue;
      what << "differs first at element " << i << " (row-major) of " << ca.sizes() << ": " << hex_bytes(x, elem)
           << ", ATen's " << hex_bytes(y, elem);
      break;
    }
    if (what.tellp() == 0) return;
  }
  differs(info, op, inputs, index, what.str());
}

void perturb_kernel_for_tests(const std::string& kernel) {
  std::lock_guard<std::mutex> lock(g_perturb_mutex);
  g_perturbed = kernel;
  g_any_perturbed.store(!kernel.empty());
}

void apply_test_perturbation(const HostKernelInfo& info, const at::Tensor& result) {
  if (!g_any_perturbed.load(std::memory_order_relaxed) || !result.defined() || result.numel() == 0) return;
  {
    std::lock_guard<std::mutex> lock(g_perturb_mutex);
    if (g_perturbed != info.kernel) return;
  }
  auto* first = static_cast<uint8_t*>(result.mutable_data_ptr());
  *first ^= 1;
}

std::vector<HostKernelListing> host_kernel_listing() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  std::vector<HostKernelListing> out;
  for (const auto& b : t.boxed) out.push_back({qualified(b.name.c_str(), b.overload.c_str()), HostKernelPath::Boxed, b.info});
  for (const auto& e : t.typed) out.push_back({e.op, e.path, e.info});
  return out;
}

void set_family_enabled(const std::string& family, bool enabled) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.families.find(family);
  TORCH_CHECK(it != t.families.end(), "neuron: no fast host kernel family named '", family, "'");
  it->second->store(enabled);
}

bool family_enabled(const std::string& family) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.families.find(family);
  TORCH_CHECK(it != t.families.end(), "neuron: no fast host kernel family named '", family, "'");
  return it->second->load();
}

}  // namespace neuron
