// Neuron storages shared between processes (torch.multiprocessing; neuron_lab/device/sharing.py),
// as CUDA shares device memory with IPC handles: the receiver maps the sender's device
// memory itself, no copy, on the same core index.
//
// Sending: a storage's memory is a range of a memory file (segment_memory.h). The sender
// hands out the file's descriptor and the range, plus a slot of a small counter file: the
// number of references receivers hold. While it is above zero, the sender keeps the storage
// (so the allocator cannot reuse its block), however long the sender's own tensors live;
// collect() lets go of storages whose count fell to zero (at each share and each receipt,
// and torch.neuron.ipc_collect()).
//
// Receiving: the receiver maps the range (mappings are shared by the storages inside them)
// and wraps it as a neuron storage of its own that its allocator neither owns nor counts,
// as CUDA's opened IPC memory is not counted; freeing the storage unmaps the range and
// decrements the count. A range that arrives again while its storage lives gives that
// storage (and the message's count back at once), so views sent apart stay views of one
// storage, and a storage sent back to its owner is the owner's own.
#include "python_submodules.h"
#include "device/csrc/runtime/runtime.h"
#include "device/csrc/runtime/segment_memory.h"

#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Storage.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sys/mman.h>
#include <sys/stat.h>
#include <tuple>
#include <unistd.h>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace neuron {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint32_t kCounterSlots = 4096;  // counters of one counter file (32 KiB)

[[noreturn]] void fail_errno(const char* what) {
  TORCH_CHECK(false, "neuron: sharing device memory between processes: ", what, " failed: ", std::strerror(errno));
}

// Which file a descriptor opens (two descriptors of one file compare equal).
struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator<(const FileId& o) const { return std::tie(dev, ino) < std::tie(o.dev, o.ino); }
  bool operator==(const FileId& o) const { return dev == o.dev && ino == o.ino; }
};

FileId file_id(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) fail_errno("fstat");
  return {st.st_dev, st.st_ino};
}

int64_t* counter_at(void* counters, uint64_t slot) { return static_cast<int64_t*>(counters) + slot; }

// ---- the sending side -------------------------------------------------------------------

struct CounterFile {
  int fd = -1;
  void* counters = nullptr;  // kCounterSlots int64 counters, MAP_SHARED
  std::vector<uint32_t> free_slots;
};

struct SentStorage {
  c10::Storage storage;  // keeps the memory allocated while receivers may use it
  CounterFile* file;
  uint32_t slot;
};

class Sender {
 public:
  // The counter of `storage`'s references in other processes, one more for the message
  // about to be sent: (counter file descriptor, slot).
  std::pair<int, uint32_t> add_reference(const c10::Storage& storage) {
    std::vector<c10::Storage> released = drop_unreferenced();
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = sent_.find(storage.unsafeGetStorageImpl());
    if (it == sent_.end()) {
      auto [file, slot] = take_slot();
      *counter_at(file->counters, slot) = 0;
      it = sent_.emplace(storage.unsafeGetStorageImpl(), SentStorage{storage, file, slot}).first;
    }
    __atomic_add_fetch(counter_at(it->second.file->counters, it->second.slot), 1, __ATOMIC_ACQ_REL);
    return {it->second.file->fd, it->second.slot};
  }

  // Lets go of the storages no other process references any more; how many.
  size_t collect() { return drop_unreferenced().size(); }

  size_t held() {
    std::lock_guard<std::mutex> lock(mutex_);
    return sent_.size();
  }

