// cuDNN's batch norm in ATen's native form, for a backend that compiles batch norm itself.
//
// Capture records below autograd, so a CUDA step holds what ATen dispatched to: cudnn_batch_norm
// and cudnn_batch_norm_backward, which pass cuDNN's opaque reserve space from one to the other. A
// backend cannot compute that reserve, so it cannot take either end. The same step in native form
// (_native_batch_norm_legit_functional, native_batch_norm_backward) computes the same batch norm,
// its statistics, the running statistics' update (unbiased variance, momentum) and the gradients,
// without a reserve; PyTorch's compiler decomposes batch norm above that dispatch for the same
// reason. The rewrite is not bit-exact (another kernel sums in another order), so the planner
// applies it only to pairs whose both ends the backend claims (plan_step.cpp).
//
// A pair: a training-mode cudnn_batch_norm whose running statistics are clones (what
// functionalize makes of the in-place update) and whose reserve only cudnn_batch_norm_backward
// nodes read. The forward becomes _native_batch_norm_legit_functional on the clones' sources,
// returning the new running statistics, which replace the clones wherever the step read them
// after it (its write-backs); each backward becomes native_batch_norm_backward in training mode,
// every gradient asked for (cuDNN computes all three).
#include <algorithm>

#include "kiln/internal/passes.h"

namespace kiln {

std::vector<BatchNormPair> cudnn_batch_norm_pairs(const ir::Graph& g) {
  std::vector<BatchNormPair> pairs;
  std::vector<std::vector<int32_t>> users(g.values.size());
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (auto v : ir::Graph::node_inputs(g.nodes[i])) users[static_cast<size_t>(v)].push_back(static_cast<int32_t>(i));
  std::vector<char> is_output(g.values.size(), 0);
  for (const auto& o : g.outputs) is_output[static_cast<size_t>(o.value)] = 1;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    if (n.op != "aten::cudnn_batch_norm" || n.args.size() != 8 || n.outputs.size() != 4) continue;
    if (n.args[5].kind != ir::Arg::Kind::Bool || !n.args[5].i) continue;  // evaluation mode
    if (n.args[0].kind != ir::Arg::Kind::Tensor) continue;
    bool ok = n.outputs[3] != ir::kNoValue && !is_output[static_cast<size_t>(n.outputs[3])];
    for (size_t a : {3, 4}) {
      const ir::Arg& rs = n.args[a];
      ok = ok && rs.kind == ir::Arg::Kind::Tensor;
      if (!ok) break;
      const int32_t p = g.value(rs.value).producer;
      ok = p >= 0 && g.nodes[static_cast<size_t>(p)].op == "aten::clone" &&
           g.nodes[static_cast<size_t>(p)].args[0].kind == ir::Arg::Kind::Tensor;
      // The clone holds the old statistics until this node updates it: nothing else may read it
      // before.
      for (int32_t u : users[static_cast<size_t>(rs.value)]) ok = ok && u >= static_cast<int32_t>(i);
    }
    for (size_t k = 0; k < 3 && ok; ++k) ok = n.outputs[k] != ir::kNoValue;
    if (!ok) continue;
    BatchNormPair pair;
    pair.forward = static_cast<int32_t>(i);
    for (int32_t u : users[static_cast<size_t>(n.outputs[3])]) {
      const ir::Node& b = g.nodes[static_cast<size_t>(u)];
      const bool backward = b.op == "aten::cudnn_batch_norm_backward" && b.args.size() == 9 && b.outputs.size() == 3 &&
                            b.args[8].kind == ir::Arg::Kind::Tensor && b.args[8].value == n.outputs[3];
      // The reserve is read as the reserve and nothing else.
      size_t reads = 0;
      for (auto v : ir::Graph::node_inputs(b)) reads += v == n.outputs[3];
      ok = ok && backward && reads == 1 && b.args[5].kind == ir::Arg::Kind::Tensor &&
           b.args[6].kind == ir::Arg::Kind::Tensor && b.args[2].kind == ir::Arg::Kind::Tensor;
      pair.backwards.push_back(u);
    }
    if (ok) pairs.push_back(std::move(pair));
  }
  return pairs;
}

size_t to_native_batch_norm(ir::Graph& g, const std::vector<BatchNormPair>& pairs) {
  for (const BatchNormPair& pair : pairs) {
    ir::Node& n = g.nodes.at(static_cast<size_t>(pair.forward));
    const ir::ValueId old_mean = n.args[3].value, old_var = n.args[4].value;
    ir::Node f;
    f.op = "aten::_native_batch_norm_legit_functional";
    f.phase = n.phase;
    f.args = n.args;  // input, weight, bias, running_mean, running_var, training, momentum, eps
    for (size_t a : {3, 4})
      f.args[a].value = g.nodes[static_cast<size_t>(g.value(f.args[a].value).producer)].args[0].value;
    const ir::ValueId new_mean = g.add_value(g.value(old_mean).meta), new_var = g.add_value(g.value(old_var).meta);
    f.outputs = {n.outputs[0], n.outputs[1], n.outputs[2], new_mean, new_var};
    const ir::ValueId reserve = n.outputs[3];
    g.value(reserve).producer = -1;  // read by nothing once the backwards are rewritten
    n = std::move(f);
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      auto& v = g.value(n.outputs[k]);
      v.producer = pair.forward;
      v.producer_output = static_cast<int32_t>(k);
    }
    // Later readers of the updated clones (the running statistics' write-backs) read the new values.
    for (size_t i = static_cast<size_t>(pair.forward) + 1; i < g.nodes.size(); ++i)
      for (auto& a : g.nodes[i].args) {
        if (a.kind == ir::Arg::Kind::Tensor && a.value == old_mean) a.value = new_mean;
        if (a.kind == ir::Arg::Kind::Tensor && a.value == old_var) a.value = new_var;
        for (auto& v : a.values) v = v == old_mean ? new_mean : v == old_var ? new_var : v;
      }
    for (auto& o : g.outputs) o.value = o.value == old_mean ? new_mean : o.value == old_var ? new_var : o.value;
    // cudnn_batch_norm_backward(input, grad_output, weight, running_mean, running_var, save_mean,
    //                           save_var, epsilon, reserveSpace)
    // native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
    //                            save_invstd, train, eps, output_mask)
    for (int32_t bi : pair.backwards) {
      ir::Node& b = g.nodes.at(static_cast<size_t>(bi));
      std::vector<ir::Arg> a = b.args;
      ir::Arg mask;
      mask.kind = ir::Arg::Kind::BoolList;
      mask.ints = {1, 1, 1};
      b.op = "aten::native_batch_norm_backward";
      b.args = {a[1], a[0], a[2], ir::Arg{}, ir::Arg{}, a[5], a[6], ir::Arg::boolean(true), a[7], mask};
    }
  }
  return pairs.size();
}

}  // namespace kiln
