// Tiled replay of elementwise runs.
//
// Replay calls each op's CPU kernel on whole tensors: a chain of 25 elementwise ops on
// 1M floats streams 4 MiB through memory 25 times. A run of consecutive elementwise
// ops over tensors of one size instead replays tile by tile, every op of the run on
// one tile while it is in cache, as a fused kernel would.
//
// The bits stay eager mode's. An elementwise CPU kernel computes each element from the
// same elements of its inputs; the only thing that depends on an element's position is
// whether the vectorized loop or the scalar tail of one kernel call computes it (their
// transcendental functions can differ in the last bit). A call's vectorized loop runs
// from the call's first element in steps of at most 256 elements (two vectors of the
// widest type, 1-byte elements in 512-bit registers), and its tail is the rest. The
// whole-tensor call splits [0, n) across k threads at multiples of ceil(n / k) (k is 1 or
// the device thread's intra-op thread count). So when ceil(n / k) is a multiple of 256
// for every such k, every call boundary of the whole-tensor run is a multiple of 256 and
// its only tail is the last n % 256-aligned stretch of the tensor; tiles that start at
// multiples of 256 and whose last one ends at n give every element the same path.
// Tiles run in order on one thread, and each tile call on one thread
// (SingleThreadedKernels), so a call never splits itself. (Tiles do not run in
// parallel: built with OpenMP, two threads running tiles at once gave results that
// differed from eager mode's, the same two threads taking turns under a lock did not,
// so the tile calls share some state; see the notes of issue 16.) ATen's parallel_for
// compiled into this extension, which builds without OpenMP, runs inline without making
// ATen's kernels see a parallel region, so a tile call never forks OpenMP's team.
#include "adaptive_eager.h"

#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <unordered_map>

namespace neuron::lazy {

namespace {

// Call boundaries of whole-tensor kernels fall on multiples of this many elements
// (see above); tiles start on them too.
constexpr int64_t kAlignment = 256;
// Elements per tile: 256 KiB of float32 per tensor, so that the few tensors a run keeps
// alive per tile stay in a core's L2 cache, while each kernel call still does enough
// work (tens of microseconds) to make its dispatch cost small.
constexpr int64_t kTileElements = 64 * 1024;
static_assert(kTileElements % kAlignment == 0, "tiles must start on call boundaries");

// Smaller tensors fit in cache whole: tiling them gains nothing.
constexpr int64_t kMinTiledElements = 2 * kTileElements;

// Whether whole-tensor kernels over `numel` elements split their work only at
// multiples of kAlignment, whatever number of threads (up to the device thread's) they use.
bool call_boundaries_aligned(int64_t numel) {
  const int64_t threads = at::get_num_threads();
  for (int64_t k = 2; k <= threads; ++k) {
    if (((numel + k - 1) / k) % kAlignment != 0) return false;
  }
  return true;
}

// Where each storage of a run is viewed from, so that all its tensors are the same
// elements: a tile of one is the same tile of all.
struct StorageView {
  int64_t offset;
  c10::ScalarType dtype;
};
using StorageViews = std::unordered_map<const c10::StorageImpl*, StorageView>;

// A device tensor of the run: `numel` contiguous elements, viewed like the other
// tensors on its storage.
bool fits(const at::Tensor& t, int64_t numel, StorageViews& views) {
  if (t.numel() != numel || !t.is_contiguous() || t.is_complex()) return false;
  const StorageView view{t.storage_offset(), t.scalar_type()};
  auto [it, inserted] = views.emplace(t.storage().unsafeGetStorageImpl(), view);
  return inserted || (it->second.offset == view.offset && it->second.dtype == view.dtype);
}

// Whether a record can join a run over `numel` elements (numel 0: it starts one and
// sets it). On failure `views` may hold entries of this record: the caller ends the run.
bool tileable(const Record& r, int64_t& numel, StorageViews& views) {
  if (!r.cls->pointwise || r.random || r.has_host_tensor) return false;
  if (r.cls->out_twin.has_value() && out_twin_refused(r.op)) return false;
  if (numel == 0) {
    const at::Tensor* first = nullptr;
    for (const auto& a : r.args) {
      if (a.isTensor() && on_device(a.toTensor())) {
        first = &a.toTensor();
        break;
      }
    }
    if (first == nullptr && !r.outputs.empty()) first = &r.outputs.front();
    if (first == nullptr) return false;
    numel = first->numel();
    if (numel < kMinTiledElements || !call_boundaries_aligned(numel)) return false;
  }
  for (const auto& a : r.args) {
    if (a.isTensor()) {
      const at::Tensor& t = a.toTensor();
      if (!t.defined()) continue;
      if (on_device(t) ? !fits(t, numel, views) : t.dim() != 0) return false;  // a wrapped number passes whole
    } else if (a.isTensorList() || a.isList()) {
      return false;
    }
  }
  for (const auto& t : r.outputs) {
    if (!fits(t, numel, views)) return false;
  }
  return true;
}

// The tiles one thread works on. Each storage of the run has one CPU tensor that is
// pointed at the current tile (its offset and length change, nothing is allocated), and
// each record a stack made once whose device tensors are those tile tensors: a tile
// call copies its record's stack and runs the kernel, with no view op per call.
class TileCursor {
 public:
  TileCursor(const std::vector<Record>& records, size_t begin, size_t end,
             const std::unordered_map<const c10::StorageImpl*, at::Tensor>& flat) {
    std::unordered_map<const c10::StorageImpl*, at::Tensor> tile_of;
    for (const auto& [impl, host] : flat) {
      auto tile = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(host.storage()),
                                                           c10::DispatchKeySet(c10::DispatchKey::CPU), host.dtype());
      tiles_.push_back({tile, host.storage_offset()});
      tile_of.emplace(impl, std::move(tile));
    }
    auto tile = [&](const at::Tensor& t) { return tile_of.at(t.storage().unsafeGetStorageImpl()); };
    stacks_.reserve(end - begin);
    for (size_t i = begin; i < end; ++i) {
      const Record& r = records[i];
      torch::jit::Stack stack;
      stack.reserve(r.args.size() + r.outputs.size());
      for (const auto& a : r.args) {
        if (a.isTensor() && on_device(a.toTensor())) {
          stack.emplace_back(tile(a.toTensor()));
        } else {
          stack.push_back(a);
        }
      }
      for (const auto& out : r.outputs) stack.emplace_back(tile(out));  // in place, or out=, on its tiles
      stacks_.push_back(std::move(stack));
    }
  }

