// Adaptive eager: ops on neuron tensors are recorded into a per-stream buffer
// and launched on the stream as small fused graphs.
//
// One folder, this header shared by its files; each file opens with its concern. The
// runtime plugs into the device through its interceptor (device/csrc/runtime/interceptor.h)
// and adds its Python submodule, _C.adaptive (python.cpp).
#pragma once

#include "device/csrc/runtime/interceptor.h"
#include "device/csrc/runtime/runtime.h"
#include "counters.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/SmallVector.h>

#include <array>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <string>
#include <string_view>
#include <vector>

namespace neuron::lazy {

// The value of a Python number wrapped as a 0-dim CPU tensor (the 3 of x * 3),
// read from its memory: no op is dispatched, so nothing active on the calling
// thread (a TorchDispatchMode, a FakeTensorMode, autocast) sees the read.
inline c10::Scalar wrapped_number_value(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kDouble: return *t.const_data_ptr<double>();
    case at::kLong: return *t.const_data_ptr<int64_t>();
    case at::kBool: return *t.const_data_ptr<bool>();
    case at::kComplexDouble: return *t.const_data_ptr<c10::complex<double>>();
    default: return t.item();
  }
}

// blocking: ops run one at a time on the caller's thread (for debugging).
// eager:    one asynchronous launch per op.
// adaptive: ops are buffered and launched as fused graphs (the default).
enum class Mode : int { Blocking = 0, Eager = 1, Adaptive = 2 };
Mode mode();
void set_mode(Mode m);  // finishes all pending work first

// Knobs of the flush policy and of the compile tier (see docs in the package).
struct Policy {
  std::atomic<int64_t> max_ops{256};             // a graph never holds more ops
  std::atomic<int64_t> max_bytes{8 << 20};       // ... nor more bytes of live results (past its newest op's)
  std::atomic<int64_t> idle_flush_bytes{1 << 20};  // an idle device gets this much work at once
  std::atomic<int64_t> idle_flush_ops{32};         // ... or this many ops
  std::atomic<int64_t> compile_after{10};        // launches of a graph before it is compiled
  // The compiled tier for graphs of eager code. Off by default: TorchInductor's code
  // rounds differently from the CPU kernels, so results would change in the last bits,
  // and from run to run, with the moment its background compile finishes. Graphs of
  // torch.compile(backend="neuron") code (whose user asked for compiled numerics) may
  // always compile.
  std::atomic<bool> compile{false};
  std::atomic<bool> capture_source{true};        // user source line per op
  std::atomic<int64_t> graph_cache_size{1024};   // graphs cached at most (least recently used evicted)
  // When recent graphs never repeat (generate(): the KV cache grows every step), building
  // each costs more than fusing saves: ops then run at once on the calling thread while
  // nothing is buffered (big ops: and the device is idle), as blocking mode runs them
  // (RepeatTracker).
  std::atomic<bool> run_unrepeated_at_once{true};
  // Where the host runs launches, graphs of small ops run at once too: replaying them there
  // costs more than running them (RepeatTracker).
  std::atomic<bool> run_at_once_on_host{true};
  // Where a device thread runs them, graphs run at once when recording them was measured
  // to cost the host more than it moved to the device (RepeatTracker).
  std::atomic<bool> run_at_once_if_cheaper{true};
};
Policy& policy();

