// Variable-length data the Hugging Face way (kiln/data.h): the padding collator, group_by_length's
// order, the text dataset, and Trainer::train over variable-length batches — compiled against the
// same training run eagerly, and resumed from a checkpoint against the uninterrupted run. Every
// test draws its data from a fresh seed (printed on failure).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include "kiln/compile.h"
#include "kiln/config.h"
#include "kiln/data.h"
#include "kiln/trainer.h"

namespace nn = torch::nn;
namespace fs = std::filesystem;

namespace {

uint64_t fresh_seed() { return (static_cast<uint64_t>(std::random_device{}()) << 20) ^ std::random_device{}(); }

std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("kiln_data_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d.string();
}

std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

at::Tensor ce(const at::Tensor& out, const at::Tensor& y) {
  return nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}), y.reshape({-1}));
}

// Variable-length token sequences: for a language model, example i is (s[0, L), s[1, L + 1)) of a
// random sequence s; for a classifier, (s[0, L), a 0-dim label). get() counts its calls.
struct Sequences : kiln::Dataset {
  std::vector<at::Tensor> ids, targets;
  mutable int64_t gets = 0;
  mutable std::vector<int64_t> got;  // every index asked for, in order
  size_t size() const override { return ids.size(); }
  kiln::Example get(size_t i) const override {
    ++gets;
    got.push_back(static_cast<int64_t>(i));
    return {{ids.at(i)}, targets.at(i)};
  }
  int64_t length(size_t i) const override { return ids.at(i).size(0); }
};

Sequences make_sequences(int64_t n, int64_t shortest, int64_t longest, int64_t vocab, bool language_model,
                         uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Sequences d;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t length = at::randint(shortest, longest + 1, {1}, gen).item<int64_t>();
    // A learnable pattern (each token the one before plus a step of 1 or 2, mod vocab) with noise.
    const at::Tensor steps = at::randint(1, 3, {length + 1}, gen, at::kLong);
    at::Tensor s = (steps.cumsum(0) + at::randint(0, vocab, {1}, gen, at::kLong)).remainder(vocab);
    if (language_model) {
      d.ids.push_back(s.slice(0, 0, length));
      d.targets.push_back(s.slice(0, 1, length + 1));
    } else {
      d.ids.push_back(s.slice(0, 0, length));
      d.targets.push_back(s[0].remainder(3));  // a 0-dim label
    }
  }
  return d;
}

// A small language model that reads the attention mask: each position's embedding (zero at the
// padding) next to the mean of the real tokens up to it, through a tanh layer to the vocabulary.
struct TinyLmImpl : nn::Module {
  TinyLmImpl(int64_t vocab, int64_t width, double dropout) {
    emb = register_module("emb", nn::Embedding(vocab, width));
    mix = register_module("mix", nn::Linear(2 * width, width));
    drop = register_module("drop", nn::Dropout(dropout));
    head = register_module("head", nn::Linear(width, vocab));
  }
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& mask) {
    lengths_seen.push_back(ids.size(1));
    const at::Tensor m = mask.unsqueeze(-1).to(at::kFloat);
    const at::Tensor x = emb->forward(ids) * m;
    const at::Tensor so_far = x.cumsum(1) / m.cumsum(1).clamp_min(1.0);
    return head->forward(drop->forward(at::tanh(mix->forward(at::cat({x, so_far}, -1)))));
  }
  nn::Embedding emb{nullptr};
  nn::Linear mix{nullptr}, head{nullptr};
  nn::Dropout drop{nullptr};
  std::vector<int64_t> lengths_seen;  // the padded length of every batch forward ran on
};

// A classifier on the mean of its real tokens' embeddings (the mask keeps the padding out).
struct TinyClassifierImpl : nn::Module {
  TinyClassifierImpl(int64_t vocab, int64_t width) {
    emb = register_module("emb", nn::Embedding(vocab, width));
    hidden = register_module("hidden", nn::Linear(width, width));
    head = register_module("head", nn::Linear(width, 3));
  }
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& mask) {
    lengths_seen.push_back(ids.size(1));
    const at::Tensor m = mask.unsqueeze(-1).to(at::kFloat);
    const at::Tensor pooled = (emb->forward(ids) * m).sum(1) / m.sum(1);
    return head->forward(at::tanh(hidden->forward(pooled)));
  }
  nn::Embedding emb{nullptr};
  nn::Linear hidden{nullptr}, head{nullptr};
  std::vector<int64_t> lengths_seen;
};

