// The graph cache: flushed buffers keyed by their structure, and why each new graph was built.
//
// A launch's key is its structure as words (KeyBuilder): the op sequence, each
// argument's metadata (shapes, strides, dtypes, which memory it uses), integer and
// boolean values, and which results are dead. A hit costs one hash and one comparison.
// The cache holds at most policy().graph_cache_size graphs and evicts the least
// recently used beyond that (counters().graphs_evicted): a session whose shapes keep
// changing (generate() grows its KV cache every token) does not grow without bound.
//
// Each new graph is explained at once, in the event log that explain() reads: a graph
// with the same op sequence as a cached one is a recompile, caused by the first op whose
// inputs differ; otherwise it is a new op sequence, compared with the recent graphs that
// start with the same op. Both look-ups are indexed, so building a graph costs the same
// however many graphs are cached.
#include "adaptive_eager.h"

#include <algorithm>
#include "storage_state.h"

#include <c10/util/Exception.h>

#include <cstring>
#include <deque>
#include <list>
#include <sstream>
#include <unordered_map>

namespace neuron::lazy {
namespace {

uint64_t hash_words(const int64_t* words, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<uint64_t>(words[i]);
    h *= 1099511628211ull;
    h ^= h >> 29;
  }
  return h;
}

int64_t double_bits(double d) {
  int64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  return bits;
}

// Word tags of KeyBuilder's encoding (KeyReader reads them back).
enum Tag : int64_t {
  kUndefined = 1, kDeviceTensor = 2, kWrappedNumber = 3, kHostTensor = 4, kNone = 5, kInt = 6, kDouble = 7,
  kBool = 8, kIntList = 9, kTensorList = 10, kList = 11, kGenerator = 12, kDevice = 13, kString = 14, kOther = 15,
};

// Floating-point scalars (a learning rate, Adam's bias corrections) go to `scalars`,
// not the words: launches that differ only in them share a graph, replay with their
// own values, and run compiled code only while they equal the values it was compiled
// with (Graph::compiled_scalars).
class KeyBuilder {
 public:
  explicit KeyBuilder(const std::unordered_map<const c10::StorageImpl*, int>* storage_index)
      : index_(storage_index) {}

  void tensor(const at::Tensor& t) {
    if (!t.defined()) return put(kUndefined);
    if (on_device(t)) {
      put(kDeviceTensor);
      put(index_ != nullptr ? index_->at(t.storage().unsafeGetStorageImpl()) : 0);
    } else if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
      put(kWrappedNumber);
      put(static_cast<int64_t>(t.scalar_type()));
      const auto s = wrapped_number_value(t);
      if (s.isFloatingPoint()) {
        key.scalars.push_back(double_bits(s.toDouble()));
      } else if (s.isComplex()) {
        put(double_bits(s.toComplexDouble().real())), put(double_bits(s.toComplexDouble().imag()));
      } else {
        put(s.toLong());
      }
      return;
    } else {
      put(kHostTensor);
    }
    put(static_cast<int64_t>(t.scalar_type()));
    put(t.dim());
    for (auto s : t.sizes()) put(s);
    for (auto s : t.strides()) put(s);
    put(t.storage_offset());
  }

  void value(const c10::IValue& v) {
    if (v.isTensor()) {
      tensor(v.toTensor());
    } else if (v.isNone()) {
      put(kNone);
    } else if (v.isInt()) {
      put(kInt), put(v.toInt());
    } else if (v.isDouble()) {
      put(kDouble);
      key.scalars.push_back(double_bits(v.toDouble()));
    } else if (v.isBool()) {
      put(kBool), put(v.toBool());
    } else if (v.isIntList()) {
      put(kIntList);
      auto l = v.toIntVector();
      put(static_cast<int64_t>(l.size()));
      for (auto x : l) put(x);
    } else if (v.isTensorList()) {
      put(kTensorList);
      auto l = v.toTensorList();
      put(static_cast<int64_t>(l.size()));
      for (const at::Tensor& t : l) tensor(t);
    } else if (v.isList()) {
      put(kList);
      auto l = v.toList();
      put(static_cast<int64_t>(l.size()));
      for (const c10::IValue& e : l) value(e);
    } else if (v.isGenerator()) {
      put(kGenerator);
    } else if (v.isDevice()) {
      put(kDevice), put(v.toDevice().index());
    } else if (v.isString()) {
      put(kString), put(static_cast<int64_t>(std::hash<std::string>()(v.toStringRef())));
    } else {
      put(kOther), put(static_cast<int64_t>(v.tagKind().size()));
      key.uncompilable = "an argument of an unusual type";
    }
  }

