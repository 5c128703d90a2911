// The device's execution engine: streams as in-order queues, each drained by
// its own device thread, so the host enqueues work and runs ahead while the
// device executes. Several streams execute concurrently; events and waits order
// them. Errors inside a launch are kept on the stream and raised at the next
// wait, as CUDA reports asynchronous errors.
#include "interceptor.h"
#include "runtime.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <Python.h>
#include <c10/util/Exception.h>
#include <torch/csrc/utils/device_lazy_init.h>

#include <cxxabi.h>
#include <dlfcn.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <pthread.h>
#include <sched.h>
#include <thread>

namespace neuron {

struct StreamState {
  c10::DeviceIndex device = 0;
  c10::StreamId id = 0;
  std::mutex mutex;
  std::condition_variable work_ready;  // device thread waits for work
  std::condition_variable work_done;   // waiters wait for completions
  std::deque<Work> queue;
  std::atomic<uint64_t> enqueued{0};
  std::atomic<uint64_t> completed{0};
  // Ops a host thread ran itself (LaunchScope): launches for the stream's counts, but not
  // in the enqueued / completed sequence that events and waits compare, so a thread that
  // runs one takes no lock and cannot interleave with another thread's enqueue.
  std::atomic<uint64_t> ran_inline{0};
  std::atomic<int64_t> queued_ops{0};
  std::atomic<int64_t> queued_result_bytes{0};
  bool thread_started = false;
  // A launch is executing: on the device thread, or on a waiting host thread
  // that runs the queue's front itself (wait_for). One at a time keeps stream order.
  bool running = false;
  // The first error since the last wait that reported one; later compute
  // launches are skipped until it is reported.
  std::exception_ptr error;
};

namespace {

// A host that runs further ahead than this many queued ops waits (as a GPU's
// bounded launch queue makes it): the queue stays short enough for a wait to
// be short, and memory held by queued launches bounded.
constexpr int64_t kMaxQueuedOps = 512;
// ... or whose queued launches' results took this much device memory. A result's memory is
// taken when its op is recorded and the tensors a queued launch reads stay alive until it
// has run, so a host recording far ahead of its device thread would hold both for every
// queued launch. 16 MiB is two of adaptive eager's default graphs (8 MiB of live results
// each): the one running and the next. (Measured per bound: commit a8f2501.)
constexpr int64_t kMaxQueuedResultBytes = int64_t{16} << 20;

bool queue_is_full(const StreamState& s) {
  return s.queued_ops.load() >= kMaxQueuedOps || s.queued_result_bytes.load() >= kMaxQueuedResultBytes;
}

thread_local std::array<c10::StreamId, kMaxCores> tl_stream{};
thread_local bool tl_on_device_thread = false;
thread_local bool tl_own_device_thread = false;  // a device thread of its own (device_thread_main)

// Launches device threads ran, for a host thread to drop (release_finished_work). Leaked:
// launches left in it at exit must not be dropped after Python has finalized.
std::mutex g_finished_mutex;
std::vector<Work>* g_finished = new std::vector<Work>();
std::atomic<bool> g_any_finished{false};
// HostRunsWhatItWaitsFor: its nesting depth on this thread; whether wake-ups are still
// deferred (a second stream ends that); the one stream not yet woken for its work.
thread_local int tl_wait_scope_depth = 0;
thread_local bool tl_defer_wakeups = false;
thread_local StreamState* tl_unwoken_stream = nullptr;

// Tells the stream's device thread that work is queued.
void wake(StreamState& s) {
  op_counters().device_thread_wakeups.fetch_add(1, std::memory_order_relaxed);
  s.work_ready.notify_one();
}

std::atomic<bool> g_threads_started{false};
std::atomic<bool> g_bad_fork{false};
// Launches queued or executing on any stream, and streams holding an error not yet
// raised: both zero means a host access has nothing to wait for (device_quiet()).
std::atomic<int64_t> g_launches_in_flight{0};
std::atomic<int64_t> g_unreported_errors{0};

struct StreamRegistry {
  std::mutex mutex;
  std::deque<StreamState> streams;  // index == stream id; deque keeps addresses stable
};
// Never destroyed: device threads may outlive static destruction at exit.
std::array<StreamRegistry, kMaxCores>& registries() {
  static auto* regs = new std::array<StreamRegistry, kMaxCores>();
  return *regs;
}

StreamRegistry& registry(c10::DeviceIndex index) {
  check_device_index(index);
  return registries()[index];
}

StreamState& ensure_stream(StreamRegistry& reg, c10::DeviceIndex device, size_t id) {
  // Called with reg.mutex held.
  while (reg.streams.size() <= id) {
    auto& s = reg.streams.emplace_back();
    s.device = device;
    s.id = static_cast<c10::StreamId>(reg.streams.size() - 1);
  }
  return reg.streams[id];
}

c10::Stream make_stream(c10::DeviceIndex index, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, index), id);
}

