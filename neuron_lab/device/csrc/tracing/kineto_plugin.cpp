// torch.profiler sees the device: an activity profiler that kineto (torch.profiler's
// tracer) runs beside its own when a trace asks for ProfilerActivity.PrivateUse1, the
// extension point PyTorch gives out-of-tree accelerators (PrivateUse1ProfilerRegistry).
//
// A trace session opens a profile of the device's launch records (trace.h: the one
// recorder that neuron_lab.profiler reads too). At its stop it finishes the device work
// of the region (the profiler's own wait), and turns the records into kineto activities:
//
//   host lane (the thread that recorded)  "neuron record: <op>" per recorded op, and
//                                         "neuron launch: <graph>" per launch enqueued
//   pid = core, tid = stream              a kernel per op that ran op by op (eager ops,
//                                         replayed graphs, inline kernels), inside a
//                                         "graph N" span per graph; one kernel per
//                                         compiled graph (its ops ran fused)
//
// Each kernel is linked to the CPU op that recorded it (its device time goes to that op
// in key_averages()), with a flow arrow from the record or launch on the host, and carries
// its source line, shapes, graph, tier, and its emulated and modelled time (the annotator
// of neuron_lab.observability, trace.h).
#define USE_KINETO 1  // the PrivateUse1 registry's header is guarded by it (torch builds with kineto)
// kineto's metadata formats with {fmt}, whose compiled part torch does not export: here it is
// header-only (inline, hidden in this extension).
#define FMT_HEADER_ONLY 1

#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <GenericTraceActivity.h>
#include <IActivityProfiler.h>
#include <ThreadUtil.h>
#include <libkineto.h>
#include <output_base.h>

#include "device/csrc/runtime/runtime.h"

#include <chrono>
#include <map>
#include <mutex>
#include <set>

namespace neuron {
namespace {

using libkineto::ActivityType;
using libkineto::GenericTraceActivity;

std::mutex g_last_mutex;
trace::Profile& last_profile() {
  static auto* p = new trace::Profile();
  return *p;
}

// Kernel and flow ids of the device's activities: apart from torch's correlation ids (from 1).
std::atomic<int32_t> g_next_id{1 << 30};

// Metadata strings go into the trace's JSON as they are (kineto only turns backslashes
// into slashes): quotes and control characters become harmless.
std::string json_safe(std::string text) {
  for (auto& c : text) {
    if (c == '"') c = '\'';
    if (c == '\\') c = '/';
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  return text;
}

std::string short_name(const std::string& op) {
  const auto colon = op.rfind("::");
  return colon == std::string::npos ? op : op.substr(colon + 2);
}

class DeviceSession final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    // The steady clock of the records to kineto's Unix-epoch nanoseconds.
    offset_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count() -
                 trace::now_ns();
    handle_ = trace::start_profile();
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    if (handle_ < 0) return;
    {
      // What the region queued runs now, so that its launches are in the trace; an error
      // it raises stays on its stream for the user's next wait.
      trace::ProfilerWaits own;
      try {
        finish_all_work(Reason::Synchronize);
      } catch (...) {
        errors_.push_back("neuron: the device work of the traced region could not be finished");
      }
    }
    profile_ = trace::stop_profile(handle_);
    handle_ = -1;
    status_ = libkineto::TraceStatus::PROCESSING;
    std::lock_guard<std::mutex> lock(g_last_mutex);
    last_profile() = profile_;
  }

  std::vector<std::string> errors() override { return errors_; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked,
                    int64_t start_time, int64_t end_time) override {
    buffer_->span = libkineto::TraceSpan(start_time, end_time, "neuron");
    const auto notes = trace::annotate(profile_);
    name_lanes(logger, start_time);
    for (const auto& launch : profile_.launches) add_launch(*launch, notes, linked);
    for (auto& activity : buffer_->activities) logger.handleActivity(*activity);
  }