  void record(const Record& r) {
    key.op_offsets.push_back(static_cast<uint32_t>(key.words.size()));
    put(reinterpret_cast<int64_t>(&r.op.schema()));
    put(static_cast<int64_t>(r.args.size()));
    for (const auto& a : r.args) value(a);
    put(static_cast<int64_t>(r.outputs.size()));
    for (const auto& t : r.outputs) tensor(t);
    // The FX graph builder pairs each fresh return with a result: one left undefined
    // (convolution_backward's output_mask) has none.
    const auto& returns = r.op.schema().returns();
    size_t fresh = 0;
    bool lists = false;
    for (size_t i = 0; i < returns.size() && i < r.cls->return_arg.size(); ++i) {
      if (r.cls->return_arg[i] >= 0) continue;
      lists = lists || !is_tensor_type(returns[i].type());
      ++fresh;
    }
    if (!lists && fresh > r.outputs.size()) key.uncompilable = "an op that leaves a result undefined";
  }

  void put(int64_t w) { key.words.push_back(w); }

  GraphKey key;

 private:
  const std::unordered_map<const c10::StorageImpl*, int>* index_;
};

// ---- reading words back, for explanations ------------------------------------------------
//
// One reader turns an op's words back into its arguments and results (KeyReader); the
// explanations print them (describe_op) or compare them part by part (difference_in_op).

// An argument or a result of a recorded op, as its key holds it.
struct KeyValue {
  int64_t tag = kUndefined;
  int64_t memory = -1;                  // device tensors: which of the graph's buffers
  c10::ScalarType dtype = c10::ScalarType::Undefined;  // tensors and wrapped numbers
  std::vector<int64_t> sizes, strides;  // tensors
  int64_t offset = 0;                   // tensors: the storage offset
  std::vector<int64_t> words;           // scalars and int lists: the words after the tag
  std::vector<KeyValue> elements;       // lists

  bool is_tensor() const { return tag == kDeviceTensor || tag == kHostTensor; }
};

struct KeyOp {
  std::vector<KeyValue> arguments, results;
};

// Reads KeyBuilder::record's words back (a truncated key reads as zeros, never past `end`).
class KeyReader {
 public:
  KeyReader(const int64_t* begin, const int64_t* end) : at_(begin), end_(end) {}

  KeyOp op() {
    KeyOp out;
    next();  // the op
    for (int64_t i = 0, n = next(); i < n; ++i) out.arguments.push_back(value());
    for (int64_t i = 0, n = next(); i < n; ++i) out.results.push_back(tensor());
    return out;
  }

 private:
  int64_t next() { return at_ < end_ ? *at_++ : 0; }
  std::vector<int64_t> take(int64_t n) {
    std::vector<int64_t> words;
    for (int64_t i = 0; i < n; ++i) words.push_back(next());
    return words;
  }

  KeyValue tensor() {
    KeyValue v;
    v.tag = next();
    if (v.tag == kUndefined) return v;
    if (v.tag == kDeviceTensor) v.memory = next();
    v.dtype = static_cast<c10::ScalarType>(next());
    if (v.tag == kWrappedNumber) {
      // Floating values are not in the key (Graph::compiled_scalars); complex ones are two words.
      if (c10::isComplexType(v.dtype)) {
        v.words = take(2);
      } else if (!c10::isFloatingType(v.dtype)) {
        v.words = take(1);
      }
      return v;
    }
    const int64_t dim = next();
    v.sizes = take(dim);
    v.strides = take(dim);
    v.offset = next();
    return v;
  }

  KeyValue value() {
    const int64_t tag = at_ < end_ ? *at_ : 0;
    switch (tag) {
      case kUndefined: case kDeviceTensor: case kWrappedNumber: case kHostTensor: return tensor();
      default: break;
    }
    KeyValue v;
    v.tag = next();
    switch (tag) {
      case kNone: case kDouble: case kGenerator: break;  // the tag alone
      case kIntList: v.words = take(next()); break;
      case kTensorList:
        for (int64_t i = 0, n = next(); i < n; ++i) v.elements.push_back(tensor());
        break;
      case kList:
        for (int64_t i = 0, n = next(); i < n; ++i) v.elements.push_back(value());
        break;
      default: v.words = take(1); break;  // int, bool, device, a string's hash, another type's
    }
    return v;
  }

