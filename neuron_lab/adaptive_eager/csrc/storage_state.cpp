#include "storage_state.h"

#include <algorithm>

namespace neuron::lazy {

namespace {
constexpr size_t kAccessSweepSize = 4096;  // the table is swept of finished launches past this
constexpr size_t kPoisonSweepSize = 1024;  // and the poison table of freed storages past this
}  // namespace

// ---- AccessTable --------------------------------------------------------------------------

void AccessTable::note(const std::vector<const c10::StorageImpl*>& storages, StreamState& stream, uint64_t seq) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto* storage : storages) {
    auto& list = table_[storage];
    auto same_stream = std::find_if(list.begin(), list.end(), [&](const Access& a) { return a.stream == &stream; });
    if (same_stream != list.end()) {
      same_stream->seq = seq;
    } else {
      list.push_back({&stream, seq});
    }
  }
  if (table_.size() > kAccessSweepSize) forget_finished_locked();
}

std::vector<Access> AccessTable::launches_using(const c10::StorageImpl* storage) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = table_.find(storage);
  return it == table_.end() ? std::vector<Access>{} : it->second;
}

void AccessTable::forget_finished() {
  std::lock_guard<std::mutex> lock(mutex_);
  forget_finished_locked();
}

void AccessTable::forget_finished_locked() {
  for (auto it = table_.begin(); it != table_.end();) {
    auto& list = it->second;
    list.erase(std::remove_if(list.begin(), list.end(),
                              [](const Access& a) { return stream_completed(*a.stream) >= a.seq; }),
               list.end());
    it = list.empty() ? table_.erase(it) : std::next(it);
  }
}

size_t AccessTable::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return table_.size();
}

// ---- PoisonTable --------------------------------------------------------------------------

void PoisonTable::mark(const c10::Storage& storage, const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (table_.size() > kPoisonSweepSize) forget_freed_locked();
  table_.insert_or_assign(storage.unsafeGetStorageImpl(),
                          Mark{c10::weak_intrusive_ptr<c10::StorageImpl>(storage.getWeakStorageImpl()), why});
  count_ = table_.size();
}

std::optional<std::string> PoisonTable::why(const c10::StorageImpl* storage) {
  if (!any()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = table_.find(storage);
  if (it == table_.end()) return std::nullopt;
  if (it->second.storage.expired()) {
    table_.erase(it);
    count_ = table_.size();
    return std::nullopt;
  }
  return it->second.why;
}

void PoisonTable::clear(const c10::StorageImpl* storage) {
  if (!any()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  table_.erase(storage);
  count_ = table_.size();
}

void PoisonTable::forget_freed() {
  std::lock_guard<std::mutex> lock(mutex_);
  forget_freed_locked();
}

void PoisonTable::forget_freed_locked() {
  for (auto it = table_.begin(); it != table_.end();) {
    it = it->second.storage.expired() ? table_.erase(it) : std::next(it);
  }
  count_ = table_.size();
}

AccessTable& access_table() {
  static auto* table = new AccessTable();
  return *table;
}

PoisonTable& poison_table() {
  static auto* table = new PoisonTable();
  return *table;
}

}  // namespace neuron::lazy
