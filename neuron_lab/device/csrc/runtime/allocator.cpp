// The caching allocator of the emulated NeuronCores.
//
// Device memory is host memory, but it is accounted per core as on real HBM, and
// managed as CUDA's caching allocator manages it: every core has a fixed capacity;
// a request is rounded up to 512 bytes and served from a segment (2 MiB for
// requests up to 1 MiB, 20 MiB up to 10 MiB, the request rounded up to 2 MiB
// above). A segment is split into blocks; the smallest free block that fits is
// taken (best fit; of equal fits, the one freed last) and split when enough
// remains; a freed block merges with its free neighbours, so a tensor that grows
// a little every step (a KV cache) reuses the memory its predecessors freed
// instead of touching new pages. One exception to merging at once: a freed block of
// up to 64 KiB waits, unmerged, in a bin of its exact size (like glibc's tcache), for
// the next request of that size: a decode step frees and asks for the same few small
// sizes op after op, and a bin serves them without the free-block tree. Bins are
// emptied (their blocks merged as any freed block) before a new segment would be
// reserved, before statistics or a snapshot are read, and before empty_cache(), so no
// memory is reserved and no figure differs because of them. Free blocks stay cached (reserved); whole free
// segments go back to the host on empty_cache() or when a request does not fit,
// which is retried once before
// torch.OutOfMemoryError is raised. Statistics follow CUDA's caching allocator
// field for field, so torch.accelerator.memory.* and torch.neuron.memory_stats()
// read them unchanged.
#include "interceptor.h"
#include "runtime.h"
#include "segment_memory.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace neuron {
namespace {

using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;

constexpr size_t kGranularity = 512;
constexpr size_t kSmallBlock = size_t(1) << 20;     // requests up to 1 MiB use the small pool
constexpr size_t kSmallSegment = size_t(2) << 20;   // segment of the small pool
constexpr size_t kMediumRequest = size_t(10) << 20;  // large requests below this share a segment
constexpr size_t kMediumSegment = size_t(20) << 20;  // of this size
constexpr size_t kLargeRounding = size_t(2) << 20;   // larger ones get their own, rounded to this

struct Block;

struct Segment {
  void* ptr;
  size_t size;
  bool small;  // which pool its blocks belong to
  c10::StreamId stream;
  Block* first = nullptr;  // the block at ptr
};

// A piece of a segment, allocated to a tensor or free. The blocks of a segment form
// a list in address order; a free block never has a free neighbour (they merge), but for
// blocks waiting in a quick bin (QuickBins).
struct Block {
  void* ptr;
  size_t size;            // bytes, a multiple of 512
  size_t requested = 0;   // bytes asked for (allocated blocks)
  c10::DeviceIndex device;
  Segment* segment;
  bool allocated = false;
  // Allocated and counted in the statistics. A pending result's block (allocate_pending)
  // is allocated, its address the tensor's, but counted only once the storage outlives its
  // launch (count_computed): a dead intermediate never counts, as before it had any block.
  bool counted = false;
  bool binned = false;       // free, waiting unmerged in a quick bin (QuickBins)
  c10::StreamId stream = 0;  // stream current when it was allocated
  Frames frames;             // where it was allocated (memory history only)
  Block* prev = nullptr;
  Block* next = nullptr;
  uint64_t freed_at = 0;  // when it last became free (free blocks only): the pool's clock

  bool is_split() const { return prev != nullptr || next != nullptr; }
};

// Free blocks, smallest first, then the most recently freed: lower_bound finds the best
// fit, and of equal fits the one freed last, whose bytes are likeliest still in the CPU's
// caches (glibc's malloc reuses a freed chunk the same way; taking the lowest address
// instead made a decoding loop's small ops read and write cold memory).
struct BySizeThenRecency {
  bool operator()(const Block* a, const Block* b) const {
    if (a->size != b->size) return a->size < b->size;
    if (a->freed_at != b->freed_at) return a->freed_at > b->freed_at;
    return std::less<void*>()(a->ptr, b->ptr);
  }
};
using FreeBlocks = std::set<Block*, BySizeThenRecency>;

// Freed small blocks by exact size, most recent last, held back from merging until a
// request of their size takes them or the bins are emptied (see the top of the file).
// At most kDepth blocks a size and kMaxBytes a block: under 17 MiB held in the worst case,
// and never any new memory reserved for it.
struct QuickBins {
  static constexpr size_t kMaxBytes = size_t(64) << 10;
  static constexpr size_t kSizes = kMaxBytes / kGranularity;
  static constexpr size_t kDepth = 4;
  std::array<std::array<Block*, kDepth>, kSizes> blocks{};
  std::array<uint8_t, kSizes> count{};
  size_t held = 0;