// Whether the graphs the runtime builds repeat. It watches the last kWindow graph
// launches; when at most kMaxHitsUnrepeated of them were cache hits, graphs do not
// repeat (building them costs more than fusing saves) and ops run at once
// (Policy::run_unrepeated_at_once). So they do when at most half of them hit and their
// ops are small (under kSmallOpBytes written per op on average, in the hits and in the
// misses alike): a decoding loop whose fixed-shape prefix repeats while the rest grows.
// For ops that small the device has too little to compute for recording to hide any of
// it, so a graph pays only when it is reused; bigger ops (a training step with ragged
// batches) keep being recorded, because the device computes them while the host records
// the next. While ops run at once, it records the next stretch of ops again (a probe:
// from one host wait of the program's own to the next, a natural boundary) when the
// last kRepeatsToProbe stretches in a row each ran the same ops on the same shapes as one
// of the kRecentStretches before (a hash of each op and its tensors' sizes: the program
// repeats, so would its graphs; a decoding loop's stretches never do, its KV length grows;
// a probe begun so that misses doubles the count asked for, up to kMaxRepeatsToProbe), and
// otherwise after kProbeEvery host waits (a program whose period is longer than
// kRecentStretches stretches).
// When kRepeatingProbes stretches in a row launch only cached graphs, the program
// repeats again and recording resumes; a probe ends at its first miss. A missed probe
// whose ops (the sequence of operators, whatever their shapes) an earlier missed probe
// also ran is the same program with grown shapes: the waits to the next probe double, up
// to kMaxProbeEvery. Ops not seen before mean the program changed: the next probe comes
// after kProbeEvery waits again. Each missed probe costs a decoding loop one token recorded
// and replayed, so the waits between probes of a growing loop only grow.
// A loop whose shapes grow is recognised sooner than a full window: when kRegrownMisses
// launches of small ops miss the cache although an earlier missed launch ran the same
// operators (the same step with longer shapes), ops run at once from then on. Only
// launches of at least kMinRegrownOps ops count: a test running one op over many shapes is
// not a loop.
// Where the host runs launches (host_runs_launches), nothing computes while the host
// records: a graph's replay is the same kernels run later, on the same thread, after the
// recording, so it costs more host time than running them at once (small ops: about 3.6 us
// per op more, on tiny transformers steps and generate(); UNet, ResNet-18 and 6-layer
// 512-wide transformers steps 3-15% more; tiled replay of elementwise runs did not pay it
// back on one thread or two). So once kHostRunsWindow launches ran there, ops run at once
// (from the next op: a loop that never waits on the host ends its buffer there), and no
// probe begins there: one whose stretches launched only cached graphs could not resume
// recording, so the waits to the next chance double instead (a device thread may come, and
// then probes begin again). Not with the compiled tier on: a compiled graph is other kernels.
// Where a device thread runs launches, recording pays only where the kernels it moves off
// the host thread take longer than the host then spends recording them and waiting for
// them: running at once, the host would run those kernels instead. Both are measured over
// kCostWindow launches of cached graphs in a row (HostCost: a graph's building is paid once,
// not each step); where the host spent more, ops run at once, and a probe that
// launched only cached graphs resumes recording only if it measured the other way (else
// the waits to the next probe double). (The figures behind it: commit 8fb2638 and
// benchmarks/README.md's 1:unpinned rows.)
class RepeatTracker {
 public:
  static constexpr int kRegrownMisses = 3;
  static constexpr int64_t kMinRegrownOps = 8;
  static constexpr int kWindow = 32;
  static constexpr int kHostRunsWindow = 8;
  static constexpr int kProbeEvery = 256;
  static constexpr int kMaxProbeEvery = 1024;
  static constexpr int kRepeatingProbes = 2;
  static constexpr int kRepeatsToProbe = 4;
  static constexpr int kMaxRepeatsToProbe = 64;
  static constexpr size_t kRecentStretches = 64;
  static constexpr int kMaxHitsUnrepeated = kWindow / 8;
  static constexpr int kMaxHitsOfSmallOps = kWindow / 2;
  static constexpr int64_t kSmallOpBytes = 16 << 10;
  // A graph launch: whether its graph came from the cache, the hash of its operator
  // sequence (shapes aside), how many ops it holds and how many bytes they write.
  void note_graph_launch(bool hit, uint64_t ops_hash, int64_t ops, int64_t written_bytes);
  // The host waited for the device, for `reason` (a natural boundary for a probe).
  void note_host_wait(Reason reason);
  // Whether the next op, arriving with nothing buffered and the device idle, runs at once.
  bool run_at_once() const { return unrepeated_.load(std::memory_order_relaxed) && !probing_.load(std::memory_order_relaxed); }
  bool unrepeated() const { return unrepeated_.load(std::memory_order_relaxed); }
  // Whether a probe records a stretch to find out if graphs repeat again.
  bool probing() const { return probing_.load(std::memory_order_relaxed); }
  // Whether the launches that made ops run at once wrote under kSmallOpBytes per op: such
  // an op waits for a launch still running rather than be recorded behind it.
  bool ops_are_small() const { return small_ops_.load(std::memory_order_relaxed); }
  void reset();

