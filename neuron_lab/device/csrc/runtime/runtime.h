// The emulated NeuronCore runtime: the declarations the device's files share.
//
// The device's native code lives in rooms, one per layer. A room includes its own headers
// and those of the rooms below it, nothing above (test_layers.py checks):
//   runtime/  the device: configuration and guard, streams and events (executor), memory
//             (allocator, segments), generators, hooks, pending storages, and the
//             interceptor a runtime that records ops plugs into
//   tracing/  what the device did: launch records, the event log, reasons, source lines,
//             torch.profiler's view; runtime/ and tracing/ include each other's headers
//   aten/     the ATen glue: kernels, the CPU-kernel fallback, the fast-kernel table;
//             aten/registrations.cpp lists everything registered with the dispatcher
//   python/   the module neuron_lab.device._C and its submodules
// Each section below names the file that defines it.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/Generator.h>
#include <ATen/core/stack.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/util/SmallVector.h>

#include "device/csrc/tracing/trace.h"
#include "op_counters.h"

#include <atomic>
#include <functional>
#include <memory>
#include <unordered_map>
#include <cstdint>
#include <string>
#include <vector>

namespace c10 {
struct Argument;        // an op schema's argument (ATen/core/function_schema.h)
class OperatorHandle;   // ATen/core/dispatch/Dispatcher.h
}  // namespace c10

namespace neuron {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;
// The dispatch key sets of a neuron tensor and of a host kernel, built once at compile
// time (a DispatchKeySet made from a key at run time walks the key's bits).
constexpr c10::DispatchKeySet kNeuronKeys(c10::DispatchKey::PrivateUse1);
constexpr c10::DispatchKeySet kCpuKeys(c10::DispatchKey::CPU);
// The most cores a process can configure (fixed-size per-core tables).
constexpr int kMaxCores = 64;

// ---- configuration (device.cpp) -------------------------------------------
// Set once, from Python, before the first tensor is made. Afterwards fixed.
void configure(int num_cores, int64_t capacity_bytes);
c10::DeviceIndex device_count() noexcept;
int64_t core_capacity() noexcept;

// ---- current device (device.cpp); thread-local as in CUDA ------------------
c10::DeviceIndex current_device();
void set_device(c10::DeviceIndex index);
void check_device_index(c10::DeviceIndex index);
// Resolves -1 to the current device and validates the index.
c10::DeviceIndex resolve_device(c10::DeviceIndex index);

// ---- streams (executor.cpp) ------------------------------------------------
// Stream 0 of each core is its default stream. A stream is an in-order queue of
// launches run by its own device thread; the host enqueues and runs ahead.
// Sequence numbers count launches: the n-th launch of a stream has seq n, and
// the stream has executed it once completed >= n.
struct StreamState;
c10::Stream current_stream(c10::DeviceIndex index);
c10::Stream default_stream(c10::DeviceIndex index);
c10::Stream new_stream(c10::DeviceIndex index, int priority);
c10::Stream exchange_stream(c10::Stream stream);
StreamState& stream_state(c10::Stream stream);
int64_t num_streams(c10::DeviceIndex index);
uint64_t stream_enqueued(const StreamState& s);
uint64_t stream_completed(const StreamState& s);
// Ops run on the calling thread (LaunchScope), counted apart from the two above.
uint64_t stream_ran_inline(const StreamState& s);
c10::Stream stream_of(const StreamState& s);
bool stream_idle(const StreamState& s);
// True when no stream of any core has a launch queued or executing, nor an error
// still to be raised at a wait: a host access then has nothing to wait for.
bool device_quiet();

// One unit of device work. `run` executes on the stream's device thread and may
// throw: the error is kept and raised at the next wait on the stream, and the
// stream skips its later compute launches until then (their inputs may be wrong).
struct Work {
  std::function<void()> run;
  std::function<void()> on_skip;  // called instead of run when the work is skipped
  bool skippable = true;  // false for event markers and cross-stream waits
  int64_t ops = 1;        // ops it runs: a stream holds a bounded number queued
  int64_t result_bytes = 0;  // device memory its results took when it was made: bounded queued too
  bool busy = true;       // counts as device busy time (false for markers and waits)
  trace::LaunchKind kind = trace::LaunchKind::Graph;  // graph or single op (for the metrics report)
  trace::LaunchRecordPtr record;  // set while a profiler runs (neuron_lab's, or torch.profiler's device lanes)
  int intra_op_threads = 0;  // the enqueuing thread's torch.get_num_threads(): kernels use as many
};
// While alive, kernels called on this thread use one thread: ATen's and MKL's
// parallel loops inside them run inline. Sets OpenMP's and MKL's counts of this
// thread only (at::set_num_threads would also set the count that threads started
// later inherit) and restores them.
class SingleThreadedKernels {
 public:
  SingleThreadedKernels();
  ~SingleThreadedKernels();
  SingleThreadedKernels(const SingleThreadedKernels&) = delete;
  SingleThreadedKernels& operator=(const SingleThreadedKernels&) = delete;

