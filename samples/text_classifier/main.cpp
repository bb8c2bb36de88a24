// A text classifier trained with kiln::Trainer::train: which license a line of text comes from. The
// lines are those of three licenses every Debian system ships in /usr/share/common-licenses (the
// GNU GPL version 3, the Apache License 2.0 and the Mozilla Public License 2.0), lower-cased, with
// indentation and runs of spaces made single spaces so that layout gives nothing away, and lines
// shorter than 16 characters left out. Each line is a bag of hashed character trigrams and words
// (fastText's idea): an EmbeddingBag averages their vectors and a linear layer scores the three licenses. Every
// license gives as many lines as the shortest one has, so a guess is right a third of the time; a
// fifth of them, drawn at random, are held out and the accuracy is measured on those.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "kiln/kiln.h"

namespace {

constexpr int64_t kBuckets = 1 << 14, kMaxFeatures = 112, kDim = 32;
const std::vector<std::string> kLicenses = {"GPL-3", "Apache-2.0", "MPL-2.0"};

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<std::string> lines;
  for (std::string raw; std::getline(in, raw);) {
    std::string line;
    for (unsigned char c : raw)
      if (!std::isspace(c)) line.push_back(static_cast<char>(std::tolower(c)));
      else if (!line.empty() && line.back() != ' ') line.push_back(' ');
    if (!line.empty() && line.back() == ' ') line.pop_back();
    if (line.size() >= 16) lines.push_back(line);
  }
  return lines;
}

// The line's features, hashed (FNV-1a) into 1..kBuckets-1: its character trigrams (with a space
// before and after it) and its words. Padded with 0 to kMaxFeatures, so that every example has one
// shape; the bag leaves the padding out.
int64_t bucket(const std::string& feature) {
  uint32_t hash = 2166136261u;
  for (unsigned char c : feature) hash = (hash ^ c) * 16777619u;
  return 1 + hash % (kBuckets - 1);
}

std::vector<int64_t> feature_ids(const std::string& line) {
  const std::string text = " " + line + " ";
  std::vector<int64_t> ids;
  for (size_t i = 0; i + 3 <= text.size(); ++i) ids.push_back(bucket(text.substr(i, 3)));
  for (size_t start = 1, end; start < text.size(); start = end + 1) {
    end = text.find(' ', start);
    ids.push_back(bucket("word:" + text.substr(start, end - start)));
  }
  ids.resize(kMaxFeatures, 0);
  return ids;
}

struct LicenseNetImpl : torch::nn::Module {
  LicenseNetImpl()
      : bag(torch::nn::EmbeddingBagOptions(kBuckets, kDim).mode(torch::kMean).padding_idx(0)),
        fc(kDim, static_cast<int64_t>(kLicenses.size())) {
    register_module("bag", bag);
    register_module("fc", fc);
  }
  torch::Tensor forward(torch::Tensor ids) { return fc(bag(ids)); }  // [B, kMaxFeatures] -> logits [B, 3]

  torch::nn::EmbeddingBag bag;
  torch::nn::Linear fc;
};
TORCH_MODULE(LicenseNet);

}  // namespace

