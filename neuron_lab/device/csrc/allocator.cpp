// The caching allocator of the emulated NeuronCores.
//
// Device memory is host memory, but it is accounted per core as on real HBM:
// every core has a fixed capacity; a request is rounded up to 512 bytes; freed
// blocks stay cached (reserved) and are reused by requests of the same rounded
// size; when a request does not fit, the cache of that core is released and the
// request retried before torch.OutOfMemoryError is raised. Statistics follow
// CUDA's caching allocator field for field, so torch.accelerator.memory.* and
// torch.neuron.memory_stats() read them unchanged.
#include "runtime.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace neuron {
namespace {

using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;

constexpr size_t kGranularity = 512;
constexpr size_t kSmallBlock = size_t(1) << 20;  // <= 1 MiB counts in the small pool
constexpr size_t kAlignment = 64;

struct Block {
  void* ptr;
  size_t size;       // rounded bytes
  size_t requested;  // bytes asked for
  c10::DeviceIndex device;
  c10::StreamId stream = 0;  // stream current when it was allocated
  Frames frames;             // where it was allocated (memory history only)
};

struct Core {
  std::mutex mutex;
  DeviceStats stats;
  std::multimap<size_t, Block*> cached;  // free blocks by size
  std::unordered_set<Block*> active;     // blocks held by tensors
  std::deque<TraceEntry> trace;          // memory history (when recording)
};

// Memory-history settings, read on every allocation (relaxed atomics).
std::atomic<bool> g_history{false};
std::atomic<bool> g_trace{false};
std::atomic<bool> g_stacks{false};
std::atomic<size_t> g_max_entries{SIZE_MAX};
std::atomic<StackCapturer> g_capturer{nullptr};

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Frames capture_stack() {
  auto capturer = g_capturer.load();
  return (g_history.load() && g_stacks.load() && capturer != nullptr) ? capturer() : nullptr;
}

// Called with core.mutex held.
void log(Core& core, const char* action, const Block* block, int64_t size, Frames frames = nullptr) {
  if (!g_trace.load()) return;
  TraceEntry e;
  e.action = action;
  e.addr = block ? reinterpret_cast<int64_t>(block->ptr) : 0;
  e.size = size;
  e.stream = block ? block->stream : 0;
  e.time_us = now_us();
  e.frames = std::move(frames);
  if (std::string_view(action) == "oom") e.device_free = core_capacity() - core.stats.reserved_bytes[0].current;
  core.trace.push_back(std::move(e));
  while (core.trace.size() > g_max_entries.load()) core.trace.pop_front();
}

std::string format_bytes(int64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t(1) << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(int64_t(1) << 30));
  } else if (bytes >= (int64_t(1) << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(1 << 20));
  } else if (bytes >= 1024) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(bytes));
  }
  return buf;
}

class NeuronAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex device = current_device();
    if (nbytes == 0) return c10::DataPtr(nullptr, c10::Device(kNeuron, device));
    return allocate_on(device, nbytes);
  }

  // Device memory of a given core, whatever the thread's current device.
  c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes) {
    Block* block = acquire(device, nbytes);
    return c10::DataPtr(block->ptr, block, &NeuronAllocator::release_context, c10::Device(kNeuron, device));
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  bool initialized() override { return true; }

  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      auto& core = cores_[d];
      std::lock_guard<std::mutex> lock(core.mutex);
      release_cached(core);
      trace::note_memory(d, core.stats.allocated_bytes[0].current, core.stats.reserved_bytes[0].current);
    }
  }

  void recordStream(const c10::DataPtr& data_ptr, c10::Stream stream) override {
    if (data_ptr.get() == nullptr) return;
    if (is_pending(data_ptr)) {
      TORCH_CHECK(stream.device_type() == kNeuron && stream.device_index() == data_ptr.device().index(),
                  "record_stream: the tensor is on neuron:", int(data_ptr.device().index()),
                  " but the stream is on ", stream.device());
      stream_state(stream);
      return;
    }
    TORCH_CHECK(data_ptr.get_deleter() == &NeuronAllocator::release_context,
                "record_stream: this memory was not allocated by the neuron allocator");
    auto* block = static_cast<Block*>(data_ptr.get_context());
    TORCH_CHECK(stream.device_type() == kNeuron && stream.device_index() == block->device,
                "record_stream: the tensor is on neuron:", int(block->device),
                " but the stream is on ", stream.device());
    // A launch holds the tensors it uses until the device has executed it, so a
    // block is idle whenever it is freed and may be reused at once; the stream
    // is validated all the same.
    stream_state(stream);
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    // Statistics describe executed work: pending launches finish first.
    if (!on_device_thread()) {
      synchronize_device(device, Reason::MemoryStatistics);
      materialize_all_pending(device);
    }
    auto& core = core_for(device);
    std::lock_guard<std::mutex> lock(core.mutex);
    return core.stats;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    auto& core = core_for(device);
    std::lock_guard<std::mutex> lock(core.mutex);
    auto& s = core.stats;
    for (auto* arr : stat_arrays(s)) {
      for (auto& stat : *arr) stat.reset_accumulated();
    }
    s.num_alloc_retries = 0;
    s.num_ooms = 0;
    s.num_device_alloc = 0;
    s.num_device_free = 0;
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    auto& core = core_for(device);
    std::lock_guard<std::mutex> lock(core.mutex);
    for (auto* arr : stat_arrays(core.stats)) {
      for (auto& stat : *arr) stat.reset_peak();
    }
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    auto& core = core_for(device);
    std::lock_guard<std::mutex> lock(core.mutex);
    const auto total = static_cast<size_t>(core_capacity());
    const auto reserved = static_cast<size_t>(core.stats.reserved_bytes[0].current);
    return {total - reserved, total};
  }

 private:
  static std::vector<c10::CachingAllocator::StatArray*> stat_arrays(DeviceStats& s) {
    return {&s.allocation,    &s.segment,      &s.active,         &s.inactive_split,
            &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes,
            &s.requested_bytes};
  }

  Core& core_for(c10::DeviceIndex device) {
    device = resolve_device(device);
    return cores_[device];
  }

  static size_t pool(size_t size) {
    return static_cast<size_t>(size <= kSmallBlock ? StatType::SMALL_POOL : StatType::LARGE_POOL);
  }

  template <typename F>
  static void for_stat(c10::CachingAllocator::StatArray& arr, size_t size, F f) {
    f(arr[static_cast<size_t>(StatType::AGGREGATE)]);
    f(arr[pool(size)]);
  }

  Block* acquire(c10::DeviceIndex device, size_t nbytes) {
    auto& core = core_for(device);
    const size_t size = rounded_size(nbytes);
    // Before the lock: capturing a Python stack takes the GIL.
    Frames frames = capture_stack();
    const c10::StreamId stream = current_stream(device).id();
    std::lock_guard<std::mutex> lock(core.mutex);
    auto& s = core.stats;

    Block* block = nullptr;
    auto it = core.cached.find(size);
    if (it != core.cached.end()) {
      block = it->second;
      core.cached.erase(it);
    } else {
      block = new_segment(core, device, size, nbytes, stream, frames);
    }
    block->requested = nbytes;
    block->stream = stream;
    block->frames = frames;
    core.active.insert(block);
    log(core, "alloc", block, static_cast<int64_t>(size), std::move(frames));
    for_stat(s.allocation, size, [](auto& st) { st.increase(1); });
    for_stat(s.active, size, [](auto& st) { st.increase(1); });
    for_stat(s.allocated_bytes, size, [&](auto& st) { st.increase(size); });
    for_stat(s.active_bytes, size, [&](auto& st) { st.increase(size); });
    for_stat(s.requested_bytes, size, [&](auto& st) { st.increase(nbytes); });
    trace::note_memory(device, s.allocated_bytes[0].current, s.reserved_bytes[0].current);
    return block;
  }

  Block* new_segment(Core& core, c10::DeviceIndex device, size_t size, size_t nbytes, c10::StreamId stream,
                     const Frames& frames) {
    auto& s = core.stats;
    const int64_t capacity = core_capacity();
    if (s.reserved_bytes[0].current + static_cast<int64_t>(size) > capacity && !core.cached.empty()) {
      s.num_alloc_retries += 1;
      release_cached(core);
    }
    void* ptr = nullptr;
    const bool fits = s.reserved_bytes[0].current + static_cast<int64_t>(size) <= capacity;
    if (fits) ptr = std::aligned_alloc(kAlignment, size);
    if (ptr == nullptr) {
      s.num_ooms += 1;
      log(core, "oom", nullptr, static_cast<int64_t>(size), frames);
      const int64_t allocated = s.allocated_bytes[0].current;
      const int64_t reserved = s.reserved_bytes[0].current;
      c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(size), allocated, reserved,
                                       c10::Device(kNeuron, device));
      TORCH_CHECK_WITH(
          OutOfMemoryError, false, "neuron:", int(device),
          fits ? " could not get host memory: " : " out of memory: ", "tried to allocate ",
          format_bytes(static_cast<int64_t>(nbytes)), "; ", format_bytes(reserved), " of ",
          format_bytes(capacity), " in use on this NeuronCore (", format_bytes(allocated),
          " allocated by tensors, ", format_bytes(reserved - allocated),
          " cached by the allocator). ",
          fits ? "The host machine itself ran out of memory; free memory on the host."
               : "Free tensors you no longer need (del them), call torch.neuron.empty_cache(), "
                 "use a smaller batch, or give each core more memory with "
                 "NEURON_LAB_CORE_MEMORY=<size> (e.g. 32GiB) before importing torch.");
    }
    s.num_device_alloc += 1;
    for_stat(s.segment, size, [](auto& st) { st.increase(1); });
    for_stat(s.reserved_bytes, size, [&](auto& st) { st.increase(size); });
    auto* block = new Block{ptr, size, nbytes, device, stream, frames};
    log(core, "segment_alloc", block, static_cast<int64_t>(size), frames);
    return block;
  }

  // Called with core.mutex held.
  static void release_cached(Core& core) {
    auto& s = core.stats;
    for (auto& [size, block] : core.cached) {
      log(core, "segment_free", block, static_cast<int64_t>(size));
      std::free(block->ptr);
      s.num_device_free += 1;
      for_stat(s.segment, size, [](auto& st) { st.decrease(1); });
      for_stat(s.reserved_bytes, size, [&](auto& st) { st.decrease(size); });
      delete block;
    }
    core.cached.clear();
  }

  void release(Block* block) {
    auto& core = cores_[block->device];
    std::lock_guard<std::mutex> lock(core.mutex);
    auto& s = core.stats;
    const size_t size = block->size;
    for_stat(s.allocation, size, [](auto& st) { st.decrease(1); });
    for_stat(s.active, size, [](auto& st) { st.decrease(1); });
    for_stat(s.allocated_bytes, size, [&](auto& st) { st.decrease(size); });
    for_stat(s.active_bytes, size, [&](auto& st) { st.decrease(size); });
    for_stat(s.requested_bytes, size, [&](auto& st) { st.decrease(block->requested); });
    core.active.erase(block);
    // Launches complete when issued, so a freed block is reusable at once.
    log(core, "free_requested", block, static_cast<int64_t>(size));
    log(core, "free_completed", block, static_cast<int64_t>(size));
    block->frames = nullptr;
    core.cached.emplace(size, block);
    trace::note_memory(block->device, s.allocated_bytes[0].current, s.reserved_bytes[0].current);
  }

 public:
  static void release_context(void* context);

  MemorySnapshot snapshot() {
    MemorySnapshot snap;
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      auto& core = cores_[d];
      std::lock_guard<std::mutex> lock(core.mutex);
      auto add = [&](const Block* b, bool active) {
        const auto size = static_cast<int64_t>(b->size);
        SegmentSnapshot seg{d, reinterpret_cast<int64_t>(b->ptr), size, active ? size : 0, active ? size : 0,
                            active ? static_cast<int64_t>(b->requested) : 0, b->stream,
                            b->size <= kSmallBlock ? "small" : "large", {}};
        seg.blocks.push_back({seg.address, size, seg.requested_size, active ? "active_allocated" : "inactive",
                              active ? b->frames : nullptr});
        snap.segments.push_back(std::move(seg));
      };
      for (const Block* b : core.active) add(b, true);
      for (const auto& [size, b] : core.cached) add(b, false);
      snap.device_traces.emplace_back(core.trace.begin(), core.trace.end());
    }
    return snap;
  }

  void clear_history() {
    for (auto& core : cores_) {
      std::lock_guard<std::mutex> lock(core.mutex);
      core.trace.clear();
    }
  }

 private:
  std::array<Core, kMaxCores> cores_;
};

