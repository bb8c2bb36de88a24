// The eager executor: runs kiln IR nodes through the dispatcher's boxed interface
// (OperatorHandle::callBoxed), so it runs any graph. It is the fallback for every node a backend
// does not claim and the numeric reference for every test.
//
// Per-step cost is kept low: operator handles, argument kinds and constant IValues are resolved
// once when a node is prepared; a run only pushes tensors and calls. Values are freed after their
// last use.
#pragma once

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

// One node, resolved against the dispatcher once.
class PreparedNode {
 public:
  // Throws std::runtime_error naming the op when it is unknown or an argument does not fit.
  explicit PreparedNode(const ir::Node& node);

  // Reads its tensor arguments from env[value id], writes its results to env[output id].
  // `scalars` holds the run-time scalars (Graph::scalar_inputs), may be null when there are none.
  void run(std::vector<at::Tensor>& env, const std::vector<c10::IValue>* scalars = nullptr) const;
  const std::string& op() const { return op_; }
  // Whether the op writes into an argument (an out= or in-place variant: a write-back into a
  // parameter's or an optimizer state's own memory).
  bool writes_arguments() const;
  // The values of the arguments it writes into (those its schema marks as written).
  std::vector<ir::ValueId> written_values() const;

 private:
  enum class Slot : uint8_t { Constant, Tensor, TensorList, OptionalTensorList, Scalar };
  struct ArgSlot {
    Slot slot = Slot::Constant;
    ir::ValueId value = ir::kNoValue;
    std::vector<ir::ValueId> values;
    c10::IValue constant;
    int32_t scalar_input = -1;
    bool as_scalar = false;  // wrap the run-time scalar as a c10::Scalar
  };
  std::string op_;
  // Shared by the copies of this node, freed with the last (a handle is two pointers into the
  // dispatcher; held through a pointer so that this header needs no Dispatcher.h).
  std::shared_ptr<const c10::OperatorHandle> handle_;
  std::vector<ArgSlot> args_;
  std::vector<ir::ValueId> outputs_;
  bool returns_list_ = false;
};

// The op of the node this thread started last (""); names the culprit when a run fails
// inside a CUDA graph capture.
const char* current_node_op();

// Converts one ir::Arg to the IValue the op's schema expects (tensors looked up in env).
c10::IValue arg_to_ivalue(const ir::Arg& arg, const c10::Argument& schema_arg, const std::vector<at::Tensor>& env);

// Runs a list of nodes of one graph, freeing each value after its last use within the list
// unless it is listed in `keep` (graph outputs, values other executors read later).
class EagerExecutor {
 public:
  // `nodes`: indices into graph.nodes, in order; empty means all of them.
  // check_meta ([debug] check_meta): each result's dtype and shape are checked against the graph
  // as the step runs, and the first mismatch is an error naming the node (finds a pass or capture
  // bug fast).
  EagerExecutor(const ir::Graph& graph, std::vector<int32_t> nodes = {}, std::vector<ir::ValueId> keep = {},
                bool check_meta = false);

  // Runs one node of any graph, resolving it on the spot (slow path, for tests and one-offs).
  static void run_node(const ir::Node& node, std::vector<at::Tensor>& env,
                       const std::vector<c10::IValue>* scalars = nullptr);

  // env has graph.values.size() entries with the graph inputs bound; results land in env.
  // Runs below autograd and autocast: the graph already holds their work.
  void run(std::vector<at::Tensor>& env, const std::vector<c10::IValue>* scalars = nullptr) const;

  size_t size() const { return nodes_.size(); }

 private:
  std::vector<PreparedNode> nodes_;
  std::vector<std::vector<ir::ValueId>> free_after_;  // per node: values dead after it
  // check_meta: per node, the expected metadata of its results.
  std::vector<std::vector<std::pair<ir::ValueId, ir::TensorMeta>>> check_meta_;
  std::vector<std::string> check_where_;
};

}  // namespace kiln
