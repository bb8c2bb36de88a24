// The inductor's op registry on its own, without LibTorch: exactly the listed ops are claimed, each
// with a claim rule and a lowering, and each under the common claim rules of its kind (which
// results it computes in, which scalars it needs as numbers, which inputs must not be empty).
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "lowering.h"
#include "op_registry.h"
#include "ops.h"

using namespace kiln::inductor;

namespace {

using Names = std::set<std::string>;

const Names kViews = {"aten::t",          "aten::permute",      "aten::transpose.int", "aten::expand",
                      "aten::unsqueeze",  "aten::squeeze.dim",  "aten::squeeze.dims",  "aten::squeeze",
                      "aten::select.int", "aten::slice.Tensor", "aten::view",          "aten::_unsafe_view",
                      "aten::reshape",    "aten::alias",        "aten::detach"};

const Names kExterns = {"aten::mm",
                        "aten::addmm",
                        "aten::bmm",
                        "aten::baddbmm",
                        "aten::convolution",
                        "aten::convolution_backward",
                        "aten::_scaled_dot_product_flash_attention_for_cpu",
                        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                        "aten::embedding_dense_backward"};

const Names kCompareScalar = {"aten::eq.Scalar", "aten::ne.Scalar", "aten::lt.Scalar",
                              "aten::le.Scalar", "aten::gt.Scalar", "aten::ge.Scalar"};
const Names kCompareTensor = {"aten::eq.Tensor", "aten::ne.Tensor", "aten::lt.Tensor",
                              "aten::le.Tensor", "aten::gt.Tensor", "aten::ge.Tensor"};
const Names kBinaryScalar = {"aten::add.Scalar",  "aten::sub.Scalar",        "aten::mul.Scalar", "aten::div.Scalar",
                             "aten::rsub.Scalar", "aten::pow.Tensor_Scalar", "aten::clamp_min",  "aten::clamp_max"};

// Generated code: pointwise ops and reductions.
const Names kCompute = [] {
  Names n = {"aten::neg",
             "aten::relu",
             "aten::sigmoid",
             "aten::tanh",
             "aten::exp",
             "aten::log",
             "aten::sqrt",
             "aten::rsqrt",
             "aten::abs",
             "aten::reciprocal",
             "aten::erf",
             "aten::silu",
             "aten::clone",
             "aten::_to_copy",
             "aten::add.Tensor",
             "aten::sub.Tensor",
             "aten::mul.Tensor",
             "aten::div.Tensor",
             "aten::maximum",
             "aten::minimum",
             "aten::rsub.Tensor",
             "aten::clamp",
             "aten::gelu",
             "aten::gelu_backward",
             "aten::sigmoid_backward",
             "aten::tanh_backward",
             "aten::threshold_backward",
             "aten::where.self",
             "aten::addcmul",
             "aten::addcdiv",
             "aten::lerp.Scalar",
             "aten::fill.Scalar",
             "aten::full",
             "aten::zeros",
             "aten::ones",
             "aten::zeros_like",
             "aten::ones_like",
             "aten::full_like",
             "aten::nll_loss_backward",
             "aten::max_pool2d_with_indices",
             "aten::embedding",
             "aten::sum.dim_IntList",
             "aten::sum",
             "aten::mean.dim",
             "aten::mean",
             "aten::amax",
             "aten::amin",
             "aten::_softmax",
             "aten::_log_softmax",
             "aten::_softmax_backward_data",
             "aten::_log_softmax_backward_data",
             "aten::native_layer_norm",
             "aten::native_layer_norm_backward",
             "aten::nll_loss_forward",
             "aten::_native_batch_norm_legit_functional",
             "aten::native_batch_norm_backward"};
  for (const auto* set : {&kCompareScalar, &kCompareTensor, &kBinaryScalar}) n.insert(set->begin(), set->end());
  return n;
}();

// Generated code whose result may be an integer or bool: copies, selects, fills, comparisons.
const Names kAnyResult = [] {
  Names n = {"aten::clone",     "aten::_to_copy", "aten::where.self", "aten::fill.Scalar", "aten::full",
             "aten::full_like", "aten::zeros",    "aten::zeros_like", "aten::ones_like"};
  for (const auto* set : {&kCompareScalar, &kCompareTensor}) n.insert(set->begin(), set->end());
  return n;
}();

const Names kNumericScalar = [] {
  Names n = kBinaryScalar;
  n.insert(kCompareScalar.begin(), kCompareScalar.end());
  return n;
}();

const Names kNonemptyInputs = {"aten::amax",
                               "aten::amin",
                               "aten::_softmax",
                               "aten::_log_softmax",
                               "aten::_softmax_backward_data",
                               "aten::_log_softmax_backward_data",
                               "aten::native_layer_norm",
                               "aten::native_layer_norm_backward",
                               "aten::nll_loss_forward",
                               "aten::_native_batch_norm_legit_functional",
                               "aten::native_batch_norm_backward"};

const Names kOwnClaimRule = {"aten::_to_copy",
                             "aten::embedding",
                             "aten::_native_batch_norm_legit_functional",
                             "aten::native_batch_norm_backward",
                             "aten::sum.dim_IntList",
                             "aten::sum",
                             "aten::mean.dim",
                             "aten::mean",
                             "aten::gelu",
                             "aten::gelu_backward",
                             "aten::nll_loss_forward",
                             "aten::nll_loss_backward",
                             "aten::expand",
                             "aten::max_pool2d_with_indices",
                             "aten::pow.Tensor_Scalar",
                             "aten::clamp"};

}  // namespace

