// The device's op and transfer counters, all in this file: what each counts, its storage,
// and the values Python reads (neuron_lab.device.trace.device_counters()).
//
// Each is a relaxed atomic that only grows; incrementing one never waits. They count since
// the process started (nothing resets them: readers take differences).
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

namespace neuron {

struct OpCounters {
  std::atomic<uint64_t> fallback_ops{0};     // ops run through the CPU-kernel fallback
  std::atomic<uint64_t> unboxed_ops{0};      // of those, run by the unboxed path (aten/unboxed_ops.cpp)
  std::atomic<uint64_t> output_copies{0};    // fresh CPU results copied into device memory
  std::atomic<uint64_t> host_to_device_bytes{0};
  std::atomic<uint64_t> device_to_host_bytes{0};
  std::atomic<uint64_t> device_to_device_bytes{0};
  std::atomic<uint64_t> bulk_bernoulli_elements{0};  // bernoulli_ elements drawn in bulk (aten/random_kernels.cpp)
  std::atomic<uint64_t> host_kernel_ops{0};  // ops run by a fast host kernel from the table (boxed)
  std::atomic<uint64_t> aliases_recycled{0};  // host aliases re-pointed instead of made (realias)
  std::atomic<uint64_t> aliases_reused{0};    // host aliases handed to a kernel again, as they were (cached_host_alias)
  std::atomic<uint64_t> launches_run_by_waiting_host{0};  // run by a host in wait_for, not a device thread
  std::atomic<uint64_t> launches_run_by_host{0};  // run by the host as it launched them (host_runs_launches)
  std::atomic<uint64_t> device_thread_wakeups{0};  // wake-up calls to device threads (queued work)
  std::atomic<uint64_t> launches_dropped_by_host{0};  // launches a device thread ran, dropped by a host (release_finished_work)
  // Fast host kernels run at once (the unboxed path): each is also a fallback, an unboxed and a
  // host-kernel op, counted once here (one atomic add an op, not three) and added to those
  // three when the counters are read.
  std::atomic<uint64_t> at_once_host_kernel_ops{0};

  // (name, value) of each counter as Python reads it, at_once_host_kernel_ops folded in.
  std::vector<std::pair<const char*, uint64_t>> read() const {
    const uint64_t at_once = at_once_host_kernel_ops.load();
    return {
        {"fallback_ops", fallback_ops.load() + at_once},
        {"unboxed_ops", unboxed_ops.load() + at_once},
        {"output_copies", output_copies.load()},
        {"host_to_device_bytes", host_to_device_bytes.load()},
        {"device_to_host_bytes", device_to_host_bytes.load()},
        {"device_to_device_bytes", device_to_device_bytes.load()},
        {"bulk_bernoulli_elements", bulk_bernoulli_elements.load()},
        {"host_kernel_ops", host_kernel_ops.load() + at_once},
        {"aliases_recycled", aliases_recycled.load()},
        {"aliases_reused", aliases_reused.load()},
        {"launches_run_by_waiting_host", launches_run_by_waiting_host.load()},
        {"launches_run_by_host", launches_run_by_host.load()},
        {"device_thread_wakeups", device_thread_wakeups.load()},
        {"launches_dropped_by_host", launches_dropped_by_host.load()},
    };
  }
};

// The process's counters (never freed: device threads may count while the process exits).
inline OpCounters& op_counters() {
  static auto* counters = new OpCounters();
  return *counters;
}

}  // namespace neuron
