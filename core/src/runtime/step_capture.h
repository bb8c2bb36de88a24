// The capture stage: runs the user's step once for real under kiln's recorder and returns what the
// plan is made from: the raw graph (views and in-place ops, as recorded), how each of its inputs
// is bound (a user input, or a tensor the step reads in place: parameter, gradient, buffer,
// optimizer state, constant), and which outputs are results and which are gradients. Internal to
// the runtime.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kiln/compile.h"
#include "kiln/ir.h"
#include "step_guards.h"

namespace kiln {

struct CapturedStep {
  ir::Graph raw;
  // Per raw input, by name (passes keep input names): a user input's index, or the tensor read in
  // place.
  std::unordered_map<std::string, int> user;
  std::unordered_map<std::string, at::Tensor> bound;
  // Raw storage id -> the parameter, buffer or optimizer state tensor bound to it (what the
  // optimizer probe checks calls against).
  std::unordered_map<int32_t, at::Tensor> storage_tensor;
  size_t num_results = 0;
  // Per parameter index (StepGuards::params order): the parameter whose gradient the step makes,
  // undefined for the others.
  std::vector<at::Tensor> grad_params;
  // The gradients the step read where they were (accumulating into them): (parameter name, the
  // parameter, its gradient at capture). A plan reads each parameter's gradient of the call (the
  // raw inputs in `grad_inputs`); a gradient of another shape or layout since, or one read only
  // through a part of it (`rebound` false: the plan holds that tensor), needs a capture again.
  struct ReadGrad {
    std::string name;
    at::Tensor param, grad;
    bool rebound = true;
  };
  std::vector<ReadGrad> read_grads;
  // Raw input name -> the parameter whose gradient it is (as itself, or an alias of all of it, an
  // optimizer's p.grad().data()): bound to that parameter's gradient at every call.
  std::unordered_map<std::string, at::Tensor> grad_inputs;
  // The parameters without a gradient when the capture began: a step that finds one there later
  // may accumulate into it where the plan makes a new one. (name, parameter)
  std::vector<std::pair<std::string, at::Tensor>> none_grads;
};

struct CaptureOutcome {
  std::vector<at::Tensor> results;  // what the step returned (it ran for real)
  CapturedStep step;
  std::string failure;  // "" when captured
  // The capture is to be done again at the next step (an optimizer made state for new parameters
  // during this one, so the recorded step creates that state instead of reading it).
  bool retry = false;
};

// Runs fn(inputs) once, recording it. Never throws for a step that cannot be captured (failure
// says why); exceptions of the step itself propagate.
CaptureOutcome capture_step(const StepFn& fn, const std::vector<at::Tensor>& inputs, const StepState& state,
                            const StepGuards& guards);

}  // namespace kiln
