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
//   - it holds policy().max_ops ops, or its live results (past the newest op's) reach
//     policy().max_bytes: a launch gives them memory at its start, so bounded graphs keep
//     peak memory near eager mode's;
//   - it starts like a cached graph of at least policy().idle_flush_ops ops and has
//     reached that graph's length: a loop settles on the same graphs every iteration,
//     whatever the device's timing (a buffer following a cached graph is not cut before
//     that length). Two cached graphs that a loop launches back to back, kJoinAfter
//     times in a row, join: the buffer is held to both lengths (up to max_ops), so the
//     places where an idle device cut the first iterations do not stay forever (the
//     first launch after a host wait stays short: the idle device gets it at once);
//   - otherwise, the device is idle and the buffer holds at least
//     policy().idle_flush_ops ops or (starting no cached graph) policy().idle_flush_bytes
//     of results: an idle device gets work promptly, and computes while the host
//     records the rest (not where the host runs launches itself: nothing would compute
//     meanwhile);
//   - in eager mode or under torch.use_deterministic_algorithms(True): every op.
// Where the host runs launches (launches.py), the idle-device rule does not apply, and the
// policy's own cuts are made when the next op comes (so a graph's key sees the same results
// alive however it was first cut).
#include "adaptive_eager.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/accumulate.h>
#include <c10/util/strides.h>
#include <c10/core/impl/PyObjectSlot.h>
#include <torch/csrc/autograd/graph_task.h>

#include <Python.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

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

// ---- do graphs repeat? ---------------------------------------------------------------------

namespace {
// What this thread ran at once since its last host wait of the program's own: a hash of each
// op (its identity) and its tensors' sizes, in order. A decoding loop's stretch (one token)
// never repeats, its KV length grows; a training step's repeats exactly, step after step.
constexpr uint64_t kEmptyStretch = 0xcbf29ce484222325ull;  // FNV-1a's offset basis
thread_local uint64_t tl_stretch = kEmptyStretch;

inline void fold(uint64_t& hash, uint64_t value) { hash = (hash ^ value) * 0x100000001b3ull; }

void fold_sizes(uint64_t& hash, const at::Tensor& t) {
  if (!t.defined()) return fold(hash, 0);
  fold(hash, static_cast<uint64_t>(t.dim()));
  for (const int64_t size : t.sizes()) fold(hash, static_cast<uint64_t>(size));
}

}  // namespace

// Where the host runs launches a replay is the recorded kernels run later on the recording
// thread: it costs more than running them at once. Where a device thread runs them, what
// recording costs the host is weighed. A compiled graph is other kernels, so with the
// compiled tier on, only repeats count.
RepeatTracker::Judged RepeatTracker::judged() {
  const auto& p = policy();
  if (p.compile.load(std::memory_order_relaxed)) return Judged::AsRepeats;
  if (host_runs_launches(at::get_num_threads())) {
    return p.run_at_once_on_host.load(std::memory_order_relaxed) ? Judged::HostReplaysCostMore : Judged::AsRepeats;
  }
  return p.run_at_once_if_cheaper.load(std::memory_order_relaxed) ? Judged::CostWeighed : Judged::AsRepeats;
}


void RepeatTracker::note_graph_launch(bool hit, uint64_t ops_hash, int64_t ops, int64_t written_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  window_ = ((window_ << 1) | (hit ? 1u : 0u)) & ((uint64_t{1} << kWindow) - 1);
  seen_ = std::min(seen_ + 1, kWindow);
  launch_ops_[next_launch_] = ops;
  launch_bytes_[next_launch_] = written_bytes;
  next_launch_ = (next_launch_ + 1) % kWindow;
  if (unrepeated_.load()) {
    // Only probes decide the way back; a probe that misses ends now.
    if (probing_.load() && !hit) {
      // Repeated stretches whose graphs missed: ask for more of them before the next probe.
      if (probe_from_repeats_) repeats_to_probe_ = std::min(2 * repeats_to_probe_, kMaxRepeatsToProbe);
      end_probe_locked();
      const bool same_ops = std::find(missed_ops_.begin(), missed_ops_.end(), ops_hash) != missed_ops_.end();
      probe_every_ = same_ops ? std::min(2 * probe_every_, kMaxProbeEvery) : kProbeEvery;
      if (!same_ops) missed_ops_[next_missed_++ % missed_ops_.size()] = ops_hash;
    }
    if (probing_.load()) probe_launched_ = true;
    return;
  }
  if (!hit && note_recorded_miss_locked(ops_hash, ops, written_bytes) && ++regrown_misses_ >= kRegrownMisses) {
    return set_unrepeated_locked(true, Unrepeated::Regrown, written_bytes / ops);
  }
  // Where the host runs launches, replays cost more whether graphs hit or not: a few launches
  // tell the size of their ops, a full window would only record more.
  const Judged judged_now = judged();
  const bool host_replays = judged_now == Judged::HostReplaysCostMore;
  // Where a device thread runs them, what recording cached graphs cost the host is weighed
  // against what it moved to the device.
  HostCost spent;
  const bool costs_more = recording_cost_more_locked(judged_now, hit, spent);
  if (seen_ < (host_replays ? kHostRunsWindow : kWindow) && !costs_more) return;
  const int hits = std::popcount(window_);
  static_assert(kMaxHitsUnrepeated <= kMaxHitsOfSmallOps, "both rules below need the window's sums");
  if (hits > kMaxHitsOfSmallOps && !host_replays && !costs_more) return;  // no rule below can fire
  std::array<int64_t, 2> window_ops{}, window_bytes{};  // of the window's launches: [miss, hit]
  for (int ago = 0; ago < seen_; ++ago) {
    const int was_hit = static_cast<int>((window_ >> ago) & 1u);
    const int slot = (next_launch_ + kWindow - 1 - ago) % kWindow;
    window_ops[was_hit] += launch_ops_[slot];
    window_bytes[was_hit] += launch_bytes_[slot];
  }
  const int64_t all_ops = window_ops[0] + window_ops[1];
  const int64_t bytes_per_op = (window_bytes[0] + window_bytes[1]) / std::max<int64_t>(all_ops, 1);
  // Where the host runs launches, replaying graphs costs more than running their ops.
  if (host_replays) {
    if (all_ops > 0) set_unrepeated_locked(true, Unrepeated::HostRunsLaunches, bytes_per_op);
    return;  // the rules below judge a full window
  }
  if (costs_more) return set_unrepeated_locked(true, Unrepeated::RecordingCostsMore, bytes_per_op, &spent);
  if (hits > kMaxHitsOfSmallOps) return;
  // Nearly all misses: a few hits (a second generate() call meets the lengths its first
  // call recorded) must not keep every other length recording.
  if (hits <= kMaxHitsUnrepeated) return set_unrepeated_locked(true, Unrepeated::FewHits, bytes_per_op);
  // Half misses or more, of small ops: a decoding loop's fixed-shape prefix hits, the
  // rest of each step grows. Both the hits and the misses must be small: a training loop's
  // graphs that hit, followed by a generate() call's that miss, are a program that changed
  // (the rule above sees it once the misses fill the window).
  const bool small = window_bytes[0] < kSmallOpBytes * window_ops[0] && window_bytes[1] < kSmallOpBytes * window_ops[1];
  if (small && all_ops > 0) set_unrepeated_locked(true, Unrepeated::SmallOpsHalfHits, bytes_per_op);
}