// The metrics file's lines as key -> the value's text (equal text: equal bits).
std::vector<std::map<std::string, std::string>> read_metrics(const std::string& dir) {
  std::vector<std::map<std::string, std::string>> out;
  std::ifstream in(fs::path(dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    std::map<std::string, std::string> m;
    for (const auto& [k, v] : j.items()) m[k] = v.dump();
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace

// ---- the collator ---------------------------------------------------------------------------------

// A batch of random-length sequences: padded on the right to the longest, with pad_token_id; the
// mask 1 exactly at the real tokens; labels -100 at the padding; and cross_entropy over the padded
// batch (ignore_index -100) equal to the mean over the real tokens alone.
TEST(DataCollator, PadsToTheLongestWithAMaskAndIgnoredLabels) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto data = make_sequences(7, 1, 30, 50, /*language_model=*/true, seed);
  std::vector<kiln::Example> examples;
  int64_t longest = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    examples.push_back(data.get(i));
    longest = std::max(longest, data.length(i));
  }
  const kiln::DataCollatorWithPadding collate(/*pad_token_id=*/7);
  const kiln::Batch b = collate(examples);
  ASSERT_EQ(b.inputs.size(), 2u) << "input_ids and attention_mask";
  const at::Tensor& ids = b.inputs[0];
  const at::Tensor& mask = b.inputs[1];
  EXPECT_EQ(ids.sizes(), (std::vector<int64_t>{7, longest}));
  EXPECT_EQ(mask.sizes(), ids.sizes());
  EXPECT_EQ(b.target.sizes(), ids.sizes());
  EXPECT_EQ(ids.scalar_type(), at::kLong);
  EXPECT_EQ(mask.scalar_type(), at::kLong);
  for (int64_t i = 0; i < 7; ++i) {
    const int64_t L = data.length(static_cast<size_t>(i));
    EXPECT_TRUE(at::equal(ids[i].slice(0, 0, L), data.ids[static_cast<size_t>(i)])) << "example " << i;
    EXPECT_TRUE(at::equal(b.target[i].slice(0, 0, L), data.targets[static_cast<size_t>(i)])) << "example " << i;
    EXPECT_TRUE(ids[i].slice(0, L).eq(7).all().item<bool>()) << "example " << i << ": pad_token_id at the padding";
    EXPECT_TRUE(b.target[i].slice(0, L).eq(-100).all().item<bool>()) << "example " << i << ": -100 labels";
    EXPECT_EQ(to_vector(mask[i]),
              [&] {
                std::vector<int64_t> want(static_cast<size_t>(longest), 0);
                std::fill(want.begin(), want.begin() + L, 1);
                return want;
              }())
        << "example " << i;
  }
  // The loss of the padded batch is the mean over the real tokens: the padding is ignored.
  const at::Tensor logits = at::randn({7, longest, 50});
  double sum = 0;
  int64_t tokens = 0;
  for (int64_t i = 0; i < 7; ++i) {
    const int64_t L = data.length(static_cast<size_t>(i));
    sum += nn::functional::cross_entropy(logits[i].slice(0, 0, L), data.targets[static_cast<size_t>(i)],
                                         nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
               .item<double>();
    tokens += L;
  }
  EXPECT_NEAR(ce(logits, b.target).item<double>(), sum / static_cast<double>(tokens), 1e-5);

  // Without the mask, the ids and labels alone.
  kiln::DataCollatorWithPadding no_mask(0);
  no_mask.return_attention_mask = false;
  EXPECT_EQ(no_mask(examples).inputs.size(), 1u);
}

// pad_to_multiple_of rounds the padded length (of the ids and the labels) up to a multiple; a
// length that is one already stays.
TEST(DataCollator, PadToMultipleOf) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    const auto data = make_sequences(5, 1, 40, 9, true, rng());
    std::vector<kiln::Example> examples;
    int64_t longest = 0;
    for (size_t i = 0; i < data.size(); ++i) {
      examples.push_back(data.get(i));
      longest = std::max(longest, data.length(i));
    }
    const int64_t multiple = static_cast<int64_t>(rng() % 9) + 1;
    const kiln::Batch b = kiln::DataCollatorWithPadding(0, multiple)(examples);
    const int64_t want = (longest + multiple - 1) / multiple * multiple;
    EXPECT_EQ(b.inputs[0].size(1), want) << "longest " << longest << ", multiple " << multiple;
    EXPECT_EQ(b.target.size(1), want);
    EXPECT_EQ(b.inputs[1].sum().item<int64_t>(), [&] {
      int64_t s = 0;
      for (size_t i = 0; i < data.size(); ++i) s += data.length(i);
      return s;
    }()) << "the mask counts the real tokens only";
  }
  // Exactly a multiple: no extra padding.
  std::vector<kiln::Example> eight = {{{at::arange(8)}, at::arange(1, 9)}, {{at::arange(3)}, at::arange(1, 4)}};
  EXPECT_EQ(kiln::DataCollatorWithPadding(0, 8)(eight).inputs[0].size(1), 8);
  EXPECT_EQ(kiln::DataCollatorWithPadding(0, 0)(eight).inputs[0].size(1), 8);
  EXPECT_EQ(kiln::DataCollatorWithPadding(0, 3)(eight).inputs[0].size(1), 9);
}