 private:
  std::mutex mutex_;
  uint64_t window_ = 0;  // hit bits of the last launches, newest lowest
  int seen_ = 0;         // launches in the window (up to kWindow)
  // Ops and bytes written of the window's launches, a ring (next_launch_ the oldest).
  std::array<int64_t, kWindow> launch_ops_{}, launch_bytes_{};
  int next_launch_ = 0;
  int waits_ = 0;        // host waits since the last probe
  int probe_every_ = kProbeEvery;  // host waits from one probe to the next
  std::array<uint64_t, 8> missed_ops_{};  // operator sequences of recent missed probes
  size_t next_missed_ = 0;
  // While recording: operator sequences of recent missed launches of small ops, and how
  // many later misses ran one of them again.
  std::array<uint64_t, 8> recorded_misses_{};
  size_t next_recorded_miss_ = 0;
  int regrown_misses_ = 0;
  // Whether this miss repeats the operators of an earlier one with other shapes.
  bool note_recorded_miss_locked(uint64_t ops_hash, int64_t ops, int64_t written_bytes);
  // Hashes of the last stretches run at once (a thread's ops and shapes between two of the
  // program's host waits): one that comes again means the program repeats.
  std::array<uint64_t, kRecentStretches> recent_stretches_{};
  size_t next_stretch_ = 0;
  int repeated_stretches_ = 0;                // in a row, up to the last wait
  int repeats_to_probe_ = kRepeatsToProbe;    // in a row, to begin a probe (doubles as such probes miss)
  bool probe_from_repeats_ = false;           // this probe began on repeated stretches
  int repeating_probes_ = 0;     // stretches of this probe that launched only cached graphs
  bool probe_launched_ = false;  // this stretch of the probe has launched (only hits so far)
  void end_probe_locked();
  // How recording is judged now, from who runs launches (host_runs_launches) and the
  // policy's knobs: asked once per launch noted, and at a probe's decisions.
  enum class Judged : uint8_t {
    AsRepeats,             // by whether graphs repeat only
    HostReplaysCostMore,   // the host runs launches: a replay costs more than running at once
    CostWeighed,           // a device thread runs them: the host's cost is weighed
  };
  static Judged judged();
  // Whether recording pays (replaying costs no more than running); where not, the repeats
  // and waits to the next probe double. Asked before a probe begins and after one hit.
  bool recording_would_pay_locked(Judged judged_now);
  // What recording has cost the host, and what the device computed, since a moment
  // (trace's running totals): recording pays where busy_ns exceeds the host's share.
  struct HostCost {
    int64_t record_ns = 0, wait_ns = 0, busy_ns = 0;
    static HostCost now();
    HostCost since(const HostCost& start) const;
    // By a fifth at least: running at once costs the host its kernels and its own per-op path
    // too (host aliases, result copies), which busy time does not show.
    bool recording_costs_more() const { return (record_ns + wait_ns) * 5 > busy_ns * 6; }
  };
  // Whether the launches since the cost window began (kCostWindow cache hits in a row, each
  // noted here) cost the host more than they kept the device busy; `spent` gets the figures.
  bool recording_cost_more_locked(Judged judged, bool hit, HostCost& spent);
  static constexpr int kCostWindow = 16;
  int cost_launches_ = 0;  // launches noted since cost_start_
  HostCost probe_cost_start_;  // at the end of the probe's first stretch that launched only hits
  HostCost cost_start_;
  // Why ops start running at once (the event log's words).
  enum class Unrepeated { FewHits, SmallOpsHalfHits, Regrown, HostRunsLaunches, RecordingCostsMore };
  // small_op_bytes: the bytes written per op by the launches that made it switch.
  void set_unrepeated_locked(bool unrepeated, Unrepeated why = Unrepeated::FewHits, int64_t small_op_bytes = 0,
                             const HostCost* spent = nullptr);
  std::atomic<bool> unrepeated_{false};
  std::atomic<bool> probing_{false};
  std::atomic<bool> small_ops_{false};
};
RepeatTracker& repeats();

