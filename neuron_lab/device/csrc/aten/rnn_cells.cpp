// Fused LSTM and GRU cells. On accelerators (CUDA, XPU) ATen's nn.LSTM and nn.GRU call
// these fused ops, which have no CPU kernel; on neuron those modules take the CPU's path
// (rnn_as_on_cpu.cpp), and these serve direct calls: composed from CPU ops on device
// memory, one launch per cell step, with the same workspace layout as CUDA's so
// autograd's formulas apply unchanged.
#include "registrations.h"
#include "device/csrc/runtime/runtime.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

namespace neuron {
namespace {

at::Tensor host(const at::Tensor& t) { return host_view(t); }
at::Tensor host(const std::optional<at::Tensor>& t) { return t.has_value() ? host_view(*t) : at::Tensor(); }
bool defined(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// Returns (hy, cy, workspace); workspace holds the activated gates [i, f, g, o].
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell(const at::Tensor& input_gates,
                                                         const at::Tensor& hidden_gates, const at::Tensor& cx,
                                                         const std::optional<at::Tensor>& input_bias,
                                                         const std::optional<at::Tensor>& hidden_bias) {
  const auto device = input_gates.device().index();
  at::Tensor hy, cy, workspace;
  {
    LaunchScope launch(device, "_thnn_fused_lstm_cell");
    auto gates = host(input_gates) + host(hidden_gates);
    if (defined(input_bias)) gates = gates + host(input_bias) + host(hidden_bias);
    auto chunks = gates.chunk(4, 1);
    auto i = chunks[0].sigmoid(), f = chunks[1].sigmoid(), g = chunks[2].tanh(), o = chunks[3].sigmoid();
    cy = f * host(cx) + i * g;
    hy = o * cy.tanh();
    workspace = at::cat({i, f, g, o}, 1);
  }
  return {to_device(hy, device), to_device(cy, device), to_device(workspace, device)};
}

// Returns (grad_gates, grad_cx, grad_bias).
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell_backward(
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy, const at::Tensor& cx,
    const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  const auto device = cx.device().index();
  at::Tensor grad_gates, grad_cx, grad_bias;
  {
    LaunchScope launch(device, "_thnn_fused_lstm_cell_backward");
    auto chunks = host(workspace).chunk(4, 1);
    auto i = chunks[0], f = chunks[1], g = chunks[2], o = chunks[3];
    auto c = host(cx);
    auto tanh_cy = host(cy).tanh();
    auto ghy = defined(grad_hy) ? host(grad_hy) : at::zeros_like(tanh_cy);
    auto gcy = defined(grad_cy) ? host(grad_cy) : at::zeros_like(tanh_cy);
    auto gc = gcy + ghy * o * (1 - tanh_cy * tanh_cy);
    auto gi = gc * g * i * (1 - i);
    auto gf = gc * c * f * (1 - f);
    auto gg = gc * i * (1 - g * g);
    auto go = ghy * tanh_cy * o * (1 - o);
    grad_gates = at::cat({gi, gf, gg, go}, 1);
    grad_cx = gc * f;
    if (has_bias) grad_bias = grad_gates.sum(0);
  }
  return {to_device(grad_gates, device), to_device(grad_cx, device), to_device(grad_bias, device)};
}

// Returns (hy, workspace); workspace holds [r, z, n, hx, hn] (hn with its bias).
std::tuple<at::Tensor, at::Tensor> gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                            const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
                                            const std::optional<at::Tensor>& hidden_bias) {
  const auto device = input_gates.device().index();
  at::Tensor hy, workspace;
  {
    LaunchScope launch(device, "_thnn_fused_gru_cell");
    auto ig = host(input_gates), hg = host(hidden_gates);
    if (defined(input_bias)) {
      ig = ig + host(input_bias);
      hg = hg + host(hidden_bias);
    }
    auto ic = ig.chunk(3, 1), hc = hg.chunk(3, 1);
    auto r = (ic[0] + hc[0]).sigmoid();
    auto z = (ic[1] + hc[1]).sigmoid();
    auto n = (ic[2] + r * hc[2]).tanh();
    auto h = host(hx);
    hy = n + z * (h - n);
    workspace = at::cat({r, z, n, h, hc[2]}, 1);
  }
  return {to_device(hy, device), to_device(workspace, device)};
}

// Returns (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  const auto device = workspace.device().index();
  at::Tensor gig, ghg, ghx, gib, ghb;
  {
    LaunchScope launch(device, "_thnn_fused_gru_cell_backward");
    auto w = host(workspace).chunk(5, 1);
    auto r = w[0], z = w[1], n = w[2], h = w[3], hn = w[4];
    auto gh = host(grad_hy);
    auto gn = gh * (1 - z) * (1 - n * n);
    auto gz = gh * (h - n) * z * (1 - z);
    auto gr = gn * hn * r * (1 - r);
    gig = at::cat({gr, gz, gn}, 1);
    ghg = at::cat({gr, gz, gn * r}, 1);
    ghx = gh * z;
    if (has_bias) {
      gib = gig.sum(0);
      ghb = ghg.sum(0);
    }
  }
  return {to_device(gig, device), to_device(ghg, device), to_device(ghx, device), to_device(gib, device),
          to_device(ghb, device)};
}

}  // namespace

void register_fused_rnn_cells(torch::Library& m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(lstm_cell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(lstm_cell_backward));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(gru_cell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(gru_cell_backward));
}

}  // namespace neuron
