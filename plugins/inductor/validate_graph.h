// Validation of a graph view handed over the C ABI, before the claim rules and the lowering index
// arrays with its value indices without further checks.
#pragma once

#include <kiln/plugin_api.hpp>

namespace kiln::inductor {

// Throws plugin::Error(KILN_ERROR_INVALID_ARGUMENT), naming the node and the index, unless every
// value index of the graph view (graph inputs and outputs, node inputs, results, tensor and
// tensor-list arguments) is in range and every pointer the lowering follows is set.
void validate_graph(const plugin::Graph& g);

}  // namespace kiln::inductor
