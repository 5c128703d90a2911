// What the runtime did, for the observability layer (neuron_lab.observability).
//
// Always on, and cheap: running totals (device busy time per core, host time
// spent recording ops, host time spent waiting) and a bounded log of the rare
// events that explain a slow region (host waits with their trigger, new graphs
// with their cause, ops that ran inline, compiles).
// Only while a profiler runs (neuron_lab.profiler, or torch.profiler with
// ProfilerActivity.PrivateUse1 through kineto_plugin.cpp): one record per launch
// (enqueue, device start and end, fused ops with their arguments' shapes, graph and
// tier, bytes, source line, the torch.profiler op that recorded it) and memory samples.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <string>
#include <string_view>
#include <vector>

#include "reason.h"

namespace neuron::trace {

// Steady clock in nanoseconds: the clock of Python's time.monotonic_ns().
int64_t now_ns();

// ---- source lines (source.cpp) --------------------------------------------------
// A user's source line: an index into an interned table of code objects' files and
// functions, and a line (file < 0: unknown, e.g. an op from autograd's backward pass).
struct Source {
  int32_t file = -1;
  int32_t line = 0;
};
// The calling thread's source line: its first Python frame outside library code.
Source capture();
// "file.py:12 in function", or why the line is unknown.
std::string describe(Source loc);
struct SourceFrame {
  std::string file;
  int line = 0;
  std::string function;
};
SourceFrame frame(Source loc);
// Files under these prefixes are library code, skipped when looking for the user's line.
void set_library_prefixes(std::vector<std::string> prefixes);
// How a file is named to the user, and its text: IPython's "Cell In[7]" for the file a
// notebook cell compiled to (whose text is in no file). describe() then says
// "Cell In[7], line 4" (", in f" inside a function), as IPython's tracebacks do.
void set_source_name(const std::string& file, const std::string& name, std::vector<std::string> lines);
// The text of a source line, stripped: a named file's registered text, else the file
// on disk (read only here, on error paths); "" when unknown.
std::string source_text(const SourceFrame& where);
std::string source_text(Source loc);

// ---- torch.profiler's ops (kineto_plugin.cpp pushes and pops them) ---------------
// While torch.profiler traces, every CPU op it records has a correlation id, pushed on
// the thread that runs the op while the op runs. Launch and op records keep the innermost
// one, so that device events link to the CPU op that recorded or launched them.
uint64_t correlation_id() noexcept;  // 0: no torch.profiler op runs on this thread
void push_correlation(uint64_t id);
void pop_correlation();
// The calling thread's OS id (gettid; what torch.profiler names CPU threads by).
int32_t host_thread_id() noexcept;

// While alive, host waits on this thread are the profiler's own (it finishes a region's
// device work, reads its memory): logged with `by_profiler` set and kept out of the wait
// total, so that no explanation lists them as the user's.
class ProfilerWaits {
 public:
  ProfilerWaits();
  ~ProfilerWaits();
  ProfilerWaits(const ProfilerWaits&) = delete;
  ProfilerWaits& operator=(const ProfilerWaits&) = delete;
};
bool profiler_waits() noexcept;
void enter_profiler_waits();  // what ProfilerWaits does, for Python's `with` blocks
void exit_profiler_waits();

// ---- running totals ------------------------------------------------------------
void add_device_busy(int device, int64_t ns);
void add_record_time(int64_t ns);  // host time spent recording ops (tracing)
void add_wait_time(int64_t ns);    // host time blocked waiting for the device
// What a launch is: a fused graph, one op, a block run inline on the host's thread, an
// event's marker, a stream's wait for an event. Python sees each as a member of the str
// enum neuron_lab.device.trace.LaunchKind, whose value is launch_kind_name(kind).
enum class LaunchKind : uint8_t { Graph = 0, Op = 1, Inline = 2, Event = 3, Wait = 4 };
constexpr int kLaunchKinds = 5;
// "graph", "op", "inline", "event", "wait".
const char* launch_kind_name(LaunchKind kind);
// Execution time of recent launches of the first three kinds (those that run work), for
// the metrics report's distributions; markers and waits are not timed.
constexpr int kTimedLaunchKinds = 3;
void note_launch_time(LaunchKind kind, int64_t ns);
// Up to the last 8192 durations of a timed kind (ns), and how many launches of it ran.
std::vector<int64_t> launch_times(LaunchKind kind, uint64_t* total = nullptr);
void reset_launch_times();
struct Totals {
  std::vector<int64_t> device_busy_ns;  // per core
  int64_t record_ns = 0, wait_ns = 0;
  int64_t profiler_wait_ns = 0;  // waits made by profilers (ProfilerWaits), not in wait_ns
};
Totals totals();
// Host time of the calling thread by what it did, each moment counted once (the
// innermost scope wins: a wait inside recording is waiting): recording ops and
// building launches, waiting for the device (running the launches it waits for
// included), running ops at once on this thread. What remains of a region's wall
// time is the user's own code. Per thread, so that a region's parts add up to its
// wall time whatever other threads do.
enum class HostPhase : int { Recording = 0, Waiting = 1, RunningOps = 2 };
constexpr int kHostPhases = 3;
class PhaseScope {
 public:
  explicit PhaseScope(HostPhase phase);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;
};
// `now`: the caller's reading of now_ns(), where it has one (a launch reads the clock once
// at each end for its phase, the busy union and its own duration).
void enter_phase(HostPhase phase, int64_t now = now_ns());
void exit_phase(int64_t now = now_ns());
// The calling thread's totals per phase so far (an open phase up to now).
std::array<int64_t, kHostPhases> thread_phase_ns();
// Wall time during which at least one launch ran on any core or stream (an interval
// counted once however many ran in it), up to now: its difference over a region is
// at most the region's wall time.
void busy_begin(int64_t now = now_ns());
void busy_end(int64_t now = now_ns());
int64_t busy_union_ns();

// ---- the event log (bounded; always on) ------------------------------------------
// What an event is: a host wait, a graph built or built again, an op run inline, a
// compile that succeeded or failed, a compiled graph that fell back to replay, a change
// of the flush policy. Python sees each as a member of the str enum
// neuron_lab.device.trace.EventKind, whose value is event_kind_name(kind).
enum class EventKind : uint8_t {
  Sync = 0, NewGraph = 1, Recompile = 2, InlineOp = 3, Compile = 4, CompileFailed = 5, CompiledFallback = 6,
  Policy = 7,
};
constexpr int kEventKinds = 8;
// "sync", "new_graph", "recompile", "inline_op", "compile", "compile_failed",
// "compiled_fallback", "policy".
const char* event_kind_name(EventKind kind);
struct Event {
  int64_t time_ns = 0;      // when it began
  int64_t duration_ns = 0;  // host time it took (waits, compiles)
  EventKind kind = EventKind::Sync;
  Reason reason = Reason::None;  // sync and inline_op: why the host waited
  std::string what;         // the trigger's op or kernel, else the reason's name; the graph
  std::string detail;       // the cause, in words
  Source source;
  int device = -1;
  int64_t graph_id = -1;
  bool by_profiler = false;  // a wait a profiler made (ProfilerWaits), not the user's code
};
void log_event(Event e);
// Events that began at or after `since_ns` (oldest first).
std::vector<Event> events_since(int64_t since_ns);

// A host wait for the device: the outermost one on a thread is logged as a
// `sync` event with its reason, op (`what`, if any), source line and duration.
class SyncScope {
 public:
  SyncScope(Reason reason, std::string_view what, int device);
  ~SyncScope();
  SyncScope(const SyncScope&) = delete;
  SyncScope& operator=(const SyncScope&) = delete;
  // The source line of the wait (the outermost scope's, captured once).
  Source source() const { return outermost_ ? source_ : capture(); }