RepeatTracker::HostCost RepeatTracker::HostCost::now() {
  const trace::Totals totals = trace::totals();
  HostCost cost;
  cost.record_ns = totals.record_ns;
  cost.wait_ns = totals.wait_ns;
  for (const int64_t busy : totals.device_busy_ns) cost.busy_ns += busy;
  return cost;
}

RepeatTracker::HostCost RepeatTracker::HostCost::since(const HostCost& start) const {
  HostCost spent;
  spent.record_ns = record_ns - start.record_ns;
  spent.wait_ns = wait_ns - start.wait_ns;
  spent.busy_ns = busy_ns - start.busy_ns;
  return spent;
}

bool RepeatTracker::recording_cost_more_locked(Judged judged_now, bool hit, HostCost& spent) {
  // A graph built costs its building once; what recording costs each time is weighed on
  // cached graphs only (a loop's first steps build theirs: UNet's first took 118 ms).
  if (judged_now != Judged::CostWeighed || !hit) {
    cost_launches_ = 0;  // the next window starts at the next hit on the device thread
    return false;
  }
  // The window opens at its first launch; the next kCostWindow launches are weighed. (The
  // last one's kernels may still run: its recording counts, its busy time may not.)
  if (cost_launches_++ == 0) {
    cost_start_ = HostCost::now();
    return false;
  }
  if (cost_launches_ <= kCostWindow) return false;
  spent = HostCost::now().since(cost_start_);
  cost_launches_ = 0;
  return spent.recording_costs_more();
}

bool RepeatTracker::note_recorded_miss_locked(uint64_t ops_hash, int64_t ops, int64_t written_bytes) {
  if (ops < kMinRegrownOps || written_bytes >= kSmallOpBytes * ops) return false;
  if (std::find(recorded_misses_.begin(), recorded_misses_.end(), ops_hash) != recorded_misses_.end()) return true;
  recorded_misses_[next_recorded_miss_++ % recorded_misses_.size()] = ops_hash;
  return false;
}

void RepeatTracker::note_host_wait(Reason reason) {
  if (!unrepeated_.load(std::memory_order_relaxed)) return;
  // A random op's wait falls inside a stretch; the program's own waits end one.
  const uint64_t stretch = reason == Reason::RandomOp ? kEmptyStretch : std::exchange(tl_stretch, kEmptyStretch);
  std::lock_guard<std::mutex> lock(mutex_);
  if (probing_.load()) {
    // A probe's stretch ended with every launch a cache hit. One such stretch is not
    // enough: a second generate() call hits the graphs its first call's probes built,
    // at those KV lengths only. The next stretch must hit too.
    if (probe_launched_ && ++repeating_probes_ >= kRepeatingProbes) {
      end_probe_locked();
      // The program repeats; recording resumes unless its graphs would cost more replayed
      // than run (then the next probe waits longer: a device thread may come), or, where a
      // device thread runs them, the probe's last stretch cost the host more than it kept the
      // device busy (then the next probe waits longer too).
      const Judged judged_now = judged();
      if (!recording_would_pay_locked(judged_now)) return;
      if (judged_now == Judged::CostWeighed && HostCost::now().since(probe_cost_start_).recording_costs_more()) {
        repeats_to_probe_ = std::min(2 * repeats_to_probe_, kMaxRepeatsToProbe);
        probe_every_ = std::min(2 * probe_every_, kMaxProbeEvery);
        return;
      }
      set_unrepeated_locked(false);
    } else {
      // The probe goes on with the next stretch. Its cost is weighed from here, at a wait:
      // from one wait to the next the host records a stretch and waits for the one before,
      // and the device computes about one stretch, as in every step recording would take.
      if (probe_launched_) probe_cost_start_ = HostCost::now();
      probe_launched_ = false;
    }
    return;
  }
  // A probe starts at a wait of the program's own (a value read back, a synchronize), never
  // at the wait a random op run at once makes so that it draws in order: that one falls in
  // the middle of a step (a dropout), where no cached graph starts, so a probe begun there
  // always missed (a training loop after generate() ran at once for 6 to 12 steps).
  if (stretch != kEmptyStretch) {
    // The program ran these ops on these shapes before. Several such stretches in a row: it
    // repeats, and so would its graphs. (One is not enough: a hand-written decoding loop's
    // fixed-shape prefix repeats every step, the rest of the step grows.)
    const bool repeated = std::find(recent_stretches_.begin(), recent_stretches_.end(), stretch) !=
                          recent_stretches_.end();
    if (!repeated) recent_stretches_[next_stretch_++ % recent_stretches_.size()] = stretch;
    repeated_stretches_ = repeated ? repeated_stretches_ + 1 : 0;
    if (repeated_stretches_ >= repeats_to_probe_) {
      repeated_stretches_ = 0;
      waits_ = 0;
      if (!recording_would_pay_locked(judged())) return;
      probing_ = true;
      probe_from_repeats_ = true;
      return;
    }
  }
  if (++waits_ >= probe_every_ && reason != Reason::RandomOp) {
    waits_ = 0;
    if (recording_would_pay_locked(judged())) probing_ = true;
  }
}