// Releases the GIL for the duration of a blocking wait, if this thread holds it:
// a device thread may need it (compiled graphs) and other Python threads run on.
class GilRelease {
 public:
  GilRelease() {
    if (Py_IsInitialized() && PyGILState_Check()) state_ = PyEval_SaveThread();
  }
  ~GilRelease() {
    if (state_ != nullptr) PyEval_RestoreThread(state_);
  }

 private:
  PyThreadState* state_ = nullptr;
};

// Executes one launch popped from the stream's queue (s->running is set), then
// counts it as done: on the stream's device thread, or on a host thread that
// was about to wait for it anyway.
void execute(StreamState* s, Work& work, bool skip) {
  std::exception_ptr failure;
  // Kernels use as many threads as the code that launched them asked for
  // (torch.set_num_threads): a device thread would otherwise run OpenMP's default
  // team, whose spinning workers compete with the host for the same cores.
  if (work.intra_op_threads > 0 && at::get_num_threads() != work.intra_op_threads) {
    at::set_num_threads(work.intra_op_threads);
  }
  const int64_t start = trace::now_ns();
  if (work.record) work.record->start_ns.store(start);
  if (skip && work.on_skip) {
    try {
      work.on_skip();
    } catch (abi::__forced_unwind&) {
      throw;
    } catch (...) {
    }
  }
  if (!skip) {
    struct Busy {  // the device's busy time, counted once however many streams run
      bool on;
      explicit Busy(bool counts) : on(counts) { if (on) trace::busy_begin(); }
      ~Busy() { if (on) trace::busy_end(); }
    } busy(work.busy);
    try {
      work.run();
    } catch (abi::__forced_unwind&) {
      throw;  // the thread is being cancelled (e.g. Python finalizing): let it end
    } catch (...) {
      failure = std::current_exception();
    }
  }
  const int64_t end = trace::now_ns();
  if (!skip && work.busy) {
    trace::add_device_busy(s->device, end - start);
    trace::note_launch_time(work.kind, end - start);
  }
  if (work.record) {
    work.record->end_ns.store(end);
    work.record->status.store(skip ? trace::LaunchStatus::Skipped : failure != nullptr ? trace::LaunchStatus::Failed : trace::LaunchStatus::Done);
  }
  // Drop the launch (and the tensors it holds) before it counts as done, so that memory
  // statistics read after a wait include its frees: here on a host thread, and a device
  // thread's by the host that waits for it (release_finished_work).
  const int64_t ops = work.ops;
  const int64_t result_bytes = work.result_bytes;
  if (tl_own_device_thread) {
    std::lock_guard<std::mutex> lock(g_finished_mutex);
    g_finished->push_back(std::move(work));
    g_any_finished.store(true, std::memory_order_release);
  }
  work = Work();
  s->queued_ops.fetch_sub(ops);
  s->queued_result_bytes.fetch_sub(result_bytes);
  bool more = false;
  {
    std::lock_guard<std::mutex> lock(s->mutex);
    if (failure != nullptr && s->error == nullptr) {
      s->error = failure;
      g_unreported_errors.fetch_add(1, std::memory_order_release);
    }
    s->completed.fetch_add(1, std::memory_order_release);
    g_launches_in_flight.fetch_sub(1, std::memory_order_release);
    s->running = false;
    more = !s->queue.empty();
  }
  s->work_done.notify_all();
  if (more) wake(*s);  // the device thread waits while another thread executes
}

// Pops the queue's front for execution; called with s->mutex held.
Work pop_front(StreamState* s, bool* skip) {
  Work work = std::move(s->queue.front());
  s->queue.pop_front();
  *skip = work.skippable && s->error != nullptr;
  s->running = true;
  return work;
}

