// Random ops that, on the CPU, draw from the host's default generator without
// taking a Generator argument (native_dropout, which F.dropout takes off the CPU).
//
// On neuron they draw from the core's own generator, whose state is a CPU generator
// (generator.cpp), with the CPU kernel's steps spelled out and the generator passed
// explicitly: the same numbers as the CPU's for the same seed, and each step an
// ordinary op, so adaptive eager records them (a training step with dropout stays one
// graph, with no host wait) and replays the draws in stream order.
//
// Dropout's pointwise part is one fused op (neuron::dropout_apply, and neuron::masked_scale
// in its backward) where it applies.
#include "registrations.h"
#include "device/csrc/runtime/runtime.h"
#include "vector_clones.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/bernoulli.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones_like.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace neuron {
namespace {

// ---- dropout's fused pointwise ops (CPU kernels, run by the fallback on device memory) -----
//
// ATen's `x.mul(mask).mul_(scale)` with a bool mask first converts the mask to x's dtype
// in a temporary (mixed dtypes on the CPU), a pass and an allocation as long as x, then
// multiplies twice. These compute the same two roundings per element, (x * m) * scale, in
// one pass: m is exactly 0 or 1 in any dtype, and the scale is rounded to x's dtype first,
// as ATen's mul rounds a scalar.

// Whether the fused loop applies: a float or double input, every other tensor of its
// shape and strides, dense (its elements one block of memory, in any order).
bool dropout_fusable(const at::Tensor& input, std::initializer_list<const at::Tensor*> others = {}) {
  if (input.scalar_type() != at::kFloat && input.scalar_type() != at::kDouble) return false;
  if (!input.is_non_overlapping_and_dense()) return false;
  for (const at::Tensor* t : others) {
    if (t->sizes() != input.sizes() || t->strides() != input.strides()) return false;
  }
  return true;
}

// The loops, vectorized (O3; AVX-512 or AVX2 where the CPU has them, chosen at load time):
// the extension's -O2 leaves loops of mixed types scalar.
#pragma GCC push_options
#pragma GCC optimize("O3")

// out = (x * draw) * scale and keep = draw != 0, from int32 draws of 0 or 1.
template <typename scalar_t>
NEURON_VECTOR_CLONES void apply_draws(const scalar_t* __restrict x, const int32_t* __restrict draws,
                                      scalar_t* __restrict out, bool* __restrict keep, scalar_t scale, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const int32_t draw = draws[i];
    out[i] = (x[i] * static_cast<scalar_t>(draw)) * scale;
    keep[i] = draw != 0;
  }
}

// out = (x * mask) * scale, with a bool mask (its bytes 0 or 1, as ATen converts them).
template <typename scalar_t>
NEURON_VECTOR_CLONES void apply_mask(const scalar_t* __restrict x, const uint8_t* __restrict mask,
                                     scalar_t* __restrict out, scalar_t scale, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * static_cast<scalar_t>(mask[i])) * scale;
}

#pragma GCC pop_options

void check_fusable(const char* op, const at::Tensor& input, std::initializer_list<const at::Tensor*> others) {
  TORCH_CHECK(dropout_fusable(input, others), op, ": takes a dense float or double input and tensors of its "
              "shape and strides (got ", input.scalar_type(), input.sizes(), " with strides ", input.strides(), ")");
}

std::tuple<at::Tensor&, at::Tensor&> dropout_apply_out(const at::Tensor& input, const at::Tensor& draws,
                                                      double scale, at::Tensor& out, at::Tensor& mask) {
  check_fusable("neuron::dropout_apply", input, {&draws, &out, &mask});
  TORCH_CHECK(draws.scalar_type() == at::kInt && mask.scalar_type() == at::kBool && out.dtype() == input.dtype(),
              "neuron::dropout_apply: takes int32 draws and writes a bool mask and a result of the input's dtype");
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "neuron::dropout_apply", [&] {
    const scalar_t* x = input.const_data_ptr<scalar_t>();
    const int32_t* d = draws.const_data_ptr<int32_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    bool* keep = mask.mutable_data_ptr<bool>();
    at::parallel_for(0, input.numel(), at::internal::GRAIN_SIZE, [&](int64_t begin, int64_t end) {
      apply_draws<scalar_t>(x + begin, d + begin, o + begin, keep + begin, static_cast<scalar_t>(scale), end - begin);
    });
  });
  return {out, mask};
}

