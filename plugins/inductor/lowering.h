// Lowering: ATen nodes of a pure subgraph to the loop IR (loop_ir.h), and the claim rules that say
// which nodes the inductor takes. Both come from one op registry (op_registry.h), so the plugin
// never claims a node it cannot lower. The pipeline: validate_graph, then each node's claim check
// and lowering in graph order, then materialize (materialize.h).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <kiln/plugin_api.hpp>

#include "loop_ir.h"
#include "validate_graph.h"

namespace kiln::inductor {

// The device a group's kernels are generated for: C++/OpenMP (codegen.h) or CUDA (codegen_cuda.h).
enum class Target : uint8_t { Cpu, Cuda };

struct LoweringOptions {
  Target target = Target::Cpu;   // the nodes' values must all be on this kind of device
  bool extern_kernels = true;    // take matmul/convolution/attention and run them through call_eager
  bool runtime_scalars = false;  // execute is given run-time scalars (KILN_CAPABILITY_RUNTIME_SCALARS)
  // CUDA: matmuls run through cuBLASLt and the nodes folded into them (gemm_fold.h); the folded
  // nodes' results become the matmul's extern results. Not owned.
  const struct GemmPlan* gemms = nullptr;
};

// The target of a node from the device of its values (empty when they are on no device the
// inductor generates code for, or on several).
std::optional<Target> target_of(const plugin::Graph& g, const plugin::Node& node);

// Whether the inductor takes `node` (empty string) or why not.
std::string why_not_claimed(const plugin::Graph& g, const plugin::Node& node, const LoweringOptions& opts);

// The op's kind in the registry: a pure view (index math only) or an extern kernel (call_eager).
bool is_view_op(const std::string& op);
bool is_extern_op(const std::string& op);
// Whether `node` runs as an extern kernel when generated for `target`: an extern op, unless the
// CUDA kernels compute it themselves there (OpEntry::cuda_claim).
bool is_extern_node(const plugin::Graph& g, const plugin::Node& node, Target target);

// Lowers a whole subgraph. Throws plugin::Unimplemented for anything it does not take. The result's
// loaders point into it, so it stays where it was made.
std::unique_ptr<LoweredGraph> lower(const plugin::Graph& g, const LoweringOptions& opts);

}  // namespace kiln::inductor