 private:
  std::vector<c10::Storage> drop_unreferenced() {
    std::vector<c10::Storage> released;  // dropped after the lock: freeing runs deleters
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = sent_.begin(); it != sent_.end();) {
      auto& s = it->second;
      if (__atomic_load_n(counter_at(s.file->counters, s.slot), __ATOMIC_ACQUIRE) > 0) {
        ++it;
        continue;
      }
      s.file->free_slots.push_back(s.slot);
      released.push_back(std::move(s.storage));
      it = sent_.erase(it);
    }
    return released;
  }

  std::pair<CounterFile*, uint32_t> take_slot() {
    for (auto& file : files_) {
      if (file->free_slots.empty()) continue;
      const uint32_t slot = file->free_slots.back();
      file->free_slots.pop_back();
      return {file.get(), slot};
    }
    auto file = std::make_unique<CounterFile>();
    const size_t bytes = kCounterSlots * sizeof(int64_t);
    file->fd = memfd_create("neuron_lab:ipc-counters", MFD_CLOEXEC);
    if (file->fd < 0) fail_errno("memfd_create");
    void* counters = ftruncate(file->fd, static_cast<off_t>(bytes)) == 0
                         ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, file->fd, 0)
                         : MAP_FAILED;
    if (counters == MAP_FAILED) {
      const int error = errno;
      close(file->fd);
      errno = error;
      fail_errno("a counter file");
    }
    file->counters = counters;
    for (uint32_t slot = kCounterSlots; slot-- > 1;) file->free_slots.push_back(slot);
    files_.push_back(std::move(file));
    return {files_.back().get(), 0};
  }

  std::mutex mutex_;
  std::vector<std::unique_ptr<CounterFile>> files_;
  std::unordered_map<const c10::StorageImpl*, SentStorage> sent_;
};

Sender& sender() {
  static auto* s = new Sender();  // leaked: storages may be freed while the process exits
  return *s;
}

// ---- the receiving side -----------------------------------------------------------------

// A range of another process's memory file, mapped here; shared by the storages inside it.
struct Mapping {
  FileId file;
  int fd;  // the file's one descriptor here (Receiver::files_), to share the range on
  uint64_t offset;
  uint64_t length;
  void* base;
  size_t users = 0;
};

// What the DataPtr of an opened storage owns.
struct OpenedStorage {
  Mapping* memory;
  Mapping* counters;
  uint64_t slot;
  c10::DeviceIndex device;
};

void release_opened(void* context);

// The storages this process opened or shared, by (file, offset, bytes): a range that comes
// back while its storage lives gives that storage.
using RangeKey = std::tuple<FileId, uint64_t, uint64_t>;

class Receiver {
 public:
  // Maps [offset, offset + length) of the file `fd` opens (or finds it mapped), one user more.
  Mapping* map(int fd, uint64_t offset, uint64_t length) {
    const FileId id = file_id(fd);
    std::lock_guard<std::mutex> lock(mutex_);
    const RangeKey key{id, offset, length};
    auto it = mappings_.find(key);
    if (it == mappings_.end()) {
      void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(offset));
      if (base == MAP_FAILED) fail_errno("mmap");
      // One descriptor per file however many ranges of it are mapped: a process receiving
      // tensors from a few processes holds a few descriptors.
      auto file = files_.find(id);
      if (file == files_.end()) {
        const int kept = dup(fd);
        if (kept < 0) {
          munmap(base, length);
          fail_errno("dup");
        }
        file = files_.emplace(id, KeptFile{kept, 0}).first;
      }
      ++file->second.mappings;
      it = mappings_.emplace(key, Mapping{id, file->second.fd, offset, length, base}).first;
    }
    ++it->second.users;
    return &it->second;
  }

  void unmap(Mapping* m) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--m->users > 0) return;
    munmap(m->base, m->length);
    auto file = files_.find(m->file);
    if (--file->second.mappings == 0) {
      close(file->second.fd);
      files_.erase(file);
    }
    mappings_.erase(RangeKey{m->file, m->offset, m->length});
  }

  // The live storage over this range, if any.
  std::optional<c10::Storage> find(const RangeKey& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = storages_.find(key);
    if (it == storages_.end()) return std::nullopt;
    auto impl = it->second.lock();
    if (!impl) {
      storages_.erase(it);
      return std::nullopt;
    }
    return c10::Storage(std::move(impl));
  }

  void remember(const RangeKey& key, const c10::Storage& storage) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (storages_.size() >= prune_at_) {
      for (auto it = storages_.begin(); it != storages_.end();) {
        it = it->second.expired() ? storages_.erase(it) : std::next(it);
      }
      prune_at_ = std::max<size_t>(128, 2 * storages_.size());
    }
    storages_.insert_or_assign(key, c10::weak_intrusive_ptr<c10::StorageImpl>(storage.getWeakStorageImpl()));
  }

  size_t mapped() {
    std::lock_guard<std::mutex> lock(mutex_);
    return mappings_.size();
  }

 private:
  struct KeptFile {
    int fd;
    size_t mappings;
  };
  std::mutex mutex_;
  std::map<FileId, KeptFile> files_;
  std::map<RangeKey, Mapping> mappings_;  // node-based: Mapping addresses stay put
  std::map<RangeKey, c10::weak_intrusive_ptr<c10::StorageImpl>> storages_;
  size_t prune_at_ = 128;
};

