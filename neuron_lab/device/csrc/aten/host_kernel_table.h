// The device's seam for fast host kernels: one table of kernels that give an op's results
// with ATen's bits, for the inputs each takes, without ATen's CPU kernel.
//
// The device runs every op with ATen's CPU kernel over host memory. An optional package above
// it (neuron_lab/fastpath) registers faster kernels here when the extension loads, as a
// runtime registers its OpInterceptor; the device knows none of them. Every path that runs an
// op on the host reads this one table:
//   - run_host_kernel (runtime.h): the boxed fallback, and replay and tiled runs of a recorded
//     graph, take a BOXED kernel, over the CPU tensors on the op's stack;
//   - the unboxed path (unboxed_ops.cpp) takes an AT-ONCE kernel of the op's own signature,
//     over the neuron tensors the runtime readied, whose results are new device memory;
//   - a structured op's functional form that is recorded, not run, takes an EMPTY-RESULT
//     kernel: its result made empty on the device with ATen's sizes, strides and dtype.
//
// A kernel is a plan and a run in one call: it first checks that it takes the arguments (its
// plan: what it computes, the result's layout) and returns "declined", having touched
// nothing, where it does not; then it runs. Declined calls take ATen's kernel, with ATen's
// semantics, warnings and errors. The contract of every kernel: for what it takes, the result
// equals ATen's bit for bit (dtype, sizes, strides, every byte; a NaN may differ from ATen's
// NaN only where IEEE 754 leaves the payload open, both being NaN).
//
// The mode says how the table is read:
//   Off       no kernel runs: only ATen's (device_counters()["host_kernel_ops"] stays 0);
//   On        a kernel runs where it takes the call;
//   Validate  a kernel that takes the call runs, ATen's kernel runs on a replica of the same
//             inputs, and the first differing bit raises, naming the kernel and the inputs.
// The table starts Off: the package that registers kernels turns it on once it has checked
// that it was validated on this torch.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

namespace c10 {
class OperatorHandle;
}  // namespace c10

