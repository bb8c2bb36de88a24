// Decomposition to kiln's core op set. Capture records below autograd, so ATen has already
// decomposed every CompositeImplicitAutograd op (linear, reshape, contiguous, cross_entropy, ...);
// what remains outside the Core ATen set are a few aliases of core ops, lowered here with exact
// rewrites only: the lowered node computes bit-identical results.
//   aten::t, aten::transpose.int      -> aten::permute
//   aten::_unsafe_view (contiguous)   -> aten::view
//   aten::ones_like, aten::zeros_like -> aten::full   (result contiguous: shape, dtype, device known)
//   aten::new_zeros, aten::new_ones   -> aten::full
#include <numeric>

#include "kiln/internal/passes.h"

namespace kiln {
namespace {

using ir::Arg;

ir::Arg device_arg(const c10::Device& d) {
  Arg a;
  a.kind = Arg::Kind::Device;
  a.s = d.str();
  return a;
}

// aten::full(SymInt[] size, Scalar fill_value, *, ScalarType? dtype, Layout? layout, Device? device,
//            bool? pin_memory)
ir::Node make_full(const ir::Graph& g, const ir::Node& n, double fill) {
  const auto& m = g.value(n.outputs[0]).meta;
  ir::Node f;
  f.op = "aten::full";
  f.outputs = n.outputs;
  f.phase = n.phase;
  Arg value =
      c10::isIntegralType(m.dtype, /*includeBool=*/true) ? Arg::integer(static_cast<int64_t>(fill)) : Arg::real(fill);
  value.is_scalar = true;
  Arg layout;
  layout.kind = Arg::Kind::Layout;
  layout.i = static_cast<int64_t>(c10::kStrided);
  f.args = {Arg::int_list(m.shape), value, Arg::scalar_type(m.dtype), layout, device_arg(m.device),
            Arg::boolean(false)};
  return f;
}

}  // namespace

void decompose(ir::Graph& g) {
  for (auto& n : g.nodes) {
    if (n.outputs.size() != 1 || n.outputs[0] == ir::kNoValue) continue;
    const auto& out = g.value(n.outputs[0]).meta;
    if (n.op == "aten::t" && out.shape.size() == 2) {
      n.op = "aten::permute";
      n.args = {n.args[0], Arg::int_list({1, 0})};
    } else if (n.op == "aten::transpose.int" && n.args.size() == 3) {
      const auto rank = static_cast<int64_t>(out.shape.size());
      if (rank == 0) continue;
      std::vector<int64_t> perm(rank);
      std::iota(perm.begin(), perm.end(), 0);
      auto d0 = n.args[1].i < 0 ? n.args[1].i + rank : n.args[1].i;
      auto d1 = n.args[2].i < 0 ? n.args[2].i + rank : n.args[2].i;
      if (d0 < 0 || d1 < 0 || d0 >= rank || d1 >= rank) continue;
      std::swap(perm[d0], perm[d1]);
      n.op = "aten::permute";
      n.args = {n.args[0], Arg::int_list(perm)};
    } else if (n.op == "aten::_unsafe_view" && n.args[0].kind == Arg::Kind::Tensor &&
               g.value(n.args[0].value).meta.is_contiguous()) {
      n.op = "aten::view";
    } else if ((n.op == "aten::ones_like" || n.op == "aten::zeros_like" || n.op == "aten::new_ones" ||
                n.op == "aten::new_zeros") &&
               out.is_contiguous() && out.storage_offset == 0) {
      const bool ones = n.op == "aten::ones_like" || n.op == "aten::new_ones";
      n = make_full(g, n, ones ? 1.0 : 0.0);
    }
  }
}

}  // namespace kiln
