// The character GPT of samples/char_gpt, trained data-parallel: start it with torchrun, one process
// per rank, e.g.
//   torchrun --standalone --nproc-per-node 2 --no-python build/bin/kiln_ddp
// Every rank builds the model (from other random numbers: the Trainer broadcasts rank 0's), reads
// the same text and the settings of samples/ddp/train.toml (or --config FILE), and trains through
// kiln::Trainer::train on its share of every epoch; the gradients are averaged across the ranks
// inside the compiled step. At the end every rank prints a checksum of its parameters, which must be
// the same on all of them. Started without torchrun it trains alone, as samples/char_gpt does.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>

#include "kiln/distributed.h"
#include "kiln/kiln.h"
#include "kiln/workloads.h"

namespace {

// Windows of `context` tokens whose targets are the same windows one token on.
class TextWindows : public kiln::Dataset {
 public:
  TextWindows(at::Tensor tokens, int64_t context) : tokens_(std::move(tokens)), context_(context) {
    size_ = tokens_.size(0) > context_ ? static_cast<size_t>((tokens_.size(0) - context_ - 1) / (context_ / 2) + 1) : 0;
    if (size_ == 0) throw std::invalid_argument("the text is shorter than one window");
  }
  size_t size() const override { return size_; }
  kiln::Example get(size_t i) const override {
    const int64_t at = static_cast<int64_t>(i) * (context_ / 2);
    return {{tokens_.slice(0, at, at + context_)}, tokens_.slice(0, at + 1, at + context_ + 1)};
  }

 private:
  at::Tensor tokens_;
  int64_t context_;
  size_t size_ = 0;
};

// A file, or the regular files of a folder in name order.
std::string read_text(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec))
      if (!e.is_symlink() && e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::string text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read the training text " + f.string());
    text += std::string(std::istreambuf_iterator<char>(in), {});
  }
  if (text.empty()) throw std::runtime_error("no training text in " + path);
  return text;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string config = KILN_DDP_CONFIG, data = "/usr/share/common-licenses", output_dir, precision = "auto";
  int64_t steps = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) config = argv[++i];
    else if (a == "--data" && i + 1 < argc) data = argv[++i];
    else if (a == "--steps" && i + 1 < argc) steps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--output-dir" && i + 1 < argc) output_dir = argv[++i];
    else if (a == "--precision" && i + 1 < argc) precision = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: torchrun --nproc-per-node N --no-python kiln_ddp [--config FILE] [--data PATH] [--steps N] "
                   "[--output-dir DIR] [--precision auto|fp32|bf16]\n");
      return 2;
    }
  }
  kiln::TrainingArguments args = kiln::TrainingArguments::from_toml(config);
  if (steps > 0) args.max_steps = steps;
  // bfloat16 autocast where the CPU computes bfloat16 in hardware (--precision auto); every rank
  // decides alike on one machine.
  const std::string chosen = kiln::choose_precision(args, precision, at::Device(at::kCPU));
  if (!output_dir.empty()) args.output_dir = output_dir;

  // The text as tokens, one per distinct byte (every rank reads the same text: the same alphabet).
  const std::string text = read_text(data);
  std::vector<int64_t> index_of(256, -1);
  int64_t vocab = 0;
  for (unsigned char c : text) index_of[c] = 0;
  for (auto& v : index_of)
    if (v == 0) v = vocab++;
  std::vector<int64_t> ids;
  for (unsigned char c : text) ids.push_back(index_of[c]);
  const int64_t context = 64;
  TextWindows train_data(at::tensor(ids, at::TensorOptions().dtype(at::kLong)), context);

  // Another seed on every rank: what they train from is rank 0's model, which the Trainer broadcasts.
  const int rank = kiln::distributed::world_from_env().rank;
  torch::manual_seed(100 + static_cast<uint64_t>(rank));
  auto model = kiln::make_char_gpt(vocab, context, /*layers=*/2, /*heads=*/4, /*width=*/64);
  torch::optim::AdamW optimizer(model.module->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0.01));
  auto loss_fn = [](const at::Tensor& logits, const at::Tensor& target) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
  };
  kiln::Trainer trainer(model.module, model.forward, optimizer, loss_fn, args);
  if (trainer.is_world_process_zero())
    std::printf("%d ranks, %zu windows of %lld characters, %lld distinct; backend %s; precision %s\n",
                trainer.world_size(), train_data.size(), static_cast<long long>(context), static_cast<long long>(vocab),
                trainer.backend().c_str(), chosen.c_str());

  const kiln::TrainOutput out = trainer.train(train_data);

  double checksum = 0;
  for (const auto& p : model.module->parameters()) checksum += p.detach().to(at::kDouble).sum().item<double>();
  std::printf("rank %d of %d: %lld steps, %s, training loss %.4f, %.2f steps/s, parameter checksum %.17g\n",
              trainer.process_index(), trainer.world_size(), static_cast<long long>(out.global_step),
              trainer.compiled() ? "compiled" : "eager", out.training_loss, out.metrics.at("train_steps_per_second"),
              checksum);
  return 0;
} catch (const kiln::DistributedError& e) {
  std::fprintf(stderr, "kiln_ddp: %s\n", e.what());
  return 3;
} catch (const std::exception& e) {
  std::fprintf(stderr, "kiln_ddp: %s\n", e.what());
  return 1;
}
