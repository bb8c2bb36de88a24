// Pointwise ops: each result element is an expression of the inputs at (a broadcast of) its own
// index, so producers are inlined into the loops that read them.
#include <cmath>

#include "ops.h"

namespace kiln::inductor {

using plugin::Graph;
using plugin::Node;

// ---- Claim rules ----

std::string takes_every_node(const Graph&, const Node&) { return ""; }

std::string claim_to_copy(const Graph& g, const Node& n) {
  auto dev = n.find_arg("device");
  if (dev && !dev->is_none()) {
    // A cast on the input's own device is a copy; a transfer is not.
    const DLDevice to = dev->as_device(), from = g.value(n.arg(0).tensor_index()).device();
    if (to.device_type != from.device_type || (to.device_type != kDLCPU && to.device_id != from.device_id))
      return "copy to another device";
  }
  auto lay = n.find_arg("layout");
  if (lay && !lay->is_none() && lay->raw()->i != KILN_LAYOUT_STRIDED) return "non-strided layout";
  return "";
}

std::string claim_gelu(const Graph&, const Node& n) {
  auto a = n.find_arg("approximate");
  if (!a || a->tag() != KILN_ARG_STRING) return "approximate";
  const std::string s = a->as_string();
  if (s != "none" && s != "tanh") return "approximate='" + s + "'";
  return "";
}

std::string claim_pow(const Graph&, const Node& n) { return is_number(n.arg(1)) ? "" : "exponent"; }

std::string claim_clamp(const Graph&, const Node& n) {
  if ((!n.arg(1).is_none() && !is_number(n.arg(1))) || (!n.arg(2).is_none() && !is_number(n.arg(2))))
    return "clamp bounds";
  return "";
}

std::string claim_max_pool2d(const Graph& g, const Node& n) {
  // Its backward stays with ATen: as a function of the input element it reads the window's
  // gradient and index at (h / sh, w / sw), a gather per element; fused with threshold_backward
  // that took 3.5 ms on the MNIST CNN's [64,64,24,24] against ATen's 2.5 ms plus 0.8 ms.
  if (n.num_args() != 6) return "arguments";
  std::string why;
  if (!pool_window(n, 1, &why)) return why;
  const auto in = g.value(n.arg(0).tensor_index());
  if (in.ndim() != 3 && in.ndim() != 4) return "input not 3-D or 4-D";
  if (in.numel() == 0) return "empty input";
  if (!is_float(*ty_of(in.dtype()))) return "integer input";
  if (n.outputs().size() != 2 || *ty_of(g.value(n.outputs()[1]).dtype()) != Ty::i64) return "results";
  return "";
}

// ---- Lowerings ----

void lower_copy(Lowerer& l, const Node& n) {
  const int64_t out = n.outputs()[0];
  auto x = l.bload(n.arg(0).tensor_index(), l.val(out).ty);
  l.pointwise(out, [x](ExprPool& p, const Idx& idx) { return x(p, idx); });
}

void lower_unary(Lowerer& l, const Node& n, const std::string& ir_op) {
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  auto x = l.bload(n.arg(0).tensor_index(), ty);
  l.pointwise(out, [x, ir_op, ty](ExprPool& p, const Idx& idx) { return p.op(ir_op, ty, {x(p, idx)}); });
}

void lower_silu(Lowerer& l, const Node& n) {
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  auto x = l.bload(n.arg(0).tensor_index(), ty);
  l.pointwise(out, [x, ty](ExprPool& p, const Idx& idx) {
    int a = x(p, idx);
    return p.op("mul", ty, {a, p.op("sigmoid", ty, {a})});
  });
}

void lower_binary(Lowerer& l, const Node& n, const std::string& ir_op, bool scalar_other, bool reversed) {
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  auto x = l.bload(n.arg(0).tensor_index(), ty);
  Loader y;
  if (!scalar_other) {
    y = l.bload(n.arg(1).tensor_index(), ty);
  } else {
    const int k = l.param(n.arg(1));
    y = [k, ty](ExprPool& p, const Idx&) { return p.param(k, ty); };
  }
  // alpha = 1 as a constant needs no multiply; a run-time alpha always does.
  int alpha = -1;
  if (auto a = n.find_arg("alpha"); a && is_number(*a) && !(rt_scalar(*a) < 0 && a->as_double() == 1.0))
    alpha = l.param(*a);
  l.pointwise(out, [x, y, ir_op, reversed, alpha, ty](ExprPool& p, const Idx& idx) {
    int a = x(p, idx), b = y(p, idx);
    // rsub(self, other, alpha) is other - alpha * self: alpha scales self there.
    if (reversed) {
      if (alpha >= 0) a = p.op("mul", ty, {a, p.param(alpha, ty)});
      return p.op(ir_op, ty, {b, a});
    }
    if (alpha >= 0) b = p.op("mul", ty, {b, p.param(alpha, ty)});
    return p.op(ir_op, ty, {a, b});
  });
}

void lower_pow(Lowerer& l, const Node& n) {
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  auto x = l.bload(n.arg(0).tensor_index(), ty);
  const int k = l.param(n.arg(1));
  Loader y = [k, ty](ExprPool& p, const Idx&) { return p.param(k, ty); };
  const double e = n.arg(1).as_double();
  const bool rt = rt_scalar(n.arg(1)) >= 0;
  // Small constant exponents as multiplies and roots: exact where pow rounds, and they vectorize.
  l.pointwise(out, [x, y, e, rt, ty](ExprPool& p, const Idx& idx) {
    int a = x(p, idx);
    if (!rt && e == 2.0) return p.op("mul", ty, {a, a});
    if (!rt && e == 1.0) return a;
    if (!rt && e == 0.5) return p.op("sqrt", ty, {a});
    if (!rt && e == -0.5) return p.op("rsqrt", ty, {a});
    if (!rt && e == -1.0) return p.op("reciprocal", ty, {a});
    if (!rt && e == 3.0) return p.op("mul", ty, {a, p.op("mul", ty, {a, a})});
    return p.op("pow", ty, {a, y(p, idx)});
  });
}

void lower_compare(Lowerer& l, const Node& n, const std::string& ir_op, bool scalar_other) {
  const int64_t out = n.outputs()[0];
  const int64_t a = n.arg(0).tensor_index();
  // Compared in the wider type: an integer tensor against a float one compares as floats.
  Ty ct = l.val(a).ty;
  Loader y;
  if (!scalar_other) {
    const int64_t b = n.arg(1).tensor_index();
    if (is_float(l.val(b).ty) && !is_float(ct)) ct = l.val(b).ty;
    y = l.bload(b, ct);
  } else {
    // ATen compares against the scalar converted to the tensor's type: a bfloat16 tensor against
    // 0.3 compares with bfloat16(0.3) = 0.30078125 (so x = 0.30078125 is <= 0.3).
    const int k = l.param(n.arg(1));
    if (ct == Ty::bf16) y = [k](ExprPool& p, const Idx&) { return p.cast(p.param(k, Ty::f32), Ty::bf16); };
    else y = [k, ct](ExprPool& p, const Idx&) { return p.param(k, ct); };
  }
  auto x = l.bload(a, ct);
  l.pointwise(out, [x, y, ir_op](ExprPool& p, const Idx& idx) { return p.op(ir_op, Ty::b8, {x(p, idx), y(p, idx)}); });
}

void lower_clamp(Lowerer& l, const Node& n) {
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  auto x = l.bload(n.arg(0).tensor_index(), ty);
  const int lo = n.arg(1).is_none() ? -1 : l.param(n.arg(1));
  const int hi = n.arg(2).is_none() ? -1 : l.param(n.arg(2));
  l.pointwise(out, [x, lo, hi, ty](ExprPool& p, const Idx& idx) {
    int a = x(p, idx);
    if (lo >= 0) a = p.op("maximum", ty, {a, p.param(lo, ty)});
    if (hi >= 0) a = p.op("minimum", ty, {a, p.param(hi, ty)});
    return a;
  });
}

void lower_gelu(Lowerer& l, const Node& n, bool backward) {
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  const bool bwd = backward;
  auto cst = [ty](ExprPool& p, double c) { return p.constant(c, ty); };
  auto g = bwd ? l.bload(n.arg(0).tensor_index(), ty) : nullptr;
  auto x = l.bload(n.arg(bwd ? 1 : 0).tensor_index(), ty);
  const bool tanh_approx = n.arg(bwd ? 2 : 1).as_string() == "tanh";
  l.pointwise(out, [g, x, bwd, tanh_approx, ty, cst](ExprPool& p, const Idx& idx) {
    int a = x(p, idx);
    auto mul = [&](int u, int v) { return p.op("mul", ty, {u, v}); };
    auto add = [&](int u, int v) { return p.op("add", ty, {u, v}); };
    if (!tanh_approx) {
      // Phi(x) straight from erfc's tail form: no cancellation for negative x, where
      // 1 + erf(x/sqrt(2)) loses every digit (ATen's formula: 1e-3 to 1e-1 below x = -4).
      int cdf = p.op("ndtr", ty, {a});
      if (!bwd) return mul(a, cdf);
      int pdf = mul(cst(p, 0.3989422804014327), p.op("exp", ty, {mul(cst(p, -0.5), mul(a, a))}));
      return mul(g(p, idx), add(cdf, mul(a, pdf)));
    }
    // tanh's form as ATen writes it, 0.5*x*(1 + tanh(u)), cancels for negative x (1 + tanh(u) is
    // the difference of two numbers near 1: one ulp of tanh is 2.5e-5 of the result at x = -3).
    // 0.5*(1 + tanh(u)) is sigmoid(2u), and 1 - tanh(u)^2 is 4*sigmoid(2u)*sigmoid(-2u): the same
    // function with no subtraction, accurate in relative terms on both sides.
    const double k0 = M_SQRT2 * M_2_SQRTPI * 0.5, k1 = 0.044715;
    int x3 = mul(a, mul(a, a));
    int two_u = mul(cst(p, 2 * k0), add(a, mul(cst(p, k1), x3)));
    int s = p.op("sigmoid", ty, {two_u});
    if (!bwd) return mul(a, s);
    int s_neg = p.op("sigmoid", ty, {p.op("neg", ty, {two_u})});
    int dinner = mul(cst(p, k0), add(cst(p, 1.0), mul(cst(p, 3 * k1), mul(a, a))));
    int right = mul(mul(cst(p, 2.0), a), mul(mul(s, s_neg), dinner));
    return mul(g(p, idx), add(s, right));
  });
}

void lower_sigmoid_tanh_backward(Lowerer& l, const Node& n, bool sigmoid) {
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  auto cst = [ty](ExprPool& p, double c) { return p.constant(c, ty); };
  auto g = l.bload(n.arg(0).tensor_index(), ty);
  auto y = l.bload(n.arg(1).tensor_index(), ty);
  const bool sig = sigmoid;
  l.pointwise(out, [g, y, sig, ty, cst](ExprPool& p, const Idx& idx) {
    int o = y(p, idx);
    int d = sig ? p.op("mul", ty, {o, p.op("sub", ty, {cst(p, 1.0), o})})
                : p.op("sub", ty, {cst(p, 1.0), p.op("mul", ty, {o, o})});
    return p.op("mul", ty, {g(p, idx), d});
  });
}

void lower_threshold_backward(Lowerer& l, const Node& n) {
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  auto cst = [ty](ExprPool& p, double c) { return p.constant(c, ty); };
  auto g = l.bload(n.arg(0).tensor_index(), ty);
  auto x = l.bload(n.arg(1).tensor_index(), ty);
  const int th = l.param(n.arg(2));
  l.pointwise(out, [g, x, th, ty, cst](ExprPool& p, const Idx& idx) {
    int c = p.op("le", Ty::b8, {x(p, idx), p.param(th, ty)});
    return p.op("where", ty, {c, cst(p, 0.0), g(p, idx)});
  });
}

void lower_where(Lowerer& l, const Node& n) {
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  auto c = l.bload(n.arg(0).tensor_index(), Ty::b8);
  auto a = l.bload(n.arg(1).tensor_index(), ty);
  auto b = l.bload(n.arg(2).tensor_index(), ty);
  l.pointwise(out, [c, a, b, ty](ExprPool& p, const Idx& idx) {
    return p.op("where", ty, {c(p, idx), a(p, idx), b(p, idx)});
  });
}

void lower_addc(Lowerer& l, const Node& n, const std::string& ir_op) {
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  auto s = l.bload(n.arg(0).tensor_index(), ty);
  auto t1 = l.bload(n.arg(1).tensor_index(), ty);
  auto t2 = l.bload(n.arg(2).tensor_index(), ty);
  const int v = l.param(n.arg(3));
  const std::string f = ir_op;
  l.pointwise(out, [s, t1, t2, v, f, ty](ExprPool& p, const Idx& idx) {
    int q = p.op(f, ty, {t1(p, idx), t2(p, idx)});
    return p.op("add", ty, {s(p, idx), p.op("mul", ty, {p.param(v, ty), q})});
  });
}

void lower_lerp(Lowerer& l, const Node& n) {
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  auto s = l.bload(n.arg(0).tensor_index(), ty);
  auto e = l.bload(n.arg(1).tensor_index(), ty);
  const int w = l.param(n.arg(2));
  l.pointwise(out, [s, e, w, ty](ExprPool& p, const Idx& idx) {
    int a = s(p, idx);
    return p.op("add", ty, {a, p.op("mul", ty, {p.param(w, ty), p.op("sub", ty, {e(p, idx), a})})});
  });
}

void lower_fill(Lowerer& l, const Node& n) {
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  const int k = l.param(n.arg(1));
  l.pointwise(out, [k, ty](ExprPool& p, const Idx&) { return p.param(k, ty); });
}

void lower_constant(Lowerer& l, const Node& n, double value) {
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  const double c = value;
  l.pointwise(out, [c, ty](ExprPool& p, const Idx&) { return p.constant(c, ty); });
}

void lower_nll_loss_backward(Lowerer& l, const Node& n) {
  // grad_input[n, c] = (c == target[n] && target[n] != ignore) ? -grad * (mean ? 1/total_weight : 1) : 0
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  auto cst = [ty](ExprPool& p, double c) { return p.constant(c, ty); };
  auto go = l.bload(n.arg(0).tensor_index(), ty);
  const int target = static_cast<int>(n.arg(2).tensor_index());
  const bool mean = n.arg(4).as_int() == 1;
  const int64_t ignore = n.arg(5).as_int();
  auto tw = l.bload(n.arg(6).tensor_index(), ty);
  const LoweredGraph* G = l.lowered();
  l.pointwise(out, [G, go, target, mean, ignore, tw, ty, cst](ExprPool& p, const Idx& idx) {
    int t = p.cast(G->load(p, target, {idx[0]}), Ty::i64);
    Expr col;
    col.k = Expr::K::IndexVal;
    col.ty = Ty::i64;
    col.idx = idx[1];
    int hit = p.op("and", Ty::b8,
                   {p.op("eq", Ty::b8, {t, p.add(col)}),
                    p.op("ne", Ty::b8, {t, p.constant(static_cast<double>(ignore), Ty::i64)})});
    int v = p.op("neg", ty, {go(p, Idx{})});
    if (mean) v = p.op("div", ty, {v, tw(p, Idx{})});
    return p.op("where", ty, {hit, v, cst(p, 0.0)});
  });
}

std::string claim_embedding(const Graph& g, const Node& n) {
  if (g.value(n.arg(0).tensor_index()).ndim() != 2) return "weight not 2-D";
  const auto t = ty_of(g.value(n.arg(1).tensor_index()).dtype());
  if (!t || (*t != Ty::i64 && *t != Ty::i32)) return "indices not int64 or int32";
  return "";
}

void lower_embedding(Lowerer& l, const Node& n) {
  // out[i..., c] = weight[indices[i...], c]: a gather, exact, that the kernels reading it fuse
  // (padding_idx and the other flags only matter to the backward). An index out of range is
  // clamped into the table, so that no kernel ever reads outside it; eager stops on one.
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  const LoweredGraph* G = l.lowered();
  const int w = static_cast<int>(n.arg(0).tensor_index());
  const int ind = static_cast<int>(n.arg(1).tensor_index());
  const int64_t rows = l.val(w).shape[0];
  const size_t k = l.val(ind).shape.size();
  l.pointwise(out, [G, w, ind, rows, k, ty](ExprPool& p, const Idx& idx) {
    const Idx at(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k));
    const int t = p.cast(G->load(p, ind, at), Ty::i64);
    return p.cast(G->load(p, w, {Index::expr(clamped_index(p, t, rows)), idx[k]}), ty);
  });
}

