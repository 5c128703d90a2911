// index_select of a contiguous tensor as block copies, without ATen's machinery.
//
// A decoding loop looks up each token's embedding rows (index_select of a [vocab, hidden]
// weight, twice a step for GPT-2's token and position tables). The result is the selected
// slices' bytes in order, so copying them gives ATen's bits. This takes only what keeps the
// result ATen's: a contiguous self of at least one dim with bytes that are its values, an
// int64 or int32 index of at most one dim, contiguous, every entry in range (ATen raises on
// others), and a result of at most GRAIN_SIZE elements. Anything else is left to ATen's
// kernel, with its semantics, warnings and errors.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <optional>

namespace neuron::fastpath {

struct DenseIndexSelect {
  c10::SmallVector<int64_t, 6> sizes;  // the result's, contiguous
  int64_t dim;                         // wrapped
};

// The plan for index_select(self, dim, index), or nullopt. Reads the index's values: the
// caller makes its memory ready.
std::optional<DenseIndexSelect> plan_dense_index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index);

// Writes the selection into `out`, a contiguous tensor of `plan.sizes` and self's dtype.
void run_dense_index_select(const DenseIndexSelect& plan, const at::Tensor& self, const at::Tensor& index,
                            const at::Tensor& out);

}  // namespace neuron::fastpath
