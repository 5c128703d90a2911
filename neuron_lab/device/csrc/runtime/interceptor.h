// The one interface between the device and a runtime that records ops (adaptive eager).
//
// The device (allocator, executor and streams, generator, pending storage, the boxed
// fallback, trace) knows nothing of the runtime above it: it calls the registered
// OpInterceptor at the points below. A runtime registers one when it loads
// (set_interceptor). With none registered, every op runs at once on the caller's
// thread, as the defaults here do; a registered runtime that is inactive (blocking
// mode) behaves the same way.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Stream.h>

#include "device/csrc/tracing/reason.h"

#include <string>
#include <string_view>
#include <vector>

namespace neuron {

class OpInterceptor {
 public:
  virtual ~OpInterceptor() = default;

  // Whether ops are intercepted at all now (false: every op runs at once).
  virtual bool active() const { return false; }

  // An op on neuron tensors about to run through the fallback: true if it was recorded
  // instead (its results are on the stack, their memory pending until a launch).
  virtual bool try_record(const c10::OperatorHandle& op, torch::jit::Stack* stack) { return false; }
  // dst.copy_(src) from host memory without waiting for the device; false: run it now.
  virtual bool try_copy_from_host(const at::Tensor& dst, const at::Tensor& src) { return false; }

  // Before the calling thread touches these tensors' memory (an op run inline, a host
  // read or write, a metadata change): whatever they depend on is launched and waited
  // for, and pending memory is given device memory. The default only does the last.
  // `what` names the op or kernel, if any.
  virtual void before_host_access(c10::ArrayRef<at::Tensor> tensors, Reason reason, std::string_view what);
  // A hot op about to run now on this thread through the device's unboxed path
  // (unboxed_ops.cpp), which skips boxing its arguments: true if the runtime would run
  // it at once anyway and has readied these tensors as before_host_access would;
  // false: take the boxed fallback (which may record it). end_unboxed_op follows a
  // true, after the kernel. The default runs everything now.
  virtual bool begin_unboxed_op(c10::ArrayRef<const at::Tensor*> tensors, std::string_view what);
  virtual void end_unboxed_op() {}
  // Raises if a tensor's value was never computed (a launch that should have written it
  // failed). The default has nothing to check.
  virtual void check_readable(const at::Tensor& t) {}
  // The host wrote this tensor: its value is valid again.
  virtual void note_written(const at::Tensor& t) {}
  // An op that just ran at once (its results on the stack): what the runtime can learn
  // from it to record the next such call.
  virtual void after_inline_run(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {}

  // Whether ops are buffered, not yet launched, on any device (a random op run now must
  // draw after them).
  virtual bool holds_ops() const { return false; }

  // Whether new tensors are created pending (memory given when their launch runs).
  virtual bool defers_allocation() const { return false; }
  // A tensor an empty kernel just made, pending, for a structured op's output.
  virtual void note_fresh_output(const at::Tensor& t) {}

  // Launch what is buffered on a stream, or on every stream of a device (-1: all
  // devices), before the device waits for or orders that stream.
  virtual void flush_stream(c10::Stream stream, Reason reason) {}
  virtual void flush_device(c10::DeviceIndex device, Reason reason) {}
  // The host is about to wait for a stream or a device (for the runtime's counters).
  virtual void note_sync(Reason reason, std::string_view what) {}
  // empty_cache(): host memory the runtime keeps for later launches, and that nothing
  // uses now, goes back to the host as the device's cached blocks do.
  virtual void release_cached_memory() {}
};

// The registered runtime's interceptor, or the device's own (run everything at once).
OpInterceptor& interceptor();

// Ends what a true begin_unboxed_op began, however the kernel after it returns.
struct UnboxedOpScope {
  UnboxedOpScope() = default;
  UnboxedOpScope(const UnboxedOpScope&) = delete;
  UnboxedOpScope& operator=(const UnboxedOpScope&) = delete;
  ~UnboxedOpScope() { interceptor().end_unboxed_op(); }
};
// Registers the runtime's interceptor when it loads; it must live as long as the
// process. nullptr unregisters it.
void set_interceptor(OpInterceptor* runtime);

}  // namespace neuron
