// What the fast path's at-once kernels share (device/csrc/host_kernel_table.h's AtOnceKernel):
// new device memory for their results, and the launch each runs as.
#pragma once

#include "device/csrc/runtime/runtime.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>

#include <atomic>
#include <optional>
#include <utility>

namespace neuron::fastpath {

// New device memory for a kernel's result (row-major, or of the given strides).
inline at::Tensor new_result(c10::IntArrayRef sizes, at::ScalarType dtype) {
  return at::detail::empty_generic(sizes, allocator(), kNeuronKeys, dtype, std::nullopt);
}
inline at::Tensor new_result(c10::IntArrayRef sizes, c10::IntArrayRef strides, at::ScalarType dtype) {
  return at::detail::empty_strided_generic(sizes, strides, allocator(), kNeuronKeys, dtype);
}

// Runs `make` (which makes and writes the results) as an op run at once on `device`: a launch
// for the profiler, counted as a fast host kernel's op (device_counters' host_kernel_ops).
template <class Make>
auto run_at_once(c10::DeviceIndex device, const char* name, Make&& make) {
  c10::DeviceGuard guard(c10::Device(kNeuron, device));
  LaunchScope launch(device, name, /*synced=*/true);
  auto results = make();
  op_counters().at_once_host_kernel_ops.fetch_add(1, std::memory_order_relaxed);
  return results;
}

// A new result on `device`, written by `write` as an op run at once.
template <class Write>
at::Tensor write_new_result(c10::DeviceIndex device, const char* name, c10::IntArrayRef sizes, at::ScalarType dtype,
                            Write&& write) {
  return run_at_once(device, name, [&] {
    at::Tensor out = new_result(sizes, dtype);
    write(out);
    return out;
  });
}
// The same, of the given strides.
template <class Write>
at::Tensor write_new_result(c10::DeviceIndex device, const char* name, c10::IntArrayRef sizes,
                            c10::IntArrayRef strides, at::ScalarType dtype, Write&& write) {
  return run_at_once(device, name, [&] {
    at::Tensor out = new_result(sizes, strides, dtype);
    write(out);
    return out;
  });
}

}  // namespace neuron::fastpath
