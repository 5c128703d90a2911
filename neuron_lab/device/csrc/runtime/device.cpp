// Configuration, current device, events and the device guard: what
// c10::DeviceGuard, torch.Stream and torch.Event call. Streams themselves (the
// queues and device threads) live in executor.cpp.
#include "interceptor.h"
#include "runtime.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <memory>

namespace neuron {
namespace {


std::atomic<int> g_num_cores{2};
std::atomic<int64_t> g_capacity{int64_t(16) << 30};

thread_local c10::DeviceIndex tl_device = 0;
// Current stream id per core, per thread (as CUDA's current stream).
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

// ---- events -------------------------------------------------------------------

namespace {

// An event marks a point in a stream: a marker launch that, when the device
// thread reaches it, stamps the time and counts as the event's completion.
struct Event {
  struct Mark {
    std::atomic<bool> reached{false};
    int64_t time_ns = 0;
  };
  c10::DeviceIndex device = -1;
  StreamState* stream = nullptr;
  uint64_t seq = 0;  // the marker launch
  bool timing = false;
  std::shared_ptr<Mark> mark;

  bool recorded() const { return stream != nullptr; }
  bool completed() const { return !recorded() || stream_completed(*stream) >= seq; }
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
    interceptor().flush_stream(stream, Reason::StreamQuery);
    return stream_idle(stream_state(stream));
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
    // The event covers every op recorded on the stream so far.
    interceptor().flush_stream(stream, Reason::EventRecord);
    auto& s = stream_state(stream);
    auto mark = std::make_shared<Event::Mark>();
    Work marker;
    marker.skippable = false;
    marker.busy = false;
    marker.record = trace::new_launch(trace::LaunchKind::Event, "event record", stream.device_index(), stream.id());
    marker.run = [mark] {
      mark->time_ns = trace::now_ns();
      mark->reached.store(true, std::memory_order_release);
    };
    ev->seq = enqueue(s, std::move(marker), /*inline_if_idle=*/true);
    ev->stream = &s;
    ev->mark = std::move(mark);
  }

  void block(void* event, const c10::Stream& stream) const override {
    auto* ev = static_cast<Event*>(event);
    if (ev == nullptr || !ev->recorded()) return;  // CUDA semantics: no-op
    auto& waiting = stream_state(stream);
    if (&waiting == ev->stream) return;  // a stream is ordered with itself
    if (ev->completed()) return;         // nothing left to wait for
    // Ops recorded on the waiting stream before the wait may run before it.
    interceptor().flush_stream(stream, Reason::StreamWait);
    Work wait;
    wait.skippable = false;
    wait.busy = false;
    wait.record = trace::new_launch(trace::LaunchKind::Wait, "stream wait", stream.device_index(), stream.id());
    StreamState* source = ev->stream;
    const uint64_t seq = ev->seq;
    wait.run = [source, seq] { wait_for(*source, seq); };
    enqueue(waiting, std::move(wait));
  }

  bool queryEvent(void* event) const override {
    auto* ev = static_cast<Event*>(event);
    return ev == nullptr || ev->completed();
  }

  void synchronizeEvent(void* event) const override {
    auto* ev = static_cast<Event*>(event);
    if (ev == nullptr || !ev->recorded()) return;
    trace::SyncScope scope(Reason::EventSynchronize, {}, ev->device);
    wait_for(*ev->stream, ev->seq);
  }

  void destroyEvent(void* event, c10::DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<Event*>(event);
  }

  double elapsedTime(void* start, void* end, c10::DeviceIndex /*device_index*/) const override {
    auto* a = static_cast<Event*>(start);
    auto* b = static_cast<Event*>(end);
    TORCH_CHECK(a != nullptr && b != nullptr && a->recorded() && b->recorded(),
                "neuron: both events must be recorded before calling elapsed_time(); "
                "call event.record() on each first");
    TORCH_CHECK(a->timing && b->timing,
                "neuron: both events must be created with enable_timing=True to measure "
                "elapsed time, e.g. torch.neuron.Event(enable_timing=True)");
    // Both events must have been reached by the device (CUDA raises instead).
    wait_for(*a->stream, a->seq);
    wait_for(*b->stream, b->seq);
    return static_cast<double>(b->mark->time_ns - a->mark->time_ns) / 1e6;
  }

  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    allocator()->recordStream(data_ptr, stream);
  }
};

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

}  // namespace neuron