 private:
  int previous_;          // OpenMP's
  int previous_mkl_ = 0;  // MKL's
};
// Where launches run. Auto (the default): on the host thread that launches them where their
// kernels' threads (torch.get_num_threads()) take every CPU the process may use, else on the
// stream's device thread. DeviceThread: always the device thread, which overlaps them with the
// host's recording. Host: always the launching host thread.
enum class LaunchRunner : uint8_t { Auto, DeviceThread, Host };
LaunchRunner launch_runner();
void set_launch_runner(LaunchRunner runner);
bool host_runs_launches(int intra_op_threads);
// Enqueues on a stream and returns the launch's sequence number.
// inline_if_idle: a stream with nothing queued runs the work at once, on the
// caller's thread (event markers: an idle stream's event is complete at once).
uint64_t enqueue(StreamState& s, Work work, bool inline_if_idle = false);
// Starts the device thread of a core's default stream now, not at its first launch: called
// at the device's first use, so that the thread's start and per-thread set-up (ATen's
// OpenMP and MKL counts, the fresh thread state hosts borrow) overlap the host's work
// instead of delaying the first launch.
void start_device_thread(c10::DeviceIndex device);
// While alive on a host thread that is about to wait for what it enqueues (a host read,
// a synchronize), launches enqueued on one stream do not wake that stream's device
// thread: the host's wait runs them itself (wait_for), and a device thread woken for
// them would only race it for the work, two thread hand-offs per wait when it wins.
// Whatever the host left queued is woken for when the scope ends. A second stream
// enqueued on in the scope (another device's buffer flushed by the same read) wakes
// both at once: the host runs one stream's work, and the other's should not idle
// meanwhile. A full queue wakes its stream too (back-pressure waits for the device thread).
class HostRunsWhatItWaitsFor {
 public:
  HostRunsWhatItWaitsFor();
  ~HostRunsWhatItWaitsFor();
  HostRunsWhatItWaitsFor(const HostRunsWhatItWaitsFor&) = delete;
  HostRunsWhatItWaitsFor& operator=(const HostRunsWhatItWaitsFor&) = delete;

 private:
  bool counted_;  // made on a host thread (a device thread's scope does nothing)
};
// Waits (releasing the GIL) until the stream has executed launch `seq`, then
// raises the stream's pending error, if any, naming the launch that failed.
void wait_for(StreamState& s, uint64_t seq);
// The host waits for a stream, a device or every device, for `reason` (`what`: the op
// or kernel that needs it, if any); the wait is logged and the runtime flushes first.
void synchronize_stream(c10::Stream stream, Reason reason = Reason::Synchronize);
void synchronize_device(c10::DeviceIndex index, Reason reason = Reason::Synchronize, std::string_view what = {});
void synchronize_all(Reason reason);
// Launches what every core has buffered and waits until every stream has run it, leaving
// any error on its stream for the user's next wait (a profiler finishing its region).
void finish_all_work(Reason reason);
// True on a stream's device thread (work must not be recorded from there).
bool on_device_thread();
// A launch that a device thread ran is dropped by a host thread, not by the device thread:
// dropping it drops the tensors it held, and where C++ held the last reference but one to
// a tensor Python holds, that releases its Python object, which takes the GIL (the host's
// Python holds it while it runs); and the host allocated its records, whose frees would
// take the host's malloc arena lock: a device thread must never wait for either. The
// device thread leaves the launch here; the next host thread that starts
// an op or finishes a wait drops it (release_finished_work), so memory statistics read
// after a wait count its frees.
void release_finished_work();
// Raises a clear error in a child process forked after the runtime started (its threads
// or its memory existed at the fork): every entry point that touches device memory or
// device state calls it (streams, launches, allocations, sharing).
void check_not_forked();
bool in_bad_fork();
// The runtime started (device threads, device memory): a child forked from now on
// cannot use the device.
void note_device_started();

// A launch that runs inline on the calling thread (native kernels that need the
// data now): every pending launch of the device finishes first, then the inline
// work is counted as one launch of the current stream.
class LaunchScope {
 public:
  // synced: the caller already waited for what the work touches (interceptor().before_host_access).
  // name: the kernel, for the profiler.
  LaunchScope(c10::DeviceIndex device, const char* name, bool synced = false);
  ~LaunchScope();
  LaunchScope(const LaunchScope&) = delete;
  LaunchScope& operator=(const LaunchScope&) = delete;

