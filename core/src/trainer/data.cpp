#include "kiln/data.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>

namespace kiln {
namespace {

std::string shape_text(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

// What a batch's tensor slot is called in messages: "input 0", "the target".
std::string slot_name(size_t slot, size_t inputs) {
  return slot < inputs ? "input " + std::to_string(slot) : std::string("the target");
}

int64_t round_up(int64_t n, int64_t multiple) { return multiple > 0 ? (n + multiple - 1) / multiple * multiple : n; }

// Tensors of one slot of every example, padded on the right along dim 0 to their longest (rounded
// up to `multiple`) with `value`, stacked into one [B, T, ...] tensor; every other dim must agree.
// Adds each one's length to `lengths` when given.
at::Tensor pad_and_stack(const std::vector<at::Tensor>& ts, int64_t multiple, int64_t value, const std::string& what,
                         std::vector<int64_t>* lengths) {
  int64_t longest = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const at::Tensor& t = ts[i];
    if (t.dim() == 0)
      throw std::invalid_argument("kiln::DataCollatorWithPadding: " + what + " of example " + std::to_string(i) +
                                  " of the batch is 0-dim; it pads sequences, the length along dim 0");
    if (t.sizes().slice(1) != ts[0].sizes().slice(1) || t.scalar_type() != ts[0].scalar_type())
      throw std::invalid_argument("kiln::DataCollatorWithPadding: " + what + " of example " + std::to_string(i) +
                                  " of the batch is " + std::string(c10::toString(t.scalar_type())) + " " +
                                  shape_text(t.sizes()) + ", example 0's " + c10::toString(ts[0].scalar_type()) + " " +
                                  shape_text(ts[0].sizes()) + ": only the length (dim 0) may differ");
    longest = std::max(longest, t.size(0));
    if (lengths) lengths->push_back(t.size(0));
  }
  std::vector<int64_t> shape = ts[0].sizes().vec();
  shape[0] = round_up(longest, multiple);
  shape.insert(shape.begin(), static_cast<int64_t>(ts.size()));
  at::Tensor out = at::full(shape, value, ts[0].options());
  for (size_t i = 0; i < ts.size(); ++i) out[static_cast<int64_t>(i)].narrow(0, 0, ts[i].size(0)).copy_(ts[i]);
  return out;
}

// Stacks one slot of every example, or says which example differs and what to do about it.
at::Tensor stack_slot(const std::vector<at::Tensor>& ts, const std::string& what, const char* who, bool suggest) {
  for (size_t i = 1; i < ts.size(); ++i)
    if (ts[i].sizes() != ts[0].sizes())
      throw std::invalid_argument(std::string(who) + ": " + what + " of example " + std::to_string(i) +
                                  " of the batch has shape " + shape_text(ts[i].sizes()) + ", example 0's " +
                                  shape_text(ts[0].sizes()) + "; stacking needs one shape" +
                                  (suggest ? std::string(" (for sequences of different lengths, give the Trainer a "
                                                         "padding collator: "
                                                         "trainer.set_data_collator(kiln::DataCollatorWithPadding("
                                                         "pad_token_id)))")
                                           : std::string()));
  return at::stack(ts);
}

void check_examples(const std::vector<Example>& examples, const char* who) {
  if (examples.empty()) throw std::invalid_argument(std::string(who) + ": no examples to make a batch of");
  for (size_t i = 0; i < examples.size(); ++i) {
    if (examples[i].inputs.size() != examples[0].inputs.size())
      throw std::invalid_argument(std::string(who) + ": example " + std::to_string(i) + " of the batch has " +
                                  std::to_string(examples[i].inputs.size()) + " inputs, example 0 has " +
                                  std::to_string(examples[0].inputs.size()));
    if (!examples[i].target.defined())
      throw std::invalid_argument(std::string(who) + ": example " + std::to_string(i) + " of the batch has no target");
  }
}

// splitmix64: a well-mixed 64-bit hash, the same on every platform (the standard library's
// distributions are not), so a window's length depends on the seed and its index alone.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("kiln::read_text: cannot read " + path + ": " + std::strerror(errno));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

int64_t Dataset::length(size_t index) const {
  const Example e = get(index);
  if (e.inputs.empty() || !e.inputs[0].defined()) return 0;
  return e.inputs[0].dim() == 0 ? 1 : e.inputs[0].size(0);
}

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

Batch default_data_collator(const std::vector<Example>& examples) {
  const char* who = "kiln::default_data_collator";
  check_examples(examples, who);
  const size_t inputs = examples[0].inputs.size();
  Batch b;
  std::vector<at::Tensor> slot;
  for (size_t s = 0; s <= inputs; ++s) {
    slot.clear();
    for (const auto& e : examples) slot.push_back(s < inputs ? e.inputs[s] : e.target);
    at::Tensor stacked = stack_slot(slot, slot_name(s, inputs), who, true);
    if (s < inputs) b.inputs.push_back(std::move(stacked));
    else b.target = std::move(stacked);
  }
  return b;
}

Batch DataCollatorWithPadding::operator()(const std::vector<Example>& examples) const {
  const char* who = "kiln::DataCollatorWithPadding";
  check_examples(examples, who);
  const size_t inputs = examples[0].inputs.size();
  if (inputs == 0) throw std::invalid_argument(std::string(who) + ": the examples have no inputs to pad");
  if (pad_to_multiple_of < 0)
    throw std::invalid_argument(std::string(who) + ": pad_to_multiple_of is " + std::to_string(pad_to_multiple_of) +
                                "; it must be 0 (none) or more");
  Batch b;
  std::vector<at::Tensor> slot;
  std::vector<int64_t> lengths;
  for (size_t s = 0; s <= inputs; ++s) {
    slot.clear();
    for (const auto& e : examples) slot.push_back(s < inputs ? e.inputs[s] : e.target);
    const std::string what = slot_name(s, inputs);
    if (s == 0) b.inputs.push_back(pad_and_stack(slot, pad_to_multiple_of, pad_token_id, what, &lengths));
    else if (s < inputs) b.inputs.push_back(stack_slot(slot, what, who, false));
    else if (slot[0].dim() == 0) b.target = stack_slot(slot, what, who, false);
    else b.target = pad_and_stack(slot, pad_to_multiple_of, label_pad_token_id, what, nullptr);
  }
  if (return_attention_mask) {
    // mask[i, t] = t < length_i, made on the CPU and moved once.
    const at::Tensor& ids = b.inputs[0];
    const at::Tensor positions = at::arange(ids.size(1), at::TensorOptions().dtype(at::kLong));
    const at::Tensor length = at::tensor(lengths, at::TensorOptions().dtype(at::kLong)).unsqueeze(1);
    b.inputs.push_back(positions.unsqueeze(0).lt(length).to(ids.device(), at::kLong));
  }
  return b;
}

std::vector<int64_t> length_grouped_indices(const std::vector<int64_t>& lengths, int64_t batch_size,
                                            at::Generator generator) {
  if (batch_size < 1)
    throw std::invalid_argument("kiln::length_grouped_indices: batch_size is " + std::to_string(batch_size) +
                                "; it must be 1 or more");
  const auto n = static_cast<int64_t>(lengths.size());
  const at::Tensor perm = at::randperm(n, generator, at::TensorOptions().dtype(at::kLong));
  std::vector<int64_t> order(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + n);
  if (n == 0) return order;
  // transformers.trainer_pt_utils.get_length_grouped_indices, step by step.
  const int64_t mult = std::max<int64_t>(1, std::min<int64_t>(n / (batch_size * 4), 50));
  const int64_t mega = mult * batch_size;
  auto longer = [&](int64_t a, int64_t b) { return lengths[static_cast<size_t>(a)] > lengths[static_cast<size_t>(b)]; };
  int64_t best = 0;  // the megabatch whose first (longest) example is the longest of all
  for (int64_t start = 0; start < n; start += mega) {
    const auto first = order.begin() + start, last = order.begin() + std::min(n, start + mega);
    std::stable_sort(first, last, longer);  // Python's sorted(reverse=True) keeps ties in order too
    if (longer(*first, order[static_cast<size_t>(best)])) best = start;
  }
  std::swap(order[0], order[static_cast<size_t>(best)]);
  return order;
}

CharTokenizer::CharTokenizer(const std::string& text) : index_of_(256, -1) {
  std::vector<bool> seen(256, false);
  for (unsigned char c : text) seen[c] = true;
  for (int c = 0; c < 256; ++c)
    if (seen[static_cast<size_t>(c)]) {
      index_of_[static_cast<size_t>(c)] = static_cast<int64_t>(alphabet_.size());
      alphabet_.push_back(static_cast<char>(c));
    }
  if (alphabet_.empty()) throw std::invalid_argument("kiln::CharTokenizer: the text is empty, so is the vocabulary");
}

at::Tensor CharTokenizer::encode(const std::string& text) const {
  at::Tensor ids = at::empty({static_cast<int64_t>(text.size())}, at::TensorOptions().dtype(at::kLong));
  int64_t* out = ids.data_ptr<int64_t>();
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const int64_t id = index_of_[c];
    if (id < 0)
      throw std::invalid_argument("kiln::CharTokenizer::encode: byte " + std::to_string(c) + " at offset " +
                                  std::to_string(i) + " is not in the vocabulary of " +
                                  std::to_string(alphabet_.size()) + " characters");
    out[i] = id;
  }
  return ids;
}

std::string CharTokenizer::decode(const at::Tensor& ids) const {
  const at::Tensor flat = ids.to(at::kCPU, at::kLong).contiguous().view({-1});
  const int64_t* p = flat.data_ptr<int64_t>();
  std::string out;
  out.reserve(static_cast<size_t>(flat.numel()));
  for (int64_t i = 0; i < flat.numel(); ++i) {
    if (p[i] < 0 || p[i] >= vocab_size())
      throw std::invalid_argument("kiln::CharTokenizer::decode: token " + std::to_string(p[i]) +
                                  " is outside the vocabulary of " + std::to_string(vocab_size()));
    out.push_back(alphabet_[static_cast<size_t>(p[i])]);
  }
  return out;
}

std::string read_text(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return read_file(path);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(path, ec))
    if (!e.is_symlink() && e.is_regular_file()) files.push_back(e.path());
  if (files.empty()) throw std::runtime_error("kiln::read_text: cannot read " + path + ": a folder without files");
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& f : files) text += (text.empty() ? "" : "\n\n") + read_file(f.string());
  return text;
}

