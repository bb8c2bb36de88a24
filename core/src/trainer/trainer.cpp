#include "kiln/trainer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <typeinfo>

#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/where.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/stack.h>
#include <c10/util/StringUtil.h>
#include <c10/util/TypeIndex.h>
#include <torch/nn/modules/normalization.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/zeros.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include "../distributed/ddp.h"
#include "checkpoint.h"
#include "kiln/compile.h"
#include "kiln/internal/json_text.h"
#include "kiln/log.h"
#include "kiln/memory.h"
#include "kiln/precision.h"
#include "progress.h"

namespace kiln {

namespace {

// bf16 / fp16: the forward and the loss under autocast (kiln::AutocastGuard), as Hugging Face wraps them.
using Autocast = AutocastGuard;

// Hugging Face's decay parameters: every parameter but biases and normalisation layers' weights
// (a LayerNorm module's, and by name: "bias", "layernorm", "rmsnorm", a part "norm" or "..._norm").
bool decays(const std::string& name, const at::Tensor& p, const std::set<const void*>& layer_norm_params) {
  if (layer_norm_params.count(p.unsafeGetTensorImpl())) return false;
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (n.find("bias") != std::string::npos || n.find("layernorm") != std::string::npos ||
      n.find("rmsnorm") != std::string::npos)
    return false;
  size_t start = 0;
  while (start <= n.size()) {
    const size_t dot = n.find('.', start);
    const std::string part = n.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part == "norm" || (part.size() > 5 && part.compare(part.size() - 5, 5, "_norm") == 0)) return false;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return true;
}

template <class T>
struct Kind {
  using type = T;
};

// The optimizer a Trainer makes when it is given none, as Hugging Face's does (optim, learning_rate
// or 5e-5, weight_decay on the decay parameters only, adam_beta1/2 and adam_epsilon).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(torch::nn::Module& model, const TrainingArguments& a) {
  const double lr = a.learning_rate.value_or(5e-5);
  std::set<const void*> layer_norm_params;
  for (const auto& m : model.modules(/*include_self=*/true))
    if (dynamic_cast<torch::nn::LayerNormImpl*>(m.get()))
      for (const auto& p : m->parameters(/*recurse=*/false)) layer_norm_params.insert(p.unsafeGetTensorImpl());
  std::vector<at::Tensor> decay, no_decay;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    if (!p.value().requires_grad()) continue;
    (decays(p.key(), p.value(), layer_norm_params) ? decay : no_decay).push_back(p.value());
  }
  if (decay.empty() && no_decay.empty())
    throw std::invalid_argument("kiln::Trainer: the model has no parameter that requires a gradient to optimise");
  // Two groups when weight decay applies to some parameters and not others; else one.
  auto groups_with = [&](const torch::optim::OptimizerOptions& decayed, const torch::optim::OptimizerOptions& plain) {
    std::vector<torch::optim::OptimizerParamGroup> g;
    if (a.weight_decay == 0 || decay.empty() || no_decay.empty()) {
      std::vector<at::Tensor> all = decay;
      all.insert(all.end(), no_decay.begin(), no_decay.end());
      g.emplace_back(all, (decay.empty() ? plain : decayed).clone());
    } else {
      g.emplace_back(decay, decayed.clone());
      g.emplace_back(no_decay, plain.clone());
    }
    return g;
  };
  // The optimizer of kind `Optim` with `options` on the decay parameters, and weight decay 0 on
  // the others.
  auto made = [&](auto kind, auto options) -> std::unique_ptr<torch::optim::Optimizer> {
    using Optim = typename decltype(kind)::type;
    auto plain = options;
    plain.weight_decay(0);
    options.weight_decay(a.weight_decay);
    return std::make_unique<Optim>(groups_with(options, plain), options);
  };
  if (a.optim == "adamw_torch" || a.optim == "adamw_torch_fused")
    return made(Kind<torch::optim::AdamW>{},
                torch::optim::AdamWOptions(lr).betas({a.adam_beta1, a.adam_beta2}).eps(a.adam_epsilon));
  if (a.optim == "sgd") return made(Kind<torch::optim::SGD>{}, torch::optim::SGDOptions(lr));
  if (a.optim == "adagrad") return made(Kind<torch::optim::Adagrad>{}, torch::optim::AdagradOptions(lr));
  if (a.optim == "rmsprop") return made(Kind<torch::optim::RMSprop>{}, torch::optim::RMSpropOptions(lr));
  throw std::invalid_argument("kiln::Trainer: optim '" + a.optim +
                              "' is not one of adamw_torch, adamw_torch_fused, sgd, adagrad, rmsprop");
}

// With an optimizer of the program's own, the keys for the one a Trainer makes change nothing
// (Hugging Face's Trainer ignores them alike): the log names those set.
void warn_unused_optimizer_keys(const TrainingArguments& a) {
  const TrainingArguments d;
  std::vector<std::string> set;
  if (a.optim != d.optim) set.push_back("optim");
  if (a.weight_decay != d.weight_decay) set.push_back("weight_decay");
  if (a.adam_beta1 != d.adam_beta1) set.push_back("adam_beta1");
  if (a.adam_beta2 != d.adam_beta2) set.push_back("adam_beta2");
  if (a.adam_epsilon != d.adam_epsilon) set.push_back("adam_epsilon");
  if (set.empty()) return;
  std::string names;
  for (const auto& n : set) names += (names.empty() ? "" : ", ") + n;
  log_warn("kiln::Trainer: " + names + (set.size() == 1 ? " is" : " are") +
           " set, but the Trainer was given an optimizer, which keeps its own settings (they apply to the "
           "optimizer a Trainer makes when it is given none)");
}

// torch::nn::utils::clip_grad_norm_ (2-norm) op for op, without its host read of the norm: the
// gradients scaled by min(1, max_norm / (norm + 1e-6)), and the norm returned as a tensor, which
// the compiled step hands back for the logs (Hugging Face's grad_norm) with no sync in the step.
at::Tensor clip_gradients(const std::vector<at::Tensor>& parameters, double max_norm) {
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return at::zeros({}, at::kDouble);
  std::vector<at::Tensor> norms;
  norms.reserve(grads.size());
  for (const auto& g : grads) norms.push_back(g.data().norm(2));
  const at::Tensor total = norms.size() == 1 ? norms[0] : at::stack(norms).norm(2);
  const at::Tensor coef = at::clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  for (auto& g : grads) g.data().mul_(coef);
  return total;
}

// fp16 = true: float16 autocast with dynamic loss scaling, torch.amp.GradScaler's algorithm with its
// defaults (which Hugging Face trains fp16 with), compiled into the step with no host read in it:
// the loss times the scale is what the backward differentiates; the gradients are unscaled and
// checked for an inf or a NaN on the device; where there was one, every parameter and optimizer
// state tensor the update wrote gets its value from before the update back (a select, so nothing
// of it survives), and the scale is halved; after 2000 clean steps in a row it doubles. The host's
// part of a skipped update (the step counts of Adam and the others, an SGD momentum buffer it made
// with dampening, the schedule's position) is put back when the Trainer next reads the flag,
// before the next step, a metrics line, a checkpoint or the end of train(): one read of the
// previous step's flag, never of the step still running.
constexpr double kInitScale = 65536.0, kGrowthFactor = 2.0, kBackoffFactor = 0.5;
constexpr double kGrowthInterval = 2000;

struct ScalerState : torch::nn::Module {
  at::Tensor scale, growth_tracker;  // float32 scalars on the model's device
  explicit ScalerState(c10::Device device) {
    const auto f = at::TensorOptions().dtype(at::kFloat).device(device);
    scale = register_buffer("scale", at::full({}, kInitScale, f));
    growth_tracker = register_buffer("growth_tracker", at::zeros({}, f));
  }
};

bool optimizer_state_tensors(const torch::optim::OptimizerParamState& st, std::vector<at::Tensor>& out);

// GradScaler.unscale_: each gradient times the scale's reciprocal (a power of two, so float32's
// reciprocal is the one PyTorch rounds from double), and the flag: 1 when any gradient held an inf
// or a NaN (its sum times zero is then NaN), else 0, as a 0-d float32 on the device.
at::Tensor unscale_gradients(const std::vector<at::Tensor>& parameters, const at::Tensor& scale) {
  const at::Tensor inv = scale.reciprocal();
  at::Tensor poisoned = at::zeros({}, scale.options());
  for (const auto& p : parameters) {
    if (!p.grad().defined()) continue;
    at::Tensor g = p.grad().data();
    poisoned = poisoned + (g * 0).sum().to(at::kFloat);
    g.mul_(inv);
  }
  return poisoned.ne(poisoned).to(at::kFloat);
}

// GradScaler.step without its host read: the optimizer's step, then where `found_inf` is set every
// parameter with a gradient and every state tensor back to its value from before; state the step
// made, to zeros (what a state made at the next step starts from; the host puts its step count
// back when it reads the flag).
void guarded_optimizer_step(torch::optim::Optimizer& optimizer, const at::Tensor& found_inf) {
  std::vector<at::Tensor> live, saved;
  std::set<void*> had;
  {
    torch::NoGradGuard no_grad;
    for (auto& group : optimizer.param_groups())
      for (auto& p : group.params())
        if (p.grad().defined()) live.push_back(p), saved.push_back(p.detach().clone());
    for (const auto& kv : optimizer.state()) {
      had.insert(kv.first);
      std::vector<at::Tensor> ts;
      if (kv.second && optimizer_state_tensors(*kv.second, ts))
        for (auto& t : ts) live.push_back(t), saved.push_back(t.clone());
    }
  }
  optimizer.step();
  torch::NoGradGuard no_grad;
  const at::Tensor skip = found_inf.ne(0);
  for (size_t i = 0; i < live.size(); ++i) live[i].copy_(at::where(skip, saved[i], live[i]));
  for (const auto& kv : optimizer.state()) {
    std::vector<at::Tensor> ts;
    if (had.count(kv.first) || !kv.second || !optimizer_state_tensors(*kv.second, ts)) continue;
    for (auto& t : ts) t.copy_(at::where(skip, at::zeros_like(t), t));
  }
}

// torch._amp_update_scale_: after a step with an inf or a NaN the scale times 0.5 and the counter
// to 0; otherwise the counter plus one, and at 2000 the scale times 2 (kept when that is not
// finite) and the counter to 0.
void update_scale(ScalerState& s, const at::Tensor& found_inf) {
  torch::NoGradGuard no_grad;
  const at::Tensor found = found_inf.ne(0);
  const at::Tensor next = s.growth_tracker + 1;
  const at::Tensor grow = next.eq(kGrowthInterval).logical_and(found.logical_not());
  const at::Tensor grown = s.scale * kGrowthFactor;
  const at::Tensor scale =
      at::where(found, s.scale * kBackoffFactor, at::where(grow.logical_and(at::isfinite(grown)), grown, s.scale));
  const at::Tensor tracker = at::where(found.logical_or(grow), at::zeros_like(next), next);
  s.scale.copy_(scale);
  s.growth_tracker.copy_(tracker);
}

// Decrements the step count of an optimizer state whose update was undone; false for one without.
void undo_step_count(torch::optim::OptimizerParamState& st) {
  auto back = [](auto* s) { s->step(std::max<int64_t>(0, s->step() - 1)); };
  if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(&st)) back(s);
  else if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(&st)) back(s);
  else if (auto* s = dynamic_cast<torch::optim::RMSpropParamState*>(&st)) back(s);
  else if (auto* s = dynamic_cast<torch::optim::AdagradParamState*>(&st)) back(s);
}

}  // namespace