// A classifier's 0-dim labels are stacked, not padded; the examples' other inputs are stacked too.
// Examples that cannot make one batch are errors that say why.
TEST(DataCollator, ClassifierLabelsAndErrors) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto data = make_sequences(6, 2, 12, 20, /*language_model=*/false, seed);
  std::vector<kiln::Example> examples;
  for (size_t i = 0; i < data.size(); ++i) examples.push_back(data.get(i));
  const kiln::Batch b = kiln::DataCollatorWithPadding(0)(examples);
  EXPECT_EQ(b.target.sizes(), (std::vector<int64_t>{6}));
  for (int64_t i = 0; i < 6; ++i) EXPECT_TRUE(at::equal(b.target[i], data.targets[static_cast<size_t>(i)]));

  // The stacking collator names the example whose length differs and points at the padding one.
  try {
    kiln::default_data_collator(examples);
    // Six random lengths from 2 to 12 being all equal is (1/11)^5: then the stack is right.
    for (size_t i = 1; i < data.size(); ++i) EXPECT_EQ(data.length(i), data.length(0));
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("kiln::default_data_collator: input 0 of example"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("kiln::DataCollatorWithPadding(pad_token_id)"), std::string::npos) << e.what();
  }
  // One shape: the default collator stacks.
  std::vector<kiln::Example> same = {{{at::arange(4), at::ones({2})}, at::scalar_tensor(1, at::kLong)},
                                     {{at::arange(4), at::zeros({2})}, at::scalar_tensor(0, at::kLong)}};
  const kiln::Batch stacked = kiln::default_data_collator(same);
  EXPECT_EQ(stacked.inputs[0].sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(stacked.inputs[1].sizes(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(stacked.target.sizes(), (std::vector<int64_t>{2}));
  // Padded and stacked: the padded input, the other input, then the mask.
  const kiln::Batch padded = kiln::DataCollatorWithPadding(0)(same);
  ASSERT_EQ(padded.inputs.size(), 3u);
  EXPECT_TRUE(at::equal(padded.inputs[1], stacked.inputs[1]));

  std::vector<kiln::Example> wide = {{{at::zeros({3, 2}, at::kLong)}, at::scalar_tensor(0, at::kLong)},
                                     {{at::zeros({5, 4}, at::kLong)}, at::scalar_tensor(1, at::kLong)}};
  try {
    kiln::DataCollatorWithPadding(0)(wide);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "kiln::DataCollatorWithPadding: input 0 of example 1 of the batch is Long [5, 4], example 0's Long "
                 "[3, 2]: only the length (dim 0) may differ");
  }
  std::vector<kiln::Example> uneven = {{{at::arange(3)}, at::scalar_tensor(0, at::kLong)},
                                       {{at::arange(3), at::arange(2)}, at::scalar_tensor(1, at::kLong)}};
  EXPECT_THROW(kiln::DataCollatorWithPadding(0)(uneven), std::invalid_argument);
  EXPECT_THROW(kiln::DataCollatorWithPadding(0)({}), std::invalid_argument);
}

// ---- group_by_length ------------------------------------------------------------------------------

// Hugging Face's length-grouped order: every index once; megabatches of min(n / (4 * batch), 50)
// batches, each sorted longest first, but for the longest example of all, which leads; batches
// of similar length (far less padding than a plain shuffle); the same generator state gives the
// same order, another seed another.
TEST(LengthGrouped, EveryIndexOnceSimilarLengthsReproducible) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const auto& [n, batch] : std::vector<std::pair<int64_t, int64_t>>{{1000, 8}, {37, 4}, {5, 16}, {2000, 3}}) {
    SCOPED_TRACE("n " + std::to_string(n) + ", batch " + std::to_string(batch));
    std::vector<int64_t> lengths;
    for (int64_t i = 0; i < n; ++i) lengths.push_back(1 + static_cast<int64_t>(rng() % 200));
    const uint64_t s = rng();
    auto g = at::make_generator<at::CPUGeneratorImpl>(s);
    const auto order = kiln::length_grouped_indices(lengths, batch, g);
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(static_cast<size_t>(n));
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(sorted, all) << "every index exactly once";
    const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
    EXPECT_EQ(lengths[static_cast<size_t>(order[0])], longest) << "the longest example first";

    // Within each megabatch, longest first (the first megabatch's head was swapped with the
    // longest megabatch's head, so each megabatch from its second element on is sorted).
    const int64_t mega = std::max<int64_t>(1, std::min<int64_t>(n / (batch * 4), 50)) * batch;
    for (int64_t start = 0; start < n; start += mega)
      for (int64_t i = start + 2; i < std::min(n, start + mega); ++i)
        EXPECT_GE(lengths[static_cast<size_t>(order[static_cast<size_t>(i - 1)])],
                  lengths[static_cast<size_t>(order[static_cast<size_t>(i)])])
            << "position " << i;

    // Padding: the batches' longest minus shortest, against a plain shuffle of the same lengths.
    auto spread = [&](const std::vector<int64_t>& o) {
      int64_t total = 0;
      for (int64_t b = 0; b < n; b += batch) {
        int64_t lo = 1 << 30, hi = 0;
        for (int64_t i = b; i < std::min(n, b + batch); ++i) {
          lo = std::min(lo, lengths[static_cast<size_t>(o[static_cast<size_t>(i)])]);
          hi = std::max(hi, lengths[static_cast<size_t>(o[static_cast<size_t>(i)])]);
        }
        total += hi - lo;
      }
      return total;
    };
    auto g2 = at::make_generator<at::CPUGeneratorImpl>(s);
    const at::Tensor perm = at::randperm(n, g2, at::TensorOptions().dtype(at::kLong));
    if (n >= 100) {
      EXPECT_LT(spread(order) * 4, spread(to_vector(perm))) << "batches of similar length";
    }

    auto same = at::make_generator<at::CPUGeneratorImpl>(s);
    EXPECT_EQ(kiln::length_grouped_indices(lengths, batch, same), order) << "the same generator state, the same order";
    auto other = at::make_generator<at::CPUGeneratorImpl>(s + 1);
    if (n > 10) {
      EXPECT_NE(kiln::length_grouped_indices(lengths, batch, other), order) << "another seed, another order";
    }
    // The generator moved on as one randperm moves it: the next epoch draws from there.
    EXPECT_TRUE(at::equal(g.get_state(), g2.get_state()));
  }
  auto g = at::make_generator<at::CPUGeneratorImpl>(rng());
  EXPECT_TRUE(kiln::length_grouped_indices({}, 4, g).empty());
  EXPECT_THROW(kiln::length_grouped_indices({3, 1}, 0, g), std::invalid_argument);
}