  static size_t bin_of(size_t size) { return size / kGranularity - 1; }  // size: a multiple of 512
  bool push(Block* block) {
    if (block->size > kMaxBytes || !block->segment->small) return false;
    const size_t bin = bin_of(block->size);
    if (count[bin] == kDepth) return false;
    blocks[bin][count[bin]++] = block;
    block->binned = true;
    ++held;
    return true;
  }
  Block* pop(size_t size) { return held == 0 || size > kMaxBytes ? nullptr : pop_from(bin_of(size)); }
  Block* pop_from(size_t bin) {
    if (count[bin] == 0) return nullptr;
    Block* block = blocks[bin][--count[bin]];
    block->binned = false;
    --held;
    return block;
  }
};

struct Core {
  std::mutex mutex;
  DeviceStats stats;
  FreeBlocks free_small, free_large;
  QuickBins quick;
  std::map<void*, Segment*> segments;  // by address, for snapshots
  std::deque<TraceEntry> trace;        // memory history (when recording)

  ~Core() {
    for (Block* b : spare_blocks) delete b;
  }
  FreeBlocks& free_blocks(bool small) { return small ? free_small : free_large; }

  // The free sets' nodes and the Block objects of blocks merged away are kept for the next
  // free and split: a small op's alloc and free mallocs and frees neither a set node nor
  // a Block.
  void add_free(Block* block) {
    block->freed_at = ++free_clock;
    auto& set = free_blocks(block->segment->small);
    if (spare_nodes.empty()) {
      set.insert(block);
      return;
    }
    auto node = std::move(spare_nodes.back());
    spare_nodes.pop_back();
    node.value() = block;
    set.insert(std::move(node));
  }
  void remove_free(FreeBlocks& set, FreeBlocks::iterator it) {
    auto node = set.extract(it);
    if (spare_nodes.size() < kSpares) spare_nodes.push_back(std::move(node));
  }
  void remove_free(Block* block) {  // every block not allocated is in its pool's set
    auto& set = free_blocks(block->segment->small);
    auto it = set.find(block);
    TORCH_INTERNAL_ASSERT(it != set.end(), "neuron allocator: a free block missing from its pool");
    remove_free(set, it);
  }
  Block* make_block(void* ptr, size_t size, c10::DeviceIndex device, Segment* segment) {
    if (spare_blocks.empty()) return new Block{ptr, size, 0, device, segment};
    Block* block = spare_blocks.back();
    spare_blocks.pop_back();
    *block = Block{ptr, size, 0, device, segment};
    return block;
  }
  void drop_block(Block* block) {
    if (spare_blocks.size() >= kSpares) {
      delete block;
      return;
    }
    block->frames = nullptr;
    spare_blocks.push_back(block);
  }

