// Configuration, current device, streams, events and the device guard.
//
// Execution is synchronous in this layer: a launch runs to completion on the
// thread that issues it, so a stream holds no queued work, only launches that
// other threads are running at that moment. The stream and event bookkeeping
// (launch counters, event targets, timestamps) is nevertheless the real one: an
// event completes when its stream has completed the launches enqueued before it
// was recorded, and synchronize/wait calls wait for exactly those.
#include "runtime.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <array>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

namespace neuron {
namespace {

constexpr int kMaxCores = 64;

std::atomic<int> g_num_cores{2};
std::atomic<int64_t> g_capacity{int64_t(16) << 30};

thread_local c10::DeviceIndex tl_device = 0;
// Current stream id per core, per thread (as CUDA's current stream).
thread_local std::array<c10::StreamId, kMaxCores> tl_stream{};

struct StreamRegistry {
  std::mutex mutex;
  std::deque<StreamStats> streams;  // index == stream id; deque keeps addresses stable
};
std::array<StreamRegistry, kMaxCores> g_streams;

StreamRegistry& registry(c10::DeviceIndex index) {
  check_device_index(index);
  return g_streams[index];
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void configure(int num_cores, int64_t capacity_bytes) {
  TORCH_CHECK(num_cores >= 1 && num_cores <= kMaxCores,
              "neuron: the number of NeuronCores must be between 1 and ", kMaxCores,
              ", got ", num_cores, " (set NEURON_LAB_NUM_CORES)");
  TORCH_CHECK(capacity_bytes > 0, "neuron: the memory per NeuronCore must be positive, got ",
              capacity_bytes, " bytes (set NEURON_LAB_CORE_MEMORY)");
  g_num_cores = num_cores;
  g_capacity = capacity_bytes;
}

c10::DeviceIndex device_count() noexcept { return static_cast<c10::DeviceIndex>(g_num_cores.load()); }
int64_t core_capacity() noexcept { return g_capacity.load(); }

void check_device_index(c10::DeviceIndex index) {
  TORCH_CHECK_INDEX(index >= 0 && index < device_count(), "neuron:", int(index),
                    " does not exist: this machine emulates ", int(device_count()),
                    " NeuronCore(s), neuron:0 to neuron:", int(device_count()) - 1,
                    ". Set NEURON_LAB_NUM_CORES before importing torch for more.");
}

c10::DeviceIndex resolve_device(c10::DeviceIndex index) {
  if (index < 0) return current_device();
  check_device_index(index);
  return index;
}

c10::DeviceIndex current_device() { return tl_device; }

void set_device(c10::DeviceIndex index) {
  check_device_index(index);
  tl_device = index;
}

// ---- streams ----------------------------------------------------------------

static c10::Stream make_stream(c10::DeviceIndex index, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, index), id);
}

static void ensure_default_stream(StreamRegistry& reg) {
  // Called with reg.mutex held.
  if (reg.streams.empty()) reg.streams.emplace_back();
}

c10::Stream default_stream(c10::DeviceIndex index) {
  index = resolve_device(index);
  auto& reg = registry(index);
  std::lock_guard<std::mutex> lock(reg.mutex);
  ensure_default_stream(reg);
  return make_stream(index, 0);
}

c10::Stream current_stream(c10::DeviceIndex index) {
  index = resolve_device(index);
  default_stream(index);
  return make_stream(index, tl_stream[index]);
}

c10::Stream new_stream(c10::DeviceIndex index, int /*priority*/) {
  index = resolve_device(index);
  auto& reg = registry(index);
  std::lock_guard<std::mutex> lock(reg.mutex);
  ensure_default_stream(reg);
  reg.streams.emplace_back();
  return make_stream(index, static_cast<c10::StreamId>(reg.streams.size() - 1));
}

StreamStats& stream_stats(c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == kNeuron, "expected a neuron stream, got a stream on ",
              stream.device());
  auto& reg = registry(stream.device_index());
  std::lock_guard<std::mutex> lock(reg.mutex);
  ensure_default_stream(reg);
  auto id = stream.id();
  TORCH_CHECK(id >= 0 && static_cast<size_t>(id) < reg.streams.size(), "neuron: unknown stream id ",
              id, " on ", stream.device(), "; streams come from torch.neuron.Stream()");
  return reg.streams[static_cast<size_t>(id)];
}

int64_t num_streams(c10::DeviceIndex index) {
  auto& reg = registry(resolve_device(index));
  std::lock_guard<std::mutex> lock(reg.mutex);
  ensure_default_stream(reg);
  return static_cast<int64_t>(reg.streams.size());
}

c10::Stream exchange_stream(c10::Stream stream) {
  stream_stats(stream);  // validates
  auto index = stream.device_index();
  auto previous = current_stream(index);
  tl_stream[index] = stream.id();
  return previous;
}