// ---- OpenMP workers of an idle device thread ----------------------------------------------
// Each thread that runs a parallel region (ATen's kernels) gets OpenMP worker threads of its
// own. Once a device thread has workers, libgomp manages more threads than there are cores
// and stops letting idle workers spin: every parallel region the host's thread runs after
// that (ops run at once, CPU work) wakes its workers with a system call. A device thread
// idle for kReleaseWorkersAfter gives its workers back (omp_pause_resource_all, per calling
// thread); the next parallel region it runs starts them again.
constexpr auto kReleaseWorkersAfter = std::chrono::milliseconds(5);
constexpr auto kReleaseHostWorkersAfter = std::chrono::milliseconds(1);  // a host blocked in a wait (wait_for)

using OmpPauseResourceAll = int (*)(int);

// libgomp's omp_pause_resource_all, from the copy torch loaded (none: another OpenMP, or
// none, and nothing to release).
OmpPauseResourceAll omp_pause_resource_all_fn() {
  static const OmpPauseResourceAll fn = [] {
    void* symbol = dlsym(RTLD_DEFAULT, "omp_pause_resource_all");
    if (symbol == nullptr) {
      if (void* gomp = dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD)) symbol = dlsym(gomp, "omp_pause_resource_all");
    }
    return reinterpret_cast<OmpPauseResourceAll>(symbol);
  }();
  return fn;
}

void release_openmp_workers() {
  constexpr int kOmpPauseSoft = 1;  // omp_pause_soft: threads go, settings stay
  if (auto pause = omp_pause_resource_all_fn()) pause(kOmpPauseSoft);
}

void capture_fresh_thread_state();

void device_thread_main(StreamState* s) {
  tl_on_device_thread = true;
  tl_own_device_thread = true;
  // Per-thread set-up before the first launch arrives (the current device's default stream
  // starts its thread at the device's first use, start_device_thread): the fresh thread's
  // state for hosts that run launches themselves, and ATen's per-thread OpenMP and MKL counts.
  capture_fresh_thread_state();
  at::get_num_threads();
  bool workers_may_run = true;  // this thread may have OpenMP workers (it has run a launch)
  for (;;) {
    Work work;
    bool skip = false;
    {
      std::unique_lock<std::mutex> lock(s->mutex);
      const auto ready = [&] { return !s->queue.empty() && !s->running; };
      if (workers_may_run && !s->work_ready.wait_for(lock, kReleaseWorkersAfter, ready)) {
        lock.unlock();
        release_openmp_workers();
        workers_may_run = false;
        lock.lock();
      }
      s->work_ready.wait(lock, ready);
      work = pop_front(s, &skip);
    }
    execute(s, work, skip);
    workers_may_run = true;
  }
}

// The thread-local state of a fresh thread (no autocast, grad mode on, no
// Python modes): what launches see on a device thread. Captured by the first device
// thread as it starts (a fresh thread), or by a thread started for it if a host needs it
// first.
std::atomic<const at::ThreadLocalState*> g_fresh_thread_state{nullptr};

void capture_fresh_thread_state() {
  if (g_fresh_thread_state.load(std::memory_order_acquire) != nullptr) return;
  auto* state = new at::ThreadLocalState();
  const at::ThreadLocalState* expected = nullptr;
  if (!g_fresh_thread_state.compare_exchange_strong(expected, state)) delete state;
}

const at::ThreadLocalState& device_thread_state() {
  if (const auto* state = g_fresh_thread_state.load(std::memory_order_acquire)) return *state;
  std::thread(capture_fresh_thread_state).join();
  return *g_fresh_thread_state.load(std::memory_order_acquire);
}

// While a host thread executes a launch for a stream it waits on, it looks like
// a device thread: the state of a fresh thread, the default streams, no
// recording, and its own allocations outside any host kernel's device memory.
class ActAsDeviceThread {
 public:
  ActAsDeviceThread() : tls_(device_thread_state()), streams_(tl_stream), host_allocations_(-1) {
    tl_stream.fill(0);
    tl_on_device_thread = true;
  }
  ~ActAsDeviceThread() {
    tl_on_device_thread = false;
    tl_stream = streams_;
  }

 private:
  at::ThreadLocalStateGuard tls_;
  std::array<c10::StreamId, kMaxCores> streams_;
  HostAllocationsOnDevice host_allocations_;
};

