// The adaptive-eager runtime's counters, all in this file: what each counts, its storage,
// its reset, and the values Python reads (neuron_lab.adaptive_eager.stats.counters()).
#pragma once

#include "device/csrc/tracing/reason.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace neuron::lazy {

// Counters for every decision the runtime takes. Each atomic grows with relaxed adds and
// returns to zero at reset() (stats.reset_counters()).
struct Counters {
  std::atomic<uint64_t> ops_recorded{0}, launches{0}, graph_launches{0}, graphs_built{0}, cache_hits{0},
      compiles_requested{0}, compiles_succeeded{0}, compiles_failed{0}, compile_ns{0},
      compiled_launches{0}, replay_launches{0}, compiled_fallbacks{0}, compiled_rejected{0}, compiled_stale{0},
      inline_ops{0}, dead_intermediate_bytes{0}, live_result_bytes{0}, graphs_evicted{0},
      graph_joins{0},  // buffers held past a cached graph's end to join its usual successor
      tiled_runs{0}, tiled_ops{0},
      metas_computed{0};  // result metadata not in the cache: a meta kernel ran
  // Ops run at once since the process started (never reset: the recorder compares it
  // across launches), and its value at the last reset(): one atomic add an op, not two.
  std::atomic<uint64_t> ops_run_at_once_total{0}, ops_run_at_once_at_reset{0};
  uint64_t ops_run_at_once() const { return ops_run_at_once_total.load() - ops_run_at_once_at_reset.load(); }
  std::array<std::atomic<uint64_t>, kReasons> flushes{};  // by reason
  std::mutex mutex;  // guards the maps below
  std::map<std::string, uint64_t, std::less<>> syncs;  // by trigger (the op that waited, else the reason's words)
  std::map<std::string, uint64_t, std::less<>> inline_by_op;  // found by string_view

  void count_flush(Reason reason) { flushes[static_cast<size_t>(reason)].fetch_add(1, std::memory_order_relaxed); }
  void count_sync(Reason reason, std::string_view what) {
    const std::string_view trigger = what.empty() ? std::string_view(reason_name(reason)) : what;
    std::lock_guard<std::mutex> lock(mutex);
    auto it = syncs.find(trigger);  // a string is made only for a trigger's first wait
    if (it == syncs.end()) it = syncs.emplace(std::string(trigger), 0).first;
    it->second += 1;
  }

  void reset() {
    for (auto* c : {&ops_recorded, &launches, &graph_launches, &graphs_built, &cache_hits, &compiles_requested,
                    &compiles_succeeded, &compiles_failed, &compile_ns, &compiled_launches, &replay_launches,
                    &compiled_fallbacks, &compiled_rejected, &compiled_stale, &inline_ops, &dead_intermediate_bytes,
                    &live_result_bytes, &graphs_evicted, &graph_joins, &tiled_runs, &tiled_ops, &metas_computed}) {
      c->store(0);
    }
    ops_run_at_once_at_reset.store(ops_run_at_once_total.load());
    for (auto& c : flushes) c.store(0);
    std::lock_guard<std::mutex> lock(mutex);
    syncs.clear();
    inline_by_op.clear();
  }

  // (name, value) of each scalar counter as Python reads it (compile time in seconds); the
  // maps (flushes by reason, syncs, inline_by_op) are read under `mutex`.
  std::vector<std::pair<const char*, std::variant<uint64_t, double>>> read() const {
    return {
        {"ops_recorded", ops_recorded.load()},
        {"launches", launches.load()},
        {"graph_launches", graph_launches.load()},
        {"graphs_built", graphs_built.load()},
        {"cache_hits", cache_hits.load()},
        {"compiles_requested", compiles_requested.load()},
        {"compiles_succeeded", compiles_succeeded.load()},
        {"compiles_failed", compiles_failed.load()},
        {"compile_seconds", static_cast<double>(compile_ns.load()) / 1e9},
        {"compiled_launches", compiled_launches.load()},
        {"replay_launches", replay_launches.load()},
        {"compiled_fallbacks", compiled_fallbacks.load()},
        {"compiled_rejected", compiled_rejected.load()},
        {"compiled_stale", compiled_stale.load()},
        {"inline_ops", inline_ops.load()},
        {"dead_intermediate_bytes", dead_intermediate_bytes.load()},
        {"live_result_bytes", live_result_bytes.load()},
        {"graphs_evicted", graphs_evicted.load()},
        {"graph_joins", graph_joins.load()},
        {"tiled_runs", tiled_runs.load()},
        {"tiled_ops", tiled_ops.load()},
        {"ops_run_at_once", ops_run_at_once()},
        {"metas_computed", metas_computed.load()},
    };
  }
};

// The process's counters (never freed: threads may count while the process exits).
inline Counters& counters() {
  static auto* c = new Counters();
  return *c;
}

}  // namespace neuron::lazy
