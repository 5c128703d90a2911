#include "reason.h"

namespace neuron {

const char* reason_name(Reason reason) {
  switch (reason) {
    case Reason::None: return "";
    case Reason::HostRead: return "host read";
    case Reason::CopyToHost: return "copy to host";
    case Reason::CopyFromHost: return "copy from host";
    case Reason::CopyBetweenCores: return "copy between cores";
    case Reason::InlineOp: return "inline op";
    case Reason::MetadataChange: return "metadata change";
    case Reason::CustomKernel: return "custom kernel";
    case Reason::CompiledGraph: return "compiled graph";
    case Reason::Collective: return "collective";
    case Reason::Synchronize: return "synchronize";
    case Reason::EventSynchronize: return "event synchronize";
    case Reason::EventRecord: return "event record";
    case Reason::StreamQuery: return "stream query";
    case Reason::StreamWait: return "stream wait";
    case Reason::StreamSwitch: return "stream switch";
    case Reason::MemoryStatistics: return "memory statistics";
    case Reason::MemorySnapshot: return "memory snapshot";
    case Reason::OutOfMemory: return "out of memory";
    case Reason::RandomState: return "random state";
    case Reason::RandomOp: return "random op";
    case Reason::ModeChange: return "mode change";
    case Reason::Exit: return "exit";
    case Reason::ExplicitFlush: return "explicit flush";
    case Reason::Eager: return "eager";
    case Reason::OpLimit: return "op limit";
    case Reason::ThreadSwitch: return "thread switch";
    case Reason::BackwardStart: return "backward start";
    case Reason::CachedGraphEnd: return "cached graph's end";
    case Reason::DeviceIdle: return "device idle";
    case Reason::ResultBytes: return "result bytes";
    case Reason::ProbeMiss: return "probe miss";
    case Reason::CompiledGraphEnd: return "end of a compiled graph";
    case Reason::kCount: break;
  }
  return "?";
}

}  // namespace neuron
