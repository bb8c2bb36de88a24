// kiln's main job: a character-level GPT trained on real text through kiln::Trainer::train with the
// default backend, the way a LibTorch user would write it. The text is a file or a folder of them
// (--data; by default /usr/share/common-licenses: the licence texts every Debian system ships with
// its base-files package, about 240 KB of English, which their own terms let anyone copy), cut into
// windows of 16 to 64 characters (kiln::TextDataset) whose labels are the same windows one
// character on. As Hugging Face trains a language model on text of every length, each batch is
// padded to its longest window (kiln::DataCollatorWithPadding, labels -100 at the padding) and the
// batches group windows of similar length (group_by_length), so the compiled step sees a different
// sequence length from batch to batch. The training's settings come from a TOML file with Hugging
// Face's TrainingArguments names (samples/char_gpt/train.toml, or --config FILE): 200 steps with a
// cosine learning-rate schedule, evaluation on the last tenth of the text (windows of 64),
// metrics.jsonl and checkpoints in the output directory.
// The flags --steps, --output-dir and --resume override what the file says. The program ends by
// drawing the loss curves into loss.png and writing a few lines of text from the trained model.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>

#include "kiln/kiln.h"
#include "kiln/workloads.h"
#include "loss_plot.h"

namespace {

int usage(FILE* out) {
  std::fprintf(out,
               "usage: kiln_char_gpt [--config FILE] [--data PATH] [--steps N] [--device cpu|cuda] [--output-dir DIR]\n"
               "                     [--precision auto|fp32|bf16] [--resume]\n"
               "  --config FILE      the training's settings (default %s)\n"
               "  --data PATH        the text to learn: a file, or a folder whose files are read in name order\n"
               "                     (default /usr/share/common-licenses, Debian's licence texts)\n"
               "  --steps N          optimizer steps (the file's max_steps)\n"
               "  --device D         cpu (default) or cuda\n"
               "  --output-dir DIR   metrics.jsonl, loss.png and checkpoints (the file's output_dir)\n"
               "  --precision P      auto (default): bfloat16 autocast where the device computes bfloat16 in\n"
               "                     hardware (the file's bf16 or fp16 win), else float32; fp32; bf16\n"
               "  --resume           continue from the newest checkpoint in the output directory\n",
               KILN_CHAR_GPT_CONFIG);
  return out == stdout ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string config = KILN_CHAR_GPT_CONFIG, data = "/usr/share/common-licenses", device = "cpu", output_dir,
              precision = "auto";
  int64_t steps = 0;  // 0: the file's
  bool resume = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--config" && has_value) config = argv[++i];
    else if (a == "--data" && has_value) data = argv[++i];
    else if (a == "--steps" && has_value) steps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--device" && has_value) device = argv[++i];
    else if (a == "--output-dir" && has_value) output_dir = argv[++i];
    else if (a == "--precision" && has_value) precision = argv[++i];
    else if (a == "--resume") resume = true;
    else if (a == "--help" || a == "-h") return usage(stdout);
    else return usage(stderr);
  }
  const bool cuda = device == "cuda";
  if (!cuda && device != "cpu") return usage(stderr);