 private:
  StreamState* stream_;
  c10::DeviceIndex device_;
  int64_t start_ns_;
  trace::LaunchRecordPtr record_;
};

// What a runtime that records ops does at the device's boundaries (flush a stream
// or a device, before a host access, ...) is the interceptor's: interceptor.h.

// ---- allocator (allocator.cpp) ---------------------------------------------
c10::DeviceAllocator* allocator();
// Bytes a request of `nbytes` occupies (rounded up to the block granularity).
size_t rounded_size(size_t nbytes);

// Memory history, in the shape of torch.cuda.memory._snapshot() so that
// PyTorch's memory visualizer (torch.cuda._memory_viz) renders it.
struct Frame {
  std::string filename;
  int line;
  std::string name;
};
using Frames = std::shared_ptr<const std::vector<Frame>>;
// Captures the caller's Python stack; installed by the bindings (no Python here).
using StackCapturer = Frames (*)();
void set_stack_capturer(StackCapturer capturer);

struct TraceEntry {
  std::string action;  // alloc, free_requested, free_completed, segment_alloc, segment_free, oom
  int64_t addr = 0;
  int64_t size = 0;
  int64_t stream = 0;
  int64_t time_us = 0;
  int64_t device_free = 0;  // oom only
  Frames frames;
};
struct BlockSnapshot {
  int64_t address, size, requested_size;
  std::string state;  // active_allocated or inactive
  Frames frames;
};
struct SegmentSnapshot {
  int device;
  int64_t address, total_size, allocated_size, active_size, requested_size, stream;
  std::string segment_type;  // small or large
  std::vector<BlockSnapshot> blocks;
};
struct MemorySnapshot {
  std::vector<SegmentSnapshot> segments;
  std::vector<std::vector<TraceEntry>> device_traces;  // one list per core
};
// enabled: block stacks are kept; trace: every allocator action is logged too.
void record_memory_history(bool enabled, bool trace, bool stacks, size_t max_entries, bool clear);
MemorySnapshot memory_snapshot();
// While history is recorded, tensors get memory when created (not when their
// launch is flushed), so that each block names the line that made it.
bool recording_memory_history();

// ---- pending memory (pending.cpp, allocator.cpp) ------------------------------
// A recorded op's result is pending until a launch computes it. It gets its block of
// device memory when it is made (its address is its own, and stays), in a DataPtr that
// says it is pending; the block counts in the statistics once the storage outlives its
// launch (materialize). A pending result that nothing outside its launch holds gives the
// block back uncounted when the launch is built, and its fused graph computes it in
// scratch instead.
c10::DataPtr allocate_pending(c10::DeviceIndex device, size_t nbytes);  // may raise OutOfMemoryError
// The same, or an empty DataPtr where the core is out of memory: nothing raised, logged or
// counted (the caller frees memory and asks again; only a second failure is an OOM).
c10::DataPtr try_allocate_pending(c10::DeviceIndex device, size_t nbytes);
bool is_pending(const c10::DataPtr& data_ptr);
bool is_pending(const c10::Storage& storage);
// The pending DataPtr becomes an ordinary one, counted (false: it was not pending).
bool mark_computed(c10::DataPtr& data_ptr);
// The storage's memory stays its own from now on (it outlives its launch); no-op otherwise.
void materialize(const c10::Storage& storage);
// Materializes every pending storage of a core that is still alive: memory statistics
// then count what the program holds (call after a flush).
void materialize_all_pending(c10::DeviceIndex device);
// A neuron tensor whose storage is pending. Out of memory, it first waits for the launches
// that hold blocks of the core's dead intermediates, then raises.
at::Tensor empty_pending(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dtype,
                         c10::DeviceIndex device);

// ---- random numbers (generator.cpp) ----------------------------------------
const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);
// The CPU generator one random op draws from (CPU kernels take it). A neuron generator
// in its CPU form hands out its CPU twin (the CPU's numbers, in order); one in offset
// form a fresh generator keyed by (seed, offset), advancing its offset by ``span``
// numbers (rounded up to 4) for the next op. ``draw_span`` is an op's span: the most
// elements any of its tensor arguments has, or its ``size`` (factories; ``n``: randperm).
at::Generator generator_for_draw(const at::Generator& neuron_generator, int64_t span);
int64_t draw_span(const std::vector<c10::Argument>& schema, const c10::IValue* args, size_t n);

