#include "op_catalogue.h"

#include <cmath>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include <ATen/ATen.h>

#include "kiln/internal/executor.h"
#include "kiln/internal/ir_text.h"

namespace kiln::conformance {

namespace {

using Fill = InputSpec::Fill;
using Layout = InputSpec::Layout;
constexpr auto f32 = c10::ScalarType::Float;
constexpr auto bf16 = c10::ScalarType::BFloat16;
constexpr auto f64 = c10::ScalarType::Double;
constexpr auto i64 = c10::ScalarType::Long;

// Shorthand for input specs: T({4,5}).t() is a transposed (non-contiguous) f32[4,5].
struct T : InputSpec {
  T(std::vector<int64_t> s, c10::ScalarType d = f32) {
    shape = std::move(s);
    dtype = d;
  }
  T& t() {
    layout = Layout::Transposed;
    return *this;
  }
  T& strided() {
    layout = Layout::Strided;
    return *this;
  }
  T& offset() {
    layout = Layout::Offset;
    return *this;
  }
  T& pos() {
    fill = Fill::Positive;
    return *this;
  }
  T& small() {
    fill = Fill::Small;
    return *this;
  }
  T& idx(int64_t bound) {
    fill = Fill::Index;
    index_bound = bound;
    dtype = i64;
    return *this;
  }
  T& boolean() {
    fill = Fill::Bool;
    dtype = c10::ScalarType::Bool;
    return *this;
  }
};

// A one-node variant: `call` reads %0.. and has `results` results.
OpVariant node(const std::string& family, const std::string& call, std::vector<InputSpec> inputs, int results = 1) {
  OpVariant v;
  v.family = family;
  v.op = call.substr(0, call.find('('));
  const size_t n = inputs.size();
  std::string lhs;
  for (int r = 0; r < results; ++r) lhs += (r ? ", %" : "%") + std::to_string(n + static_cast<size_t>(r));
  v.body = lhs + " = " + call;
  v.inputs = std::move(inputs);
  return v;
}

// The shapes every pointwise op runs over (one input).
std::vector<InputSpec> unary_shapes(Fill fill) {
  std::vector<T> s = {
      T({}),       T({0}),        T({1}),           T({1, 1}),          T({7}),          T({4, 5}),     T({2, 3, 4}),
      T({33, 65}), T({4, 5}).t(), T({9}).strided(), T({4, 5}).offset(), T({4, 5}, bf16), T({4, 5}, f64)};
  std::vector<InputSpec> out;
  for (auto& t : s) {
    t.fill = fill;
    out.push_back(t);
  }
  return out;
}

// Pairs for binary ops: same shape, broadcast both ways, 0-d with n-d, empty, non-contiguous,
// other dtypes and mixed dtypes (type promotion).
std::vector<std::pair<InputSpec, InputSpec>> binary_shapes(Fill second) {
  std::vector<std::pair<T, T>> s = {
      {T({4, 5}), T({4, 5})},
      {T({}), T({})},
      {T({1}), T({1})},
      {T({33, 65}), T({33, 65})},
      {T({4, 5}), T({5})},
      {T({4, 1}), T({1, 5})},
      {T({}), T({4, 5})},
      {T({4, 5}), T({1})},
      {T({0, 5}), T({5})},
      {T({4, 5}).t(), T({4, 5})},
      {T({4, 5}), T({4, 5}).offset()},
      {T({9}).strided(), T({9})},
      {T({4, 5}, bf16), T({4, 5}, bf16)},
      {T({4, 5}, f64), T({4, 5}, f64)},
      {T({4, 5}), T({4, 5}, bf16)},
  };
  std::vector<std::pair<InputSpec, InputSpec>> out;
  for (auto& [a, b] : s) {
    b.fill = second;
    out.emplace_back(a, b);
  }
  return out;
}

// A one-node variant whose run-time scalar $0 is argument `arg`, drawn from [lo, hi].
OpVariant scalar_node(const std::string& family, const std::string& call, std::vector<InputSpec> inputs,
                      ScalarSpec scalar) {
  OpVariant v = node(family, call, std::move(inputs));
  v.scalars = {std::move(scalar)};
  return v;
}

// Run-time scalars: every op and argument kiln marks as one and knows how to lift
// (core/src/passes/lift_runtime_scalars.cpp: add, sub, mul, div, addcdiv, addcmul, lerp, pow, fill),
// and the optimizer chains where several of them meet in one group. The value in the body is the
// capture's; each execute after the first hands the plugin another.
std::vector<OpVariant> runtime_scalar_variants() {
  std::vector<OpVariant> c;
  auto spec = [](std::string arg, double lo, double hi, bool integer = false) {
    return ScalarSpec{std::move(arg), integer, lo, hi};
  };
  // One tensor and the scalar: 0-d, odd sizes, non-contiguous, every training dtype.
  const std::vector<T> one = {T({4, 5}), T({}), T({33, 65}).t(), T({4, 5}, bf16), T({4, 5}, f64)};
  const std::vector<std::tuple<std::string, ScalarSpec, Fill>> unary = {
      {"aten::mul.Scalar(%0, $0:scalar(0.5))", spec("other", -2, 2), Fill::Normal},
      {"aten::div.Scalar(%0, $0:scalar(0.5))", spec("other", 0.25, 4), Fill::Normal},
      {"aten::add.Scalar(%0, $0:scalar(1.5), scalar(1))", spec("other", -2, 2), Fill::Normal},
      {"aten::add.Scalar(%0, scalar(1.5), $0:scalar(0.5))", spec("alpha", -2, 2), Fill::Normal},
      {"aten::sub.Scalar(%0, $0:scalar(1.5), scalar(1))", spec("other", -2, 2), Fill::Normal},
      {"aten::sub.Scalar(%0, scalar(1.5), $0:scalar(0.5))", spec("alpha", -2, 2), Fill::Normal},
      {"aten::pow.Tensor_Scalar(%0, $0:scalar(2.0))", spec("exponent", 0.5, 3), Fill::Positive},
  };
  for (const auto& [call, scalar, fill] : unary)
    for (T t : one) {
      t.fill = fill;
      c.push_back(scalar_node("RuntimeScalars", call, {t}, scalar));
    }
  for (const T& t : {T({4, 5}), T({}), T({4, 5}, bf16)})
    c.push_back(scalar_node("RuntimeScalars", "aten::fill.Scalar(%0, $0:scalar(1.5))", {t}, spec("value", -2, 2)));
  // Two or three tensors and the scalar: same shapes and broadcast, bf16 and f64.
  const std::vector<std::pair<T, T>> two = {{T({4, 5}), T({4, 5})},
                                            {T({4, 5}), T({5})},
                                            {T({4, 5}, bf16), T({4, 5}, bf16)},
                                            {T({4, 5}, f64), T({4, 5}, f64)}};
  for (const auto& call : {"aten::add.Tensor(%0, %1, $0:scalar(0.5))", "aten::sub.Tensor(%0, %1, $0:scalar(0.5))"})
    for (const auto& [a, b] : two) c.push_back(scalar_node("RuntimeScalars", call, {a, b}, spec("alpha", -2, 2)));
  for (const auto& [a, b] : two)
    c.push_back(
        scalar_node("RuntimeScalars", "aten::lerp.Scalar(%0, %1, $0:scalar(0.1))", {a, b}, spec("weight", 0, 1)));
  for (const T& t : {T({4, 5}), T({33, 65}), T({4, 5}, bf16), T({4, 5}, f64)}) {
    T pos = t;
    pos.fill = Fill::Positive;
    c.push_back(
        scalar_node("RuntimeScalars", "aten::addcmul(%0, %1, %2, $0:scalar(0.5))", {t, t, t}, spec("value", -2, 2)));
    c.push_back(scalar_node("RuntimeScalars", "aten::addcdiv(%0, %1, %2, $0:scalar(-0.01))", {t, t, pos},
                            spec("value", -2, 2)));
  }
  // An int scalar (KILN_ARG_INT in the execute's scalars, not DOUBLE).
  c.push_back(scalar_node("RuntimeScalars", "aten::add.Tensor(%0, %1, $0:scalar(2))", {T({4, 5}), T({4, 5})},
                          spec("alpha", -5, 5, true)));
  c.push_back(
      scalar_node("RuntimeScalars", "aten::mul.Scalar(%0, $0:scalar(3))", {T({4, 5})}, spec("other", -5, 5, true)));

  // Several scalars in one group, as optimizers make them. The indices are the step's, not the
  // group's: AdamW's update reads $2 before $0 and $1, and the SGD group reads only $1 of two.
  for (const T& t : {T({33, 65}), T({4, 5}, f64)}) {
    T pos = t;
    pos.fill = Fill::Positive;
    OpVariant adamw;
    adamw.family = "RuntimeScalarChains";
    adamw.op = "adamw update";
    adamw.inputs = {t, t, t, pos};  // param, grad, exp_avg, exp_avg_sq
    adamw.scalars = {spec("step_size", -0.5, -0.001), spec("bias_correction2_sqrt", 0.05, 1),
                     spec("decay", 0.9, 0.9999)};
    adamw.body =
        "%4 = aten::mul.Scalar(%0, $2:scalar(0.999))\n"
        "%5 = aten::lerp.Scalar(%2, %1, scalar(0.1))\n"
        "%6 = aten::mul.Scalar(%3, scalar(0.999))\n"
        "%7 = aten::addcmul(%6, %1, %1, scalar(0.001))\n"
        "%8 = aten::sqrt(%7)\n"
        "%9 = aten::div.Scalar(%8, $1:scalar(0.0316))\n"
        "%10 = aten::add.Scalar(%9, scalar(1e-08), scalar(1))\n"
        "%11 = aten::addcdiv(%4, %5, %10, $0:scalar(-0.01))";
    c.push_back(adamw);

    OpVariant sgd;
    sgd.family = "RuntimeScalarChains";
    sgd.op = "sgd update with a scheduled lr";
    sgd.inputs = {t, t, t};  // param, grad, momentum buffer
    sgd.scalars = {spec("weight_decay", 0, 0.1), spec("neg_lr", -0.5, -0.001)};
    sgd.body =
        "%3 = aten::mul.Scalar(%2, scalar(0.9))\n"
        "%4 = aten::add.Tensor(%3, %1, scalar(1))\n"
        "%5 = aten::add.Tensor(%0, %4, $1:scalar(-0.01))";
    c.push_back(sgd);
  }
  return c;
}

std::vector<OpVariant> build_catalogue() {
  std::vector<OpVariant> c;
  auto add = [&](OpVariant v) { c.push_back(std::move(v)); };

  // ---- Pointwise, one tensor ----
  const std::vector<std::pair<std::string, Fill>> unary = {
      {"aten::relu(%0)", Fill::Normal},
      {"aten::neg(%0)", Fill::Normal},
      {"aten::exp(%0)", Fill::Normal},
      {"aten::log(%0)", Fill::Positive},
      {"aten::sqrt(%0)", Fill::Positive},
      {"aten::rsqrt(%0)", Fill::Positive},
      {"aten::sigmoid(%0)", Fill::Normal},
      {"aten::tanh(%0)", Fill::Normal},
      {"aten::abs(%0)", Fill::Normal},
      {"aten::reciprocal(%0)", Fill::Positive},
      {"aten::gelu(%0, \"none\")", Fill::Normal},
      {"aten::gelu(%0, \"tanh\")", Fill::Normal},
      {"aten::mul.Scalar(%0, scalar(0.5))", Fill::Normal},
      {"aten::add.Scalar(%0, scalar(1.5), scalar(1))", Fill::Normal},
      {"aten::pow.Tensor_Scalar(%0, scalar(2))", Fill::Normal},
      {"aten::pow.Tensor_Scalar(%0, scalar(0.5))", Fill::Positive},
  };
  for (const auto& [call, fill] : unary)
    for (const auto& s : unary_shapes(fill)) add(node("UnaryPointwise", call, {s}));

  // ---- Pointwise, two tensors ----
  const std::vector<std::pair<std::string, Fill>> binary = {
      {"aten::add.Tensor(%0, %1, scalar(1))", Fill::Normal}, {"aten::add.Tensor(%0, %1, scalar(0.5))", Fill::Normal},
      {"aten::sub.Tensor(%0, %1, scalar(1))", Fill::Normal}, {"aten::mul.Tensor(%0, %1)", Fill::Normal},
      {"aten::div.Tensor(%0, %1)", Fill::Positive},          {"aten::maximum(%0, %1)", Fill::Normal},
  };
  for (const auto& [call, fill] : binary)
    for (const auto& [a, b] : binary_shapes(fill)) add(node("BinaryPointwise", call, {a, b}));

  // ---- Backward pointwise (grad, saved) ----
  const std::vector<std::pair<std::string, Fill>> backward = {
      {"aten::threshold_backward(%0, %1, scalar(0))", Fill::Normal},
      {"aten::sigmoid_backward(%0, %1)", Fill::Normal},
      {"aten::tanh_backward(%0, %1)", Fill::Normal},
      {"aten::gelu_backward(%0, %1, \"none\")", Fill::Normal},
      {"aten::gelu_backward(%0, %1, \"tanh\")", Fill::Normal},
  };
  for (const auto& [call, fill] : backward)
    for (const auto& s : unary_shapes(fill)) {
      InputSpec grad = s;
      InputSpec saved = s;
      saved.layout = Layout::Contiguous;
      add(node("BackwardPointwise", call, {grad, saved}));
    }

  // ---- Optimizer updates and selection ----
  for (const auto& s : unary_shapes(Fill::Normal)) {
    InputSpec p = s, pos = s;
    pos.fill = Fill::Positive;
    add(node("OptimizerPointwise", "aten::addcmul(%0, %1, %2, scalar(0.5))", {s, s, s}));
    add(node("OptimizerPointwise", "aten::addcdiv(%0, %1, %2, scalar(-0.01))", {s, s, pos}));
    add(node("OptimizerPointwise", "aten::lerp.Scalar(%0, %1, scalar(0.1))", {s, p}));
    InputSpec cond = s;
    cond.fill = Fill::Bool;
    cond.dtype = c10::ScalarType::Bool;
    add(node("OptimizerPointwise", "aten::where.self(%0, %1, %2)", {cond, s, s}));
  }
  add(node("OptimizerPointwise", "aten::where.self(%0, %1, %2)", {T({4, 1}).boolean(), T({5}), T({4, 5})}));

  // ---- Reductions ----
  for (const auto& t :
       {T({4, 5}), T({33, 65}), T({2, 3, 4}), T({4, 5}).t(), T({0, 5}), T({1, 1}), T({4, 5}, bf16), T({4, 5}, f64)}) {
    const std::string last = std::to_string(static_cast<int64_t>(t.shape.size()) - 1);
    add(node("Reductions", "aten::sum(%0, None)", {t}));
    add(node("Reductions", "aten::sum.dim_IntList(%0, i[0], false, None)", {t}));
    add(node("Reductions", "aten::sum.dim_IntList(%0, i[-1], true, None)", {t}));
    add(node("Reductions", "aten::mean.dim(%0, i[" + last + "], false, None)", {t}));
    if (t.shape[0] != 0) add(node("Reductions", "aten::amax(%0, i[-1], true)", {t}));
  }
  add(node("Reductions", "aten::sum(%0, None)", {T({})}));
  add(node("Reductions", "aten::sum(%0, None)", {T({1000})}));
  add(node("Reductions", "aten::sum.dim_IntList(%0, i[0, 2], false, None)", {T({2, 3, 4})}));

  // ---- Softmax ----
  for (const auto& t : {T({4, 5}), T({33, 65}), T({2, 3, 4}), T({4, 5}).t(), T({1, 1}), T({4, 5}, f64)}) {
    const std::string last = std::to_string(static_cast<int64_t>(t.shape.size()) - 1);
    add(node("Softmax", "aten::_softmax(%0, " + last + ", false)", {t}));
    add(node("Softmax", "aten::_log_softmax(%0, " + last + ", false)", {t}));
    add(node("Softmax", "aten::_softmax(%0, 0, false)", {t}));
    InputSpec g = t;
    g.layout = Layout::Contiguous;
    add(node("Softmax",
             "aten::_softmax_backward_data(%0, %1, " + last + ", dtype(" + std::string(t.dtype == f64 ? "f64" : "f32") +
                 "))",
             {g, g}));
    add(node("Softmax",
             "aten::_log_softmax_backward_data(%0, %1, " + last + ", dtype(" +
                 std::string(t.dtype == f64 ? "f64" : "f32") + "))",
             {g, g}));
  }
  add(node("Softmax", "aten::_softmax(%0, 1, false)", {T({4, 5}, bf16)}));

  // ---- Layer norm ----
  for (int64_t n : {5, 64, 1}) {
    const std::string ns = "i[" + std::to_string(n) + "]";
    add(node("LayerNorm", "aten::native_layer_norm(%0, " + ns + ", %1, %2, 1e-05)", {T({4, n}), T({n}), T({n})}, 3));
    add(node("LayerNorm", "aten::native_layer_norm(%0, " + ns + ", None, None, 1e-05)", {T({2, 3, n})}, 3));
    add(node("LayerNorm", "aten::native_layer_norm_backward(%0, %1, " + ns + ", %2, %3, %4, %5, b[true, true, true])",
             {T({4, n}), T({4, n}), T({4, 1}), T({4, 1}).pos(), T({n}), T({n})}, 3));
  }

  // ---- Losses ----
  for (int64_t classes : {10, 1}) {
    add(node("NllLoss", "aten::nll_loss_forward(%0, %1, None, 1, -100)", {T({8, classes}), T({8}).idx(classes)}, 2));
    add(node("NllLoss", "aten::nll_loss_forward(%0, %1, None, 2, -100)", {T({8, classes}), T({8}).idx(classes)}, 2));
    add(node("NllLoss", "aten::nll_loss_backward(%0, %1, %2, None, 1, -100, %3)",
             {T({}), T({8, classes}), T({8}).idx(classes), T({}).pos()}));
  }

  // ---- Matmul ----
  for (const auto& [a, b] : std::vector<std::pair<T, T>>{{T({4, 5}), T({5, 3})},
                                                         {T({33, 65}), T({65, 17})},
                                                         {T({4, 5}).t(), T({5, 3})},
                                                         {T({4, 5}), T({5, 3}).t()},
                                                         {T({1, 1}), T({1, 1})},
                                                         {T({0, 5}), T({5, 3})},
                                                         {T({4, 0}), T({0, 3})},
                                                         {T({4, 5}, f64), T({5, 3}, f64)},
                                                         {T({4, 5}, bf16), T({5, 3}, bf16)}}) {
    OpVariant v = node("Matmul", "aten::mm(%0, %1)", {a, b});
    v.matmul_like = true;
    add(v);
    T bias({b.shape[1]}, b.dtype);
    OpVariant w = node("Matmul", "aten::addmm(%0, %1, %2, scalar(1), scalar(1))", {bias, a, b});
    w.matmul_like = true;
    add(w);
  }
  {
    OpVariant v = node("Matmul", "aten::addmm(%0, %1, %2, scalar(0.5), scalar(2))", {T({4, 3}), T({4, 5}), T({5, 3})});
    v.matmul_like = true;
    add(v);
    OpVariant b = node("Matmul", "aten::bmm(%0, %1)", {T({3, 4, 5}), T({3, 5, 2})});
    b.matmul_like = true;
    add(b);
  }

  // ---- Layout ----
  for (const auto& t : {T({4, 5}), T({4, 5}).t(), T({0, 5}), T({4, 5}, bf16)}) {
    add(node("Layout", "aten::permute(%0, i[1, 0])", {t}));
    add(node("Layout", "aten::clone(%0, None)", {t}));
    add(node("Layout", "aten::clone(%0, memory_format(0))", {t}));
    add(node("Layout", "aten::_to_copy(%0, dtype(f64), None, None, None, false, None)", {t}));
    add(node("Layout", "aten::_to_copy(%0, dtype(bf16), None, None, None, false, None)", {t}));
  }
  add(node("Layout", "aten::view(%0, i[20])", {T({4, 5})}));
  add(node("Layout", "aten::view(%0, i[2, 2, 5])", {T({4, 5})}));
  add(node("Layout", "aten::expand(%0, i[4, 5], false)", {T({4, 1})}));
  add(node("Layout", "aten::expand(%0, i[3, 4, 5], false)", {T({5})}));
  add(node("Layout", "aten::full(i[4, 5], scalar(1.5), dtype(f32), layout(0), device(\"{dev}\"), false)", {}));
  add(node("Layout", "aten::full(i[], scalar(0), dtype(f32), layout(0), device(\"{dev}\"), false)", {}));
  add(node("Layout", "aten::cat(t[%0, %1], 0)", {T({2, 5}), T({3, 5})}));
  add(node("Layout", "aten::cat(t[%0, %1], 1)", {T({4, 2}), T({4, 3})}));

  // ---- Embedding ----
  add(node("Embedding", "aten::embedding(%0, %1, -1, false, false)", {T({10, 6}), T({4, 7}).idx(10)}));
  add(node("Embedding", "aten::embedding(%0, %1, -1, false, false)", {T({10, 6}), T({0}).idx(10)}));
  add(node("Embedding", "aten::embedding_dense_backward(%0, %1, 10, -1, false)", {T({4, 7, 6}), T({4, 7}).idx(10)}));

  // ---- Convolution and pooling (NCHW) ----
  add(node("Convolution", "aten::convolution(%0, %1, %2, i[1, 1], i[1, 1], i[1, 1], false, i[0, 0], 1)",
           {T({2, 3, 8, 8}), T({4, 3, 3, 3}), T({4})}));
  add(node("Convolution", "aten::convolution(%0, %1, None, i[2, 2], i[0, 0], i[1, 1], false, i[0, 0], 1)",
           {T({2, 3, 9, 9}), T({4, 3, 3, 3})}));
  add(node(
      "Convolution",
      "aten::convolution_backward(%0, %1, %2, i[4], i[1, 1], i[1, 1], i[1, 1], false, i[0, 0], 1, b[true, true, true])",
      {T({2, 4, 8, 8}), T({2, 3, 8, 8}), T({4, 3, 3, 3})}, 3));
  add(node("Convolution", "aten::max_pool2d_with_indices(%0, i[2, 2], i[2, 2], i[0, 0], i[1, 1], false)",
           {T({2, 3, 8, 8})}, 2));

  // ---- Chains: what a fusing backend fuses ----
  {
    OpVariant v;
    v.family = "FusedChains";
    v.op = "addmm+relu+mul+sum";
    v.inputs = {T({16}), T({8, 12}), T({12, 16}), T({8, 16})};
    v.body =
        "%4 = aten::addmm(%0, %1, %2, scalar(1), scalar(1))\n"
        "%5 = aten::relu(%4)\n"
        "%6 = aten::mul.Tensor(%5, %3)\n"
        "%7 = aten::sum(%6, None)";
    v.matmul_like = true;
    add(v);
  }
  {
    OpVariant v;
    v.family = "FusedChains";
    v.op = "sgd momentum update";
    v.inputs = {T({33, 65}), T({33, 65}), T({33, 65})};
    v.body =
        "%3 = aten::mul.Scalar(%2, scalar(0.9))\n"
        "%4 = aten::add.Tensor(%3, %1, scalar(1))\n"
        "%5 = aten::add.Tensor(%0, %4, scalar(-0.01))";
    add(v);
  }
  {
    OpVariant v;
    v.family = "FusedChains";
    v.op = "log_softmax+nll_loss";
    v.inputs = {T({8, 10}), T({8}).idx(10)};
    v.body =
        "%2 = aten::_log_softmax(%0, 1, false)\n"
        "%3, %4 = aten::nll_loss_forward(%2, %1, None, 1, -100)";
    add(v);
  }
  {
    OpVariant v;
    v.family = "FusedChains";
    v.op = "broadcast chain with a non-contiguous input";
    v.inputs = {T({4, 5}).t(), T({5}), T({4, 1})};
    v.body =
        "%3 = aten::add.Tensor(%0, %1, scalar(1))\n"
        "%4 = aten::tanh(%3)\n"
        "%5 = aten::mul.Tensor(%4, %2)\n"
        "%6 = aten::neg(%5)";
    add(v);
  }
  for (auto& v : runtime_scalar_variants()) add(std::move(v));
  return c;
}

std::string short_type(const InputSpec& s) {
  std::string t = ir::dtype_short_name(s.dtype);
  t += "[";
  for (size_t i = 0; i < s.shape.size(); ++i) t += (i ? "," : "") + std::to_string(s.shape[i]);
  t += "]";
  switch (s.layout) {
    case Layout::Transposed: t += " transposed"; break;
    case Layout::Strided: t += " strided"; break;
    case Layout::Offset: t += " offset"; break;
    default: break;
  }
  return t;
}

at::Tensor make_input(const InputSpec& s, const c10::Device& device) {
  // The storage is made contiguous in a shape chosen so that the final view has the layout asked.
  std::vector<int64_t> storage_shape = s.shape;
  if (s.layout == Layout::Transposed && s.shape.size() >= 2)
    std::swap(storage_shape[storage_shape.size() - 1], storage_shape[storage_shape.size() - 2]);
  if (s.layout == Layout::Strided && !s.shape.empty()) storage_shape[0] *= 2;
  if (s.layout == Layout::Offset && !s.shape.empty()) storage_shape[0] += 1;
  const auto opts = at::TensorOptions(device);
  at::Tensor t;
  switch (s.fill) {
    case Fill::Normal: t = at::randn(storage_shape, opts.dtype(at::kDouble)); break;
    case Fill::Small: t = at::randn(storage_shape, opts.dtype(at::kDouble)) * 0.1; break;
    case Fill::Positive: t = at::rand(storage_shape, opts.dtype(at::kDouble)) * 1.5 + 0.5; break;
    case Fill::Index: t = at::randint(std::max<int64_t>(s.index_bound, 1), storage_shape, opts.dtype(at::kLong)); break;
    case Fill::Bool: t = at::rand(storage_shape, opts.dtype(at::kDouble)) > 0.5; break;
  }
  t = t.to(s.dtype);
  switch (s.layout) {
    case Layout::Transposed:
      if (s.shape.size() >= 2) t = t.transpose(-1, -2);
      break;
    case Layout::Strided:
      if (!s.shape.empty()) t = t.slice(0, 0, storage_shape[0], 2);
      break;
    case Layout::Offset:
      if (!s.shape.empty()) t = t.slice(0, 1, storage_shape[0]);
      break;
    default: break;
  }
  return t;
}

}  // namespace

std::string OpVariant::label() const {
  std::string s = op + "(";
  for (size_t i = 0; i < inputs.size(); ++i) s += (i ? ", " : "") + short_type(inputs[i]);
  // The run-time scalars the body reads (a group may read only some of the step's).
  for (size_t k = 0; k < scalars.size(); ++k)
    if (body.find("$" + std::to_string(k) + ":") != std::string::npos)
      s += ", " + scalars[k].arg + "=$" + std::to_string(k);
  return s + ")";
}

std::vector<OpVariant> op_catalogue(const std::string& family) {
  static const std::vector<OpVariant> all = build_catalogue();
  if (family.empty()) return all;
  std::vector<OpVariant> out;
  for (const auto& v : all)
    if (v.family == family) out.push_back(v);
  return out;
}

std::vector<std::string> op_families() {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& v : op_catalogue())
    if (seen.insert(v.family).second) out.push_back(v.family);
  return out;
}

