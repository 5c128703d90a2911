// Scratch memory for the dead intermediates of a launch.
//
// A fused graph's intermediates that nothing outside it holds never take device
// memory (as on-chip memory would hold them). Replaying the graph still needs
// bytes for them. Fresh host allocations for each of them, each launch, cost a
// page fault per 4 KiB touched (a 1M-element chain replayed at twice eager mode's
// time). Instead:
//   - intermediates whose lifetimes within the launch do not overlap share one
//     buffer (interval colouring, best fit), as eager mode's caching allocator
//     reuses a freed result's block for the next op's;
//   - buffers come from a pool kept across launches, so their pages stay mapped
//     and warm; a buffer returns to it when the last storage using it dies.
// The pool keeps at most kMaxCachedBytes; scratch is not device memory and the
// memory statistics do not count it: counters()["scratch_cached_bytes"] shows what the
// pool keeps, and empty_cache() gives it back.
#include "adaptive_eager.h"

#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <map>
#include <mutex>

namespace neuron::lazy {
namespace {

constexpr size_t kMaxCachedBytes = size_t(1) << 30;
constexpr size_t kPageBytes = 4096;

struct Block {
  void* ptr = nullptr;
  size_t size = 0;
  std::atomic<int64_t> users{0};  // storages whose memory it is
};

class ScratchPool {
 public:
  Block* take(size_t size) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // Best fit, but never a block more than twice the size asked for.
      auto it = free_.lower_bound(size);
      if (it != free_.end() && it->first <= 2 * size) {
        Block* b = it->second;
        free_.erase(it);
        cached_bytes_ -= b->size;
        return b;
      }
    }
    auto* b = new Block();
    b->size = size;
    b->ptr = c10::alloc_cpu(size);
    return b;
  }

  void give_back(Block* b) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cached_bytes_ + b->size <= kMaxCachedBytes) {
        cached_bytes_ += b->size;
        free_.emplace(b->size, b);
        return;
      }
    }
    destroy(b);
  }

  size_t cached_bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return cached_bytes_;
  }

  void release_cached() {
    std::multimap<size_t, Block*> free;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      free.swap(free_);
      cached_bytes_ = 0;
    }
    for (auto& [size, b] : free) destroy(b);
  }

 private:
  static void destroy(Block* b) {
    c10::free_cpu(b->ptr);
    delete b;
  }
  std::mutex mutex_;
  std::multimap<size_t, Block*> free_;
  size_t cached_bytes_ = 0;
};

ScratchPool& pool() {
  static auto* p = new ScratchPool();  // leaked: storages may die while the process exits
  return *p;
}

void release_block(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  if (b->users.fetch_sub(1) == 1) pool().give_back(b);
}

size_t rounded(size_t nbytes) { return (nbytes + kPageBytes - 1) / kPageBytes * kPageBytes; }

}  // namespace

void give_scratch(const std::vector<ScratchUse>& uses) {
  // Buffers of this launch: their size and the last record that uses each.
  struct Buffer {
    size_t size;
    int64_t busy_until;
    std::vector<size_t> users;  // indices into `uses`
  };
  std::vector<size_t> order(uses.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return uses[a].first < uses[b].first; });
  std::vector<Buffer> buffers;
  for (size_t i : order) {
    const auto& u = uses[i];
    if (!is_pending(u.storage)) continue;
    const size_t size = rounded(u.storage.nbytes());
    Buffer* best = nullptr;
    for (auto& b : buffers) {
      if (b.busy_until < u.first && b.size >= size && (best == nullptr || b.size < best->size)) best = &b;
    }
    if (best == nullptr) {
      buffers.push_back({size, u.last, {}});
      best = &buffers.back();
    }
    best->busy_until = u.last;
    best->users.push_back(i);
  }
  for (auto& b : buffers) {
    Block* block = pool().take(b.size);
    block->users = static_cast<int64_t>(b.users.size());
    for (size_t i : b.users) {
      const auto& storage = uses[i].storage;
      storage.unsafeGetStorageImpl()->set_data_ptr_noswap(
          c10::DataPtr(block->ptr, block, &release_block, storage.device()));
    }
  }
}

size_t scratch_cached_bytes() { return pool().cached_bytes(); }
void release_cached_scratch() { pool().release_cached(); }

}  // namespace neuron::lazy