TEST(InductorRegistry, ListsExactlyTheOpsTheInductorClaimsEachOnce) {
  Names expected = kCompute;
  expected.insert(kViews.begin(), kViews.end());
  expected.insert(kExterns.begin(), kExterns.end());
  Names listed;
  for (const OpEntry& e : op_registry()) EXPECT_TRUE(listed.insert(e.name).second) << e.name << " is listed twice";
  EXPECT_EQ(listed, expected);
  EXPECT_EQ(op_registry().size(), 100u);
}

TEST(InductorRegistry, EveryOpHasAClaimRuleAndALowering) {
  for (const OpEntry& e : op_registry()) {
    EXPECT_NE(e.claim, nullptr) << e.name;
    EXPECT_TRUE(static_cast<bool>(e.lower)) << e.name;
  }
}

TEST(InductorRegistry, EachOpFollowsTheCommonClaimRulesOfItsKind) {
  for (const OpEntry& e : op_registry()) {
    const OpKind kind = kViews.count(e.name) ? OpKind::View : kExterns.count(e.name) ? OpKind::Extern : OpKind::Compute;
    EXPECT_EQ(e.kind, kind) << e.name;
    EXPECT_EQ(e.float_result, kind == OpKind::Compute && !kAnyResult.count(e.name)) << e.name;
    EXPECT_EQ(e.numeric_scalar, kNumericScalar.count(e.name) == 1) << e.name;
    EXPECT_EQ(e.nonempty_inputs, kNonemptyInputs.count(e.name) == 1) << e.name;
    EXPECT_EQ(e.claim != &takes_every_node, kOwnClaimRule.count(e.name) == 1) << e.name;
  }
}

TEST(InductorRegistry, LookupFindsEachEntryAndNothingElse) {
  for (const OpEntry& e : op_registry()) {
    EXPECT_EQ(find_op(e.name), &e) << e.name;
    EXPECT_EQ(is_view_op(e.name), e.kind == OpKind::View) << e.name;
    EXPECT_EQ(is_extern_op(e.name), e.kind == OpKind::Extern) << e.name;
  }
  // Random ops, data-dependent ops and overloads the table does not list are not taken.
  for (const char* op : {"aten::bernoulli.p", "aten::nonzero", "aten::add.out", "aten::relu_", "relu", ""}) {
    EXPECT_EQ(find_op(op), nullptr) << op;
    EXPECT_FALSE(is_view_op(op)) << op;
    EXPECT_FALSE(is_extern_op(op)) << op;
  }
}