 private:
  static constexpr size_t kSpares = 64;
  uint64_t free_clock = 0;
  std::vector<FreeBlocks::node_type> spare_nodes;
  std::vector<Block*> spare_blocks;
};

size_t segment_size(size_t size) {
  if (size <= kSmallBlock) return kSmallSegment;
  if (size < kMediumRequest) return kMediumSegment;
  return (size + kLargeRounding - 1) / kLargeRounding * kLargeRounding;
}

// CUDA's rule: a small block is split if at least 512 bytes remain, a large one
// only if more than 1 MiB does (smaller remainders stay with the block).
bool worth_splitting(const Block* block, size_t size) {
  const size_t remaining = block->size - size;
  return block->segment->small ? remaining >= kGranularity : remaining > kSmallBlock;
}

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

// Called with core.mutex held, when the memory history is on (log() checks).
void log_entry(Core& core, const char* action, const void* addr, int64_t size, c10::StreamId stream,
               Frames frames) {
  TraceEntry e;
  e.action = action;
  e.addr = reinterpret_cast<int64_t>(addr);
  e.size = size;
  e.stream = stream;
  e.time_us = now_us();
  e.frames = std::move(frames);
  if (std::string_view(action) == "oom") e.device_free = core_capacity() - core.stats.reserved_bytes[0].current;
  core.trace.push_back(std::move(e));
  while (core.trace.size() > g_max_entries.load()) core.trace.pop_front();
}

// Records an allocator event in the memory history, when it is on (a check per event).
inline void log(Core& core, const char* action, const void* addr, int64_t size, c10::StreamId stream,
                Frames frames = nullptr) {
  if (g_trace.load(std::memory_order_relaxed)) log_entry(core, action, addr, size, stream, std::move(frames));
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
  // What a request that the core cannot hold does.
  enum class OnOutOfMemory { Raise, ReturnNull };

  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex device = current_device();
    if (nbytes == 0) return c10::DataPtr(nullptr, c10::Device(kNeuron, device));
    return allocate_on(device, nbytes);
  }