// Through Trainer::train: each epoch reads every example once (beyond the one it reads first, to
// learn the batch's layout), its batches hold examples of similar length, the longest batch
// first, and the order is the seed's: the same in a second run, another with another seed.
TEST(LengthGrouped, TrainerEpochsSeeEveryExampleOnceInBatchesOfSimilarLength) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int64_t n = 96, bs = 4;
  auto run = [&](int64_t train_seed, std::vector<int64_t>* lengths_seen) {
    auto data = make_sequences(n, 1, 60, 13, true, seed);
    torch::manual_seed(1);
    auto model = std::make_shared<TinyLmImpl>(13, 8, 0.0);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
    kiln::TrainingArguments args;
    args.per_device_train_batch_size = bs;
    args.num_train_epochs = 2;
    args.group_by_length = true;
    args.seed = train_seed;
    args.logging_steps = 1000;
    args.log_level = "warn";
    kiln::Trainer trainer(model, opt, ce, args);
    trainer.set_data_collator(kiln::DataCollatorWithPadding(0));
    trainer.train(data);
    *lengths_seen = model->lengths_seen;
    return std::vector<int64_t>(data.got.begin() + 1, data.got.end());  // the first: the layout probe
  };
  std::vector<int64_t> lengths_seen;
  const auto got = run(5, &lengths_seen);
  ASSERT_EQ(got.size(), static_cast<size_t>(2 * n));
  const auto data = make_sequences(n, 1, 60, 13, true, seed);
  int64_t longest = 0;
  for (int64_t i = 0; i < n; ++i) longest = std::max(longest, data.length(static_cast<size_t>(i)));
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> e(got.begin() + epoch * n, got.begin() + (epoch + 1) * n);
    EXPECT_EQ(lengths_seen[static_cast<size_t>(epoch * n / bs)], longest) << "epoch " << epoch << " starts longest";
    std::sort(e.begin(), e.end());
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(e[static_cast<size_t>(i)], i) << "epoch " << epoch;
  }
  // The padded lengths differ from batch to batch: the step sees many shapes.
  EXPECT_GT(std::set<int64_t>(lengths_seen.begin(), lengths_seen.end()).size(), 5u);
  std::vector<int64_t> again_seen, other_seen;
  EXPECT_EQ(run(5, &again_seen), got) << "the same seed, the same order";
  EXPECT_NE(run(6, &other_seen), got) << "another seed, another order";
}