struct Trainer::Impl {
  std::vector<std::shared_ptr<TrainerCallback>> callbacks;
  TrainerState state;
  std::shared_ptr<torch::nn::Module> model;
  ForwardLossFn forward_loss_fn;
  torch::optim::Optimizer* optimizer;
  std::unique_ptr<torch::optim::Optimizer> own_optimizer;  // the one the Trainer made, when given none
  // With max_grad_norm > 0: the gradients' total norm before clipping at the last step (a 0-d
  // tensor on the model's device, read only when logged); undefined without clipping.
  at::Tensor grad_norm;
  // bf16 / fp16: the forward and the loss run under autocast to this type on the model's device
  // (float: no autocast).
  at::ScalarType amp_dtype = at::kFloat;
  c10::DeviceType amp_device = c10::kCPU;
  // fp16: the loss scale and its growth counter, as buffers of a module of their own that every
  // compiled step lists with the model, so that it reads and updates them in place on the device.
  std::shared_ptr<ScalerState> scaler;
  // The last step's flag (gradients with an inf or a NaN: its update was undone on the device),
  // read by settle_scaler before anything on the host depends on it; the optimizer's state entries
  // before that step; the optimizer steps skipped so far, which the schedule does not count.
  at::Tensor pending_found_inf;
  std::set<void*> state_keys_before;
  int64_t skipped_steps = 0;
  void settle_scaler();
  // Before a step that may be skipped: what settle_scaler needs to undo it on the host.
  void before_scaled_step() {
    settle_scaler();
    if (!scaler) return;
    state_keys_before.clear();
    for (const auto& kv : optimizer->state()) state_keys_before.insert(kv.first);
  }
  // The optimizer's step under fp16: unscaled gradients, the flag, the guarded update and the
  // scale's update; the flag is returned (a 0-d float32 on the device).
  at::Tensor scaled_update(at::Tensor* norm);
  // After the backward (and the gradients' all_reduce): clipping, the optimizer (under fp16 the
  // scaled update), the next step's rates. Returns the fp16 flag (undefined without fp16).
  at::Tensor update_parameters(at::Tensor* norm);
  // step()'s and step_with_outputs()'s function: the loss, the forward's tensors when asked, the
  // norm with clipping, the fp16 flag last.
  std::vector<at::Tensor> one_step(const std::vector<at::Tensor>& in, bool with_outputs);
  // What a compiled step lists: the model (and fp16's scale), and the optimizer when it updates.
  StepState step_state(bool updates) const {
    std::vector<std::shared_ptr<torch::nn::Module>> modules{model};
    if (scaler) modules.push_back(scaler);
    return StepState{
        modules, updates ? std::vector<torch::optim::Optimizer*>{optimizer} : std::vector<torch::optim::Optimizer*>{}};
  }
  at::Tensor forward_loss(const std::vector<at::Tensor>& x, const at::Tensor& target) {
    Autocast amp(amp_dtype, amp_device);
    return forward_loss_fn(x, target, nullptr);
  }
  void setup(std::shared_ptr<torch::nn::Module> m, ForwardLossFn f, torch::optim::Optimizer* opt,
             TrainingArguments args);
  double max_grad_norm = 0;
  std::unique_ptr<CompiledStep> step;
  // train() with gradient_accumulation_steps > 1, as Hugging Face runs it: each micro-batch
  // through `micro` (forward and backward, its loss divided by the group's count, the gradients
  // added into .grad where they are), then one `update` (the gradients' all_reduce, clipping, the
  // optimizer, the gradients zeroed in place). Each is compiled once, whatever the count, and a
  // short last group is the same two steps. Made at the first group; `per_micro` tensors a
  // micro-batch (its inputs, then its target).
  std::unique_ptr<CompiledStep> micro, update;
  size_t per_micro = 0;
  CompiledStep* last = nullptr;  // the step that ran last, for stats()
  // stats() after accumulating groups: the micro-step's and the update's counts together, summed
  // when asked for.
  StepStats accumulated;
  void sum_accumulated_stats();
  // During train(): the next optimizer step's learning rate, which the step function sets right
  // after the update. Host state only, so a compiled step never runs it; but the capture runs the
  // function, and the optimizer probe's look-ahead right after the capture then replays step()
  // with the next rate: a scheduled rate is a run-time scalar of the first plan, and the step is
  // not planned again when the rate first moves.
  std::optional<double> next_factor;  // the schedule's factor of the next step
  void set_next_rates() {
    if (next_factor) set_rates(*next_factor);
  }
  // train()'s schedule scales each parameter group's peak rate (Hugging Face's base_lrs):
  // learning_rate when it is set, else the group's own lr, as the optimizer had it at the first
  // train() (or as the checkpoint a run resumes from says).
  std::vector<double> peak_lrs;
  void set_rates(double factor) {
    auto& groups = optimizer->param_groups();
    if (plateau.on) {
      for (size_t i = 0; i < groups.size() && i < plateau.lrs.size(); ++i) groups[i].options().set_lr(plateau.lrs[i]);
      return;
    }
    for (size_t i = 0; i < groups.size() && i < peak_lrs.size(); ++i) groups[i].options().set_lr(peak_lrs[i] * factor);
  }
  // lr_scheduler_type "reduce_lr_on_plateau": PyTorch's ReduceLROnPlateau, stepped as Hugging Face
  // steps it, once after each evaluation on metric_for_best_model ("loss" unless named), with its
  // arguments from lr_scheduler_kwargs. No warmup, no per-step schedule: the rates it sets stay
  // until an evaluation lowers them.
  struct Plateau {
    bool on = false;
    bool max_mode = false, relative = true;
    double factor = 0.1, threshold = 1e-4, min_lr = 0, eps = 1e-8;
    int64_t patience = 10, cooldown = 0;
    double best = 0;
    int64_t bad = 0, cooldown_left = 0;  // evaluations without improvement; cooldown still to wait
    std::vector<double> lrs;             // each parameter group's rate
    bool better(double m) const {
      if (max_mode) return relative ? m > best * (1 + threshold) : m > best + threshold;
      return relative ? m < best * (1 - threshold) : m < best - threshold;
    }
    // One evaluation's metric; true when it lowered a rate.
    bool step(double metric) {
      if (better(metric)) {
        best = metric;
        bad = 0;
      } else {
        ++bad;
      }
      if (cooldown_left > 0) --cooldown_left, bad = 0;
      if (bad <= patience) return false;
      bool lowered = false;
      for (double& lr : lrs) {
        const double next = std::max(lr * factor, min_lr);
        if (lr - next > eps) lr = next, lowered = true;
      }
      cooldown_left = cooldown;
      bad = 0;
      return lowered;
    }
  } plateau;
  ComputeMetricsFn compute_metrics;
  // train()'s and evaluate()'s micro-batches; none: examples stacked (stack_examples).
  DataCollator collator;
  // The examples order[begin, end) of `dataset` as one micro-batch: its inputs, then its target
  // (`per` tensors; 0 when not known yet).
  std::vector<at::Tensor> make_batch(const Dataset& dataset, const std::vector<int64_t>& order, int64_t begin,
                                     int64_t end, size_t per, const char* who) const;

  // Data parallelism: the group and the reducer the step functions call after the backward (both
  // null in a world of one), the log level of every rank but 0, and the calls made so far (which
  // name a failure's store keys alike on every rank).
  std::shared_ptr<distributed::Group> group;
  std::unique_ptr<distributed::GradientReducer> reducer;
  std::string replica_log_level;
  int64_t calls = 0;
  std::map<const CompiledStep*, int> checked_compiles;
  void reduce_gradients() {
    if (reducer) reducer->reduce(model->named_parameters(true).pairs());
  }
  void join(std::shared_ptr<distributed::Group> g, const TrainingArguments& args);
  // One call of a compiled step; with a group, a failed collective names this rank, the step and
  // the ranks that stopped answering, and a new compile is compared across the ranks before its
  // first run.
  std::vector<at::Tensor> call(CompiledStep& cs, const std::vector<at::Tensor>& inputs);
  void check_same_step(const CompiledStep& cs);
  // The mean of `v` over the ranks (the logged losses, as Hugging Face logs them); `v` alone.
  double mean_over_ranks(double v) const;

  void make_accumulate(const TrainingArguments& args);
  // step_with_outputs(): step()'s function, also returning the forward's tensors; made at its first call.
  std::unique_ptr<CompiledStep> step_outputs;
  void make_step_outputs();
  // `factor`, `factor_next`: the schedule's factors of the step the run continues with and of the
  // one after.
  void prepare_compiled_steps(const Dataset& dataset, const checkpoint::LoopState& resumed, double factor,
                              double factor_next,
                              const std::function<at::Tensor(const std::vector<at::Tensor>&)>& run_step);
  // evaluate()'s metrics, in the order the metrics line writes them, each name "<prefix>_...";
  // `keep`: also the outputs and targets (predict()).
  std::vector<std::pair<std::string, double>> evaluate(const Dataset& dataset, int64_t batch_size,
                                                       const std::string& prefix = "eval",
                                                       EvalPrediction* keep = nullptr);
};

void Trainer::Impl::make_accumulate(const TrainingArguments& args) {
  auto replica_args = [this](TrainingArguments a) {
    if (!replica_log_level.empty()) a.log_level = replica_log_level;
    return a;
  };
  auto* im = this;
  // The last input is the divisor (the group's micro-batch count, a float32 scalar on the model's
  // device): an input rather than a number in the graph, so that a group of another count runs
  // the same plan.
  micro = std::make_unique<CompiledStep>(
      [im](const std::vector<at::Tensor>& in) {
        const std::vector<at::Tensor> x(in.begin(), in.end() - 2);
        auto l = im->forward_loss(x, in[in.size() - 2]) / in.back();
        (im->scaler ? l * im->scaler->scale : l).backward();
        return std::vector<at::Tensor>{l.detach()};
      },
      step_state(false), replica_args(args));
  // Its outputs: the gradients' norm with clipping, and under fp16 the flag last.
  update = std::make_unique<CompiledStep>(
      [im](const std::vector<at::Tensor>&) {
        im->reduce_gradients();
        at::Tensor norm;
        const at::Tensor found_inf = im->update_parameters(&norm);
        // Zeroed where they are, not set to none: the micro-step's plan adds into these tensors.
        {
          torch::NoGradGuard no_grad;
          for (auto& p : im->model->parameters())
            if (p.grad().defined()) p.mutable_grad().zero_();
        }
        std::vector<at::Tensor> out;
        if (norm.defined()) out.push_back(norm.detach());
        if (found_inf.defined()) out.push_back(found_inf);
        return out;
      },
      step_state(true), replica_args(args));
}

at::Tensor Trainer::Impl::scaled_update(at::Tensor* norm) {
  const auto params = model->parameters();
  at::Tensor found_inf = unscale_gradients(params, scaler->scale);
  // Clipping sees the unscaled gradients, as after Hugging Face's unscale_.
  if (max_grad_norm > 0) *norm = clip_gradients(params, max_grad_norm);
  guarded_optimizer_step(*optimizer, found_inf);
  update_scale(*scaler, found_inf);
  return found_inf;
}

void Trainer::Impl::settle_scaler() {
  if (!pending_found_inf.defined()) return;
  const bool skipped = pending_found_inf.item<float>() != 0;
  pending_found_inf = at::Tensor();
  if (!skipped) return;
  ++skipped_steps;
  // As if the optimizer had not stepped: step counts back (a state the step made is zeros with a
  // count of 0 now, which is where a state made at the next step starts). SGD makes its momentum
  // buffer as a copy of the first gradient, which a buffer of zeros equals only without dampening:
  // with dampening such a state is dropped.
  bool dampened = false;
  if (auto* sgd = dynamic_cast<torch::optim::SGD*>(optimizer))
    for (auto& g : sgd->param_groups())
      dampened = dampened || static_cast<torch::optim::SGDOptions&>(g.options()).dampening() != 0;
  auto& state = optimizer->state();
  for (auto it = state.begin(); it != state.end();) {
    if (dampened && !state_keys_before.count(it->first)) {
      it = state.erase(it);
      continue;
    }
    if (it->second) undo_step_count(*it->second);
    ++it;
  }
  log_info(
      c10::str("kiln::Trainer: fp16: gradients held an inf or a NaN, so the optimizer step was skipped and "
               "the loss scale lowered to ",
               scaler->scale.item<double>(), " (", skipped_steps, " skipped so far)"));
}

void Trainer::Impl::make_step_outputs() {
  auto* im = this;
  TrainingArguments args = step->args();
  if (!replica_log_level.empty()) args.log_level = replica_log_level;
  step_outputs = std::make_unique<CompiledStep>(
      [im](const std::vector<at::Tensor>& in) { return im->one_step(in, true); }, step_state(true), std::move(args));
}

std::vector<at::Tensor> Trainer::Impl::one_step(const std::vector<at::Tensor>& in, bool with_outputs) {
  optimizer->zero_grad();
  const std::vector<at::Tensor> x(in.begin(), in.end() - 1);
  std::vector<at::Tensor> outputs;
  at::Tensor loss;
  {
    Autocast amp(amp_dtype, amp_device);
    loss = forward_loss_fn(x, in.back(), with_outputs ? &outputs : nullptr);
  }
  (scaler ? loss * scaler->scale : loss).backward();
  reduce_gradients();
  at::Tensor norm;
  const at::Tensor found_inf = update_parameters(&norm);
  std::vector<at::Tensor> out{loss.detach()};
  for (const auto& o : outputs) out.push_back(o.detach());
  if (norm.defined()) out.push_back(norm.detach());
  if (found_inf.defined()) out.push_back(found_inf);
  return out;
}

