// Ops whose meta kernel disagrees with their CPU kernel: the first call of each signature
// runs at once.
//
// A recorded op gets its results' metadata from its meta kernel and runs later, on the
// device thread. Where the meta kernel and the CPU kernel disagree, that goes wrong:
// * a check the CPU kernel makes and the meta kernel does not (the size of
//   fractional_max_pool2d's _random_samples, the dtype of complex's out=, whether take's
//   out= overlaps its input) raises at a later, unrelated op, where CUDA raises it on the
//   host, at the op;
// * a result whose metadata the meta kernel gets wrong (the size of mkldnn_rnn_layer's
//   workspace; the strides of linalg_eig's eigenvectors, column-major on the CPU) fails at
//   its launch, or has other strides than the CPU's, so that later ops round differently.
// Both depend on the call's signature alone (dtypes, sizes, strides, how the arguments
// alias each other, the values of non-tensor arguments): so the first call of each
// signature of such an op runs at once, where the CPU kernel's checks raise at the op and
// its results teach the recorder their metadata; only a signature the CPU kernel has
// accepted is recorded, with the metadata the CPU kernel gave. Checks on tensor values (an
// index out of range) raise later, as CUDA's device-side asserts do.
//
// Which ops: a list, and every op that draws random numbers (a Generator argument): their
// CPU kernels check their distribution's parameters on the host (uniform_'s from <= to,
// normal_'s std >= 0, multinomial's sample count), which their meta kernels do not; their
// signature keys those parameters by value, as the check sees them.
//
// Every op would be exact, but would also run the first call of every
// new shape at once (a loop whose shapes grow would never be recorded).
// test_opinfo_errors.py (PyTorch's error inputs, in every mode) and
// test_bitwise.py (results' bits and strides) fail on a new member, and check that
// each entry is still needed.
#include "adaptive_eager.h"

#include <c10/util/TypeCast.h>
#include <torch/headeronly/version.h>

#include <algorithm>
#include <map>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace neuron::lazy {
namespace {

template <typename T>
void put(std::string& key, const T& v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// Which dtypes a floating-point value overflows (a bit per dtype): what the CPU kernels'
// checked conversions of a scalar test, and all a check can see of a float value that the
// signature of a pointwise op leaves out (so that a learning rate that changes every step
// does not make every step a new signature).
template <typename T>
void overflow_bit(uint16_t& bits, int& bit, double v) {
  if (c10::overflows<T, double>(v)) bits |= static_cast<uint16_t>(1u << bit);
  ++bit;
}

uint16_t overflows(double v) {
  uint16_t bits = 0;
  int bit = 0;
  overflow_bit<c10::Half>(bits, bit, v);
  overflow_bit<c10::BFloat16>(bits, bit, v);
  overflow_bit<float>(bits, bit, v);
  overflow_bit<uint8_t>(bits, bit, v);
  overflow_bit<int8_t>(bits, bit, v);
  overflow_bit<int16_t>(bits, bit, v);
  overflow_bit<int32_t>(bits, bit, v);
  overflow_bit<int64_t>(bits, bit, v);
  return bits;
}

template <typename From>
bool overflows_dtype(From v, c10::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf: return c10::overflows<c10::Half, From>(v);
    case at::kBFloat16: return c10::overflows<c10::BFloat16, From>(v);
    case at::kFloat: return c10::overflows<float, From>(v);
    case at::kDouble: return c10::overflows<double, From>(v);
    case at::kByte: return c10::overflows<uint8_t, From>(v);
    case at::kChar: return c10::overflows<int8_t, From>(v);
    case at::kShort: return c10::overflows<int16_t, From>(v);
    case at::kInt: return c10::overflows<int32_t, From>(v);
    case at::kLong: return c10::overflows<int64_t, From>(v);
    case at::kBool: return c10::overflows<bool, From>(v);
    default: return false;  // complex and other dtypes: as before
  }
}

// What the meta signature leaves out and a check may see: for each tensor, which earlier
// tensor argument shares its memory and where it starts in it (overlap checks); the
// overflow bits of float values and of numbers wrapped as tensors.
struct CheckedParts {
  std::string& key;
  bool exact_numbers;  // key float values exactly, not by the dtypes they overflow
  c10::SmallVector<const c10::StorageImpl*, 8> storages;

