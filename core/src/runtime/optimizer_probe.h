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
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include "kiln/internal/capture.h"
#include "kiln/ir.h"
#include "step_capture.h"

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

// Run-time scalars of a captured step: (raw node, argument) -> run-time scalar index
// (ir::Arg::scalar_input once planned).
using ScalarSlots = std::map<std::pair<int32_t, int32_t>, int32_t>;

// The probe of one captured step: what it found (the optimizers' call sites, the run-time scalar
// slots) and the placeholder gradients it lends.
struct ProbeState {
  OptimizerSites sites;
  bool sites_found = false;
  ScalarSlots slots;
  std::vector<at::Tensor> placeholders;  // per CapturedStep::grad_params entry, made once
  std::vector<at::Tensor> placed;        // parameters given a placeholder by the current probe
};

// Replays the optimizers' step() on the host, with no kernels, before each compiled step (see the
// top of this file), and right after a capture (look_ahead), so that the scalars the next step
// passes differently (Adam's bias corrections) are run-time scalars of the first plan already.
class StepProbe {
 public:
  using Warn = std::function<void(const std::string&)>;
  StepProbe(std::vector<torch::optim::Optimizer*> optimizers, Warn warn_once);

  // Right after a capture: finds the optimizers' calls and the scalars that change from step to
  // step. The optimizers' host state and the parameters' gradients are put back afterwards. When
  // the calls cannot be matched here, the first compiled step's probe tries again and says why.
  void look_ahead(const CapturedStep& cs, ProbeState& ps) const;

  // Before a compiled step: replays every optimizer's step(), checks that each made the calls the
  // graph holds on the same tensors, and writes the current value of every run-time scalar into
  // `scalars` (one per slot). A scalar that differs from the capture's for the first time gets a
  // new slot and sets *new_slots: the plan must be made again. Returns "" or why the calls no
  // longer match (naming the optimizer). The optimizers' host state has advanced either way: the
  // caller restores it from an OptimizerSnapshot, and calls undo_placeholders, when the step does
  // not run.
  std::string probe(const CapturedStep& cs, ProbeState& ps, std::vector<c10::IValue>& scalars, bool* new_slots) const;

  // Takes back the placeholder gradients lent by the last probe (an eager step must not
  // accumulate into them).
  static void undo_placeholders(ProbeState& ps);

 private:
  void lend_placeholders(const CapturedStep& cs, ProbeState& ps) const;
  std::vector<std::vector<ProbeCall>> replay() const;
  void warn_unlisted_updates(const CapturedStep& cs, const ProbeState& ps) const;

  std::vector<torch::optim::Optimizer*> optimizers_;
  std::vector<std::string> names_;
  Warn warn_once_;
};

}  // namespace kiln