  // The file's settings (a bad one is a kiln::ConfigError naming the file, line and key), then the flags.
  kiln::TrainingArguments args = kiln::TrainingArguments::from_toml(config);
  if (steps > 0) args.max_steps = steps;
  if (!output_dir.empty()) args.output_dir = output_dir;
  if (resume) args.resume_from_checkpoint = "last";
  // Mixed precision: bfloat16 autocast where the device computes bfloat16 in hardware.
  const std::string chosen =
      kiln::choose_precision(args, precision, cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU));

  // The text as tokens: one per distinct byte, in byte order. The model's context is 64 characters:
  // training windows of 16 to 64 (starting every 32 characters, as the fixed windows of 64 did, and
  // seeded by the run's seed), evaluation windows of 64 side by side, as before, so that the
  // evaluation loss compares with earlier runs.
  const std::string text = kiln::read_text(data);
  const kiln::CharTokenizer tokenizer(text);
  const at::Device dev = cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  const at::Tensor tokens = tokenizer.encode(text).to(dev);
  const int64_t n = tokens.size(0), split = n * 9 / 10, context = 64, shortest = 16;
  const auto train_data = kiln::TextDataset::windows(tokens.slice(0, 0, split), shortest, context, context / 2,
                                                     static_cast<uint64_t>(args.seed));
  const auto eval_data = kiln::TextDataset::windows(tokens.slice(0, split, n), context, context, context);
  const int64_t multiple = args.pad_to_multiple_of;
  if (multiple > 0 && (context + multiple - 1) / multiple * multiple > context)
    throw std::invalid_argument(c10::str("pad_to_multiple_of = ", multiple, " would pad windows of ", context,
                                         " characters past the model's context of ", context,
                                         ": use a divisor of it, or 0"));
  std::printf("config: %s\n", config.c_str());
  std::printf("precision: %s\n", chosen.c_str());
  std::printf(
      "text: %s, %lld characters, %lld distinct; %zu training windows of %lld to %lld, %zu evaluation windows of "
      "%lld\n",
      data.c_str(), static_cast<long long>(n), static_cast<long long>(tokenizer.vocab_size()), train_data.size(),
      static_cast<long long>(shortest), static_cast<long long>(context), eval_data.size(),
      static_cast<long long>(context));

  // The model (seeded, so that the eager twin timed at the end starts from the same weights) and its
  // AdamW.
  auto make_model = [&] {
    torch::manual_seed(1);
    auto m = kiln::make_char_gpt(tokenizer.vocab_size(), context, /*layers=*/4, /*heads=*/4,
                                 /*width=*/cuda ? 384 : 128);
    m.module->to(dev);
    return m;
  };
  const auto adamw = torch::optim::AdamWOptions(3e-3).weight_decay(0.01);
  auto model = make_model();
  torch::optim::AdamW optimizer(model.module->parameters(), adamw);
  auto loss_fn = [](const at::Tensor& logits, const at::Tensor& target) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
  };

  kiln::Trainer trainer(model.module, model.forward, optimizer, loss_fn, args);
  // Batches padded to their longest window (rounded up to pad_to_multiple_of), labels -100 at the
  // padding, which cross_entropy ignores. No attention mask: the padding comes after the text, and
  // causal attention (built from each batch's own length) never lets a position see a later one,
  // so no real character sees the padding; the model takes the token ids alone.
  kiln::DataCollatorWithPadding collator(/*pad_token_id=*/0);
  collator.return_attention_mask = false;
  trainer.set_data_collator(collator);
  std::printf("backend: %s\n", trainer.backend().c_str());
  for (const auto& r : trainer.backend_reasons()) std::printf("  why: %s\n", r.c_str());

  const auto before = trainer.evaluate(eval_data);
  const kiln::TrainOutput out = trainer.train(train_data, eval_data);
  const auto after = trainer.evaluate(eval_data);
  auto metric = [&](const char* name) { return out.metrics.count(name) ? out.metrics.at(name) : 0.0; };
  // Compiled when the compiled step ran: with batches of varying length, the last step may well be
  // the first of a new length, which runs while the step is captured again (eagerly).
  const kiln::StepStats& stats = trainer.stats();
  std::printf(
      "\n%lld steps in %.1f s (%.2f steps/s), %s; training loss %.3f; evaluation loss %.3f before, %.3f after "
      "(a uniform guess: %.3f)\n",
      static_cast<long long>(out.global_step), metric("train_runtime"), metric("train_steps_per_second"),
      stats.compiled_steps > 0 ? "compiled" : "running eagerly (see the log for why)", out.training_loss,
      before.at("eval_loss"), after.at("eval_loss"), std::log(static_cast<double>(tokenizer.vocab_size())));
  std::printf("steps: %d compiled, %d eager (warm-up, captures, fallbacks); %d compiles\n", stats.compiled_steps,
              stats.eager_steps, stats.compiles);
  if (!args.output_dir.empty()) {
    const std::string metrics = args.output_dir + "/metrics.jsonl";
    std::printf("metrics: %s; checkpoints: %s\n", metrics.c_str(),
                kiln::Trainer::last_checkpoint(args.output_dir).c_str());
    const auto& to = args.report_to;
    if (std::count(to.begin(), to.end(), "all") + std::count(to.begin(), to.end(), "jsonl") > 0) {
      try {
        loss_plot::write_loss_plot(metrics, args.output_dir + "/loss.png");
        std::printf("loss curves: %s/loss.png\n", args.output_dir.c_str());
      } catch (const std::runtime_error& e) {  // a run shorter than logging_steps logged no loss
        std::printf("loss curves: not drawn (%s)\n", e.what());
      }
    }
  }

  // A few lines in the style of the text: sampled one character at a time (temperature 0.8).
  model.module->eval();
  at::NoGradGuard no_grad;
  at::Tensor context_ids = tokens.slice(0, split, split + context).unsqueeze(0);
  std::string written;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  for (int i = 0; i < 300; ++i) {
    const at::Tensor logits = model.forward(context_ids).select(1, -1).squeeze(0).to(at::kFloat).cpu();
    const at::Tensor probs = at::softmax(logits / 0.8, 0);
    const at::Tensor next = at::multinomial(probs, 1, false, gen);
    written += tokenizer.decode(next);
    context_ids = at::cat({context_ids.slice(1, 1, context), next.to(context_ids.device()).view({1, 1})}, 1);
  }
  std::printf("\nthe model writes, after the opening of the held-out text:\n---\n%s\n---\n", written.c_str());

  // Speed, side by side: the same step in LibTorch eager (a twin of the model with its own AdamW)
  // and in kiln's compiled step, each timed over 20 steps of one batch after 3 to warm up.
  model.module->train();
  {
    c10::AutoGradMode grad(true);  // the sampling above turned gradients off
    const int64_t batch = args.per_device_train_batch_size;
    const at::Tensor x = tokens.slice(0, 0, batch * context).view({batch, context});
    const at::Tensor y = tokens.slice(0, 1, batch * context + 1).view({batch, context});
    auto twin = make_model();
    torch::optim::AdamW twin_optimizer(twin.module->parameters(), adamw);
    kiln::TrainingArguments eager_args = args;
    // Off for certain: a mode or backend set in the file turns compiling on (Hugging Face's rule).
    eager_args.torch_compile = false;
    eager_args.torch_compile_mode = "default";
    eager_args.torch_compile_backend = "auto";
    eager_args.output_dir.clear();
    kiln::Trainer eager(twin.module, twin.forward, twin_optimizer, loss_fn, eager_args);
    auto ms_per_step = [&](kiln::Trainer& t) {
      for (int i = 0; i < 3; ++i) t.step(x, y);
      if (cuda) torch::cuda::synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 20; ++i) t.step(x, y);
      if (cuda) torch::cuda::synchronize();
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 20;
    };
    const double eager_ms = ms_per_step(eager), kiln_ms = ms_per_step(trainer);
    std::printf("speed, one batch of %lld x %lld, ms a step: LibTorch eager %.2f, kiln %.2f (%.2fx)\n",
                static_cast<long long>(batch), static_cast<long long>(context), eager_ms, kiln_ms, eager_ms / kiln_ms);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "kiln_char_gpt: %s\n", e.what());
  return 1;
}