// The runtime's counters: counters.h.

// ---- recorder.cpp ------------------------------------------------------------
// Records the op on the stack if the current mode and the op allow it; returns
// false when the caller must run it inline (after prepare_inline).
bool try_record(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// From now on the op runs inline, for the given reason (its meta kernel was found to
// predict other result shapes than its CPU kernel gives).
void never_record(const c10::OperatorHandle& op, const std::string& why);
// An out= twin that resized its output (other semantics than the functional op's) is
// not used again: the op replays through its functional kernel and a copy.
bool out_twin_refused(const c10::OperatorHandle& op);
void refuse_out_twin(const c10::OperatorHandle& op);
// After an op that try_record refused so as to learn its result metadata ran inline:
// the metadata of its results (on `stack`) answers the same call from then on.
void learn_from_inline_run(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
// A copy from host memory into a neuron tensor without waiting for the device (a result
// just made takes the bytes now; another tensor gets them through staged device memory
// and a recorded copy); false when it must run inline.
bool try_copy_from_host(const at::Tensor& dst, const at::Tensor& src);
// Before an op runs inline on the caller's thread: launches what is buffered
// and waits for every launch that uses the given tensors' memory.
void prepare_inline(c10::ArrayRef<at::Tensor> tensors, Reason reason, std::string_view what);
// Notes a tensor just created by an empty kernel for a structured op's output.
void note_fresh_output(const at::Tensor& t);
// Forgets which cached graphs follow each other (their joins), with the graph cache.
void forget_graph_successors();
// True when new tensors should be created pending (lazy modes).
bool lazy_allocation();
void note_sync(Reason reason, std::string_view what);
// Launch the ops a stream has buffered, or every buffered op of a device (-1: all).
void flush_stream_buffer(c10::Stream stream, Reason reason);
void flush_device_buffers(c10::DeviceIndex device, Reason reason);
// Registers the recorder as the device's interceptor (interceptor.h), when the extension
// loads; false unregisters it, leaving the device alone (a test of the device by itself).
void install_recorder(bool installed = true);

struct MetaResult;
// Result metadata computed in C++ for an op whose meta kernel is Python (shape_rules.cpp):
// a result that is not ok runs the call inline (ATen rejects it: its error is raised at
// the op); std::nullopt where the rule is not sure, and the meta kernel decides.
using ShapeRule = std::optional<MetaResult> (*)(const c10::IValue* args, size_t n);

// How an op's results relate to its arguments (from its schema).
struct OpClass {
  bool recordable = false;
  std::string why_not;          // why it runs inline instead
  bool has_out_args = false;    // keyword-only written arguments (out=)
  bool functional = false;      // returns fresh tensors
  std::vector<int> return_arg;  // per return: the argument it is, or -1 (fresh)
  std::vector<bool> write_arg;  // per argument: written by the op
  // A functional op's out= overload (same arguments, then one out tensor per result):
  // replay writes the results straight into the memory the recorder gave them.
  std::optional<c10::OperatorHandle> out_twin;
  // Result metadata in C++ for a few ops whose meta kernel is Python (shape_rules.cpp).
  ShapeRule shape_rule = nullptr;
  // An elementwise op (tagged pointwise, draws no random numbers) whose results replay
  // through its out= twin or in place: a run of them can replay tile by tile (tiled.cpp).
  bool pointwise = false;
  // Its results' metadata cannot depend on the values of its floating-point arguments
  // (pointwise, foreach and in-place ops): the metadata cache keys them by type only, so
  // an optimizer step whose learning rate or bias correction changes every step hits it.
  bool float_values_free = false;
};

// ---- op_catalog.cpp -------------------------------------------------------------------
// The class of an op (made once per op, lock-free per call after a thread's first).
const OpClass& classify(const c10::OperatorHandle& op);
// Whether the op's meta kernel is torch's Python code (torch._meta_registrations, refs):
// its first call imports torch._dynamo and more (about a second). Until that is loaded
// anyway, the op's result metadata is learned from running it inline once per signature.
// Found once per op, when first asked.
bool meta_kernel_is_torch_python(const c10::OperatorHandle& op);

// ---- result_meta.cpp ------------------------------------------------------------------
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
using MetaPtr = std::shared_ptr<const MetaResult>;
// The metadata of the results of this call of the op (args: its n arguments).
MetaPtr meta_for(const c10::OperatorHandle& op, const OpClass& cls, const c10::IValue* args, size_t n);
// ---- shape_rules.cpp -------------------------------------------------------------------
ShapeRule shape_rule_for(const c10::OperatorHandle& op);
// convolution_rules.cpp: aten::convolution's and convolution_backward's rules (else null).
// A fresh Tensor return with no metadata is an undefined result (an output_mask's false).
ShapeRule convolution_shape_rule(const c10::OperatorHandle& op);
// The dtype of layer and group norm's saved mean and rstd on the CPU: float32 for a
// reduced-precision input with float32 weight or bias (ATen's param_scalar_type), else
// the input's.
c10::ScalarType norm_statistics_dtype(const at::Tensor& input, const at::Tensor* weight, const at::Tensor* bias);

// Drops a lesson meta_for left for the calling thread (the call did not run inline).
void forget_lesson();
// Makes the calling thread's current op, about to run at once, teach the metadata cache its
// results' metadata (learn_from_inline_run), whatever its meta kernel says.
void learn_metadata_at_this_run(const c10::OperatorHandle& op, const OpClass& cls, const c10::IValue* args,
                                size_t n);
// Appends the call's signature (the op; its arguments' dtypes, shapes, strides and values)
// to key; false if an argument cannot be part of one.
bool call_signature(std::string& key, const c10::OperatorHandle& op, const OpClass& cls, const c10::IValue* args,
                    size_t n);

// ---- checked_signatures.cpp ------------------------------------------------------------
// For an op whose meta kernel disagrees with its CPU kernel (a check it misses, a result's
// metadata): whether a call of this signature ran at once without an error before (the
// checks passed, the results' metadata is learned); only then may it be recorded. If not,
// the call runs at once and note_checked_run, after it succeeds, remembers the signature.
// Other ops: true.
bool signature_checked(const c10::OperatorHandle& op, const OpClass& cls, const c10::IValue* args, size_t n);
void note_checked_run(const c10::OperatorHandle& op);
// Drops what signature_checked left for the calling thread (a new op starts).
void forget_unchecked();
// Whether every number (Scalar) argument fits the dtype of the tensor the op writes (else
// its first tensor that is not a bool mask). Kernels
// convert such numbers to their dtype with a check that meta kernels lack (threshold, elu,
// full, masked_fill_ raise on a value that overflows it): a call with one that does not fit
// runs at once, where the CPU kernel raises or not, at the op.
bool numbers_fit(const c10::OperatorHandle& op, const c10::IValue* args, size_t n);
// The ops whose first call of each signature runs at once ({schema name: how their meta
// kernel disagrees}); tests replace them.
std::map<std::string, std::string> ops_checked_at_first_call();
void set_ops_checked_at_first_call(const std::map<std::string, std::string>& ops_and_why);
// Forgets every checked signature (the metadata cache starts over: what it learned is gone).
void forget_checked_signatures();

struct Record {
  c10::OperatorHandle op;
  const OpClass* cls = nullptr;
  std::vector<c10::IValue> args;     // neuron tensors stay neuron tensors
  std::vector<at::Tensor> outputs;   // results made by the recorder (functional ops)
  int64_t written_bytes = 0;
  int64_t record_ns = 0;  // host time spent recording it
  int64_t record_start_ns = 0;  // when recording began
  trace::Source source;
  uint64_t correlation = 0;  // while profiling: the torch.profiler op that recorded it
  int32_t host_tid = 0;      // while profiling: the recording thread
  bool random = false;       // draws from a generator
  bool has_host_tensor = false;  // a CPU tensor argument (not a wrapped number)
  bool in_torch_compile_graph = false;  // recorded while a torch.compile graph ran
};

// A neuron tensor (not a CPU tensor or an undefined one).
inline bool on_device(const at::Tensor& t) { return t.defined() && t.device().type() == kNeuron; }
// Schema types: Tensor, and Tensor[].
inline bool is_tensor_type(const c10::TypePtr& t) { return t->kind() == c10::TypeKind::TensorType; }
inline bool is_tensor_list_type(const c10::TypePtr& t) {
  return t->kind() == c10::TypeKind::ListType && is_tensor_type(t->expectRef<c10::ListType>().getElementType());
}

// Every tensor in an argument: itself, or the tensors of a list.
template <typename F>
void for_each_tensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) f(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toList()) {
      if (e.isTensor()) f(e.toTensor());
    }
  }
}