  const int64_t* at_;
  const int64_t* end_;
};

// The words of op `k` of a graph's key: [first, last).
std::pair<const int64_t*, const int64_t*> op_words(const Graph& g, size_t k) {
  const size_t begin = g.op_offsets[k];
  const size_t end = k + 1 < g.op_offsets.size() ? g.op_offsets[k + 1] : g.words_end;
  return {g.key.data() + begin, g.key.data() + end};
}

KeyOp read_op(const Graph& g, size_t k) {
  const auto [begin, end] = op_words(g, k);
  return KeyReader(begin, end).op();
}

std::string list_text(const std::vector<int64_t>& words) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < words.size(); ++i) out << (i ? ", " : "") << words[i];
  out << "]";
  return out.str();
}

// An argument as the explanations print it: "Float[2, 3]", "1", "None", "[4 tensors]".
void print(std::ostringstream& out, const KeyValue& v) {
  switch (v.tag) {
    case kUndefined: case kNone: out << "None"; return;
    case kWrappedNumber:
      if (c10::isComplexType(v.dtype)) {
        out << "complex";
      } else if (c10::isFloatingType(v.dtype)) {
        out << "float";
      } else {
        out << v.words.at(0);
      }
      return;
    case kDeviceTensor: case kHostTensor:
      out << v.dtype << list_text(v.sizes) << (v.tag == kHostTensor ? " on cpu" : "");
      return;
    case kInt: out << v.words.at(0); return;
    case kDouble: out << "float"; return;
    case kBool: out << (v.words.at(0) ? "True" : "False"); return;
    case kIntList: out << list_text(v.words); return;
    case kTensorList: out << "[" << v.elements.size() << " tensors]"; return;
    case kList:
      out << "[";
      for (size_t i = 0; i < v.elements.size(); ++i) {
        if (i) out << ", ";
        print(out, v.elements[i]);
      }
      out << "]";
      return;
    case kDevice: out << "neuron:" << v.words.at(0); return;
    case kString: out << "str"; return;
    case kGenerator: out << "Generator"; return;
    default: out << "?"; return;  // an argument of another type
  }
}

// The inputs of op `k` of a graph, as text: "(Float[2, 3], 1, None)".
std::string describe_op(const Graph& g, size_t k) {
  std::ostringstream out;
  out << "(";
  const KeyOp op = read_op(g, k);
  for (size_t i = 0; i < op.arguments.size(); ++i) {
    if (i) out << ", ";
    print(out, op.arguments[i]);
  }
  out << ")";
  return out.str();
}

// ---- what differs between two ops that print alike ---------------------------------------

// One part of an op's key: what an argument or result is made of.
struct Field {
  std::string where;  // "argument 2", "result 1", "argument 1 element 3"
  std::string what;   // memory, dtype, sizes, strides, offset, length, value
  std::vector<int64_t> words;
};

// The parts of one value, in key order.
void add_fields(const KeyValue& v, const std::string& where, std::vector<Field>& out) {
  if (v.tag == kWrappedNumber) {
    std::vector<int64_t> words{static_cast<int64_t>(v.dtype)};
    words.insert(words.end(), v.words.begin(), v.words.end());
    out.push_back({where, "value", words});
  } else if (v.is_tensor()) {
    if (v.tag == kDeviceTensor) out.push_back({where, "memory", {v.memory}});
    out.push_back({where, v.tag == kHostTensor ? "dtype on cpu" : "dtype", {static_cast<int64_t>(v.dtype)}});
    out.push_back({where, "sizes", v.sizes});
    out.push_back({where, "strides", v.strides});
    out.push_back({where, "offset", {v.offset}});
  } else if (v.tag == kTensorList || v.tag == kList) {
    out.push_back({where, "length", {static_cast<int64_t>(v.elements.size())}});
    for (size_t i = 0; i < v.elements.size(); ++i) {
      add_fields(v.elements[i], where + " element " + std::to_string(i + 1), out);
    }
  } else {
    std::vector<int64_t> words{v.tag};  // None and a list's value compare by their tags too
    words.insert(words.end(), v.words.begin(), v.words.end());
    out.push_back({where, "value", words});
  }
}

