// Random number generators of the emulated NeuronCores.
//
// A neuron generator carries its state in a CPU (mt19937) generator: random ops
// run the CPU kernel on device memory and are handed that CPU generator. So a
// seeded neuron program draws exactly the numbers the same program draws on the
// CPU, and each core has its own independent default generator.
//
// A generator can instead be given an offset state: 16 bytes, seed (u64) and offset
// (u64), the layout of CUDA's philox state, which DTensor's RNG tracker reads and
// writes (it moves the offset so that each shard of a tensor draws its own numbers
// and every rank ends at the same offset). In that form each random op draws from a
// fresh CPU generator whose whole mt19937 state is derived from (seed, offset), and
// the offset then moves past the op's numbers: the numbers an op draws depend only on
// the state it started from, as with philox, but they are not the CPU's numbers.
// set_state with a 16-byte state selects the offset form, with the CPU generator's
// state the CPU form; manual_seed keeps the form (offset 0 in the offset form).
#include "runtime.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/MT19937RNGEngine.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/empty.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <pthread.h>
#include <unistd.h>

namespace neuron {
namespace {

constexpr int64_t kOffsetStateBytes = 16;  // seed u64, offset u64
constexpr int64_t kCpuStateBytes = 5056;   // CPUGeneratorImplState
constexpr int64_t kLegacyCpuStateBytes = 5048;

// SplitMix64 (Steele, Lea, Flood 2014): a bijective 64-bit mix, used to spread
// (seed, offset) over the 624 words of an mt19937 state.
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// A CPU generator whose state is a function of (seed, offset) alone: distinct offsets
// of one seed give distinct 64-bit keys, hence unrelated mt19937 states.
at::Generator keyed_cpu_generator(uint64_t seed, uint64_t offset) {
  uint64_t mixing = seed;
  uint64_t x = splitmix64(mixing) ^ offset;
  at::mt19937_data_pod data{};
  data.seed_ = seed;
  data.seeded_ = true;
  for (size_t j = 0; j < data.state_.size(); j += 2) {
    const uint64_t word = splitmix64(x);
    data.state_[j] = static_cast<uint32_t>(word);
    data.state_[j + 1] = static_cast<uint32_t>(word >> 32);
  }
  data.left_ = 1;  // as a freshly seeded engine: the first draw twists the state
  data.next_ = 0;
  at::mt19937 engine;
  engine.set_data(data);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  generator.get<at::CPUGeneratorImpl>()->set_engine(engine);
  return generator;
}

// Lock order. torch's Python bindings of a generator (manual_seed, get_state, set_state,
// seed, clone_state) hold the GIL and then take the generator's mutex (GeneratorImpl::mutex_)
// before they call in here. Code below that mutex must therefore never wait for the GIL: a
// thread blocked on the mutex holds it. Changing the state never waits: a CPU twin still
// held by queued random ops keeps serving them, and the generator takes a new twin (what
// eager mode would leave the queued ops to draw from, they still draw). Reading the state
// of the CPU form waits for those ops to draw; that wait lets go of the mutex (and the
// GIL), and takes both back in torch's order (TorchMutexReleased).
class TorchMutexReleased {
 public:
  explicit TorchMutexReleased(std::mutex& m) : mutex_(m), held_(held_by_this_thread(m)) {
    if (held_) mutex_.unlock();
  }
  ~TorchMutexReleased() {
    if (held_) mutex_.lock();  // with the GIL, if the caller holds it: torch's order
  }
  TorchMutexReleased(const TorchMutexReleased&) = delete;
  TorchMutexReleased& operator=(const TorchMutexReleased&) = delete;