// ---- the text dataset -----------------------------------------------------------------------------

TEST(TextDataset, WindowsOfRandomLengthWithNextTokenLabels) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor tokens = at::randint(0, 1000, {5000}, gen, at::kLong);
  for (int64_t stride : {0, 7}) {
    SCOPED_TRACE("stride " + std::to_string(stride));
    const auto d = kiln::TextDataset::windows(tokens, 5, 40, stride, seed);
    std::set<int64_t> lengths;
    int64_t expect_start = 0;
    for (size_t i = 0; i < d.size(); ++i) {
      const auto [start, length] = d.spans()[i];
      EXPECT_EQ(start, expect_start) << "window " << i;
      EXPECT_GE(length, 5);
      EXPECT_LE(length, 40);
      const kiln::Example e = d.get(i);
      EXPECT_EQ(d.length(i), e.inputs[0].size(0));
      EXPECT_TRUE(at::equal(e.inputs[0], tokens.slice(0, start, start + length)));
      EXPECT_TRUE(at::equal(e.target, tokens.slice(0, start + 1, start + length + 1))) << "labels: the next tokens";
      lengths.insert(length);
      expect_start += stride > 0 ? stride : length;
    }
    // The text is used up: no room for another window of 5 and its next token.
    EXPECT_GT(expect_start + 5 + 1, 5000);
    EXPECT_GT(lengths.size(), 20u) << "lengths spread over 5..40";
    const auto again = kiln::TextDataset::windows(tokens, 5, 40, stride, seed);
    EXPECT_EQ(again.spans(), d.spans()) << "the same seed, the same windows";
    EXPECT_NE(kiln::TextDataset::windows(tokens, 5, 40, stride, seed + 1).spans(), d.spans());
  }
  const auto fixed = kiln::TextDataset::windows(tokens, 64, 64, 64);
  EXPECT_EQ(fixed.size(), static_cast<size_t>((5000 - 1) / 64));
  EXPECT_THROW(kiln::TextDataset::windows(tokens, 0, 4), std::invalid_argument);
  EXPECT_THROW(kiln::TextDataset::windows(tokens, 8, 4), std::invalid_argument);
  EXPECT_THROW(kiln::TextDataset::windows(tokens.slice(0, 0, 4), 4, 4), std::invalid_argument);
}

TEST(TextDataset, LinesOfAFileAndTheCharTokenizer) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // Random lines of random letters, some empty, the last without its newline.
  std::vector<std::string> lines;
  std::string text;
  for (int i = 0; i < 30; ++i) {
    std::string line;
    const size_t length = rng() % 4 == 0 ? 0 : 1 + rng() % 50;
    for (size_t k = 0; k < length; ++k) line.push_back(static_cast<char>('a' + rng() % 26));
    lines.push_back(line);
    text += line + (i + 1 < 30 ? "\n" : "");
  }
  const std::string path = fresh_dir("lines") + ".txt";
  std::ofstream(path) << text;
  const std::string read = kiln::read_text(path);
  ASSERT_EQ(read, text);
  const kiln::CharTokenizer tok(read);
  EXPECT_EQ(tok.decode(tok.encode(read)), read);
  std::set<char> distinct(read.begin(), read.end());
  EXPECT_EQ(tok.vocab_size(), static_cast<int64_t>(distinct.size()));
  EXPECT_TRUE(std::is_sorted(tok.alphabet().begin(), tok.alphabet().end()));
  try {
    tok.encode("ab#");
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("byte 35 at offset 2 is not in the vocabulary"), std::string::npos)
        << e.what();
  }

  for (int64_t max_length : {0, 7}) {
    SCOPED_TRACE("max_length " + std::to_string(max_length));
    const auto d = kiln::TextDataset::lines(read, tok, max_length);
    // The examples, line by line: inputs the line (with its newline but the last character), its
    // labels one character on; a line longer than max_length cut into pieces.
    size_t next = 0;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string with_newline = lines[i] + (i + 1 < lines.size() ? "\n" : "");
      const int64_t inputs = static_cast<int64_t>(with_newline.size()) - 1;
      for (int64_t at = 0; at<inputs; at += max_length> 0 ? max_length : inputs) {
        const int64_t length = max_length > 0 ? std::min(max_length, inputs - at) : inputs;
        ASSERT_LT(next, d.size()) << "line " << i;
        const kiln::Example e = d.get(next++);
        EXPECT_EQ(tok.decode(e.inputs[0]), with_newline.substr(static_cast<size_t>(at), static_cast<size_t>(length)))
            << "line " << i;
        EXPECT_EQ(tok.decode(e.target), with_newline.substr(static_cast<size_t>(at) + 1, static_cast<size_t>(length)))
            << "line " << i;
      }
    }
    EXPECT_EQ(next, d.size()) << "one example per non-empty line (or piece), no more";
  }
  fs::remove(path);
  try {
    kiln::read_text(path);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "kiln::read_text: cannot read " + path + ": No such file or directory");
  }
}