  // Device memory of a given core, whatever the thread's current device.
  c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes) {
    Block* block = acquire(device, nbytes);
    return owning_data_ptr(block);
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  bool initialized() override { return true; }

  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    interceptor().release_cached_memory();
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      auto& core = cores_[d];
      std::lock_guard<std::mutex> lock(core.mutex);
      release_cached(core);
      trace::note_memory(d, core.stats.allocated_bytes[0].current, core.stats.reserved_bytes[0].current);
    }
  }

  void recordStream(const c10::DataPtr& data_ptr, c10::Stream stream) override {
    if (data_ptr.get() == nullptr) return;
    TORCH_CHECK(data_ptr.get_deleter() == &NeuronAllocator::release_context || is_pending(data_ptr),
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
    // Statistics describe executed work: pending launches finish first, and results that
    // are still pending but alive (never written: torch.empty) count as the memory they hold.
    if (!on_device_thread()) {
      synchronize_device(device, Reason::MemoryStatistics);
      materialize_all_pending(device);
    }
    auto& core = core_for(device);
    std::lock_guard<std::mutex> lock(core.mutex);
    empty_quick_bins(core);  // inactive_split counts blocks as they are once merged
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

  static size_t pool(bool small) {
    return static_cast<size_t>(small ? StatType::SMALL_POOL : StatType::LARGE_POOL);
  }

  template <typename F>
  static void for_stat(c10::CachingAllocator::StatArray& arr, bool small, F f) {
    f(arr[static_cast<size_t>(StatType::AGGREGATE)]);
    f(arr[pool(small)]);
  }

  // Adds (Sign > 0) or takes `amount` from a statistic of the block's pool and the aggregate.
  // The sign is a template argument: every block given or freed runs these, straight-line.
  template <int Sign>
  static void count(c10::CachingAllocator::StatArray& arr, const Block* block, int64_t amount) {
    for_stat(arr, block->segment->small, [&](auto& st) {
      if constexpr (Sign > 0) {
        st.increase(amount);
      } else {
        st.decrease(amount);
      }
    });
  }

  // A block given to a tensor counts as an allocation, active, and its bytes.
  template <int Sign>
  static void count_allocated(Core& core, const Block* block) {
    auto& s = core.stats;
    const auto bytes = static_cast<int64_t>(block->size);
    count<Sign>(s.allocation, block, 1);
    count<Sign>(s.active, block, 1);
    count<Sign>(s.allocated_bytes, block, bytes);
    count<Sign>(s.active_bytes, block, bytes);
    count<Sign>(s.requested_bytes, block, static_cast<int64_t>(block->requested));
  }

  // A free block that is a piece of a segment counts as an inactive split (CUDA's stat).
  template <int Sign>
  static void count_inactive_split(Core& core, const Block* block) {
    if (!block->is_split()) return;
    count<Sign>(core.stats.inactive_split, block, 1);
    count<Sign>(core.stats.inactive_split_bytes, block, static_cast<int64_t>(block->size));
  }

  Block* acquire(c10::DeviceIndex device, size_t nbytes, bool counted = true,
                 OnOutOfMemory on_oom = OnOutOfMemory::Raise) {
    auto& core = core_for(device);
    const size_t size = rounded_size(nbytes);
    const bool small = size <= kSmallBlock;
    // Before the lock: capturing a Python stack takes the GIL.
    Frames frames = capture_stack();
    const c10::StreamId stream = current_stream(device).id();
    std::lock_guard<std::mutex> lock(core.mutex);
    auto& s = core.stats;

    Block* block = core.quick.pop(size);
    if (block != nullptr) {
      count_inactive_split<-1>(core, block);
    } else {
      block = take_free_block(core, small, size);
      if (block == nullptr && empty_quick_bins(core)) block = take_free_block(core, small, size);
      if (block == nullptr) block = new_segment(core, device, size, small, nbytes, stream, frames, on_oom);
      if (block == nullptr) return nullptr;  // OnOutOfMemory::ReturnNull
    }
    if (worth_splitting(block, size)) {
      auto* rest = core.make_block(static_cast<char*>(block->ptr) + size, block->size - size, device, block->segment);
      rest->prev = block;
      rest->next = block->next;
      if (block->next != nullptr) block->next->prev = rest;
      block->next = rest;
      block->size = size;
      core.add_free(rest);
      count_inactive_split<1>(core, rest);
    }
    block->allocated = true;
    block->requested = nbytes;
    block->stream = stream;
    block->frames = frames;
    block->counted = counted;
    if (counted) {
      log(core, "alloc", block->ptr, static_cast<int64_t>(block->size), stream, std::move(frames));
      count_allocated<1>(core, block);
      trace::note_memory(device, s.allocated_bytes[0].current, s.reserved_bytes[0].current, block->ptr,
                         static_cast<int64_t>(block->size));
    }
    return block;
  }

 public:
  // A pending result's block (see Block::counted).
  c10::DataPtr allocate_pending(c10::DeviceIndex device, size_t nbytes, OnOutOfMemory on_oom) {
    Block* block = acquire(device, nbytes, /*counted=*/false, on_oom);
    if (block == nullptr) return c10::DataPtr(nullptr, c10::Device(kNeuron, device));
    return c10::DataPtr(block->ptr, block, &NeuronAllocator::release_pending_context, c10::Device(kNeuron, device));
  }

  // A pending block whose storage outlives its launch starts to count.
  void count_computed(Block* block) {
    auto& core = cores_[block->device];
    std::lock_guard<std::mutex> lock(core.mutex);
    if (block->counted) return;
    block->counted = true;
    log(core, "alloc", block->ptr, static_cast<int64_t>(block->size), block->stream, block->frames);
    count_allocated<1>(core, block);
    trace::note_memory(block->device, core.stats.allocated_bytes[0].current, core.stats.reserved_bytes[0].current,
                       block->ptr, static_cast<int64_t>(block->size));
  }

 private:

  // The smallest free block of the pool that holds `size` bytes, taken out of the pool.
  static Block* take_free_block(Core& core, bool small, size_t size) {
    auto& free = core.free_blocks(small);
    Block key{nullptr, size, 0, 0, nullptr};
    key.freed_at = UINT64_MAX;  // before every free block of this size
    auto it = free.lower_bound(&key);
    if (it == free.end()) return nullptr;
    Block* block = *it;
    core.remove_free(free, it);
    count_inactive_split<-1>(core, block);
    return block;
  }

  Block* new_segment(Core& core, c10::DeviceIndex device, size_t size, bool small, size_t nbytes,
                     c10::StreamId stream, const Frames& frames, OnOutOfMemory on_oom) {
    auto& s = core.stats;
    const int64_t capacity = core_capacity();
    const auto fits = [&](size_t bytes) {
      return s.reserved_bytes[0].current + static_cast<int64_t>(bytes) <= capacity;
    };
    size_t bytes = segment_size(size);
    if (!fits(bytes) && release_cached(core) > 0) s.num_alloc_retries += 1;
    if (!fits(bytes)) bytes = size;  // a segment just as large as the request may still fit
    void* ptr = fits(bytes) ? allocate_segment(device, bytes) : nullptr;  // shareable pages (segment_memory.h)
    if (ptr == nullptr && on_oom == OnOutOfMemory::ReturnNull) return nullptr;
    if (ptr == nullptr) {
      s.num_ooms += 1;
      log(core, "oom", nullptr, static_cast<int64_t>(size), stream, frames);
      const int64_t allocated = s.allocated_bytes[0].current;
      const int64_t reserved = s.reserved_bytes[0].current;
      c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(size), allocated, reserved,
                                       c10::Device(kNeuron, device));
      const bool host_ran_out = fits(bytes);
      TORCH_CHECK_WITH(
          OutOfMemoryError, false, "neuron:", int(device),
          host_ran_out ? " could not get host memory: " : " out of memory: ", "tried to allocate ",
          format_bytes(static_cast<int64_t>(nbytes)), "; ", format_bytes(reserved), " of ",
          format_bytes(capacity), " in use on this NeuronCore (", format_bytes(allocated),
          " allocated by tensors, ", format_bytes(reserved - allocated),
          " cached by the allocator). ",
          host_ran_out ? "The host machine itself ran out of memory; free memory on the host."
                       : "Free tensors you no longer need (del them), call torch.neuron.empty_cache(), "
                         "use a smaller batch, or give each core more memory with "
                         "NEURON_LAB_CORE_MEMORY=<size> (e.g. 32GiB) before importing torch.");
    }
    s.num_device_alloc += 1;
    for_stat(s.segment, small, [](auto& st) { st.increase(1); });
    for_stat(s.reserved_bytes, small, [&](auto& st) { st.increase(static_cast<int64_t>(bytes)); });
    auto* segment = new Segment{ptr, bytes, small, stream};
    segment->first = new Block{ptr, bytes, 0, device, segment};
    core.segments.emplace(ptr, segment);
    log(core, "segment_alloc", ptr, static_cast<int64_t>(bytes), stream, frames);
    return segment->first;
  }

  // Returns the segments no tensor uses to the host; called with core.mutex held.
  static size_t release_cached(Core& core) {
    empty_quick_bins(core);
    auto& s = core.stats;
    size_t released = 0;
    for (auto it = core.segments.begin(); it != core.segments.end();) {
      Segment* segment = it->second;
      Block* whole = segment->first;
      if (whole->allocated || whole->next != nullptr) {  // a tensor uses part of it
        ++it;
        continue;
      }
      const bool small = segment->small;
      core.remove_free(whole);
      core.drop_block(whole);
      log(core, "segment_free", segment->ptr, static_cast<int64_t>(segment->size), segment->stream);
      release_segment(segment->ptr);
      s.num_device_free += 1;
      for_stat(s.segment, small, [](auto& st) { st.decrease(1); });
      for_stat(s.reserved_bytes, small, [&](auto& st) { st.decrease(static_cast<int64_t>(segment->size)); });
      delete segment;
      it = core.segments.erase(it);
      ++released;
    }
    return released;
  }

  void release(Block* block) {
    auto& core = cores_[block->device];
    std::lock_guard<std::mutex> lock(core.mutex);
    auto& s = core.stats;
    const auto bytes = static_cast<int64_t>(block->size);
    const int64_t freed = block->counted ? bytes : 0;
    void* const freed_ptr = block->ptr;  // merging below may move the block's start
    if (block->counted) {
      count_allocated<-1>(core, block);
      // Launches complete when issued, so a freed block is reusable at once.
      log(core, "free_requested", block->ptr, bytes, block->stream);
      log(core, "free_completed", block->ptr, bytes, block->stream);
    }
    block->allocated = false;
    block->counted = false;
    block->requested = 0;
    block->frames = nullptr;
    if (core.quick.push(block)) {
      count_inactive_split<1>(core, block);
    } else {
      free_into_tree(core, block);
    }
    trace::note_memory(block->device, s.allocated_bytes[0].current, s.reserved_bytes[0].current, freed_ptr, -freed);
  }

  // Merges the quick bins' blocks into the free-block tree, as release() merges any freed
  // block; false if they were empty. Called with core.mutex held.
  static bool empty_quick_bins(Core& core) {
    if (core.quick.held == 0) return false;
    for (size_t bin = 0; bin < QuickBins::kSizes; ++bin) {
      while (Block* block = core.quick.pop_from(bin)) {
        count_inactive_split<-1>(core, block);
        free_into_tree(core, block);
      }
    }
    return true;
  }

  // A free block into the free-block tree, merged with its free neighbours first.
  static void free_into_tree(Core& core, Block* block) {
    merge_with_free_neighbours(core, block);
    count_inactive_split<1>(core, block);
    core.add_free(block);
  }

  // Absorbs the free blocks before and after `block` (freed just now) into it.
  static void merge_with_free_neighbours(Core& core, Block* block) {
    if (Block* prev = block->prev; prev != nullptr && !prev->allocated && !prev->binned) {
      count_inactive_split<-1>(core, prev);
      core.remove_free(prev);
      block->ptr = prev->ptr;
      block->size += prev->size;
      block->prev = prev->prev;
      if (block->prev != nullptr) block->prev->next = block;
      if (block->segment->first == prev) block->segment->first = block;
      core.drop_block(prev);
    }
    if (Block* next = block->next; next != nullptr && !next->allocated && !next->binned) {
      count_inactive_split<-1>(core, next);
      core.remove_free(next);
      block->size += next->size;
      block->next = next->next;
      if (block->next != nullptr) block->next->prev = block;
      core.drop_block(next);
    }
  }

 public:
  static void release_context(void* context);
  // The same for memory whose contents no launch has written yet (pending.cpp): a
  // distinct function, so that the DataPtr itself says which kind it is.
  static void release_pending_context(void* context);
  // The device DataPtr that owns `block`: freeing it gives the block back.
  static c10::DataPtr owning_data_ptr(Block* block) {
    return c10::DataPtr(block->ptr, block, &NeuronAllocator::release_context, c10::Device(kNeuron, block->device));
  }

  MemorySnapshot snapshot() {
    MemorySnapshot snap;
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      auto& core = cores_[d];
      std::lock_guard<std::mutex> lock(core.mutex);
      empty_quick_bins(core);  // a snapshot shows blocks as they are once merged
      for (const auto& [address, segment] : core.segments) {
        SegmentSnapshot seg{d, reinterpret_cast<int64_t>(address), static_cast<int64_t>(segment->size), 0, 0, 0,
                            segment->stream, segment->small ? "small" : "large", {}};
        for (const Block* b = segment->first; b != nullptr; b = b->next) {
          const auto size = static_cast<int64_t>(b->size);
          const auto requested = static_cast<int64_t>(b->requested);
          if (b->allocated) {
            seg.allocated_size += size;
            seg.active_size += size;
            seg.requested_size += requested;
          }
          seg.blocks.push_back({reinterpret_cast<int64_t>(b->ptr), size, requested,
                                b->allocated ? "active_allocated" : "inactive", b->allocated ? b->frames : nullptr});
        }
        snap.segments.push_back(std::move(seg));
      }
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

// The device's tensors live in its segments, not in malloc's heap, so glibc never sees the
// large frees that in a CPU process raise its mmap threshold (dynamically, up to 32 MiB) and
// its trim threshold (twice that). Kernels malloc scratch buffers on every call (oneDNN's,
// im2col's): a CPU process then reuses heap memory, while at glibc's start-up threshold
// (128 KiB) each buffer is mapped, page-faulted and unmapped again (ResNet-18's training step:
// 13,700 minor faults against the CPU's 4,400, 75 ms against 58). So the process starts where
// the dynamic rule ends, unless its user set a threshold.
bool match_a_cpu_process_malloc() {
#if defined(__GLIBC__)
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"}) {
    if (std::getenv(name) != nullptr) return false;
  }
  constexpr int kMmapThreshold = 32 << 20;  // glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 && mallopt(M_TRIM_THRESHOLD, 2 * kMmapThreshold) == 1;
#else
  return false;
#endif
}
[[maybe_unused]] const bool g_malloc_matched = match_a_cpu_process_malloc();  // at load

void NeuronAllocator::release_context(void* context) {
  // A forked child's copy of the allocator is not its own (its locks may be held for ever,
  // its memory is the parent's): a tensor it drops is left as it is.
  if (in_bad_fork()) return;
  g_allocator->release(static_cast<Block*>(context));
}
void NeuronAllocator::release_pending_context(void* context) { release_context(context); }

// ---- host allocations that take device memory ----------------------------------------
//
// A kernel that runs on the host (a torch.compile graph, a custom kernel) allocates
// its results with the CPU allocator. While a HostAllocationsOnDevice guard is
// active on a thread, those allocations take memory of a NeuronCore instead, so
// the results become neuron tensors without a copy (adopt_host_storage). The CPU
// allocator is wrapped once, on first use; other threads, and this thread outside
// the guard, allocate exactly as before.
//
// A thread's lending state is one thread-local, so that a hot path looks it up once, and
// trivially destructible, so that a free that runs after the thread's thread-locals are
// gone (static destructors at exit) still reads a valid, empty list.
struct HostLending {
  c10::DeviceIndex device = -1;  // the core CPU allocations take memory of; -1: none
  size_t min_bytes = 1;          // smaller CPU allocations stay host memory
  // Blocks lent under a thread-private scope (an op of the unboxed path, where only this
  // thread's C++ runs) stay in `lent` instead of the shared map: an op lends one or two
  // and takes them back at once, without the lock or a hash node. The scope hands what
  // is left to the shared map when it ends, so that any thread can free it; a block
  // lent when the list is full goes to the shared map at once.
  bool privately = false;
  int lent_count = 0;
  std::array<std::pair<void*, Block*>, 8> lent{};
};
thread_local HostLending tl_lending;

// Device blocks handed out as CPU memory, by address: a CPU DataPtr's context must
// be its address (Allocator::raw_allocate asserts it; oneDNN uses it for scratch).
std::mutex g_host_blocks_mutex;
std::unordered_map<void*, Block*>& host_blocks() {
  static auto* blocks = new std::unordered_map<void*, Block*>();
  return *blocks;
}
c10::DeleterFnPtr g_host_raw_deleter = nullptr;

Block* take_lent_privately(void* ptr) {
  HostLending& lending = tl_lending;
  for (int i = 0; i < lending.lent_count; ++i) {
    if (lending.lent[i].first != ptr) continue;
    Block* block = lending.lent[i].second;
    lending.lent[i] = lending.lent[--lending.lent_count];  // order does not matter
    return block;
  }
  return nullptr;
}

void share_lent_blocks(HostLending& lending) {
  if (lending.lent_count == 0) return;
  std::lock_guard<std::mutex> lock(g_host_blocks_mutex);
  for (int i = 0; i < lending.lent_count; ++i) host_blocks().emplace(lending.lent[i].first, lending.lent[i].second);
  lending.lent_count = 0;
}

Block* take_host_block(void* ptr) {
  if (Block* block = take_lent_privately(ptr)) return block;
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
    HostLending& lending = tl_lending;
    const c10::DeviceIndex device = lending.device;
    if (device < 0 || nbytes < lending.min_bytes || nbytes == 0) return host_->allocate(nbytes);
    auto data = g_allocator->allocate_on(device, nbytes);
    auto* block = static_cast<Block*>(data.release_context());
    if (lending.privately && lending.lent_count < static_cast<int>(lending.lent.size())) {
      lending.lent[lending.lent_count++] = {block->ptr, block};
    } else {
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
  // A function-local static: after the first call, a check of its guard (std::call_once
  // took several thread-local look-ups on every op that lends memory).
  [[maybe_unused]] static const bool installed = [] {
    // Leaked on purpose, like the device allocator: CPU tensors may outlive everything.
    c10::Allocator* host = c10::GetCPUAllocator();
    g_host_raw_deleter = host->raw_deleter();
    static auto* wrapper = new HostOrDeviceAllocator(host);
    // The default priority: a CPU allocator installed later still takes over (host
    // kernels' results are then copied into device memory instead of adopted).
    c10::SetAllocator(c10::DeviceType::CPU, wrapper, /*priority=*/0);
    return true;
  }();
}

}  // namespace

HostAllocationsOnDevice::HostAllocationsOnDevice(c10::DeviceIndex device, Lending lending, size_t min_bytes) {
  if (device >= 0) {
    check_device_index(device);
    install_host_or_device_allocator();
  }
  HostLending& state = tl_lending;
  previous_ = state.device;
  previous_private_ = state.privately;
  previous_min_bytes_ = state.min_bytes;
  state.device = device;
  state.privately = lending == Lending::ThreadPrivate;
  state.min_bytes = min_bytes;
}

HostAllocationsOnDevice::~HostAllocationsOnDevice() {
  HostLending& state = tl_lending;
  if (state.privately && !previous_private_) share_lent_blocks(state);
  state.device = previous_;
  state.privately = previous_private_;
  state.min_bytes = previous_min_bytes_;
}

c10::DeviceIndex host_allocations_device() { return tl_lending.device; }

namespace {

// The context of a CPU storage whose memory a neuron storage adopted: it keeps that
// neuron storage, and so the memory, alive while CPU tensors over the memory live.
struct AdoptedMemory {
  c10::Storage device_storage;
};

void release_adopted_memory(void* context) { delete static_cast<AdoptedMemory*>(context); }

}  // namespace

c10::Storage adopt_host_storage(const c10::Storage& host_storage, c10::DeviceIndex device) {
  auto* impl = host_storage.unsafeGetStorageImpl();
  if (impl == nullptr) return {};
  if (impl->data_ptr().get_deleter() == &release_adopted_memory) {  // an earlier launch adopted it
    const auto* adopted = static_cast<const AdoptedMemory*>(impl->data_ptr().get_context());
    return adopted->device_storage.device().index() == device ? adopted->device_storage : c10::Storage();
  }
  if (impl->data_ptr().get_deleter() != &free_device_or_host) return {};
  Block* block = take_host_block(impl->data_ptr().get());
  if (block == nullptr) return {};  // host memory freed through the raw deleter
  if (block->device != device) {
    std::lock_guard<std::mutex> lock(g_host_blocks_mutex);
    host_blocks().emplace(block->ptr, block);  // still lent to the host, as before
    return {};
  }
  c10::Storage adopted(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), impl->nbytes(),
                                                             NeuronAllocator::owning_data_ptr(block), g_allocator,
                                                             /*resizable=*/true));
  // The CPU storage keeps its view of the memory, now held through the neuron storage
  // (its old DataPtr's deleter must not run: the block is the neuron storage's).
  impl->set_data_ptr(c10::DataPtr(block->ptr, new AdoptedMemory{adopted}, &release_adopted_memory,
                                  c10::Device(c10::kCPU)))
      .release_context();
  return adopted;
}

