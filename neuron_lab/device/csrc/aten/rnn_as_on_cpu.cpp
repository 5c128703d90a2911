// nn.LSTM, nn.GRU and nn.RNN (and their cells) take the CPU's path on the device.
//
// ATen's recurrent ops (aten::lstm, gru, rnn_tanh, rnn_relu and the *_cell ops) are
// composite: they pick an implementation from the input's device. On the CPU a float32
// LSTM runs oneDNN, one aten::mkldnn_rnn_layer per layer and direction; other CPU RNNs
// project the whole sequence through the input weights at once, then run each step with
// plain ops (linear, add_, sigmoid_, tanh_, ...). On an accelerator (PrivateUse1 among
// them) the composite projects step by step and calls fused cell ops. Those round
// differently, so an LSTM language model drifted from the CPU's (2.2e-6).
//
// The device emulates the CPU: these ops are registered here, for the device and its
// autograd key, and take the CPU's path with the same ATen ops in the same order, each
// dispatched to the device (its CPU kernel, its autograd formula), so that results,
// gradients and training steps are the CPU's bits. Argument checks say what ATen's do.
#include "registrations.h"
#include "device/csrc/runtime/runtime.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

namespace neuron {
namespace {

enum class Cell { LSTM, GRU, Tanh, Relu };

// ---- which path the CPU takes ----------------------------------------------------------

// oneDNN's code for an LSTM layer: the `mode` argument of aten::mkldnn_rnn_layer.
constexpr int64_t kOneDnnLstm = 2;

// Whether the CPU would run an LSTM of this reduced-precision dtype through oneDNN: that
// depends on what the host CPU supports, so the CPU is asked once, with a one-step LSTM
// while an observer counts the aten::mkldnn_rnn_layer calls it makes.
std::atomic<int> g_onednn_calls{0};

std::unique_ptr<at::ObserverContext> count_onednn_layer(const at::RecordFunction& fn) {
  if (std::strcmp(fn.name(), "aten::mkldnn_rnn_layer") == 0) g_onednn_calls.fetch_add(1);
  return nullptr;
}

bool cpu_runs_onednn_lstm_in(c10::ScalarType dtype) {
  static std::mutex mutex;
  static std::map<c10::ScalarType, bool> known;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find(dtype);
  if (it != known.end()) return it->second;
  bool onednn = false;
  {
    at::NoGradGuard no_grad;  // half precision takes oneDNN only without autograd
    const auto options = at::TensorOptions().dtype(dtype);
    const auto input = at::zeros({1, 1, 1}, options), state = at::zeros({1, 1, 1}, options);
    const auto w_ih = at::zeros({4, 1}, options), w_hh = at::zeros({4, 1}, options);
    g_onednn_calls = 0;
    const auto handle = at::addThreadLocalCallback(
        at::RecordFunctionCallback(&count_onednn_layer).scopes({at::RecordScope::FUNCTION}));
    try {
      at::lstm(input, {state, state}, {w_ih, w_hh}, false, 1, 0.0, false, false, false);
    } catch (...) {
      at::removeCallback(handle);
      throw;
    }
    at::removeCallback(handle);
    onednn = g_onednn_calls.load() > 0;
  }
  known[dtype] = onednn;
  return onednn;
}

// The CPU's choice for aten::lstm: oneDNN for float32 (and bfloat16 or, without autograd,
// half where the host supports them), when oneDNN is enabled, every tensor is on the
// device, the input is not empty and the LSTM has no projections.
bool lstm_takes_onednn(const at::Tensor& input, at::TensorList hx, at::TensorList params, bool has_projections) {
  if (has_projections || !at::globalContext().userEnabledMkldnn() || input.numel() == 0) return false;
  const auto same_place = [&](at::TensorList ts) {
    return std::all_of(ts.begin(), ts.end(), [&](const at::Tensor& t) { return t.device().type() == kNeuron; });
  };
  if (input.device().type() != kNeuron || !same_place(hx) || !same_place(params)) return false;
  if (hx[0].unsafeGetTensorImpl()->has_symbolic_sizes_strides()) return false;
  switch (input.scalar_type()) {
    case at::kFloat: return true;
    case at::kBFloat16: return cpu_runs_onednn_lstm_in(at::kBFloat16);
    case at::kHalf: return !c10::GradMode::is_enabled() && cpu_runs_onednn_lstm_in(at::kHalf);
    default: return false;
  }
}

// ---- arguments -------------------------------------------------------------------------

void check_same_device(const at::Tensor& input, at::TensorList params, at::TensorList hx) {
  const auto device = input.device();
  for (const auto& list : {params, hx}) {
    for (const auto& t : list) {
      TORCH_CHECK(t.device() == device, "RNN: the input is on ", device, " but a ",
                  (&list == &params ? "parameter" : "hidden state"), " is on ", t.device(),
                  "; move every tensor to one device");
    }
  }
}

void check_lstm_states(at::TensorList hx, int64_t num_layers, bool bidirectional) {
  const int64_t layers = num_layers * (bidirectional ? 2 : 1);
  for (size_t i = 0; i < 2; ++i) {
    TORCH_CHECK(hx[i].dim() == 3, "LSTM: for a batched 3-D input, hx[", i, "] (", i == 0 ? "h_0" : "c_0",
                ") should be 3-D, but got a ", hx[i].dim(), "-D tensor");
    TORCH_CHECK(hx[i].size(0) == layers, "LSTM: expected ", i == 0 ? "h_0" : "c_0", ".size(0) to be ", layers,
                " (num_layers * num_directions), but got ", hx[i].size(0));
  }
}

// One layer and direction's weights; undefined tensors where the RNN has none.
struct Weights {
  at::Tensor w_ih, w_hh, b_ih, b_hh, w_hr;

