// Device memory that other processes can map: the allocator's segments (segment_memory.h).
//
// Each core's memory is one memory file (memfd_create), grown as segments are reserved;
// a segment is a page-aligned range of that file mapped MAP_SHARED, so a process given
// the file's descriptor and the range maps the same pages (torch.multiprocessing shares
// neuron tensors that way: ipc.cpp, sharing.py). One file per core keeps the process's
// descriptors to a handful however many segments exist. Ranges of the file are handed
// out first fit; a released segment's pages go back to the host at once (a hole punched
// in the file) and its range is reused. Untouched pages take no memory, as with malloc.
#include "segment_memory.h"
#include "runtime.h"

#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <malloc.h>
#include <map>
#include <mutex>
#include <string>
#include <sys/mman.h>
#include <unistd.h>

namespace neuron {
namespace {

constexpr uint64_t kPage = 4096;

uint64_t round_to_pages(uint64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

struct CoreFile {
  int fd = -1;
  uint64_t size = 0;                        // bytes of the file: the end of the last range in use
  std::map<uint64_t, uint64_t> free_ranges;  // offset -> length, below `size`, never adjacent
};

struct Segment {
  c10::DeviceIndex device;
  uint64_t offset;  // in the core's file
  uint64_t length;  // mapped bytes (whole pages)
};

struct SegmentMemory {
  std::mutex mutex;
  std::array<CoreFile, kMaxCores> files;
  std::map<uintptr_t, Segment> segments;  // by base address

  // A range of `length` bytes of the core's file (first fit, else at its end).
  bool take_range(CoreFile& file, uint64_t length, uint64_t* offset) {
    for (auto it = file.free_ranges.begin(); it != file.free_ranges.end(); ++it) {
      if (it->second < length) continue;
      *offset = it->first;
      const uint64_t rest = it->second - length;
      file.free_ranges.erase(it);
      if (rest > 0) file.free_ranges.emplace(*offset + length, rest);
      return true;
    }
    if (ftruncate(file.fd, static_cast<off_t>(file.size + length)) != 0) return false;
    *offset = file.size;
    file.size += length;
    return true;
  }

  // Returns a range to the file, merged with its free neighbours; a range that ends the
  // file shortens it instead.
  void give_range(CoreFile& file, uint64_t offset, uint64_t length) {
    auto next = file.free_ranges.lower_bound(offset);
    if (next != file.free_ranges.end() && next->first == offset + length) {
      length += next->second;
      next = file.free_ranges.erase(next);
    }
    if (next != file.free_ranges.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == offset) {
        offset = prev->first;
        length += prev->second;
        file.free_ranges.erase(prev);
      }
    }
    if (offset + length == file.size) {
      if (ftruncate(file.fd, static_cast<off_t>(offset)) == 0) {
        file.size = offset;
        return;
      }
    }
    file.free_ranges.emplace(offset, length);
  }
};

// Leaked on purpose: segments may be released while the process exits.
SegmentMemory& memory() {
  static auto* m = new SegmentMemory();
  return *m;
}

int open_core_file(c10::DeviceIndex device) {
  const std::string name = "neuron_lab:neuron:" + std::to_string(device);
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  TORCH_CHECK(fd >= 0, "neuron: could not create the memory file of neuron:", int(device), " (memfd_create: ",
              std::strerror(errno), "); device memory is shared memory so that processes can share tensors");
  // From now on a forked child shares these pages with this process: it must not use them.
  note_device_started();
  return fd;
}

// The devices' memory is the host's, so memory the host program freed (a model's CPU
// weights after .to("neuron")) but the C library's heap kept counts twice in the process's
// footprint while the devices take new pages for the same data: ResNet-18's peak RSS held
// its 42 MiB of CPU weights through training. Each time the devices have taken another
// kTrimEveryBytes, the heap's free pages go back to the host first (glibc's malloc_trim: a
// few milliseconds, a handful of times as a program starts).
constexpr uint64_t kTrimEveryBytes = 64 << 20;

void give_freed_heap_back(uint64_t taken) {
#if defined(__GLIBC__)
  static std::atomic<uint64_t> since_trim{0};
  if (since_trim.fetch_add(taken, std::memory_order_relaxed) + taken < kTrimEveryBytes) return;
  since_trim.store(0, std::memory_order_relaxed);
  malloc_trim(0);
#else
  (void)taken;
#endif
}

}  // namespace

void* allocate_segment(c10::DeviceIndex device, size_t bytes) {
  check_not_forked();
  auto& m = memory();
  const uint64_t length = round_to_pages(bytes);
  give_freed_heap_back(length);
  std::lock_guard<std::mutex> lock(m.mutex);
  CoreFile& file = m.files[device];
  if (file.fd < 0) file.fd = open_core_file(device);
  uint64_t offset = 0;
  if (!m.take_range(file, length, &offset)) return nullptr;
  void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, file.fd, static_cast<off_t>(offset));
  if (base == MAP_FAILED) {
    m.give_range(file, offset, length);
    return nullptr;
  }
  m.segments.emplace(reinterpret_cast<uintptr_t>(base), Segment{device, offset, length});
  return base;
}

void release_segment(void* base) {
  if (in_bad_fork()) return;  // the pages are the parent's too
  auto& m = memory();
  std::lock_guard<std::mutex> lock(m.mutex);
  auto it = m.segments.find(reinterpret_cast<uintptr_t>(base));
  TORCH_INTERNAL_ASSERT(it != m.segments.end(), "neuron: released a segment that was never allocated");
  const Segment segment = it->second;
  m.segments.erase(it);
  munmap(base, segment.length);
  CoreFile& file = m.files[segment.device];
  // The pages go back to the host now; a process that mapped them keeps its mapping and
  // would read zeros (ipc.cpp keeps shared blocks allocated until their receivers let go).
  fallocate(file.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(segment.offset),
            static_cast<off_t>(segment.length));
  m.give_range(file, segment.offset, segment.length);
}

bool find_segment(const void* ptr, MemoryLocation* location) {
  auto& m = memory();
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(m.mutex);
  auto next = m.segments.upper_bound(address);
  if (next == m.segments.begin()) return false;
  const auto& [base, segment] = *std::prev(next);
  if (address >= base + segment.length) return false;
  location->device = segment.device;
  location->fd = m.files[segment.device].fd;
  location->base_offset = segment.offset;
  location->length = segment.length;
  location->base = reinterpret_cast<const void*>(base);
  return true;
}

}  // namespace neuron