std::tuple<at::Tensor, at::Tensor> dropout_apply(const at::Tensor& input, const at::Tensor& draws, double scale) {
  auto out = at::empty_like(input);
  auto mask = at::empty_like(input, input.options().dtype(at::kBool));
  dropout_apply_out(input, draws, scale, out, mask);
  return {out, mask};
}

at::Tensor& masked_scale_out(const at::Tensor& input, const at::Tensor& mask, double scale, at::Tensor& out) {
  check_fusable("neuron::masked_scale", input, {&mask, &out});
  TORCH_CHECK(mask.scalar_type() == at::kBool && out.dtype() == input.dtype(),
              "neuron::masked_scale: takes a bool mask and writes a result of the input's dtype");
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "neuron::masked_scale", [&] {
    const scalar_t* x = input.const_data_ptr<scalar_t>();
    const auto* m = reinterpret_cast<const uint8_t*>(mask.const_data_ptr<bool>());
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, input.numel(), at::internal::GRAIN_SIZE, [&](int64_t begin, int64_t end) {
      apply_mask<scalar_t>(x + begin, m + begin, o + begin, static_cast<scalar_t>(scale), end - begin);
    });
  });
  return out;
}

at::Tensor masked_scale(const at::Tensor& input, const at::Tensor& mask, double scale) {
  auto out = at::empty_like(input);
  masked_scale_out(input, mask, scale, out);
  return out;
}

std::tuple<at::Tensor, at::Tensor> dropout_apply_meta(const at::Tensor& input, const at::Tensor& draws,
                                                      double scale) {
  return {at::empty_like(input), at::empty_like(input, input.options().dtype(at::kBool))};
}

at::Tensor masked_scale_meta(const at::Tensor& input, const at::Tensor& mask, double scale) {
  return at::empty_like(input);
}

// ---- bernoulli_(p): ATen's draws, generated in bulk ------------------------------------
//
// Where ATen's CPU kernel does not use MKL (AMD CPUs), bernoulli_(p) draws one element at
// a time: two mt19937 words make a 53-bit uniform u = (hi << 32 | lo) & (2^53 - 1), times
// 2^-53, and the element is u < p. The same words, generated a whole twist of the state at
// a time, and the same comparison (u * 2^-53 < p is v < ceil(p * 2^53) on the integer v,
// exactly), give the same elements and leave the generator in the same state. A check at
// first use compares both on a test generator; where they differ (MKL's kernel on Intel
// CPUs), ATen's runs.

#pragma GCC push_options
#pragma GCC optimize("O3")

// mt19937's next state: the engine's own recurrence (ATen/core/MT19937RNGEngine.h).
NEURON_VECTOR_CLONES void twist_state(uint32_t* state) {
  constexpr int N = at::MERSENNE_STATE_N, M = at::MERSENNE_STATE_M;
  auto twist = [](uint32_t u, uint32_t v) {
    return (((u & at::UMASK) | (v & at::LMASK)) >> 1) ^ ((v & 1u) ? at::MATRIX_A : 0u);
  };
  for (int i = 0; i < N - M; ++i) state[i] = state[i + M] ^ twist(state[i], state[i + 1]);
  for (int i = N - M; i < N - 1; ++i) state[i] = state[i + M - N] ^ twist(state[i], state[i + 1]);
  state[N - 1] = state[M - 1] ^ twist(state[N - 1], state[0]);
}

