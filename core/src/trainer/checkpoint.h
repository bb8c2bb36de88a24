// Trainer::train's checkpoints: <output_dir>/checkpoint-<global_step>/, written into a temporary
// folder and renamed into place, read back whole and checked before anything is changed.
//
//   model.pt           the model's parameters and buffers, as torch::save(model) writes them
//   optimizer.pt       torch::save(optimizer)
//   scheduler.pt       the learning-rate schedule and the step it reached
//   rng_state.pt       the CPU generator, every CUDA generator, the data-order generator
//   trainer_state.pt   the loop's position (global step, epoch, step in the epoch), the loss sums
//                      behind the next metrics line, the metrics lines so far
//   trainer_state.json the same for people and tools, with Hugging Face's field names
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

namespace kiln::checkpoint {

// The schedule train() follows; a resumed run that differs is warned about.
struct Schedule {
  std::string type;
  std::vector<double> peak_lrs;  // each parameter group's peak rate (Hugging Face's base_lrs)
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  // reduce_lr_on_plateau: the rates it set, the best metric so far, the evaluations without
  // improvement and the cooldown left (PyTorch's ReduceLROnPlateau state).
  std::vector<double> plateau_lrs;
  double plateau_best = 0;
  int64_t plateau_bad = 0, plateau_cooldown = 0;
  // fp16: the optimizer steps skipped so far (the schedule does not count them), and GradScaler's
  // scale and growth counter; loss_scale 0 without fp16.
  int64_t skipped_steps = 0;
  double loss_scale = 0, scale_growth_tracker = 0;
};

// Everything of train()'s loop a checkpoint holds besides the model and the optimizer.
struct LoopState {
  int64_t global_step = 0;
  int64_t epoch = 0;          // the epoch the last step belonged to (0-based)
  int64_t step_in_epoch = 0;  // optimizer steps of that epoch done
  // The step ended its epoch's loop but the epoch's end (eval_strategy/save_strategy "epoch") has
  // not run yet: it runs first when the training resumes.
  bool epoch_end_pending = false;
  double epoch_progress = 0;  // the "epoch" Hugging Face logs: epochs done, fractional
  at::Tensor total_loss;      // the sum of every step's loss (undefined before the first step)
  at::Tensor interval_loss;   // the sum since the last metrics line (undefined when none)
  int64_t interval_steps = 0;
  at::Tensor data_order_state;           // the data-order generator's state before this epoch's shuffle
  std::vector<std::string> log_history;  // every metrics line so far (JSON objects)
  // What train()'s compiled steps have run, in order: each one's first (warm-up) call, "warm-up
  // step 8" (one micro-batch of 8 examples), then each input layout it captured, "accumulate 8 8";
  // with a data collator also the batches' shapes and the examples that first made them,
  // "step 8 [8,40][8,40] @ 3 17 22 5 1 0 9 8".
  // A resumed run makes the same calls before it continues (and puts everything back), so that
  // every later step runs as it would have, compiled or eagerly.
  std::vector<std::string> layouts;
  // What decides the data order: a resumed run with other values cannot continue the same order.
  int64_t dataset_size = 0;
  int64_t per_device_train_batch_size = 0;
  int64_t gradient_accumulation_steps = 0;
  int64_t seed = 0;
  bool group_by_length = false;  // (absent from checkpoints written before it existed: false)
  Schedule schedule;
  // The best evaluation so far (metric_for_best_model) and the checkpoint saved with it.
  std::optional<double> best_metric;
  std::string best_model_checkpoint;
  // Set by load(): the generators' states, applied by apply_rng().
  at::Tensor cpu_rng_state;
  std::vector<at::Tensor> cuda_rng_states;
};

// "checkpoint-<step>".
std::string folder_name(int64_t global_step);

// Writes <output_dir>/checkpoint-<global_step>/ atomically (a temporary folder, renamed into place;
// an existing folder of that name is replaced) and returns its path. Stale temporary folders of
// earlier runs are removed first.
std::string save(const std::string& output_dir, const torch::nn::Module& model,
                 const torch::optim::Optimizer& optimizer, const LoopState& loop,
                 const std::string& trainer_state_json);

// Writes the model's parameters and buffers to <dir>/model.pt (a checkpoint's model.pt), through a
// temporary file renamed into place; makes `dir` when missing. Returns the file's path.
std::string save_model(const std::string& dir, const torch::nn::Module& model);

// Deletes the oldest checkpoint-<step> folders of output_dir beyond `limit` (0: none), never `keep`
// nor `keep_too` (the best model's, when there is one). Returns the folders deleted.
std::vector<std::string> rotate(const std::string& output_dir, int64_t limit, const std::string& keep,
                                const std::string& keep_too = "");

// Copies a checkpoint's model.pt into the model's own tensors (load_best_model_at_end). Throws
// kiln::CheckpointError naming the file when it does not fit the model, which is then unchanged.
void load_model(const std::string& dir, torch::nn::Module& model);

// The newest complete checkpoint-<step> folder in output_dir (by step), or "" when there is none.
std::string last(const std::string& output_dir);

// Every checkpoint-<step> and tmp-checkpoint-<step> folder of output_dir, complete or not, by step.
std::vector<std::string> all(const std::string& output_dir);

// Reads every file of the checkpoint in `dir` and checks it against the model and the optimizer;
// only when all of it fits are the model's parameters and buffers copied in place and the
// optimizer's state loaded. Throws kiln::CheckpointError naming the file and what is wrong, with
// the model and the optimizer as they were.
LoopState load(const std::string& dir, torch::nn::Module& model, torch::optim::Optimizer& optimizer);

// Sets the CPU and CUDA generators to the states load() read.
void apply_rng(const LoopState& loop);

}  // namespace kiln::checkpoint