bool RepeatTracker::recording_would_pay_locked(Judged judged_now) {
  // Where replaying costs more than running, recording never resumes, so a probe could only
  // record a stretch and replay it for nothing (a ResNet-18 step: its graphs recorded, and
  // 27 MiB more host heap for the replayed kernels' results). The repeats and waits asked of
  // the next probe double instead; a device thread or the compiled tier lets it probe.
  if (judged_now != Judged::HostReplaysCostMore) return true;
  repeats_to_probe_ = std::min(2 * repeats_to_probe_, kMaxRepeatsToProbe);
  probe_every_ = std::min(2 * probe_every_, kMaxProbeEvery);
  return false;
}

void RepeatTracker::end_probe_locked() {
  probe_from_repeats_ = false;
  probing_ = false;
  probe_launched_ = false;
  repeating_probes_ = 0;
}

void RepeatTracker::set_unrepeated_locked(bool unrepeated, Unrepeated why, int64_t small_op_bytes,
                                          const HostCost* spent) {
  unrepeated_ = unrepeated;
  small_ops_ = unrepeated && small_op_bytes < kSmallOpBytes;
  probe_every_ = kProbeEvery;
  // Each regime is judged on a window of its own launches: resumed recording must not
  // switch back at once on the misses from before the switch.
  window_ = 0;
  seen_ = 0;
  recorded_misses_.fill(0);
  regrown_misses_ = 0;
  recent_stretches_.fill(0);
  repeated_stretches_ = 0;
  repeats_to_probe_ = kRepeatsToProbe;
  cost_launches_ = 0;
  trace::Event e;
  e.time_ns = trace::now_ns();
  e.kind = trace::EventKind::Policy;
  e.what = unrepeated ? "ops run at once" : "ops recorded again";
  std::string repeated;
  std::string costs = ", so building graphs costs more than fusing saves:";
  switch (why) {
    case Unrepeated::FewHits:
      repeated = "at most " + std::to_string(kMaxHitsUnrepeated) + " of the last " + std::to_string(kWindow) +
                 " graphs repeated (e.g. shapes that grow every step)";
      break;
    case Unrepeated::SmallOpsHalfHits:
      repeated = "at most half of the last " + std::to_string(kWindow) + " graphs repeated and their ops are small (" +
                 std::to_string(small_op_bytes) + " bytes written per op; a fixed-shape prefix repeats, the rest of "
                 "each step grows)";
      break;
    case Unrepeated::HostRunsLaunches:
      repeated = "the host runs launches (kernels take every usable CPU, " + std::to_string(small_op_bytes) +
                 " bytes written per op in the last " + std::to_string(kHostRunsWindow) +
                 " graphs), so a replay runs the same kernels later on the same thread";
      costs = ": replaying graphs costs more than running their ops, so";
      break;
    case Unrepeated::RecordingCostsMore: {
      const auto ms = [](int64_t ns) { return c10::str(std::round(ns / 1e4) / 100); };
      repeated = "recording the last " + std::to_string(kCostWindow) + " graphs cost the host " +
                 ms(spent->record_ns + spent->wait_ns) + " ms (" + ms(spent->record_ns) + " recording, " +
                 ms(spent->wait_ns) + " waiting for the device) while their kernels kept the device thread busy " +
                 ms(spent->busy_ns) + " ms";
      costs = ": the host would spend less running them itself, so";
      break;
    }
    case Unrepeated::Regrown:
      repeated = std::to_string(kRegrownMisses) + " graphs of small ops (" + std::to_string(small_op_bytes) +
                 " bytes written per op) ran the operators of an earlier graph with new shapes (a step whose shapes "
                 "grow, e.g. a KV cache)";
      break;
  }
  e.detail = unrepeated ? repeated + costs + " ops run at once while nothing is buffered"
                        : "the stretches of ops of " + std::to_string(kRepeatingProbes) +
                              " probes in a row repeated cached graphs";
  e.source = trace::capture();
  trace::log_event(std::move(e));
}

void RepeatTracker::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  window_ = 0;
  launch_ops_.fill(0);
  launch_bytes_.fill(0);
  next_launch_ = 0;
  seen_ = waits_ = repeating_probes_ = 0;
  probe_every_ = kProbeEvery;
  missed_ops_.fill(0);
  recorded_misses_.fill(0);
  next_recorded_miss_ = 0;
  regrown_misses_ = 0;
  recent_stretches_.fill(0);
  next_stretch_ = 0;
  repeated_stretches_ = 0;
  repeats_to_probe_ = kRepeatsToProbe;
  probe_from_repeats_ = false;
  probe_launched_ = false;
  unrepeated_ = probing_ = small_ops_ = false;
  cost_launches_ = 0;
}

