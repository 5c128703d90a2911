// Why the host waits for the device, or a runtime launches what it has buffered.
//
// One typed value crosses every layer: the device passes it to the runtime's
// interceptor, the trace logs it with each host wait, the runtime counts flushes
// by it, and Python (neuron_lab.device.trace.Reason) explains a slow region from
// it. `what` beside a reason names the op or kernel when there is one.
#pragma once

#include <cstdint>

namespace neuron {

enum class Reason : uint8_t {
  None = 0,  // an event that is not a wait or a flush
  // The host touches device memory.
  HostRead,          // an op whose result is a host value (.item(), bool(), equal)
  CopyToHost,        // .cpu(), .numpy(), printing
  CopyFromHost,      // a host copy into a tensor the device still uses
  CopyBetweenCores,  // neuron:0 -> neuron:1
  InlineOp,          // an op that runs on the host thread and needs its inputs now
  MetadataChange,    // resize_, set_, transpose_, ...: launches read metadata when they run
  CustomKernel,      // a neuron_lab.kernels kernel: one launch by design
  CompiledGraph,     // a torch.compile graph run as one launch
  Collective,        // a torch.distributed collective: one launch, the ranks' data meet on the host
  // The user's code orders or waits for the device.
  Synchronize,
  EventSynchronize,
  EventRecord,
  StreamQuery,
  StreamWait,
  StreamSwitch,
  MemoryStatistics,
  MemorySnapshot,
  OutOfMemory,  // a request did not fit: launches that hold memory run and give it back first
  RandomState,  // reading or seeding the generator
  RandomOp,     // a random op that runs at once draws from the generator in order
  ModeChange,
  Exit,
  ExplicitFlush,
  // The runtime's own flush policy.
  Eager,             // eager mode (or deterministic algorithms): every op is a launch
  OpLimit,           // the buffer holds policy().max_ops ops
  ThreadSwitch,      // another thread records on the stream
  BackwardStart,     // autograd's backward pass starts
  CachedGraphEnd,    // the buffer reached the end of the cached graph it follows
  DeviceIdle,        // the device has nothing to do
  ResultBytes,       // the buffer's results reached policy().max_bytes
  ProbeMiss,         // a probe (RepeatTracker) records ops no cached graph holds: it ends now
  CompiledGraphEnd,  // a torch.compile graph recorded whole
  kCount
};
constexpr int kReasons = static_cast<int>(Reason::kCount);

// "copy to host", "op limit", ...: the words users see in counters and explanations.
const char* reason_name(Reason reason);

// The host reads device memory (a value or a copy): a wait, never a fusion boundary of its own.
constexpr bool is_host_read(Reason reason) { return reason == Reason::HostRead || reason == Reason::CopyToHost; }

}  // namespace neuron
