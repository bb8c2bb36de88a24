#include "kiln/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/stack.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/utils.h>

#include "kiln/compile.h"
#include "kiln/log.h"

namespace kiln {

struct Trainer::Impl {
  std::shared_ptr<torch::nn::Module> model;
  MultiForwardFn forward;
  torch::optim::Optimizer* optimizer;
  LossFn loss_fn;
  double max_grad_norm = 0;
  std::unique_ptr<CompiledStep> step;
  // train()'s groups of several micro-batches: the inputs are the micro-batches one after the
  // other, each `per_micro` tensors (its inputs, then its target). Made at the first such group.
  std::unique_ptr<CompiledStep> accumulate;
  size_t per_micro = 0;
  CompiledStep* last = nullptr;  // the step that ran last, for stats()
  // During train(): the next optimizer step's learning rate, which the step function sets right
  // after the update. Host state only, so a compiled step never runs it; but the capture runs the
  // function, and the optimizer probe's look-ahead right after the capture then replays step()
  // with the next rate: a scheduled rate is a run-time scalar of the first plan, and the step is
  // not planned again when the rate first moves.
  std::optional<double> next_lr;
  void set_next_lr() {
    if (next_lr)
      for (auto& group : optimizer->param_groups()) group.options().set_lr(*next_lr);
  }
};

namespace {

// Hugging Face's schedules (transformers.optimization), as a factor of the peak learning rate at
// optimizer step `step` (0-based) of `total`.
double schedule_factor(const std::string& type, int64_t step, int64_t warmup, int64_t total) {
  if (type == "constant") return 1.0;
  if (step < warmup) return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
  if (type == "constant_with_warmup") return 1.0;
  if (type == "linear")
    return std::max(0.0, static_cast<double>(total - step) / static_cast<double>(std::max<int64_t>(1, total - warmup)));
  if (type == "cosine") {
    const double progress =
        static_cast<double>(step - warmup) / static_cast<double>(std::max<int64_t>(1, total - warmup));
    return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * 0.5 * 2.0 * progress)));
  }
  throw std::invalid_argument("kiln::Trainer: unknown lr_scheduler_type '" + type + "'");
}

// The shortest text that reads back as `d` (0.1, not 0.10000000000000001).
std::string json_number(double d) {
  if (!std::isfinite(d)) return "null";
  for (int precision = 1;; ++precision) {
    std::ostringstream os;
    os.precision(precision);
    os << d;
    if (precision >= 17 || std::strtod(os.str().c_str(), nullptr) == d) return os.str();
  }
}

// {"k": v, ...} in the given order.
std::string json_line(const std::vector<std::pair<std::string, double>>& fields) {
  std::string out = "{";
  for (size_t i = 0; i < fields.size(); ++i)
    out += (i ? ", \"" : "\"") + fields[i].first + "\": " + json_number(fields[i].second);
  return out + "}";
}

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

TensorDataset::TensorDataset(std::vector<at::Tensor> inputs, at::Tensor target)
    : inputs_(std::move(inputs)), target_(std::move(target)) {
  if (inputs_.empty()) throw std::invalid_argument("kiln::TensorDataset: no input tensors");
  for (const auto& t : inputs_)
    if (t.dim() == 0 || t.size(0) != target_.size(0))
      throw std::invalid_argument("kiln::TensorDataset: every input must have the target's length along dim 0 (" +
                                  std::to_string(target_.size(0)) + ")");
}

size_t TensorDataset::size() const { return static_cast<size_t>(target_.size(0)); }