std::vector<Field> fields_of_op(const Graph& g, size_t k) {
  const KeyOp op = read_op(g, k);
  std::vector<Field> out;
  for (size_t i = 0; i < op.arguments.size(); ++i) add_fields(op.arguments[i], "argument " + std::to_string(i + 1), out);
  for (size_t i = 0; i < op.results.size(); ++i) add_fields(op.results[i], "result " + std::to_string(i + 1), out);
  return out;
}

// What differs in op `k` of graph `g` from the same op of `cached`, beyond what describe_op
// prints (which memory an argument uses, its strides or offset, a result's layout); empty
// when nothing does.
std::string difference_in_op(const Graph& g, const Graph& cached, size_t k) {
  const auto here = fields_of_op(g, k);
  const auto there = fields_of_op(cached, k);
  const std::string graph = "cached graph " + std::to_string(cached.id);
  for (size_t i = 0; i < here.size() && i < there.size(); ++i) {
    const Field& a = here[i];
    const Field& b = there[i];
    if (a.where == b.where && a.what == b.what && a.words == b.words) continue;
    if (a.where != b.where || a.what != b.what) break;  // different structure: no finer answer
    if (a.what == "memory") {
      return a.where + " uses the graph's buffer " + std::to_string(a.words[0]) + " here and buffer " +
             std::to_string(b.words[0]) + " in " + graph + " (which tensors share memory differs)";
    }
    if (a.what == "offset") {
      return a.where + " starts at element " + std::to_string(a.words[0]) + " of its memory here and at element " +
             std::to_string(b.words[0]) + " in " + graph +
             " (a view at another offset, such as a slice that moves every step)";
    }
    if (a.what == "strides") {
      return a.where + " has strides " + list_text(a.words) + " here and " + list_text(b.words) + " in " + graph +
             " (another memory layout)";
    }
    return a.where + " " + a.what + " " + list_text(a.words) + " here, " + list_text(b.words) + " in " + graph;
  }
  return "";
}

// What differs in the memory two graphs with the same ops use: a buffer's size, dtype, or
// whether it stays alive after the launch (a result the program keeps) or dies inside it.
std::string storage_difference(const Graph& g, const Graph& cached) {
  constexpr size_t kWordsPerStorage = 3;  // key_of: bytes, dead, dtype
  const size_t n = (g.key.size() - g.words_end) / kWordsPerStorage;
  const size_t n_cached = (cached.key.size() - cached.words_end) / kWordsPerStorage;
  const std::string graph = "graph " + std::to_string(cached.id);
  if (n != n_cached) {
    return "it uses " + std::to_string(n) + " buffers here and " + std::to_string(n_cached) + " in " + graph +
           " (which tensors share memory differs)";
  }
  for (size_t i = 0; i < n; ++i) {
    const int64_t* here = g.key.data() + g.words_end + i * kWordsPerStorage;
    const int64_t* there = cached.key.data() + cached.words_end + i * kWordsPerStorage;
    const std::string buffer = "buffer " + std::to_string(i);
    if (here[1] != there[1]) {
      const auto fate = [](int64_t dead) { return dead ? "dies inside the launch" : "stays alive after it"; };
      return buffer + " " + fate(here[1]) + " here and " + fate(there[1]) + " in " + graph +
             " (the program keeps another set of results)";
    }
    if (here[0] != there[0]) {
      return buffer + " holds " + std::to_string(here[0]) + " bytes here and " + std::to_string(there[0]) + " in " +
             graph + " (a view of a larger or smaller storage)";
    }
    if (here[2] != there[2]) return buffer + " has another dtype here than in " + graph;
  }
  return "the memory layout differs (which inputs alias, storage sizes, or which results stay alive)";
}

uint64_t op_words_hash(const Graph& g, size_t k) {
  const auto [begin, end] = op_words(g, k);
  return hash_words(begin, static_cast<size_t>(end - begin));
}

const c10::FunctionSchema* op_schema(const Graph& g, size_t k) {
  return reinterpret_cast<const c10::FunctionSchema*>(g.key[g.op_offsets[k]]);
}

