// The op table: every op the inductor takes, named once, with its kind, the common claim rules
// that apply to it, its own claim rule and its lowering (ops.h).
#include "op_registry.h"

#include <map>
#include <stdexcept>

#include "ops.h"

namespace kiln::inductor {

using plugin::Node;

void lower_extern(Lowerer& l, const Node& n) {
  for (int64_t v : n.outputs()) {
    l.val(v).kind = ValueInfo::Kind::Extern;
    l.val(v).ext.node = static_cast<int>(n.index());
    l.val(v).materialized = true;
  }
}

namespace {

// ---- Entry makers: the common rules of each kind of op ----

// Generated code (pointwise or reduction) over float results.
OpEntry compute(std::string name, Lowering lower, ClaimRule claim = takes_every_node) {
  OpEntry e;
  e.name = std::move(name);
  e.float_result = true;
  e.claim = claim;
  e.lower = std::move(lower);
  return e;
}

// Ops that compute nothing (copies, selects, constants): right for integer and bool results too.
OpEntry any_result(OpEntry e) {
  e.float_result = false;
  return e;
}

OpEntry with_numeric_scalar(OpEntry e) {
  e.numeric_scalar = true;
  return e;
}

OpEntry unary(std::string name, std::string ir_op) {
  return compute(std::move(name), [ir_op](Lowerer& l, const Node& n) { lower_unary(l, n, ir_op); });
}

OpEntry binary(std::string name, std::string ir_op, bool reversed = false) {
  return compute(std::move(name),
                 [ir_op, reversed](Lowerer& l, const Node& n) { lower_binary(l, n, ir_op, false, reversed); });
}

OpEntry binary_scalar(std::string name, std::string ir_op, bool reversed = false) {
  return with_numeric_scalar(compute(
      std::move(name), [ir_op, reversed](Lowerer& l, const Node& n) { lower_binary(l, n, ir_op, true, reversed); }));
}

// Comparisons produce bool from any operand types.
OpEntry compare(std::string name, std::string ir_op) {
  return any_result(
      compute(std::move(name), [ir_op](Lowerer& l, const Node& n) { lower_compare(l, n, ir_op, false); }));
}

OpEntry compare_scalar(std::string name, std::string ir_op) {
  return with_numeric_scalar(
      any_result(compute(std::move(name), [ir_op](Lowerer& l, const Node& n) { lower_compare(l, n, ir_op, true); })));
}

OpEntry reduction(std::string name, Lowering lower, ClaimRule claim = takes_every_node) {
  OpEntry e = compute(std::move(name), std::move(lower), claim);
  e.nonempty_inputs = true;
  return e;
}

// sum and mean of an empty input are ATen's 0 and NaN, which the generated code gives too.
OpEntry sum_or_mean(std::string name, bool mean, bool all_dims) {
  return compute(
      std::move(name), [mean, all_dims](Lowerer& l, const Node& n) { lower_reduce(l, n, "sum", mean, all_dims); },
      claim_sum_mean);
}

OpEntry view(std::string name, Lowering lower, ClaimRule claim = takes_every_node) {
  OpEntry e;
  e.name = std::move(name);
  e.kind = OpKind::View;
  e.claim = claim;
  e.lower = std::move(lower);
  return e;
}

OpEntry extern_kernel(std::string name) {
  OpEntry e;
  e.name = std::move(name);
  e.kind = OpKind::Extern;
  e.claim = takes_every_node;
  e.lower = lower_extern;
  return e;
}

// An extern kernel that the CUDA kernels compute themselves where `claim` takes the node.
OpEntry cuda_scatter(OpEntry e, Lowering lower, ClaimRule claim) {
  e.cuda_lower = std::move(lower);
  e.cuda_claim = claim;
  return e;
}

std::vector<OpEntry> make_registry() {
  return {
      // ---- Pointwise ----
      unary("aten::neg", "neg"),
      unary("aten::relu", "relu"),
      unary("aten::sigmoid", "sigmoid"),
      unary("aten::tanh", "tanh"),
      unary("aten::exp", "exp"),
      unary("aten::log", "log"),
      unary("aten::sqrt", "sqrt"),
      unary("aten::rsqrt", "rsqrt"),
      unary("aten::abs", "abs"),
      unary("aten::reciprocal", "reciprocal"),
      unary("aten::erf", "erf"),
      compute("aten::silu", lower_silu),
      any_result(compute("aten::clone", lower_copy)),
      any_result(compute("aten::_to_copy", lower_copy, claim_to_copy)),
      binary("aten::add.Tensor", "add"),
      binary("aten::sub.Tensor", "sub"),
      binary("aten::mul.Tensor", "mul"),
      binary("aten::div.Tensor", "div"),
      binary("aten::maximum", "maximum"),
      binary("aten::minimum", "minimum"),
      binary("aten::rsub.Tensor", "sub", /*reversed=*/true),
      binary_scalar("aten::add.Scalar", "add"),
      binary_scalar("aten::sub.Scalar", "sub"),
      binary_scalar("aten::mul.Scalar", "mul"),
      binary_scalar("aten::div.Scalar", "div"),
      binary_scalar("aten::rsub.Scalar", "sub", /*reversed=*/true),
      with_numeric_scalar(compute("aten::pow.Tensor_Scalar", lower_pow, claim_pow)),
      binary_scalar("aten::clamp_min", "maximum"),
      binary_scalar("aten::clamp_max", "minimum"),
      compare("aten::eq.Tensor", "eq"),
      compare("aten::ne.Tensor", "ne"),
      compare("aten::lt.Tensor", "lt"),
      compare("aten::le.Tensor", "le"),
      compare("aten::gt.Tensor", "gt"),
      compare("aten::ge.Tensor", "ge"),
      compare_scalar("aten::eq.Scalar", "eq"),
      compare_scalar("aten::ne.Scalar", "ne"),
      compare_scalar("aten::lt.Scalar", "lt"),
      compare_scalar("aten::le.Scalar", "le"),
      compare_scalar("aten::gt.Scalar", "gt"),
      compare_scalar("aten::ge.Scalar", "ge"),
      compute("aten::clamp", lower_clamp, claim_clamp),
      compute(
          "aten::gelu", [](Lowerer& l, const Node& n) { lower_gelu(l, n, /*backward=*/false); }, claim_gelu),
      compute(
          "aten::gelu_backward", [](Lowerer& l, const Node& n) { lower_gelu(l, n, /*backward=*/true); }, claim_gelu),
      compute("aten::sigmoid_backward",
              [](Lowerer& l, const Node& n) { lower_sigmoid_tanh_backward(l, n, /*sigmoid=*/true); }),
      compute("aten::tanh_backward",
              [](Lowerer& l, const Node& n) { lower_sigmoid_tanh_backward(l, n, /*sigmoid=*/false); }),
      compute("aten::threshold_backward", lower_threshold_backward),
      any_result(compute("aten::where.self", lower_where)),
      compute("aten::addcmul", [](Lowerer& l, const Node& n) { lower_addc(l, n, "mul"); }),
      compute("aten::addcdiv", [](Lowerer& l, const Node& n) { lower_addc(l, n, "div"); }),
      compute("aten::lerp.Scalar", lower_lerp),
      any_result(compute("aten::fill.Scalar", lower_fill)),
      any_result(compute("aten::full", lower_fill)),
      any_result(compute("aten::full_like", lower_fill)),
      any_result(compute("aten::zeros", [](Lowerer& l, const Node& n) { lower_constant(l, n, 0.0); })),
      any_result(compute("aten::zeros_like", [](Lowerer& l, const Node& n) { lower_constant(l, n, 0.0); })),
      // Float results only, unlike ones_like: the rule as it has always been (an integer `ones`
      // stays with ATen).
      compute("aten::ones", [](Lowerer& l, const Node& n) { lower_constant(l, n, 1.0); }),
      any_result(compute("aten::ones_like", [](Lowerer& l, const Node& n) { lower_constant(l, n, 1.0); })),
      compute("aten::nll_loss_backward", lower_nll_loss_backward, claim_nll_loss),
      compute("aten::max_pool2d_with_indices", lower_max_pool2d_with_indices, claim_max_pool2d),
      compute("aten::embedding", lower_embedding, claim_embedding),

      // ---- Reductions and composites with reductions ----
      sum_or_mean("aten::sum.dim_IntList", /*mean=*/false, /*all_dims=*/false),
      sum_or_mean("aten::sum", /*mean=*/false, /*all_dims=*/true),
      sum_or_mean("aten::mean.dim", /*mean=*/true, /*all_dims=*/false),
      sum_or_mean("aten::mean", /*mean=*/true, /*all_dims=*/true),
      reduction("aten::amax", [](Lowerer& l, const Node& n) { lower_reduce(l, n, "max", false, false); }),
      reduction("aten::amin", [](Lowerer& l, const Node& n) { lower_reduce(l, n, "min", false, false); }),
      reduction("aten::_softmax", [](Lowerer& l, const Node& n) { lower_softmax(l, n, /*log=*/false); }),
      reduction("aten::_log_softmax", [](Lowerer& l, const Node& n) { lower_softmax(l, n, /*log=*/true); }),
      reduction("aten::_softmax_backward_data",
                [](Lowerer& l, const Node& n) { lower_softmax_backward(l, n, /*log=*/false); }),
      reduction("aten::_log_softmax_backward_data",
                [](Lowerer& l, const Node& n) { lower_softmax_backward(l, n, /*log=*/true); }),
      // Undefined results (gradients the step does not need) are refused by the common rules.
      reduction("aten::native_layer_norm", lower_layer_norm),
      reduction("aten::native_layer_norm_backward", lower_layer_norm_backward),
      reduction("aten::nll_loss_forward", lower_nll_loss_forward, claim_nll_loss),
      reduction("aten::_native_batch_norm_legit_functional", lower_batch_norm, claim_batch_norm),
      reduction("aten::native_batch_norm_backward", lower_batch_norm_backward, claim_batch_norm),

      // ---- Views: index math ----
      view("aten::t", lower_t),
      view("aten::permute", lower_permute),
      view("aten::transpose.int", lower_transpose),
      view("aten::expand", lower_expand, claim_expand),
      view("aten::unsqueeze", lower_unsqueeze),
      view("aten::squeeze.dim", [](Lowerer& l, const Node& n) { lower_squeeze(l, n, Squeeze::Dim); }),
      view("aten::squeeze.dims", [](Lowerer& l, const Node& n) { lower_squeeze(l, n, Squeeze::Dims); }),
      view("aten::squeeze", [](Lowerer& l, const Node& n) { lower_squeeze(l, n, Squeeze::AllOnes); }),
      view("aten::select.int", lower_select),
      view("aten::slice.Tensor", lower_slice),
      view("aten::view", lower_reshape),
      view("aten::_unsafe_view", lower_reshape),
      view("aten::reshape", lower_reshape),
      view("aten::alias", lower_same_index_view),
      view("aten::detach", lower_same_index_view),

      // ---- Extern kernels: ATen through call_eager ----
      extern_kernel("aten::mm"),
      extern_kernel("aten::addmm"),
      extern_kernel("aten::bmm"),
      extern_kernel("aten::baddbmm"),
      extern_kernel("aten::convolution"),
      extern_kernel("aten::convolution_backward"),
      extern_kernel("aten::_scaled_dot_product_flash_attention_for_cpu"),
      extern_kernel("aten::_scaled_dot_product_flash_attention_for_cpu_backward"),
      // A scatter-add of generated code on CUDA (tables of up to a few hundred rows), else ATen's.
      cuda_scatter(extern_kernel("aten::embedding_dense_backward"), lower_embedding_backward,
                   claim_embedding_backward_cuda),
  };
}

const std::map<std::string, const OpEntry*>& by_name() {
  static const std::map<std::string, const OpEntry*> m = [] {
    std::map<std::string, const OpEntry*> r;
    for (const OpEntry& e : op_registry())
      if (!r.emplace(e.name, &e).second) throw std::logic_error("inductor op table: " + e.name + " is listed twice");
    return r;
  }();
  return m;
}

}  // namespace

const std::vector<OpEntry>& op_registry() {
  static const std::vector<OpEntry> table = make_registry();
  return table;
}

const OpEntry* find_op(const std::string& op) {
  auto it = by_name().find(op);
  return it == by_name().end() ? nullptr : it->second;
}

}  // namespace kiln::inductor
