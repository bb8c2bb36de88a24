// Capture: records a whole training step (forward, loss, backward, optimizer update) as one kiln
// IR graph, below autograd, while the step really runs.
//
// The recorder is a C++ c10::impl::PyInterpreterVTable pushed on LibTorch's dispatch-mode stack
// (the stack torch.compile's own tracing uses). libtorch registers a fallback for the Python
// dispatch key that hands every call below autograd and autocast to the top mode; kiln's mode
// records the call, pops itself, runs the real kernel and pushes itself back. Autograd's engine
// carries the mode stack to its device threads, so a CUDA backward is recorded too. This is
// internal LibTorch API: tests/unit/capture pins it. docs/architecture.md has the evidence.
//
// The recorded graph is not functional: in-place ops, out= ops and views stay as they ran, and
// Value::storage says which values share memory. functionalize() (passes.h) makes it pure.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/function_schema.h>

#include "kiln/ir.h"

namespace c10 {
class OperatorHandle;
}

namespace kiln {

// A tensor the step reads that kiln knows by identity: a parameter, buffer, gradient, optimizer
// state or the user's batch. Any other tensor the step reads without producing it is recorded
// as a Constant input bound to that very tensor.
struct KnownTensor {
  at::Tensor tensor;
  ir::InputRole role = ir::InputRole::Constant;
  std::string name;
  int user_index = -1;  // for UserInput: position among the step's inputs
};

// Why a capture stopped recording. The step itself always runs to its end.
struct CaptureFailure {
  std::string op;      // "aten::_local_scalar_dense", or "" when not about one op
  std::string reason;  // one sentence for the warning
};

class StepRecorder {
 public:
  explicit StepRecorder(std::vector<KnownTensor> known);
  ~StepRecorder();
  StepRecorder(const StepRecorder&) = delete;
  StepRecorder& operator=(const StepRecorder&) = delete;

  // Runs `step` once with the recorder on top of the dispatch-mode stack; returns its results.
  // Exceptions from the step propagate (after the mode is popped).
  std::vector<at::Tensor> run(const std::function<std::vector<at::Tensor>()>& step);

  bool ok() const;
  const CaptureFailure& failure() const;
  // Values the step read on the host and that kiln let through (".item() of a tensor the step had
  // already used on the device, in aten::..."), one line each.
  const std::vector<std::string>& host_reads() const;

  // The value a tensor holds at the end of the step, kNoValue when the step never saw it.
  ir::ValueId value_of(const at::Tensor& t) const;
  // Adds a graph output: result number `target` of the step, or the gradient of parameter number
  // `target` (role Gradient), for the caller to put in param.grad.
  void add_output(ir::ValueId v, std::string name, ir::OutputRole role = ir::OutputRole::Result, int32_t target = -1);

  // The graph (raw: views and in-place ops, Value::storage set) and, parallel to graph.inputs,
  // the tensor each input was bound to and its user input index (-1 for state).
  ir::Graph& graph();
  const std::vector<at::Tensor>& input_tensors() const;
  const std::vector<int>& input_user_index() const;

  struct State;

 private:
  std::unique_ptr<State> s_;
};

// One intercepted call of a probe run.
struct ProbeCall {
  std::string op;                 // "aten::addcdiv_"
  std::vector<c10::IValue> args;  // every argument as passed
};

// Runs `fn` with every ATen call below autograd intercepted and NOT executed: a call that writes
// an argument returns that argument, any other returns a placeholder. Used to replay an
// optimizer's step() on the host only, so that its C++ state (Adam's step count) advances and the
// scalars it passes this step (bias corrections, learning rate) are known, while the compiled
// graph does the arithmetic.
std::vector<ProbeCall> probe_calls(const std::function<void()>& fn);

// Converts one recorded argument to an ir::Arg by its schema type. Tensors are looked up with
// `tensor_value`. Returns false (with `why`) for arguments kiln cannot replay (a Generator, ...).
bool ivalue_to_arg(const c10::IValue& v, const c10::Argument& schema_arg,
                   const std::function<ir::ValueId(const at::Tensor&)>& tensor_value, ir::Arg& out, std::string& why);

// "aten::add_.Tensor" for an operator handle.
std::string op_full_name(const c10::OperatorHandle& op);

// Ops whose result (or result shape) depends on tensor data: capture stops at them.
bool is_data_dependent_op(const std::string& op_full_name);

}  // namespace kiln