at::Tensor Trainer::Impl::update_parameters(at::Tensor* norm) {
  at::Tensor found_inf;
  if (scaler) {
    found_inf = scaled_update(norm);
  } else {
    if (max_grad_norm > 0) *norm = clip_gradients(model->parameters(), max_grad_norm);
    optimizer->step();
  }
  set_next_rates();
  return found_inf;
}

void Trainer::Impl::sum_accumulated_stats() {
  const StepStats& m = micro->stats();
  accumulated = update->stats();
  StepStats& a = accumulated;
  a.steps += m.steps;
  a.eager_steps += m.eager_steps;
  a.compiled_steps += m.compiled_steps;
  a.compiles += m.compiles;
  a.failed_captures += m.failed_captures;
  a.rebuilds += m.rebuilds;
  a.recaptures += m.recaptures;
  a.last_compile_seconds += m.last_compile_seconds;
  if (!m.last_fallback.empty()) a.last_fallback = m.last_fallback;
  a.graphs_recorded += m.graphs_recorded;
  a.graph_replays += m.graph_replays;
  if (!m.last_graph_skip.empty()) a.last_graph_skip = m.last_graph_skip;
  a.adopted_writebacks += m.adopted_writebacks;
  a.copied_writebacks += m.copied_writebacks;
  a.probe_seconds += m.probe_seconds;
  a.groups.insert(a.groups.begin(), m.groups.begin(), m.groups.end());
  a.shape_specialisations += m.shape_specialisations;
  a.shape_evictions += m.shape_evictions;
  a.dynamic_dims = m.dynamic_dims;
  if (!m.last_recompile_reason.empty()) a.last_recompile_reason = m.last_recompile_reason;
}

namespace {

// Hugging Face's schedules (transformers.optimization), as a factor of the peak learning rate at
// optimizer step `step` (0-based) of `total`; `kw` holds lr_scheduler_kwargs (checked by the
// configuration), `lr_init` the first parameter group's peak (Hugging Face's optimizer default lr,
// which polynomial and cosine_with_min_lr's min_lr are relative to).
double schedule_factor(const std::string& type, const std::map<std::string, std::string>& kw, int64_t step,
                       int64_t warmup, int64_t total, double lr_init) {
  auto arg = [&](const char* name, double otherwise) {
    const auto it = kw.find(name);
    return it == kw.end() ? otherwise : std::stod(it->second);
  };
  const double linear_warmup = static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
  const double progress =
      static_cast<double>(step - warmup) / static_cast<double>(std::max<int64_t>(1, total - warmup));
  if (type == "constant" || type == "reduce_lr_on_plateau") return 1.0;
  if (type == "warmup_stable_decay") {
    const double min_ratio = arg("min_lr_ratio", 0.0), cycles = arg("num_cycles", 0.5);
    const auto decay = static_cast<int64_t>(arg("num_decay_steps", 0));
    const auto stable =
        kw.count("num_stable_steps") ? static_cast<int64_t>(arg("num_stable_steps", 0)) : total - warmup - decay;
    if (step < warmup) return std::max(0.0, linear_warmup * (1.0 - min_ratio) + min_ratio);
    if (step < warmup + stable) return 1.0;
    if (step < warmup + stable + decay) {
      const double p = static_cast<double>(step - warmup - stable) / static_cast<double>(std::max<int64_t>(1, decay));
      const auto it = kw.find("decay_type");
      const std::string how = it == kw.end() ? "cosine" : it->second;
      const double f = how == "linear"   ? 1.0 - p
                       : how == "1-sqrt" ? 1.0 - std::sqrt(p)
                                         : 0.5 * (1.0 + std::cos(M_PI * cycles * 2.0 * p));
      return std::max(0.0, f * (1.0 - min_ratio) + min_ratio);
    }
    return min_ratio;
  }
  if (step < warmup) return linear_warmup;
  if (type == "constant_with_warmup") return 1.0;
  if (type == "linear")
    return std::max(0.0, static_cast<double>(total - step) / static_cast<double>(std::max<int64_t>(1, total - warmup)));
  if (type == "cosine") return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * arg("num_cycles", 0.5) * 2.0 * progress)));
  if (type == "cosine_with_restarts") {
    if (progress >= 1.0) return 0.0;
    return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * std::fmod(arg("num_cycles", 1.0) * progress, 1.0))));
  }
  if (type == "cosine_with_min_lr") {
    const double rate = kw.count("min_lr") ? arg("min_lr", 0) / lr_init : arg("min_lr_rate", 0);
    const double f = 0.5 * (1.0 + std::cos(M_PI * arg("num_cycles", 0.5) * 2.0 * progress));
    return std::max(0.0, f * (1.0 - rate) + rate);
  }
  if (type == "polynomial") {
    const double lr_end = arg("lr_end", 1e-7), power = arg("power", 1.0);
    if (step > total) return lr_end / lr_init;
    const double remaining =
        1.0 - static_cast<double>(step - warmup) / static_cast<double>(std::max<int64_t>(1, total - warmup));
    return ((lr_init - lr_end) * std::pow(remaining, power) + lr_end) / lr_init;
  }
  if (type == "inverse_sqrt") {
    const double timescale = arg("timescale", warmup > 0 ? static_cast<double>(warmup) : 10000.0);
    return 1.0 / std::sqrt((static_cast<double>(step) + timescale - static_cast<double>(warmup)) / timescale);
  }
  throw std::invalid_argument("kiln::Trainer: unknown lr_scheduler_type '" + type + "'");
}

// A number for people (log lines, the progress line): `digits` significant digits, shortest form
// ("0.5", "3.277", "0.002991"). The metrics file keeps every digit (json_number).
std::string display_number(double d, int digits = 4) {
  if (!std::isfinite(d)) return std::isnan(d) ? "nan" : d < 0 ? "-inf" : "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*g", digits, d);
  return buf;
}

// Learning rates for people: "0.001", or "[0.001, 0.0001]" when the parameter groups differ.
std::string rates_text(const std::vector<double>& rates) {
  if (rates.empty()) return "none";
  if (std::all_of(rates.begin(), rates.end(), [&](double r) { return r == rates[0]; })) return display_number(rates[0]);
  std::string t = "[";
  for (size_t i = 0; i < rates.size(); ++i) t += (i ? ", " : "") + display_number(rates[i]);
  return t + "]";
}

// A metric as JSON: a whole number as an integer (step 10, not 10.0, as the file has always had it),
// any other with just the digits that read back as it (0.1, not 0.10000000000000001; nlohmann's
// Grisu2), and one that is not finite as null (nlohmann writes NaN and infinities so).
Json json_number(double d) {
  if (std::isfinite(d) && d == std::trunc(d) && std::abs(d) < 1e15) return static_cast<int64_t>(d);
  return d;
}

// Seconds for people: 0.38, 12.4, 301.
std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 10 ? "%.2f" : s < 100 ? "%.1f" : "%.0f", s);
  return buf;
}

// One metrics line: {"k": v, ...} in the given order, on one line (JSON Lines).
std::string json_line(const std::vector<std::pair<std::string, double>>& fields) {
  Json j = Json::object();
  for (const auto& [k, v] : fields) j[k] = json_number(v);
  return json_text(j);
}

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The examples order[begin, end) of `dataset`, stacked along a new dim 0: its inputs, then its
// target (`per_example` tensors).
std::vector<at::Tensor> stack_examples(const Dataset& dataset, const std::vector<int64_t>& order, int64_t begin,
                                       int64_t end, size_t per_example, const char* who) {
  std::vector<std::vector<at::Tensor>> slots(per_example);
  for (int64_t i = begin; i < end; ++i) {
    const int64_t index = order[static_cast<size_t>(i)];
    Example e = dataset.get(static_cast<size_t>(index));
    if (e.inputs.size() + 1 != per_example)
      throw std::invalid_argument(std::string(who) + ": example " + std::to_string(index) + " has " +
                                  std::to_string(e.inputs.size()) + " inputs, the first has " +
                                  std::to_string(per_example - 1));
    for (size_t s = 0; s + 1 < per_example; ++s) slots[s].push_back(std::move(e.inputs[s]));
    slots.back().push_back(std::move(e.target));
  }
  std::vector<at::Tensor> out;
  for (auto& s : slots) out.push_back(at::stack(s));
  return out;
}

// A micro-batch's shapes, as a layout records them: "[8,40][8,40][8]" (one word).
std::string shapes_text(const std::vector<at::Tensor>& ts) {
  std::string out;
  for (const auto& t : ts) {
    out += "[";
    for (int64_t d = 0; d < t.dim(); ++d) out += (d ? "," : "") + std::to_string(t.size(d));
    out += "]";
  }
  return out;
}

// Hugging Face's nested_concat for the evaluation's outputs and targets: the batches' tensors along
// dim 0, each first padded with -100 to the largest size of every other dim when they differ
// (batches padded to different lengths).
at::Tensor concat_padded(const std::vector<at::Tensor>& ts) {
  std::vector<int64_t> shape = ts[0].sizes().vec();
  bool differ = false;
  for (const auto& t : ts) {
    if (t.dim() != ts[0].dim() || t.dim() == 0) return at::cat(ts);  // at::cat says what is wrong
    for (int64_t d = 1; d < t.dim(); ++d) {
      differ = differ || t.size(d) != shape[static_cast<size_t>(d)];
      shape[static_cast<size_t>(d)] = std::max(shape[static_cast<size_t>(d)], t.size(d));
    }
  }
  if (!differ) return at::cat(ts);
  std::vector<at::Tensor> padded;
  for (const auto& t : ts) {
    shape[0] = t.size(0);
    at::Tensor out = at::full(shape, -100, t.options());
    at::Tensor region = out;
    for (int64_t d = 1; d < t.dim(); ++d) region = region.narrow(d, 0, t.size(d));
    region.copy_(t);
    padded.push_back(out);
  }
  return at::cat(padded);
}

// The checkpoint folder resume_from_checkpoint names: "" for none ("" or "false"), the newest
// checkpoint-<step> of output_dir for "true" or "last" (Hugging Face's get_last_checkpoint).
std::string resume_folder(const TrainingArguments& a) {
  std::string r = a.resume_from_checkpoint;
  std::string lower = r;
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower.empty() || lower == "false") return "";
  if (lower != "true" && lower != "last") return r;
  if (a.output_dir.empty())
    throw CheckpointError("resume_from_checkpoint",
                          "'" + r + "' means the newest checkpoint in output_dir, and output_dir is not set");
  std::string found = checkpoint::last(a.output_dir);
  if (found.empty())
    throw CheckpointError(a.output_dir,
                          "no checkpoint-<step> folder to resume from (resume_from_checkpoint '" + r + "')");
  return found;
}

// "step 8" for a group of one micro-batch of 8 examples, "accumulate 8 8 4" for several.
std::string layout_text(const std::vector<int64_t>& sizes) {
  std::string out = sizes.size() == 1 ? "step" : "accumulate";
  for (int64_t m : sizes) out += " " + std::to_string(m);
  return out;
}

std::vector<int64_t> layout_sizes(const std::string& text) {
  std::istringstream in(text.rfind("warm-up ", 0) == 0 ? text.substr(8) : text);
  std::string kind;
  in >> kind;
  std::vector<int64_t> sizes;
  for (int64_t m; in >> m;) sizes.push_back(m);
  return sizes;
}

// With a data collator a layout also holds the micro-batches' shapes, which tell its compiled
// signatures apart, and, after " @ ", the examples of the step that first had them, which make the
// same batch again when a resumed run replays it: "step 8 [8,40][8,40][8,40] @ 3 17 ...".
std::string layout_key(const std::string& entry) { return entry.substr(0, entry.find(" @ ")); }

std::vector<int64_t> layout_examples(const std::string& entry) {
  std::vector<int64_t> out;
  const size_t at = entry.find(" @ ");
  if (at == std::string::npos) return out;
  std::istringstream in(entry.substr(at + 3));
  for (int64_t i; in >> i;) out.push_back(i);
  return out;
}

