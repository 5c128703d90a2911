// Device memory that other processes can map (segment_memory.cpp), and the memory this
// process mapped from others (ipc.cpp).
//
// The allocator's segments are pages of one memory file per core (memfd, mapped
// MAP_SHARED), so any block of device memory is a range of a file: another process that
// is given the file's descriptor maps the same pages, as CUDA's IPC handles open the same
// device memory in another process.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>

namespace neuron {

// A new segment of `bytes` of device memory of `device`, zero-filled and 4 KiB-aligned;
// nullptr when the host has no memory for it. Raises in a process forked after the device
// started (the parent's memory file is shared with it).
void* allocate_segment(c10::DeviceIndex device, size_t bytes);
// Gives a segment from allocate_segment back to the host. Does nothing in a forked child:
// the pages are the parent's too.
void release_segment(void* base);

// Where a byte of device memory lives: `offset` bytes into the memory file `fd`, inside a
// mapping that starts `base_offset` bytes into the file at address `base` and is `length`
// bytes long (a segment, or a range this process mapped from another).
struct MemoryLocation {
  c10::DeviceIndex device = -1;
  int fd = -1;  // owned by the memory module: dup it to pass it on
  uint64_t base_offset = 0;
  uint64_t length = 0;
  const void* base = nullptr;
};
// The segment of this process's device memory that holds `ptr`; false if none does.
bool find_segment(const void* ptr, MemoryLocation* location);

// Whether a DataPtr is memory another process shared with this one (ipc.cpp): device
// memory this process's allocator does not own or count.
bool is_opened_ipc_memory(const c10::DataPtr& data_ptr);

}  // namespace neuron
