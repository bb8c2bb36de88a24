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
#include <string>
#include <vector>

#include <kiln/plugin_api.hpp>

#include "synapse_abi.h"

namespace kiln::hpu {

struct SynTensor {
  enum class Kind { kInput, kOutput, kScalar, kWorkspace };
  std::string name;            // unique in the graph; how a launch names a persistent tensor
  std::vector<int64_t> shape;  // ATen's order (slowest dim first); the runtime reverses it
  syn::DataType dtype = syn::kTypeFloat;
  Kind kind = Kind::kWorkspace;
  int64_t index = -1;    // the subgraph input or output, or the run-time scalar
  bool widened = false;  // int64 on kiln's side, int32 on the device
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
  // The whole graph as text: every tensor and node with its GUID and parameters, in order.
  std::string dump() const;
};

// "" when lower() can take node `n`, else why not (for the debug log).
std::string why_not_lowered(const kiln::plugin::Graph& g, const kiln::plugin::Node& n);

// The subgraph as a Synapse graph. Throws kiln::plugin::Unimplemented for a node it cannot take.
SynGraph lower(const kiln::plugin::Graph& g);

}  // namespace kiln::hpu