// The state tensors of LibTorch's optimizers; false for an optimizer of another kind.
bool optimizer_state_tensors(const torch::optim::OptimizerParamState& st, std::vector<at::Tensor>& out) {
  if (auto* s = dynamic_cast<const torch::optim::SGDParamState*>(&st)) {
    out = {s->momentum_buffer()};
  } else if (auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(&st)) {
    out = {s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()};
  } else if (auto* s = dynamic_cast<const torch::optim::AdamParamState*>(&st)) {
    out = {s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()};
  } else if (auto* s = dynamic_cast<const torch::optim::RMSpropParamState*>(&st)) {
    out = {s->square_avg(), s->momentum_buffer(), s->grad_avg()};
  } else if (auto* s = dynamic_cast<const torch::optim::AdagradParamState*>(&st)) {
    out = {s->sum()};
  } else {
    return false;
  }
  out.erase(std::remove_if(out.begin(), out.end(), [](const at::Tensor& t) { return !t.defined(); }), out.end());
  return true;
}

// trainer_state.json: Hugging Face's TrainerState fields, and where in the data kiln's loop is.
std::string trainer_state_json(const checkpoint::LoopState& loop, const TrainingArguments& a, int64_t max_steps,
                               int64_t epochs, int64_t logging_steps, int64_t eval_steps, int64_t save_steps,
                               int64_t steps_per_epoch) {
  Json history = Json::array();
  for (const auto& line : loop.log_history) history.push_back(Json::parse(line));  // json_line's, always JSON
  const Json j = {
      {"global_step", loop.global_step},
      {"epoch", json_number(loop.epoch_progress)},
      {"max_steps", max_steps},
      {"num_train_epochs", epochs},
      {"logging_steps", logging_steps},
      {"eval_steps", eval_steps},
      {"save_steps", save_steps},
      {"run_name", a.run_name.empty() ? a.output_dir : a.run_name},
      {"train_batch_size", a.per_device_train_batch_size},
      {"best_metric", loop.best_metric ? json_number(*loop.best_metric) : Json(nullptr)},
      {"best_model_checkpoint", loop.best_model_checkpoint.empty() ? Json(nullptr) : Json(loop.best_model_checkpoint)},
      {"is_world_process_zero", true},
      {"log_history", history},
      {"kiln",
       {{"epoch_index", loop.epoch},
        {"step_in_epoch", loop.step_in_epoch},
        {"steps_per_epoch", steps_per_epoch},
        {"gradient_accumulation_steps", loop.gradient_accumulation_steps},
        {"seed", loop.seed},
        {"group_by_length", loop.group_by_length},
        {"dataset_size", loop.dataset_size}}}};
  return json_text(j, 2) + "\n";
}

}  // namespace

CheckpointError::CheckpointError(std::string file, const std::string& what)
    : std::runtime_error(file + ": " + what), file_(std::move(file)) {}

std::vector<at::Tensor> Trainer::Impl::make_batch(const Dataset& dataset, const std::vector<int64_t>& order,
                                                  int64_t begin, int64_t end, size_t per, const char* who) const {
  if (!collator) return stack_examples(dataset, order, begin, end, per, who);
  std::vector<Example> examples;
  examples.reserve(static_cast<size_t>(end - begin));
  for (int64_t i = begin; i < end; ++i)
    examples.push_back(dataset.get(static_cast<size_t>(order[static_cast<size_t>(i)])));
  Batch b = collator(examples);
  if (!b.target.defined())
    throw std::invalid_argument(std::string(who) + ": the data collator made a batch without a target");
  if (per != 0 && b.inputs.size() + 1 != per)
    throw std::invalid_argument(std::string(who) + ": the data collator made a batch of " +
                                std::to_string(b.inputs.size()) + " inputs, the first batch had " +
                                std::to_string(per - 1));
  std::vector<at::Tensor> out = std::move(b.inputs);
  out.push_back(std::move(b.target));
  return out;
}

Trainer::Trainer(std::shared_ptr<torch::nn::Module> model, ForwardFn forward, torch::optim::Optimizer& optimizer,
                 LossFn loss_fn, TrainingArguments args)
    : Trainer(
          std::move(model), MultiForwardFn([f = std::move(forward)](const std::vector<at::Tensor>& in) {
            if (in.size() != 1)
              throw std::invalid_argument("kiln::Trainer: the forward function takes one tensor, the step was given " +
                                          std::to_string(in.size()));
            return f(in[0]);
          }),
          optimizer, std::move(loss_fn), std::move(args)) {}

namespace {
ForwardLossFn fuse_tensor_forward(MultiForwardFn forward, LossFn loss) {
  return [forward = std::move(forward), loss = std::move(loss)](
             const std::vector<at::Tensor>& in, const at::Tensor& target, std::vector<at::Tensor>* outputs) {
    at::Tensor out = forward(in);
    at::Tensor l = loss(out, target);
    if (outputs) *outputs = {out};
    return l;
  };
}
}  // namespace

Trainer::Trainer(std::shared_ptr<torch::nn::Module> model, MultiForwardFn forward, torch::optim::Optimizer& optimizer,
                 LossFn loss_fn, TrainingArguments args)
    : Trainer(std::move(model), fuse_tensor_forward(std::move(forward), std::move(loss_fn)), &optimizer,
              std::move(args)) {}

Trainer::Trainer(std::shared_ptr<torch::nn::Module> model, MultiForwardFn forward, LossFn loss_fn,
                 TrainingArguments args)
    : Trainer(std::move(model), fuse_tensor_forward(std::move(forward), std::move(loss_fn)), nullptr, std::move(args)) {
}

Trainer::Trainer(std::shared_ptr<torch::nn::Module> model, ForwardLossFn forward_loss,
                 torch::optim::Optimizer* optimizer, TrainingArguments args)
    : impl_(std::make_unique<Impl>()) {
  if (!model) throw std::invalid_argument("kiln::Trainer: the model is null");
  if (!forward_loss) throw std::invalid_argument("kiln::Trainer: the forward and loss function is empty");
  if (optimizer) {
    warn_unused_optimizer_keys(args);
  } else {
    impl_->own_optimizer = make_optimizer(*model, args);
    optimizer = impl_->own_optimizer.get();
  }
  impl_->setup(std::move(model), std::move(forward_loss), optimizer, std::move(args));
}

void Trainer::Impl::setup(std::shared_ptr<torch::nn::Module> m, ForwardLossFn f, torch::optim::Optimizer* opt,
                          TrainingArguments args) {
  if (args.fp16 && args.bf16) throw std::invalid_argument("kiln::Trainer: fp16 and bf16 are both true; choose one");
  model = std::move(m);
  forward_loss_fn = std::move(f);
  optimizer = opt;
  max_grad_norm = args.max_grad_norm;
  const auto params = model->parameters();
  const bool on_cuda = !params.empty() && params.front().device().type() == c10::kCUDA;
  amp_dtype = args.fp16 ? at::kHalf : args.bf16 ? at::kBFloat16 : at::kFloat;
  amp_device = on_cuda ? c10::kCUDA : c10::kCPU;
  if (args.fp16) {
    // Each parameter group's state must be one kiln can put back after a skipped update.
    std::string kinds;
    if (!dynamic_cast<torch::optim::SGD*>(opt) && !dynamic_cast<torch::optim::Adam*>(opt) &&
        !dynamic_cast<torch::optim::AdamW*>(opt) && !dynamic_cast<torch::optim::RMSprop*>(opt) &&
        !dynamic_cast<torch::optim::Adagrad*>(opt))
      throw std::invalid_argument(
          "kiln::Trainer: fp16 = true skips the updates whose gradients hold an inf or a NaN, which kiln can undo "
          "for LibTorch's SGD, Adam, AdamW, RMSprop and Adagrad; this optimizer (" +
          c10::demangle(typeid(*opt).name()) + ") is none of them: use bf16 = true, or one of those");
    scaler = std::make_shared<ScalerState>(params.empty() ? c10::Device(c10::kCPU) : params.front().device());
  }
  if (args.tf32) {
    at::globalContext().setAllowTF32CuBLAS(true);
    at::globalContext().setAllowTF32CuDNN(true);
    if (!on_cuda) log_info("kiln::Trainer: tf32 = true changes nothing on the CPU (it applies to CUDA matmuls)");
  }
  auto* im = this;
  // The last input is the target; the others go to forward.
  // Its outputs: the loss, the gradients' norm with clipping, and under fp16 the flag last.
  step = std::make_unique<CompiledStep>([im](const std::vector<at::Tensor>& in) { return im->one_step(in, false); },
                                        step_state(true), std::move(args));
  // The environment may have set max_grad_norm too (CompiledStep applied it).
  max_grad_norm = step->args().max_grad_norm;
  last = step.get();
  // Under torchrun: this process's rank of the world.
  if (auto g = distributed::group_from_env(step->args(), on_cuda ? "cuda" : "cpu")) join(std::move(g), step->args());
}

void Trainer::Impl::join(std::shared_ptr<distributed::Group> g, const TrainingArguments& args) {
  if (step->stats().steps > 0 || (micro && micro->stats().steps > 0) ||
      (step_outputs && step_outputs->stats().steps > 0))
    throw std::logic_error(
        "kiln::Trainer::set_process_group: the Trainer already made steps; hand it the process "
        "group before the first step");
  group = std::move(g);
  reducer =
      std::make_unique<distributed::GradientReducer>(group, args.ddp_bucket_cap_mb, args.ddp_find_unused_parameters);
  // Every rank starts from rank 0's model, as DistributedDataParallel's constructor makes it.
  std::vector<std::pair<std::string, at::Tensor>> state = model->named_parameters(true).pairs();
  for (const auto& b : model->named_buffers(true))
    if (b.value().defined()) state.emplace_back(b.key(), b.value());
  reducer->broadcast(state);
  // Hugging Face's log_level_replica: the other ranks say only warnings and errors.
  if (group->rank != 0) {
    const std::string& l = args.log_level;
    if (l == "info" || l == "debug" || l == "trace") {
      replica_log_level = "warn";
      set_log_level(replica_log_level);
    }
  }
}

std::vector<at::Tensor> Trainer::Impl::call(CompiledStep& cs, const std::vector<at::Tensor>& inputs) {
  // The step and the update end in the fp16 flag, taken off here; the micro-step has none.
  const bool flagged = scaler && &cs != micro.get();
  if (flagged) before_scaled_step();
  auto take_flag = [&](std::vector<at::Tensor>& out) {
    if (!flagged) return;
    pending_found_inf = out.back();
    out.pop_back();
  };
  if (!group) {
    auto out = cs(inputs);
    take_flag(out);
    if (&cs == step.get() && out.size() > 1) grad_norm = out[1];
    return out;
  }
  ++calls;
  const int compiles = cs.stats().compiles;
  std::vector<at::Tensor> out;
  try {
    out = cs(inputs);
  } catch (const CompileError& e) {
    // A compiled step whose collective failed (the eager step's reducer names its bucket itself).
    if (std::string(e.what()).rfind("kiln: the compiled step failed", 0) != 0) throw;
    throw DistributedError(c10::str("kiln: rank ", group->rank, ": step ", calls,
                                    " failed in the compiled step, whose ", "gradient all_reduce runs on ",
                                    group->backend, " (", reducer->num_buckets(), " buckets): ", e.what(), "; ",
                                    group->diagnose(c10::str("failed.step.", calls))));
  }
  if (cs.stats().compiles > compiles) check_same_step(cs);
  take_flag(out);
  if (&cs == step.get() && out.size() > 1) grad_norm = out[1];
  return out;
}

double Trainer::Impl::mean_over_ranks(double v) const { return group ? group->mean(v, "the logged loss") : v; }

namespace {
// What must agree across the ranks' compiled steps: the ops in order (not the shapes, so a rank with
// another batch size agrees) and every collective's size.
std::string step_summary(const CompiledStep& cs) {
  const ir::Graph* g = cs.compiled_graph();
  if (!g) return "eager (" + cs.stats().last_fallback + ")";
  std::string text;
  size_t collectives = 0;
  for (const auto& n : g->nodes) {
    text += n.op;
    if (n.op.rfind("_c10d_functional::", 0) == 0) {
      ++collectives;
      for (auto v : n.outputs)
        if (v != ir::kNoValue) text += c10::str("[", g->value(v).meta.numel(), "]");
    }
    text += "\n";
  }
  return c10::str(g->nodes.size(), " nodes, ", collectives, " collectives, hash ", std::hash<std::string>()(text));
}
}  // namespace