// Every tensor a record reads or writes, with whether it writes it.
template <typename F>
void for_each_record_tensor(const Record& r, F&& f) {
  for (size_t i = 0; i < r.args.size(); ++i) {
    const bool write = r.cls->write_arg[i];
    for_each_tensor(r.args[i], [&](const at::Tensor& t) { f(t, write); });
  }
  for (const auto& t : r.outputs) f(t, true);
}

// While set on a thread, the ops it records belong to a graph of torch.compile'd code
// (the neuron backend's async launches): their graphs may compile whatever the policy.
// Returns the previous value.
bool set_recording_torch_compile_graph(bool on);

// One memory (storage) a launch uses.
struct StorageUse {
  c10::Storage storage;
  c10::ScalarType dtype = c10::ScalarType::Float;  // of its first use
  bool mixed_dtypes = false;
  bool written = false;
  bool dead = false;  // a pending result nothing outside the launch holds
  c10::SmallVector<const c10::TensorImpl*, 2> impls;  // most storages have one or two tensors
  int64_t first_record = 0, last_record = 0;  // the records of the launch that use it
};

// The storages a launch's records use, in order of first use (index: a storage's place),
// with which pending results are dead (nothing but the records holds them).
struct StorageUses {
  std::vector<StorageUse> storages;
  std::unordered_map<const c10::StorageImpl*, int> index;
};
StorageUses storage_uses(const std::vector<Record>& records);
// Bytes of the records' pending results that something outside them holds (the memory
// their launch would give now), but the newest record's, which the program holds anyway.
int64_t live_pending_bytes(const std::vector<Record>& records);