std::vector<at::Tensor> make_inputs(const OpVariant& v, const c10::Device& device) {
  std::vector<at::Tensor> out;
  for (const auto& s : v.inputs) out.push_back(make_input(s, device));
  return out;
}

ir::Graph build_graph(const OpVariant& v, const std::vector<at::Tensor>& sample) {
  std::ostringstream text;
  text << "graph {\n";
  for (size_t k = 0; k < v.scalars.size(); ++k)
    text << "  scalar $" << k << " " << (v.scalars[k].integer ? "int" : "float") << " \"" << v.scalars[k].arg << "\"\n";
  for (size_t i = 0; i < sample.size(); ++i) {
    ir::TensorMeta m;
    m.dtype = sample[i].scalar_type();
    m.shape = sample[i].sizes().vec();
    m.strides = sample[i].strides().vec();
    m.storage_offset = sample[i].storage_offset();
    m.device = sample[i].device();
    text << "  input %" << i << " : " << ir::print_type(m) << " input \"x" << i << "\"\n";
  }
  const std::string dev = sample.empty() ? "cpu" : sample[0].device().str();
  std::vector<std::string> last_results;
  std::istringstream body(v.body);
  std::string line;
  while (std::getline(body, line)) {
    const size_t eq = line.find(" = ");
    std::string lhs = line.substr(0, eq), rhs = line.substr(eq + 3);
    for (size_t p; (p = rhs.find("{dev}")) != std::string::npos;) rhs.replace(p, 5, dev);
    std::vector<std::string> results;
    std::istringstream ls(lhs);
    std::string r;
    std::string typed;
    while (std::getline(ls, r, ',')) {
      r.erase(0, r.find_first_not_of(' '));
      results.push_back(r);
      typed += (typed.empty() ? "" : ", ") + r + " : f32[]{}";
    }
    text << "  " << typed << " = " << rhs << "\n";
    last_results = results;
  }
  for (size_t k = 0; k < last_results.size(); ++k)
    text << "  output " << last_results[k] << " result \"out" << k << "\"\n";
  text << "}\n";
  ir::Graph g = ir::parse(text.str());
  // Result types: run the nodes once.
  std::vector<at::Tensor> env(g.values.size());
  for (size_t i = 0; i < sample.size(); ++i) env[g.inputs[i].value] = sample[i];
  const std::vector<c10::IValue> scalars = captured_scalars(g);
  for (const auto& n : g.nodes) {
    EagerExecutor::run_node(n, env, &scalars);
    for (auto o : n.outputs) {
      const at::Tensor& t = env[o];
      auto& m = g.value(o).meta;
      m.dtype = t.scalar_type();
      m.shape = t.sizes().vec();
      m.strides = t.strides().vec();
      m.storage_offset = 0;
      m.device = t.device();
    }
  }
  g.verify();
  return g;
}

