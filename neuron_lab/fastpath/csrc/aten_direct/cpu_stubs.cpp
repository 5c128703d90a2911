// ATen's dispatch stubs run the CPU's kernels for the device too (cpu_stubs.h).
//
// The stubs' per-capability kernel pointers (DispatchStub::DEFAULT, AVX2, AVX512) are
// exported, but declared only where ATen's build defines HAVE_<capability>_CPU_DEFINITION;
// this file defines them for x86 to read those pointers, and calls nothing else of the
// stubs (their lookup functions are ATen's own).
#if defined(__x86_64__) || defined(_M_X64)
#define HAVE_AVX512_CPU_DEFINITION
#define HAVE_AVX2_CPU_DEFINITION
#endif
#include "fastpath/csrc/aten_direct/cpu_stubs.h"

#include <ATen/Version.h>  // at::get_cpu_capability
#include <ATen/native/Activation.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/UnaryOps.h>

#include <string>
#include <string_view>

namespace neuron::fastpath {
namespace {

#if defined(__x86_64__) || defined(_M_X64)
// The kernel the stub runs for the CPU: choose_cpu_impl's order for ATen's capability.
template <class Stub>
typename Stub::FnPtr cpu_kernel_of(std::string_view capability) {
  if (capability == "AVX512" && Stub::AVX512 != nullptr) return Stub::AVX512;
  if ((capability == "AVX512" || capability == "AVX2") && Stub::AVX2 != nullptr) return Stub::AVX2;
  return Stub::DEFAULT;
}

template <class Stub>
bool point_at_cpu_kernel(Stub& stub, std::string_view capability) {
  const auto kernel = cpu_kernel_of<Stub>(capability);
  if (kernel == nullptr) return false;
  stub.set_privateuse1_dispatch_ptr(kernel);
  return true;
}
#endif

bool point_device_stubs_at_cpu_kernels() {
#if defined(__x86_64__) || defined(_M_X64)
  const char* capability = aten_x86_capability();
  if (capability == nullptr) return false;
  namespace native = at::native;
  bool ok = true;
  ok = point_at_cpu_kernel(native::cos_stub, capability) && ok;
  ok = point_at_cpu_kernel(native::sin_stub, capability) && ok;
  ok = point_at_cpu_kernel(native::tanh_stub, capability) && ok;
  ok = point_at_cpu_kernel(native::silu_stub, capability) && ok;
  return ok;
#else
  return false;
#endif
}

}  // namespace

const char* aten_x86_capability() {
#if defined(__x86_64__) || defined(_M_X64)
  static const char* const known = [] {
    const std::string capability = at::get_cpu_capability();
    for (const char* name : {"AVX512", "AVX2", "DEFAULT"}) {
      if (capability == name) return name;
    }
    return static_cast<const char*>(nullptr);
  }();
  return known;
#else
  return nullptr;
#endif
}

bool device_stubs_run_cpu_kernels() {
  static const bool pointed = point_device_stubs_at_cpu_kernels();
  return pointed;
}

}  // namespace neuron::fastpath
