// One launch of recorded ops: what a stream's device thread executes (execute.cpp).
//
// The recording thread builds it (launch.cpp: which results live, the graph); the device
// thread runs it, with the graph's compiled code when it has code for these scalars and no
// input is poisoned, else by replaying each op on its CPU kernel over the device memory
// (bit-identical to eager mode). A failing op poisons what it and every later op writes.
#pragma once

#include "adaptive_eager.h"

namespace neuron::lazy {

struct Launch {
  std::vector<Record> records;
  std::vector<ScratchUse> scratch;         // dead intermediates (replay only)
  bool scratch_given = false;
  std::vector<c10::Storage> inputs;        // the compiled code's inputs: every live storage
  std::vector<c10::ScalarType> input_dtypes;
  std::shared_ptr<Graph> graph;
  bool replay_only = false;  // its scalars differ from those the graph's compiled code has
  c10::DeviceIndex device = 0;
  c10::StreamId stream_id = 0;
  trace::LaunchRecordPtr record;  // while profiling

  // On the device thread: compiled or replayed, then the graph's timing statistics.
  void execute();
  // The stream skipped this launch after an earlier failure: its results are never computed.
  void skipped();
  // Dead intermediates get host scratch (once; the recording thread may do it early).
  void give_scratch_once();

 private:
  void replay();
  bool run_reads_poison(size_t begin, size_t end) const;
  void poison_from(size_t first, const Record& failed);
  void replay_record(size_t i);
  void replay_run_tiled(size_t begin, size_t end, int64_t numel);
  bool reads_poison() const;
  void replay_one(Record& r);
  std::string failure_context(const Record& r) const;
};

}  // namespace neuron::lazy