// ---- tensors (fallback.cpp) ------------------------------------------------
// A CPU tensor viewing the same host memory as a neuron tensor (no copy).
at::Tensor host_alias(const at::Tensor& neuron_tensor);
// Makes `alias`, a host alias nothing else holds, an alias of `neuron_tensor` instead (its
// bytes, dtype, shape and strides) without allocating; false, and nothing changed, where
// something else could see the change.
// `inference_mode`: c10::InferenceMode::is_enabled(), read once by the caller for a whole call.
bool realias(at::Tensor& alias, const at::Tensor& neuron_tensor, bool inference_mode);
// host_alias from this thread's cache of recent aliases: the same alias again while it still
// describes the tensor exactly and nothing else holds it (an optimizer's parameters, a
// decoding loop's weights), else a recycled or new one. Hold it only for one call.
at::Tensor cached_host_alias(const at::Tensor& neuron_tensor, bool inference_mode);
// host_alias for neuron tensors; CPU and undefined tensors pass through as they are.
at::Tensor host_view(const at::Tensor& t);
// The same, over a given host storage: aliases of one neuron storage must share
// one host storage for CPU kernels to detect overlap between them.
at::Tensor host_alias_sharing(const at::Tensor& neuron_tensor, c10::Storage host_storage);
// A new neuron tensor on `device` holding a copy of a CPU tensor.
at::Tensor to_device(const at::Tensor& cpu_tensor, c10::DeviceIndex device);
// A neuron view of `neuron_base`'s storage shaped as `host_view`, a CPU kernel's view
// of the base's host alias.
at::Tensor neuron_view_of(const at::Tensor& neuron_base, const at::Tensor& host_view);
// After a kernel wrote through `host`, the host alias of the neuron tensor `original`:
// a resize or restride the kernel made to the alias is made to `original` too.
void write_back(const at::Tensor& original, const at::Tensor& host);

// ---- running an op on the host (host_kernel_table.cpp) -------------------------
// Runs `op` on the host tensors of a boxed stack: ATen's CPU kernel, or a fast host kernel
// from the table with the same results bit for bit where one takes the call.
void run_host_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// ---- host kernels that allocate device memory (allocator.cpp) -----------------
// While alive, CPU tensors allocated on this thread take memory of NeuronCore
// `device` (a host kernel's results), so that they can be adopted without a copy;
// device -1 turns that off for the scope.
class HostAllocationsOnDevice {
 public:
  // Who may free what the scope allocates before the scope ends: any thread (Shared, the
  // default: Python or a compiled graph runs inside), or only this one (ThreadPrivate: one
  // CPU kernel runs inside), which keeps the bookkeeping off the shared lock.
  enum class Lending { Shared, ThreadPrivate };
  // min_bytes: smaller allocations stay host memory (a result that small is copied faster
  // than device memory is lent, tracked and adopted; a kernel's small scratch is malloc's).
  explicit HostAllocationsOnDevice(c10::DeviceIndex device, Lending lending = Lending::Shared,
                                   size_t min_bytes = 1);
  ~HostAllocationsOnDevice();
  HostAllocationsOnDevice(const HostAllocationsOnDevice&) = delete;
  HostAllocationsOnDevice& operator=(const HostAllocationsOnDevice&) = delete;

