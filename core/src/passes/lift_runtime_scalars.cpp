// Run-time scalars become 0-dim tensors (for CUDA graphs, which bake every kernel argument at
// capture). A node with an Arg::scalar_input (Adam's bias corrections, a scheduled lr) is rewritten
// into tensor ops that read a new graph input of role Scalar, "scalar.<q>", a 0-dim tensor of the
// dtype and device of the tensor it combines with; the compiled step fills it before every call.
//
//   div.Scalar(x, $q)        -> mul.Tensor(x, R), R = 1/$q                  (CUDA)
//                               div.Tensor(x, S)                            (CPU)
//   mul.Scalar(x, $q)        -> mul.Tensor(x, S)
//   add.Scalar(x, $q, a)     -> add.Tensor(x, S, a)       (sub likewise)
//   add.Scalar(x, c, $q)     -> add.Tensor(x, S, c)       (x + c*alpha == x + alpha*c)
//   add.Tensor(x, y, $q)     -> addcmul(x, y, S, 1)       (sub: value -1)
//   addcdiv(x, a, b, $q)     -> addcmul(x, div.Tensor(a, b), S, 1)          (CUDA)
//                               addcdiv(x, mul.Tensor(a, S), b, 1)          (CPU)
//   addcmul(x, a, b, $q)     -> addcmul(x, mul.Tensor(a, b), S, 1)          (CUDA)
//                               addcmul(x, mul.Tensor(a, S), b, 1)          (CPU)
//   lerp.Scalar(x, y, $q)    -> lerp.Tensor(x, y, S)
//   pow.Tensor_Scalar(x, $q) -> pow.Tensor_Tensor(x, S)
//   fill.Scalar(x, $q)       -> fill.Tensor(x, S)
//
// Each form follows the order in which ATen's kernel for the host-scalar op rounds, so that the
// lifted step stays as close as ATen allows to the step with host scalars (in bf16 training a
// last-bit difference in AdamW's update grows over a few dozen steps into differences as large as
// the noise of non-deterministic kernels):
// - CPU: ATen divides by a scalar (a / s), and computes addcdiv as x + (value*a)/b: the lifted
//   forms above are bit for bit the same (LiftRuntimeScalars tests check it with at::equal).
// - CUDA: ATen's division by a host scalar multiplies by 1/s computed in double and rounded to
//   the operand's math type (fill_scalars computes R the same way); addcdiv and addcmul are
//   fma(value, a/b, x) and fma(value, a*b, x) with the quotient or product rounded first, and
//   addcmul with value 1 is fma(a, b, x): the lifted forms above give the same single roundings.
//   Measured bit for bit on the H200 (LiftRuntimeScalarsCuda: 160 scalars per form, 65536
//   elements each).
#include <algorithm>
#include <map>
#include <stdexcept>

#include <c10/util/StringUtil.h>

#include "kiln/internal/passes.h"