void lower_max_pool2d_with_indices(Lowerer& l, const Node& n) {
  // out[.., oh, ow] = the window's maximum and its index h * W + w in the input plane, taken in
  // ATen's order (rows, then columns): a later element replaces the maximum when it is larger or
  // NaN, so the first of equal maxima and the last NaN win, as in ATen's kernel.
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  std::string why;
  const PoolWindow win = *pool_window(n, 1, &why);
  const int64_t x = n.arg(0).tensor_index();
  const int64_t W = l.val(x).shape.back();
  const LoweredGraph* G = l.lowered();
  auto chain = [G, x, win, W, ty](ExprPool& p, const Idx& idx, bool want_index) {
    const size_t r = idx.size();
    Idx in = idx;
    int m = -1, mi = -1;
    for (int64_t i = 0; i < win.kh; ++i)
      for (int64_t j = 0; j < win.kw; ++j) {
        in[r - 2] = idx[r - 2].scaled(win.sh) + Index::constant(i);
        in[r - 1] = idx[r - 1].scaled(win.sw) + Index::constant(j);
        const int v = G->load(p, static_cast<int>(x), in);
        const int at = index_value(p, in[r - 2].scaled(W) + in[r - 1]);
        if (m < 0) {
          m = v;
          mi = at;
          continue;
        }
        const int take =
            p.op("where", Ty::b8, {p.op("gt", Ty::b8, {v, m}), p.constant(1, Ty::b8), p.op("ne", Ty::b8, {v, v})});
        m = p.op("where", ty, {take, v, m});
        mi = p.op("where", Ty::i64, {take, at, mi});
      }
    return want_index ? mi : m;
  };
  l.pointwise(out, [chain](ExprPool& p, const Idx& idx) { return chain(p, idx, false); });
  l.pointwise(n.outputs()[1], [chain](ExprPool& p, const Idx& idx) { return chain(p, idx, true); });
}

}  // namespace kiln::inductor