 private:
  c10::DeviceIndex previous_;
  bool previous_private_;
  size_t previous_min_bytes_;
};
// The core whose memory this thread's CPU allocations take now (-1: none): inside a
// host kernel's launch, its CPU tensors are device memory the launch already prepared.
c10::DeviceIndex host_allocations_device();

// The neuron storage of a CPU storage allocated under HostAllocationsOnDevice over memory
// of `device`: a new one that owns the memory, while the CPU storage keeps viewing it
// (holding the neuron storage, so that CPU tensors still over it stay valid); the same
// one again for a CPU storage adopted before. An undefined Storage, with nothing
// changed, for memory of another core or memory the host allocated.
c10::Storage adopt_host_storage(const c10::Storage& host_storage, c10::DeviceIndex device);
// The same without a new storage: a CPU storage only its tensor holds, over device memory
// of `device`, becomes that memory's neuron storage itself (its DataPtr and allocator are
// the device's from then on). False, and nothing changed, where it cannot.
bool adopt_host_storage_in_place(c10::StorageImpl& host_storage, c10::DeviceIndex device);
// Turns a host kernel's results into neuron tensors without copies where it can:
// a result over device memory (allocated under HostAllocationsOnDevice) keeps it,
// views of one result stay views of one neuron storage, and a result that views an
// input's host alias becomes a view of that neuron input. Anything else is copied.
class HostResults {
 public:
  explicit HostResults(c10::DeviceIndex device) : device_(device) {}
  // `host_alias` (a CPU tensor) aliases the neuron tensor `input`.
  void add_input(const at::Tensor& host_alias, const at::Tensor& input);
  at::Tensor adopt(const at::Tensor& cpu_tensor);
  // The same for a result only the caller holds: a plain dense CPU tensor becomes the
  // neuron tensor itself (its TensorImpl takes the adopted storage and the neuron keys)
  // instead of lending its shape to a new TensorImpl.
  at::Tensor adopt(at::Tensor&& cpu_tensor);

 private:
  // The neuron input whose memory a result views, or null.
  const at::Tensor* input_viewed_by(const at::Tensor& cpu_tensor) const;
  // The neuron storage of a result's memory, adopted once per host storage; null when the
  // memory is not device memory of this core (the result must be copied).
  const c10::Storage* adopted_storage(const at::Tensor& cpu_tensor);
  c10::DeviceIndex device_;
  // A call has a handful of inputs and results: a linear search beats hashing, and the
  // inline capacity allocates nothing.
  c10::SmallVector<std::pair<const c10::StorageImpl*, at::Tensor>, 4> inputs_;
  c10::SmallVector<std::pair<const c10::StorageImpl*, c10::Storage>, 2> adopted_;
};

// The device's op and transfer counters: op_counters.h.

}  // namespace neuron

namespace neuron {
// Grows or shrinks a storage in device memory, keeping its leading bytes (kernels.cpp).
void resize_storage_bytes(const c10::Storage& storage, size_t new_size);
}  // namespace neuron

namespace neuron {
// Runs one aten op on the CPU kernel over the same memory (fallback.cpp).
void neuron_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// ---- deterministic mode's fill of new memory (uninitialized_fill.cpp) --------
// Deterministic algorithms with torch.utils.deterministic.fill_uninitialized_memory.
bool fills_uninitialized_memory();
// A new empty tensor, filled as the CPU's empty fills it.
at::Tensor filled_if_deterministic(at::Tensor t);
// After resize_ grew t's storage from old_storage_nbytes: fills the new bytes.
void fill_grown_if_deterministic(const at::Tensor& t, int64_t old_storage_nbytes);
}  // namespace neuron
