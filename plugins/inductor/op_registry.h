// The ops the inductor takes: one entry per ATen op, with the rules that decide whether a node of
// it is claimed and the lowering that turns it into loop IR. The claim rules common to every op
// (dtypes, devices, argument kinds) are applied by why_not_claimed (lowering.h) from the entry's
// kind and flags; `claim` adds the op's own.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <kiln/plugin_api.hpp>

#include "lowerer.h"

namespace kiln::inductor {

enum class OpKind : uint8_t {
  Compute,  // generated code: pointwise or reduction
  View,     // index math only
  Extern,   // run by ATen through the host's call_eager (matmul, convolution, attention)
};

using ClaimRule = std::string (*)(const plugin::Graph& g, const plugin::Node& n);
using Lowering = std::function<void(Lowerer& l, const plugin::Node& n)>;

struct OpEntry {
  std::string name;  // "aten::add.Tensor"
  OpKind kind = OpKind::Compute;
  // Integer results are left to ATen: integer division, overflow and the like have rules of their
  // own that float arithmetic does not follow.
  bool float_result = false;
  // Argument 1 is a Scalar that becomes a parameter of the generated code: it must be a number.
  bool numeric_scalar = false;
  // An empty input runs eagerly: ATen's answer over an empty dim (an error for amax, NaN rows for
  // softmax) is an edge case nobody trains on.
  bool nonempty_inputs = false;
  ClaimRule claim = nullptr;  // the op's own rules: why not, or ""
  Lowering lower;
  // An extern kernel that the CUDA kernels compute themselves where `cuda_claim` takes the node
  // (the embedding's backward as a scatter-add): there it is generated code, lowered by
  // `cuda_lower`; elsewhere, and on CUDA where the rule says no, it stays an extern kernel.
  ClaimRule cuda_claim = nullptr;
  Lowering cuda_lower;
};

// Every entry, in the order of the table.
const std::vector<OpEntry>& op_registry();

// The entry of `op` ("aten::mm"), nullptr when the inductor does not take it.
const OpEntry* find_op(const std::string& op);

}  // namespace kiln::inductor