// ---- the keys -------------------------------------------------------------------------------------

TEST(TrainerConfig, GroupByLengthAndPadToMultipleOf) {
  const kiln::TrainingArguments d;
  EXPECT_FALSE(d.group_by_length);
  EXPECT_EQ(d.pad_to_multiple_of, 0);
  const auto a = kiln::TrainingArguments::from_toml_string("group_by_length = true\npad_to_multiple_of = 8\n");
  EXPECT_TRUE(a.group_by_length);
  EXPECT_EQ(a.pad_to_multiple_of, 8);
  try {
    kiln::TrainingArguments::from_toml_string("pad_to_multiple_of = -8\n", "train.toml");
    FAIL() << "expected an error";
  } catch (const kiln::ConfigError& e) {
    EXPECT_EQ(e.key(), "pad_to_multiple_of");
    EXPECT_NE(std::string(e.what()).find("train.toml:1:"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kiln::TrainingArguments::from_toml_string("group_by_length = 1\n"), kiln::ConfigError);
}

// ---- Trainer::train over variable-length batches --------------------------------------------------

namespace {

struct VariableRun {
  std::vector<std::map<std::string, std::string>> metrics;
  std::vector<at::Tensor> params;
  std::vector<int64_t> lengths_seen;
  kiln::StepStats stats;
};

// A language model (ga 1) or a classifier (ga 2, the accumulating step) trained on variable-length
// sequences with the padding collator, group_by_length and pad_to_multiple_of, evaluated every 3
// steps on variable-length data too; compiled or eagerly.
VariableRun train_variable(bool language_model, bool compile, uint64_t seed, const std::string& dir) {
  const auto train = make_sequences(40, 2, 21, 17, language_model, seed);
  const auto eval = make_sequences(10, 2, 21, 17, language_model, seed + 1);
  kiln::TrainingArguments args;
  args.torch_compile = compile;
  args.runtime.recompile_limit = 1000;  // every shape compiled (the point is the numbers)
  args.output_dir = dir;
  args.save_strategy = "no";
  args.per_device_train_batch_size = 4;
  args.gradient_accumulation_steps = language_model ? 1 : 2;
  args.max_steps = language_model ? 12 : 7;
  args.learning_rate = 1e-2;
  args.lr_scheduler_type = "linear";
  args.warmup_steps = 2;
  args.logging_steps = 1;
  args.eval_strategy = "steps";
  args.eval_steps = 3;
  args.per_device_eval_batch_size = 3;
  args.group_by_length = true;
  args.pad_to_multiple_of = 4;
  args.seed = static_cast<int64_t>(seed % 1000);
  args.log_level = "warn";
  torch::manual_seed(seed);
  VariableRun out;
  auto run = [&](auto m) {
    torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(1.0).weight_decay(0.01));
    kiln::Trainer trainer(m, opt, ce, args);
    trainer.set_data_collator(kiln::DataCollatorWithPadding(/*pad_token_id=*/1));  // takes args' multiple of 4
    // The evaluation's outputs and labels, batches of different lengths padded with -100 to one:
    // the accuracy over the real labels, and how many there are.
    trainer.set_compute_metrics([](const kiln::EvalPrediction& p) {
      const at::Tensor real = p.label_ids.ne(-100);
      const at::Tensor predicted = p.predictions.argmax(-1);
      return std::map<std::string, double>{
          {"accuracy", (predicted.eq(p.label_ids) & real).sum().item<double>() / real.sum().item<double>()},
          {"labels", real.sum().item<double>()},
          {"examples", static_cast<double>(p.predictions.size(0))}};
    });
    trainer.train(train, eval);
    out.stats = trainer.stats();
    for (const auto& p : m->parameters()) out.params.push_back(p.detach().clone());
    out.lengths_seen = m->lengths_seen;
  };
  if (language_model) run(std::make_shared<TinyLmImpl>(17, 12, 0.0));
  else run(std::make_shared<TinyClassifierImpl>(17, 12));
  out.metrics = read_metrics(dir);
  return out;
}

double number(const std::map<std::string, std::string>& line, const std::string& key) {
  return std::stod(line.at(key));
}

}  // namespace

// The same training compiled and eagerly: every logged loss, learning rate and evaluation loss
// within float tolerance, the final parameters too, while the batches' padded lengths vary (all
// multiples of 4, the longest batch first) and the compiled steps ran.
TEST(TrainerVariableLength, CompiledMatchesTheEagerRun) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (bool language_model : {true, false}) {
    SCOPED_TRACE(language_model ? "language model" : "classifier, gradient accumulation");
    const std::string dir = fresh_dir(language_model ? "lm" : "classifier");
    const auto eager = train_variable(language_model, false, seed, dir + "_eager");
    const auto compiled = train_variable(language_model, true, seed, dir + "_compiled");
    ASSERT_EQ(compiled.metrics.size(), eager.metrics.size());
    int64_t losses = 0, evals = 0;
    for (size_t i = 0; i < eager.metrics.size(); ++i) {
      const auto &e = eager.metrics[i], &c = compiled.metrics[i];
      EXPECT_EQ(c.at("step"), e.at("step")) << "line " << i + 1;
      for (const char* k : {"loss", "eval_loss", "learning_rate"}) {
        if (!e.count(k)) continue;
        ASSERT_TRUE(c.count(k)) << k << ", line " << i + 1;
        EXPECT_NEAR(number(c, k), number(e, k), 2e-4 * std::max(1.0, std::abs(number(e, k))))
            << k << ", line " << i + 1;
        losses += std::string(k) == "loss";
        evals += std::string(k) == "eval_loss";
      }
    }
    EXPECT_EQ(losses, language_model ? 12 : 7);
    EXPECT_GE(evals, 2);
    // The metrics function saw every evaluation example and exactly its real labels.
    const auto eval = make_sequences(10, 2, 21, 17, language_model, seed + 1);
    int64_t labels = 0;
    for (const auto& t : eval.targets) labels += t.numel();
    for (const auto& line : compiled.metrics)
      if (line.count("eval_loss")) {
        EXPECT_EQ(number(line, "eval_examples"), 10);
        EXPECT_EQ(number(line, "eval_labels"), static_cast<double>(labels));
        EXPECT_GE(number(line, "eval_accuracy"), 0);
        EXPECT_LE(number(line, "eval_accuracy"), 1);
      }
    ASSERT_EQ(compiled.params.size(), eager.params.size());
    for (size_t i = 0; i < eager.params.size(); ++i)
      EXPECT_TRUE(at::allclose(compiled.params[i], eager.params[i], 2e-4, 2e-5))
          << "parameter " << i << " differs by " << (compiled.params[i] - eager.params[i]).abs().max().item<double>();
    // The eager run's forward saw every batch (training and evaluation): lengths that vary, each a
    // multiple of 4.
    const std::set<int64_t> lengths(eager.lengths_seen.begin(), eager.lengths_seen.end());
    EXPECT_GE(lengths.size(), 3u) << "variable batch lengths";
    for (int64_t l : lengths) EXPECT_EQ(l % 4, 0) << "pad_to_multiple_of 4 from the arguments";
    EXPECT_GT(compiled.stats.compiled_steps, 0) << "the compiled step ran: " << compiled.stats.last_fallback;
    EXPECT_EQ(eager.stats.compiled_steps, 0);
    std::printf("[ %s ] %zu batch lengths; compiled steps %d, compiles %d, eager steps %d\n",
                language_model ? "lm" : "classifier", lengths.size(), compiled.stats.compiled_steps,
                compiled.stats.compiles, compiled.stats.eager_steps);
    fs::remove_all(dir + "_eager");
    fs::remove_all(dir + "_compiled");
  }
}