// The next n words of the engine whose state is `s`, tempered, into `words`.
NEURON_VECTOR_CLONES void mt19937_words(at::mt19937_data_pod& s, uint32_t* words, int64_t n) {
  uint32_t* state = s.state_.data();
  while (n > 0) {
    // The engine twists when a call brings `left_` to 0; it then has N words again.
    if (s.left_ == 1) {
      twist_state(state);
      s.left_ = at::MERSENNE_STATE_N + 1;
      s.next_ = 0;
    }
    const int64_t k = std::min<int64_t>(n, s.left_ - 1);
    const uint32_t* from = state + s.next_;
    for (int64_t i = 0; i < k; ++i) {
      uint32_t y = from[i];
      y ^= (y >> 11);
      y ^= (y << 7) & 0x9d2c5680u;
      y ^= (y << 15) & 0xefc60000u;
      y ^= (y >> 18);
      words[i] = y;
    }
    words += k;
    n -= k;
    s.left_ -= static_cast<int>(k);
    s.next_ += static_cast<uint32_t>(k);
  }
}

// Element i: ((w[2i] << 32 | w[2i+1]) & (2^53 - 1)) < threshold.
template <typename scalar_t>
NEURON_VECTOR_CLONES void bernoulli_from_words(const uint32_t* __restrict words, scalar_t* __restrict out,
                                               uint64_t threshold, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t v = (static_cast<uint64_t>(words[2 * i] & 0x1fffffu) << 32) | words[2 * i + 1];
    out[i] = static_cast<scalar_t>(v < threshold);
  }
}

#pragma GCC pop_options

template <typename scalar_t>
void fill_bernoulli(at::CPUGeneratorImpl* generator, double p, scalar_t* out, int64_t n) {
  // u * 2^-53 < p, for u < 2^53: p * 2^53 is exact (p in [0, 1]).
  const auto threshold = static_cast<uint64_t>(std::ceil(std::ldexp(p, 53)));
  constexpr int64_t kChunk = 4096;  // elements per batch of words (32 KiB of words)
  std::vector<uint32_t> words(2 * std::min(n, kChunk));
  at::mt19937 engine = generator->engine();
  at::mt19937_data_pod state = engine.data();
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t len = std::min(kChunk, n - begin);
    mt19937_words(state, words.data(), 2 * len);
    bernoulli_from_words(words.data(), out + begin, threshold, len);
  }
  engine.set_data(state);
  generator->set_engine(engine);
}

// Whether fill_bernoulli makes ATen's elements on this CPU (checked once, on a generator
// of its own: across twists, from a state part-way through one, for two probabilities).
bool bulk_bernoulli_matches_aten() {
  static const bool matches = [] {
    for (double p : {0.1, 0.73}) {
      auto ours = at::detail::createCPUGenerator(20261203);
      auto aten = at::detail::createCPUGenerator(20261203);
      ours.get<at::CPUGeneratorImpl>()->random();  // start mid-state
      aten.get<at::CPUGeneratorImpl>()->random();
      const int64_t n = 3 * at::MERSENNE_STATE_N + 17;
      auto expected = at::empty({n}, at::kInt).bernoulli_(p, aten);
      std::vector<int32_t> actual(n);
      fill_bernoulli(ours.get<at::CPUGeneratorImpl>(), p, actual.data(), n);
      if (std::memcmp(actual.data(), expected.const_data_ptr<int32_t>(), n * sizeof(int32_t)) != 0) return false;
      if (ours.get<at::CPUGeneratorImpl>()->random() != aten.get<at::CPUGeneratorImpl>()->random()) return false;
    }
    return true;
  }();
  return matches;
}

// neuron::bernoulli_'s CPU kernel: aten::bernoulli_.float's elements, in bulk where they match.
at::Tensor& bulk_bernoulli_(at::Tensor& self, double p, std::optional<at::Generator> generator) {
  const bool bulk = self.is_contiguous() && self.numel() > 0 && p >= 0 && p <= 1 &&
                    (self.scalar_type() == at::kInt || self.scalar_type() == at::kFloat ||
                     self.scalar_type() == at::kDouble || self.scalar_type() == at::kBool) &&
                    bulk_bernoulli_matches_aten();
  if (!bulk) return self.bernoulli_(p, generator);  // ATen's kernel (and its errors)
  auto* gen = at::get_generator_or_default<at::CPUGeneratorImpl>(generator, at::detail::getDefaultCPUGenerator());
  std::lock_guard<std::mutex> lock(gen->mutex_);
  AT_DISPATCH_SWITCH(self.scalar_type(), "neuron::bernoulli_",
                     AT_DISPATCH_CASE(at::kInt, [&] { fill_bernoulli(gen, p, self.mutable_data_ptr<int32_t>(), self.numel()); })
                     AT_DISPATCH_CASE(at::kFloat, [&] { fill_bernoulli(gen, p, self.mutable_data_ptr<float>(), self.numel()); })
                     AT_DISPATCH_CASE(at::kDouble, [&] { fill_bernoulli(gen, p, self.mutable_data_ptr<double>(), self.numel()); })
                     AT_DISPATCH_CASE(at::kBool, [&] { fill_bernoulli(gen, p, self.mutable_data_ptr<bool>(), self.numel()); }));
  op_counters().bulk_bernoulli_elements += static_cast<uint64_t>(self.numel());
  return self;
}