RepeatTracker& repeats() {
  static auto* tracker = new RepeatTracker();
  return *tracker;
}

// ---- the outputs a structured kernel just made ---------------------------------------
// A structured op's functional form creates its outputs with empty_strided and
// then calls the op's out= form: such outputs already have the right shape. They
// have no Python object yet, unlike a tensor a user passes as out=.

namespace {

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

// A cached graph as the flush policy sees it: the hash of its first record and its length.
struct GraphSpan {
  uint64_t first_record_hash = 0;
  int64_t n_ops = 0;
  bool operator==(const GraphSpan& o) const { return first_record_hash == o.first_record_hash && n_ops == o.n_ops; }
};
struct GraphSpanHash {
  size_t operator()(const GraphSpan& g) const { return g.first_record_hash ^ (static_cast<uint64_t>(g.n_ops) << 1); }
};

// The cached graph that followed a graph launched at its cached end, with nothing between
// them on the host (no wait, no other flush, no op run at once), and how many times in a
// row it did.
struct Successor {
  GraphSpan next;
  int times = 0;
  bool too_big = false;  // joined, the pair held more than policy().max_bytes of results: never again
};

// A launch at a cached graph's end, while nothing has happened on the host since.
struct JustEnded {
  GraphSpan graph;
  std::thread::id owner;
  int graph_task = -1;
  uint64_t ops_run_at_once = 0;  // ops_run_at_once_total() then
};

// Successors that joined once stay joined; this many in a row are needed first.
constexpr int kJoinAfter = 2;
// Successors kept per stream; past that the table starts again (the shapes of a session change).
constexpr size_t kMaxSuccessors = 4096;

struct Buffer {
  std::mutex mutex;
  std::vector<Record> records;
  std::thread::id owner;
  int graph_task = -1;  // the autograd backward pass the records were made in (-1: none)
  int64_t bytes = 0;
  bool first_checked = false;
  uint64_t first_record_hash = 0;
  int64_t follow_ops = 0;  // the length of the cached graph that starts like this buffer (0: none)
  // Joining: a loop whose graphs were cut at timing-dependent places (an idle device in
  // its first iterations) launches two graphs back to back every iteration. Once a pair
  // has followed each other kJoinAfter times in a row, the buffer following the first is
  // held to both lengths: one graph from then on, whatever the device's timing was.
  std::optional<JustEnded> just_ended;
  std::unordered_map<GraphSpan, Successor, GraphSpanHash> successors;
  std::optional<GraphSpan> joining;  // the graph this buffer was held past, to join its successor
  // The next launch is the first since the host waited: the device is idle until it
  // arrives, so it stays short (it never joins its successor).
  bool next_after_wait = true;
  // Where the host runs launches: the policy's cut, made when the next op comes (try_record).
  std::optional<Reason> cut_before_next;
  // bytes at which the live results are counted next, at least max_bytes (live_results_fill_a_graph)
  int64_t next_live_check = 0;
};

// Flushes of the runtime's own policy; every other reason is a wait of the host, or an
// order of the user's, after which the device runs dry.
bool policy_flush(Reason reason) {
  return reason == Reason::CachedGraphEnd || reason == Reason::DeviceIdle || reason == Reason::OpLimit ||
         reason == Reason::ResultBytes || reason == Reason::ProbeMiss ||
         reason == Reason::BackwardStart || reason == Reason::ThreadSwitch || reason == Reason::Eager;
}

// Ops run at once since the process started (never reset, unlike counters()). An op run
// inline flushes the buffers, which ends a join's pair by itself; one run at once does not.
std::atomic<uint64_t>& ops_run_at_once_total() { return counters().ops_run_at_once_total; }

// Every stream's buffer, made on its first recorded op. Buffers live as long as the
// process (streams do), so a thread keeps a pointer to the one it used last.
class BufferRegistry {
 public:
  Buffer& of(StreamState& s) {
    thread_local StreamState* last_stream = nullptr;
    thread_local Buffer* last_buffer = nullptr;
    if (last_stream == &s) return *last_buffer;
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = buffers_[&s];
    if (!slot) slot = std::make_unique<Buffer>();
    last_stream = &s;
    last_buffer = slot.get();
    return *slot;
  }
  // The buffers of a device's streams (-1: every device's).
  std::vector<std::pair<StreamState*, Buffer*>> of_device(c10::DeviceIndex device) {
    std::vector<std::pair<StreamState*, Buffer*>> out;
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [s, b] : buffers_) {
      if (device < 0 || stream_of(*s).device_index() == device) out.emplace_back(s, b.get());
    }
    return out;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<StreamState*, std::unique_ptr<Buffer>> buffers_;
};

// Records buffered on every stream together: zero means no op waits to be launched.
std::atomic<int64_t> g_buffered_records{0};

BufferRegistry& buffers() {
  static auto* registry = new BufferRegistry();  // leaked: device threads may flush at exit
  return *registry;
}

Buffer& buffer_of(StreamState& s) { return buffers().of(s); }

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
  b.just_ended.reset();  // a flush (or a wait that asks for one) comes between two launches
  b.cut_before_next.reset();
  const bool host_waits = !policy_flush(reason);
  if (b.joining.has_value()) {
    // A join that did not reach its length (a wait came first): that pair is not a rule;
    // one cut by its results' size is one never to join again.
    if (reason == Reason::ResultBytes) {
      b.successors[*b.joining].too_big = true;
    } else if (static_cast<int64_t>(b.records.size()) != b.follow_ops) {
      b.successors.erase(*b.joining);
    }
    b.joining.reset();
  }
  if (b.records.empty()) {
    if (host_waits) b.next_after_wait = true;
    return;
  }
  b.next_after_wait = host_waits;
  std::vector<Record> records;
  records.swap(b.records);
  // The records count as buffered until launch() has noted which storages they use: a
  // thread that finds nothing buffered runs ops at once after waiting only for the
  // launches using its tensors, so it must find these records in one place or the other.
  const auto n_records = static_cast<int64_t>(records.size());
  struct Unbuffer {
    int64_t n;
    ~Unbuffer() { g_buffered_records.fetch_sub(n, std::memory_order_acq_rel); }
  } unbuffer{n_records};
  b.records.reserve(records.size());  // the next buffer is likely as long: no regrowth per op
  b.bytes = 0;
  b.next_live_check = 0;
  b.first_checked = false;
  counters().count_flush(reason);
  const bool use_cache = mode() == Mode::Adaptive && reason != Reason::Eager;
  const int64_t start = trace::now_ns();
  const auto phases_before = trace::thread_phase_ns();
  {
    trace::PhaseScope building(trace::HostPhase::Recording);
    launch(std::move(records), s, use_cache, reason);
  }
  // Recording time is the building alone: not a launch the host ran as it made it, nor a
  // wait for room in the stream's queue.
  const auto phases_after = trace::thread_phase_ns();
  int64_t elsewhere = 0;
  for (auto phase : {trace::HostPhase::Waiting, trace::HostPhase::RunningOps}) {
    elsewhere += phases_after[static_cast<int>(phase)] - phases_before[static_cast<int>(phase)];
  }
  trace::add_record_time(trace::now_ns() - start - elsewhere);
}

