// DDP's runtime statistics for neuron: the reducer times each sampled iteration's
// forward, backward compute and gradient communication (ddp._get_ddp_logging_data()'s
// avg_*_time) with a c10d::Timer registered for the parameters' device type; without
// one it warns and records nothing. The host runs ahead of the device, so the times are
// those of events on the current stream, reached when the device gets there.
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include <array>
#include <optional>

namespace neuron {
namespace {

class NeuronTimer final : public c10d::Timer {
 public:
  explicit NeuronTimer(c10::Device device) : device_(device) {}

  void record(Event event) override {
    c10d::Timer::record(event);  // the host's timestamp, which the reducer reads as well
    auto& mark = marks_[static_cast<size_t>(event)];
    if (!mark.has_value()) mark.emplace(c10::kPrivateUse1, c10::EventFlag::BACKEND_DEFAULT);  // timing
    c10::impl::VirtualGuardImpl guard(c10::kPrivateUse1);
    mark->record(guard.getStream(device_));
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    const auto& first = marks_[static_cast<size_t>(start)];
    const auto& last = marks_[static_cast<size_t>(end)];
    // Never recorded (no backward yet, or only no_sync() iterations): nothing to measure.
    if (!first.has_value() || !last.has_value() || !first->was_marked_for_recording() ||
        !last->was_marked_for_recording()) {
      return std::nullopt;
    }
    // The reducer asks at the next iteration's forward, when the device is mostly done with
    // the previous one; c10::Event::elapsedTime wants both events completed.
    first->synchronize();
    last->synchronize();
    const double milliseconds = first->elapsedTime(*last);
    // An end left over from an earlier iteration precedes this iteration's start.
    if (milliseconds < 0) return std::nullopt;
    return static_cast<int64_t>(milliseconds * 1e6);
  }

 private:
  c10::Device device_;
  std::array<std::optional<c10::Event>, 5> marks_;  // one per c10d::Timer::Event
};

}  // namespace
}  // namespace neuron

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, neuron::NeuronTimer);
}  // namespace c10d
