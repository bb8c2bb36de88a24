// Lowering: ATen nodes of a pure subgraph to the loop IR (loop_ir.h), and the claim rules that say
// which nodes the inductor takes. The two share one table so that the plugin never claims a node it
// cannot lower.
#pragma once

#include <memory>
#include <string>

#include <kiln/plugin_api.hpp>

#include "loop_ir.h"

namespace kiln::inductor {

struct LoweringOptions {
  bool extern_kernels = true;   // take matmul/convolution/attention and run them through call_eager
  bool runtime_scalars = false; // the host passes run-time scalars (ABI 1.1)
};

// Throws plugin::Error(KILN_ERROR_INVALID_ARGUMENT), naming the node and the index, unless every
// value index of the graph view (graph inputs and outputs, node inputs, results, tensor and
// tensor-list arguments) is in range and every pointer the lowering follows is set. The lowering
// and the claim rules index arrays with these without further checks.
void validate_graph(const plugin::Graph& g);

// Whether the inductor takes `node` (empty string) or why not.
std::string why_not_claimed(const plugin::Graph& g, const plugin::Node& node, const LoweringOptions& opts);

// The op's kind in the claim table: a pure view (index math only) or an extern kernel (call_eager).
bool is_view_op(const std::string& op);
bool is_extern_op(const std::string& op);

// Lowers a whole subgraph. Throws plugin::Unimplemented for anything it does not take. The result's
// loaders point into it, so it stays where it was made.
std::unique_ptr<LoweredGraph> lower(const plugin::Graph& g, const LoweringOptions& opts);

}  // namespace kiln::inductor