std::string op_name(const Graph& g, size_t k) { return op_schema(g, k)->operator_name().name; }


constexpr size_t kRecentPerFirstOp = 8;

}  // namespace

// ---- the cache -------------------------------------------------------------------------------

class GraphCache {
 public:
  std::mutex mutex;  // also guards the graphs' scalar fields (launch.cpp)

  // The cached graph with this key, or a new one built and explained (mutex held).
  std::shared_ptr<Graph> find_or_build(GraphKey&& key, const std::vector<Record>& records,
                                       Reason flush_reason, bool& hit) {
    const uint64_t h = hash_words(key.words.data(), key.words.size());
    auto& bucket = by_key_[h];
    for (const auto& g : bucket) {
      if (g->key == key.words) {
        hit = true;
        lru_.splice(lru_.begin(), lru_, g->lru);
        starts_[g->first_record_hash].last_n_ops = g->n_ops;
        return g;
      }
    }
    hit = false;
    auto g = std::make_shared<Graph>();
    g->id = next_id_++;
    g->words_end = key.ops_end;
    g->op_offsets = std::move(key.op_offsets);
    g->key = std::move(key.words);
    g->key_hash = h;
    g->n_ops = static_cast<int64_t>(records.size());
    g->first_op = records.front().op.schema().operator_name().name;
    g->source = trace::describe(records.front().source);
    g->flush_reason = flush_reason;
    g->ops_hash = ops_hash_of(*g);
    g->first_record_hash = record_hash(records.front());
    auto event = explain(*g, records);
    g->cause = event.detail;
    trace::log_event(std::move(event));
    bucket.push_back(g);
    lru_.push_front(g);
    g->lru = lru_.begin();
    by_ops_[g->ops_hash] = g;
    auto& recent = by_first_op_[g->key[0]];
    recent.push_back(g);
    if (recent.size() > kRecentPerFirstOp) recent.pop_front();
    auto& start = starts_[g->first_record_hash];
    start.graphs += 1;
    start.last_n_ops = g->n_ops;
    while (lru_.size() > static_cast<size_t>(std::max<int64_t>(1, policy().graph_cache_size.load()))) {
      evict(lru_.back());
    }
    return g;
  }