// In a child forked after the device started, the device is unusable: its threads are
// gone, its locks may be held for ever, and its memory file is the parent's. Every entry
// point that touches device memory or device state raises (check_not_forked); torch's
// factories ask torch.neuron._lazy_init() again, which raises too.
void on_fork_child() {
  if (!g_threads_started.load()) return;
  g_bad_fork = true;
  torch::utils::set_requires_device_init(kNeuron, true);
}

void install_fork_handler() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, &on_fork_child); });
}

}  // namespace

bool in_bad_fork() { return g_bad_fork.load(); }

void check_not_forked() {
  if (C10_LIKELY(!g_bad_fork.load(std::memory_order_relaxed))) return;
  TORCH_CHECK(false,
              "neuron: cannot use the neuron device in a process forked after the parent used it (its "
              "runtime threads do not survive fork(), and its memory is the parent's). Start the process "
              "with the 'spawn' or 'forkserver' start method: torch.multiprocessing.set_start_method('spawn'), "
              "torch.multiprocessing.get_context('forkserver'), or DataLoader(..., "
              "multiprocessing_context='spawn'); or keep a DataLoader worker's data on the CPU and move "
              "each batch to neuron in the main process.");
}

void note_device_started() {
  install_fork_handler();
  g_threads_started = true;
}

bool on_device_thread() { return tl_on_device_thread; }
void release_finished_work() {
  if (tl_on_device_thread || !g_any_finished.load(std::memory_order_acquire)) return;
  std::vector<Work> finished;
  {
    std::lock_guard<std::mutex> lock(g_finished_mutex);
    finished.swap(*g_finished);
    g_any_finished.store(false, std::memory_order_release);
  }
  op_counters().launches_dropped_by_host.fetch_add(finished.size(), std::memory_order_relaxed);
}  // dropped here, outside the lock

// OpenMP's and MKL's thread-local setters, from the runtimes torch loaded (weak: a
// torch built without them leaves them null).
extern "C" void omp_set_num_threads(int) __attribute__((weak));
extern "C" int MKL_Set_Num_Threads_Local(int) __attribute__((weak));  // C ABI (the lower-case one is Fortran's)

// (at::get_num_threads first runs PyTorch's per-thread initialization, which would
// otherwise undo this at the thread's first parallel loop.)
SingleThreadedKernels::SingleThreadedKernels() : previous_(at::get_num_threads()) {
  if (previous_ != 1 && omp_set_num_threads != nullptr) omp_set_num_threads(1);
  if (MKL_Set_Num_Threads_Local != nullptr) previous_mkl_ = MKL_Set_Num_Threads_Local(1);
}

SingleThreadedKernels::~SingleThreadedKernels() {
  if (previous_ != 1 && omp_set_num_threads != nullptr) omp_set_num_threads(previous_);
  if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(previous_mkl_);  // 0: MKL's global count
}

c10::Stream default_stream(c10::DeviceIndex index) {
  check_not_forked();
  index = resolve_device(index);
  auto& reg = registry(index);
  std::lock_guard<std::mutex> lock(reg.mutex);
  ensure_stream(reg, index, 0);
  return make_stream(index, 0);
}

c10::Stream current_stream(c10::DeviceIndex index) {
  check_not_forked();  // every allocation and every op asks for its stream
  index = resolve_device(index);
  return make_stream(index, tl_stream[index]);
}

c10::Stream new_stream(c10::DeviceIndex index, int /*priority*/) {
  check_not_forked();
  index = resolve_device(index);
  auto& reg = registry(index);
  std::lock_guard<std::mutex> lock(reg.mutex);
  ensure_stream(reg, index, reg.streams.size() + (reg.streams.empty() ? 1 : 0));
  return make_stream(index, static_cast<c10::StreamId>(reg.streams.size() - 1));
}

namespace {

StreamState& stream_state_slow(c10::Stream stream) {
  auto& reg = registry(stream.device_index());
  std::lock_guard<std::mutex> lock(reg.mutex);
  const auto id = stream.id();
  TORCH_CHECK(id >= 0 && (id == 0 || static_cast<size_t>(id) < reg.streams.size()), "neuron: unknown stream id ",
              id, " on ", stream.device(), "; streams come from torch.neuron.Stream()");
  return ensure_stream(reg, stream.device_index(), static_cast<size_t>(id));
}

}  // namespace

