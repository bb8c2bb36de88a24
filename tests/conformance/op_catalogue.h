// The catalogue of op variants the numeric cases hand to a plugin: every op of the core op set
// that kiln's pipeline emits for training steps (pointwise forward and backward, optimizer
// updates, reductions, softmax, layer norm, losses, matmul, layout, embedding, convolution),
// each over shapes that catch the usual mistakes (0-d, empty, size-1, broadcast, non-contiguous
// and offset inputs) and over the dtypes training uses (float32, bfloat16, float64). The run-time
// scalar families add every op argument kiln passes as a run-time scalar, whose value the plugin
// must read at every execute.
//
// A variant is a one-node graph (or a short chain, for fusion) written in kiln IR text with its
// input tensors described; build() infers the result types by running the node once eagerly, so
// the catalogue never states an output shape by hand.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "kiln/ir.h"

namespace kiln::conformance {

struct InputSpec {
  enum class Fill { Normal, Positive, Index, Bool, Small };
  enum class Layout { Contiguous, Transposed, Strided, Offset };
  std::vector<int64_t> shape;
  c10::ScalarType dtype = c10::ScalarType::Float;
  Fill fill = Fill::Normal;
  int64_t index_bound = 0;  // Fill::Index: values in [0, index_bound)
  Layout layout = Layout::Contiguous;
};

// A run-time scalar of a variant: `$k:<value>` in the body, where <value> is the one seen at
// capture. Every later execute draws a fresh value from [lo, hi] (an integer for an int scalar).
struct ScalarSpec {
  std::string arg;  // the argument it is, for messages: "alpha", "other", "step_size"
  bool integer = false;
  double lo = -2, hi = 2;
};

struct OpVariant {
  std::string family;  // the case that runs it: "UnaryPointwise", "Matmul", ...
  std::string op;      // the op it is about, for messages
  std::string body;    // IR text lines after the inputs; %0.. are the inputs; the last line's
                       // results (and any line marked by `output`) are the outputs
  std::vector<InputSpec> inputs;
  std::vector<ScalarSpec> scalars;  // $0, $1, ... in the body
  bool matmul_like = false;         // tf32 tolerance on CUDA

  std::string label() const;  // "aten::add.Tensor(f32[4,5], f32[5])", "aten::mul.Scalar(f32[4,5], other=$0)"
};

// Every variant; `family` filters ("" for all).
std::vector<OpVariant> op_catalogue(const std::string& family = "");
std::vector<std::string> op_families();

// Fresh random inputs for a variant on `device`.
std::vector<at::Tensor> make_inputs(const OpVariant& v, const c10::Device& device);
// The variant as a graph whose value types come from running it once on `sample` inputs (and the
// run-time scalars' capture values).
ir::Graph build_graph(const OpVariant& v, const std::vector<at::Tensor>& sample);

// The run-time scalars' values seen at capture (what the graph's `$k:<value>` arguments hold), by
// index: what the compiled graph was made with.
std::vector<c10::IValue> captured_scalars(const ir::Graph& g);
// Fresh values for a variant's run-time scalars, each different from the one in `previous` (the
// last execute's), so that a plugin that keeps an old value cannot match by chance.
std::vector<c10::IValue> make_scalars(const OpVariant& v, const std::vector<c10::IValue>& previous);

}  // namespace kiln::conformance
