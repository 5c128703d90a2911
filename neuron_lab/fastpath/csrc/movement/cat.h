// torch.cat of small row-major tensors as block copies, without ATen's machinery.
//
// A decoding loop concatenates each token's keys and values onto its cache ([1, 4, L, 8]
// with [1, 4, 1, 8]), and its ids and masks ([1, L] with [1, 1]). A cat's result is its
// inputs' bytes rearranged, so copying blocks gives ATen's bits. This takes only what keeps
// the result ATen's too: inputs of one dtype and rank, row-major (strides included for
// size-1 dims) with ATen's contiguous memory format suggested, no conjugate or negative
// bits, sizes equal but along `dim`, and at most GRAIN_SIZE elements in all (above that
// ATen copies in parallel). Anything else is left to ATen's kernel, with its semantics,
// warnings and errors.
#pragma once

#include <ATen/core/ATen_fwd.h>
#include <ATen/core/IListRef.h>
#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <optional>

namespace neuron::fastpath {

struct DenseCat {
  c10::SmallVector<int64_t, 6> sizes;  // the result's
  int64_t dim;                         // wrapped
};

// The plan for cat(tensors, dim), or nullopt when the block copy does not take them.
std::optional<DenseCat> plan_dense_cat(const at::ITensorListRef& tensors, int64_t dim);

// Writes cat(tensors, dim) into `out`, a row-major tensor of `plan.sizes` and the inputs'
// dtype that overlaps none of them. The caller makes the inputs' memory ready.
void run_dense_cat(const DenseCat& plan, const at::ITensorListRef& tensors, const at::Tensor& out);

}  // namespace neuron::fastpath
