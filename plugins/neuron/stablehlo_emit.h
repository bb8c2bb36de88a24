// StableHLO from kiln's graph view: a claimed subgraph as one MLIR module in text, whose
// `func.func public @main` takes the subgraph's inputs in order and returns its outputs. kiln's own
// emitter, with no MLIR dependency: ops are written in MLIR's generic form
// ("stablehlo.add"(%a, %b) : (types) -> type), which every StableHLO parser reads the same way.
//
// What it takes today, float32: element-wise arithmetic and activations with broadcasting (add,
// sub, mul, div with tensors or scalars and alpha; neg, abs, exp, log, sqrt, rsqrt, tanh, sigmoid,
// relu and its backward (threshold_backward), maximum, minimum, clone); matmuls (mm, bmm, addmm as
// dot_general); views (t, permute, transpose, view, reshape, expand); sums over dims; log_softmax
// and its backward. Convolutions, other reductions, gathers and the optimizers' run-time scalars
// are not emitted yet: those nodes stay eager.
#pragma once

#include <string>
#include <vector>

#include <kiln/plugin_api.hpp>

namespace kiln::neuron {

// "" when emit_stablehlo can take node `n`, else why not (for the debug log).
std::string why_not_emitted(const kiln::plugin::Graph& g, const kiln::plugin::Node& n);

// The whole subgraph as a module. Throws kiln::plugin::Unimplemented for a node it cannot take.
// @main's parameters are the subgraph's inputs, then one rank-0 f32 per run-time scalar the nodes
// read: `runtime_scalars` (when given) gets their numbers (Arg::runtime_scalar), in that order.
std::string emit_stablehlo(const kiln::plugin::Graph& g, std::vector<int32_t>* runtime_scalars = nullptr);

}  // namespace kiln::neuron
