// What Trainer::train reads and how it makes micro-batches of it, the way Hugging Face's datasets
// and data collators do.
//
// Examples of one shape are stacked (default_data_collator):
//   kiln::TensorDataset data({xs}, ys);           // example i is ({xs[i]}, ys[i])
//
// Examples of variable length (token sequences) are padded per batch (DataCollatorWithPadding):
//   kiln::CharTokenizer tokenizer(text);          // one token per distinct byte of the text
//   auto data = kiln::TextDataset::windows(tokenizer.encode(text), 16, 64);  // 16 to 64 tokens
//   trainer.set_data_collator(kiln::DataCollatorWithPadding(/*pad_token_id=*/0));
//   // micro-batches {input_ids [B, T], attention_mask [B, T]} and labels [B, T], -100 at padding,
//   // T the batch's longest example (rounded up to args.pad_to_multiple_of)
//   args.group_by_length = true;                  // batches of examples of similar length
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

namespace kiln {

// One example of a dataset: the tensors forward takes, and the target the loss reads.
struct Example {
  std::vector<at::Tensor> inputs;
  at::Tensor target;
};

// What Trainer::train reads: examples by index. A collator (set_data_collator) makes micro-batches
// of them; without one, train() stacks per_device_train_batch_size of them along a new dim 0, so
// every example must have the same number of inputs and the same shapes.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual size_t size() const = 0;
  virtual Example get(size_t index) const = 0;
  // The example's length, which group_by_length groups by (Hugging Face's "length" column): by
  // default its first input's size along dim 0 (1 for a 0-dim tensor), read through get(). A
  // dataset that knows its lengths without making examples can say so here.
  virtual int64_t length(size_t index) const;
};

// Examples along dim 0 of tensors: example i is ({inputs[0][i], ...}, target[i]).
class TensorDataset : public Dataset {
 public:
  TensorDataset(std::vector<at::Tensor> inputs, at::Tensor target);
  size_t size() const override;
  Example get(size_t index) const override;

 private:
  std::vector<at::Tensor> inputs_;
  at::Tensor target_;
};

// A micro-batch as the Trainer's step takes it: forward(inputs...), then loss_fn(output, target).
struct Batch {
  std::vector<at::Tensor> inputs;
  at::Tensor target;
};

// Examples into one micro-batch (Hugging Face's data_collator), for Trainer::set_data_collator.
using DataCollator = std::function<Batch(const std::vector<Example>& examples)>;

// Hugging Face's default_data_collator: every input and the target stacked along a new dim 0. The
// examples must agree in their number of inputs and in every shape; when they do not, the
// std::invalid_argument names the first that differs and points at DataCollatorWithPadding.
Batch default_data_collator(const std::vector<Example>& examples);

// Hugging Face's DataCollatorWithPadding, with the labels DataCollatorForSeq2Seq makes: a batch of
// variable-length sequences padded on the right to the longest of the batch.
//   inputs[0]   the token sequence (length along dim 0, int64 ids): padded with pad_token_id;
//   the mask    with return_attention_mask, one more input after the example's: int64 [B, T], 1 at
//               real tokens and 0 at padding;
//   the target  with dims (a language model's labels): padded along dim 0 to the batch's longest
//               target with label_pad_token_id, -100, which cross_entropy ignores (its default
//               ignore_index); a 0-dim target (a classifier's label) is stacked;
//   other inputs stacked, as default_data_collator does.
// With pad_to_multiple_of > 0 the padded lengths are rounded up to a multiple of it (fewer
// distinct shapes, hence fewer compiles; Tensor Cores like multiples of 8). Given to a Trainer
// (set_data_collator) with pad_to_multiple_of 0, it takes the Trainer's args.pad_to_multiple_of.
struct DataCollatorWithPadding {
  explicit DataCollatorWithPadding(int64_t pad_token_id = 0, int64_t pad_to_multiple_of = 0)
      : pad_token_id(pad_token_id), pad_to_multiple_of(pad_to_multiple_of) {}
  int64_t pad_token_id = 0;
  int64_t pad_to_multiple_of = 0;
  int64_t label_pad_token_id = -100;
  bool return_attention_mask = true;
  Batch operator()(const std::vector<Example>& examples) const;
};

// Hugging Face's get_length_grouped_indices (what LengthGroupedSampler, group_by_length, yields):
// the indices 0..lengths.size()-1 in a random order (randperm with `generator`) cut into
// megabatches of min(n / (4 * batch_size), 50) batches (at least one), each megabatch sorted by
// length, longest first, and the longest example of all moved to the very front, so that the first
// batch is the longest (an out-of-memory error comes at once, not hours in). Consecutive batches of
// batch_size hold examples of similar length, so they need little padding. Every index appears
// once; the same generator state gives the same order.
std::vector<int64_t> length_grouped_indices(const std::vector<int64_t>& lengths, int64_t batch_size,
                                            at::Generator generator);

// A character-level vocabulary: one token per distinct byte of a text, in byte order (token 0 is
// the smallest byte the text has).
class CharTokenizer {
 public:
  explicit CharTokenizer(const std::string& text);
  int64_t vocab_size() const { return static_cast<int64_t>(alphabet_.size()); }
  // The bytes the tokens stand for: token i is alphabet()[i].
  const std::string& alphabet() const { return alphabet_; }
  // The text as token ids (int64, 1-D, on the CPU); a byte outside the vocabulary is an
  // std::invalid_argument naming it and its offset.
  at::Tensor encode(const std::string& text) const;
  std::string decode(const at::Tensor& ids) const;

 private:
  std::string alphabet_;
  std::vector<int64_t> index_of_;  // by byte; -1 when not in the vocabulary
};

// A file, or every regular file of a folder in name order (links skipped) with a blank line
// between them. Throws std::runtime_error naming the path when there is nothing to read.
std::string read_text(const std::string& path);

// A causal language model's variable-length examples, spans of one token sequence: example i is
// ({tokens[s, s + L)}, tokens[s + 1, s + L + 1)), each input token's label the token after it.
// Make micro-batches of it with DataCollatorWithPadding.
class TextDataset : public Dataset {
 public:
  // Windows of `tokens` (int64, 1-D, any device): window i starts `stride` tokens after window i-1
  // (0: where window i-1 ends) and holds L tokens, L drawn uniformly from [min_length, max_length]
  // by window i's index and `seed` alone, so the same arguments always give the same windows. The
  // last window is shortened to fit (never below min_length).
  static TextDataset windows(at::Tensor tokens, int64_t min_length, int64_t max_length, int64_t stride = 0,
                             uint64_t seed = 0);
  // One example per line of `text` (its newline is the last label, so the model learns where lines
  // end); empty lines are skipped, and a line longer than max_length tokens (> 0) is cut into
  // examples of at most max_length.
  static TextDataset lines(const std::string& text, const CharTokenizer& tokenizer, int64_t max_length = 0);

  size_t size() const override { return spans_.size(); }
  Example get(size_t index) const override;
  int64_t length(size_t index) const override;
  // The token sequence and each example's (start, length) in it.
  const at::Tensor& tokens() const { return tokens_; }
  const std::vector<std::pair<int64_t, int64_t>>& spans() const { return spans_; }

 private:
  TextDataset(at::Tensor tokens, std::vector<std::pair<int64_t, int64_t>> spans);
  at::Tensor tokens_;
  std::vector<std::pair<int64_t, int64_t>> spans_;
};

}  // namespace kiln
