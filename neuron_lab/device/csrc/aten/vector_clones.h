// Loops compiled for AVX-512 (x86-64-v4) and AVX2 as well as the baseline, chosen once
// at load time by what the CPU has (GCC's function multiversioning, an ifunc per function).
//
// The extension is built for the baseline x86-64 (SSE2) so that one wheel runs on any
// x86 host; the few loops that dominate a kernel's time carry this attribute instead of
// raising the whole build's target. Only for loops whose results cannot depend on the
// instruction set: integer and compare work, and float multiplies with no add next to
// them (an AVX2 or AVX-512 FMA rounds once where the baseline rounds twice).
#pragma once

#define NEURON_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