  static std::optional<at::Tensor> maybe(const at::Tensor& t) {
    return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
  }
  at::Tensor project_input(const at::Tensor& x) const { return at::linear(x, w_ih, maybe(b_ih)); }
  at::Tensor project_hidden(const at::Tensor& h) const { return at::linear(h, w_hh, maybe(b_hh)); }
  at::Tensor project_output(const at::Tensor& h) const { return w_hr.defined() ? at::matmul(h, w_hr.t()) : h; }
};

std::vector<Weights> weights_of(at::TensorList params, bool has_biases, bool has_projections) {
  const size_t per_layer = 2 + (has_biases ? 2 : 0) + (has_projections ? 1 : 0);
  TORCH_CHECK(params.size() % per_layer == 0, "RNN: got ", params.size(), " parameters, not a multiple of the ",
              per_layer, " each layer and direction has");
  std::vector<Weights> out;
  for (size_t i = 0; i < params.size(); i += per_layer) {
    Weights w;
    w.w_ih = params[i];
    w.w_hh = params[i + 1];
    if (has_biases) {
      w.b_ih = params[i + 2];
      w.b_hh = params[i + 3];
    }
    if (has_projections) w.w_hr = params[i + per_layer - 1];
    out.push_back(std::move(w));
  }
  return out;
}

// ---- one step --------------------------------------------------------------------------

// The hidden state of one layer and direction: h, and c for an LSTM.
struct State {
  at::Tensor h, c;
};

// One step of a cell: `x` is the step's input, already projected through the input
// weights when `projected`.
State step(Cell cell, const at::Tensor& x, const State& s, const Weights& w, bool projected) {
  switch (cell) {
    case Cell::LSTM: {
      auto gates = w.project_hidden(s.h);
      gates.add_(projected ? x : w.project_input(x));
      auto parts = gates.unsafe_chunk(4, 1);
      auto in = parts[0].sigmoid_();
      auto forget = parts[1].sigmoid_();
      auto candidate = parts[2].tanh_();
      auto out = parts[3].sigmoid_();
      auto c = forget * s.c;
      c.add_(in * candidate);
      auto h = out * c.tanh();
      return {w.project_output(h), c};
    }
    case Cell::GRU: {
      const auto in_parts = (projected ? x : w.project_input(x)).unsafe_chunk(3, 1);
      auto hidden_parts = w.project_hidden(s.h).unsafe_chunk(3, 1);
      const auto reset = hidden_parts[0].add_(in_parts[0]).sigmoid_();
      const auto update = hidden_parts[1].add_(in_parts[1]).sigmoid_();
      auto scaled = hidden_parts[2].mul_(reset);
      const auto fresh = in_parts[2].add(scaled).tanh_();
      auto h = s.h - fresh;
      h.mul_(update);
      h.add_(fresh);
      return {h, {}};
    }
    case Cell::Tanh:
    case Cell::Relu: {
      auto pre = w.project_hidden(s.h);
      pre.add_(projected ? x : w.project_input(x));
      return {cell == Cell::Tanh ? at::tanh(pre) : at::relu(pre), {}};
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unknown RNN cell");
}

// ---- a layer over a padded sequence [T, B, *] --------------------------------------------

struct LayerResult {
  at::Tensor output;
  State last;
};

// The whole sequence is projected through the input weights first, then stepped.
LayerResult run_sequence(Cell cell, const at::Tensor& input, const State& first, const Weights& w, bool reverse) {
  auto steps = w.project_input(input).unbind(0);
  if (reverse) std::reverse(steps.begin(), steps.end());
  std::vector<at::Tensor> outputs;
  State s = first;
  for (const auto& x : steps) {
    s = step(cell, x, s, w, /*projected=*/true);
    outputs.push_back(s.h);
  }
  TORCH_CHECK(!outputs.empty(), "Expected sequence length to be larger than 0 in RNN");
  if (reverse) std::reverse(outputs.begin(), outputs.end());
  return {at::stack(outputs, 0), s};
}

// ---- a layer over a packed sequence (data [sum of lengths, *], batch sizes per step) ----

std::vector<int64_t> batch_sizes_of(const at::Tensor& batch_sizes) {
  TORCH_CHECK(batch_sizes.device().is_cpu() && batch_sizes.scalar_type() == at::kLong && batch_sizes.dim() == 1,
              "RNN: a packed sequence's batch_sizes must be a 1-D int64 CPU tensor, got ",
              batch_sizes.toString(), " on ", batch_sizes.device());
  const auto contiguous = batch_sizes.contiguous();
  const int64_t* p = contiguous.const_data_ptr<int64_t>();
  return {p, p + contiguous.numel()};
}

// For an LSTM the cell state goes first, as on the CPU (whose compiler evaluates the
// arguments of the call that pairs them from the last).
State narrow_state(const State& s, int64_t start, int64_t end) {
  auto c = s.c.defined() ? s.c.narrow(0, start, end - start) : at::Tensor();
  return {s.h.narrow(0, start, end - start), c};
}

State cat_states(const std::vector<State>& states) {
  std::vector<at::Tensor> hs, cs;
  for (const auto& s : states) {
    hs.push_back(s.h);
    if (s.c.defined()) cs.push_back(s.c);
  }
  auto c = cs.empty() ? at::Tensor() : at::cat(cs, 0);
  return {at::cat(hs, 0), c};
}

// Forward: the batch shrinks as sequences end; the states of ended sequences are kept.
LayerResult run_packed(Cell cell, const at::Tensor& data, const std::vector<int64_t>& sizes, const State& first,
                       const Weights& w) {
  const auto projected = w.project_input(data);
  std::vector<at::Tensor> outputs;
  std::vector<State> ended;
  State s = first;
  int64_t offset = 0, last = sizes.at(0);
  for (const int64_t size : sizes) {
    const auto x = projected.narrow(0, offset, size);
    offset += size;
    if (last > size) {
      ended.push_back(narrow_state(s, size, last));
      s = narrow_state(s, 0, size);
    }
    last = size;
    s = step(cell, x, s, w, /*projected=*/true);
    outputs.push_back(s.h);
  }
  ended.push_back(s);
  std::reverse(ended.begin(), ended.end());
  return {at::cat(outputs, 0), cat_states(ended)};
}

// Backward in time: the batch grows as sequences start, from the initial states.
LayerResult run_packed_reversed(Cell cell, const at::Tensor& data, const std::vector<int64_t>& sizes,
                                const State& first, const Weights& w) {
  const auto projected = w.project_input(data);
  std::vector<at::Tensor> outputs;
  int64_t offset = data.size(0), last = sizes.back();
  State s = narrow_state(first, 0, last);
  for (auto it = sizes.rbegin(); it != sizes.rend(); ++it) {
    const int64_t size = *it;
    if (size > last) s = cat_states({s, narrow_state(first, last, size)});
    const auto x = projected.narrow(0, offset - size, size);
    offset -= size;
    last = size;
    s = step(cell, x, s, w, /*projected=*/true);
    outputs.push_back(s.h);
  }
  std::reverse(outputs.begin(), outputs.end());
  return {at::cat(outputs, 0), s};
}

// ---- layers stacked ----------------------------------------------------------------------

// Runs the layers (each direction of a bidirectional layer in turn) over `input` (a padded
// sequence [T, B, *], or a packed sequence's data with its batch sizes), with dropout
// between layers in training. Returns the last layer's output and the final states, one
// per layer and direction.
std::pair<at::Tensor, std::vector<State>> run_layers(Cell cell, const at::Tensor& input,
                                                     const std::vector<int64_t>* packed_sizes,
                                                     const std::vector<State>& firsts,
                                                     const std::vector<Weights>& weights, int64_t num_layers,
                                                     double dropout, bool train, bool bidirectional) {
  const size_t directions = bidirectional ? 2 : 1;
  TORCH_CHECK(!bidirectional || (firsts.size() % 2 == 0 && weights.size() % 2 == 0),
              "Odd number of params or hiddens given to a bidirectional RNN");
  TORCH_CHECK(static_cast<size_t>(num_layers) * directions == firsts.size(),
              "Expected more hidden states in stacked_rnn");
  TORCH_CHECK(static_cast<size_t>(num_layers) * directions == weights.size(), "Expected more weights in stacked_rnn");
  at::Tensor layer_input = input;
  std::vector<State> lasts;
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    const size_t i = static_cast<size_t>(layer) * directions;
    at::Tensor output;
    if (packed_sizes != nullptr) {
      auto forward = run_packed(cell, layer_input, *packed_sizes, firsts[i], weights[i]);
      lasts.push_back(forward.last);
      output = forward.output;
      if (bidirectional) {
        auto backward = run_packed_reversed(cell, layer_input, *packed_sizes, firsts[i + 1], weights[i + 1]);
        lasts.push_back(backward.last);
        output = at::cat({forward.output, backward.output}, -1);
      }
    } else {
      auto forward = run_sequence(cell, layer_input, firsts[i], weights[i], /*reverse=*/false);
      lasts.push_back(forward.last);
      output = forward.output;
      if (bidirectional) {
        auto backward = run_sequence(cell, layer_input, firsts[i + 1], weights[i + 1], /*reverse=*/true);
        lasts.push_back(backward.last);
        output = at::cat({forward.output, backward.output}, forward.output.dim() - 1);
      }
    }
    layer_input = output;
    if (dropout != 0 && train && layer < num_layers - 1) layer_input = at::dropout(layer_input, dropout, true);
  }
  return {layer_input, lasts};
}

std::vector<State> states_of(const at::Tensor& hx, const at::Tensor& cx) {
  const auto hs = hx.unbind(0);
  std::vector<at::Tensor> cs;
  if (cx.defined()) cs = cx.unbind(0);
  std::vector<State> out;
  for (size_t i = 0; i < hs.size(); ++i) out.push_back({hs[i], cx.defined() ? cs.at(i) : at::Tensor()});
  return out;
}

// ---- the ops -----------------------------------------------------------------------------

// oneDNN's LSTM, as the CPU runs it: one aten::mkldnn_rnn_layer per layer and direction.
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_onednn(const at::Tensor& input_, at::TensorList hx,
                                                           at::TensorList params, bool has_biases, int64_t num_layers,
                                                           double dropout, bool train, bool bidirectional,
                                                           bool batch_first) {
  const auto input = (batch_first ? input_.transpose(0, 1) : input_).contiguous();
  const auto h = hx[0].contiguous();
  const auto c = hx[1].contiguous();
  const int64_t hidden_size = h.size(2);
  const int64_t directions = bidirectional ? 2 : 1;
  const size_t per_layer = has_biases ? 4 : 2;
  at::Tensor layer_input = input;
  std::vector<at::Tensor> hy(num_layers * directions), cy(num_layers * directions);
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    std::vector<at::Tensor> outputs(directions);
    for (int64_t direction = 0; direction < directions; ++direction) {
      const int64_t index = layer * directions + direction;
      const size_t first = static_cast<size_t>(index) * per_layer;
      TORCH_CHECK(first + per_layer <= params.size(), "LSTM: got ", params.size(), " parameters for ", num_layers,
                  " layers");
      const auto& w_ih = params[first];
      const auto& w_hh = params[first + 1];
      const auto layer_h = h[index];
      const auto layer_c = c[index];
      // Without biases the layer takes zeros in their place (made in the CPU's order).
      const auto b_hh = has_biases ? params[first + 3] : at::zeros(w_hh.sizes(), w_hh.options());
      const auto b_ih = has_biases ? params[first + 2] : at::zeros(w_ih.sizes(), w_ih.options());
      auto result = at::mkldnn_rnn_layer(layer_input, w_ih, w_hh, b_ih, b_hh, layer_h, layer_c, direction > 0, {},
                                         kOneDnnLstm, hidden_size, num_layers, has_biases, bidirectional,
                                         batch_first, train);
      outputs[direction] = std::get<0>(result);
      hy[index] = std::get<1>(result);
      cy[index] = std::get<2>(result);
    }
    layer_input = directions == 1 ? outputs[0] : at::cat(outputs, -1);
    if (dropout != 0 && train && layer < num_layers - 1) layer_input = at::dropout(layer_input, dropout, true);
  }
  auto h_out = at::stack(hy, 0);
  auto c_out = at::stack(cy, 0);
  return {batch_first ? layer_input.transpose(0, 1) : layer_input, h_out, c_out};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_input(const at::Tensor& input, at::TensorList hx,
                                                          at::TensorList params, bool has_biases, int64_t num_layers,
                                                          double dropout, bool train, bool bidirectional,
                                                          bool batch_first) {
  TORCH_CHECK(hx.size() == 2, "lstm expects two hidden states");
  check_lstm_states(hx, num_layers, bidirectional);
  const bool has_projections = hx[0].size(2) != hx[1].size(2);
  if (lstm_takes_onednn(input, hx, params, has_projections)) {
    return lstm_onednn(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first);
  }
  check_same_device(input, params, hx);
  const auto sequence = batch_first ? input.transpose(0, 1) : input;
  const auto weights = weights_of(params, has_biases, has_projections);
  const auto firsts = states_of(hx[0], hx[1]);
  auto [output, lasts] = run_layers(Cell::LSTM, sequence, nullptr, firsts, weights, num_layers, dropout, train,
                                    bidirectional);
  std::vector<at::Tensor> hs, cs;
  for (const auto& s : lasts) {
    hs.push_back(s.h);
    cs.push_back(s.c);
  }
  auto c_out = at::stack(cs, 0);  // the CPU stacks the cell states first
  auto h_out = at::stack(hs, 0);
  return {batch_first ? output.transpose(0, 1) : output, h_out, c_out};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_data(const at::Tensor& data, const at::Tensor& batch_sizes,
                                                         at::TensorList hx, at::TensorList params, bool has_biases,
                                                         int64_t num_layers, double dropout, bool train,
                                                         bool bidirectional) {
  TORCH_CHECK(hx.size() == 2, "lstm expects two hidden states");
  check_lstm_states(hx, num_layers, bidirectional);
  const bool has_projections = hx[0].size(2) != hx[1].size(2);
  const auto weights = weights_of(params, has_biases, has_projections);
  const auto firsts = states_of(hx[0], hx[1]);
  const auto sizes = batch_sizes_of(batch_sizes);
  auto [output, lasts] = run_layers(Cell::LSTM, data, &sizes, firsts, weights, num_layers, dropout, train,
                                    bidirectional);
  std::vector<at::Tensor> hs, cs;
  for (const auto& s : lasts) {
    hs.push_back(s.h);
    cs.push_back(s.c);
  }
  auto c_out = at::stack(cs, 0);
  auto h_out = at::stack(hs, 0);
  return {output, h_out, c_out};
}

template <Cell cell>
std::tuple<at::Tensor, at::Tensor> one_state_input(const at::Tensor& input, const at::Tensor& hx,
                                                   at::TensorList params, bool has_biases, int64_t num_layers,
                                                   double dropout, bool train, bool bidirectional, bool batch_first) {
  check_same_device(input, params, hx);
  const auto sequence = batch_first ? input.transpose(0, 1) : input;
  const auto weights = weights_of(params, has_biases, false);
  const auto firsts = states_of(hx, at::Tensor());
  auto [output, lasts] = run_layers(cell, sequence, nullptr, firsts, weights, num_layers, dropout, train,
                                    bidirectional);
  std::vector<at::Tensor> hs;
  for (const auto& s : lasts) hs.push_back(s.h);
  auto h_out = at::stack(hs, 0);
  if (batch_first) output.transpose_(0, 1);
  return {output, h_out};
}

template <Cell cell>
std::tuple<at::Tensor, at::Tensor> one_state_data(const at::Tensor& data, const at::Tensor& batch_sizes,
                                                  const at::Tensor& hx, at::TensorList params, bool has_biases,
                                                  int64_t num_layers, double dropout, bool train, bool bidirectional) {
  const auto weights = weights_of(params, has_biases, false);
  const auto firsts = states_of(hx, at::Tensor());
  const auto sizes = batch_sizes_of(batch_sizes);
  auto [output, lasts] = run_layers(cell, data, &sizes, firsts, weights, num_layers, dropout, train, bidirectional);
  std::vector<at::Tensor> hs;
  for (const auto& s : lasts) hs.push_back(s.h);
  return {output, at::stack(hs, 0)};
}

// ---- cells (nn.LSTMCell, nn.GRUCell, nn.RNNCell) --------------------------------------------

void check_cell(const at::Tensor& input, const at::Tensor& w_ih, const at::Tensor& w_hh, int64_t gates,
                std::initializer_list<const at::Tensor*> states) {
  const int64_t hidden_size = w_hh.size(1);
  TORCH_CHECK(input.size(1) == w_ih.size(1), "input has inconsistent input_size: got ", input.size(1),
              " expected ", w_ih.size(1));
  TORCH_CHECK(w_ih.size(0) == gates * hidden_size, "weight_ih first dim must be ", gates, " * hidden_size = ",
              gates * hidden_size, ", but got ", w_ih.size(0));
  TORCH_CHECK(w_hh.size(0) == gates * hidden_size, "weight_hh first dim must be ", gates, " * hidden_size = ",
              gates * hidden_size, ", but got ", w_hh.size(0));
  int64_t label = 0;
  for (const at::Tensor* s : states) {
    TORCH_CHECK(input.size(0) == s->size(0), "Input batch size ", input.size(0), " doesn't match hidden", label,
                " batch size ", s->size(0));
    TORCH_CHECK(s->size(1) == hidden_size, "hidden", label, " has inconsistent hidden_size: got ", s->size(1),
                ", expected ", hidden_size);
    ++label;
  }
}

Weights cell_weights(const at::Tensor& w_ih, const at::Tensor& w_hh, const std::optional<at::Tensor>& b_ih,
                     const std::optional<at::Tensor>& b_hh) {
  return {w_ih, w_hh, b_ih.value_or(at::Tensor()), b_hh.value_or(at::Tensor()), at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor> lstm_cell(const at::Tensor& input, at::TensorList hx, const at::Tensor& w_ih,
                                             const at::Tensor& w_hh, const std::optional<at::Tensor>& b_ih,
                                             const std::optional<at::Tensor>& b_hh) {
  TORCH_CHECK(hx.size() == 2, "lstm_cell expects two hidden states");
  check_cell(input, w_ih, w_hh, 4, {&hx[0], &hx[1]});
  auto s = step(Cell::LSTM, input, {hx[0], hx[1]}, cell_weights(w_ih, w_hh, b_ih, b_hh), false);
  return {s.h, s.c};
}

template <Cell cell>
at::Tensor one_state_cell(const at::Tensor& input, const at::Tensor& hx, const at::Tensor& w_ih,
                          const at::Tensor& w_hh, const std::optional<at::Tensor>& b_ih,
                          const std::optional<at::Tensor>& b_hh) {
  check_cell(input, w_ih, w_hh, cell == Cell::GRU ? 3 : 1, {&hx});
  return step(cell, input, {hx, {}}, cell_weights(w_ih, w_hh, b_ih, b_hh), false).h;
}

void register_all(torch::Library& m) {
  m.impl("lstm.input", TORCH_FN(lstm_input));
  m.impl("lstm.data", TORCH_FN(lstm_data));
  m.impl("gru.input", TORCH_FN(one_state_input<Cell::GRU>));
  m.impl("gru.data", TORCH_FN(one_state_data<Cell::GRU>));
  m.impl("rnn_tanh.input", TORCH_FN(one_state_input<Cell::Tanh>));
  m.impl("rnn_tanh.data", TORCH_FN(one_state_data<Cell::Tanh>));
  m.impl("rnn_relu.input", TORCH_FN(one_state_input<Cell::Relu>));
  m.impl("rnn_relu.data", TORCH_FN(one_state_data<Cell::Relu>));
  m.impl("lstm_cell", TORCH_FN(lstm_cell));
  m.impl("gru_cell", TORCH_FN(one_state_cell<Cell::GRU>));
  m.impl("rnn_tanh_cell", TORCH_FN(one_state_cell<Cell::Tanh>));
  m.impl("rnn_relu_cell", TORCH_FN(one_state_cell<Cell::Relu>));
}

}  // namespace

void register_rnn_as_on_cpu(torch::Library& m) { register_all(m); }

}  // namespace neuron