TextDataset::TextDataset(at::Tensor tokens, std::vector<std::pair<int64_t, int64_t>> spans)
    : tokens_(std::move(tokens)), spans_(std::move(spans)) {}

TextDataset TextDataset::windows(at::Tensor tokens, int64_t min_length, int64_t max_length, int64_t stride,
                                 uint64_t seed) {
  const char* who = "kiln::TextDataset::windows";
  if (!tokens.defined() || tokens.dim() != 1)
    throw std::invalid_argument(std::string(who) + ": the tokens must be a 1-D tensor");
  if (min_length < 1 || max_length < min_length)
    throw std::invalid_argument(std::string(who) + ": min_length " + std::to_string(min_length) + " and max_length " +
                                std::to_string(max_length) + " must satisfy 1 <= min_length <= max_length");
  if (stride < 0) throw std::invalid_argument(std::string(who) + ": stride " + std::to_string(stride) + " is negative");
  const int64_t n = tokens.size(0);
  std::vector<std::pair<int64_t, int64_t>> spans;
  const auto range = static_cast<uint64_t>(max_length - min_length + 1);
  for (int64_t start = 0; start + min_length + 1 <= n;) {
    const uint64_t draw = mix(seed ^ mix(static_cast<uint64_t>(spans.size())));
    const int64_t length = std::min(min_length + static_cast<int64_t>(draw % range), n - 1 - start);
    spans.emplace_back(start, length);
    start += stride > 0 ? stride : length;
  }
  if (spans.empty())
    throw std::invalid_argument(std::string(who) + ": " + std::to_string(n) + " tokens hold no window of " +
                                std::to_string(min_length) + " tokens and its next token");
  return TextDataset(std::move(tokens), std::move(spans));
}

