// The passes over kiln IR, one function each in core/src/passes/<pass>.cpp, and PassRunner, which
// runs them in order, verifying and dumping the IR after every pass (core/src/passes/pipeline.cpp).
// The compiled step's whole pipeline is plan_step (core/src/runtime/plan_step.cpp).
#pragma once

#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kiln/ir.h"

namespace kiln {

// Tensors bound to Constant graph inputs by value id: what capture saw, plus what constant
// folding computed. The compiled step keeps them alive and binds them on every call.
using ConstantTensors = std::unordered_map<ir::ValueId, at::Tensor>;

// In-place ops and view mutations become pure ops plus write-back outputs.
void functionalize(ir::Graph& graph);
// Lowers non-core ops to kiln's core op set (docs/architecture.md lists it). Exact rewrites only:
// the result is bit-identical to the original op.
void decompose(ir::Graph& graph);
// Removes nodes whose results nothing uses (never mutating or random ops).
void eliminate_dead_code(ir::Graph& graph);
// Merges identical pure nodes (same op, same arguments).
void eliminate_common_subexpressions(ir::Graph& graph);
// Evaluates, once, every pure node whose inputs are all constants, and turns its results into
// Constant inputs whose tensors go to `constants`.
void fold_constants(ir::Graph& graph, ConstantTensors& constants);

// Planning, after partitioning (see core/src/passes/writeback_in_place.cpp): element-wise
// write-backs that run eagerly compute straight into the written tensor (out= variants).
// `position[i]`: the slot node i runs in, -(slot + 1) for nodes a plugin runs; empty: graph order.
void compute_writebacks_in_place(ir::Graph& graph, const std::vector<int32_t>& position = {});

// Run-time scalars become 0-dim tensors, for CUDA graphs (which bake kernel arguments): every node
// with an Arg::scalar_input is rewritten into tensor ops that read a new Scalar graph input holding
// Graph::scalar_inputs[scalar] as a 0-dim tensor of `dtype` on `device`
// (core/src/passes/lift_runtime_scalars.cpp lists the rewrites). Returns the ops it could not
// rewrite (they keep their run-time scalars); `lifted` gets the new inputs.
struct LiftedScalar {
  ir::ValueId value = ir::kNoValue;
  int32_t scalar = -1;
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::kCPU);
  bool reciprocal = false;  // holds 1/scalar, rounded as ATen does (div.Scalar became a multiply)
};
std::vector<std::string> lift_runtime_scalars(ir::Graph& graph, std::vector<LiftedScalar>* lifted = nullptr);

// The optimizer's per-parameter element-wise updates as multi-tensor ops (experimental, CUDA;
// off unless [experimental] batch_optimizer): LibTorch's C++ optimizers update each parameter with its own
// few kernels (AdamW: ~10 per parameter, 770 launches on gpt), where PyTorch's foreach optimizers
// launch a few multi-tensor kernels for all of them. Nodes of the optimizer phase with the same
// op, the same constant arguments, the same dtype and device and the same depth within the
// optimizer phase (so that none depends on another) become one ATen `_foreach_*` node over the lists of their operands
// (mul.Scalar, add.Scalar with alpha 1, add/sub.Tensor, mul/div.Tensor of same-shaped operands,
// mul.Tensor by one shared 0-dim tensor, addcmul, addcdiv, sqrt, lerp.Scalar). A node whose result
// is written back (a parameter's or a state's new value) stays single, so that it still computes
// straight into the written tensor. Nodes are re-ordered topologically, keeping graph order where
// they are free. Returns how many nodes were folded into multi-tensor nodes.
size_t batch_optimizer_updates(ir::Graph& graph);