// ---- neuron tensors: native_dropout and bernoulli_ ----------------------------------------------------

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  // What the CPU kernel does, step for step (ATen's native_dropout_cpu).
  if (input.numel() == 0) return {input, at::empty_like(input)};
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  const double keep = 1. - p;
  const double scale = keep == 0 ? 0. : 1. / keep;
  const at::Generator& generator = default_generator(input.device().index());
  if (dropout_fusable(input)) {
    // The same draws (bernoulli_ draws 0 or 1 into int32 for any dtype, then converts),
    // applied in one pass.
    auto draws = at::empty_like(input, input.options().dtype(at::kInt));
    draws.bernoulli_(keep, generator);
    static const auto apply = c10::Dispatcher::singleton()
                                  .findSchemaOrThrow("neuron::dropout_apply", "")
                                  .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                            double)>();
    return apply.call(input, draws, scale);
  }
  auto mask = at::empty_like(input, input.options().dtype(at::kBool));
  mask.bernoulli_(keep, generator);
  auto output = input.mul(mask).mul_(scale);
  return {output, mask};
}

// aten::bernoulli_.float on neuron: neuron::bernoulli_, recorded like any op with a generator.
at::Tensor& bernoulli_(at::Tensor& self, double p, std::optional<at::Generator> generator) {
  // ATen's check, here: a recorded op's error would surface only at the next host wait.
  TORCH_CHECK(0 <= p && p <= 1, "bernoulli_ expects p to be in [0, 1], but got p=", p);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("neuron::bernoulli_", "")
                             .typed<at::Tensor&(at::Tensor&, double, std::optional<at::Generator>)>();
  return op.call(self, p, generator);
}

at::Tensor& bernoulli_meta_(at::Tensor& self, double p, std::optional<at::Generator> generator) { return self; }

at::Tensor native_dropout_backward(const at::Tensor& grad, const at::Tensor& mask, double scale) {
  // ATen's kernel: grad * mask * scale.
  if (dropout_fusable(grad, {&mask}) && mask.scalar_type() == at::kBool) {
    static const auto apply = c10::Dispatcher::singleton()
                                  .findSchemaOrThrow("neuron::masked_scale", "")
                                  .typed<at::Tensor(const at::Tensor&, const at::Tensor&, double)>();
    return apply.call(grad, mask, scale);
  }
  return grad * mask * scale;
}

}  // namespace

void register_neuron_ops_cpu_kernels(torch::Library& m) {
  m.impl("dropout_apply", TORCH_FN(dropout_apply));
  m.impl("dropout_apply.out", TORCH_FN(dropout_apply_out));
  m.impl("masked_scale", TORCH_FN(masked_scale));
  m.impl("masked_scale.out", TORCH_FN(masked_scale_out));
  m.impl("bernoulli_", TORCH_FN(bulk_bernoulli_));
}

void register_neuron_ops_meta_kernels(torch::Library& m) {
  m.impl("dropout_apply", TORCH_FN(dropout_apply_meta));
  m.impl("masked_scale", TORCH_FN(masked_scale_meta));
  m.impl("bernoulli_", TORCH_FN(bernoulli_meta_));
}

void register_random_kernels(torch::Library& m) {
  m.impl("native_dropout", TORCH_FN(native_dropout));
  m.impl("native_dropout_backward", TORCH_FN(native_dropout_backward));
  m.impl("bernoulli_.float", TORCH_FN(bernoulli_));
}

}  // namespace neuron