  int64_t length_from(uint64_t first_record_hash) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = starts_.find(first_record_hash);
    return it == starts_.end() ? 0 : it->second.last_n_ops;
  }

  std::vector<std::shared_ptr<Graph>> all() {
    std::lock_guard<std::mutex> lock(mutex);
    return {lru_.begin(), lru_.end()};
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mutex);
    by_key_.clear();
    by_ops_.clear();
    by_first_op_.clear();
    starts_.clear();
    lru_.clear();
  }

 private:
  uint64_t ops_hash_of(const Graph& g) {
    std::vector<int64_t> ops;
    ops.reserve(g.op_offsets.size());
    for (auto o : g.op_offsets) ops.push_back(g.key[o]);
    return hash_words(ops.data(), ops.size());
  }

  void evict(std::shared_ptr<Graph> g) {
    lru_.erase(g->lru);
    auto& bucket = by_key_[g->key_hash];
    bucket.erase(std::remove(bucket.begin(), bucket.end(), g), bucket.end());
    if (bucket.empty()) by_key_.erase(g->key_hash);
    if (auto it = by_ops_.find(g->ops_hash); it != by_ops_.end() && it->second.lock() == g) by_ops_.erase(it);
    if (auto it = starts_.find(g->first_record_hash); it != starts_.end() && --it->second.graphs == 0) starts_.erase(it);
    counters().graphs_evicted.fetch_add(1, std::memory_order_relaxed);
  }

  // Why a new graph was built (mutex held).
  trace::Event explain(const Graph& g, const std::vector<Record>& records) {
    trace::Event e;
    e.time_ns = trace::now_ns();
    e.what = "graph " + std::to_string(g.id) + " (" + std::to_string(g.n_ops) + " op" + (g.n_ops == 1 ? "" : "s") +
             ", from " + g.first_op + ")";
    e.graph_id = g.id;
    e.source = records.front().source;
    std::shared_ptr<Graph> same_ops;
    if (auto it = by_ops_.find(g.ops_hash); it != by_ops_.end()) same_ops = it->second.lock();
    if (same_ops && same_ops->op_offsets.size() == g.op_offsets.size()) {
      e.kind = trace::EventKind::Recompile;
      for (size_t i = 0; i < g.op_offsets.size(); ++i) {
        if (op_words_hash(g, i) == op_words_hash(*same_ops, i)) continue;
        const std::string inputs = describe_op(g, i);
        const std::string cached_inputs = describe_op(*same_ops, i);
        const std::string finer = inputs == cached_inputs ? difference_in_op(g, *same_ops, i) : "";
        e.detail = "op " + std::to_string(i + 1) + " " + op_name(g, i) +
                   (finer.empty() ? " got inputs " + inputs + "; cached graph " + std::to_string(same_ops->id) +
                                        " has " + cached_inputs
                                  : " got inputs " + inputs + " as before, but " + finer);
        e.source = records[i].source;
        return e;
      }
      e.detail = "same ops and inputs as graph " + std::to_string(same_ops->id) + ", but " +
                 storage_difference(g, *same_ops);
      return e;
    }
    e.kind = trace::EventKind::NewGraph;
    std::shared_ptr<Graph> longest;
    size_t longest_prefix = 0;
    if (auto it = by_first_op_.find(g.key[0]); it != by_first_op_.end()) {
      for (const auto& weak : it->second) {
        auto other = weak.lock();
        if (!other) continue;
        size_t k = 0;
        while (k < g.op_offsets.size() && k < other->op_offsets.size() && op_schema(g, k) == op_schema(*other, k)) ++k;
        if (k > longest_prefix || (k == longest_prefix && longest && other->id > longest->id)) {
          longest_prefix = k;
          longest = other;
        }
      }
    }
    if (longest != nullptr) {
      const size_t k = longest_prefix;
      e.detail = "a new op sequence: its first " + std::to_string(k) + " op" + (k == 1 ? "" : "s") +
                 " match graph " + std::to_string(longest->id) + ", then ";
      if (k < g.op_offsets.size() && k < longest->op_offsets.size()) {
        e.detail += "op " + std::to_string(k + 1) + " is " + op_name(g, k) + " here and " + op_name(*longest, k) +
                    " there";
        e.source = records[k].source;
      } else if (k == g.op_offsets.size()) {
        e.detail += "this graph ends (flushed: " + std::string(reason_name(g.flush_reason)) + ") where graph " + std::to_string(longest->id) +
                    " goes on";
      } else {
        e.detail += "it goes on where graph " + std::to_string(longest->id) + " ended";
      }
    } else {
      e.detail = "the first graph starting with " + g.first_op + " (flushed: " + std::string(reason_name(g.flush_reason)) + ")";
    }
    return e;
  }

  int64_t next_id_ = 1;
  std::unordered_map<uint64_t, std::vector<std::shared_ptr<Graph>>> by_key_;
  std::list<std::shared_ptr<Graph>> lru_;  // most recently used first
  std::unordered_map<uint64_t, std::weak_ptr<Graph>> by_ops_;  // the latest graph of each op sequence
  std::unordered_map<int64_t, std::deque<std::weak_ptr<Graph>>> by_first_op_;  // recent graphs by first op
  // Cached graphs by their first record: how many, and the length of the one used last
  // (a buffer that starts with that record follows it to that length; see the flush policy).
  struct Start {
    int64_t graphs = 0;
    int64_t last_n_ops = 0;
  };
  std::unordered_map<uint64_t, Start> starts_;
};

GraphCache& graph_cache() {
  static auto* cache = new GraphCache();  // leaked: graphs may be released while the process exits
  return *cache;
}

GraphKey key_of(const std::vector<Record>& records, const std::vector<StorageUse>& storages,
                const std::unordered_map<const c10::StorageImpl*, int>& index) {
  KeyBuilder builder(&index);
  // About 8 words a tensor, a few tensors a record: one allocation instead of a regrowth per doubling.
  builder.key.words.reserve(records.size() * 32 + storages.size() * 3);
  builder.key.op_offsets.reserve(records.size());
  for (const auto& r : records) builder.record(r);
  builder.key.ops_end = builder.key.words.size();
  for (const auto& u : storages) {
    builder.put(static_cast<int64_t>(u.storage.nbytes()));
    builder.put(u.dead);
    builder.put(static_cast<int64_t>(u.dtype));
  }
  return std::move(builder.key);
}