std::vector<c10::IValue> captured_scalars(const ir::Graph& g) {
  std::vector<c10::IValue> out(g.scalar_inputs.size());
  for (const auto& n : g.nodes)
    for (const auto& a : n.args)
      if (a.scalar_input >= 0)
        out.at(static_cast<size_t>(a.scalar_input)) = a.kind == ir::Arg::Kind::Double ? c10::IValue(a.d)
                                                      : a.kind == ir::Arg::Kind::Bool ? c10::IValue(a.i != 0)
                                                                                      : c10::IValue(a.i);
  // A scalar of the step that no node of this graph reads still has a value to pass.
  for (size_t k = 0; k < out.size(); ++k)
    if (out[k].isNone())
      out[k] = g.scalar_inputs[k].kind == ir::Arg::Kind::Int ? c10::IValue(int64_t{1}) : c10::IValue(1.0);
  return out;
}

std::vector<c10::IValue> make_scalars(const OpVariant& v, const std::vector<c10::IValue>& previous) {
  std::vector<c10::IValue> out;
  for (size_t k = 0; k < v.scalars.size(); ++k) {
    const ScalarSpec& s = v.scalars[k];
    const c10::IValue* last = k < previous.size() ? &previous[k] : nullptr;
    // Drawn from LibTorch's generator, so that --seed repeats them with the inputs.
    for (;;) {
      const double u = at::rand({1}, at::kDouble).item<double>();
      const c10::IValue x = s.integer ? c10::IValue(static_cast<int64_t>(std::floor(s.lo + u * (s.hi - s.lo + 1))))
                                      : c10::IValue(s.lo + u * (s.hi - s.lo));
      if (last && last->isScalar() && x.toScalar().toDouble() == last->toScalar().toDouble()) continue;
      out.push_back(x);
      break;
    }
  }
  return out;
}

}  // namespace kiln::conformance