StreamState& stream_state(c10::Stream stream) {
  // Every launch, wait, event and op run at once asks for its stream's state: in a forked
  // child, it raises here.
  check_not_forked();
  // The last one found is kept per thread (states live as long as the process, at stable
  // addresses), saving the registry's lock.
  thread_local StreamState* last = nullptr;
  if (last != nullptr && last->id == stream.id() && last->device == stream.device_index() &&
      stream.device_type() == kNeuron) {
    return *last;
  }
  TORCH_CHECK(stream.device_type() == kNeuron, "expected a neuron stream, got a stream on ", stream.device());
  last = &stream_state_slow(stream);
  return *last;
}

int64_t num_streams(c10::DeviceIndex index) {
  auto& reg = registry(resolve_device(index));
  std::lock_guard<std::mutex> lock(reg.mutex);
  ensure_stream(reg, index, 0);
  return static_cast<int64_t>(reg.streams.size());
}

bool device_quiet() {
  return g_launches_in_flight.load(std::memory_order_acquire) == 0 &&
         g_unreported_errors.load(std::memory_order_acquire) == 0;
}

uint64_t stream_enqueued(const StreamState& s) { return s.enqueued.load(std::memory_order_acquire); }
uint64_t stream_completed(const StreamState& s) { return s.completed.load(std::memory_order_acquire); }
uint64_t stream_ran_inline(const StreamState& s) { return s.ran_inline.load(std::memory_order_relaxed); }
c10::Stream stream_of(const StreamState& s) { return make_stream(s.device, s.id); }
bool stream_idle(const StreamState& s) { return stream_completed(s) >= stream_enqueued(s); }

c10::Stream exchange_stream(c10::Stream stream) {
  // The autograd engine sets each node's stream, almost always the current one already.
  const auto index = stream.device_index();
  if (stream.device_type() == kNeuron && index >= 0 && index < device_count()) {
    const c10::Stream current = current_stream(index);
    if (current == stream) return current;
  }
  stream_state(stream);  // validates
  auto previous = current_stream(index);
  if (previous != stream) interceptor().flush_stream(previous, Reason::StreamSwitch);
  tl_stream[index] = stream.id();
  return previous;
}

namespace {
// Starts the stream's device thread unless it runs; called with s.mutex held.
void start_thread_locked(StreamState& s) {
  if (s.thread_started) return;
  install_fork_handler();
  std::thread(device_thread_main, &s).detach();
  s.thread_started = true;
  g_threads_started = true;
}
}  // namespace

void start_device_thread(c10::DeviceIndex device) {
  check_not_forked();
  StreamState& s = stream_state(default_stream(device));
  std::lock_guard<std::mutex> lock(s.mutex);
  start_thread_locked(s);
}

namespace {
void wait_until_done(StreamState& s, uint64_t seq, std::atomic<uint64_t>& host_runs_counter);

// The CPUs this process may run on (its affinity mask), read once.
int usable_cpus() {
  static const int count = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) return static_cast<int>(std::thread::hardware_concurrency());
    return CPU_COUNT(&set);
  }();
  return count;
}

std::atomic<LaunchRunner> g_launch_runner{LaunchRunner::Auto};  // launches.py: the default
}  // namespace

LaunchRunner launch_runner() { return g_launch_runner.load(std::memory_order_relaxed); }
void set_launch_runner(LaunchRunner runner) { g_launch_runner.store(runner, std::memory_order_relaxed); }

bool host_runs_launches(int intra_op_threads) {
  switch (launch_runner()) {
    case LaunchRunner::Host: return true;
    case LaunchRunner::DeviceThread: return false;
    case LaunchRunner::Auto: break;
  }
  // Kernels that take every usable core leave none for a host that records meanwhile: the
  // host thread and the kernels' OpenMP team would then share cores, and a parallel region
  // waits for its slowest thread. Running the launch on the host costs no overlap there.
  return intra_op_threads >= usable_cpus();
}

