// What the runtime knows about device memory between launches, each table owned by one
// object: which launches still use a storage (what a host access waits for), and which
// storages hold values that were never computed (a launch that should have written them
// failed or was skipped).
#pragma once

#include "device/csrc/runtime/runtime.h"

#include <c10/core/Storage.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace neuron::lazy {

// The last launch of each stream that used a storage.
struct Access {
  StreamState* stream;
  uint64_t seq;
};

class AccessTable {
 public:
  // A launch `seq` on `stream` uses these storages.
  void note(const std::vector<const c10::StorageImpl*>& storages, StreamState& stream, uint64_t seq);
  // The launches a host access of this storage must wait for (some may have finished).
  std::vector<Access> launches_using(const c10::StorageImpl* storage) const;
  // Forgets accesses whose launch has finished (all of them once the device is idle).
  void forget_finished();
  size_t size() const;

 private:
  void forget_finished_locked();
  mutable std::mutex mutex_;
  std::unordered_map<const c10::StorageImpl*, std::vector<Access>> table_;
};

class PoisonTable {
 public:
  // Marks a storage as never computed, with why (shown when it is read).
  void mark(const c10::Storage& storage, const std::string& why);
  // Why the storage was never computed, or nothing when its value is valid.
  std::optional<std::string> why(const c10::StorageImpl* storage);
  // A successful write makes the value valid again.
  void clear(const c10::StorageImpl* storage);
  // Cheap check before any lookup: is anything marked?
  bool any() const { return count_.load(std::memory_order_relaxed) > 0; }
  // Forgets storages that were freed.
  void forget_freed();
  size_t size() const { return count_.load(); }

 private:
  void forget_freed_locked();
  struct Mark {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;  // keeps the address from being reused
    std::string why;
  };
  std::mutex mutex_;
  std::atomic<size_t> count_{0};
  std::unordered_map<const c10::StorageImpl*, Mark> table_;
};

// The runtime's tables (process lifetime: device threads may use them at exit).
AccessTable& access_table();
PoisonTable& poison_table();

}  // namespace neuron::lazy
