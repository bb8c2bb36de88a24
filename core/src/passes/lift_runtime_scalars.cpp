// Run-time scalars become 0-dim tensors (for CUDA graphs, which bake every kernel argument at
// capture). A node with an Arg::scalar_input (Adam's bias corrections, a scheduled lr) is rewritten
// into tensor ops that read a new graph input of role Scalar, "scalar.<q>", a 0-dim tensor of the
// dtype and device of the tensor it combines with; the compiled step fills it before every call.
//
//   div.Scalar(x, $q)            -> mul.Tensor(x, R), R = 1/$q (reciprocal)
//   mul.Scalar(x, $q)            -> mul.Tensor(x, S)
//   add.Scalar(x, $q, a)         -> add.Tensor(x, S, a)        (sub likewise)
//   add.Scalar(x, c, $q)         -> add.Tensor(x, S, c)        (x + c*alpha == x + alpha*c)
//   add.Tensor(x, y, $q)         -> add.Tensor(x, mul.Tensor(y, S), 1)   (sub likewise)
//   addcdiv(x, a, b, $q)         -> add.Tensor(x, mul.Tensor(div.Tensor(a, b), S), 1)
//   addcmul(x, a, b, $q)         -> add.Tensor(x, mul.Tensor(mul.Tensor(a, S), b), 1)
//   lerp.Scalar(x, y, $q)        -> lerp.Tensor(x, y, S)
//   pow.Tensor_Scalar(x, $q)     -> pow.Tensor_Tensor(x, S)
//   fill.Scalar(x, $q)           -> fill.Tensor(x, S)
// The addcdiv/addcmul forms evaluate in the order ATen's CUDA kernels do (x + v*(a/b), x + v*a*b),
// up to the contraction of a*b+c into one fused multiply-add that the single ATen kernel may do
// (a last-bit difference). div.Scalar becomes a multiplication by the reciprocal, as ATen's CUDA
// kernel computes a division by a host scalar (1/s rounded to the operand's math type, then a
// multiply): bit for bit the same.
#include <map>
#include <stdexcept>

#include <c10/util/StringUtil.h>

#include "kiln/passes.h"

namespace kiln {

namespace {

bool runtime(const ir::Arg& a) { return a.scalar_input >= 0; }

ir::Arg one() {
  ir::Arg a = ir::Arg::integer(1);
  a.is_scalar = true;
  return a;
}

}  // namespace

std::vector<std::string> lift_runtime_scalars(ir::Graph& g, std::vector<LiftedScalar>* lifted) {
  std::vector<std::string> unsupported;
  std::map<std::tuple<int32_t, int, std::string>, ir::ValueId> inputs;  // (q, dtype, device) -> input
  auto scalar_tensor = [&](int32_t q, const ir::TensorMeta& like, bool reciprocal = false) {
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
  auto node = [](std::string op, std::vector<ir::Arg> args, ir::ValueId result, const std::string& phase) {
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
    const ir::TensorMeta& rmeta = g.value(result).meta;
    const std::string& op = n.op;
    const std::string& ph = n.phase;
    auto T = [](ir::ValueId v) { return ir::Arg::tensor(v); };
    if ((op == "aten::div.Scalar" || op == "aten::mul.Scalar") && A.size() == 2 && runtime(A[1]) && !runtime(A[0])) {
      const bool div = op == "aten::div.Scalar";
      const auto s = scalar_tensor(A[1].scalar_input, g.value(A[0].value).meta, /*reciprocal=*/div);
      out.push_back(node("aten::mul.Tensor", {T(A[0].value), T(s)}, result, ph));
    } else if ((op == "aten::add.Scalar" || op == "aten::sub.Scalar") && A.size() == 3 && runtime(A[1]) != runtime(A[2])) {
      const std::string top = op == "aten::add.Scalar" ? "aten::add.Tensor" : "aten::sub.Tensor";
      const int k = runtime(A[1]) ? 1 : 2;  // the run-time one becomes the tensor, the other alpha
      const auto s = scalar_tensor(A[static_cast<size_t>(k)].scalar_input, g.value(A[0].value).meta);
      ir::Arg alpha = A[static_cast<size_t>(3 - k)];
      alpha.is_scalar = true;
      out.push_back(node(top, {T(A[0].value), T(s), alpha}, result, ph));
    } else if ((op == "aten::add.Tensor" || op == "aten::sub.Tensor") && A.size() == 3 && runtime(A[2]) &&
               A[1].kind == ir::Arg::Kind::Tensor) {
      const auto& ymeta = g.value(A[1].value).meta;
      const auto s = scalar_tensor(A[2].scalar_input, ymeta);
      const auto scaled = new_value(ymeta);
      out.push_back(node("aten::mul.Tensor", {T(A[1].value), T(s)}, scaled, ph));
      out.push_back(node(op, {T(A[0].value), T(scaled), one()}, result, ph));
    } else if ((op == "aten::addcdiv" || op == "aten::addcmul") && A.size() == 4 && runtime(A[3]) &&
               !runtime(A[0]) && A[1].kind == ir::Arg::Kind::Tensor && A[2].kind == ir::Arg::Kind::Tensor) {
      ir::TensorMeta m = rmeta;
      const auto s = scalar_tensor(A[3].scalar_input, rmeta);
      const auto t1 = new_value(m), t2 = new_value(m);
      if (op == "aten::addcdiv") {
        out.push_back(node("aten::div.Tensor", {T(A[1].value), T(A[2].value)}, t1, ph));
        out.push_back(node("aten::mul.Tensor", {T(t1), T(s)}, t2, ph));
      } else {
        out.push_back(node("aten::mul.Tensor", {T(A[1].value), T(s)}, t1, ph));
        out.push_back(node("aten::mul.Tensor", {T(t1), T(A[2].value)}, t2, ph));
      }
      out.push_back(node("aten::add.Tensor", {T(A[0].value), T(t2), one()}, result, ph));
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