 private:
  // glibc records the owning thread of a locked mutex (pthread_mutex_t.__data.__owner).
  static bool held_by_this_thread(std::mutex& m) {
    return m.native_handle()->__data.__owner == static_cast<int>(gettid());
  }
  std::mutex& mutex_;
  bool held_;
};

class NeuronGeneratorImpl final : public c10::GeneratorImpl {
 public:
  NeuronGeneratorImpl(c10::DeviceIndex index, at::Generator host)
      : c10::GeneratorImpl(c10::Device(kNeuron, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        host_(std::move(host)) {}

  void set_current_seed(uint64_t seed) override {
    std::lock_guard<std::mutex> lock(twin_mutex_);
    if (offset_form_) {
      seed_ = seed;
      offset_ = 0;
    } else {
      own_twin(/*keep_state=*/false).set_current_seed(seed);
    }
  }
  void set_offset(uint64_t offset) override {
    std::lock_guard<std::mutex> lock(twin_mutex_);
    if (offset_form_) {
      offset_ = offset;
    } else {
      own_twin(/*keep_state=*/true).set_offset(offset);
    }
  }
  uint64_t get_offset() const override {
    settle_for_read();
    std::lock_guard<std::mutex> lock(twin_mutex_);
    return offset_form_ ? offset_ : host_.get_offset();
  }
  uint64_t current_seed() const override {
    std::lock_guard<std::mutex> lock(twin_mutex_);
    return offset_form_ ? seed_ : host_.current_seed();
  }
  uint64_t seed() override {
    std::lock_guard<std::mutex> lock(twin_mutex_);
    const uint64_t fresh = own_twin(/*keep_state=*/false).seed();
    if (offset_form_) {
      seed_ = fresh;
      offset_ = 0;
    }
    return fresh;
  }
  void set_state(const c10::TensorImpl& new_state) override {
    const int64_t bytes = new_state.numel() * static_cast<int64_t>(new_state.itemsize());
    TORCH_CHECK(bytes == kOffsetStateBytes || bytes == kCpuStateBytes || bytes == kLegacyCpuStateBytes,
                "a neuron generator's state is either its CPU (mt19937) generator's state (", kCpuStateBytes,
                " bytes, as get_rng_state() returns it in the CPU form; its draws are the CPU's) or an offset state "
                "of ", kOffsetStateBytes, " bytes (seed and offset, uint64 each, the layout of CUDA's philox state, "
                "what DTensor's RNG tracker uses), but it got ", bytes,
                " bytes; pass a tensor that get_rng_state() returned or torch.neuron.offset_rng_state(seed)");
    std::lock_guard<std::mutex> lock(twin_mutex_);
    if (bytes == kOffsetStateBytes) {
      uint64_t words[2];
      std::memcpy(words, new_state.data(), sizeof(words));
      seed_ = words[0];
      offset_ = words[1];
      offset_form_ = true;
    } else {
      own_twin(/*keep_state=*/false).unsafeGetGeneratorImpl()->set_state(new_state);
      offset_form_ = false;
    }
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    settle_for_read();
    std::lock_guard<std::mutex> lock(twin_mutex_);
    if (!offset_form_) {
      std::lock_guard<std::mutex> twin_lock(host_.unsafeGetGeneratorImpl()->mutex_);  // a kernel of another thread may draw
      return host_.unsafeGetGeneratorImpl()->get_state();
    }
    auto state = at::empty({kOffsetStateBytes}, at::TensorOptions().dtype(at::kByte));
    const uint64_t words[2] = {seed_, offset_};
    std::memcpy(state.data_ptr(), words, sizeof(words));
    return state.getIntrusivePtr();
  }
  static c10::DeviceType device_type() { return kNeuron; }

  // The generator one op draws from (see generator_for_draw).
  at::Generator for_draw(int64_t span) {
    std::lock_guard<std::mutex> lock(twin_mutex_);
    if (!offset_form_) return host_;
    auto keyed = keyed_cpu_generator(seed_, offset_);
    offset_ += static_cast<uint64_t>((std::max<int64_t>(span, 1) + 3) / 4 * 4);
    return keyed;
  }

 private:
  NeuronGeneratorImpl* clone_impl() const override {
    settle_for_read();
    std::lock_guard<std::mutex> lock(twin_mutex_);
    std::lock_guard<std::mutex> twin_lock(host_.unsafeGetGeneratorImpl()->mutex_);
    auto* copy = new NeuronGeneratorImpl(device().index(), host_.clone());
    copy->offset_form_ = offset_form_;
    copy->seed_ = seed_;
    copy->offset_ = offset_;
    return copy;
  }

  // The CPU twin, this generator's alone, to change (called with twin_mutex_ held): random
  // ops still queued that hold the current twin keep it, as eager mode's ops would have
  // drawn from it before the change; the generator goes on with a new one, a copy of the
  // current state (keep_state) or a fresh generator whose state the caller sets whole.
  at::Generator& own_twin(bool keep_state) {
    if (host_.getIntrusivePtr().use_count() > 1) {
      if (keep_state) {
        std::lock_guard<std::mutex> twin_lock(host_.unsafeGetGeneratorImpl()->mutex_);
        host_ = host_.clone();
      } else {
        host_ = at::detail::createCPUGenerator();
      }
    }
    return host_;
  }

  // Before the CPU form's state is read: random ops recorded or queued earlier that draw
  // from the twin draw first, as they would have in eager mode. The offset form advances
  // when an op is recorded, and a twin nothing else holds has no draws pending.
  void settle_for_read() const {
    if (on_device_thread() || in_bad_fork()) return;
    {
      std::lock_guard<std::mutex> lock(twin_mutex_);
      if (offset_form_ || host_.getIntrusivePtr().use_count() == 1) return;
    }
    TorchMutexReleased released(const_cast<std::mutex&>(mutex_));
    synchronize_all(Reason::RandomState);
  }

  // Guards the fields below: recording threads take the twin (for_draw) while a Python
  // thread changes the state. Never held while waiting for anything.
  mutable std::mutex twin_mutex_;
  at::Generator host_;
  bool offset_form_ = false;
  uint64_t seed_ = 0;
  uint64_t offset_ = 0;
};

std::once_flag g_defaults_once;
std::vector<at::Generator>* g_defaults = nullptr;  // leaked: generators outlive exit

}  // namespace

at::Generator new_generator(c10::DeviceIndex index) {
  index = resolve_device(index);
  return at::make_generator<NeuronGeneratorImpl>(index, at::detail::createCPUGenerator());
}

const at::Generator& default_generator(c10::DeviceIndex index) {
  index = resolve_device(index);
  std::call_once(g_defaults_once, [] {
    g_defaults = new std::vector<at::Generator>();
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      g_defaults->push_back(at::make_generator<NeuronGeneratorImpl>(
          d, at::detail::createCPUGenerator(c10::default_rng_seed_val)));
    }
  });
  return (*g_defaults)[index];
}

at::Generator generator_for_draw(const at::Generator& neuron_generator, int64_t span) {
  auto* impl = dynamic_cast<NeuronGeneratorImpl*>(neuron_generator.unsafeGetGeneratorImpl());
  TORCH_CHECK(impl != nullptr, "expected a neuron generator, got one on ", neuron_generator.device());
  return impl->for_draw(span);
}

int64_t draw_span(const std::vector<c10::Argument>& schema, const c10::IValue* args, size_t n) {
  int64_t span = 1;
  for (size_t i = 0; i < n && i < schema.size(); ++i) {
    const auto& v = args[i];
    if (v.isTensor()) {
      if (v.toTensor().defined()) span = std::max<int64_t>(span, v.toTensor().numel());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) span = std::max<int64_t>(span, t.numel());
    } else if (schema[i].name() == "size" && v.isIntList()) {  // factories: rand(size), randint(.., size)
      int64_t numel = 1;
      for (int64_t d : v.toIntVector()) numel *= d;
      span = std::max<int64_t>(span, numel);
    } else if (schema[i].name() == "n" && v.isInt()) {  // randperm(n)
      span = std::max<int64_t>(span, v.toInt());
    }
  }
  return span;
}

}  // namespace neuron