std::shared_ptr<Graph> find_or_build_graph(GraphKey&& key, const std::vector<Record>& records,
                                           Reason flush_reason, bool& hit,
                                           const std::function<void(Graph&, bool built)>& under_lock) {
  auto& cache = graph_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto g = cache.find_or_build(std::move(key), records, flush_reason, hit);
  under_lock(*g, !hit);
  return g;
}

uint64_t record_hash(const Record& r) {
  KeyBuilder key(nullptr);
  key.record(r);
  return hash_words(key.key.words.data(), key.key.words.size());
}

int64_t cached_graph_length_from(uint64_t first_record_hash) { return graph_cache().length_from(first_record_hash); }

std::string shapes_of(const Record& r) {
  std::ostringstream out;
  out << "(";
  bool first = true;
  for (const auto& a : r.args) {
    if (!first) out << ", ";
    first = false;
    if (a.isTensor() && a.toTensor().defined() && a.toTensor().unsafeGetTensorImpl()->is_wrapped_number()) {
      out << c10::IValue(wrapped_number_value(a.toTensor()));  // a Python number, e.g. the 3 of x * 3
    } else if (a.isTensor() && a.toTensor().defined()) {
      const auto& t = a.toTensor();
      out << t.scalar_type() << t.sizes();
      if (!on_device(t)) out << " on " << t.device();
    } else if (a.isTensorList()) {
      out << "[" << a.toTensorList().size() << " tensors]";
    } else if (a.isTensor()) {
      out << "None";
    } else if (a.isList() && !a.isIntList() && !a.isDoubleList() && !a.isBoolList()) {
      // Tensor?[] (indices): shapes only; printing values would read device memory.
      out << "[";
      for (const c10::IValue& e : a.toList()) {
        if (e.isTensor()) {
          out << e.toTensor().scalar_type() << e.toTensor().sizes() << " ";
        } else {
          out << "None ";
        }
      }
      out << "]";
    } else {
      out << a;
    }
  }
  out << ")";
  return out.str();
}

std::vector<GraphInfo> graph_infos() {
  std::vector<GraphInfo> out;
  for (const auto& g : graph_cache().all()) {
    std::lock_guard<std::mutex> glock(g->mutex);
    GraphInfo i;
    i.id = g->id;
    i.n_ops = g->n_ops;
    i.hits = g->hits.load();
    i.compiled_runs = g->compiled_runs;
    i.replay_runs = g->replay_runs;
    i.scalar_changes = g->scalar_changes;
    i.replay_ms = g->replay_runs ? static_cast<double>(g->replay_ns) / g->replay_runs / 1e6 : 0.0;
    i.compiled_ms = g->compiled_runs ? static_cast<double>(g->compiled_ns) / g->compiled_runs / 1e6 : 0.0;
    static const char* tiers[] = {"replay", "compiling", "compiled", "replay (compile failed)",
                                  "replay (not compilable)", "replay (compiled was slower)"};
    i.tier = tiers[g->state.load()];
    i.note = g->note;
    if (i.note.empty() && g->state.load() == Graph::Cold && g->scalar_changes > 0) {
      i.note = "its floating-point scalars changed " + std::to_string(g->scalar_changes) +
               " time(s) (e.g. Adam's bias corrections): it replays with each launch's values and "
               "compiles once they stay the same for compile_after launches";
    }
    i.first_op = g->first_op;
    i.source = g->source;
    i.flush_reason = reason_name(g->flush_reason);
    i.cause = g->cause;
    out.push_back(std::move(i));
  }
  std::sort(out.begin(), out.end(), [](const GraphInfo& a, const GraphInfo& b) { return a.id < b.id; });
  return out;
}

// A launch of the graph ran: its tier keeps the faster code.
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

void clear_graph_cache() {
  graph_cache().clear();
  repeats().reset();  // what repeated was judged against the graphs just forgotten
  forget_graph_successors();  // so were the graphs that follow each other
  // The bookkeeping of finished launches and freed memory goes with it (what is still
  // in flight, or still allocated and never computed, stays: forgetting it would let a
  // host access skip a wait, or read a value that was never computed).
  access_table().forget_finished();
  poison_table().forget_freed();
}

}  // namespace neuron::lazy
