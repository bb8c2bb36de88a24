#include "step_capture.h"

#include <algorithm>
#include <set>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "kiln/internal/capture.h"
#include "kiln/log.h"
#include "optimizer_probe.h"

namespace kiln {

namespace {

// The optimizer state tensors LibTorch's optimizers keep, by name.
void optimizer_state_tensors(const torch::optim::OptimizerParamState& st,
                             std::vector<std::pair<std::string, at::Tensor>>& out) {
  if (auto* s = dynamic_cast<const torch::optim::SGDParamState*>(&st)) {
    out.emplace_back("momentum_buffer", s->momentum_buffer());
  } else if (auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(&st)) {
    out.emplace_back("exp_avg", s->exp_avg());
    out.emplace_back("exp_avg_sq", s->exp_avg_sq());
    out.emplace_back("max_exp_avg_sq", s->max_exp_avg_sq());
  } else if (auto* s = dynamic_cast<const torch::optim::AdamParamState*>(&st)) {
    out.emplace_back("exp_avg", s->exp_avg());
    out.emplace_back("exp_avg_sq", s->exp_avg_sq());
    out.emplace_back("max_exp_avg_sq", s->max_exp_avg_sq());
  } else if (auto* s = dynamic_cast<const torch::optim::RMSpropParamState*>(&st)) {
    out.emplace_back("square_avg", s->square_avg());
    out.emplace_back("momentum_buffer", s->momentum_buffer());
    out.emplace_back("grad_avg", s->grad_avg());
  } else if (auto* s = dynamic_cast<const torch::optim::AdagradParamState*>(&st)) {
    out.emplace_back("sum", s->sum());
  }
}

// Every tensor the step may read besides constants, with its role and a name for dumps and
// messages: "input.0", "0.weight", "grad.0.weight", "optimizer1.0.weight.exp_avg".
std::vector<KnownTensor> known_tensors(const std::vector<at::Tensor>& inputs, const StepState& state,
                                       const StepGuards& guards) {
  std::vector<KnownTensor> known;
  for (size_t i = 0; i < inputs.size(); ++i)
    known.push_back({inputs[i], ir::InputRole::UserInput, "input." + std::to_string(i), static_cast<int>(i)});
  std::unordered_map<const void*, std::string> param_name;
  for (const auto& [name, p] : guards.params()) {
    known.push_back({p, ir::InputRole::Parameter, name});
    param_name[p.unsafeGetTensorImpl()] = name;
    if (p.grad().defined()) known.push_back({p.grad(), ir::InputRole::Gradient, "grad." + name});
  }
  for (size_t m = 0; m < state.modules.size(); ++m) {
    const std::string prefix = state.modules.size() > 1 ? "module" + std::to_string(m) + "." : "";
    for (auto& b : state.modules[m]->named_buffers(true))
      if (b.value().defined()) known.push_back({b.value(), ir::InputRole::Buffer, prefix + b.key()});
  }
  for (size_t o = 0; o < state.optimizers.size(); ++o) {
    for (const auto& [key, st] : state.optimizers[o]->state()) {
      auto it = param_name.find(key);
      const std::string pname = it != param_name.end() ? it->second : "param" + std::to_string(known.size());
      std::vector<std::pair<std::string, at::Tensor>> ts;
      optimizer_state_tensors(*st, ts);
      for (auto& [field, t] : ts)
        if (t.defined())
          known.push_back({t, ir::InputRole::OptimizerState,
                           "optimizer" + (o ? std::to_string(o) : std::string()) + "." + pname + "." + field});
    }
  }
  return known;
}

}  // namespace

CaptureOutcome capture_step(const StepFn& fn, const std::vector<at::Tensor>& inputs, const StepState& state,
                            const StepGuards& guards) {
  CaptureOutcome out;
  const auto& params = guards.params();
  std::set<const c10::TensorImpl*> grads_before;
  std::vector<std::pair<std::string, at::Tensor>> none_grads;
  std::vector<CapturedStep::ReadGrad> had_grads;  // the gradients as the step found them
  for (const auto& [name, p] : params)
    if (p.grad().defined()) {
      grads_before.insert(p.grad().unsafeGetTensorImpl());
      had_grads.push_back({name, p, p.grad()});
    } else if (p.requires_grad()) {
      none_grads.emplace_back(name, p);
    }
  const size_t state_entries = optimizer_state_entries(state.optimizers);
  StepRecorder rec(known_tensors(inputs, state, guards));
  out.results = rec.run([&] { return fn(inputs); });
  if (!rec.ok()) {
    out.failure = "kiln: the step cannot be captured: " + rec.failure().reason;
    return out;
  }
  if (optimizer_state_entries(state.optimizers) != state_entries) {
    out.retry = true;
    out.failure = "kiln: an optimizer created state for new parameters during this step";
    return out;
  }
  CapturedStep& cs = out.step;
  for (size_t k = 0; k < out.results.size(); ++k) {
    const auto v = rec.value_of(out.results[k]);
    if (v == ir::kNoValue) {
      out.failure = "kiln: the step's result " + std::to_string(k) + " was not computed by ATen ops in the step";
      return out;
    }
    rec.add_output(v, "result." + std::to_string(k), ir::OutputRole::Result, static_cast<int32_t>(k));
  }
  cs.num_results = out.results.size();
  cs.none_grads = std::move(none_grads);
  cs.grad_params.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    const auto& g = p.grad();
    if (!g.defined() || grads_before.count(g.unsafeGetTensorImpl())) continue;
    const auto v = rec.value_of(g);
    if (v == ir::kNoValue) continue;
    rec.add_output(v, "grad." + name, ir::OutputRole::Gradient, static_cast<int32_t>(i));
    cs.grad_params[i] = p;
  }
  for (const auto& r : rec.host_reads())
    log_info("kiln: the step reads a value on the host (" + r +
             "); the compiled step computes it on the device, "
             "and the host code that used it ran once, at capture");
  cs.raw = std::move(rec.graph());
  for (size_t i = 0; i < cs.raw.inputs.size(); ++i) {
    const auto& in = cs.raw.inputs[i];
    if (rec.input_user_index()[i] >= 0) {
      cs.user[in.name] = rec.input_user_index()[i];
      continue;
    }
    const at::Tensor& t = rec.input_tensors()[i];
    cs.bound[in.name] = t;
    // A gradient read where it is: as itself, or through an alias of it (an optimizer's
    // p.grad().data(), which the graph holds as a constant over the same memory).
    if ((in.role == ir::InputRole::Gradient || in.role == ir::InputRole::Constant) && t.defined() && t.has_storage())
      for (const auto& h : had_grads) {
        if (!h.grad.has_storage() || !h.grad.storage().is_alias_of(t.storage())) continue;
        const bool whole = t.sizes() == h.grad.sizes() && t.strides() == h.grad.strides() &&
                           t.storage_offset() == h.grad.storage_offset() && t.dtype() == h.grad.dtype();
        if (whole) cs.grad_inputs[in.name] = h.param;
        auto r = std::find_if(cs.read_grads.begin(), cs.read_grads.end(),
                              [&](const CapturedStep::ReadGrad& x) { return x.name == h.name; });
        if (r == cs.read_grads.end()) r = cs.read_grads.insert(cs.read_grads.end(), h);
        r->rebound = r->rebound && whole;
      }
    if (in.role == ir::InputRole::Parameter || in.role == ir::InputRole::Buffer ||
        in.role == ir::InputRole::OptimizerState)
      cs.storage_tensor[cs.raw.value(in.value).storage] = rec.input_tensors()[i];
  }
  return out;
}

}  // namespace kiln
