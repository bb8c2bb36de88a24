// What a fragment of the user guide (docs/guide.md, docs/es/guide.md, docs/pt/guide.md) may use
// without declaring it. tests/docs/guide_code.py compiles every ```cpp block of the guides that does
// not start with #include as the body of a function of its own, after this header, in a scope of
// its own (so a fragment may declare one of these names again). The names are those of the guide's
// quick start program:
//
//   model       a Net: a TORCH_MODULE whose forward takes one tensor
//   optimizer   the model's torch::optim::AdamW
//   loss_fn     a kiln::LossFn (mean squared error in the quick start)
//   args        a kiln::TrainingArguments
//   x, y        one batch and its target
//   data        a kiln::TensorDataset of examples, and eval_data another for evaluation
//
// A block that starts with #include is a whole program and is compiled on its own, without this
// header.
#pragma once

#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <kiln/kiln.h>

// The quick start's model.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

// The parameters of every fragment's function: the names above. (clang-format takes the & in a
// macro for a binary operator.)
// clang-format off
#define KILN_GUIDE_GIVEN_NAMES                                                                     \
  Net& model, torch::optim::AdamW& optimizer, kiln::LossFn loss_fn, kiln::TrainingArguments args, \
  torch::Tensor x, torch::Tensor y, const kiln::TensorDataset& data, const kiln::TensorDataset& eval_data
// clang-format on