void Trainer::Impl::check_same_step(const CompiledStep& cs) {
  if (!group->store) return;
  const int k = ++checked_compiles[&cs];
  const std::string mine = step_summary(cs);
  const char* which = &cs == step.get()           ? "step"
                      : &cs == micro.get()        ? "micro"
                      : &cs == step_outputs.get() ? "step_with_outputs"
                                                  : "update";
  const auto all = group->exchange(c10::str(which, ".compile.", k), mine);
  std::string differ;
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r] != all[0]) differ += c10::str(differ.empty() ? "" : "; ", "rank ", r, ": ", all[r]);
  if (!differ.empty())
    throw DistributedError(c10::str("kiln: rank ", group->rank,
                                    ": the ranks captured different steps, which would not run the same collectives: "
                                    "rank 0: ",
                                    all[0], "; ", differ, ". Every rank must run the same step function and settings"));
}

Trainer::~Trainer() = default;

at::Tensor Trainer::step(const at::Tensor& input, const at::Tensor& target) {
  impl_->last = impl_->step.get();
  return impl_->call(*impl_->step, {input, target}).at(0);
}

at::Tensor Trainer::step(const std::vector<at::Tensor>& inputs, const at::Tensor& target) {
  std::vector<at::Tensor> all(inputs);
  all.push_back(target);
  impl_->last = impl_->step.get();
  return impl_->call(*impl_->step, all).at(0);
}

StepOutput Trainer::step_with_outputs(const at::Tensor& input, const at::Tensor& target) {
  return step_with_outputs(std::vector<at::Tensor>{input}, target);
}

StepOutput Trainer::step_with_outputs(const std::vector<at::Tensor>& inputs, const at::Tensor& target) {
  auto* im = impl_.get();
  if (!im->step_outputs) im->make_step_outputs();
  std::vector<at::Tensor> all(inputs);
  all.push_back(target);
  im->last = im->step_outputs.get();
  // Its outputs: the loss, the forward's tensors, the norm with clipping (the fp16 flag, taken off
  // by call()).
  std::vector<at::Tensor> out = im->call(*im->step_outputs, all);
  if (im->max_grad_norm > 0) {
    im->grad_norm = out.back();
    out.pop_back();
  }
  StepOutput r;
  r.loss = out.at(0);
  r.outputs.assign(out.begin() + 1, out.end());
  return r;
}

void Trainer::set_process_group(const c10::intrusive_ptr<c10d::ProcessGroup>& process_group) {
  impl_->join(distributed::group_without_store(process_group, args()), args());
}

void Trainer::set_process_group(const c10::intrusive_ptr<c10d::ProcessGroup>& process_group,
                                const c10::intrusive_ptr<c10d::Store>& store) {
  impl_->join(distributed::group_from(process_group, args(), store), args());
}

int Trainer::process_index() const { return impl_->group ? impl_->group->rank : 0; }
int Trainer::world_size() const { return impl_->group ? impl_->group->size : 1; }
bool Trainer::is_world_process_zero() const { return process_index() == 0; }

TrainOutput Trainer::train(const Dataset& dataset) { return run(dataset, nullptr); }

TrainOutput Trainer::train(const Dataset& train_dataset, const Dataset& eval_dataset) {
  return run(train_dataset, &eval_dataset);
}

std::string Trainer::last_checkpoint(const std::string& output_dir) { return checkpoint::last(output_dir); }

void Trainer::set_compute_metrics(ComputeMetricsFn compute_metrics) {
  impl_->compute_metrics = std::move(compute_metrics);
}

void Trainer::add_callback(std::shared_ptr<TrainerCallback> callback) {
  if (!callback) throw std::invalid_argument("kiln::Trainer::add_callback: the callback is null");
  impl_->callbacks.push_back(std::move(callback));
}

const TrainerState& Trainer::state() const { return impl_->state; }

namespace {

// metric_for_best_model as evaluate() names it ("accuracy" is "eval_accuracy"); "" when no best is
// kept ("loss" when load_best_model_at_end or reduce_lr_on_plateau asks for one without naming it).
std::string best_metric_key(const TrainingArguments& a) {
  std::string m = a.metric_for_best_model;
  if (m.empty() && (a.load_best_model_at_end || a.lr_scheduler_type == "reduce_lr_on_plateau")) m = "loss";
  if (m.empty()) return m;
  return m.rfind("eval_", 0) == 0 ? m : "eval_" + m;
}

bool greater_is_better(const TrainingArguments& a) {
  if (a.greater_is_better) return *a.greater_is_better;
  const std::string m = best_metric_key(a);
  return !(m == "eval_loss");
}

}  // namespace

EarlyStoppingCallback::EarlyStoppingCallback(int early_stopping_patience, double early_stopping_threshold)
    : patience_(early_stopping_patience), threshold_(early_stopping_threshold) {
  if (patience_ < 1)
    throw std::invalid_argument("kiln::EarlyStoppingCallback: early_stopping_patience must be at least 1, got " +
                                std::to_string(patience_));
}

void EarlyStoppingCallback::on_train_begin(const TrainingArguments& args, const TrainerState&, TrainerControl&) {
  if (!args.load_best_model_at_end)
    throw std::invalid_argument(
        "kiln::EarlyStoppingCallback requires load_best_model_at_end = true (Hugging Face's rule)");
  if (args.eval_strategy == "no")
    throw std::invalid_argument(
        "kiln::EarlyStoppingCallback requires an eval_strategy ('steps' or 'epoch'): it stops on evaluations");
  counter_ = 0;
}

void EarlyStoppingCallback::on_evaluate(const TrainingArguments& args, const TrainerState& state,
                                        TrainerControl& control, const std::map<std::string, double>& metrics) {
  const std::string key = best_metric_key(args);
  const auto it = metrics.find(key);
  if (it == metrics.end()) {
    log_warn("kiln::EarlyStoppingCallback: the evaluation has no '" + key + "' (metric_for_best_model); not stopping");
    return;
  }
  const double v = it->second;
  const bool better = !state.best_metric || (greater_is_better(args) ? v > *state.best_metric : v < *state.best_metric);
  if (better && (!state.best_metric || std::abs(v - *state.best_metric) > threshold_)) {
    counter_ = 0;
  } else if (++counter_ >= patience_) {
    control.should_training_stop = true;
    log_info(c10::str("kiln::EarlyStoppingCallback: ", key, " has not improved on ", display_number(*state.best_metric),
                      " at ", counter_, " evaluations in a row; stopping at step ", state.global_step));
  }
}

void Trainer::set_data_collator(DataCollator collator) { impl_->collator = std::move(collator); }

void Trainer::set_data_collator(DataCollatorWithPadding collator) {
  if (collator.pad_to_multiple_of == 0) collator.pad_to_multiple_of = args().pad_to_multiple_of;
  impl_->collator = collator;
}

PredictionOutput Trainer::predict(const Dataset& dataset, const std::string& metric_key_prefix) {
  if (metric_key_prefix.empty()) throw std::invalid_argument("kiln::Trainer::predict: the metric key prefix is empty");
  EvalPrediction p;
  const auto m = impl_->evaluate(dataset, args().per_device_eval_batch_size, metric_key_prefix, &p);
  return PredictionOutput{p.predictions, p.label_ids, std::map<std::string, double>(m.begin(), m.end())};
}

std::string Trainer::save_model(const std::string& dir) {
  const std::string to = dir.empty() ? args().output_dir : dir;
  if (to.empty()) throw std::invalid_argument("kiln::Trainer::save_model: no folder given and output_dir is not set");
  const std::string file = (std::filesystem::path(to) / "model.pt").string();
  if (!is_world_process_zero()) return file;
  checkpoint::save_model(to, *impl_->model);
  log_info("saved the model to " + file);
  return file;
}

std::map<std::string, double> Trainer::evaluate(const Dataset& eval_dataset) {
  const auto m = impl_->evaluate(eval_dataset, args().per_device_eval_batch_size);
  return std::map<std::string, double>(m.begin(), m.end());
}

std::vector<std::pair<std::string, double>> Trainer::Impl::evaluate(const Dataset& dataset, int64_t batch_size,
                                                                    const std::string& prefix, EvalPrediction* keep) {
  const std::string who = keep ? "kiln::Trainer::predict" : "kiln::Trainer::evaluate";
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto n = static_cast<int64_t>(dataset.size());
  if (n == 0) throw std::invalid_argument(who + ": the dataset is empty");
  const std::vector<int64_t> first{0};
  const size_t per =
      collator ? make_batch(dataset, first, 0, 1, 0, who.c_str()).size() : dataset.get(0).inputs.size() + 1;
  struct Mode {
    torch::nn::Module& m;
    bool training;
    ~Mode() { m.train(training); }
  } mode{*model, model->is_training()};
  model->eval();
  torch::NoGradGuard no_grad;
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  double loss_sum = 0;
  int64_t batches = 0;
  std::vector<at::Tensor> predictions, labels;
  for (int64_t b = 0; b < n; b += batch_size) {
    const int64_t end = std::min(b + batch_size, n);
    const auto batch = make_batch(dataset, order, b, end, per, who.c_str());
    std::vector<at::Tensor> outputs;
    at::Tensor loss;
    {
      Autocast amp(amp_dtype, amp_device);
      loss = forward_loss_fn(std::vector<at::Tensor>(batch.begin(), batch.end() - 1), batch.back(), &outputs);
    }
    loss_sum += loss.item<double>() * static_cast<double>(end - b);
    if (compute_metrics || keep) {
      // The predictions: the forward's first tensor (Hugging Face's logits, first after the loss).
      if (outputs.empty() || !outputs[0].defined())
        throw std::invalid_argument(who +
                                    ": the metrics need the model's predictions, and the forward returned no tensor "
                                    "kiln can read: a forward returning a struct of its own gives them through "
                                    "`std::vector<at::Tensor> output_tensors(const YourStruct&)` beside the struct");
      predictions.push_back(outputs[0].detach());
      labels.push_back(batch.back());
    }
    ++batches;
  }
  const std::string pre = prefix + "_";
  std::vector<std::pair<std::string, double>> out{{pre + "loss", loss_sum / static_cast<double>(n)}};
  if (compute_metrics || keep) {
    EvalPrediction p;
    try {
      p.predictions = concat_padded(predictions);
      p.label_ids = concat_padded(labels);
    } catch (const c10::Error& e) {
      throw std::invalid_argument(who +
                                  ": the model's outputs or the targets of the batches cannot be concatenated along "
                                  "dim 0 for the metrics function: " +
                                  e.msg());
    }
    if (compute_metrics)
      for (const auto& [name, value] : compute_metrics(p))
        out.emplace_back(name.rfind(pre, 0) == 0 ? name : pre + name, value);
    if (keep) *keep = std::move(p);
  }
  const double runtime = std::chrono::duration<double>(Clock::now() - start).count();
  out.emplace_back(pre + "runtime", runtime);
  out.emplace_back(pre + "samples_per_second", static_cast<double>(n) / runtime);
  out.emplace_back(pre + "steps_per_second", static_cast<double>(batches) / runtime);
  return out;
}