namespace neuron {

enum class FastPath : uint8_t { Off, On, Validate };
FastPath fast_path() noexcept;
void set_fast_path(FastPath mode);

// What the table knows of a kernel: its name (validate's errors name it), its family (a
// group of kernels switched on and off together, measured together), and the ATen kernel
// whose results it gives.
struct HostKernelInfo {
  const char* kernel;
  const char* family;
  const char* mirrors;
};

enum class HostKernelPath : uint8_t { Boxed, AtOnce, EmptyResult };

// ---- boxed kernels -------------------------------------------------------------------------

// Runs the op over CPU tensors: `args` are the stack's last `n_args` values (out_arg the
// out= argument, else null). Takes the call (pops the arguments, pushes the results, true)
// or declines it (the stack untouched, false).
using BoxedHostKernel = bool (*)(const c10::IValue* args, const c10::IValue* out_arg, torch::jit::Stack* stack,
                                 size_t n_args);
// `n_args` counts out= too, the last argument of an out_variant.
void register_boxed_host_kernel(const char* op, const char* overload, size_t n_args, bool out_variant,
                                BoxedHostKernel kernel, const HostKernelInfo& info);

// ---- at-once and empty-result kernels: typed by the op's signature -------------------------

// An at-once kernel of an op `R(A...)` is `std::optional<R'>(DeviceIndex, A...)`: its
// results on that core (R' = std::reference_wrapper<at::Tensor> where the op returns the
// argument it wrote), or nullopt where it declines. It readies nothing: the unboxed path
// calls it once the runtime made its arguments' memory ready, inside the op's launch. The
// kernels of clone and _to_copy, which the unboxed path does not wrap, ready their tensors
// themselves (interceptor().begin_unboxed_op, after their plan took the call).
template <class R>
struct AtOnceValue {
  using type = R;
};
template <>
struct AtOnceValue<at::Tensor&> {
  using type = std::reference_wrapper<at::Tensor>;
};
template <class Schema>
struct AtOnceSignature;
template <class R, class... A>
struct AtOnceSignature<R(A...)> {
  using Result = std::optional<typename AtOnceValue<R>::type>;
  using Kernel = Result (*)(c10::DeviceIndex, A...);
  using EmptyResult = std::optional<at::Tensor> (*)(A...);
};
template <class Op>
using AtOnceKernel = typename AtOnceSignature<typename Op::schema>::Kernel;
// An empty-result kernel: the new, empty device tensor that the op's functional form would
// make for its out= form (ATen's sizes, strides, dtype), or nullopt.
template <class Op>
using EmptyResultKernel = typename AtOnceSignature<typename Op::schema>::EmptyResult;

struct TypedHostKernel;  // an entry of the table (host_kernel_table.cpp)

namespace table_detail {
using AnyFunction = void (*)();
void add(const char* op, const char* overload, HostKernelPath path, AnyFunction fn, const std::type_info& type,
         const HostKernelInfo& info);
// The entry for this op, path and signature, or null; found once per call site.
const TypedHostKernel* find(const char* op, const char* overload, HostKernelPath path, const std::type_info& type);
AnyFunction function(const TypedHostKernel& entry);
bool usable(const TypedHostKernel& entry) noexcept;
}  // namespace table_detail

template <class Op>
void register_at_once_kernel(AtOnceKernel<Op> kernel, const HostKernelInfo& info) {
  table_detail::add(Op::name, Op::overload_name, HostKernelPath::AtOnce,
                    reinterpret_cast<table_detail::AnyFunction>(kernel), typeid(AtOnceKernel<Op>), info);
}
template <class Op>
void register_empty_result_kernel(EmptyResultKernel<Op> kernel, const HostKernelInfo& info) {
  table_detail::add(Op::name, Op::overload_name, HostKernelPath::EmptyResult,
                    reinterpret_cast<table_detail::AnyFunction>(kernel), typeid(EmptyResultKernel<Op>), info);
}

// The entry of Op's at-once (or empty-result) kernel when there is one and the mode and its
// family let it run now; null otherwise.
template <class Op>
const TypedHostKernel* usable_at_once_kernel() {
  static const TypedHostKernel* const entry =
      table_detail::find(Op::name, Op::overload_name, HostKernelPath::AtOnce, typeid(AtOnceKernel<Op>));
  return entry != nullptr && table_detail::usable(*entry) ? entry : nullptr;
}
template <class Op>
const TypedHostKernel* usable_empty_result_kernel() {
  static const TypedHostKernel* const entry =
      table_detail::find(Op::name, Op::overload_name, HostKernelPath::EmptyResult, typeid(EmptyResultKernel<Op>));
  return entry != nullptr && table_detail::usable(*entry) ? entry : nullptr;
}
template <class Op>
AtOnceKernel<Op> at_once_function(const TypedHostKernel& entry) {
  return reinterpret_cast<AtOnceKernel<Op>>(table_detail::function(entry));
}
template <class Op>
EmptyResultKernel<Op> empty_result_function(const TypedHostKernel& entry) {
  return reinterpret_cast<EmptyResultKernel<Op>>(table_detail::function(entry));
}
const HostKernelInfo& info_of(const TypedHostKernel& entry);

// ---- validation ------------------------------------------------------------------------------

// The arguments of a call as validate's errors name them: each tensor's dtype, sizes and
// strides, and its values where it is a small CPU tensor.
std::string describe_inputs(c10::ArrayRef<c10::IValue> inputs);
// Raises, naming the kernel, the op and the inputs, where `got` (a kernel's result
// `index`, on the host) is not `expected` (ATen's) bit for bit: dtype, sizes, strides
// (unless `compare_strides` is false: an out= result keeps the caller's), then each element's
// bytes, the first differing one named with both values.
void check_same_bits(const HostKernelInfo& info, const std::string& op, const std::string& inputs, size_t index, const at::Tensor& got, const at::Tensor& expected, bool compare_strides = true);
// The same for an empty-result kernel: only dtype, sizes and strides.
void check_same_layout(const HostKernelInfo& info, const std::string& op, const std::string& inputs,
                       const at::Tensor& got, const at::Tensor& expected);
// Test hook: validate mode flips one bit of this kernel's first result before comparing
// (the name of a kernel, or empty: none), so that tests can see validation catch it.
void perturb_kernel_for_tests(const std::string& kernel);
// Flips the lowest bit of `result`'s first byte when `info` names the perturbed kernel.
void apply_test_perturbation(const HostKernelInfo& info, const at::Tensor& result);

// ---- what the table holds --------------------------------------------------------------------

struct HostKernelListing {
  std::string op;  // "aten::add.out"
  HostKernelPath path;
  HostKernelInfo info;
};
std::vector<HostKernelListing> host_kernel_listing();
// Families switched off run ATen's kernels (benchmarks measure what each family gains).
void set_family_enabled(const std::string& family, bool enabled);
bool family_enabled(const std::string& family);

}  // namespace neuron
