// StableHLO from kiln's graph view: a claimed subgraph as one MLIR module in text, whose
// `func.func public @main` takes the subgraph's inputs in order and returns its outputs. kiln's own
// emitter, with no MLIR dependency: ops are written in MLIR's generic form
// ("stablehlo.add"(%a, %b) : (types) -> type), which every StableHLO parser reads the same way.
//
// What it takes today, float32 (int64 for indices, targets and batch norm's counter): element-wise
// arithmetic and activations with broadcasting (add, sub, mul, div with tensors or scalars and
// alpha; neg, abs, exp, log, sqrt, rsqrt, tanh, sigmoid, relu and its backward, gelu and its
// backward, maximum, minimum, clone, detach); the optimizers' addcmul/addcdiv with run-time
// scalars as parameters of @main; matmuls (mm, bmm, addmm as dot_general); views (t, permute,
// transpose, view, reshape, expand, slice, split, cat); sums and means over dims; softmax,
// log_softmax and nll_loss with their backward; layer norm, training batch norm, convolution, max
// pooling with indices, embedding and CPU flash attention, each with its backward. Everything else
// stays eager, with the reason.
#pragma once

#include <string>
#include <vector>

#include <kiln/plugin_api.hpp>

namespace kiln::neuron {

struct PaddingPlan;

// Whether `op` is an element-wise op the emitter takes (its result's elements each from the
// operands' elements at the same place, broadcast).
bool is_elementwise(const std::string& op);

// "" when emit_stablehlo can take node `n`, else why not (for the debug log).
std::string why_not_emitted(const kiln::plugin::Graph& g, const kiln::plugin::Node& n);

// How @main's tensors lie in memory: for each of the subgraph's inputs and outputs, the order of
// its dims in storage, outermost first (boundary.h's storage_order), where it is dense in an order
// other than row-major; empty where it is row-major, or no permutation of a dense layout at all.
struct BoundaryLayout {
  std::vector<std::vector<int64_t>> inputs, outputs;
};

// The whole subgraph as a module. Throws kiln::plugin::Unimplemented for a node it cannot take.
// @main's parameters are the subgraph's inputs, then one rank-0 f32 per run-time scalar the nodes
// read: `runtime_scalars` (when given) gets their numbers (Arg::runtime_scalar), in that order. An
// input or output whose recorded strides are dense in another order of its dims (a transposed
// weight, a channels-last activation) is a parameter or result of its dims in storage order, with a
// stablehlo.transpose after the parameter or before the return; `layout` (when given) gets those
// orders. With `padding` (padding.h; `g` is then a symbolic group made concrete at a bucket of
// sizes), @main also takes the size symbols' real values, rank-0 i64 parameters after the
// run-time scalars, and keeps padded elements out of every real result as the plan says.
std::string emit_stablehlo(const kiln::plugin::Graph& g, std::vector<int32_t>* runtime_scalars = nullptr,
                           BoundaryLayout* layout = nullptr, const PaddingPlan* padding = nullptr);

}  // namespace kiln::neuron
