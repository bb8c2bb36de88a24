// The lowerings and the claim rules of each op family, which op_registry.cpp binds to op names.
// A lowering defines the node's results in the LoweredGraph (lowerer.h); it runs only on nodes
// its claim rules and the common ones (lowering.cpp) accepted. A claim rule returns why the
// inductor does not take the node, or "" when it does.
#pragma once

#include <string>

#include <kiln/plugin_api.hpp>

#include "lowerer.h"

namespace kiln::inductor {

// ---- Claim rules ----
std::string takes_every_node(const plugin::Graph& g, const plugin::Node& n);
std::string claim_to_copy(const plugin::Graph& g, const plugin::Node& n);
std::string claim_gelu(const plugin::Graph& g, const plugin::Node& n);
std::string claim_pow(const plugin::Graph& g, const plugin::Node& n);
std::string claim_clamp(const plugin::Graph& g, const plugin::Node& n);
std::string claim_max_pool2d(const plugin::Graph& g, const plugin::Node& n);
std::string claim_sum_mean(const plugin::Graph& g, const plugin::Node& n);
std::string claim_nll_loss(const plugin::Graph& g, const plugin::Node& n);
std::string claim_expand(const plugin::Graph& g, const plugin::Node& n);
std::string claim_batch_norm(const plugin::Graph& g, const plugin::Node& n);

// ---- Pointwise (ops_pointwise.cpp) ----
// `ir_op` is the loop-IR op the ATen op becomes (loop_ir.h, codegen's text()).
void lower_copy(Lowerer& l, const plugin::Node& n);
void lower_unary(Lowerer& l, const plugin::Node& n, const std::string& ir_op);
void lower_silu(Lowerer& l, const plugin::Node& n);
// self op alpha * other (alpha when the op has one); `reversed`: other op alpha * self (rsub).
void lower_binary(Lowerer& l, const plugin::Node& n, const std::string& ir_op, bool scalar_other, bool reversed);
void lower_pow(Lowerer& l, const plugin::Node& n);
void lower_compare(Lowerer& l, const plugin::Node& n, const std::string& ir_op, bool scalar_other);
void lower_clamp(Lowerer& l, const plugin::Node& n);
void lower_gelu(Lowerer& l, const plugin::Node& n, bool backward);
void lower_sigmoid_tanh_backward(Lowerer& l, const plugin::Node& n, bool sigmoid);
void lower_threshold_backward(Lowerer& l, const plugin::Node& n);
void lower_where(Lowerer& l, const plugin::Node& n);
void lower_addc(Lowerer& l, const plugin::Node& n, const std::string& ir_op);  // addcmul, addcdiv
void lower_lerp(Lowerer& l, const plugin::Node& n);
void lower_fill(Lowerer& l, const plugin::Node& n);  // the value is argument 1
void lower_constant(Lowerer& l, const plugin::Node& n, double value);
void lower_nll_loss_backward(Lowerer& l, const plugin::Node& n);
void lower_embedding(Lowerer& l, const plugin::Node& n);
std::string claim_embedding(const plugin::Graph& g, const plugin::Node& n);
void lower_max_pool2d_with_indices(Lowerer& l, const plugin::Node& n);

// ---- Reductions and composites with reductions (ops_reduction.cpp) ----
// `all_dims`: the overload without a dim list; `mean`: scaled by 1 / the reduced count.
void lower_reduce(Lowerer& l, const plugin::Node& n, const std::string& combine, bool mean, bool all_dims);
void lower_softmax(Lowerer& l, const plugin::Node& n, bool log);
void lower_softmax_backward(Lowerer& l, const plugin::Node& n, bool log);
void lower_layer_norm(Lowerer& l, const plugin::Node& n);
void lower_layer_norm_backward(Lowerer& l, const plugin::Node& n);
// Batch norm in training mode (ops_reduction.cpp): the functional forward and its backward.
void lower_batch_norm(Lowerer& l, const plugin::Node& n);
void lower_batch_norm_backward(Lowerer& l, const plugin::Node& n);
void lower_nll_loss_forward(Lowerer& l, const plugin::Node& n);
// The embedding's backward as a scatter-add (Reduction::scatter), for the CUDA kernels.
void lower_embedding_backward(Lowerer& l, const plugin::Node& n);
std::string claim_embedding_backward_cuda(const plugin::Graph& g, const plugin::Node& n);

// ---- Views: index math (ops_view.cpp) ----
void lower_same_index_view(Lowerer& l, const plugin::Node& n);  // alias, detach
void lower_reshape(Lowerer& l, const plugin::Node& n);          // view, _unsafe_view, reshape
void lower_t(Lowerer& l, const plugin::Node& n);
void lower_permute(Lowerer& l, const plugin::Node& n);
void lower_transpose(Lowerer& l, const plugin::Node& n);
void lower_expand(Lowerer& l, const plugin::Node& n);
void lower_unsqueeze(Lowerer& l, const plugin::Node& n);
enum class Squeeze { AllOnes, Dim, Dims };
void lower_squeeze(Lowerer& l, const plugin::Node& n, Squeeze which);
void lower_select(Lowerer& l, const plugin::Node& n);
void lower_slice(Lowerer& l, const plugin::Node& n);

// ---- Extern kernels: ATen through call_eager (op_registry.cpp) ----
void lower_extern(Lowerer& l, const plugin::Node& n);

}  // namespace kiln::inductor