uint64_t enqueue(StreamState& s, Work work, bool inline_if_idle) {
  check_not_forked();
  uint64_t seq;
  if (work.intra_op_threads == 0) work.intra_op_threads = at::get_num_threads();
  const bool host_runs = !tl_on_device_thread && !inline_if_idle && host_runs_launches(work.intra_op_threads);
  // Back-pressure: like a GPU's launch queue, a stream holds a bounded number
  // of launches; a host that runs too far ahead waits (without the GIL).
  if (!on_device_thread() && queue_is_full(s)) {
    if (tl_unwoken_stream == &s) {  // the device thread must drain it: wake it now
      tl_unwoken_stream = nullptr;
      tl_defer_wakeups = false;
      wake(s);
    }
    GilRelease no_gil;
    std::unique_lock<std::mutex> lock(s.mutex);
    s.work_done.wait(lock, [&] { return !queue_is_full(s); });
  }
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (inline_if_idle && s.queue.empty() && s.completed.load() == s.enqueued.load() && s.error == nullptr) {
      if (work.record) work.record->start_ns.store(trace::now_ns());
      work.run();
      if (work.record) {
        work.record->end_ns.store(trace::now_ns());
        work.record->status.store(trace::LaunchStatus::Done);
      }
      s.enqueued.fetch_add(1);
      return s.completed.fetch_add(1) + 1;
    }
    if (!host_runs) start_thread_locked(s);
    s.queued_ops.fetch_add(work.ops);
    s.queued_result_bytes.fetch_add(work.result_bytes);
    g_launches_in_flight.fetch_add(1, std::memory_order_acq_rel);
    s.queue.push_back(std::move(work));
    seq = s.enqueued.fetch_add(1, std::memory_order_acq_rel) + 1;
  }
  if (host_runs) {
    // As a wait would run it (its error stays on the stream for the next wait), now; the
    // host's time goes to running ops, not to the recording that made the launch.
    trace::PhaseScope running(trace::HostPhase::RunningOps);
    wait_until_done(s, seq, op_counters().launches_run_by_host);
    return seq;
  }
  if (tl_defer_wakeups && !tl_on_device_thread) {
    if (tl_unwoken_stream == nullptr || tl_unwoken_stream == &s) {
      tl_unwoken_stream = &s;  // the host's wait runs it (HostRunsWhatItWaitsFor)
      return seq;
    }
    tl_defer_wakeups = false;  // a second stream: each device thread runs its own
    wake(*std::exchange(tl_unwoken_stream, nullptr));
  }
  wake(s);
  return seq;
}

HostRunsWhatItWaitsFor::HostRunsWhatItWaitsFor() : counted_(!tl_on_device_thread) {
  if (counted_ && tl_wait_scope_depth++ == 0) tl_defer_wakeups = true;
}

HostRunsWhatItWaitsFor::~HostRunsWhatItWaitsFor() {
  if (!counted_ || --tl_wait_scope_depth > 0) return;
  tl_defer_wakeups = false;
  if (StreamState* s = std::exchange(tl_unwoken_stream, nullptr)) {
    bool left_queued = false;
    {
      std::lock_guard<std::mutex> lock(s->mutex);
      left_queued = !s->queue.empty();
    }
    if (left_queued) wake(*s);
  }
}

namespace {
// Waits (releasing the GIL) until the stream has executed launch `seq`; its error, if
// any, stays on the stream.
// host_runs_counter counts the launches this host thread runs itself.
void wait_until_done(StreamState& s, uint64_t seq, std::atomic<uint64_t>& host_runs_counter) {
  if (s.completed.load(std::memory_order_acquire) < seq) {
    GilRelease no_gil;
    std::unique_lock<std::mutex> lock(s.mutex);
    bool host_workers_kept = true;
    while (s.completed.load(std::memory_order_acquire) < seq) {
      // Rather than wake the device thread and sleep until it is done, a host
      // thread runs the launches it waits for itself when nothing is executing:
      // two thread hand-offs fewer per wait, and the data stays in this core's cache.
      if (!tl_on_device_thread && !s.running && !s.queue.empty()) {
        bool skip = false;
        Work work = pop_front(&s, &skip);
        lock.unlock();
        {
          ActAsDeviceThread as_device;
          host_runs_counter.fetch_add(1, std::memory_order_relaxed);
          execute(&s, work, skip);
        }
        lock.lock();
        continue;
      }
      // A host blocked on a device that computes gives its OpenMP workers back, as an idle
      // device thread does: the device thread's parallel regions then keep their spinning
      // workers. Only once the wait has lasted, so that short waits cost nothing.
      if (!host_workers_kept) {
        s.work_done.wait(lock);
      } else if (s.work_done.wait_for(lock, kReleaseHostWorkersAfter) == std::cv_status::timeout) {
        lock.unlock();
        release_openmp_workers();
        host_workers_kept = false;
        lock.lock();
      }
    }
  }
}
}  // namespace