// ---- scratch.cpp ---------------------------------------------------------------------
// A dead intermediate of a launch and the records that use it.
struct ScratchUse {
  c10::Storage storage;
  int64_t first = 0, last = 0;
};
// Gives the (pending) storages host scratch memory, those whose uses do not overlap
// sharing one buffer, buffers taken from a pool kept warm across launches.
void give_scratch(const std::vector<ScratchUse>& uses);
// Bytes the pool keeps for later launches; release_cached_scratch() frees them (empty_cache()).
size_t scratch_cached_bytes();
void release_cached_scratch();

// ---- tiled.cpp ---------------------------------------------------------------------------
// Tiled replay: a run of elementwise ops over tensors of one size replays tile by tile,
// each tile through every op of the run while it is in cache, with eager mode's bits.
// The end of the run of such records that starts at `begin` (begin when none), and the
// element count its tensors share.
size_t tileable_run_end(const std::vector<Record>& records, size_t begin, int64_t& numel);
// Replays records [begin, end) of such a run; `op_ns` (when given) gets each op's time.
// A failing kernel's error gets `context` of its record, whose index goes to `failed`.
void replay_tiled(const std::vector<Record>& records, size_t begin, size_t end, int64_t numel,
                  std::vector<int64_t>* op_ns, const std::function<std::string(const Record&)>& context,
                  size_t& failed);