  // Points every tile tensor at [start, start + length) of its storage's elements.
  void move_to(int64_t start, int64_t length) {
    const std::array<int64_t, 1> sizes{length}, strides{1};
    for (auto& t : tiles_) t.tile.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, t.base_offset + start);
  }

  // Runs the tile of the run's `k`-th record.
  void run(const Record& r, size_t k) {
    torch::jit::Stack stack = stacks_[k];
    run_host_kernel(r.cls->out_twin.has_value() ? *r.cls->out_twin : r.op, &stack);
  }

 private:
  struct Tile {
    at::Tensor tile;
    int64_t base_offset;  // where the run's elements start in the storage
  };
  std::vector<Tile> tiles_;
  std::vector<torch::jit::Stack> stacks_;
};

}  // namespace

size_t tileable_run_end(const std::vector<Record>& records, size_t begin, int64_t& numel) {
  numel = 0;
  StorageViews views;
  size_t end = begin;
  while (end < records.size()) {
    StorageViews tried = views;
    int64_t n = numel;
    if (!tileable(records[end], n, tried)) break;
    numel = n;
    views = std::move(tried);
    ++end;
  }
  return end;
}

void replay_tiled(const std::vector<Record>& records, size_t begin, size_t end, int64_t numel,
                  std::vector<int64_t>* op_ns, const std::function<std::string(const Record&)>& context,
                  size_t& failed) {
  // One flat host view per storage; tiles narrow it. Tensors of one storage share one
  // host storage, so kernels see in-place ops as in place.
  std::unordered_map<const c10::StorageImpl*, at::Tensor> flat;
  for (size_t i = begin; i < end; ++i) {
    for_each_record_tensor(records[i], [&](const at::Tensor& t, bool) {
      if (!on_device(t)) return;
      const auto* impl = t.storage().unsafeGetStorageImpl();
      if (flat.count(impl) == 0) flat.emplace(impl, host_alias(t).view({numel}));
    });
  }
  const int64_t tiles = (numel + kTileElements - 1) / kTileElements;
  size_t current = end;  // the record whose tile call is running
  try {
    SingleThreadedKernels one_thread;
    TileCursor cursor(records, begin, end, flat);
    for (int64_t k = 0; k < tiles; ++k) {
      const int64_t start = k * kTileElements;
      cursor.move_to(start, std::min(kTileElements, numel - start));
      for (current = begin; current < end; ++current) {
        const int64_t t0 = op_ns != nullptr ? trace::now_ns() : 0;
        cursor.run(records[current], current - begin);
        if (op_ns != nullptr) (*op_ns)[current - begin] += trace::now_ns() - t0;
      }
    }
  } catch (c10::Error& e) {
    failed = current;
    if (current < end) e.add_context(context(records[current]));
    throw;
  } catch (const std::exception& e) {
    failed = current;
    if (current < end) TORCH_CHECK(false, e.what(), "\n", context(records[current]));
    throw;
  }
  counters().tiled_runs.fetch_add(1);
  counters().tiled_ops.fetch_add(end - begin);
}

}  // namespace neuron::lazy