int main(int argc, char** argv) try {
  std::string dir = "/usr/share/common-licenses", output_dir = "text_classifier_run", precision = "auto",
              device = "cpu";
  int64_t steps = 300;
  auto usage = [] {
    std::fprintf(stderr,
                 "usage: kiln_text_classifier [--licenses DIR] [--steps N] [--output-dir DIR] [--device cpu|cuda] "
                 "[--precision auto|fp32|bf16]\n");
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--licenses" && i + 1 < argc) dir = argv[++i];
    else if (flag == "--steps" && i + 1 < argc) steps = std::max(1, std::atoi(argv[++i]));
    else if (flag == "--output-dir" && i + 1 < argc) output_dir = argv[++i];
    else if (flag == "--precision" && i + 1 < argc) precision = argv[++i];
    else if (flag == "--device" && i + 1 < argc) device = argv[++i];
    else return usage();
  }
  if (device != "cpu" && device != "cuda") return usage();
  const at::Device dev = device == "cuda" ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);

  // The model is tiny: an op split across threads costs more in hand-offs than it saves, and on a
  // busy machine the threads wait on each other far longer.
  torch::set_num_threads(1);
  // Each license's features, as many lines of each as the shortest license has, in one order drawn
  // at random; a fifth held out.
  std::vector<std::vector<std::string>> texts;
  for (const auto& name : kLicenses) texts.push_back(lines_of(dir + "/" + name));
  size_t per_license = SIZE_MAX;
  for (const auto& lines : texts) per_license = std::min(per_license, lines.size());
  std::mt19937 rng(1);
  std::vector<int64_t> ids, labels;
  for (size_t k = 0; k < texts.size(); ++k) {
    std::shuffle(texts[k].begin(), texts[k].end(), rng);  // which lines of the longer licenses are used
    for (size_t i = 0; i < per_license; ++i) {
      const std::vector<int64_t> features = feature_ids(texts[k][i]);
      ids.insert(ids.end(), features.begin(), features.end());
      labels.push_back(static_cast<int64_t>(k));
    }
  }
  torch::manual_seed(1);
  const int64_t n = static_cast<int64_t>(labels.size()), batch = 16;
  const at::Tensor order = torch::randperm(n);
  const at::Tensor x = torch::tensor(ids).reshape({n, kMaxFeatures}).index_select(0, order).to(dev);
  const at::Tensor y = torch::tensor(labels).index_select(0, order).to(dev);
  const int64_t n_eval = n / 5, n_train = (n - n_eval) / batch * batch;  // whole batches: one shape, one compile
  kiln::TensorDataset train_data({x.slice(0, 0, n_train)}, y.slice(0, 0, n_train));
  kiln::TensorDataset eval_data({x.slice(0, n_train, n_train + n_eval)}, y.slice(0, n_train, n_train + n_eval));
  std::printf("%zu lines of each license; %lld for training, %lld held out\n", per_license,
              static_cast<long long>(n_train), static_cast<long long>(n_eval));

  LicenseNet model;
  model->to(dev);
  torch::optim::AdamW optimizer(model->parameters());
  auto loss_fn = [](const at::Tensor& logits, const at::Tensor& labels) {
    return torch::nn::functional::cross_entropy(logits, labels);
  };

  kiln::TrainingArguments args;
  args.torch_compile = true;  // the default backend for this machine
  args.output_dir = output_dir;
  args.max_steps = steps;
  args.per_device_train_batch_size = batch;
  args.per_device_eval_batch_size = 128;
  args.learning_rate = 1e-2;
  args.warmup_ratio = 0.05;  // then linear decay to 0
  args.logging_steps = std::max<int64_t>(1, steps / 10);
  args.eval_strategy = "steps";
  args.eval_steps = std::max<int64_t>(1, steps / 4);
  args.save_strategy = "no";
  args.seed = 1;
  // bfloat16 autocast where the device computes bfloat16 in hardware (--precision auto).
  std::printf("precision: %s\n", kiln::choose_precision(args, precision, dev).c_str());

  kiln::Trainer trainer(model, optimizer, loss_fn, args);
  trainer.set_compute_metrics([](const kiln::EvalPrediction& p) {
    const double accuracy = p.predictions.argmax(1).eq(p.label_ids).to(at::kDouble).mean().item<double>();
    return std::map<std::string, double>{{"accuracy", accuracy}};
  });
  std::printf("backend: %s\n", trainer.backend().c_str());

  const auto before = trainer.evaluate(eval_data);
  const kiln::TrainOutput out = trainer.train(train_data, eval_data);
  const auto after = trainer.evaluate(eval_data);

  const kiln::StepStats& stats = trainer.stats();
  std::printf("%lld steps in %.1f s: %d compiled, %d eager (warm-up and capture); fallback: %s\n",
              static_cast<long long>(out.global_step), out.metrics.at("train_runtime"), stats.compiled_steps,
              stats.eager_steps, stats.last_fallback.empty() ? "none" : stats.last_fallback.c_str());
  std::printf("held-out accuracy %.3f before, %.3f after (chance %.3f); evaluation loss %.3f before, %.3f after\n",
              before.at("eval_accuracy"), after.at("eval_accuracy"), 1.0 / static_cast<double>(kLicenses.size()),
              before.at("eval_loss"), after.at("eval_loss"));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "kiln_text_classifier: %s\n", e.what());
  return 1;
}