void wait_for(StreamState& s, uint64_t seq) {
  wait_until_done(s, seq, op_counters().launches_run_by_waiting_host);
  release_finished_work();  // what the launches waited for held: memory statistics read next count its frees
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.error == nullptr) return;
    std::swap(error, s.error);
    g_unreported_errors.fetch_sub(1, std::memory_order_release);
  }
  std::rethrow_exception(error);
}

void synchronize_stream(c10::Stream stream, Reason reason) {
  trace::SyncScope scope(reason, {}, stream.device_index());
  HostRunsWhatItWaitsFor host_runs;
  interceptor().note_sync(reason, {});
  interceptor().flush_stream(stream, reason);
  auto& s = stream_state(stream);
  wait_for(s, stream_enqueued(s));
}

void synchronize_device(c10::DeviceIndex index, Reason reason, std::string_view what) {
  index = resolve_device(index);
  trace::SyncScope scope(reason, what, index);
  HostRunsWhatItWaitsFor host_runs;
  interceptor().note_sync(reason, what);
  interceptor().flush_device(index, reason);
  // Every stream is waited for before the first error is raised: a
  // synchronize leaves the device idle either way.
  std::exception_ptr first;
  for (int64_t id = 0; id < num_streams(index); ++id) {
    auto& s = stream_state(make_stream(index, static_cast<c10::StreamId>(id)));
    try {
      wait_for(s, stream_enqueued(s));
    } catch (...) {
      if (first == nullptr) first = std::current_exception();
    }
  }
  if (first != nullptr) std::rethrow_exception(first);
}

void finish_all_work(Reason reason) {
  trace::SyncScope scope(reason, {}, -1);
  HostRunsWhatItWaitsFor host_runs;
  for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
    interceptor().flush_device(d, reason);
    for (int64_t id = 0; id < num_streams(d); ++id) {
      auto& s = stream_state(make_stream(d, static_cast<c10::StreamId>(id)));
      wait_until_done(s, stream_enqueued(s), op_counters().launches_run_by_waiting_host);
    }
  }
  release_finished_work();
}

void synchronize_all(Reason reason) {
  trace::SyncScope scope(reason, {}, -1);
  std::exception_ptr first;
  for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
    try {
      synchronize_device(d, reason);
    } catch (...) {
      if (first == nullptr) first = std::current_exception();
    }
  }
  if (first != nullptr) std::rethrow_exception(first);
}

// Inline work counts as a launch of the current stream only when that stream
// is idle: with launches queued, a count taken as done would let a waiter take
// an unfinished queued launch for done (completions are counts, not ids).
LaunchScope::LaunchScope(c10::DeviceIndex device, const char* name, bool synced) : device_(device) {
  if (!synced) synchronize_device(device, Reason::InlineOp, name);
  stream_ = &stream_state(current_stream(device));
  stream_->ran_inline.fetch_add(1, std::memory_order_relaxed);
  if (trace::profiling()) {  // a record (and its name's copy) only for a profiler to read
    record_ = trace::new_launch(trace::LaunchKind::Inline, name, device, stream_->id);
    if (record_) record_->source = trace::capture();
  }
  start_ns_ = trace::now_ns();
  if (record_) record_->start_ns.store(start_ns_);
  trace::busy_begin(start_ns_);
  trace::enter_phase(trace::HostPhase::RunningOps, start_ns_);
}

LaunchScope::~LaunchScope() {
  const int64_t end = trace::now_ns();
  trace::exit_phase(end);
  trace::busy_end(end);
  trace::add_device_busy(device_, end - start_ns_);
  trace::note_launch_time(trace::LaunchKind::Inline, end - start_ns_);
  if (record_) {
    record_->end_ns.store(end);
    record_->status.store(std::uncaught_exceptions() > 0 ? trace::LaunchStatus::Failed : trace::LaunchStatus::Done);
  }
}

}  // namespace neuron
