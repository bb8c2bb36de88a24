// The optimizers' host side in a compiled step: their C++ state (Adam's step count, the state
// tensors by handle) saved before a step so that a failed attempt leaves nothing behind, and their
// step() calls found in the captured graph, one optimizer at a time, checked again every step.
//
// A compiled step never runs the user's step function, so every optimizer's step() is replayed on
// the host with no kernels (probe_calls) before the graph runs: that advances its own counters and
// tells the scalars it passes this step. The calls each optimizer makes must be the ones the
// captured graph holds, on the same tensors (a parameter, its state): when the user replaced the
// optimizer's state (torch::load), its parameters or its hyper-parameters in a way that changes
// the calls, the check fails and the step is captured again.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include "kiln/capture.h"
#include "kiln/ir.h"

namespace kiln {

// "optimizer 1 (torch::optim::Adam)".
std::string optimizer_name(const torch::optim::Optimizer& opt, size_t index);

// The per-parameter state objects of some optimizers, copied (tensors by handle, counters by
// value). restore() puts them back exactly: entries the attempt added are removed, counters it
// advanced are reset, and every state tensor is the same tensor as before.
class OptimizerSnapshot {
 public:
  OptimizerSnapshot() = default;
  explicit OptimizerSnapshot(const std::vector<torch::optim::Optimizer*>& optimizers);
  void restore() const;
  bool empty() const { return saved_.empty(); }

 private:
  struct Saved {
    torch::optim::Optimizer* opt;
    std::vector<std::pair<void*, std::unique_ptr<torch::optim::OptimizerParamState>>> state;
  };
  std::vector<Saved> saved_;
};

// How many per-parameter state entries the optimizers hold (an entry is made lazily, the first
// time step() sees a parameter with a gradient).
size_t optimizer_state_entries(const std::vector<torch::optim::Optimizer*>& optimizers);

// One call of an optimizer's step() in the captured graph: the raw node, and for the arguments
// that are a parameter, a buffer or optimizer state, the tensor the argument must be.
struct OptimizerCallSite {
  int32_t node = -1;
  std::vector<std::pair<int32_t, at::Tensor>> same_tensor;
};

// Every optimizer's call sites, in call order, optimizer by optimizer.
using OptimizerSites = std::vector<std::vector<OptimizerCallSite>>;

// Finds each optimizer's calls (calls[o], from probe_calls of its step() alone) as a run of
// consecutive recorded nodes outside the backward, on the same tensors, not shared with another
// optimizer. `storage_tensor` maps a raw graph storage id to the parameter, buffer or optimizer
// state tensor bound to it. Returns "" or why not, naming the optimizer.
std::string match_optimizer_calls(const ir::Graph& raw, const std::unordered_map<int32_t, at::Tensor>& storage_tensor,
                                  const std::vector<std::vector<ProbeCall>>& calls,
                                  const std::vector<std::string>& names, OptimizerSites& out);

// This step's calls against the sites found at the first compiled step: the same ops in the same
// order on the same tensors. Returns "" or why not, naming the optimizer and the call.
std::string check_optimizer_calls(const ir::Graph& raw, const OptimizerSites& sites,
                                  const std::vector<std::vector<ProbeCall>>& calls,
                                  const std::vector<std::string>& names);

}  // namespace kiln
