// Small sum and mean over rows in ATen's order of additions (sum.h says what they take).
#include "fastpath/csrc/reductions/sum.h"

#include "device/csrc/aten/dense_layout.h"
#include "device/csrc/aten/vector_clones.h"

#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE
#include <ATen/Version.h>         // at::get_cpu_capability

#include <array>
#include <cstring>
#include <string>

namespace neuron::fastpath {
namespace {

// The x86 capability ATen's CPU kernels run with ("AVX512", "AVX2" or "DEFAULT", which
// ATEN_CPU_CAPABILITY can lower), or nullptr on a build this file does not know (not x86):
// the kernel reproduces the order of additions of ATen's x86 kernels only.
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

// The width of ATen's vectors in its sum kernel: 32 bytes (8 floats, 4 doubles) under every
// x86 capability. SumKernel.cpp registers with REGISTER_DISPATCH, which leaves the AVX512 slot
// empty, so an AVX512 CPU runs the AVX2 kernel; with no capability the generic Vectorized is
// 32 bytes too.
constexpr int kVectorBytes = 32;

// One of ATen's vector accumulators: W lanes, each added to on its own. A GCC vector (a lane-wise
// IEEE add per +=, never reassociated) rather than an array of W scalars: the scalar emulation
// cost about ten instructions an element, for the level sums and the zeroing of a cascade on
// every row, more than ATen's whole sum on an RMSNorm's rows of 32 to 64 floats.
template <class T, int W>
struct Lanes {
  typedef T Vector __attribute__((vector_size(W * sizeof(T))));
  Vector lane{};  // zeros, as Vectorized<T>(0)

  C10_ALWAYS_INLINE Lanes& operator+=(const Lanes& other) {
    lane += other.lane;
    return *this;
  }
};

// The chunked cascade over `steps` steps of four accumulators each (ATen's multi_row_sum with
// four rows): step i adds load(i, k) to accumulator k at level 0; every 16 steps level 0 is
// added into level 1 and cleared, every 256 level 1 into level 2, and so on; at the end levels
// 1 to 3 are added into level 0. ATen's chunk is 2^max(4, ceil(log2(steps)) / 4) steps: 16 for
// every row this kernel takes (steps < 2^16).
template <class Acc, class Load>
C10_ALWAYS_INLINE std::array<Acc, 4> cascade(int64_t steps, const Load& load) {
  constexpr int kLevels = 4;
  constexpr int kChunkBits = 4;
  constexpr int64_t kChunk = int64_t{1} << kChunkBits;
  std::array<std::array<Acc, 4>, kLevels> acc{};
  int64_t i = 0;
  while (i + kChunk <= steps) {
    for (int64_t j = 0; j < kChunk; ++j, ++i) {
      for (int k = 0; k < 4; ++k) acc[0][k] += load(i, k);
    }
    for (int level = 1; level < kLevels; ++level) {
      for (int k = 0; k < 4; ++k) {
        acc[level][k] += acc[level - 1][k];
        acc[level - 1][k] = Acc{};
      }
      if ((i & ((kChunk - 1) << (level * kChunkBits))) != 0) break;
    }
  }
  for (; i < steps; ++i) {
    for (int k = 0; k < 4; ++k) acc[0][k] += load(i, k);
  }
  for (int level = 1; level < kLevels; ++level) {
    for (int k = 0; k < 4; ++k) acc[0][k] += acc[level][k];
  }
  return acc[0];
}

// ATen's row_sum: `count` items read as rows of four (four accumulators), the items past the
// last whole row into the first, then the other three into it.
template <class Acc, class Load>
C10_ALWAYS_INLINE Acc row_sum(int64_t count, const Load& load) {
  const int64_t steps = count / 4;
  auto partial = cascade<Acc>(steps, [&](int64_t i, int k) { return load(i * 4 + k); });
  for (int64_t i = steps * 4; i < count; ++i) partial[0] += load(i);
  for (int k = 1; k < 4; ++k) partial[0] += partial[k];
  return partial[0];
}

// One row's sum as ATen's cascade_sum computes it: vectors of W elements when the row holds
// at least one (vectorized_inner_sum: the vector sum, then the scalar tail into a fresh
// accumulator, then the vector's lanes in order), single elements otherwise (scalar_inner_sum);
// the result is added to the zero ATen fills its output with.
template <class T, int W>
C10_ALWAYS_INLINE T sum_row(const T* x, int64_t n) {
  if (n < W) return T(0) + row_sum<T>(n, [&](int64_t i) { return x[i]; });
  const int64_t vectors = n / W;
  const auto vector_sum = row_sum<Lanes<T, W>>(vectors, [&](int64_t v) {
    Lanes<T, W> lanes;
    std::memcpy(&lanes.lane, x + v * W, sizeof(lanes.lane));  // an unaligned load
    return lanes;
  });
  T sum = 0;
  for (int64_t k = vectors * W; k < n; ++k) sum += x[k];
  for (int l = 0; l < W; ++l) sum += vector_sum.lane[l];
  return T(0) + sum;
}

// Cloned for AVX2 and AVX-512 (vector_clones.h): the lanes' adds are the same IEEE adds on any
// instruction set (no multiply to fuse with), and the baseline's 32-byte vectors are two halves.
template <class T, int W>
NEURON_VECTOR_CLONES void sum_rows(const SmallSum& plan, const T* x, bool mean, T* y) {
  // mean is sum_out(...).div_(n): the row length as the dtype's number, one IEEE division.
  const T n = static_cast<T>(plan.row);
  for (int64_t r = 0; r < plan.rows; ++r) {
    const T sum = sum_row<T, W>(x + r * plan.row, plan.row);
    y[r] = mean ? sum / n : sum;
  }
}

}  // namespace

std::optional<SmallSum> plan_small_sum(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                                       std::optional<at::ScalarType> dtype) {
  const at::ScalarType t = self.scalar_type();
  if ((t != at::kFloat && t != at::kDouble) || (dtype.has_value() && *dtype != t)) return std::nullopt;
  if (!dim.has_value() || dim->size() != 1 || self.dim() < 1) return std::nullopt;
  const int64_t d = (*dim)[0];
  if (d != -1 && d != self.dim() - 1) return std::nullopt;
  const int64_t row = self.size(-1);
  if (row < 2 || self.numel() >= at::internal::GRAIN_SIZE || !bytes_are_values(self) || !dense_row_major(self)) {
    return std::nullopt;
  }
  if (aten_x86_capability() == nullptr) return std::nullopt;  // another vector width, another order
  SmallSum plan;
  plan.sizes.assign(self.sizes().begin(), self.sizes().end());
  if (keepdim) {
    plan.sizes.back() = 1;
  } else {
    plan.sizes.pop_back();
  }
  plan.row = row;
  plan.rows = self.numel() / row;
  return plan;
}

void run_small_sum(const SmallSum& plan, const at::Tensor& self, bool mean, const at::Tensor& out) {
  if (self.scalar_type() == at::kFloat) {
    return sum_rows<float, kVectorBytes / sizeof(float)>(plan, self.const_data_ptr<float>(), mean,
                                                          out.mutable_data_ptr<float>());
  }
  TORCH_INTERNAL_ASSERT(self.scalar_type() == at::kDouble, "neuron: small sum planned for ", self.scalar_type());
  sum_rows<double, kVectorBytes / sizeof(double)>(plan, self.const_data_ptr<double>(), mean,
                                                  out.mutable_data_ptr<double>());
}

}  // namespace neuron::fastpath