// A resumed run's compiled steps made ready before it continues: the uninterrupted training had run
// every layout of the checkpoint's, so its next steps run compiled (and a backend's kernels need
// not round as LibTorch's eager kernels do). Each compiled step runs its warm-up and captures each
// layout on examples of the dataset; then the parameters and buffers (in place), the optimizer's
// state (the same tensors, their values and counters) and the generators are put back to the
// checkpoint's. Only for LibTorch's own optimizers, whose state tensors are known.
void Trainer::Impl::prepare_compiled_steps(const Dataset& dataset, const checkpoint::LoopState& resumed, double factor,
                                           double factor_next,
                                           const std::function<at::Tensor(const std::vector<at::Tensor>&)>& run_step) {
  if (resumed.layouts.empty() || !step->args().compile_enabled()) return;
  struct Entry {
    void* key;
    std::unique_ptr<torch::optim::OptimizerParamState> state;
    std::vector<at::Tensor> live, values;
  };
  std::vector<Entry> entries;
  for (auto& [key, st] : optimizer->state()) {
    Entry e{key, st->clone(), {}, {}};
    if (!optimizer_state_tensors(*st, e.live)) {
      log_info(
          "kiln::Trainer::train: resuming without preparing the compiled step first (an optimizer whose "
          "state kiln cannot put back): the first steps run eagerly, as for a fresh Trainer");
      return;
    }
    for (const auto& t : e.live) e.values.push_back(t.clone());
    entries.push_back(std::move(e));
  }
  std::vector<std::pair<at::Tensor, at::Tensor>> tensors;
  for (const auto& p : model->parameters()) tensors.emplace_back(p, p.detach().clone());
  for (const auto& b : model->buffers()) tensors.emplace_back(b, b.clone());
  if (scaler)
    for (const auto& b : scaler->buffers()) tensors.emplace_back(b, b.clone());
  const int64_t skipped = skipped_steps;
  auto restore = [&] {
    torch::NoGradGuard no_grad;
    for (auto& [t, v] : tensors) t.copy_(v);
    pending_found_inf = at::Tensor();
    skipped_steps = skipped;
    auto& state = optimizer->state();
    state.clear();
    for (auto& e : entries) {
      for (size_t i = 0; i < e.live.size(); ++i) e.live[i].copy_(e.values[i]);
      state[e.key] = e.state->clone();
    }
    checkpoint::apply_rng(resumed);
  };
  const auto n = static_cast<int64_t>(dataset.size());
  try {
    // The calls that made each compiled step what it was: its warm-up, then a capture per layout.
    for (const auto& l : resumed.layouts) {
      {
        // Each micro-batch of the layout: the examples it names (by their index modulo the
        // dataset's size, should the dataset have shrunk), or, without, the first ones.
        const std::vector<int64_t> examples = layout_examples(l);
        std::vector<at::Tensor> inputs;
        size_t next = 0;
        for (int64_t m : layout_sizes(l)) {
          std::vector<int64_t> order;
          for (int64_t k = 0; k < std::min(m, n); ++k, ++next)
            order.push_back(examples.empty() ? k : examples[next % examples.size()] % n);
          auto mb =
              make_batch(dataset, order, 0, static_cast<int64_t>(order.size()), per_micro, "kiln::Trainer::train");
          inputs.insert(inputs.end(), mb.begin(), mb.end());
        }
        // As the step the run continues with: the look-ahead after a capture sees the rate move.
        set_rates(factor);
        next_factor = factor_next;
        run_step(inputs);
      }
    }
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

namespace {
// The training device's peak allocated memory for the logs' peak_memory_mb: on CUDA LibTorch's
// caching allocator (as torch.cuda.max_memory_allocated: every tensor on the device), on the CPU
// kiln's counting allocator, which train() puts in place (kiln/compile.h): CPU tensors allocated
// since train() began (activations, gradients, the optimizer's state, new parameter storage), not
// those that existed before it. Each log line gives the peak since the previous one.
class PeakMemoryWatch {
 public:
  explicit PeakMemoryWatch(c10::Device device)
      : cuda_(device.is_cuda()), index_(device.has_index() ? device.index() : 0) {
    if (!cuda_) meter_ = std::make_unique<ScopedCpuMemoryMeter>();
    reset();
  }
  // The peak since the last call (or the start), in MiB; then starts a new interval.
  double interval_peak_mb() {
    const int64_t bytes = cuda_ ? cuda_peak_allocated_bytes(index_) : cpu_peak_allocated_bytes();
    const double mb = static_cast<double>(bytes) / (1 << 20);
    run_peak_mb_ = std::max(run_peak_mb_, mb);
    reset();
    return mb;
  }
  double run_peak_mb() { return std::max(run_peak_mb_, interval_peak_mb()); }

 private:
  void reset() { cuda_ ? cuda_reset_peak_allocated(index_) : cpu_reset_peak_allocated(); }
  bool cuda_;
  int index_;
  std::unique_ptr<ScopedCpuMemoryMeter> meter_;
  double run_peak_mb_ = 0;
};
}  // namespace

TrainOutput Trainer::run(const Dataset& dataset, const Dataset* eval_dataset) {
  using Clock = std::chrono::steady_clock;
  const TrainingArguments& a = args();
  auto* im = impl_.get();
  const auto n = static_cast<int64_t>(dataset.size());
  if (n == 0) throw std::invalid_argument("kiln::Trainer::train: the dataset is empty");
  if (a.eval_strategy != "no" && !eval_dataset)
    throw std::invalid_argument("kiln::Trainer::train: eval_strategy is '" + a.eval_strategy +
                                "' but there is no evaluation dataset: call train(train_dataset, eval_dataset)");
  if (eval_dataset && eval_dataset->size() == 0)
    throw std::invalid_argument("kiln::Trainer::train: the evaluation dataset is empty");
  const int64_t bs = a.per_device_train_batch_size, ga = a.gradient_accumulation_steps;
  // Data parallelism: each rank trains on its share of every epoch's order, as PyTorch's
  // DistributedSampler deals it (the order padded from its start to a multiple of the world,
  // then every world-th example from the rank's own), so n_local examples per rank and epoch.
  const int64_t world = im->group ? im->group->size : 1, rank = im->group ? im->group->rank : 0;
  const int64_t n_local = (n + world - 1) / world;
  const bool world_zero = rank == 0;
  // dataloader_drop_last: each epoch's last micro-batch is dropped when it is short.
  const int64_t batches_per_epoch = a.dataloader_drop_last ? n_local / bs : (n_local + bs - 1) / bs;
  if (batches_per_epoch == 0)
    throw std::invalid_argument(c10::str("kiln::Trainer::train: dataloader_drop_last drops every batch: ", n_local,
                                         " examples", world > 1 ? " per rank" : "",
                                         " are fewer than per_device_train_batch_size ", bs));
  const int64_t steps_per_epoch = (batches_per_epoch + ga - 1) / ga;
  const int64_t total_steps =
      a.max_steps > 0 ? a.max_steps
                      : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(a.num_train_epochs * steps_per_epoch)));
  const int64_t epochs = (total_steps + steps_per_epoch - 1) / steps_per_epoch;
  const int64_t warmup =
      a.warmup_steps > 0 ? a.warmup_steps : static_cast<int64_t>(std::ceil(a.warmup_ratio * total_steps));
  // The schedule's factor of optimizer step `step`, and the rate it gives the first parameter group
  // (the one the metrics log, as Hugging Face logs the scheduler's first rate).
  auto factor_at = [&](int64_t step) {
    return schedule_factor(a.lr_scheduler_type, a.lr_scheduler_kwargs, step, warmup, total_steps,
                           im->peak_lrs.empty() ? 1.0 : im->peak_lrs[0]);
  };
  auto lr_at = [&](int64_t step) {
    if (im->plateau.on) return im->plateau.lrs.empty() ? 0.0 : im->plateau.lrs[0];
    return (im->peak_lrs.empty() ? 0.0 : im->peak_lrs[0]) * factor_at(step);
  };
  // logging_steps, eval_steps and save_steps below 1 are ratios of the run (Hugging Face's: rounded up).
  auto every = [&](double steps) {
    return steps < 1 ? std::max<int64_t>(1, static_cast<int64_t>(std::ceil(steps * static_cast<double>(total_steps))))
                     : static_cast<int64_t>(steps);
  };
  const int64_t logging_steps = every(a.logging_steps);
  const int64_t eval_steps = a.eval_steps > 0 ? every(a.eval_steps) : logging_steps;
  const int64_t save_every = every(a.save_steps);
  // load_best_model_at_end keeps the checkpoint saved with the best evaluation: Hugging Face's rules.
  if (a.load_best_model_at_end) {
    if (a.eval_strategy == "no" || a.save_strategy != a.eval_strategy)
      throw std::invalid_argument(
          "kiln::Trainer::train: load_best_model_at_end requires the save and eval strategy "
          "to match, but found eval_strategy '" +
          a.eval_strategy + "' and save_strategy '" + a.save_strategy + "'");
    if (a.save_strategy == "steps" && save_every % eval_steps != 0)
      throw std::invalid_argument(
          c10::str("kiln::Trainer::train: load_best_model_at_end requires save_steps to be a "
                   "round multiple of eval_steps, but found ",
                   save_every, " and ", eval_steps));
    if (a.output_dir.empty())
      throw std::invalid_argument("kiln::Trainer::train: load_best_model_at_end needs output_dir for its checkpoints");
  }
  const bool evaluate_steps = eval_dataset && a.eval_strategy == "steps";
  const bool evaluate_epochs = eval_dataset && a.eval_strategy == "epoch";
  // Rank 0 alone writes checkpoints and metrics.
  const bool save_steps = world_zero && !a.output_dir.empty() && a.save_strategy == "steps";
  const bool save_epochs = world_zero && !a.output_dir.empty() && a.save_strategy == "epoch";
  const bool to_jsonl = world_zero && !a.output_dir.empty() &&
                        std::any_of(a.report_to.begin(), a.report_to.end(),
                                    [](const std::string& r) { return r == "all" || r == "jsonl"; });

  struct ResetNextLr {
    Impl* im;
    ~ResetNextLr() { im->next_factor.reset(); }
  } reset_next_rates{im};
  torch::manual_seed(static_cast<uint64_t>(a.seed));
  auto shuffle = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(a.data_seed.value_or(a.seed)));
  {
    const std::vector<int64_t> first{0};
    im->per_micro = im->collator ? im->make_batch(dataset, first, 0, 1, 0, "kiln::Trainer::train").size()
                                 : dataset.get(0).inputs.size() + 1;
  }
  // group_by_length: every example's length, read once.
  std::vector<int64_t> lengths;
  if (a.group_by_length)
    for (int64_t i = 0; i < n; ++i) lengths.push_back(dataset.length(static_cast<size_t>(i)));

  // What a checkpoint holds of the loop; the loss sums and the position are kept here.
  checkpoint::LoopState loop;
  loop.dataset_size = n;
  loop.per_device_train_batch_size = bs;
  loop.gradient_accumulation_steps = ga;
  loop.seed = a.seed;
  loop.group_by_length = a.group_by_length;
  // Each parameter group's peak: learning_rate when it is set (it wins, as in Hugging Face's
  // TrainingArguments), else the optimizer's own rates, read at the first train() of this Trainer
  // (a later one keeps them: the schedule has moved the rates since).
  const size_t n_groups = im->optimizer->param_groups().size();
  if (a.learning_rate) {
    im->peak_lrs.assign(n_groups, *a.learning_rate);
  } else if (im->peak_lrs.size() != n_groups) {
    im->peak_lrs.clear();
    for (auto& group : im->optimizer->param_groups()) im->peak_lrs.push_back(group.options().get_lr());
  }
  loop.schedule = checkpoint::Schedule{};
  loop.schedule.type = a.lr_scheduler_type;
  loop.schedule.peak_lrs = im->peak_lrs;
  loop.schedule.warmup_steps = warmup;
  loop.schedule.total_steps = total_steps;
  im->plateau = Impl::Plateau{};
  if (a.lr_scheduler_type == "reduce_lr_on_plateau") {
    if (a.eval_strategy == "no" || !eval_dataset)
      throw std::invalid_argument(
          std::string("kiln::Trainer::train: lr_scheduler_type reduce_lr_on_plateau steps on evaluations (Hugging "
                      "Face's rule): ") +
          (a.eval_strategy == "no" ? "set eval_strategy to \"steps\" or \"epoch\"" : "give train() an eval dataset"));
    auto& pl = im->plateau;
    const auto& kw = a.lr_scheduler_kwargs;
    auto num = [&](const char* k, double otherwise) { return kw.count(k) ? std::stod(kw.at(k)) : otherwise; };
    pl.on = true;
    pl.max_mode = kw.count("mode") && kw.at("mode") == "max";
    pl.relative = !(kw.count("threshold_mode") && kw.at("threshold_mode") == "abs");
    pl.factor = num("factor", 0.1);
    pl.patience = static_cast<int64_t>(num("patience", 10));
    pl.threshold = num("threshold", 1e-4);
    pl.cooldown = static_cast<int64_t>(num("cooldown", 0));
    pl.min_lr = num("min_lr", 0);
    pl.eps = num("eps", 1e-8);
    pl.best = pl.max_mode ? -INFINITY : INFINITY;
    pl.lrs = im->peak_lrs;
    if (warmup > 0 && world_zero)
      log_info(c10::str("kiln::Trainer::train: reduce_lr_on_plateau has no warmup (as in Hugging Face): the ", warmup,
                        " warmup steps asked for are not taken"));
  }

  // Resuming: everything is read and checked before anything of this run is written.
  int64_t start_epoch = 0, start_in_epoch = 0;
  bool resumed_epoch_end = false;
  std::string resumed_from;
  checkpoint::LoopState r;
  if (const std::string dir = resume_folder(a); !dir.empty()) {
    r = checkpoint::load(dir, *im->model, *im->optimizer);
    checkpoint::apply_rng(r);
    resumed_from = dir;
    loop.layouts = r.layouts;
    loop.global_step = r.global_step;
    loop.epoch_progress = r.epoch_progress;
    loop.total_loss = r.total_loss;
    loop.interval_loss = r.interval_loss;
    loop.interval_steps = r.interval_steps;
    loop.log_history = std::move(r.log_history);
    loop.best_metric = r.best_metric;
    loop.best_model_checkpoint = r.best_model_checkpoint;
    const bool same_data = r.dataset_size == n && r.per_device_train_batch_size == bs &&
                           r.gradient_accumulation_steps == ga && r.seed == a.seed &&
                           r.group_by_length == a.group_by_length;
    if (same_data) {
      start_epoch = r.epoch;
      start_in_epoch = r.step_in_epoch;
      // The epoch's end still to run, unless this run's max_steps goes on past it within the epoch.
      resumed_epoch_end = r.epoch_end_pending && (r.step_in_epoch >= steps_per_epoch || r.global_step >= total_steps);
      shuffle.set_state(r.data_order_state);
    } else {
      // Hugging Face's way: the position from the global step, the order of a fresh generator.
      log_warn(c10::str("kiln::Trainer::train: the checkpoint ", dir, " was written with ", r.dataset_size,
                        " examples, per_device_train_batch_size ", r.per_device_train_batch_size,
                        ", gradient_accumulation_steps ", r.gradient_accumulation_steps, ", seed ", r.seed,
                        " and group_by_length ", r.group_by_length ? "true" : "false", "; this run has ", n, ", ", bs,
                        ", ", ga, ", ", a.seed, " and ", a.group_by_length ? "true" : "false",
                        ": it continues from step ", r.global_step, " in another order of the examples"));
      start_epoch = r.global_step / steps_per_epoch;
      start_in_epoch = r.global_step % steps_per_epoch;
      for (int64_t e = 0; e < start_epoch; ++e) at::randperm(n, shuffle, at::TensorOptions().dtype(at::kLong));
    }
    const auto& s = r.schedule;
    // Without learning_rate the checkpoint's peaks go on (the optimizer it loaded holds scheduled
    // rates, not the peaks); a checkpoint of another number of groups gives its first to all.
    if (!a.learning_rate && !s.peak_lrs.empty()) {
      im->peak_lrs.assign(n_groups, s.peak_lrs[0]);
      if (s.peak_lrs.size() == n_groups) im->peak_lrs = s.peak_lrs;
      loop.schedule.peak_lrs = im->peak_lrs;
    }
    // fp16: the loss scale, its counter and the skipped steps go on; a checkpoint without them
    // (written without fp16) starts the scale afresh.
    im->skipped_steps = s.skipped_steps;
    if (im->scaler && s.loss_scale > 0) {
      torch::NoGradGuard no_grad;
      im->scaler->scale.fill_(s.loss_scale);
      im->scaler->growth_tracker.fill_(s.scale_growth_tracker);
    }
    if (im->plateau.on && s.type == a.lr_scheduler_type && s.plateau_lrs.size() == n_groups) {
      im->plateau.lrs = s.plateau_lrs;
      im->plateau.best = s.plateau_best;
      im->plateau.bad = s.plateau_bad;
      im->plateau.cooldown_left = s.plateau_cooldown;
    }
    if (s.type != a.lr_scheduler_type || s.peak_lrs != im->peak_lrs || s.warmup_steps != warmup ||
        s.total_steps != total_steps)
      log_warn(c10::str("kiln::Trainer::train: the checkpoint ", dir, " followed the schedule ", s.type, " (peak ",
                        rates_text(s.peak_lrs), ", ", s.warmup_steps, " warmup steps of ", s.total_steps,
                        "); this run follows ", a.lr_scheduler_type, " (peak ", rates_text(im->peak_lrs), ", ", warmup,
                        " warmup steps of ", total_steps, ") from step ", r.global_step));
  }

  if (world_zero)
    log_info(a.learning_rate
                 ? c10::str("kiln::Trainer::train: learning_rate ", display_number(*a.learning_rate),
                            " is the schedule's peak for every parameter group (the optimizer's own rate is not used)")
                 : c10::str("kiln::Trainer::train: learning_rate is not set: the schedule scales the optimizer's own ",
                            n_groups == 1 ? "rate " : "rates ", rates_text(im->peak_lrs)));
  // The output folder, before anything is written: one that cannot be made or written is named,
  // and a fresh run never shares it with another run's checkpoints, which "last" would resume.
  if (!a.output_dir.empty() && (save_steps || save_epochs || to_jsonl)) {
    std::error_code ec;
    std::filesystem::create_directories(a.output_dir, ec);
    if (ec || ::access(a.output_dir.c_str(), W_OK) != 0)
      throw std::runtime_error("kiln::Trainer::train: cannot write into output_dir '" + a.output_dir +
                               "': " + (ec ? ec.message() : std::string(std::strerror(errno))));
  }
  if (resumed_from.empty() && !a.output_dir.empty() && a.save_strategy != "no") {
    const std::vector<std::string> others = checkpoint::all(a.output_dir);
    if (!others.empty() && !a.overwrite_output_dir)
      throw CheckpointError(a.output_dir, "holds " + std::to_string(others.size()) + " checkpoint folder" +
                                              (others.size() == 1 ? "" : "s") + " of another run (the newest " +
                                              std::filesystem::path(others.back()).filename().string() +
                                              "): set overwrite_output_dir = true to delete them and start afresh, "
                                              "or resume_from_checkpoint = \"last\" to continue that run");
    if (world_zero)
      for (const auto& dir : others) {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
        log_info("kiln::Trainer::train: overwrite_output_dir: deleted " + dir);
      }
  }
  Progress progress(a.disable_tqdm, total_steps, loop.global_step);
  if (!a.run_name.empty())
    progress.line(c10::str("run ", a.run_name, ": ", total_steps, " optimizer steps",
                           a.output_dir.empty() ? "" : ", into " + a.output_dir));
  if (!resumed_from.empty())
    progress.line(c10::str("resuming from ", resumed_from, ": step ", loop.global_step, " of ", total_steps, ", epoch ",
                           json_text(json_number(loop.epoch_progress))));

  // One call of `cs`, saying in the progress display when its first compile runs.
  auto call_step = [&](CompiledStep& cs, const std::vector<at::Tensor>& inputs) {
    const char* what = &cs == im->micro.get() ? "the micro-step" : &cs == im->update.get() ? "the update" : "the step";
    const int compiles_before = cs.stats().compiles;
    const bool will_compile =
        a.compile_enabled() && cs.stats().steps >= 1 && compiles_before == 0 && cs.stats().last_fallback.empty();
    if (will_compile) progress.compiling(what);
    auto out = im->call(cs, inputs);
    if (cs.stats().compiles > compiles_before) progress.compiled(cs.stats().last_compile_seconds, what);
    else if (will_compile) progress.not_compiled(what);
    return out;
  };
  const bool accumulating = ga > 1;
  // One optimizer step on `inputs` (micro-batches one after the other, each its inputs then its
  // target): through step()'s compiled step, or with accumulation the micro-step for each
  // micro-batch and then the update.
  auto run_step = [&](const std::vector<at::Tensor>& inputs) {
    if (!accumulating) {
      im->last = im->step.get();
      return call_step(*im->step, inputs).at(0);
    }
    if (!im->micro) im->make_accumulate(a);
    const size_t k = inputs.size() / im->per_micro;
    const auto& target = inputs[im->per_micro - 1];
    const at::Tensor divisor = at::full({}, static_cast<double>(k), target.options().dtype(at::kFloat));
    at::Tensor loss;
    for (size_t m = 0; m < k; ++m) {
      const auto begin = inputs.begin() + static_cast<std::ptrdiff_t>(m * im->per_micro);
      std::vector<at::Tensor> in(begin, begin + static_cast<std::ptrdiff_t>(im->per_micro));
      in.push_back(divisor);
      const at::Tensor l = call_step(*im->micro, in).at(0);
      loss = m == 0 ? l : loss + l;
    }
    const auto out = call_step(*im->update, {});
    if (!out.empty()) im->grad_norm = out[0];
    im->last = im->micro.get();
    return loss;
  };
  if (!resumed_from.empty())
    im->prepare_compiled_steps(dataset, r, factor_at(loop.global_step - im->skipped_steps),
                               factor_at(loop.global_step - im->skipped_steps + 1), run_step);

  std::ofstream metrics;
  if (to_jsonl) {
    std::filesystem::create_directories(a.output_dir);
    const std::string path = a.output_dir + "/metrics.jsonl";
    metrics.open(path, std::ios::trunc);
    if (!metrics) throw std::runtime_error("kiln::Trainer::train: cannot write " + path);
    for (const auto& line : loop.log_history) metrics << line << "\n";
    metrics << std::flush;
  }
  // The callbacks and the state they see (Hugging Face's TrainerState and TrainerControl).
  TrainerState& state = im->state;
  state = TrainerState{};
  state.max_steps = total_steps;
  state.num_train_epochs = epochs;
  state.logging_steps = logging_steps;
  state.eval_steps = eval_steps;
  state.save_steps = save_every;
  state.train_batch_size = bs;
  state.is_world_process_zero = world_zero;
  state.global_step = loop.global_step;
  state.epoch = loop.epoch_progress;
  state.best_metric = loop.best_metric;
  state.best_model_checkpoint = loop.best_model_checkpoint;
  auto as_map = [](const std::string& line) {
    std::map<std::string, double> m;
    const Json j = Json::parse(line);
    for (const auto& [k, v] : j.items())
      if (v.is_number()) m[k] = v.get<double>();
    return m;
  };
  for (const auto& line : loop.log_history) state.log_history.push_back(as_map(line));
  TrainerControl control;
  auto fire = [&](auto event) {
    for (const auto& cb : im->callbacks) event(*cb);
  };
  auto log_line = [&](const std::string& line) {
    loop.log_history.push_back(line);
    if (metrics.is_open()) metrics << line << "\n" << std::flush;
    state.log_history.push_back(as_map(line));
    fire([&](TrainerCallback& cb) { cb.on_log(a, state, control, state.log_history.back()); });
  };
  // metric_for_best_model: the best value so far, and the step whose evaluation gave it (its
  // checkpoint, when one is saved at that step, is the best model's).
  const std::string best_key = best_metric_key(a);
  int64_t best_at_step = -1;

  auto evaluate_now = [&] {
    const auto m = im->evaluate(*eval_dataset, a.per_device_eval_batch_size);
    const std::map<std::string, double> metrics_by_name(m.begin(), m.end());
    fire([&](TrainerCallback& cb) { cb.on_evaluate(a, state, control, metrics_by_name); });
    if (!best_key.empty()) {
      const auto it = metrics_by_name.find(best_key);
      if (it == metrics_by_name.end()) {
        std::string names;
        for (const auto& [k, v] : m) names += (names.empty() ? "" : ", ") + k;
        throw std::invalid_argument("kiln::Trainer::train: metric_for_best_model '" + a.metric_for_best_model + "' (" +
                                    best_key + ") is not among the evaluation's metrics: " + names);
      }
      const bool greater = greater_is_better(a);
      if (!state.best_metric || (greater ? it->second > *state.best_metric : it->second < *state.best_metric)) {
        state.best_metric = loop.best_metric = it->second;
        best_at_step = loop.global_step;
      }
    }
    std::vector<std::pair<std::string, double>> fields{{"step", static_cast<double>(loop.global_step)},
                                                       {"epoch", loop.epoch_progress}};
    fields.insert(fields.end(), m.begin(), m.end());
    log_line(json_line(fields));
    // reduce_lr_on_plateau steps on the metric (the ranks' evaluations agree: every rank lowers
    // its rates alike).
    if (im->plateau.on) {
      const auto it = metrics_by_name.find(best_key);
      if (it == metrics_by_name.end())
        throw std::invalid_argument("kiln::Trainer::train: reduce_lr_on_plateau steps on " + best_key +
                                    " (metric_for_best_model), which the evaluation did not report");
      if (im->plateau.step(it->second))
        progress.line(c10::str("reduce_lr_on_plateau: ", best_key, " ", display_number(it->second),
                               " has not improved on ", display_number(im->plateau.best), " for more than ",
                               im->plateau.patience, " evaluations: learning_rate ", rates_text(im->plateau.lrs)));
    }
    std::string text = c10::str("step ", loop.global_step, "/", total_steps, ":");
    for (const auto& [k, v] : m)
      if (k.find("runtime") == std::string::npos && k.find("per_second") == std::string::npos)
        text += c10::str(" ", k, " ", display_number(v));
    progress.line(text);
  };
  auto save_now = [&](int64_t epoch, int64_t in_epoch, bool epoch_end_pending, const at::Tensor& order_state) {
    loop.epoch = epoch;
    loop.step_in_epoch = in_epoch;
    loop.epoch_end_pending = epoch_end_pending;
    loop.data_order_state = order_state;
    // As Hugging Face's optimizer after the scheduler's step: the next step's rate.
    im->settle_scaler();
    im->set_rates(factor_at(loop.global_step - im->skipped_steps));
    if (im->scaler) {
      loop.schedule.skipped_steps = im->skipped_steps;
      loop.schedule.loss_scale = im->scaler->scale.item<double>();
      loop.schedule.scale_growth_tracker = im->scaler->growth_tracker.item<double>();
    }
    if (im->plateau.on) {
      loop.schedule.plateau_lrs = im->plateau.lrs;
      loop.schedule.plateau_best = im->plateau.best;
      loop.schedule.plateau_bad = im->plateau.bad;
      loop.schedule.plateau_cooldown = im->plateau.cooldown_left;
    }
    if (best_at_step == loop.global_step)
      state.best_model_checkpoint = loop.best_model_checkpoint =
          (std::filesystem::path(a.output_dir) / checkpoint::folder_name(loop.global_step)).string();
    const std::string path = checkpoint::save(
        a.output_dir, *im->model, *im->optimizer, loop,
        trainer_state_json(loop, a, total_steps, epochs, logging_steps, eval_steps, save_every, steps_per_epoch));
    progress.line("saved " + path);
    fire([&](TrainerCallback& cb) { cb.on_save(a, state, control); });
    for (const auto& removed : checkpoint::rotate(a.output_dir, a.save_total_limit, path, state.best_model_checkpoint))
      progress.line("deleted " + removed + " (save_total_limit " + std::to_string(a.save_total_limit) + ")");
  };

  fire([&](TrainerCallback& cb) { cb.on_train_begin(a, state, control); });
  TrainOutput result;
  const int64_t first_step = loop.global_step;
  const auto model_params = im->model->parameters();
  PeakMemoryWatch memory(model_params.empty() ? c10::Device(c10::kCPU) : model_params.front().device());
  const auto start = Clock::now();
  auto interval_start = start;
  for (int64_t epoch = start_epoch; epoch < epochs; ++epoch) {
    const bool first = epoch == start_epoch;
    if (loop.global_step >= total_steps && !(first && resumed_epoch_end)) break;
    const at::Tensor order_state = shuffle.get_state();  // what a checkpoint of this epoch holds
    // Both draw one randperm from the generator, so the skip over epochs above holds for both.
    std::vector<int64_t> order;
    if (a.group_by_length) {
      order = length_grouped_indices(lengths, bs * ga, shuffle);
    } else {
      const at::Tensor perm = at::randperm(n, shuffle, at::TensorOptions().dtype(at::kLong));
      order.assign(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + n);
    }
    if (world > 1) {
      std::vector<int64_t> mine;
      for (int64_t i = rank; i < n_local * world; i += world) mine.push_back(order[static_cast<size_t>(i % n)]);
      order = std::move(mine);
    }
    bool epoch_ran = first && resumed_epoch_end;
    int64_t s = first ? start_in_epoch : 0;
    fire([&](TrainerCallback& cb) { cb.on_epoch_begin(a, state, control); });
    for (; s < steps_per_epoch && loop.global_step < total_steps; ++s) {
      const int64_t first_batch = s * ga, last_batch = std::min(first_batch + ga, batches_per_epoch);
      std::vector<at::Tensor> inputs;
      std::vector<int64_t> sizes;
      for (int64_t b = first_batch; b < last_batch; ++b) {
        const int64_t end = std::min((b + 1) * bs, n_local);
        auto mb = im->make_batch(dataset, order, b * bs, end, im->per_micro, "kiln::Trainer::train");
        inputs.insert(inputs.end(), mb.begin(), mb.end());
        sizes.push_back(end - b * bs);
      }
      {
        // The compiled steps' history: each one's warm-up call, then each layout it captured (with
        // a collator each batch shape, and the examples that first had it).
        CompiledStep* cs = accumulating ? im->micro.get() : im->step.get();
        std::string key = layout_text(sizes), examples;
        if (im->collator) {
          key += " " + shapes_text(inputs);
          examples = " @";
          for (int64_t i = first_batch * bs; i < std::min(last_batch * bs, n_local); ++i)
            examples += " " + std::to_string(order[static_cast<size_t>(i)]);
        }
        if (!cs || cs->stats().steps == 0) loop.layouts.push_back("warm-up " + key + examples);
        else if (std::none_of(loop.layouts.begin(), loop.layouts.end(),
                              [&](const std::string& l) { return layout_key(l) == key; }))
          loop.layouts.push_back(key + examples);
      }
      fire([&](TrainerCallback& cb) { cb.on_step_begin(a, state, control); });
      // The schedule counts the optimizer steps that ran (fp16 skips some, as Hugging Face's does).
      im->settle_scaler();
      im->set_rates(factor_at(loop.global_step - im->skipped_steps));
      im->next_factor = factor_at(loop.global_step - im->skipped_steps + 1);
      const at::Tensor loss = run_step(inputs);

      ++loop.global_step;
      ++loop.interval_steps;
      loop.total_loss = loop.total_loss.defined() ? loop.total_loss.to(loss.device()) + loss : loss;
      loop.interval_loss = loop.interval_loss.defined() ? loop.interval_loss.to(loss.device()) + loss : loss;
      loop.epoch_progress =
          static_cast<double>(epoch) + static_cast<double>(s + 1) / static_cast<double>(steps_per_epoch);
      epoch_ran = true;
      state.global_step = loop.global_step;
      state.epoch = loop.epoch_progress;
      // What the strategies decide at this step (Hugging Face's DefaultFlowCallback); the callbacks
      // may change it.
      control.should_log = loop.global_step % logging_steps == 0 || (a.logging_first_step && loop.global_step == 1);
      control.should_evaluate = evaluate_steps && loop.global_step % eval_steps == 0;
      control.should_save = save_steps && (loop.global_step % save_every == 0 || loop.global_step == total_steps);
      fire([&](TrainerCallback& cb) { cb.on_step_end(a, state, control); });
      std::optional<double> logged, logged_grad_norm;
      double steps_per_second = 0;
      if (control.should_log && loop.interval_steps > 0) {
        im->settle_scaler();  // the rate logged is the next step's, as the schedule counts it
        const auto now = Clock::now();
        logged = im->mean_over_ranks(loop.interval_loss.item<double>()) / static_cast<double>(loop.interval_steps);
        // The same steps per second in the file and the log line: this interval's, compiles in it
        // included.
        steps_per_second = loop.interval_steps / seconds_between(interval_start, now);
        std::vector<std::pair<std::string, double>> fields{
            {"step", static_cast<double>(loop.global_step)}, {"epoch", loop.epoch_progress}, {"loss", *logged}};
        if (im->grad_norm.defined()) {
          logged_grad_norm = im->grad_norm.item<double>();
          fields.emplace_back("grad_norm", *logged_grad_norm);
        }
        fields.emplace_back("learning_rate", lr_at(loop.global_step - im->skipped_steps));
        fields.emplace_back("steps_per_second", steps_per_second);
        fields.emplace_back("peak_memory_mb", memory.interval_peak_mb());
        log_line(json_line(fields));
        loop.interval_loss = at::Tensor();
        loop.interval_steps = 0;
        interval_start = now;
      }
      progress.step(loop.global_step, logged);
      if (logged) {
        std::string text = c10::str("step ", loop.global_step, "/", total_steps, " (epoch ",
                                    display_number(loop.epoch_progress, 3), "): loss ", display_number(*logged));
        if (logged_grad_norm) text += ", grad_norm " + display_number(*logged_grad_norm);
        text += ", learning_rate " + display_number(lr_at(loop.global_step - im->skipped_steps)) + ", " +
                display_number(steps_per_second) + " steps/s";
        if (auto eta = progress.eta(); !eta.empty()) text += ", " + eta;
        progress.line(text);
      }
      if (control.should_evaluate && eval_dataset) evaluate_now();
      if (control.should_save && world_zero && !a.output_dir.empty()) {
        const bool loop_ends = s + 1 == steps_per_epoch || loop.global_step == total_steps ||
                               control.should_training_stop || control.should_epoch_stop;
        save_now(epoch, s + 1, loop_ends && (evaluate_epochs || save_epochs), order_state);
      }
      control.should_log = control.should_evaluate = control.should_save = false;
      if (control.should_training_stop || control.should_epoch_stop) {
        ++s;
        break;
      }
    }
    control.should_epoch_stop = false;
    // The epoch's end (the last epoch's too, when max_steps ends it early), as Hugging Face's.
    if (epoch_ran) {
      control.should_evaluate = evaluate_epochs;
      control.should_save = save_epochs;
      fire([&](TrainerCallback& cb) { cb.on_epoch_end(a, state, control); });
      if (control.should_evaluate && eval_dataset) evaluate_now();
      if (control.should_save && world_zero && !a.output_dir.empty()) save_now(epoch, s, false, order_state);
      control.should_evaluate = control.should_save = false;
    }
    if (control.should_training_stop) break;
  }
  fire([&](TrainerCallback& cb) { cb.on_train_end(a, state, control); });
  // load_best_model_at_end: the best evaluation's checkpoint, into the model's own tensors.
  if (a.load_best_model_at_end) {
    if (!state.best_model_checkpoint.empty()) {
      checkpoint::load_model(state.best_model_checkpoint, *im->model);
      progress.line(c10::str("loaded the best model (", best_key, " ", display_number(*state.best_metric), ") from ",
                             state.best_model_checkpoint));
    } else {
      log_warn(
          "kiln::Trainer::train: load_best_model_at_end: no checkpoint was saved at an evaluation; the model is "
          "the last step's");
    }
  }
  // As after Hugging Face's last scheduler step: the rate the schedule gives the step after the last.
  im->settle_scaler();
  im->set_rates(factor_at(loop.global_step - im->skipped_steps));
  const double runtime = seconds_between(start, Clock::now());
  result.global_step = loop.global_step;
  result.training_loss = loop.total_loss.defined() ? im->mean_over_ranks(loop.total_loss.item<double>()) /
                                                         static_cast<double>(std::max<int64_t>(1, loop.global_step))
                                                   : 0.0;
  const int64_t steps_run = loop.global_step - first_step;
  const double samples = static_cast<double>(std::min(n_local * epochs, total_steps * ga * bs) * world) *
                         static_cast<double>(steps_run) / static_cast<double>(total_steps);
  result.metrics = {{"train_runtime", runtime},
                    {"train_samples_per_second", samples / runtime},
                    {"train_steps_per_second", static_cast<double>(steps_run) / runtime},
                    {"train_loss", result.training_loss},
                    {"epoch", loop.epoch_progress},
                    {"peak_memory_mb", memory.run_peak_mb()}};
  std::vector<std::pair<std::string, double>> last{{"step", static_cast<double>(result.global_step)}};
  for (const char* k :
       {"epoch", "train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "peak_memory_mb"})
    last.emplace_back(k, result.metrics.at(k));
  log_line(json_line(last));
  progress.line(c10::str("done: step ", loop.global_step, "/", total_steps, " in ", seconds_text(runtime),
                         " s, train_loss ", display_number(result.training_loss)));
  return result;
}

const std::string& Trainer::backend() const { return impl_->step->backend(); }
const std::vector<std::string>& Trainer::backend_reasons() const { return impl_->step->backend_reasons(); }
bool Trainer::compiled() const {
  if (impl_->last == impl_->micro.get())
    return impl_->micro->last_step_compiled() && impl_->update->last_step_compiled();
  return impl_->last->last_step_compiled();
}
const TrainingArguments& Trainer::args() const { return impl_->step->args(); }

torch::optim::Optimizer& Trainer::optimizer() {
  // Under fp16, the last step's skip is settled first: its step counts are what they should be.
  impl_->settle_scaler();
  return *impl_->optimizer;
}
const StepStats& Trainer::stats() const {
  if (impl_->last != impl_->micro.get()) return impl_->last->stats();
  impl_->sum_accumulated_stats();
  return impl_->accumulated;
}
const CompiledStep& Trainer::compiled_step() const { return *impl_->last; }

}  // namespace kiln
