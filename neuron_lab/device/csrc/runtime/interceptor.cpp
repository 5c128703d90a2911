// The device's side of the interceptor interface (interceptor.h).
#include "interceptor.h"

#include "runtime.h"

#include <atomic>

namespace neuron {
namespace {

OpInterceptor& run_at_once() {
  static auto* none = new OpInterceptor();
  return *none;
}

std::atomic<OpInterceptor*> g_interceptor{nullptr};

}  // namespace

void OpInterceptor::before_host_access(c10::ArrayRef<at::Tensor> tensors, Reason /*reason*/, std::string_view /*what*/) {
  for (const auto& t : tensors) {
    if (t.defined() && t.device().type() == kNeuron) materialize(t.storage());
  }
}

bool OpInterceptor::begin_unboxed_op(c10::ArrayRef<const at::Tensor*> tensors, std::string_view /*what*/) {
  for (const at::Tensor* t : tensors) materialize(t->storage());
  return true;
}

OpInterceptor& interceptor() {
  OpInterceptor* runtime = g_interceptor.load(std::memory_order_acquire);
  return runtime != nullptr ? *runtime : run_at_once();
}

void set_interceptor(OpInterceptor* runtime) { g_interceptor.store(runtime, std::memory_order_release); }

}  // namespace neuron