// A training on variable-length batches that crashes after a checkpoint and is resumed by a fresh
// model, optimizer and Trainer ends bit for bit where the uninterrupted one ends: the parameters,
// every logged loss and evaluation loss. The resumed run compiles the batch shapes the stopped run
// had compiled, on the examples that first had them, so the steps after it run compiled (or not)
// exactly where the uninterrupted run's did; the second epoch's length-grouped order comes from
// the checkpoint's data-order generator.
TEST(TrainerVariableLength, ResumeMatchesTheUninterruptedRun) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto train = make_sequences(32, 2, 30, 19, true, seed);  // 8 steps an epoch, megabatches of 8
  const auto eval = make_sequences(7, 2, 30, 19, true, seed + 1);
  auto args_for = [&](const std::string& dir) {
    kiln::TrainingArguments a;
    a.torch_compile = true;
    a.runtime.recompile_limit = 1000;
    a.output_dir = dir;
    a.max_steps = 12;
    a.per_device_train_batch_size = 4;
    a.learning_rate = 2e-2;
    a.lr_scheduler_type = "cosine";
    a.warmup_steps = 2;
    a.logging_steps = 1;
    a.save_steps = 4;  // checkpoint-4 (mid-epoch), checkpoint-8, checkpoint-12
    a.eval_strategy = "steps";
    a.eval_steps = 2;
    a.group_by_length = true;
    a.seed = static_cast<int64_t>(seed % 1000);
    a.log_level = "warn";
    return a;
  };
  // The dataset fails ("the machine went down") once it has made `limit` examples.
  struct Crashing : kiln::Dataset {
    Crashing(const kiln::Dataset& inner, int64_t limit) : inner(inner), limit(limit) {}
    const kiln::Dataset& inner;
    int64_t limit;
    mutable int64_t calls = 0;
    size_t size() const override { return inner.size(); }
    kiln::Example get(size_t i) const override {
      if (++calls > limit) throw std::runtime_error("simulated crash");
      return inner.get(i);
    }
    int64_t length(size_t i) const override { return inner.length(i); }
  };
  auto make_model = [] { return std::make_shared<TinyLmImpl>(19, 10, 0.2); };  // dropout: the CPU generator matters
  // The padding collator, noting the padded length of every batch it makes.
  std::vector<int64_t> padded;
  const kiln::DataCollator collator = [&padded](const std::vector<kiln::Example>& examples) {
    kiln::Batch b = kiln::DataCollatorWithPadding(/*pad_token_id=*/0, /*pad_to_multiple_of=*/4)(examples);
    padded.push_back(b.inputs[0].size(1));
    return b;
  };

  torch::manual_seed(seed);
  auto ref = make_model();
  torch::optim::AdamW ref_opt(ref->parameters(), torch::optim::AdamWOptions(1.0).weight_decay(0.1));
  const std::string ref_dir = fresh_dir("resume_ref");
  kiln::Trainer ref_trainer(ref, ref_opt, ce, args_for(ref_dir));
  ref_trainer.set_data_collator(collator);
  const auto ref_out = ref_trainer.train(train, eval);
  ASSERT_EQ(ref_out.global_step, 12);
  EXPECT_GT(ref_trainer.stats().compiled_steps, 0) << ref_trainer.stats().last_fallback;
  EXPECT_GE(std::set<int64_t>(padded.begin(), padded.end()).size(), 3u) << "batches of different lengths";

  const std::string dir = fresh_dir("resume");
  {
    torch::manual_seed(seed);
    auto crashed = make_model();
    torch::optim::AdamW opt(crashed->parameters(), torch::optim::AdamWOptions(1.0).weight_decay(0.1));
    kiln::Trainer trainer(crashed, opt, ce, args_for(dir));
    trainer.set_data_collator(collator);
    Crashing crashing(train, 1 + 4 * 5 + 2);  // the layout probe, five steps, part of the sixth
    EXPECT_THROW(trainer.train(crashing, eval), std::runtime_error);
  }
  ASSERT_EQ(fs::path(kiln::Trainer::last_checkpoint(dir)).filename(), "checkpoint-4");

  auto resumed = make_model();  // other initial parameters: everything must come from the checkpoint
  torch::optim::AdamW opt(resumed->parameters(), torch::optim::AdamWOptions(1.0).weight_decay(0.1));
  auto args = args_for(dir);
  args.resume_from_checkpoint = "last";
  kiln::Trainer trainer(resumed, opt, ce, args);
  trainer.set_data_collator(collator);
  const auto out = trainer.train(train, eval);
  EXPECT_EQ(out.global_step, 12);
  EXPECT_EQ(out.training_loss, ref_out.training_loss);
  auto pa = ref->named_parameters(), pb = resumed->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(at::equal(pa[i].value(), pb[i].value()))
        << pa[i].key() << " differs by " << (pa[i].value() - pb[i].value()).abs().max().item<double>();
  const auto want = read_metrics(ref_dir), got = read_metrics(dir);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    for (const char* k : {"step", "epoch", "loss", "learning_rate", "eval_loss", "train_loss"}) {
      EXPECT_EQ(got[i].count(k), want[i].count(k)) << k << ", metrics line " << i + 1;
      if (want[i].count(k) && got[i].count(k)) {
        EXPECT_EQ(got[i].at(k), want[i].at(k)) << k << ", metrics line " << i + 1;
      }
    }
  EXPECT_GT(trainer.stats().compiled_steps, 0) << "the steps after the resume ran compiled";
  fs::remove_all(ref_dir);
  fs::remove_all(dir);
}