// Leaked on purpose: tensors may still be freed while the process exits.
NeuronAllocator* g_allocator = new NeuronAllocator();

void NeuronAllocator::release_context(void* context) { g_allocator->release(static_cast<Block*>(context)); }

// ---- host allocations that take device memory ----------------------------------------
//
// A kernel that runs on the host (a torch.compile graph, a custom kernel) allocates
// its results with the CPU allocator. While a HostAllocationsOnDevice guard is
// active on a thread, those allocations take memory of a NeuronCore instead, so
// the results become neuron tensors without a copy (adopt_host_storage). The CPU
// allocator is wrapped once, on first use; other threads, and this thread outside
// the guard, allocate exactly as before.
thread_local c10::DeviceIndex tl_host_allocations_device = -1;

// Device blocks handed out as CPU memory, by address: a CPU DataPtr's context must
// be its address (Allocator::raw_allocate asserts it; oneDNN uses it for scratch).
std::mutex g_host_blocks_mutex;
std::unordered_map<void*, Block*>& host_blocks() {
  static auto* blocks = new std::unordered_map<void*, Block*>();
  return *blocks;
}
c10::DeleterFnPtr g_host_raw_deleter = nullptr;

Block* take_host_block(void* ptr) {
  std::lock_guard<std::mutex> lock(g_host_blocks_mutex);
  auto it = host_blocks().find(ptr);
  if (it == host_blocks().end()) return nullptr;
  Block* block = it->second;
  host_blocks().erase(it);
  return block;
}