TextDataset TextDataset::lines(const std::string& text, const CharTokenizer& tokenizer, int64_t max_length) {
  if (max_length < 0)
    throw std::invalid_argument("kiln::TextDataset::lines: max_length " + std::to_string(max_length) +
                                " is negative (0: no limit)");
  at::Tensor tokens = tokenizer.encode(text);
  std::vector<std::pair<int64_t, int64_t>> spans;
  const auto n = static_cast<int64_t>(text.size());
  for (int64_t begin = 0; begin < n;) {
    const size_t nl = text.find('\n', static_cast<size_t>(begin));
    // The line's tokens with its newline; the example's inputs are all but the last.
    const int64_t end = nl == std::string::npos ? n : static_cast<int64_t>(nl) + 1;
    for (int64_t at = begin; at + 1 < end;) {
      const int64_t length = max_length > 0 ? std::min(max_length, end - 1 - at) : end - 1 - at;
      spans.emplace_back(at, length);
      at += length;
    }
    begin = end;
  }
  if (spans.empty()) throw std::invalid_argument("kiln::TextDataset::lines: the text has no line of two characters");
  return TextDataset(std::move(tokens), std::move(spans));
}

Example TextDataset::get(size_t index) const {
  const auto& [start, length] = spans_.at(index);
  return {{tokens_.slice(0, start, start + length)}, tokens_.slice(0, start + 1, start + length + 1)};
}

int64_t TextDataset::length(size_t index) const { return spans_.at(index).second; }

}  // namespace kiln
