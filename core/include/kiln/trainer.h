// kiln::Trainer: the user's training step (forward, loss, backward, optional gradient clipping,
// optimizer update) run through kiln. The first step runs eagerly; kiln compiles the whole step and
// runs the compiled step from then on, falling back to the eager step whenever capture or compile
// fails.
//
//   Net model;                                   // TORCH_MODULE(Net), or std::make_shared<NetImpl>()
//   torch::optim::AdamW opt(model->parameters());
//   kiln::Trainer trainer(model, opt, loss_fn, args);
//   auto loss = trainer.step(x, y);              // forward(Tensor)
//   auto loss = trainer.step({ids, lengths}, y); // forward(Tensor, Tensor)
//
// Or a whole training, the way Hugging Face's Trainer runs it (args.num_train_epochs, max_steps,
// per_device_train_batch_size, gradient_accumulation_steps, learning_rate, lr_scheduler_type,
// warmup_steps, logging_steps, seed, output_dir; checkpoints with save_strategy, save_steps,
// save_total_limit and resume_from_checkpoint; evaluation with eval_strategy and eval_steps):
//   kiln::TensorDataset data({xs}, ys);          // examples along dim 0
//   kiln::TrainOutput out = trainer.train(data);
//   trainer.set_compute_metrics(accuracy);       // optional: metrics of the evaluation
//   out = trainer.train(data, eval_data);        // with evaluation
// Variable-length examples (token sequences; kiln/data.h) are padded per batch by a collator:
//   trainer.set_data_collator(kiln::DataCollatorWithPadding(pad_token_id));
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include "kiln/config.h"
#include "kiln/data.h"