Example TensorDataset::get(size_t index) const {
  Example e;
  for (const auto& t : inputs_) e.inputs.push_back(t.select(0, static_cast<int64_t>(index)));
  e.target = target_.select(0, static_cast<int64_t>(index));
  return e;
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

Trainer::Trainer(std::shared_ptr<torch::nn::Module> model, MultiForwardFn forward, torch::optim::Optimizer& optimizer,
                 LossFn loss_fn, TrainingArguments args)
    : impl_(std::make_unique<Impl>()) {
  if (!model) throw std::invalid_argument("kiln::Trainer: the model is null");
  impl_->model = std::move(model);
  impl_->forward = std::move(forward);
  impl_->optimizer = &optimizer;
  impl_->loss_fn = std::move(loss_fn);
  impl_->max_grad_norm = args.max_grad_norm;
  auto* im = impl_.get();
  // The last input is the target; the others go to forward.
  impl_->step = std::make_unique<CompiledStep>(
      [im](const std::vector<at::Tensor>& in) {
        im->optimizer->zero_grad();
        const std::vector<at::Tensor> x(in.begin(), in.end() - 1);
        auto loss = im->loss_fn(im->forward(x), in.back());
        loss.backward();
        if (im->max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(im->model->parameters(), im->max_grad_norm);
        im->optimizer->step();
        im->set_next_lr();
        return std::vector<at::Tensor>{loss.detach()};
      },
      StepState{{impl_->model}, {impl_->optimizer}}, std::move(args));
  // The environment may have set max_grad_norm too (CompiledStep applied it).
  impl_->max_grad_norm = impl_->step->args().max_grad_norm;
  impl_->last = impl_->step.get();
}

Trainer::~Trainer() = default;

at::Tensor Trainer::step(const at::Tensor& input, const at::Tensor& target) {
  impl_->last = impl_->step.get();
  return (*impl_->step)({input, target}).at(0);
}

at::Tensor Trainer::step(const std::vector<at::Tensor>& inputs, const at::Tensor& target) {
  std::vector<at::Tensor> all(inputs);
  all.push_back(target);
  impl_->last = impl_->step.get();
  return (*impl_->step)(all).at(0);
}

TrainOutput Trainer::train(const Dataset& dataset) {
  using Clock = std::chrono::steady_clock;
  const TrainingArguments& a = args();
  auto* im = impl_.get();
  const auto n = static_cast<int64_t>(dataset.size());
  if (n == 0) throw std::invalid_argument("kiln::Trainer::train: the dataset is empty");
  const int64_t bs = a.per_device_train_batch_size, ga = a.gradient_accumulation_steps;
  const int64_t batches_per_epoch = (n + bs - 1) / bs;
  const int64_t steps_per_epoch = (batches_per_epoch + ga - 1) / ga;
  const int64_t total_steps =
      a.max_steps > 0 ? a.max_steps
                      : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(a.num_train_epochs * steps_per_epoch)));
  const int64_t epochs = (total_steps + steps_per_epoch - 1) / steps_per_epoch;
  const int64_t warmup =
      a.warmup_steps > 0 ? a.warmup_steps : static_cast<int64_t>(std::ceil(a.warmup_ratio * total_steps));
  auto lr_at = [&](int64_t step) {
    return a.learning_rate * schedule_factor(a.lr_scheduler_type, step, warmup, total_steps);
  };

  std::ofstream metrics;
  if (!a.output_dir.empty()) {
    std::filesystem::create_directories(a.output_dir);
    const std::string path = a.output_dir + "/metrics.jsonl";
    metrics.open(path, std::ios::trunc);
    if (!metrics) throw std::runtime_error("kiln::Trainer::train: cannot write " + path);
  }

  struct ResetNextLr {
    Impl* im;
    ~ResetNextLr() { im->next_lr.reset(); }
  } reset_next_lr{im};
  torch::manual_seed(static_cast<uint64_t>(a.seed));
  auto shuffle = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(a.seed));
  im->per_micro = dataset.get(0).inputs.size() + 1;

  // The micro-batch of the examples order[begin, end), stacked, its target last.
  auto micro_batch = [&](const std::vector<int64_t>& order, int64_t begin, int64_t end) {
    std::vector<std::vector<at::Tensor>> slots(im->per_micro);
    for (int64_t i = begin; i < end; ++i) {
      Example e = dataset.get(static_cast<size_t>(order[static_cast<size_t>(i)]));
      if (e.inputs.size() + 1 != im->per_micro)
        throw std::invalid_argument("kiln::Trainer::train: example " + std::to_string(order[static_cast<size_t>(i)]) +
                                    " has " + std::to_string(e.inputs.size()) + " inputs, the first has " +
                                    std::to_string(im->per_micro - 1));
      for (size_t s = 0; s + 1 < im->per_micro; ++s) slots[s].push_back(std::move(e.inputs[s]));
      slots.back().push_back(std::move(e.target));
    }
    std::vector<at::Tensor> out;
    for (auto& s : slots) out.push_back(at::stack(s));
    return out;
  };

  TrainOutput result;
  at::Tensor total_loss, interval_loss;
  int64_t interval_steps = 0;
  const auto start = Clock::now();
  auto interval_start = start;
  double epoch_progress = 0;
  for (int64_t epoch = 0; epoch < epochs && result.global_step < total_steps; ++epoch) {
    const at::Tensor perm = at::randperm(n, shuffle, at::TensorOptions().dtype(at::kLong));
    const std::vector<int64_t> order(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + n);
    for (int64_t s = 0; s < steps_per_epoch && result.global_step < total_steps; ++s) {
      const int64_t first = s * ga, last = std::min(first + ga, batches_per_epoch);
      std::vector<at::Tensor> inputs;
      for (int64_t b = first; b < last; ++b) {
        auto mb = micro_batch(order, b * bs, std::min((b + 1) * bs, n));
        inputs.insert(inputs.end(), mb.begin(), mb.end());
      }
      for (auto& group : im->optimizer->param_groups()) group.options().set_lr(lr_at(result.global_step));
      im->next_lr = lr_at(result.global_step + 1);
      at::Tensor loss;
      if (last - first == 1) {
        loss = step(std::vector<at::Tensor>(inputs.begin(), inputs.end() - 1), inputs.back());
      } else {
        if (!im->accumulate) {
          im->accumulate = std::make_unique<CompiledStep>(
              [im](const std::vector<at::Tensor>& in) {
                const size_t k = in.size() / im->per_micro;
                im->optimizer->zero_grad();
                at::Tensor sum;
                for (size_t m = 0; m < k; ++m) {
                  const auto begin = in.begin() + static_cast<std::ptrdiff_t>(m * im->per_micro);
                  const std::vector<at::Tensor> x(begin, begin + static_cast<std::ptrdiff_t>(im->per_micro - 1));
                  auto l = im->loss_fn(im->forward(x), *(begin + static_cast<std::ptrdiff_t>(im->per_micro - 1))) /
                           static_cast<double>(k);
                  l.backward();
                  sum = m == 0 ? l.detach() : sum + l.detach();
                }
                if (im->max_grad_norm > 0)
                  torch::nn::utils::clip_grad_norm_(im->model->parameters(), im->max_grad_norm);
                im->optimizer->step();
                im->set_next_lr();
                return std::vector<at::Tensor>{sum};
              },
              StepState{{im->model}, {im->optimizer}}, a);
        }
        im->last = im->accumulate.get();
        loss = (*im->accumulate)(inputs).at(0);
      }
      ++result.global_step;
      ++interval_steps;
      total_loss = total_loss.defined() ? total_loss + loss : loss;
      interval_loss = interval_loss.defined() ? interval_loss + loss : loss;
      epoch_progress = static_cast<double>(epoch) + static_cast<double>(s + 1) / static_cast<double>(steps_per_epoch);
      if (result.global_step % a.logging_steps == 0) {
        const auto now = Clock::now();
        if (metrics.is_open())
          metrics << json_line({{"step", static_cast<double>(result.global_step)},
                                {"epoch", epoch_progress},
                                {"loss", interval_loss.item<double>() / static_cast<double>(interval_steps)},
                                {"learning_rate", lr_at(result.global_step)},
                                {"steps_per_second", interval_steps / seconds_between(interval_start, now)}})
                  << "\n"
                  << std::flush;
        interval_loss = at::Tensor();
        interval_steps = 0;
        interval_start = now;
      }
    }
  }
  // As after Hugging Face's last scheduler step: the rate the schedule gives the step after the last.
  for (auto& group : im->optimizer->param_groups()) group.options().set_lr(lr_at(result.global_step));
  const double runtime = seconds_between(start, Clock::now());
  result.training_loss = total_loss.item<double>() / static_cast<double>(result.global_step);
  const double samples = static_cast<double>(std::min(n * epochs, total_steps * ga * bs));
  result.metrics = {{"train_runtime", runtime},
                    {"train_samples_per_second", samples / runtime},
                    {"train_steps_per_second", static_cast<double>(result.global_step) / runtime},
                    {"train_loss", result.training_loss},
                    {"epoch", epoch_progress}};
  if (metrics.is_open()) {
    std::vector<std::pair<std::string, double>> last{{"step", static_cast<double>(result.global_step)}};
    for (const char* k : {"epoch", "train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss"})
      last.emplace_back(k, result.metrics.at(k));
    metrics << json_line(last) << "\n";
  }
  return result;
}

const std::string& Trainer::backend() const { return impl_->step->backend(); }
const std::vector<std::string>& Trainer::backend_reasons() const { return impl_->step->backend_reasons(); }
bool Trainer::compiled() const { return impl_->last->last_step_compiled(); }
const TrainingArguments& Trainer::args() const { return impl_->step->args(); }
const StepStats& Trainer::stats() const { return impl_->last->stats(); }
const CompiledStep& Trainer::compiled_step() const { return *impl_->last; }

}  // namespace kiln
