// Launch records, memory samples, running totals and the event log (trace.h).
#include "trace.h"

#include "device/csrc/runtime/runtime.h"

#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <deque>
#include <map>
#include <mutex>

namespace neuron::trace {

namespace {

constexpr size_t kMaxEvents = 8192;
constexpr int kMaxWatermarks = 32;

std::array<std::atomic<int64_t>, kMaxCores> g_device_busy{};
std::atomic<int64_t> g_record_ns{0};
std::atomic<int64_t> g_wait_ns{0};
std::atomic<int64_t> g_profiler_wait_ns{0};
thread_local int tl_profiler_waits = 0;
thread_local std::vector<uint64_t> tl_correlations;

std::mutex g_events_mutex;
std::deque<Event>& events() {
  static auto* e = new std::deque<Event>();
  return *e;
}

// Profiles: every active profile reads the shared record list from its own start.
std::mutex g_profile_mutex;
std::atomic<int> g_active_profiles{0};
std::atomic<int64_t> g_next_launch_id{1};
struct ActiveProfile {
  size_t first_launch = 0, first_sample = 0;
  int64_t start_ns = 0;
};
std::map<int, ActiveProfile>& active_profiles() {
  static auto* p = new std::map<int, ActiveProfile>();
  return *p;
}
int g_next_profile = 1;
std::vector<LaunchRecordPtr>& records() {
  static auto* r = new std::vector<LaunchRecordPtr>();
  return *r;
}
std::vector<MemorySample>& samples() {
  static auto* s = new std::vector<MemorySample>();
  return *s;
}

struct Watermark {
  std::atomic<bool> open{false};
  std::array<std::atomic<int64_t>, kMaxCores> peak{};
};
std::array<Watermark, kMaxWatermarks> g_watermarks;
std::atomic<int> g_open_watermarks{0};
std::array<std::atomic<int64_t>, kMaxCores> g_allocated{};

thread_local int tl_sync_depth = 0;

constexpr size_t kRing = 8192;
struct DurationRing {
  std::array<std::atomic<int64_t>, kRing> values{};
  std::atomic<uint64_t> count{0};
};
std::array<DurationRing, kTimedLaunchKinds> g_launch_times;

}  // namespace

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t correlation_id() noexcept { return tl_correlations.empty() ? 0 : tl_correlations.back(); }
void push_correlation(uint64_t id) { tl_correlations.push_back(id); }
void pop_correlation() {
  if (!tl_correlations.empty()) tl_correlations.pop_back();
}

int32_t host_thread_id() noexcept {
  thread_local const auto tid = static_cast<int32_t>(::syscall(SYS_gettid));
  return tid;
}

ProfilerWaits::ProfilerWaits() { ++tl_profiler_waits; }
ProfilerWaits::~ProfilerWaits() { --tl_profiler_waits; }
bool profiler_waits() noexcept { return tl_profiler_waits > 0; }
void enter_profiler_waits() { ++tl_profiler_waits; }
void exit_profiler_waits() {
  if (tl_profiler_waits > 0) --tl_profiler_waits;
}

void add_device_busy(int device, int64_t ns) {
  if (device >= 0 && device < kMaxCores) g_device_busy[device].fetch_add(ns, std::memory_order_relaxed);
}
void add_record_time(int64_t ns) { g_record_ns.fetch_add(ns, std::memory_order_relaxed); }
void add_wait_time(int64_t ns) { g_wait_ns.fetch_add(ns, std::memory_order_relaxed); }

namespace {
// The calling thread's host phases: a stack (scopes nest), and the time charged so far.
constexpr int kMaxPhaseDepth = 32;
struct PhaseClock {
  std::array<int64_t, kHostPhases> total{};
  std::array<HostPhase, kMaxPhaseDepth> stack{};
  int depth = 0;     // may exceed kMaxPhaseDepth: those levels are charged to the deepest kept
  int64_t since = 0;  // when the time of the current phase was last charged
};
thread_local PhaseClock tl_phases;

void charge_phase(PhaseClock& c, int64_t now) {
  if (c.depth > 0) c.total[static_cast<int>(c.stack[std::min(c.depth, kMaxPhaseDepth) - 1])] += now - c.since;
  c.since = now;
}

std::mutex g_busy_mutex;
int g_busy_count = 0;
int64_t g_busy_since = 0;
int64_t g_busy_union = 0;

std::mutex g_failures_mutex;
constexpr size_t kMaxFailures = 16;
std::deque<AsyncFailure>& failures() {
  static auto* f = new std::deque<AsyncFailure>();
  return *f;
}
}  // namespace

void enter_phase(HostPhase phase, int64_t now) {
  auto& c = tl_phases;
  charge_phase(c, now);
  if (c.depth < kMaxPhaseDepth) c.stack[c.depth] = phase;
  ++c.depth;
}

void exit_phase(int64_t now) {
  auto& c = tl_phases;
  if (c.depth == 0) return;
  charge_phase(c, now);
  --c.depth;
}

PhaseScope::PhaseScope(HostPhase phase) { enter_phase(phase); }
PhaseScope::~PhaseScope() { exit_phase(); }

std::array<int64_t, kHostPhases> thread_phase_ns() {
  auto c = tl_phases;  // a copy: charging it changes nothing of the thread's clock
  charge_phase(c, now_ns());
  return c.total;
}

void busy_begin(int64_t now) {
  std::lock_guard<std::mutex> lock(g_busy_mutex);
  if (g_busy_count++ == 0) g_busy_since = now;
}

void busy_end(int64_t now) {
  std::lock_guard<std::mutex> lock(g_busy_mutex);
  if (g_busy_count == 0) return;
  if (--g_busy_count == 0) g_busy_union += now - g_busy_since;
}

int64_t busy_union_ns() {
  std::lock_guard<std::mutex> lock(g_busy_mutex);
  return g_busy_union + (g_busy_count > 0 ? now_ns() - g_busy_since : 0);
}

void note_async_failure(AsyncFailure failure) {
  failure.time_ns = now_ns();
  std::lock_guard<std::mutex> lock(g_failures_mutex);
  auto& kept = failures();
  kept.push_back(std::move(failure));
  if (kept.size() > kMaxFailures) kept.pop_front();
}

std::vector<AsyncFailure> async_failures() {
  std::lock_guard<std::mutex> lock(g_failures_mutex);
  return {failures().begin(), failures().end()};
}

const char* launch_kind_name(LaunchKind kind) {
  switch (kind) {
    case LaunchKind::Graph: return "graph";
    case LaunchKind::Op: return "op";
    case LaunchKind::Inline: return "inline";
    case LaunchKind::Event: return "event";
    case LaunchKind::Wait: return "wait";
  }
  return "unknown";
}

const char* event_kind_name(EventKind kind) {
  switch (kind) {
    case EventKind::Sync: return "sync";
    case EventKind::NewGraph: return "new_graph";
    case EventKind::Recompile: return "recompile";
    case EventKind::InlineOp: return "inline_op";
    case EventKind::Compile: return "compile";
    case EventKind::CompileFailed: return "compile_failed";
    case EventKind::CompiledFallback: return "compiled_fallback";
    case EventKind::Policy: return "policy";
  }
  return "unknown";
}

void note_launch_time(LaunchKind kind, int64_t ns) {
  if (static_cast<int>(kind) >= kTimedLaunchKinds) return;
  auto& ring = g_launch_times[static_cast<int>(kind)];
  const uint64_t i = ring.count.fetch_add(1, std::memory_order_relaxed);
  ring.values[i % kRing].store(ns, std::memory_order_relaxed);
}

std::vector<int64_t> launch_times(LaunchKind kind, uint64_t* total) {
  if (static_cast<int>(kind) >= kTimedLaunchKinds) {
    if (total != nullptr) *total = 0;
    return {};
  }
  auto& ring = g_launch_times[static_cast<int>(kind)];
  const uint64_t n = ring.count.load();
  if (total != nullptr) *total = n;
  std::vector<int64_t> out;
  const uint64_t kept = std::min<uint64_t>(n, kRing);
  out.reserve(kept);
  for (uint64_t i = n - kept; i < n; ++i) out.push_back(ring.values[i % kRing].load(std::memory_order_relaxed));
  return out;
}

void reset_launch_times() {
  for (auto& ring : g_launch_times) ring.count.store(0);
}

Totals totals() {
  Totals t;
  for (const auto& b : g_device_busy) t.device_busy_ns.push_back(b.load(std::memory_order_relaxed));
  t.record_ns = g_record_ns.load();
  t.wait_ns = g_wait_ns.load();
  t.profiler_wait_ns = g_profiler_wait_ns.load();
  return t;
}

void log_event(Event e) {
  std::lock_guard<std::mutex> lock(g_events_mutex);
  auto& log = events();
  log.push_back(std::move(e));
  if (log.size() > kMaxEvents) log.pop_front();
}

std::vector<Event> events_since(int64_t since_ns) {
  std::lock_guard<std::mutex> lock(g_events_mutex);
  std::vector<Event> out;
  for (const auto& e : events()) {
    if (e.time_ns >= since_ns) out.push_back(e);
  }
  return out;
}

SyncScope::SyncScope(Reason reason, std::string_view what, int device)
    : outermost_(tl_sync_depth++ == 0), reason_(reason), device_(device) {
  enter_phase(HostPhase::Waiting);
  if (!outermost_) return;
  what_ = what.empty() ? reason_name(reason) : std::string(what);
  start_ = now_ns();
  source_ = capture();
}

SyncScope::~SyncScope() {
  exit_phase();
  --tl_sync_depth;
  if (!outermost_) return;
  Event e;
  e.time_ns = start_;
  e.duration_ns = now_ns() - start_;
  e.kind = EventKind::Sync;
  e.reason = reason_;
  e.what = std::move(what_);
  e.source = source_;
  e.device = device_;
  e.by_profiler = profiler_waits();
  if (e.by_profiler) {
    g_profiler_wait_ns.fetch_add(e.duration_ns, std::memory_order_relaxed);
  } else {
    add_wait_time(e.duration_ns);
  }
  log_event(std::move(e));
}

const char* tier_name(LaunchTier tier) {
  switch (tier) {
    case LaunchTier::Replay: return "replay";
    case LaunchTier::Compiled: return "compiled";
    case LaunchTier::None: break;
  }
  return "";
}

const char* status_name(LaunchStatus status) {
  switch (status) {
    case LaunchStatus::Queued: return "queued";
    case LaunchStatus::Done: return "done";
    case LaunchStatus::Failed: return "failed";
    case LaunchStatus::Skipped: return "skipped";
  }
  return "?";
}

bool profiling() noexcept { return g_active_profiles.load(std::memory_order_relaxed) > 0; }

LaunchRecordPtr new_launch(LaunchKind kind, std::string_view name, int device, int64_t stream) {
  if (!profiling()) return nullptr;
  auto r = std::make_shared<LaunchRecord>();
  r->id = g_next_launch_id.fetch_add(1);
  r->kind = kind;
  r->name = std::string(name);  // built only while profiling: every op run at once asks
  r->device = device;
  r->stream = stream;
  r->enqueue_ns = now_ns();
  r->correlation = correlation_id();
  r->host_tid = host_thread_id();
  std::lock_guard<std::mutex> lock(g_profile_mutex);
  if (active_profiles().empty()) return nullptr;
  records().push_back(r);
  return r;
}

void note_memory(int device, int64_t allocated, int64_t reserved, void* ptr, int64_t delta) {
  if (device < 0 || device >= kMaxCores) return;
  if (delta != 0 && c10::memoryProfilingEnabled()) {  // torch.profiler(profile_memory=True) on this thread
    c10::reportMemoryUsageToProfiler(ptr, delta, static_cast<size_t>(allocated), static_cast<size_t>(reserved),
                                     c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)));
  }
  g_allocated[device].store(allocated, std::memory_order_relaxed);
  if (g_open_watermarks.load(std::memory_order_relaxed) > 0) {
    for (auto& w : g_watermarks) {
      if (!w.open.load(std::memory_order_relaxed)) continue;
      auto& peak = w.peak[device];
      int64_t seen = peak.load(std::memory_order_relaxed);
      while (allocated > seen && !peak.compare_exchange_weak(seen, allocated)) {
      }
    }
  }
  if (!profiling()) return;
  std::lock_guard<std::mutex> lock(g_profile_mutex);
  if (!active_profiles().empty()) samples().push_back({now_ns(), device, allocated, reserved});
}

