// A claimed subgraph as a Synapse graph, in kiln's own terms: the tensors (persistent ones for the
// subgraph's inputs, outputs and run-time scalars; the rest live in the recipe's workspace) and
// the nodes (a kernel GUID, its operands, its parameter struct's bytes). synapse_runtime.cpp turns
// it into synTensor and synNodeCreate calls; its text (dump) is the recipe cache's key and what the
// golden test reads.
//
// What it lowers, float32 and bfloat16: mm, addmm and bmm (MME gemm / batch_gemm, a transpose of
// an operand folded into the GEMM's transpose flag), t, permute, transpose, view, reshape;
// element-wise add, sub, mul, div of tensors or Scalars with alpha, neg, exp, log, sqrt, rsqrt,
// tanh, sigmoid, relu and gelu (exact or tanh) with their backward; sum and mean over dims;
// softmax and log_softmax and their backward; nll_loss and its backward over [N, C] (mean, sum or
// none, no class weight); the optimizers' addcmul and addcdiv with run-time scalars (a persistent
// one-element tensor each, written at every launch); clone, alias, detach; embedding (gather) and
// its dense backward; 2-d convolution and its backward (spatial_convolution, dedx, dedw on NHWC
// tensors); layer norm over the last dim and training batch norm (NHWC), with their backward,
// their weights and statistics float32 in the kernels. int64 targets and indices are int32
// tensors on the device (narrowed on the way in), and so is a one-element int64 counter stepped by
// a constant (batch norm's num_batches_tracked). Everything else stays eager, with the reason.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <kiln/plugin_api.hpp>

#include "synapse_abi.h"

namespace kiln::hpu {

struct SynTensor {
  // Persistent tensors (all but kWorkspace) are given at each launch: kInput, kOutput and kScalar
  // (a run-time scalar) hold data kiln writes or reads; kSizeScalar is a one-element tensor holding
  // a number that follows the sizes (a mean's 1/n), written before each launch; kShape holds no
  // data: its sizes at a launch are the actual sizes of the tensor a reshape outputs.
  enum class Kind { kInput, kOutput, kScalar, kWorkspace, kSizeScalar, kShape };
  std::string name;                // unique in the graph; how a launch names a persistent tensor
  std::vector<int64_t> shape;      // ATen's order (slowest dim first); the runtime reverses it. The
                                   // largest sizes where min_shape is set
  std::vector<int64_t> min_shape;  // empty, or the smallest sizes of a tensor whose sizes change
  syn::DataType dtype = syn::kTypeFloat;
  Kind kind = Kind::kWorkspace;
  // The subgraph input or output, the run-time scalar; for kSizeScalar the constant node, and for
  // kShape the tensor, of a lowering at the launch's sizes that gives its value or sizes.
  int64_t index = -1;
  bool widened = false;  // int64 on kiln's side, int32 on the device
  bool dynamic() const { return !min_shape.empty() && min_shape != shape; }
};

struct SynNode {
  std::string guid;
  std::string name;
  std::vector<int32_t> inputs, outputs;  // indices into SynGraph::tensors
  std::vector<uint8_t> params;           // the kernel's parameter struct, as synNodeCreate takes it
  std::string params_text;               // the same, for the dump
};

struct SynGraph {
  std::vector<SynTensor> tensors;
  std::vector<SynNode> nodes;
  std::vector<int32_t> inputs;   // per subgraph input: its tensor, or -1 where no node reads it
  std::vector<int32_t> outputs;  // per subgraph output: its tensor
  std::vector<int32_t> scalars;  // persistent scalar tensors (SynTensor::index: the run-time scalar)
  // A graph for a range of sizes (dynamic_graph): its kSizeScalar and kShape tensors.
  std::vector<int32_t> size_scalars, shape_tensors;
  // The whole graph as text: every tensor and node with its GUID and parameters, in order.
  std::string dump() const;
};

// "" when lower() can take node `n`, else why not (for the debug log).
std::string why_not_lowered(const kiln::plugin::Graph& g, const kiln::plugin::Node& n);

// The subgraph as a Synapse graph. Throws kiln::plugin::Unimplemented for a node it cannot take.
SynGraph lower(const kiln::plugin::Graph& g);

// One graph for every size of a symbolic group between two sizes, from its lowerings at the
// smallest (`low`) and the largest (`high`) of them: `high` with each tensor whose sizes differ
// given `low`'s as its minimum sizes (Synapse's dynamic shapes), a shape tensor as the second
// input of each reshape whose output changes size, and each constant whose value differs (a number
// that follows the sizes) made a persistent kSizeScalar. A launch reads the actual sizes and
// numbers from the lowering at its own sizes, which has the same tensors and nodes. Empty, with
// `why`, where the two lowerings differ in anything else (another node, a tensor's rank or dtype,
// a kernel parameter that is not a constant's value).
std::optional<SynGraph> dynamic_graph(const SynGraph& low, const SynGraph& high, std::string* why);

// How the size symbols of a symbolic view depend on each other. They are not independent: a
// group's input of sizes [B*T, C] has a symbol of its own, which its reshapes tie to the others (a
// view of [8, T, C] as [8*T, C] makes it 8 * T). Each symbol is free, or derived: its value is
// num * (the product of free symbols `factors`) / den. Read from the element counts the view's
// reshapes keep.
struct SymbolRelation {
  bool derived = false;
  int64_t num = 1, den = 1;
  std::vector<int32_t> factors;  // free symbols, with repeats
  // A free symbol's values are multiples of `step` where a number the view holds is a fraction of
  // it (a size site s / 2): the range's ends are rounded up to one.
  int64_t step = 1;
};
std::vector<SymbolRelation> symbol_relations(const kiln::plugin::Graph& symbolic);

// The range of sizes one recipe serves for a call at `sizes`: each free symbol's bucket under
// `policy` (kiln::plugin::size_bucket), each derived one computed at both ends. Empty where
// `sizes` break a relation or a derived size is not an integer at an end.
std::optional<kiln::plugin::SizeBucket> size_range(const std::vector<SymbolRelation>& relations,
                                                   const std::string& policy, const std::vector<int64_t>& sizes);

// The value a constant node writes (its ConstantParams, read as the dtype of its output).
double constant_value(const SynGraph& g, const SynNode& n);

}  // namespace kiln::hpu