Receiver& receiver() {
  static auto* r = new Receiver();  // leaked: storages may be freed while the process exits
  return *r;
}

void release_opened(void* context) {
  // A forked child's copy of a storage is not a reference the sender counted.
  if (in_bad_fork()) return;
  auto* opened = static_cast<OpenedStorage*>(context);
  __atomic_sub_fetch(counter_at(opened->counters->base, opened->slot), 1, __ATOMIC_ACQ_REL);
  receiver().unmap(opened->memory);
  receiver().unmap(opened->counters);
  delete opened;
}

// ---- sharing and opening ------------------------------------------------------------------

// What another process needs to map a storage's memory.
struct Handle {
  int device;
  int memory_fd;  // owned by this process: the caller passes a duplicate on
  uint64_t base_offset, length;   // the mapped range holding the storage
  uint64_t offset, nbytes;        // the storage inside that range
  int counter_fd;
  uint32_t slot;
};

Handle share(const c10::Storage& storage) {
  check_not_forked();
  TORCH_CHECK(storage.device_type() == kNeuron, "neuron: expected a neuron storage, got one on ", storage.device());
  TORCH_CHECK(!is_pending(storage), "neuron: a storage must hold its values before it is shared (internal error)");
  const void* data = storage.data();
  MemoryLocation where;
  const auto& data_ptr = storage.data_ptr();
  if (data_ptr.get_deleter() == &release_opened) {  // memory another process shared with this one
    const auto* opened = static_cast<const OpenedStorage*>(data_ptr.get_context());
    where = {opened->device, opened->memory->fd, opened->memory->offset, opened->memory->length, opened->memory->base};
  } else {
    TORCH_CHECK(find_segment(data, &where), "neuron: this storage's memory (", data,
                ") is not device memory of the neuron allocator, so it cannot be shared with another process; "
                "share a copy (tensor.clone()) instead");
  }
  const uint64_t offset = static_cast<uint64_t>(static_cast<const char*>(data) - static_cast<const char*>(where.base));
  TORCH_CHECK(offset + storage.nbytes() <= where.length, "neuron: a storage runs past its memory segment (internal error)");
  auto [counter_fd, slot] = sender().add_reference(storage);
  receiver().remember(RangeKey{file_id(where.fd), where.base_offset + offset, storage.nbytes()}, storage);
  return {static_cast<int>(storage.device().index()), where.fd, where.base_offset, where.length, offset,
          storage.nbytes(), counter_fd, slot};
}

