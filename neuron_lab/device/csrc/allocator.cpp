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

#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
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
};

struct Core {
  std::mutex mutex;
  DeviceStats stats;
  std::multimap<size_t, Block*> cached;  // free blocks by size
};

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
    Block* block = acquire(device, nbytes);
    return c10::DataPtr(block->ptr, block, &NeuronAllocator::release_context,
                        c10::Device(kNeuron, device));
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
    }
  }

  void recordStream(const c10::DataPtr& data_ptr, c10::Stream stream) override {
    if (data_ptr.get() == nullptr) return;
    TORCH_CHECK(data_ptr.get_deleter() == &NeuronAllocator::release_context,
                "record_stream: this memory was not allocated by the neuron allocator");
    auto* block = static_cast<Block*>(data_ptr.get_context());
    TORCH_CHECK(stream.device_type() == kNeuron && stream.device_index() == block->device,
                "record_stream: the tensor is on neuron:", int(block->device),
                " but the stream is on ", stream.device());
    // Launches run to completion when issued, so the block is idle whenever it
    // is freed and may be reused at once; the stream is validated all the same.
    stream_stats(stream);
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
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
    std::lock_guard<std::mutex> lock(core.mutex);
    auto& s = core.stats;

    Block* block = nullptr;
    auto it = core.cached.find(size);
    if (it != core.cached.end()) {
      block = it->second;
      core.cached.erase(it);
    } else {
      block = new_segment(core, device, size, nbytes);
    }
    block->requested = nbytes;
    for_stat(s.allocation, size, [](auto& st) { st.increase(1); });
    for_stat(s.active, size, [](auto& st) { st.increase(1); });
    for_stat(s.allocated_bytes, size, [&](auto& st) { st.increase(size); });
    for_stat(s.active_bytes, size, [&](auto& st) { st.increase(size); });
    for_stat(s.requested_bytes, size, [&](auto& st) { st.increase(nbytes); });
    return block;
  }

  Block* new_segment(Core& core, c10::DeviceIndex device, size_t size, size_t nbytes) {
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
    return new Block{ptr, size, nbytes, device};
  }

  // Called with core.mutex held.
  static void release_cached(Core& core) {
    auto& s = core.stats;
    for (auto& [size, block] : core.cached) {
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
    core.cached.emplace(size, block);
  }

  static void release_context(void* context);

  std::array<Core, 64> cores_;
};

// Leaked on purpose: tensors may still be freed while the process exits.
NeuronAllocator* g_allocator = new NeuronAllocator();

void NeuronAllocator::release_context(void* context) { g_allocator->release(static_cast<Block*>(context)); }

}  // namespace

size_t rounded_size(size_t nbytes) { return (nbytes + kGranularity - 1) / kGranularity * kGranularity; }

c10::DeviceAllocator* allocator() { return g_allocator; }

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, g_allocator);

}  // namespace neuron