bool adopt_host_storage_in_place(c10::StorageImpl& impl, c10::DeviceIndex device) {
  if (impl.data_ptr().get_deleter() != &free_device_or_host) return false;
  Block* block = take_host_block(impl.data_ptr().get());
  if (block == nullptr) return false;  // host memory freed through the raw deleter
  if (block->device != device) {
    std::lock_guard<std::mutex> lock(g_host_blocks_mutex);
    host_blocks().emplace(block->ptr, block);  // still lent to the host, as before
    return false;
  }
  // The old DataPtr's deleter must not run: the block is the new one's.
  impl.set_data_ptr(NeuronAllocator::owning_data_ptr(block)).release_context();
  impl.set_allocator(g_allocator);
  return true;
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

// ---- memory of results not computed yet (pending.cpp) ----------------------------------

c10::DataPtr allocate_pending(c10::DeviceIndex device, size_t nbytes) {
  return g_allocator->allocate_pending(device, nbytes, NeuronAllocator::OnOutOfMemory::Raise);
}

c10::DataPtr try_allocate_pending(c10::DeviceIndex device, size_t nbytes) {
  return g_allocator->allocate_pending(device, nbytes, NeuronAllocator::OnOutOfMemory::ReturnNull);
}

bool is_pending(const c10::DataPtr& data_ptr) {
  return data_ptr.get_deleter() == &NeuronAllocator::release_pending_context;
}

bool mark_computed(c10::DataPtr& data_ptr) {
  if (!data_ptr.compare_exchange_deleter(&NeuronAllocator::release_pending_context,
                                         &NeuronAllocator::release_context)) {
    return false;
  }
  g_allocator->count_computed(static_cast<Block*>(data_ptr.get_context()));
  return true;
}

size_t rounded_size(size_t nbytes) { return (nbytes + kGranularity - 1) / kGranularity * kGranularity; }

c10::DeviceAllocator* allocator() { return g_allocator; }

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, g_allocator);

}  // namespace neuron