std::vector<int64_t> allocated_now() {
  std::vector<int64_t> out;
  for (const auto& a : g_allocated) out.push_back(a.load(std::memory_order_relaxed));
  return out;
}

int start_profile() {
  std::lock_guard<std::mutex> lock(g_profile_mutex);
  const int handle = g_next_profile++;
  active_profiles()[handle] = {records().size(), samples().size(), now_ns()};
  g_active_profiles.fetch_add(1);
  return handle;
}

Profile stop_profile(int handle) {
  std::lock_guard<std::mutex> lock(g_profile_mutex);
  auto it = active_profiles().find(handle);
  TORCH_CHECK(it != active_profiles().end(), "neuron: this profiler was already stopped");
  Profile p;
  p.start_ns = it->second.start_ns;
  p.end_ns = now_ns();
  p.launches.assign(records().begin() + static_cast<std::ptrdiff_t>(it->second.first_launch), records().end());
  p.memory.assign(samples().begin() + static_cast<std::ptrdiff_t>(it->second.first_sample), samples().end());
  active_profiles().erase(it);
  g_active_profiles.fetch_sub(1);
  if (active_profiles().empty()) {
    records().clear();
    samples().clear();
  } else {
    // Drop what no remaining profile reads.
    size_t first_launch = records().size(), first_sample = samples().size();
    for (const auto& [h, a] : active_profiles()) {
      first_launch = std::min(first_launch, a.first_launch);
      first_sample = std::min(first_sample, a.first_sample);
    }
    if (first_launch > 0 || first_sample > 0) {
      records().erase(records().begin(), records().begin() + static_cast<std::ptrdiff_t>(first_launch));
      samples().erase(samples().begin(), samples().begin() + static_cast<std::ptrdiff_t>(first_sample));
      for (auto& [h, a] : active_profiles()) {
        a.first_launch -= first_launch;
        a.first_sample -= first_sample;
      }
    }
  }
  return p;
}

