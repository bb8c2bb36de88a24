// Materialization, the last step of lowering: inputs and outputs are the execute() tensors; every
// other value that needs memory (reductions, extern results and their arguments, reshaped roots,
// pointwise values that are costly to recompute for several readers) gets a scratch slot; then
// the order to compute the materialized values in, dependencies first.
#pragma once

#include <kiln/plugin_api.hpp>

#include "loop_ir.h"

namespace kiln::inductor {

// Fills `L`'s buffers, scratch_bytes and order; `L` holds every node's definitions already.
// Throws plugin::Unimplemented for outputs the host cannot bind (a value output twice, an input
// passed through).
void materialize(const plugin::Graph& g, LoweredGraph* L);

}  // namespace kiln::inductor