  void tensor(const at::Tensor& t) {
    if (!t.defined() || !t.has_storage()) {
      key.push_back('-');
      return;
    }
    const auto* storage = t.storage().unsafeGetStorageImpl();
    int16_t shares = -1;
    for (size_t i = 0; i < storages.size(); ++i) {
      if (storages[i] == storage) shares = static_cast<int16_t>(i);
    }
    put(key, shares);
    if (shares >= 0) put(key, t.storage_offset());
    storages.push_back(storage);
    if (t.unsafeGetTensorImpl()->is_wrapped_number() && t.scalar_type() == at::kDouble) {
      put(key, overflows(*t.const_data_ptr<double>()));
    }
  }

  // False if the value cannot be keyed.
  bool value(const c10::IValue& v) {
    if (v.isTensor()) {
      tensor(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) tensor(t);
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toList()) {
        if (!value(e)) return false;
      }
    } else if (v.isDouble()) {
      if (exact_numbers) {
        put(key, v.toDouble());
      } else {
        put(key, overflows(v.toDouble()));
      }
    } else if (v.isComplexDouble()) {
      return false;
    }
    return true;
  }
};

// Signatures whose call ran at once without an error. Bounded: past kMaxEntries it starts
// over (each signature is checked again at its next call).
class CheckedSet {
 public:
  bool contains(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    return keys_.count(key) != 0;
  }
  void add(std::string key) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (keys_.size() > kMaxEntries) keys_.clear();
    keys_.insert(std::move(key));
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    keys_.clear();
  }

 private:
  static constexpr size_t kMaxEntries = 100000;
  std::mutex mutex_;
  std::unordered_set<std::string> keys_;
};

CheckedSet& checked() {
  static auto* set = new CheckedSet();
  return *set;
}

// The signature this thread's current op runs at once to be checked, and its schema.
struct Unchecked {
  std::string key;
  const c10::FunctionSchema* schema = nullptr;
};
thread_local std::optional<Unchecked> tl_unchecked;

// Ops (schema names, every overload) whose meta kernel disagrees with their CPU kernel
// in the torch this is built against, and how. tests/ops/test_opinfo_errors.py checks
// that each "check:" entry is still needed there.
const std::vector<std::pair<std::string, std::string>>& default_ops() {
  static const auto* ops = new std::vector<std::pair<std::string, std::string>>{
      {"aten::complex", "check: out='s dtype, the parts' dtypes"},
      {"aten::masked_scatter_", "check: a boolean mask"},
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 14
      {"aten::aminmax", "check: out='s dtype"},  // torch 2.14's meta kernel checks it
#endif
      {"aten::gelu", "check: the approximation's name"},
      {"aten::take", "check: out= overlapping the input or itself"},
      {"aten::gather", "check: out= overlapping the input or itself"},
      {"aten::bucketize", "check: 1-D boundaries"},
      {"aten::fractional_max_pool2d", "check: _random_samples' size"},
      {"aten::fractional_max_pool3d", "check: _random_samples' size"},
      {"aten::mkldnn_rnn_layer", "metadata: the size of the workspace result"},
      {"aten::linalg_eig", "metadata: the eigenvectors' strides (column-major on the CPU)"},
      {"aten::max_unpool2d", "metadata: a channels-last input's result strides (channels-last on the CPU)"},
      {"aten::nonzero_static", "metadata: the result's strides (row-major on the CPU)"},
  };
  return *ops;
}

std::mutex& ops_mutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::unordered_map<std::string, std::string>& ops() {
  static auto* map = new std::unordered_map<std::string, std::string>(default_ops().begin(), default_ops().end());
  return *map;
}
std::atomic<uint64_t> g_ops_version{1};

bool draws_random_numbers(const c10::FunctionSchema& schema) {
  for (const auto& arg : schema.arguments()) {
    auto type = arg.type();
    if (type->kind() == c10::TypeKind::OptionalType) type = type->expectRef<c10::OptionalType>().getElementType();
    if (type->kind() == c10::TypeKind::GeneratorType) return true;
  }
  return false;
}