// Waits until the stream has completed every launch enqueued before the call.
// Launches run on the threads that issue them, so a wait is only ever for a
// launch another thread is still running.
static void wait_for(const StreamStats& stats, uint64_t target) {
  while (stats.completed.load(std::memory_order_acquire) < target) std::this_thread::yield();
}

void synchronize_stream(c10::Stream stream) {
  auto& stats = stream_stats(stream);
  wait_for(stats, stats.enqueued.load(std::memory_order_acquire));
}

void synchronize_device(c10::DeviceIndex index) {
  index = resolve_device(index);
  for (int64_t id = 0; id < num_streams(index); ++id) synchronize_stream(make_stream(index, id));
}

LaunchScope::LaunchScope(c10::DeviceIndex device) : stats_(&stream_stats(current_stream(device))) {
  stats_->enqueued.fetch_add(1, std::memory_order_relaxed);
}

LaunchScope::~LaunchScope() { stats_->completed.fetch_add(1, std::memory_order_release); }

// ---- events -------------------------------------------------------------------

namespace {

struct Event {
  c10::DeviceIndex device = -1;
  c10::Stream stream = c10::Stream(c10::Stream::DEFAULT, c10::Device(kNeuron, 0));
  uint64_t target = 0;  // launches of `stream` that must complete
  bool recorded = false;
  bool timing = false;
  int64_t time_ns = 0;

  bool completed() const { return !recorded || stream_stats(stream).completed.load() >= target; }
};

// ---- the device guard: what c10::DeviceGuard, torch.Stream and torch.Event call

struct NeuronGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNeuron; }

  c10::Device exchangeDevice(c10::Device device) const override {
    auto previous = getDevice();
    if (device.index() != previous.index()) set_device(device.index());
    return previous;
  }
  c10::Device getDevice() const override { return c10::Device(kNeuron, current_device()); }
  void setDevice(c10::Device device) const override { set_device(device.index()); }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.index() >= 0 && device.index() < device_count()) tl_device = device.index();
  }

  c10::Stream getStream(c10::Device device) const override { return current_stream(device.index()); }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return default_stream(device.index());
  }
  c10::Stream getNewStream(c10::Device device, int priority) const override {
    return new_stream(device.index(), priority);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool /*high_priority*/) const override {
    return new_stream(device.index(), 0);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override { return exchange_stream(stream); }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }

  bool queryStream(const c10::Stream& stream) const override {
    auto& stats = stream_stats(stream);
    return stats.completed.load() >= stats.enqueued.load();
  }
  void synchronizeStream(const c10::Stream& stream) const override { synchronize_stream(stream); }
  void synchronizeDevice(c10::DeviceIndex index) const override { synchronize_device(index); }

  void record(void** event, const c10::Stream& stream, c10::DeviceIndex device_index,
              c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
                "neuron: event is on neuron:", int(device_index), " but the stream is on ",
                stream.device(), "; record an event on a stream of its own device");
    auto* ev = static_cast<Event*>(*event);
    if (ev == nullptr) {
      ev = new Event();
      ev->device = stream.device_index();
      ev->timing = (flag == c10::EventFlag::BACKEND_DEFAULT);
      *event = ev;
    }
    auto& stats = stream_stats(stream);
    ev->stream = stream;
    ev->target = stats.enqueued.load(std::memory_order_acquire);
    ev->recorded = true;
    wait_for(stats, ev->target);  // the event's work ends now (or when another thread's launch does)
    ev->time_ns = now_ns();
  }

  void block(void* event, const c10::Stream& stream) const override {
    auto* ev = static_cast<Event*>(event);
    if (ev == nullptr || !ev->recorded) return;  // CUDA semantics: no-op
    stream_stats(stream);  // validates the waiting stream
    // Launches run when issued: the waiting stream's next launch may start once
    // the event's work is done.
    wait_for(stream_stats(ev->stream), ev->target);
  }

  bool queryEvent(void* event) const override {
    auto* ev = static_cast<Event*>(event);
    return ev == nullptr || ev->completed();
  }

  void synchronizeEvent(void* event) const override {
    auto* ev = static_cast<Event*>(event);
    if (ev != nullptr && ev->recorded) wait_for(stream_stats(ev->stream), ev->target);
  }

  void destroyEvent(void* event, c10::DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<Event*>(event);
  }

  double elapsedTime(void* start, void* end, c10::DeviceIndex /*device_index*/) const override {
    auto* a = static_cast<Event*>(start);
    auto* b = static_cast<Event*>(end);
    TORCH_CHECK(a != nullptr && b != nullptr && a->recorded && b->recorded,
                "neuron: both events must be recorded before calling elapsed_time(); "
                "call event.record() on each first");
    TORCH_CHECK(a->timing && b->timing,
                "neuron: both events must be created with enable_timing=True to measure "
                "elapsed time, e.g. torch.neuron.Event(enable_timing=True)");
    return static_cast<double>(b->time_ns - a->time_ns) / 1e6;
  }

  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    allocator()->recordStream(data_ptr, stream);
  }
};

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

}  // namespace neuron