c10::Storage open(const Handle& h) {
  check_not_forked();
  check_device_index(static_cast<c10::DeviceIndex>(h.device));
  TORCH_CHECK(h.base_offset % kPage == 0 && h.offset + h.nbytes <= h.length && h.slot < kCounterSlots,
              "neuron: a malformed handle of shared device memory");
  note_device_started();  // a child forked from now on shares this memory: it must not use it
  sender().collect();      // what this process shared on and no one references any more
  const RangeKey key{file_id(h.memory_fd), h.base_offset + h.offset, h.nbytes};
  Mapping* counters = receiver().map(h.counter_fd, 0, kCounterSlots * sizeof(int64_t));
  if (auto alive = receiver().find(key)) {
    // This process holds the storage already (one it opened, or its own): the message's
    // reference is not needed.
    __atomic_sub_fetch(counter_at(counters->base, h.slot), 1, __ATOMIC_ACQ_REL);
    receiver().unmap(counters);
    return *alive;
  }
  Mapping* memory = nullptr;
  try {
    memory = receiver().map(h.memory_fd, h.base_offset, h.length);
  } catch (...) {
    receiver().unmap(counters);
    throw;
  }
  const auto device = static_cast<c10::DeviceIndex>(h.device);
  auto* opened = new OpenedStorage{memory, counters, h.slot, device};
  c10::DataPtr data(static_cast<char*>(memory->base) + h.offset, opened, &release_opened, c10::Device(kNeuron, device));
  // Not resizable, with no allocator, as CUDA's opened IPC memory: a resize would write
  // past the sender's block.
  c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), h.nbytes,
                                                             std::move(data), nullptr, /*resizable=*/false));
  receiver().remember(key, storage);
  return storage;
}

const c10::Storage& unpack_storage(py::handle object) {
  TORCH_CHECK(THPStorage_Check(object.ptr()), "neuron: expected an UntypedStorage, got ",
              py::str(py::type::of(object)).cast<std::string>());
  return THPStorage_Unpack(object.ptr());
}

void bind(py::module_& m) {
  m.def(
      "share",
      [](py::handle storage_object) {
        const Handle h = share(unpack_storage(storage_object));
        return py::make_tuple(h.device, h.memory_fd, h.base_offset, h.length, h.offset, h.nbytes, h.counter_fd,
                              h.slot);
      },
      py::arg("storage"),
      "(device, memory_fd, base_offset, length, offset, nbytes, counter_fd, slot): what another process "
      "needs to map this neuron storage's memory (call prepare_storage_access first). The descriptors stay "
      "this process's: pass duplicates on.");
  m.def(
      "open",
      [](int device, int memory_fd, uint64_t base_offset, uint64_t length, uint64_t offset, uint64_t nbytes,
         int counter_fd, uint32_t slot) {
        const Handle h{device, memory_fd, base_offset, length, offset, nbytes, counter_fd, slot};
        c10::Storage storage;
        {
          py::gil_scoped_release no_gil;
          storage = open(h);
        }
        return py::reinterpret_steal<py::object>(THPStorage_Wrap(std::move(storage)));
      },
      py::arg("device"), py::arg("memory_fd"), py::arg("base_offset"), py::arg("length"), py::arg("offset"),
      py::arg("nbytes"), py::arg("counter_fd"), py::arg("slot"),
      "The neuron storage over memory another process shared (share()'s tuple, with descriptors of this "
      "process; they stay the caller's to close).");
  m.def(
      "collect",
      [] {
        py::gil_scoped_release no_gil;
        return sender().collect();
      },
      "Lets go of shared storages no other process references any more; returns how many.");
  m.def("held", [] { return sender().held(); }, "Storages kept because other processes may reference them.");
  m.def("mapped", [] { return receiver().mapped(); }, "Ranges of other processes' memory mapped here.");
  m.def("is_opened", [](py::handle storage_object) { return is_opened_ipc_memory(unpack_storage(storage_object).data_ptr()); },
        py::arg("storage"), "Whether a neuron storage is memory another process shared with this one.");
}

const bool registered =
    add_python_submodule("ipc", "Neuron storages shared between processes (torch.multiprocessing).", &bind);

}  // namespace

bool is_opened_ipc_memory(const c10::DataPtr& data_ptr) { return data_ptr.get_deleter() == &release_opened; }

}  // namespace neuron