// Rematerialization under an activation memory budget (core/src/passes/rematerialize.cpp): of
// the forward's values the backward reads, the largest ones that can be computed again exactly and
// cheaply (element-wise ops, views, casts, layer norm; never matmuls, attention or random ops) from
// what stays kept are, as Phase::Recompute copies placed before their first backward reader, until
// what is kept is at most `budget` times what was. budget >= 1 changes nothing.
struct RematerializeResult {
  int64_t kept_bytes_before = 0;  // what the forward kept for the backward
  int64_t kept_bytes_after = 0;
  int dropped_tensors = 0;   // kept tensors now computed again
  int recomputed_nodes = 0;  // nodes copied into the backward
};
RematerializeResult rematerialize(ir::Graph& graph, double budget);
// Data parallelism: every all_reduce as early as its inputs allow (its bucket's gradients made),
// the waits where they were, so communication overlaps the rest of the backward. Keeps the
// all_reduces' order and the order of random and in-place ops among themselves. Returns how many
// nodes changed place (0 when the graph has no all_reduce).
size_t overlap_collectives(ir::Graph& graph);

// cuDNN batch norm (cudnn_batch_norm and the cudnn_batch_norm_backward nodes that read its
// reserve space) in ATen's native form, for a backend that compiles batch norm itself
// (core/src/passes/native_batch_norm.cpp). Not bit-exact: the planner rewrites only pairs whose
// every node the backend claims. Node indices are kept; the running statistics' clones become
// dead (run DCE after).
struct BatchNormPair {
  int32_t forward = -1;            // the cudnn_batch_norm node
  std::vector<int32_t> backwards;  // the cudnn_batch_norm_backward nodes reading its reserve
};
std::vector<BatchNormPair> cudnn_batch_norm_pairs(const ir::Graph& graph);
size_t to_native_batch_norm(ir::Graph& graph, const std::vector<BatchNormPair>& pairs);

// 2-D convolutions on channels-last activations (core/src/passes/channels_last.cpp): every
// convolution's weight is read through a channels-last clone (so that ATen runs it in NHWC), its
// weight gradient goes back to the layout eager gives it, and the activations around the
// convolutions are marked channels-last so that the kernels producing them write NHWC. Values and
// their order are unchanged; only layouts. CUDA graphs only, unless `any_device`. Returns how many
// convolutions it found (0: the graph is untouched).
size_t channels_last_convolutions(ir::Graph& graph, bool any_device = false);

struct PassRecord {
  std::string name;
  size_t nodes_before = 0, nodes_after = 0;
  double ms = 0;
};

// Runs passes over one graph, the way every pipeline of kiln does: run the pass, verify the graph
// (an error names the pass), dump it as "<NN>-<name>.kir" into dump_dir when that is set, log and
// record what the pass did, next pass. dump() writes a numbered file that is not IR (the
// partition, the plan) into the same sequence.
class PassRunner {
 public:
  PassRunner(ir::Graph& graph, std::string dump_dir);
  void run(const std::string& name, const std::function<void()>& pass);
  void dump(const std::string& name, const std::string& text);
  const std::vector<PassRecord>& records() const { return records_; }

 private:
  ir::Graph& g_;
  std::string dir_;
  int index_ = 0;
  std::vector<PassRecord> records_;
};

struct PipelineOptions {
  bool functionalize = true;
  // Where to dump the IR after every pass ("" = nowhere).
  std::string debug_dir;
};

// The graph passes alone, in the order the compiled step's planner runs them: functionalize,
// decompose, DCE, CSE, constant folding, DCE. For tests and tools; the compiled step runs them, and
// the passes after them, in plan_step.
void run_graph_passes(PassRunner& runner, ir::Graph& graph, ConstantTensors& constants, bool functionalize = true);
std::vector<PassRecord> run_pipeline(ir::Graph& graph, ConstantTensors& constants, const PipelineOptions& options = {});

// Writes `text` to <dir>/<name>, creating dir; logs and goes on when it cannot. Nothing when dir
// is empty.
void dump_debug_file(const std::string& dir, const std::string& name, const std::string& text);

}  // namespace kiln