  // Every core is named in processTrace; one is named here too, which tells kineto not to
  // name pids 0..15 as the GPUs it would otherwise assume.
  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    int core = 0;
    if (!profile_.launches.empty()) core = profile_.launches.front()->device;
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{
        core, core + (1 << 24), "neuron:" + std::to_string(core), "NeuronCore " + std::to_string(core)});
  }
  std::vector<libkineto::ResourceInfo> getResourceInfos() override { return {}; }
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }

  void pushCorrelationId(uint64_t id) override { trace::push_correlation(id); }
  void popCorrelationId() override { trace::pop_correlation(); }

  std::unordered_map<std::string, std::string> getMetadata() override {
    return {{"neuron_cores", std::to_string(device_count())}};
  }

 private:
  int64_t unix_ns(int64_t steady_ns) const { return steady_ns + offset_ns_; }

  GenericTraceActivity& add(ActivityType type, const std::string& name) {
    buffer_->emplace_activity(buffer_->span, type, json_safe(name));
    return *buffer_->activities.back();
  }

  // An inline kernel runs on the host thread that asked for it, beside whatever its stream
  // still runs (a value whose work is done is read while a later graph runs): a lane of its
  // own per stream, so that a stream's lane holds only kernels that ran one after another
  // (tools such as Holistic Trace Analysis read gaps between them as the stream's idle time).
  static constexpr int64_t kInlineLaneBase = int64_t{1} << 30;
  static int64_t lane_of(const trace::LaunchRecord& l) {
    return l.kind == trace::LaunchKind::Inline ? kInlineLaneBase + l.stream : l.stream;
  }

  // A process per core and a thread per stream (and per stream's inline kernels), named as
  // users name them.
  void name_lanes(libkineto::ActivityLogger& logger, int64_t time) {
    std::set<int> cores;
    std::set<std::pair<int, int64_t>> streams;
    for (const auto& l : profile_.launches) {
      cores.insert(l->device);
      streams.insert({l->device, lane_of(*l)});
    }
    for (int core : cores) {
      logger.handleDeviceInfo(libkineto::DeviceInfo{core, core + (1 << 24), "neuron:" + std::to_string(core),
                                                    "NeuronCore " + std::to_string(core)},
                              time);
    }
    for (const auto& [core, lane] : streams) {
      const std::string name = lane >= kInlineLaneBase
                                   ? "stream " + std::to_string(lane - kInlineLaneBase) + " inline (host thread)"
                                   : "stream " + std::to_string(lane);
      logger.handleResourceInfo(libkineto::ResourceInfo{lane, lane, core, name}, time);
    }
  }

  // What every device activity of a launch says about it. Kernels name their device and stream
  // in their args, as CUDA's do (Holistic Trace Analysis counts what has a stream as a kernel);
  // a graph's span, which holds its ops' kernels, does not.
  void describe_launch(GenericTraceActivity& a, const trace::LaunchRecord& l, const trace::ProfileNotes& notes,
                       bool kernel = true) {
    if (kernel) {
      a.addMetadata("device", l.device);
      // An inline kernel is no stream's work (see lane_of): no "stream", which tools read as
      // the stream it ran in order on, but the stream it ran for.
      a.addMetadata(l.kind == trace::LaunchKind::Inline ? "inline for stream" : "stream", l.stream);
    }
    a.addMetadataQuoted("launch", trace::launch_kind_name(l.kind));
    if (l.graph_id >= 0) a.addMetadata("graph", l.graph_id);
    const char* tier = trace::tier_name(l.tier.load());
    if (*tier != '\0') a.addMetadataQuoted("tier", tier);
    a.addMetadata("launch ops", l.n_ops);
    a.addMetadataQuoted("status", trace::status_name(l.status.load()));
    if (auto it = notes.launch_costs.find(l.id); it != notes.launch_costs.end() && it->second.modelled_ns >= 0) {
      a.addMetadata("launch modelled us", it->second.modelled_ns / 1e3);
    }
  }

  void describe_cost(GenericTraceActivity& a, const trace::OpCost& cost, int64_t emulated_ns) {
    a.addMetadata("emulated us", static_cast<double>(emulated_ns) / 1e3);
    if (cost.modelled_ns >= 0) a.addMetadata("modelled us", cost.modelled_ns / 1e3);
    if (cost.flops >= 0) a.addMetadata("flops", static_cast<int64_t>(cost.flops));
    if (cost.bytes >= 0) a.addMetadata("bytes", static_cast<int64_t>(cost.bytes));
  }

  // A flow arrow from a host activity to a device one (kineto's "ac2g", as CUDA launches have).
  static void flow(GenericTraceActivity& from, GenericTraceActivity& to, uint32_t id) {
    from.flow.id = to.flow.id = id;
    from.flow.type = to.flow.type = libkineto::kLinkAsyncCpuGpu;
    from.flow.start = 1;
    to.flow.start = 0;
  }

  GenericTraceActivity& host_activity(const std::string& name, int32_t tid, int64_t start_ns, int64_t dur_ns,
                                      uint64_t correlation, const libkineto::getLinkedActivityCallback& linked,
                                      int32_t id) {
    auto& h = add(ActivityType::PRIVATEUSE1_RUNTIME, name);
    h.device = libkineto::processId();
    h.resource = tid != 0 ? tid : libkineto::systemThreadId();
    h.threadId = h.resource;
    h.startTime = unix_ns(start_ns);
    h.endTime = h.startTime + std::max<int64_t>(dur_ns, 1);
    h.id = id;
    if (correlation != 0) h.linked = linked(static_cast<int32_t>(correlation));
    h.addMetadata("correlation", id);
    return h;
  }

  GenericTraceActivity& device_activity(ActivityType type, const std::string& name, const trace::LaunchRecord& l,
                                        int64_t start_ns, int64_t dur_ns, int32_t id) {
    auto& d = add(type, name);
    d.device = l.device;
    d.resource = static_cast<int32_t>(lane_of(l));
    d.startTime = unix_ns(start_ns);
    d.endTime = d.startTime + std::max<int64_t>(dur_ns, 1);
    d.id = id;
    d.addMetadata("correlation", id);
    return d;
  }

  void add_launch(const trace::LaunchRecord& l, const trace::ProfileNotes& notes,
                  const libkineto::getLinkedActivityCallback& linked) {
    const int64_t start = l.start_ns.load(), end = l.end_ns.load();
    if (start == 0 || l.kind == trace::LaunchKind::Event) return;  // never ran, or a marker with no duration
    const int64_t duration = std::max<int64_t>(end - start, 0);
    const auto costs_it = notes.op_costs.find(l.id);
    const std::vector<trace::OpCost>* costs = costs_it == notes.op_costs.end() ? nullptr : &costs_it->second;
    const auto cost_of = [&](size_t i) { return costs != nullptr && i < costs->size() ? (*costs)[i] : trace::OpCost{}; };
    const std::string where = source_text(l.source, notes);

    // The enqueue on the host (an inline kernel runs on the host thread itself: none).
    GenericTraceActivity* launch_on_host = nullptr;
    const int32_t launch_id = g_next_id.fetch_add(1);
    if (l.kind != trace::LaunchKind::Inline) {
      launch_on_host = &host_activity("neuron launch: " + l.name, l.host_tid, l.enqueue_ns, 1000, l.correlation,
                                      linked, launch_id);
      launch_on_host->addMetadata("launch id", l.id);
    }

    const bool per_op = !l.ops.empty() && (l.tier.load() != trace::LaunchTier::Compiled) &&
                        std::all_of(l.ops.begin(), l.ops.end(), [](const auto& o) { return o.device_ns >= 0; });
    if (l.kind == trace::LaunchKind::Graph && per_op) {
      // The graph's span, and a kernel per op laid end to end in the order they ran.
      auto& span = device_activity(ActivityType::GPU_USER_ANNOTATION, "graph " + std::to_string(l.graph_id) + " (" +
                                       std::to_string(l.n_ops) + " ops)", l, start, duration, launch_id);
      describe_launch(span, l, notes, /*kernel=*/false);
      if (!where.empty()) span.addMetadataQuoted("source", json_safe(where));
      if (launch_on_host != nullptr) flow(*launch_on_host, span, static_cast<uint32_t>(launch_id));
      int64_t at = start;
      for (size_t i = 0; i < l.ops.size(); ++i) {
        const auto& op = l.ops[i];
        add_op_kernel(l, op, cost_of(i), notes, linked, at, op.device_ns);
        at += op.device_ns;
      }
      return;
    }
    if (l.kind == trace::LaunchKind::Wait) {
      auto& wait = device_activity(ActivityType::GPU_USER_ANNOTATION, "stream wait", l, start, duration, launch_id);
      describe_launch(wait, l, notes, /*kernel=*/false);
      if (launch_on_host != nullptr) flow(*launch_on_host, wait, static_cast<uint32_t>(launch_id));
      return;
    }
    if (l.ops.size() == 1) {  // one op launched alone (eager mode): the arrow from its record
      auto& k = add_op_kernel(l, l.ops.front(), cost_of(0), notes, linked, start, duration);
      if (launch_on_host != nullptr && l.ops.front().record_start_ns == 0) {
        flow(*launch_on_host, k, static_cast<uint32_t>(launch_id));
      }
      return;
    }
    // A compiled graph (its ops ran fused) or an inline kernel: one kernel.
    const std::string name = l.kind == trace::LaunchKind::Graph ? "neuron::graph_" + std::to_string(l.graph_id) + " (compiled, " +
                                                     std::to_string(l.n_ops) + " ops)"
                                               : "neuron::" + short_name(l.name);
    auto& k = device_activity(ActivityType::CONCURRENT_KERNEL, name, l, start, duration, launch_id);
    if (l.correlation != 0) k.linked = linked(static_cast<int32_t>(l.correlation));
    describe_launch(k, l, notes);
    if (!where.empty()) k.addMetadataQuoted("source", json_safe(where));
    trace::OpCost total;
    if (auto it = notes.launch_costs.find(l.id); it != notes.launch_costs.end()) total = it->second;
    describe_cost(k, total, duration);
    if (launch_on_host != nullptr) flow(*launch_on_host, k, static_cast<uint32_t>(launch_id));
  }

  // An op's kernel on its stream, linked to the CPU op that recorded it, with an arrow from
  // its recording on the host.
  GenericTraceActivity& add_op_kernel(const trace::LaunchRecord& l, const trace::OpRecord& op,
                                      const trace::OpCost& cost, const trace::ProfileNotes& notes,
                                      const libkineto::getLinkedActivityCallback& linked, int64_t start_ns,
                                      int64_t dur_ns) {
    const int32_t id = g_next_id.fetch_add(1);
    auto& k = device_activity(ActivityType::CONCURRENT_KERNEL, "neuron::" + short_name(op.name), l, start_ns, dur_ns,
                              id);
    const uint64_t correlation = op.correlation != 0 ? op.correlation : l.correlation;
    if (correlation != 0) k.linked = linked(static_cast<int32_t>(correlation));
    describe_launch(k, l, notes);
    k.addMetadataQuoted("op", op.name + (op.overload.empty() ? "" : "." + op.overload));
    k.addMetadataQuoted("shapes", json_safe(op.inputs));
    const std::string where = source_text(op.source, notes);
    if (!where.empty()) k.addMetadataQuoted("source", json_safe(where));
    describe_cost(k, cost, dur_ns);
    if (op.record_start_ns != 0) {
      auto& rec = host_activity("neuron record: " + op.name, op.host_tid, op.record_start_ns, op.host_ns,
                                op.correlation, linked, id);
      flow(rec, k, static_cast<uint32_t>(id));
    }
    return k;
  }

  int handle_ = -1;
  int64_t offset_ns_ = 0;
  trace::Profile profile_;
  std::vector<std::string> errors_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
};

class DeviceActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<ActivityType>& availableActivities() const override { return activities_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& activity_types,
                                                                 const libkineto::Config& config) override {
    // Only traces that ask for the device's activities (ProfilerActivity.PrivateUse1). Torch
    // puts PRIVATEUSE1_RUNTIME in its CPU types too, so a CPU-only trace asks for it: only the
    // device-side types (kernels, annotations on the device) tell that the device was asked for.
    const bool wanted = activity_types.count(ActivityType::CONCURRENT_KERNEL) > 0 ||
                        activity_types.count(ActivityType::GPU_USER_ANNOTATION) > 0;
    if (!wanted) return nullptr;
    return std::make_unique<DeviceSession>();
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t,
                                                                 const std::set<ActivityType>& activity_types,
                                                                 const libkineto::Config& config) override {
    return configure(activity_types, config);
  }

 private:
  std::string name_{"neuron"};
  std::set<ActivityType> activities_{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_USER_ANNOTATION,
                                     ActivityType::PRIVATEUSE1_RUNTIME};
};

REGISTER_PRIVATEUSE1_PROFILER(DeviceActivityProfiler);

}  // namespace

namespace trace {
Profile last_torch_profile() {
  std::lock_guard<std::mutex> lock(g_last_mutex);
  return last_profile();
}
}  // namespace trace

}  // namespace neuron