// The buffer has just started: if it follows a cached graph right after another one
// ended, count the pair. A backward pass that starts, or another thread, never joins.
void note_successor(Buffer& b) {
  if (!b.just_ended.has_value()) return;
  const JustEnded ended = *b.just_ended;
  b.just_ended.reset();
  const bool backward_starts = b.graph_task != -1 && b.graph_task != ended.graph_task;
  const bool ran_at_once_between = ops_run_at_once_total().load(std::memory_order_relaxed) != ended.ops_run_at_once;
  if (b.follow_ops == 0 || backward_starts || b.owner != ended.owner || ran_at_once_between) return;
  if (b.successors.size() >= kMaxSuccessors) b.successors.clear();
  auto& successor = b.successors[ended.graph];
  const GraphSpan next{b.first_record_hash, b.follow_ops};
  successor.times = successor.next == next ? successor.times + 1 : 1;
  successor.next = next;
}

// Launches a buffer at its cached graph's end; the buffer that follows may join it to its
// successor (note_successor). Called with the buffer locked.
void end_cached_graph_locked(Buffer& b, StreamState& s) {
  const GraphSpan ended{b.first_record_hash, static_cast<int64_t>(b.records.size())};
  const bool first_after_wait = b.next_after_wait;
  const auto owner = b.owner;
  const int graph_task = b.graph_task;
  flush_locked(b, s, Reason::CachedGraphEnd);
  // The first launch after a wait stays short: the idle device gets it at once.
  if (!first_after_wait) {
    b.just_ended = JustEnded{ended, owner, graph_task, ops_run_at_once_total().load(std::memory_order_relaxed)};
  }
}

// Launches the buffer now for one of the policy's cuts (at a cached graph's end, noting it
// for a join with what follows). Called with the buffer locked.
void cut_locked(Buffer& b, StreamState& s, Reason reason) {
  if (reason == Reason::CachedGraphEnd) {
    end_cached_graph_locked(b, s);
  } else {
    flush_locked(b, s, reason);
  }
}

// Whether the buffer's live results reached policy().max_bytes. Counting them walks the
// records, so it is done only each time the bytes written grow by another quarter of it.
bool live_results_fill_a_graph(Buffer& b) {
  const int64_t max_bytes = policy().max_bytes.load();
  b.next_live_check = b.bytes + std::max<int64_t>(max_bytes / 4, 1);
  return live_pending_bytes(b.records) >= max_bytes;
}

// Says why the next graph is new: explain() and the timeline show it.
void note_join(const Record& first, int64_t n_ops, int64_t next_ops) {
  trace::Event e;
  e.time_ns = trace::now_ns();
  e.kind = trace::EventKind::Policy;
  e.what = "graphs joined";
  e.detail = "the cached graph of " + std::to_string(n_ops) + " ops from " + first.op.schema().operator_name().name +
             " and the graph of " + std::to_string(next_ops) + " ops that followed it " + std::to_string(kJoinAfter) +
             " times in a row, with nothing between them on the host, now launch as one graph";
  e.source = first.source;
  trace::log_event(std::move(e));
}

// The length to hold a buffer to that has reached the end of the cached graph it
// follows: that graph's, or with its usual successor joined on.
int64_t joined_length(const Buffer& b) {
  const auto it = b.successors.find(GraphSpan{b.first_record_hash, b.follow_ops});
  if (it == b.successors.end() || it->second.times < kJoinAfter || it->second.too_big) return b.follow_ops;
  const int64_t joined = b.follow_ops + it->second.next.n_ops;
  return joined <= policy().max_ops.load() ? joined : b.follow_ops;
}

