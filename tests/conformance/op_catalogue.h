// The catalogue of op variants the numeric cases hand to a plugin: every op of the core op set
// that kiln's pipeline emits for training steps (pointwise forward and backward, optimizer
// updates, reductions, softmax, layer norm, losses, matmul, layout, embedding, convolution),
// each over shapes that catch the usual mistakes (0-d, empty, size-1, broadcast, non-contiguous
// and offset inputs) and over the dtypes training uses (float32, bfloat16, float64).
//
// A variant is a one-node graph (or a short chain, for fusion) written in kiln IR text with its
// input tensors described; build() infers the result types by running the node once eagerly, so
// the catalogue never states an output shape by hand.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

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

struct OpVariant {
  std::string family;  // the case that runs it: "UnaryPointwise", "Matmul", ...
  std::string op;      // the op it is about, for messages
  std::string body;    // IR text lines after the inputs; %0.. are the inputs; the last line's
                       // results (and any line marked by `output`) are the outputs
  std::vector<InputSpec> inputs;
  bool matmul_like = false;  // tf32 tolerance on CUDA

  std::string label() const;  // "aten::add.Tensor(f32[4,5], f32[5])"
};

// Every variant; `family` filters ("" for all).
std::vector<OpVariant> op_catalogue(const std::string& family = "");
std::vector<std::string> op_families();

// Fresh random inputs for a variant on `device`.
std::vector<at::Tensor> make_inputs(const OpVariant& v, const c10::Device& device);
// The variant as a graph whose value types come from running it once on `sample` inputs.
ir::Graph build_graph(const OpVariant& v, const std::vector<at::Tensor>& sample);

}  // namespace kiln::conformance
