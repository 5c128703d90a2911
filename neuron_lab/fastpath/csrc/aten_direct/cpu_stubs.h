// ATen's dispatch stubs run the CPU's kernels for the device too.
//
// A structured CPU op (cos, silu, ...) builds a TensorIterator and calls its dispatch stub
// for the iterator's device type. The device's tensors are host memory, so the CPU's
// kernel is the right one for them: with the stub's PrivateUse1 entry pointing at it, the
// op's own structured class (meta, then impl) runs on the device's tensors directly, as
// the CPU runs it on its own (unboxed_ops.cpp), with no host aliases. The kernel chosen is
// the one the stub itself chooses on this CPU (its AVX512 entry when ATen runs AVX512 and
// has one, else AVX2, else the default): the CPU's bits.
#pragma once

namespace neuron::fastpath {

// The x86 capability ATen's CPU kernels run with ("AVX512", "AVX2" or "DEFAULT", which
// ATEN_CPU_CAPABILITY can lower), or nullptr on a build this file does not know (not x86):
// host kernels that reproduce an ATen kernel's order of operations take only known ones.
const char* aten_x86_capability();

// Whether the stubs of the ops unboxed_ops.cpp runs through their structured classes point
// at the CPU's kernels for PrivateUse1 (done on the first call). False where this build
// cannot (a non-x86 torch): those ops then keep the host-alias path.
bool device_stubs_run_cpu_kernels();

}  // namespace neuron::fastpath