// Whether a cached graph starts like this buffer (looked up once per buffer).
bool follows_cached_graph(Buffer& b) {
  if (!b.first_checked) {
    b.first_record_hash = record_hash(b.records.front());
    b.follow_ops = cached_graph_length_from(b.first_record_hash);
    b.first_checked = true;
    note_successor(b);
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

void forget_graph_successors() {
  for (auto& [s, b] : buffers().of_device(-1)) {
    auto lock = lock_buffer(*b);
    b->successors.clear();
    b->just_ended.reset();
  }
}

void flush_device_buffers(c10::DeviceIndex device, Reason reason) {
  for (auto& [s, b] : buffers().of_device(device)) {
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
  uint64_t sizes = kEmptyStretch;  // a hash of the tensors' sizes, for the stretch run at once
};

void scan_tensor(Scan& scan, const at::Tensor& t, bool write, bool out_arg) {
  fold_sizes(scan.sizes, t);
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
// try_record let the op run at once (RepeatTracker): its host access is not a fusion boundary.
thread_local bool tl_run_at_once = false;
// An op's kernel is running at once on this thread: a resize of its out= tensor inside
// it (arange's composite makes an empty tensor and resizes it) is no host wait either.
// Set by the op's host access, cleared when it returns (after_inline_run) or the next op
// arrives.
thread_local bool tl_in_at_once_kernel = false;

// Adds the host time of one try_record call to the tracing total.
struct RecordTimer {
  int64_t start = trace::now_ns();
  trace::PhaseScope phase{trace::HostPhase::Recording};  // this thread's share, for explain()
  ~RecordTimer() { trace::add_record_time(trace::now_ns() - start); }
};

bool refuse(const char* why) {
  tl_inline_why = why;
  tl_inline_why_string = nullptr;
  return false;
}

// A new op on this thread: what the previous one left is forgotten.
void start_op() {
  release_finished_work();  // what a device thread ran is dropped here, with no lock held
  forget_lesson();  // a lesson belongs to the call that set it, and no later one
  forget_unchecked();  // so does a signature to check
  tl_run_at_once = false;  // so is a decision to run at once (the op may have failed before its host access)
  tl_in_at_once_kernel = false;
}

// Whether the policy lets ops run at once: graphs do not repeat, the mode is adaptive, this is
// no torch.compile graph and configure() allows it.
bool at_once_allowed() {
  return repeats().run_at_once() && mode() == Mode::Adaptive && !tl_in_torch_compile_graph &&
         policy().run_unrepeated_at_once.load(std::memory_order_relaxed);
}

// Whether ops run at once now: the policy allows it and nothing is buffered.
bool in_at_once_regime() {
  return at_once_allowed() && g_buffered_records.load(std::memory_order_acquire) == 0;
}

// Where the host runs launches, the policy's cut waits for the next op (Buffer::cut_before_next),
// so a loop that never waits on the host arrives at every op with records buffered. Once ops
// run at once, that op is where the buffer ends: its graph launches (the cut it was due), and the
// op runs at once. Without this, such a loop (a training loop that reads no value back) went on
// recording for as long as it ran, each graph replayed on the host after its recording.
void launch_due_cut(c10::DeviceIndex device) {
  auto& s = stream_state(current_stream(device));
  auto& b = buffer_of(s);
  auto lock = lock_buffer(b);
  if (const auto cut = b.cut_before_next; cut && b.owner == std::this_thread::get_id()) cut_locked(b, s, *cut);
}

// Graphs do not repeat: with nothing buffered, an op on `device` runs at once, on this
// thread, as blocking mode runs it (the same CPU kernel: the same numbers). Counts the op
// when it does. While the device still runs a launch (a probe's), a small op waits for the
// launches that use its tensors' memory (begin_unboxed_op, prepare_inline) rather than start
// a graph that would never repeat (a probe's token recorded 44 more ops so, in two graphs,
// not one); big ops are recorded behind it, so the host records while the device computes.
bool runs_at_once(c10::DeviceIndex device) {
  if (!at_once_allowed()) return false;
  if (g_buffered_records.load(std::memory_order_acquire) != 0) {
    launch_due_cut(device);
    if (g_buffered_records.load(std::memory_order_acquire) != 0) return false;
  }
  if (!repeats().ops_are_small() && !stream_idle(stream_state(current_stream(device)))) return false;
  ops_run_at_once_total().fetch_add(1, std::memory_order_relaxed);
  return true;
}
}  // namespace

bool try_record(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  start_op();
  if (mode() == Mode::Blocking || on_device_thread()) return refuse(nullptr);
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
  if (runs_at_once(scan.device)) {
    tl_run_at_once = true;
    fold(tl_stretch, reinterpret_cast<uintptr_t>(&cls));  // the op: its class, cached for the process
    fold(tl_stretch, scan.sizes);
    return false;
  }
  // Recording starts here: an op run at once is not recorded, nor timed as recording (two
  // clock reads for every op a decoding loop runs).
  RecordTimer timer;

  // Before the meta kernel's refusals: a call that runs at once for them checks its signature too.
  const bool checked = signature_checked(op, cls, stack->data() + begin, n);
  MetaPtr meta;
  if (cls.functional || !scan.out_args_fresh) {
    meta = meta_for(op, cls, stack->data() + begin, n);
    if (meta->learn) {
      return refuse("its result shapes are learned from this first run: its meta kernel is torch's Python code, "
                    "whose first call imports torch._dynamo");
    }
    if (!meta->ok) return refuse("its result shapes cannot be known without running it (data-dependent or no meta kernel)");
  }
  if (!checked) {
    return refuse("the first call of a signature runs at once: the CPU kernel's argument checks raise at the op, "
                  "as CUDA's host code raises them");
  }
  if (!numbers_fit(op, stack->data() + begin, n)) {
    return refuse("a number overflows the tensor's dtype: the CPU kernel decides at the op whether that is an error");
  }
  if (meta != nullptr) {
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
  // How many numbers a random op draws, read before the loop below moves the arguments.
  int64_t span = 0;
  for (size_t i = 0; i < n && span == 0; ++i) {
    const auto& v = (*stack)[begin + i];
    if (v.isGenerator() || (v.isNone() && is_optional_generator(arg_defs[i]))) {
      span = draw_span(arg_defs, &(*stack)[begin], n);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    auto& v = (*stack)[begin + i];
    if (v.isGenerator()) {
      v = generator_for_draw(v.toGenerator(), span);
      r.random = true;
    } else if (v.isNone() && is_optional_generator(arg_defs[i])) {
      v = generator_for_draw(default_generator(scan.device), span);
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
      // No metadata: a result the op leaves undefined (convolution_backward's output_mask).
      stack->push_back(count == 0 ? at::Tensor() : r.outputs[next_output++]);
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
  if (const auto cut = b.cut_before_next) cut_locked(b, s, *cut);
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
  r.record_start_ns = timer.start;
  if (trace::profiling()) {
    r.correlation = trace::correlation_id();
    r.host_tid = trace::host_thread_id();
  }
  b.records.push_back(std::move(r));
  g_buffered_records.fetch_add(1, std::memory_order_relaxed);
  const bool per_op = mode() == Mode::Eager || at::globalContext().deterministicAlgorithms();
  if (per_op) {
    flush_locked(b, s, Reason::Eager);
    return true;
  }
  // Where the host runs each launch as it makes it, no device computes while the host
  // records. The policy's cuts then wait for the next op, so that a graph's key sees the
  // same results alive however it was cut (the program has dropped by then what it held for
  // this op, e.g. the previous result in y = f(y), as at a wait); and nothing is launched
  // early for an idle device: graphs end where the program waits, at a cached graph's end,
  // at max_ops, or once their live results reach max_bytes. (Asked only where a cut is due:
  // most ops make none.)
  const auto host_runs = [] { return host_runs_launches(at::get_num_threads()); };
  const auto cut = [&](Reason reason) {
    if (host_runs()) {
      b.cut_before_next = reason;
    } else {
      cut_locked(b, s, reason);
    }
  };
  const int64_t buffered = static_cast<int64_t>(b.records.size());
  if (buffered >= policy().max_ops.load()) {
    cut(Reason::OpLimit);
  } else if (b.bytes >= std::max(b.next_live_check, policy().max_bytes.load()) && live_results_fill_a_graph(b)) {
    // A launch gives its live results memory when it starts and frees what it read when it
    // ends: graphs bounded by their live results keep the device's peak memory near eager
    // mode's. (Dead intermediates do not count: they share scratch as eager's would.)
    cut(Reason::ResultBytes);
  } else if (!tl_in_torch_compile_graph) {
    // A buffer that starts like a cached graph follows it: held to that graph's length
    // whatever the device does meanwhile, and launched there when the graph is long
    // enough to be worth keeping (a short one, cut early by an idle device, grows past
    // it), so a loop settles on the same graphs every iteration. Otherwise an idle device
    // gets the buffered work now and computes while the host records the rest (generate()
    // reads a token back every step). A torch.compile graph is launched whole at its end.
    const int64_t enough_ops = policy().idle_flush_ops.load();
    const bool follows = follows_cached_graph(b);
    const bool enough_bytes = !follows && b.bytes >= policy().idle_flush_bytes.load();
    if (follows && buffered == b.follow_ops && buffered >= enough_ops) {
      if (const int64_t joined = joined_length(b); joined > buffered) {
        b.joining = GraphSpan{b.first_record_hash, buffered};
        b.follow_ops = joined;  // record on: its successor joins it
        counters().graph_joins.fetch_add(1, std::memory_order_relaxed);
        note_join(b.records.front(), buffered, joined - buffered);
      } else {
        cut(Reason::CachedGraphEnd);
      }
    } else if ((!follows || buffered > b.follow_ops) && (buffered >= enough_ops || enough_bytes)) {
      if (!host_runs()) {
        if (stream_idle(s)) flush_locked(b, s, Reason::DeviceIdle);
      } else if (repeats().probing()) {
        // A probe that has recorded as much as an idle device would get, and holds ops no
        // cached graph holds, will miss: launched now (not at the next op, nor at the program's
        // next wait), the miss ends the probe and the next ops run at once again, as an idle
        // device's early launch ends it on the device thread. (A shorter stretch is recorded
        // whole: the graph it builds lets the next probe of a repeating program hit.)
        flush_locked(b, s, Reason::ProbeMiss);
      }
    }
  }
  return true;
}

bool set_recording_torch_compile_graph(bool on) {
  const bool previous = tl_in_torch_compile_graph;
  tl_in_torch_compile_graph = on;
  return previous;
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

void note_sync(Reason reason, std::string_view what) {
  counters().count_sync(reason, what);
  repeats().note_host_wait(reason);
}

namespace {
// An op about to run inline: a host wait for the repeat policy, and a count by op.
// What an op run inline is counted and logged under: the op, else the reason's words.
std::string_view inline_trigger(Reason reason, std::string_view what) {
  return what.empty() ? std::string_view(reason_name(reason)) : what;
}

// Counts an op run inline under its trigger (a string is made only for a trigger's first
// op: blocking mode counts every op it runs).
void count_inline_op(Reason reason, std::string_view what) {
  repeats().note_host_wait(reason);
  const std::string_view trigger = inline_trigger(reason, what);
  auto& c = counters();
  c.inline_ops.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.inline_by_op.find(trigger);
  if (it == c.inline_by_op.end()) it = c.inline_by_op.emplace(std::string(trigger), 0).first;
  it->second += 1;
}
}  // namespace

void prepare_inline(c10::ArrayRef<at::Tensor> tensors, Reason reason, std::string_view what) {
  const bool at_once = std::exchange(tl_run_at_once, false) ||
                       (tl_in_at_once_kernel && reason == Reason::MetadataChange);
  if (at_once && g_buffered_records.load(std::memory_order_acquire) == 0) {
    tl_in_at_once_kernel = true;
    // Nothing is buffered and this stream was idle: only launches of other streams may
    // still use these tensors.
    for (const auto& t : tensors) {
      if (!on_device(t)) continue;
      wait_for_storage(t.storage());
      materialize(t.storage());
    }
    return;
  }
  count_inline_op(reason, what);
  // Blocking mode, or a kernel on a device thread: nothing is queued behind this work.
  if (mode() == Mode::Blocking || on_device_thread()) {
    for (const auto& t : tensors) {
      if (t.defined() && t.device().type() == kNeuron) materialize(t.storage());
    }
    return;
  }
  const std::string_view trigger = inline_trigger(reason, what);
  int device = -1;
  for (const auto& t : tensors) {
    if (t.defined() && t.device().type() == kNeuron) device = t.device().index();
  }
  trace::SyncScope scope(reason, trigger, device);
  // A host read is logged as its wait (the scope's sync event) alone: the observability
  // layer lists inline ops that cut graphs, which host reads are not, by design.
  if (!is_host_read(reason)) {
    trace::Event e;
    e.time_ns = trace::now_ns();
    e.kind = trace::EventKind::InlineOp;
    e.reason = reason;
    e.what = trigger;
    e.detail = tl_inline_why_string != nullptr ? *tl_inline_why_string
               : tl_inline_why != nullptr      ? tl_inline_why
               : reason == Reason::MetadataChange
                   ? "it changes metadata (sizes, strides, storage) that queued launches read when they run"
                   : "a native kernel that needs its inputs' values now";
    e.source = scope.source();
    e.device = device;
    trace::log_event(std::move(e));
  }
  tl_inline_why = nullptr;
  tl_inline_why_string = nullptr;
  counters().count_sync(reason, trigger);
  HostRunsWhatItWaitsFor host_runs;  // the waits below run what the flush enqueues
  flush_device_buffers(-1, reason);
  for (const auto& t : tensors) {
    if (!t.defined() || t.device().type() != kNeuron) continue;
    wait_for_storage(t.storage());
    materialize(t.storage());
  }
}

// The device's unboxed path for hot ops: try_record's decision to run an op at once and
// prepare_inline's readying of its tensors, without the boxed stack between them.
bool begin_unboxed_op(c10::ArrayRef<const at::Tensor*> tensors, std::string_view what) {
  start_op();
  if (on_device_thread() || tensors.empty()) return false;  // a replay's kernels keep the boxed path
  if (mode() == Mode::Blocking) {
    count_inline_op(Reason::InlineOp, what);
    for (const at::Tensor* t : tensors) materialize(t->storage());
    return true;
  }
  if (!runs_at_once(tensors.front()->device().index())) return false;
  tl_in_at_once_kernel = true;
  fold(tl_stretch, reinterpret_cast<uintptr_t>(what.data()));  // the op: its name, a static string
  for (const at::Tensor* t : tensors) fold_sizes(tl_stretch, *t);
  for (const at::Tensor* t : tensors) {
    wait_for_storage(t->storage());
    materialize(t->storage());
  }
  return true;
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
  void before_host_access(c10::ArrayRef<at::Tensor> tensors, Reason reason, std::string_view what) override {
    prepare_inline(tensors, reason, what);
  }
  bool begin_unboxed_op(c10::ArrayRef<const at::Tensor*> tensors, std::string_view what) override {
    return lazy::begin_unboxed_op(tensors, what);
  }
  void end_unboxed_op() override { tl_in_at_once_kernel = false; }
  void check_readable(const at::Tensor& t) override { lazy::check_readable(t); }
  void note_written(const at::Tensor& t) override { lazy::note_written(t); }
  void after_inline_run(const c10::OperatorHandle& op, const torch::jit::Stack& stack) override {
    tl_in_at_once_kernel = false;
    learn_from_inline_run(op, stack);
    note_checked_run(op);
  }
  // While ops run at once (the same rule as runs_at_once, and the device is quiet), the op
  // that asks for a new tensor writes it at once: memory now, not a pending storage that is
  // registered and then materialized a moment later. Otherwise the op is recorded, and its
  // new tensor must be a pending one that the recorder knows as fresh (with memory already
  // given, a structured op's out= tensor read as a user's, and configure(
  // run_unrepeated_at_once=False) still saw such ops run inline to learn their shapes).
  bool defers_allocation() const override { return lazy_allocation() && !(in_at_once_regime() && device_quiet()); }
  bool holds_ops() const override { return g_buffered_records.load(std::memory_order_acquire) != 0; }
  void note_fresh_output(const at::Tensor& t) override { lazy::note_fresh_output(t); }
  void flush_stream(c10::Stream stream, Reason reason) override { flush_stream_buffer(stream, reason); }
  void flush_device(c10::DeviceIndex device, Reason reason) override { flush_device_buffers(device, reason); }
  void note_sync(Reason reason, std::string_view what) override { lazy::note_sync(reason, what); }
  void release_cached_memory() override { release_cached_scratch(); }
};

}  // namespace

void install_recorder(bool installed) {
  static auto* recorder = new Recorder();
  flush_device_buffers(-1, Reason::ModeChange);  // nothing stays buffered behind the switch
  set_interceptor(installed ? recorder : nullptr);
}

}  // namespace neuron::lazy