 private:
  bool outermost_;
  int64_t start_ = 0;
  Reason reason_;
  std::string what_;
  int device_;
  Source source_;
};

// ---- errors raised late ----------------------------------------------------------
// An op of a launch failed on the device; its error is raised at the next wait. Kept
// for the last few failures, so that the layer that shows the error can point at the
// op's line and say what was recorded after it.
struct AsyncFailure {
  std::string context;  // the text the error's message carries (identifies it)
  std::string op;
  SourceFrame recorded;  // where the failing op was recorded
  // Ops recorded after it in its launch, which did not run: (op, line).
  std::vector<std::pair<std::string, SourceFrame>> not_run;
  int64_t time_ns = 0;
};
void note_async_failure(AsyncFailure failure);
std::vector<AsyncFailure> async_failures();

// ---- launch records (only while profiling) ----------------------------------------
// How a graph launch ran, and what became of a launch.
enum class LaunchTier : int { None = 0, Replay = 1, Compiled = 2 };
enum class LaunchStatus : int { Queued = 0, Done = 1, Failed = 2, Skipped = 3 };
const char* tier_name(LaunchTier tier);
const char* status_name(LaunchStatus status);
// An argument or result of a recorded op, as a cost model reads it (FLOPs and bytes).
struct OpValue {
  enum class Kind : uint8_t { Other, None, Tensor, Tensors, Int, Double, Bool, Ints };
  Kind kind = Kind::Other;
  int8_t dtype = -1;           // Tensor: its c10::ScalarType
  std::vector<int64_t> ints;   // Tensor: its shape; Int: one value; Ints: the list; Tensors: their count
  double number = 0;           // Double, Bool
};
struct OpRecord {
  std::string name, inputs;
  Source source;
  int64_t host_ns = 0;     // time spent recording it
  int64_t device_ns = -1;  // its share of the launch when replayed op by op; -1: unknown
  std::string overload;    // the schema's overload name ("" for the default)
  std::vector<OpValue> args, results;
  int64_t record_start_ns = 0;  // when the host began recording it
  uint64_t correlation = 0;     // the torch.profiler CPU op that recorded it (0: none)
  int32_t host_tid = 0;         // the thread that recorded it
};
struct LaunchRecord {
  int64_t id = 0;
  LaunchKind kind = LaunchKind::Op;
  std::string name;
  int device = 0;
  int64_t stream = 0;
  int64_t enqueue_ns = 0;
  std::atomic<int64_t> start_ns{0}, end_ns{0};
  int64_t n_ops = 1;
  int64_t graph_id = -1;
  std::atomic<LaunchTier> tier{LaunchTier::None};
  std::atomic<LaunchStatus> status{LaunchStatus::Queued};
  int64_t bytes_allocated = 0;
  Source source;
  std::vector<OpRecord> ops;
  uint64_t correlation = 0;  // the torch.profiler CPU op running when it was enqueued (0: none)
  int32_t host_tid = 0;      // the thread that enqueued it
};
using LaunchRecordPtr = std::shared_ptr<LaunchRecord>;

bool profiling() noexcept;
// A new launch record (kept until the profiler stops), or nullptr when not profiling.
LaunchRecordPtr new_launch(LaunchKind kind, std::string_view name, int device, int64_t stream);

struct MemorySample {
  int64_t time_ns;
  int device;
  int64_t allocated, reserved;
};
// The allocator reports every change: profiles sample it, scopes track their peak, and
// torch.profiler(profile_memory=True) gets the block (ptr, +size allocated / -size freed).
void note_memory(int device, int64_t allocated, int64_t reserved, void* ptr = nullptr, int64_t delta = 0);
// Allocated bytes per core as of the allocator's last change (no wait for pending work).
std::vector<int64_t> allocated_now();

struct Profile {
  std::vector<LaunchRecordPtr> launches;
  std::vector<MemorySample> memory;
  int64_t start_ns = 0, end_ns = 0;
};
// Profilers nest: records go to every active profiler.
int start_profile();
Profile stop_profile(int handle);

// ---- what the layers above add to a profile before torch.profiler shows it ----------
// The device knows no notebooks and no cost model: the observability layer registers an
// annotator (from Python) that names source files as the user knows them (IPython's
// "Cell In[7]") and models each op's NeuronCore time.
struct OpCost {
  double flops = -1, bytes = -1, modelled_ns = -1;  // -1: not modelled
};
struct ProfileNotes {
  std::unordered_map<std::string, std::string> file_names;      // a source file -> its name ("Cell In[7]")
  std::unordered_map<int64_t, OpCost> launch_costs;             // launch id -> the launch (overhead included)
  std::unordered_map<int64_t, std::vector<OpCost>> op_costs;    // launch id -> each of its ops
};
using ProfileAnnotator = std::function<ProfileNotes(const Profile&)>;
void set_profile_annotator(ProfileAnnotator annotator);
// The registered annotator's notes on a profile (none registered: empty notes).
ProfileNotes annotate(const Profile& profile);
// A source line as text, with the annotator's name for its file: "Cell In[7], line 8",
// "train.py:12 in step"; "" when unknown.
std::string source_text(Source loc, const ProfileNotes& notes);

// The device work torch.profiler saw last (its latest trace with ProfilerActivity.PrivateUse1):
// the same records its device lanes were made of (kineto_plugin.cpp).
Profile last_torch_profile();

// Peak allocated bytes per core since a watermark was opened.
int open_watermark();
std::vector<int64_t> close_watermark(int handle);

}  // namespace neuron::trace