// A cached graph: its structure, how often it ran and in which tier.
struct Graph {
  enum State : int { Cold = 0, Compiling = 1, Compiled = 2, CompileFailed = 3, NotCompilable = 4, Rejected = 5 };
  static constexpr int64_t kTrialRuns = 5;  // compiled runs before the tiers are compared
  int64_t id = 0;
  std::vector<int64_t> key;          // its structure (graph_cache.cpp)
  std::vector<uint32_t> op_offsets;  // where each op's words begin in `key`
  size_t words_end = 0;              // where the ops' words end (storage words follow)
  uint64_t key_hash = 0, ops_hash = 0, first_record_hash = 0;
  std::list<std::shared_ptr<Graph>>::iterator lru;  // its place in the cache's recency list
  int64_t n_ops = 0;
  bool from_torch_compile = false;  // every op came from a torch.compile graph (see Policy::compile)
  std::string first_op, source, note;
  Reason flush_reason = Reason::None;
  std::string cause;                   // why it was built (what differed from the closest cached graph)
  std::atomic<int64_t> hits{0};
  std::atomic<int> state{Cold};
  // Floating-point scalar arguments are not part of the key (see KeyBuilder); guarded by
  // the cache's mutex. Compiled code has them baked in: it runs only while they match.
  std::vector<int64_t> scalars;           // the latest launch's values
  std::vector<int64_t> compiled_scalars;  // the values compiled code was (or is being) built with
  int64_t runs_with_these_scalars = 0;    // compiles only once they stay for compile_after runs
  int64_t scalar_changes = 0;
  void* compiled = nullptr;  // a Python callable (python.cpp owns the reference)
  std::mutex mutex;          // guards the statistics below
  int64_t replay_runs = 0, replay_ns = 0, compiled_runs = 0, compiled_ns = 0;
  void note_run(bool compiled, int64_t ns);
};

// ---- graph_cache.cpp --------------------------------------------------------------------
// A launch's structure as words, with where each op's words begin; its floating-point
// scalars apart (launches that differ only in them share a graph).
struct GraphKey {
  std::vector<int64_t> words;  // the ops' words, then three per storage (bytes, dead, dtype)
  std::vector<uint32_t> op_offsets;
  size_t ops_end = 0;          // where the ops' words end
  std::vector<int64_t> scalars;
  const char* uncompilable = nullptr;
};
GraphKey key_of(const std::vector<Record>& records, const std::vector<StorageUse>& storages,
                const std::unordered_map<const c10::StorageImpl*, int>& index);
// The cached graph with this key (hit), or a new one, built and explained in the event
// log; `under_lock` runs with the cache's lock held (which guards the graphs' scalars).
std::shared_ptr<Graph> find_or_build_graph(GraphKey&& key, const std::vector<Record>& records,
                                           Reason flush_reason, bool& hit,
                                           const std::function<void(Graph&, bool built)>& under_lock);
// A record's inputs as text: "(Float[2, 3], 1, None)".
std::string shapes_of(const Record& r);

// Turns buffered records into one launch on the stream (flush).
void launch(std::vector<Record>&& records, StreamState& stream, bool use_cache, Reason reason);
// Raises if the tensor's value was never computed (an op it depends on failed).
void check_readable(const at::Tensor& t);
// Clears that mark after an inline write.
void note_written(const at::Tensor& t);
// Waits for every launch that touches this storage's memory.
void wait_for_storage(const c10::Storage& storage);
// Structural hash of one record (the first op of a buffer; see the flush policy).
uint64_t record_hash(const Record& r);
// The length in ops of the cached graph last used that starts with this record (0: none).
int64_t cached_graph_length_from(uint64_t first_record_hash);

// The background compiler (Python) receives graphs through this hook.
struct GraphInfo {
  int64_t id, n_ops, hits, compiled_runs, replay_runs, scalar_changes;
  double replay_ms, compiled_ms;
  std::string tier, note, first_op, source, flush_reason, cause;
};
std::vector<GraphInfo> graph_infos();
void clear_graph_cache();

// ---- compile_queue.cpp ------------------------------------------------------------------
// Hands a hot graph to the background compiler (once; from the recording thread).
void request_compile(const std::shared_ptr<Graph>& graph, const std::vector<Record>& records,
                     const std::vector<StorageUse>& storages);
// Runs the graph's compiled code over its live storages (takes the GIL); false if it failed.
bool run_compiled(Graph& graph, const std::vector<c10::Storage>& inputs, const std::vector<c10::ScalarType>& dtypes);

}  // namespace neuron::lazy
