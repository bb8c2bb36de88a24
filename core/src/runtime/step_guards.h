// What a compiled step can see besides its inputs, and the guards that tell whether a plan still
// fits: the modules' parameters (unique, named), every module, the modules' structure (every
// module, parameter and buffer by address, every module's printed options), and the input
// signature (sizes, dtypes, devices, requires_grad of inputs and parameters; train()/eval(); grad
// mode; autocast). Internal to the runtime.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "kiln/compile.h"

namespace kiln {

class StepGuards {
 public:
  explicit StepGuards(const StepState& state);

  // Reads the parameters, modules and structure again (after they changed).
  void collect();
  // Whether a parameter, buffer or submodule was replaced, added or removed, or a module's options
  // changed (a dropout probability, a batch norm momentum: the forward reads them on the host, so
  // a capture bakes them) since collect().
  bool structure_changed() const;
  // The plan cache's key. with_sizes = false: ranks only (the key of captures that failed, so
  // that a new shape with the same cause does not pay another failing capture).
  std::vector<int64_t> signature(const std::vector<at::Tensor>& inputs, bool with_sizes = true) const;

  // Unique parameters, named "<module path>" ("module<k>.<path>" with several modules), in the
  // order gradients are numbered (ir::OutputRole::Gradient's target).
  const std::vector<std::pair<std::string, at::Tensor>>& params() const { return params_; }

 private:
  struct Structure {
    std::vector<const void*> addresses;
    std::string options;
    bool operator==(const Structure& o) const { return addresses == o.addresses && options == o.options; }
  };
  Structure structure_now() const;

  const StepState& state_;
  std::vector<std::shared_ptr<torch::nn::Module>> modules_;
  std::vector<std::pair<std::string, at::Tensor>> params_;
  Structure structure_;
};

}  // namespace kiln