namespace {
std::mutex g_annotator_mutex;
ProfileAnnotator& annotator() {
  static auto* a = new ProfileAnnotator();
  return *a;
}
}  // namespace

void set_profile_annotator(ProfileAnnotator a) {
  std::lock_guard<std::mutex> lock(g_annotator_mutex);
  annotator() = std::move(a);
}

ProfileNotes annotate(const Profile& profile) {
  ProfileAnnotator a;
  {
    std::lock_guard<std::mutex> lock(g_annotator_mutex);
    a = annotator();
  }
  return a ? a(profile) : ProfileNotes{};
}

std::string source_text(Source loc, const ProfileNotes& notes) {
  if (loc.file < 0) return "";
  const auto f = frame(loc);
  const auto named = notes.file_names.find(f.file);
  if (named == notes.file_names.end() || named->second.empty()) {
    return f.file + ":" + std::to_string(f.line) + " in " + f.function;
  }
  std::string out = named->second + ", line " + std::to_string(f.line);
  if (f.function != "<module>") out += " in " + f.function;
  return out;
}

int open_watermark() {
  for (int i = 0; i < kMaxWatermarks; ++i) {
    bool expected = false;
    if (g_watermarks[i].open.compare_exchange_strong(expected, true)) {
      for (int d = 0; d < kMaxCores; ++d) g_watermarks[i].peak[d].store(g_allocated[d].load());
      g_open_watermarks.fetch_add(1);
      return i;
    }
  }
  TORCH_CHECK(false, "neuron: more than ", kMaxWatermarks,
              " nested explain scopes or profilers are open; close some (use them as `with` blocks)");
}

std::vector<int64_t> close_watermark(int handle) {
  TORCH_CHECK(handle >= 0 && handle < kMaxWatermarks && g_watermarks[handle].open.load(),
              "neuron: this memory watermark is not open");
  std::vector<int64_t> out;
  for (const auto& p : g_watermarks[handle].peak) out.push_back(p.load());
  g_watermarks[handle].open.store(false);
  g_open_watermarks.fetch_sub(1);
  return out;
}

}  // namespace neuron::trace