// Frees CPU memory of either kind: a device block lent to the host, or the host
// allocator's own (raw_deallocate passes both here).
void free_device_or_host(void* ptr) {
  if (Block* block = take_host_block(ptr)) {
    NeuronAllocator::release_context(block);
  } else if (g_host_raw_deleter != nullptr) {
    g_host_raw_deleter(ptr);
  }
}

class HostOrDeviceAllocator final : public c10::Allocator {
 public:
  explicit HostOrDeviceAllocator(c10::Allocator* host) : host_(host) {}

  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex device = tl_host_allocations_device;
    if (device < 0 || nbytes == 0) return host_->allocate(nbytes);
    auto data = g_allocator->allocate_on(device, nbytes);
    auto* block = static_cast<Block*>(data.release_context());
    {
      std::lock_guard<std::mutex> lock(g_host_blocks_mutex);
      host_blocks().emplace(block->ptr, block);
    }
    return c10::DataPtr(block->ptr, block->ptr, &free_device_or_host, c10::Device(c10::kCPU));
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return g_host_raw_deleter != nullptr ? &free_device_or_host : nullptr;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { host_->copy_data(dest, src, count); }

 private:
  c10::Allocator* host_;
};

void install_host_or_device_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Leaked on purpose, like the device allocator: CPU tensors may outlive everything.
    c10::Allocator* host = c10::GetCPUAllocator();
    g_host_raw_deleter = host->raw_deleter();
    static auto* wrapper = new HostOrDeviceAllocator(host);
    // The default priority: a CPU allocator installed later still takes over (host
    // kernels' results are then copied into device memory instead of adopted).
    c10::SetAllocator(c10::DeviceType::CPU, wrapper, /*priority=*/0);
  });
}

}  // namespace

HostAllocationsOnDevice::HostAllocationsOnDevice(c10::DeviceIndex device) : previous_(tl_host_allocations_device) {
  if (device >= 0) {
    check_device_index(device);
    install_host_or_device_allocator();
  }
  tl_host_allocations_device = device;
}

HostAllocationsOnDevice::~HostAllocationsOnDevice() { tl_host_allocations_device = previous_; }

c10::DeviceIndex host_allocations_device() { return tl_host_allocations_device; }

c10::Storage adopt_host_storage(const c10::Storage& host_storage) {
  auto* impl = host_storage.unsafeGetStorageImpl();
  if (impl == nullptr || impl->data_ptr().get_deleter() != &free_device_or_host) return {};
  Block* block = take_host_block(impl->data_ptr().get());
  if (block == nullptr) return {};  // host memory freed through the raw deleter
  const size_t nbytes = impl->nbytes();
  impl->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU))).release_context();  // now the block's owner
  impl->set_nbytes(0);  // the CPU storage keeps no view of memory it no longer owns
  c10::DataPtr data(block->ptr, block, &NeuronAllocator::release_context, c10::Device(kNeuron, block->device));
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                            std::move(data), g_allocator, /*resizable=*/true));
}

void set_stack_capturer(StackCapturer capturer) { g_capturer = capturer; }

bool recording_memory_history() { return g_history.load(std::memory_order_relaxed); }

void record_memory_history(bool enabled, bool trace, bool stacks, size_t max_entries, bool clear) {
  g_max_entries = max_entries;
  g_stacks = enabled && stacks;
  g_trace = enabled && trace;
  g_history = enabled;
  if (clear) g_allocator->clear_history();
}

MemorySnapshot memory_snapshot() {
  // A snapshot describes executed work and the memory the program holds.
  if (!on_device_thread()) {
    synchronize_all(Reason::MemorySnapshot);
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) materialize_all_pending(d);
  }
  return g_allocator->snapshot();
}

size_t rounded_size(size_t nbytes) { return (nbytes + kGranularity - 1) / kGranularity * kGranularity; }

c10::DeviceAllocator* allocator() { return g_allocator; }

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, g_allocator);

}  // namespace neuron
