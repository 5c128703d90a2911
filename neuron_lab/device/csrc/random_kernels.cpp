// Random ops that, on the CPU, draw from the host's default generator without
// taking a Generator argument (native_dropout, which F.dropout takes off the CPU).
//
// On neuron they draw from the core's own generator, whose state is a CPU generator
// (generator.cpp), with the CPU kernel's steps spelled out and the generator passed
// explicitly: the same numbers as the CPU's for the same seed, and each step an
// ordinary op, so adaptive eager records them (a training step with dropout stays one
// graph, with no host wait) and replays the draws in stream order.
#include "runtime.h"

#include <ATen/ops/bernoulli.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones_like.h>
#include <torch/library.h>

namespace neuron {
namespace {

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  // What the CPU kernel does, step for step (ATen's native_dropout_cpu).
  if (input.numel() == 0) return {input, at::empty_like(input)};
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  const double keep = 1. - p;
  const double scale = keep == 0 ? 0. : 1. / keep;
  auto mask = at::empty_like(input, input.options().dtype(at::kBool));
  mask.bernoulli_(keep, default_generator(input.device().index()));
  auto output = input.mul(mask).mul_(scale);
  return {output, mask};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("native_dropout", TORCH_FN(native_dropout)); }

}  // namespace neuron