// Whether the op is listed or draws; cached per thread by schema, until the list changes.
bool checks_beyond_meta(const c10::OperatorHandle& op) {
  struct Known {
    uint64_t version;
    bool listed;
  };
  thread_local std::unordered_map<const c10::FunctionSchema*, Known> known;
  const uint64_t version = g_ops_version.load(std::memory_order_acquire);
  const auto* schema = &op.schema();
  auto it = known.find(schema);
  if (it != known.end() && it->second.version == version) return it->second.listed;
  bool listed;
  {
    std::lock_guard<std::mutex> lock(ops_mutex());
    listed = ops().count(schema->name()) != 0;
  }
  listed = listed || draws_random_numbers(*schema);
  known[schema] = Known{version, listed};
  return listed;
}

}  // namespace

bool numbers_fit(const c10::OperatorHandle& op, const c10::IValue* args, size_t n) {
  const auto& defs = op.schema().arguments();
  // The tensor whose dtype the numbers are computed in: the first argument that is no mask
  // and no out= (where(condition, self, -inf) converts -inf to self's dtype, not to bool;
  // eq(x, 50256, out=) compares in x's dtype and writes bools), else the first argument
  // that is no out=, else the out= (full's only tensor).
  const at::Tensor* target = nullptr;
  auto first = [&](bool allow_bool, bool allow_out) {
    for (size_t i = 0; i < n && i < defs.size() && target == nullptr; ++i) {
      if (!args[i].isTensor() || !args[i].toTensor().defined()) continue;
      if (!allow_out && defs[i].is_out()) continue;
      if (!allow_bool && args[i].toTensor().scalar_type() == at::kBool) continue;
      target = &args[i].toTensor();
    }
  };
  first(/*allow_bool=*/false, /*allow_out=*/false);
  if (target == nullptr) first(/*allow_bool=*/true, /*allow_out=*/false);
  if (target == nullptr) first(/*allow_bool=*/true, /*allow_out=*/true);
  if (target == nullptr) return true;
  const auto dtype = target->scalar_type();
  for (size_t i = 0; i < n && i < defs.size(); ++i) {
    const c10::IValue& v = args[i];
    if (!v.isDouble() && !v.isInt() && !v.isComplexDouble()) continue;
    auto type = defs[i].type();
    if (type->kind() == c10::TypeKind::OptionalType) type = type->expectRef<c10::OptionalType>().getElementType();
    if (type->kind() != c10::TypeKind::NumberType) continue;  // a Scalar: what kernels convert to their dtype
    const bool overflows = v.isDouble() ? overflows_dtype(v.toDouble(), dtype)
                           : v.isInt()  ? overflows_dtype(v.toInt(), dtype)
                                        : overflows_dtype(v.toComplexDouble(), dtype);  // imaginary part, if real
    if (overflows) return false;
  }
  return true;
}

std::map<std::string, std::string> ops_checked_at_first_call() {
  std::lock_guard<std::mutex> lock(ops_mutex());
  return {ops().begin(), ops().end()};
}

void set_ops_checked_at_first_call(const std::map<std::string, std::string>& ops_and_why) {
  {
    std::lock_guard<std::mutex> lock(ops_mutex());
    ops() = std::unordered_map<std::string, std::string>(ops_and_why.begin(), ops_and_why.end());
  }
  g_ops_version.fetch_add(1, std::memory_order_acq_rel);
  checked().clear();  // what was recorded with another list's metadata is checked again
}

bool signature_checked(const c10::OperatorHandle& op, const OpClass& cls, const c10::IValue* args, size_t n) {
  if (!checks_beyond_meta(op)) return true;
  thread_local std::string key;  // reused: no allocation per op once it has grown
  key.clear();
  CheckedParts parts{key, draws_random_numbers(op.schema()), {}};
  bool keyed = call_signature(key, op, cls, args, n);
  for (size_t i = 0; i < n && keyed; ++i) keyed = parts.value(args[i]);
  if (!keyed) return false;  // runs at once every time: nothing to remember it by
  if (checked().contains(key)) return true;
  tl_unchecked = Unchecked{key, &op.schema()};
  learn_metadata_at_this_run(op, cls, args, n);  // the run at once teaches its results' metadata
  return false;
}

void note_checked_run(const c10::OperatorHandle& op) {
  if (!tl_unchecked.has_value()) return;
  Unchecked done = std::move(*tl_unchecked);
  tl_unchecked.reset();
  if (done.schema == &op.schema()) checked().add(std::move(done.key));  // else another op ran in between
}

void forget_unchecked() { tl_unchecked.reset(); }

void forget_checked_signatures() { checked().clear(); }

}  // namespace neuron::lazy