namespace kiln {
class CompiledStep;
struct StepStats;
}  // namespace kiln
namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace kiln {

using ForwardFn = std::function<at::Tensor(const at::Tensor& input)>;
using MultiForwardFn = std::function<at::Tensor(const std::vector<at::Tensor>& inputs)>;
using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;
// The forward and the loss as one, which every Trainer constructor makes of what it is given: the
// loss of `inputs` against `target`; `outputs`, when not null, gets the forward's tensors
// (output_tensors of what it returned).
using ForwardLossFn = std::function<at::Tensor(const std::vector<at::Tensor>& inputs, const at::Tensor& target,
                                               std::vector<at::Tensor>* outputs)>;

// The tensors of what a forward returns, in order: a tensor, a std::vector of tensors, a std::pair's
// or std::tuple's (nested ones flattened). A forward that returns a struct of your own gives its
// tensors through an overload beside the struct, found by argument-dependent lookup:
//   struct Out { at::Tensor logits, aux; };
//   std::vector<at::Tensor> output_tensors(const Out& o) { return {o.logits, o.aux}; }
// The Trainer uses them for Trainer::step_with_outputs and the predictions of an evaluation (the
// first); a struct without one trains all the same.
inline std::vector<at::Tensor> output_tensors(const at::Tensor& t) { return {t}; }
inline std::vector<at::Tensor> output_tensors(const std::vector<at::Tensor>& v) { return v; }
template <class A, class B>
std::vector<at::Tensor> output_tensors(const std::pair<A, B>& p);
template <class... T>
std::vector<at::Tensor> output_tensors(const std::tuple<T...>& t);

namespace trainer_detail {
// The number of tensors a module's (non-template, non-overloaded) forward takes.
template <class F>
struct arity;
template <class C, class R, class... A>
struct arity<R (C::*)(A...)> : std::integral_constant<size_t, sizeof...(A)> {};
template <class C, class R, class... A>
struct arity<R (C::*)(A...) const> : std::integral_constant<size_t, sizeof...(A)> {};

template <class M, class = void>
struct has_plain_forward : std::false_type {};
template <class M>
struct has_plain_forward<M, std::void_t<decltype(&M::forward)>> : std::true_type {};

template <class M, size_t... I>
at::Tensor call_forward(M& m, const std::vector<at::Tensor>& in, std::index_sequence<I...>) {
  return m.forward(in[I]...);
}
template <class M, size_t... I>
auto call_any_forward(M& m, const std::vector<at::Tensor>& in, std::index_sequence<I...>) {
  return m.forward(in[I]...);
}

// forward(inputs...) of `model`, checking the count. Modules whose forward is a template
// (torch::nn::Sequential) take one tensor.
template <class Module>
MultiForwardFn forward_of(const std::shared_ptr<Module>& model) {
  if constexpr (has_plain_forward<Module>::value) {
    constexpr size_t n = arity<decltype(&Module::forward)>::value;
    return [model](const std::vector<at::Tensor>& in) -> at::Tensor {
      if (in.size() != n)
        throw std::invalid_argument("kiln::Trainer: the model's forward takes " + std::to_string(n) +
                                    " tensors, the step was given " + std::to_string(in.size()));
      return call_forward(*model, in, std::make_index_sequence<n>{});
    };
  } else {
    return [model](const std::vector<at::Tensor>& in) -> at::Tensor {
      if (in.size() != 1)
        throw std::invalid_argument(
            "kiln::Trainer: the model's forward is called with one tensor, the step was given " +
            std::to_string(in.size()));
      return model->forward(in[0]);
    };
  }
}

// Whether output_tensors takes a T (kiln's overloads, or one beside T).
template <class T, class = void>
struct has_output_tensors : std::false_type {};
template <class T>
struct has_output_tensors<T, std::void_t<decltype(output_tensors(std::declval<const T&>()))>> : std::true_type {};

template <class T>
std::vector<at::Tensor> tensors_of(const T& out) {
  if constexpr (has_output_tensors<T>::value) return output_tensors(out);
  else return {};
}

// What a forward taking the step's input tensors returns.
template <class F>
using forward_result_t = std::decay_t<std::invoke_result_t<F&, const std::vector<at::Tensor>&>>;

// A forward that returns something other than one tensor, with a loss that takes that.
template <class F, class L, class = void>
struct structured_forward : std::false_type {};
template <class F, class L>
struct structured_forward<
    F, L,
    std::enable_if_t<
        !std::is_same_v<forward_result_t<F>, at::Tensor> &&
        std::is_convertible_v<std::invoke_result_t<L&, const forward_result_t<F>&, const at::Tensor&>, at::Tensor>>>
    : std::true_type {};

template <class F, class L>
ForwardLossFn fuse(F forward, L loss) {
  return [forward = std::move(forward), loss = std::move(loss)](
             const std::vector<at::Tensor>& in, const at::Tensor& target, std::vector<at::Tensor>* outputs) mutable {
    const auto out = forward(in);
    at::Tensor l = loss(out, target);
    if (outputs) *outputs = tensors_of(out);
    return l;
  };
}

// A module's forward over the step's inputs, returning what it returns (one to n tensors in).
template <class Module>
auto module_forward(const std::shared_ptr<Module>& model) {
  constexpr size_t n = arity<decltype(&Module::forward)>::value;
  return [model](const std::vector<at::Tensor>& in) {
    if (in.size() != n)
      throw std::invalid_argument("kiln::Trainer: the model's forward takes " + std::to_string(n) +
                                  " tensors, the step was given " + std::to_string(in.size()));
    return call_any_forward(*model, in, std::make_index_sequence<n>{});
  };
}

template <class Module, class = void>
struct module_returns_structure : std::false_type {};
template <class Module>
struct module_returns_structure<Module, std::enable_if_t<has_plain_forward<Module>::value>>
    : std::bool_constant<!std::is_same_v<
          forward_result_t<decltype(module_forward(std::declval<const std::shared_ptr<Module>&>()))>, at::Tensor>> {};
}  // namespace trainer_detail

template <class A, class B>
std::vector<at::Tensor> output_tensors(const std::pair<A, B>& p) {
  auto out = trainer_detail::tensors_of(p.first);
  for (auto& t : trainer_detail::tensors_of(p.second)) out.push_back(std::move(t));
  return out;
}
template <class... T>
std::vector<at::Tensor> output_tensors(const std::tuple<T...>& t) {
  std::vector<at::Tensor> out;
  std::apply(
      [&](const auto&... part) {
        (
            [&] {
              for (auto& x : trainer_detail::tensors_of(part)) out.push_back(std::move(x));
            }(),
            ...);
      },
      t);
  return out;
}

// What Trainer::step_with_outputs returns: the loss and the forward's tensors (output_tensors),
// detached, for metrics on the training batches.
struct StepOutput {
  at::Tensor loss;
  std::vector<at::Tensor> outputs;
};

// What an evaluation hands the metrics function (Hugging Face's EvalPrediction): the model's outputs
// for every example of the evaluation dataset and their targets, each batch's concatenated along
// dim 0. Batches that differ in another dim (padded to different lengths) are first padded to the
// longest with -100, as Hugging Face's evaluation loop pads them.
struct EvalPrediction {
  at::Tensor predictions;
  at::Tensor label_ids;
};
// Returns metrics by name ("accuracy"); the evaluation logs them as "eval_accuracy".
using ComputeMetricsFn = std::function<std::map<std::string, double>(const EvalPrediction&)>;

// A checkpoint that cannot be resumed from: a folder or file missing, a file truncated or not
// kiln's, a checkpoint of another model (parameter names or shapes differ) or another optimizer.
// what() is "<file>: <what is wrong>"; the model and the optimizer are left as they were.
class CheckpointError : public std::runtime_error {
 public:
  CheckpointError(std::string file, const std::string& what);
  const std::string& file() const { return file_; }

 private:
  std::string file_;
};

// What Trainer::predict returns, as Hugging Face's PredictionOutput: the model's outputs for every
// example and their targets (concatenated as EvalPrediction's), and the metrics evaluate() gives,
// named with predict()'s prefix ("test_loss", "test_runtime", "test_<metric>"...).
struct PredictionOutput {
  at::Tensor predictions;
  at::Tensor label_ids;
  std::map<std::string, double> metrics;
};

// What Trainer::train returns, as Hugging Face's TrainOutput: the optimizer steps made, the mean
// training loss over them, and the run's metrics (train_runtime, train_samples_per_second,
// train_steps_per_second, train_loss, epoch).
struct TrainOutput {
  int64_t global_step = 0;
  double training_loss = 0;
  std::map<std::string, double> metrics;
};

// Hugging Face's TrainerState: where train() is (Trainer::state(), and what callbacks are shown).
// The steps are the resolved ones (a ratio of the run already turned into steps).
struct TrainerState {
  int64_t global_step = 0;
  double epoch = 0;       // epochs done, fractional
  int64_t max_steps = 0;  // the run's optimizer steps
  int64_t num_train_epochs = 0;
  int64_t logging_steps = 0;
  int64_t eval_steps = 0;
  int64_t save_steps = 0;
  int64_t train_batch_size = 0;
  // The best value of metric_for_best_model seen at an evaluation, and the checkpoint saved at that
  // step (none when no checkpoint was written then). Kept in checkpoints.
  std::optional<double> best_metric;
  std::string best_model_checkpoint;
  bool is_world_process_zero = true;
  std::vector<std::map<std::string, double>> log_history;  // every metrics line so far
};

// Hugging Face's TrainerControl: what the callbacks ask of the loop. At a step's end the flags
// arrive set as the strategies decide (logging_steps, eval_strategy, save_strategy) and a callback
// may change them; should_training_stop ends the training after this step, should_epoch_stop the
// epoch.
struct TrainerControl {
  bool should_training_stop = false;
  bool should_epoch_stop = false;
  bool should_save = false;
  bool should_evaluate = false;
  bool should_log = false;
};

// Hugging Face's TrainerCallback: override the events you want (Trainer::add_callback).
class TrainerCallback {
 public:
  virtual ~TrainerCallback() = default;
  virtual void on_train_begin(const TrainingArguments&, const TrainerState&, TrainerControl&) {}
  virtual void on_train_end(const TrainingArguments&, const TrainerState&, TrainerControl&) {}
  virtual void on_epoch_begin(const TrainingArguments&, const TrainerState&, TrainerControl&) {}
  virtual void on_epoch_end(const TrainingArguments&, const TrainerState&, TrainerControl&) {}
  virtual void on_step_begin(const TrainingArguments&, const TrainerState&, TrainerControl&) {}
  virtual void on_step_end(const TrainingArguments&, const TrainerState&, TrainerControl&) {}
  // A metrics line (training, evaluation or the run's last), as it goes to metrics.jsonl.
  virtual void on_log(const TrainingArguments&, const TrainerState&, TrainerControl&,
                      const std::map<std::string, double>& logs) {}
  // An evaluation's metrics ("eval_loss", "eval_<metric>"...).
  virtual void on_evaluate(const TrainingArguments&, const TrainerState&, TrainerControl&,
                           const std::map<std::string, double>& metrics) {}
  virtual void on_save(const TrainingArguments&, const TrainerState&, TrainerControl&) {}
};

// Hugging Face's EarlyStoppingCallback: stops the training when metric_for_best_model has not
// improved on the best so far (by more than `threshold`, in the direction greater_is_better says)
// at `patience` evaluations in a row. Needs load_best_model_at_end, as Hugging Face's does, and an
// eval_strategy.
class EarlyStoppingCallback : public TrainerCallback {
 public:
  explicit EarlyStoppingCallback(int early_stopping_patience = 1, double early_stopping_threshold = 0.0);
  void on_train_begin(const TrainingArguments& args, const TrainerState& state, TrainerControl& control) override;
  void on_evaluate(const TrainingArguments& args, const TrainerState& state, TrainerControl& control,
                   const std::map<std::string, double>& metrics) override;
  int patience_counter() const { return counter_; }

 private:
  int patience_;
  double threshold_;
  int counter_ = 0;
};

class Trainer {
 public:
  // `model`: a std::shared_ptr to a torch::nn::Module, or a module holder (torch::nn::Linear, a
  // TORCH_MODULE), whose forward takes one or several tensors and returns the output the loss
  // reads. The optimizer must outlive the Trainer.
  template <class Module>
  Trainer(std::shared_ptr<Module> model, torch::optim::Optimizer& optimizer, LossFn loss_fn,
          TrainingArguments args = {})
      : Trainer(std::static_pointer_cast<torch::nn::Module>(model), trainer_detail::forward_of(model), optimizer,
                std::move(loss_fn), std::move(args)) {}
  template <class Contained>
  Trainer(const torch::nn::ModuleHolder<Contained>& model, torch::optim::Optimizer& optimizer, LossFn loss_fn,
          TrainingArguments args = {})
      : Trainer(model.ptr(), optimizer, std::move(loss_fn), std::move(args)) {}

  // Without an optimizer: the Trainer makes one from the arguments and owns it, as Hugging Face's
  // does (optim, learning_rate, weight_decay, adam_beta1, adam_beta2, adam_epsilon; optimizer()).
  template <class Module>
  Trainer(std::shared_ptr<Module> model, LossFn loss_fn, TrainingArguments args = {})
      : Trainer(std::static_pointer_cast<torch::nn::Module>(model), trainer_detail::forward_of(model),
                std::move(loss_fn), std::move(args)) {}
  template <class Contained>
  Trainer(const torch::nn::ModuleHolder<Contained>& model, LossFn loss_fn, TrainingArguments args = {})
      : Trainer(model.ptr(), std::move(loss_fn), std::move(args)) {}
  Trainer(std::shared_ptr<torch::nn::Module> model, MultiForwardFn forward, LossFn loss_fn,
          TrainingArguments args = {});

  Trainer(std::shared_ptr<torch::nn::Module> model, ForwardFn forward, torch::optim::Optimizer& optimizer,
          LossFn loss_fn, TrainingArguments args = {});
  Trainer(std::shared_ptr<torch::nn::Module> model, MultiForwardFn forward, torch::optim::Optimizer& optimizer,
          LossFn loss_fn, TrainingArguments args = {});

  // A forward that returns something other than one tensor (a std::tuple, a std::pair, a
  // std::vector of tensors, a struct of your own), with a loss that takes what it returns:
  //   kiln::Trainer trainer(model, [&](const std::vector<at::Tensor>& x) { return model->forward(x[0]); },
  //                         optimizer, [](const std::tuple<at::Tensor, at::Tensor>& out, const at::Tensor& y) {
  //                           return ce(std::get<0>(out), y) + 0.1 * std::get<1>(out).mean(); }, args);
  // A module whose forward returns one takes the loss alone, as above. Predictions and
  // step_with_outputs read its tensors through output_tensors.
  template <class Forward, class Loss,
            std::enable_if_t<trainer_detail::structured_forward<Forward, Loss>::value, int> = 0>
  Trainer(std::shared_ptr<torch::nn::Module> model, Forward forward, torch::optim::Optimizer& optimizer, Loss loss_fn,
          TrainingArguments args = {})
      : Trainer(std::move(model), trainer_detail::fuse(std::move(forward), std::move(loss_fn)), &optimizer,
                std::move(args)) {}
  template <class Module, class Loss,
            std::enable_if_t<trainer_detail::module_returns_structure<Module>::value, int> = 0>
  Trainer(std::shared_ptr<Module> model, torch::optim::Optimizer& optimizer, Loss loss_fn, TrainingArguments args = {})
      : Trainer(std::static_pointer_cast<torch::nn::Module>(model),
                trainer_detail::fuse(trainer_detail::module_forward(model), std::move(loss_fn)), &optimizer,
                std::move(args)) {}
  template <class Contained, class Loss,
            std::enable_if_t<trainer_detail::module_returns_structure<Contained>::value, int> = 0>
  Trainer(const torch::nn::ModuleHolder<Contained>& model, torch::optim::Optimizer& optimizer, Loss loss_fn,
          TrainingArguments args = {})
      : Trainer(model.ptr(), optimizer, std::move(loss_fn), std::move(args)) {}
  // The forward and the loss as one function; a null optimizer: the Trainer makes one, as the
  // constructors without an optimizer do.
  Trainer(std::shared_ptr<torch::nn::Module> model, ForwardLossFn forward_loss, torch::optim::Optimizer* optimizer,
          TrainingArguments args = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One training step: zero_grad, forward, loss, backward, clip_grad_norm_ (args.max_grad_norm > 0),
  // optimizer update. Returns the loss.
  at::Tensor step(const at::Tensor& input, const at::Tensor& target);
  at::Tensor step(const std::vector<at::Tensor>& inputs, const at::Tensor& target);
  // The same step, also returning the forward's tensors (output_tensors of what it returned),
  // detached: metrics on the training batch (its accuracy) without a second forward, as Hugging
  // Face's compute_loss(return_outputs=True). A compiled step of its own, apart from step()'s, made
  // at the first call (the outputs stay alive after the step, which step() need not keep).
  StepOutput step_with_outputs(const at::Tensor& input, const at::Tensor& target);
  StepOutput step_with_outputs(const std::vector<at::Tensor>& inputs, const at::Tensor& target);

  // A whole training over `dataset`, driven by args() with Hugging Face's meanings: max_steps
  // optimizer steps when > 0, else ceil(num_train_epochs * steps per epoch), where an epoch is the
  // dataset shuffled (a generator seeded with args.seed; with group_by_length, then grouped by
  // length as length_grouped_indices does, batches of per_device_train_batch_size *
  // gradient_accumulation_steps examples), cut into micro-batches of per_device_train_batch_size
  // examples (the last may be smaller), each made by the data collator (set_data_collator;
  // stacked without one), and those grouped by gradient_accumulation_steps (the last group may be
  // shorter). Before every optimizer step each parameter group's learning rate is set to the
  // schedule's factor (lr_scheduler_type, warmup_steps or warmup_ratio) times the group's peak:
  // learning_rate when it is set, else the group's own lr as the optimizer had it at the first
  // train() (Hugging Face's way with an optimizer it is given). A group of one micro-batch runs
  // through step(); a longer group runs through a second compiled step that adds the micro-batches'
  // gradients (each loss divided by the group's size) before one optimizer update.
  //
  // Metrics. Every logging_steps steps a line {"step", "epoch", "loss" (the mean since the last
  // line), "learning_rate" (the scheduler's after the step, as Hugging Face logs it),
  // "steps_per_second"} goes to <output_dir>/metrics.jsonl when report_to names it ("all" or
  // "jsonl"; no file when output_dir is empty). The file is started afresh, or, when resuming,
  // with the lines the checkpoint holds; a last line holds the run's metrics.
  //
  // Progress. When stderr is a terminal, one line redrawn in place (step/total, loss, steps per
  // second, time left; "compiling the step… 0.8 s" for the step that compiles), standing in for
  // kiln's own info lines while it is up. Otherwise, or with disable_tqdm, the same as plain log
  // lines every logging_steps. log_level "warn" silences both.
  //
  // Checkpoints (output_dir set, save_strategy "steps": every save_steps steps and after the last;
  // "epoch": after every epoch; "no"): <output_dir>/checkpoint-<global_step>/ holds the model's
  // parameters and buffers (model.pt, as torch::save(model) writes it), the optimizer
  // (optimizer.pt, torch::save), the schedule (scheduler.pt), the CPU, CUDA and data-order
  // generators (rng_state.pt), the position in the data and the loss sums (trainer_state.pt), and
  // trainer_state.json for people and tools. A checkpoint is written into a tmp-checkpoint-<step>
  // folder and renamed into place, so a checkpoint-<step> folder is always complete. With
  // save_total_limit > 0 the oldest beyond it are deleted.
  //
  // Resuming: resume_from_checkpoint names a checkpoint folder, or "true"/"last" the newest in
  // output_dir. train() then loads it into the model (in place), the optimizer and the generators
  // and continues exactly as the uninterrupted training would have: the same examples in the same
  // order from the same place in the epoch, the same learning rates, the same random numbers, the
  // same metrics lines. The steps after it go through this Trainer's compiled steps: before it
  // continues, train() makes the calls the stopped run's compiled steps had made (each one's
  // eager warm-up, each capture; with a collator, of every batch shape in the order they came,
  // each on the examples that first had it) and then puts the model, the
  // optimizer's state and the generators back, so every later step runs compiled exactly where the
  // uninterrupted run's did, and nothing is compiled that a fresh Trainer would not compile (for
  // LibTorch's own optimizers; with another, the first resumed steps run eagerly). A checkpoint
  // that does not fit (missing, truncated, of another model or optimizer) throws CheckpointError
  // before anything — the model, the optimizer, the metrics file — is changed.
  //
  // Evaluation (the two-dataset form): with eval_strategy "steps" every eval_steps steps
  // (logging_steps when 0), with "epoch" after every epoch, the model runs over eval_dataset as
  // evaluate() does and a line {"step", "epoch", "eval_loss", "eval_<metric>"...,
  // "eval_runtime", "eval_samples_per_second", "eval_steps_per_second"} is logged. At one step the
  // order is Hugging Face's: the metrics line, the evaluation, the checkpoint.
  TrainOutput train(const Dataset& dataset);
  TrainOutput train(const Dataset& train_dataset, const Dataset& eval_dataset);

  // The model over `eval_dataset` in batches of per_device_eval_batch_size, in order, in eval mode
  // (train() mode is put back after) and without gradients: the forward and the loss, run eagerly
  // (not compiled; the compiled training step is not touched and stays compiled). Returns
  // "eval_loss" (the mean over the examples), "eval_runtime", "eval_samples_per_second",
  // "eval_steps_per_second", and what the metrics function returns, each name prefixed "eval_".
  std::map<std::string, double> evaluate(const Dataset& eval_dataset);
  // The model over `dataset` as evaluate() runs it, keeping its outputs and the targets (Hugging
  // Face's predict): the metrics are named "<metric_key_prefix>_loss" and so on.
  PredictionOutput predict(const Dataset& dataset, const std::string& metric_key_prefix = "test");
  // The model's parameters and buffers into <dir>/model.pt (dir "": output_dir), the archive a
  // checkpoint's model.pt is (torch::nn::Module::load reads it). Rank 0 alone writes. Returns the
  // file's path.
  std::string save_model(const std::string& dir = "");
  // The metrics function of every evaluation (none by default: eval_loss only).
  void set_compute_metrics(ComputeMetricsFn compute_metrics);
  // Callbacks train() calls at its events, in the order added (Hugging Face's add_callback).
  void add_callback(std::shared_ptr<TrainerCallback> callback);
  // Where the last or current train() is (Hugging Face's trainer.state).
  const TrainerState& state() const;
  // How train() and evaluate() make a micro-batch of examples (Hugging Face's data_collator): the
  // batch's inputs go to forward, its target to the loss. Without one, examples are stacked
  // (default_data_collator), which needs examples of one shape. A DataCollatorWithPadding whose
  // pad_to_multiple_of is 0 takes args().pad_to_multiple_of. Set it before train().
  void set_data_collator(DataCollator collator);
  void set_data_collator(DataCollatorWithPadding collator);

  // The newest complete checkpoint-<step> folder in output_dir (by step), or "" when there is none:
  // what resume_from_checkpoint "last" resumes from (Hugging Face's get_last_checkpoint).
  static std::string last_checkpoint(const std::string& output_dir);

  // Data-parallel training (docs/distributed.md). Under torchrun (WORLD_SIZE > 1) the Trainer joins
  // the world itself when it is made: rank 0's parameters and buffers are broadcast, and every step
  // averages the gradients across the ranks after the backward. A program with a process group of
  // its own hands it here instead, before the first step (`store`, optional, lets kiln compare the
  // ranks' compiled steps). Throws DistributedError (kiln/distributed.h) when a rank fails.
  void set_process_group(const c10::intrusive_ptr<c10d::ProcessGroup>& process_group);
  void set_process_group(const c10::intrusive_ptr<c10d::ProcessGroup>& process_group,
                         const c10::intrusive_ptr<c10d::Store>& store);
  // Hugging Face's names: this process's rank and the number of ranks (0 and 1 without data
  // parallelism); rank 0 alone writes metrics and checkpoints.
  int process_index() const;
  int world_size() const;
  bool is_world_process_zero() const;

  // The backend chosen and the reasons, for display: "none" when torch_compile is off (LibTorch
  // runs the step), "eager" for kiln's eager executor (what runs when no backend can).
  const std::string& backend() const;
  const std::vector<std::string>& backend_reasons() const;
  // Whether steps currently run compiled (false while the pipeline falls back to eager).
  bool compiled() const;
  const TrainingArguments& args() const;
  // The optimizer the steps update: the one the Trainer was given, or the one it made. Under fp16
  // the last step's flag is read first, so that a skipped update's step counts are put back.
  torch::optim::Optimizer& optimizer();
  // Counters (compiles, compiled and eager steps, compile time, last fallback reason) and the
  // compiled step itself (its captured and compiled graphs): step()'s, or, after train() ran with
  // gradient_accumulation_steps > 1, the micro-step's (the counters then add up the micro-step's
  // and the update's).
  const StepStats& stats() const;
  const CompiledStep& compiled_step() const;

 private:
  TrainOutput run(const Dataset& dataset, const Dataset* eval_dataset);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