namespace kiln {

namespace {

bool runtime(const ir::Arg& a) { return a.scalar_input >= 0; }

ir::Arg one() {
  ir::Arg a = ir::Arg::integer(1);
  a.is_scalar = true;
  return a;
}

// The contiguous result of an elementwise op of a and b (broadcast shapes, a's dtype and device).
ir::TensorMeta broadcast_meta(const ir::TensorMeta& a, const ir::TensorMeta& b) {
  ir::TensorMeta m = a;
  m.storage_offset = 0;
  const size_t n = std::max(a.shape.size(), b.shape.size());
  m.shape.assign(n, 1);
  for (size_t i = 0; i < n; ++i) {
    const int64_t x = i < n - a.shape.size() ? 1 : a.shape[i - (n - a.shape.size())];
    const int64_t y = i < n - b.shape.size() ? 1 : b.shape[i - (n - b.shape.size())];
    m.shape[i] = x == 1 ? y : x;
  }
  m.strides.assign(n, 1);
  for (size_t i = n; i-- > 1;) m.strides[i - 1] = m.strides[i] * std::max<int64_t>(m.shape[i], 1);
  return m;
}

}  // namespace

std::vector<std::string> lift_runtime_scalars(ir::Graph& g, std::vector<LiftedScalar>* lifted) {
  std::vector<std::string> unsupported;
  std::map<std::tuple<int32_t, int, std::string>, ir::ValueId> inputs;  // (q, dtype, device) -> input
  // Adding a value grows g.values, which frees the metas that references into it point at: `like`
  // (a meta of g) is taken by value, and so is every meta read from g before a value is added.
  auto scalar_tensor = [&](int32_t q, const ir::TensorMeta like, bool reciprocal = false) {
    const auto key = std::make_tuple(reciprocal ? -2 - q : q, static_cast<int>(like.dtype), like.device.str());
    auto it = inputs.find(key);
    if (it != inputs.end()) return it->second;
    ir::TensorMeta m;
    m.dtype = like.dtype;
    m.device = like.device;
    const std::string name =
        c10::str("scalar.", q, reciprocal ? ".reciprocal." : ".", c10::toString(like.dtype), ".", like.device.str());
    const ir::ValueId v = g.add_input(m, ir::InputRole::Scalar, name);
    inputs.emplace(key, v);
    if (lifted) lifted->push_back({v, q, like.dtype, like.device, reciprocal});
    return v;
  };
  std::vector<ir::Node> out;
  out.reserve(g.nodes.size());
  // A new elementwise result shaped like `like` (same dtype unless given).
  auto new_value = [&](const ir::TensorMeta& like) {
    ir::TensorMeta m = like;
    m.storage_offset = 0;
    return g.add_value(m);
  };
  auto node = [](std::string op, std::vector<ir::Arg> args, ir::ValueId result, ir::Phase phase) {
    ir::Node n;
    n.op = std::move(op);
    n.args = std::move(args);
    n.outputs = {result};
    n.phase = phase;
    return n;
  };
  for (auto& n : g.nodes) {
    bool has = false;
    for (const auto& a : n.args) has = has || runtime(a);
    if (!has) {
      out.push_back(std::move(n));
      continue;
    }
    const auto& A = n.args;
    const ir::ValueId result = n.outputs.empty() ? ir::kNoValue : n.outputs[0];
    const ir::TensorMeta rmeta = g.value(result).meta;  // a copy: g.values grows below
    const std::string& op = n.op;
    const ir::Phase ph = n.phase;
    auto T = [](ir::ValueId v) { return ir::Arg::tensor(v); };
    if ((op == "aten::div.Scalar" || op == "aten::mul.Scalar") && A.size() == 2 && runtime(A[1]) && !runtime(A[0])) {
      const auto& xmeta = g.value(A[0].value).meta;
      const bool reciprocal = op == "aten::div.Scalar" && xmeta.device.is_cuda();
      const auto s = scalar_tensor(A[1].scalar_input, xmeta, reciprocal);
      const bool divide = op == "aten::div.Scalar" && !reciprocal;
      out.push_back(node(divide ? "aten::div.Tensor" : "aten::mul.Tensor", {T(A[0].value), T(s)}, result, ph));
    } else if ((op == "aten::add.Scalar" || op == "aten::sub.Scalar") && A.size() == 3 &&
               runtime(A[1]) != runtime(A[2])) {
      const std::string top = op == "aten::add.Scalar" ? "aten::add.Tensor" : "aten::sub.Tensor";
      const int k = runtime(A[1]) ? 1 : 2;  // the run-time one becomes the tensor, the other alpha
      const auto s = scalar_tensor(A[static_cast<size_t>(k)].scalar_input, g.value(A[0].value).meta);
      ir::Arg alpha = A[static_cast<size_t>(3 - k)];
      alpha.is_scalar = true;
      out.push_back(node(top, {T(A[0].value), T(s), alpha}, result, ph));
    } else if ((op == "aten::add.Tensor" || op == "aten::sub.Tensor") && A.size() == 3 && runtime(A[2]) &&
               A[1].kind == ir::Arg::Kind::Tensor) {
      const auto s = scalar_tensor(A[2].scalar_input, g.value(A[1].value).meta);
      ir::Arg value = ir::Arg::integer(op == "aten::add.Tensor" ? 1 : -1);
      value.is_scalar = true;
      out.push_back(node("aten::addcmul", {T(A[0].value), T(A[1].value), T(s), value}, result, ph));
    } else if ((op == "aten::addcdiv" || op == "aten::addcmul") && A.size() == 4 && runtime(A[3]) && !runtime(A[0]) &&
               A[1].kind == ir::Arg::Kind::Tensor && A[2].kind == ir::Arg::Kind::Tensor) {
      const auto s = scalar_tensor(A[3].scalar_input, rmeta);
      if (op == "aten::addcdiv" && rmeta.device.is_cuda()) {
        const auto q = new_value(rmeta);
        out.push_back(node("aten::div.Tensor", {T(A[1].value), T(A[2].value)}, q, ph));
        out.push_back(node("aten::addcmul", {T(A[0].value), T(q), T(s), one()}, result, ph));
      } else if (op == "aten::addcdiv") {
        const auto scaled = new_value(g.value(A[1].value).meta);
        out.push_back(node("aten::mul.Tensor", {T(A[1].value), T(s)}, scaled, ph));
        out.push_back(node("aten::addcdiv", {T(A[0].value), T(scaled), T(A[2].value), one()}, result, ph));
      } else if (rmeta.device.is_cuda()) {
        // ATen's CUDA addcmul: fma(value, a*b, x), the product rounded first.
        const auto prod = new_value(broadcast_meta(g.value(A[1].value).meta, g.value(A[2].value).meta));
        out.push_back(node("aten::mul.Tensor", {T(A[1].value), T(A[2].value)}, prod, ph));
        out.push_back(node("aten::addcmul", {T(A[0].value), T(prod), T(s), one()}, result, ph));
      } else {
        const auto scaled = new_value(g.value(A[1].value).meta);
        out.push_back(node("aten::mul.Tensor", {T(A[1].value), T(s)}, scaled, ph));
        out.push_back(node("aten::addcmul", {T(A[0].value), T(scaled), T(A[2].value), one()}, result, ph));
      }
    } else if (op == "aten::lerp.Scalar" && A.size() == 3 && runtime(A[2])) {
      const auto s = scalar_tensor(A[2].scalar_input, g.value(A[0].value).meta);
      out.push_back(node("aten::lerp.Tensor", {T(A[0].value), T(A[1].value), T(s)}, result, ph));
    } else if (op == "aten::pow.Tensor_Scalar" && A.size() == 2 && runtime(A[1])) {
      const auto s = scalar_tensor(A[1].scalar_input, g.value(A[0].value).meta);
      out.push_back(node("aten::pow.Tensor_Tensor", {T(A[0].value), T(s)}, result, ph));
    } else if (op == "aten::fill.Scalar" && A.size() == 2 && runtime(A[1])) {
      const auto s = scalar_tensor(A[1].scalar_input, g.value(A[0].value).meta);
      out.push_back(node("aten::fill.Tensor", {T(A[0].value), T(s)}, result, ph));
    } else {
      unsupported.push_back(op);
      out.push_back(std::move(n));
    }
  }
  g.nodes = std::move(out);
  g.reindex();
  return unsupported;
}

}  // namespace kiln
