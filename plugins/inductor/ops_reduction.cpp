// Reductions and the composites built on them (softmax, layer norm, nll loss): each is one or
// more reductions over the input plus pointwise results that read them, which the scheduler
// puts in one pass over each row.
#include <cmath>

#include "ops.h"

namespace kiln::inductor {

using plugin::Graph;
using plugin::Node;

// ---- Claim rules ----

std::string claim_sum_mean(const Graph&, const Node& n) {
  auto dt = n.find_arg("dtype");
  if (dt && !dt->is_none()) return "dtype argument";
  return "";
}

// Forward and backward alike.
std::string claim_nll_loss(const Graph& g, const Node& n) {
  auto w = n.find_arg("weight");
  if (w && !w->is_none()) return "class weights";
  auto r = n.find_arg("reduction");
  if (!r || r->tag() != KILN_ARG_INT || (r->as_int() != 1 && r->as_int() != 2)) return "reduction other than mean/sum";
  auto self = n.find_arg("self");
  if (!self || !self->is_tensor() || g.value(self->tensor_index()).ndim() != 2) return "input not 2-D";
  return "";
}

std::string claim_embedding_backward_cuda(const Graph& g, const Node& n) {
  // embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
  if (n.num_args() != 5 || !n.arg(0).is_tensor() || !n.arg(1).is_tensor()) return "arguments";
  if (n.arg(4).tag() != KILN_ARG_BOOL || n.arg(4).as_bool()) return "scale_grad_by_freq";
  if (n.arg(3).tag() != KILN_ARG_INT) return "padding_idx not an int";
  const auto grad = g.value(n.arg(0).tensor_index()), ind = g.value(n.arg(1).tensor_index());
  const auto out = g.value(n.outputs()[0]);
  const auto t = ty_of(ind.dtype());
  if (!t || (*t != Ty::i64 && *t != Ty::i32)) return "indices not int64 or int32";
  auto gs = grad.shape();
  if (out.ndim() != 2 || gs.empty() || gs.back() != out.shape()[1] ||
      std::vector<int64_t>(gs.begin(), gs.end() - 1) != ind.shape())
    return "shapes other than grad [indices..., C] and weight [rows, C]";
  if (ind.numel() == 0 || out.numel() == 0) return "empty input";
  const auto ty = ty_of(out.dtype());
  const int64_t acc_bytes = ty && *ty == Ty::f64 ? 8 : 4;
  if (out.shape()[0] * 32 * acc_bytes > kScatterTableBytes)
    return "table of " + std::to_string(out.shape()[0]) + " rows: a block's shared memory holds " +
           std::to_string(kScatterTableBytes / (32 * acc_bytes)) + " rows of 32 columns";
  return "";
}

// ---- Lowerings ----

void lower_reduce(Lowerer& l, const Node& n, const std::string& combine, bool mean, bool all_dims) {
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  const LoweredGraph* G = l.lowered();
  const int64_t x = n.arg(0).tensor_index();
  const auto shape = l.val(x).shape;
  const int64_t nd = static_cast<int64_t>(shape.size());
  std::vector<int64_t> dims;
  bool keepdim = false;
  if (all_dims) {
    for (int64_t d = 0; d < nd; ++d) dims.push_back(d);
  } else {
    dims = reduce_dims(n.arg(1), nd);
    keepdim = n.arg(2).as_bool();
  }
  double scale = 1.0;
  if (mean) {
    int64_t cnt = 1;
    for (auto d : dims) cnt *= shape[static_cast<size_t>(d)];
    scale = cnt ? 1.0 / static_cast<double>(cnt) : NAN;
  }
  const int xi = static_cast<int>(x);
  l.reduction(static_cast<int>(out), shape, dims, keepdim, combine, scale,
              [G, xi, ty](ExprPool& p, const Idx& i) { return p.cast(G->load(p, xi, i), ty); });
}

void lower_softmax(Lowerer& l, const Node& n, bool log) {
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  const LoweredGraph* G = l.lowered();
  const int x = static_cast<int>(n.arg(0).tensor_index());
  const auto shape = l.val(x).shape;
  const std::vector<int64_t> dims = {norm_dim(n.arg(1).as_int(), static_cast<int64_t>(shape.size()))};
  const auto ks = Lowerer::keep_shape(shape, dims);
  // Shifted by the row's maximum, so exp never overflows.
  const int m = l.hidden(ks, ty);
  l.reduction(m, shape, dims, true, "max", 1.0,
              [G, x, ty](ExprPool& p, const Idx& i) { return p.cast(G->load(p, x, i), ty); });
  const int s = l.hidden(ks, ty);
  auto xm = [G, x, m, ks, ty](ExprPool& p, const Idx& i) {
    return p.op("sub", ty, {p.cast(G->load(p, x, i), ty), G->load(p, m, Lowerer::bidx(ks, i))});
  };
  l.reduction(s, shape, dims, true, "sum", 1.0,
              [xm, ty](ExprPool& p, const Idx& i) { return p.op("exp", ty, {xm(p, i)}); });
  l.pointwise(out, [G, xm, s, ks, log, ty](ExprPool& p, const Idx& i) {
    int sv = G->load(p, s, Lowerer::bidx(ks, i));
    if (log) return p.op("sub", ty, {xm(p, i), p.op("log", ty, {sv})});
    return p.op("div", ty, {p.op("exp", ty, {xm(p, i)}), sv});
  });
}

void lower_softmax_backward(Lowerer& l, const Node& n, bool log) {
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  const LoweredGraph* G = l.lowered();
  const int go = static_cast<int>(n.arg(0).tensor_index());
  const int y = static_cast<int>(n.arg(1).tensor_index());
  const auto shape = l.val(go).shape;
  const std::vector<int64_t> dims = {norm_dim(n.arg(2).as_int(), static_cast<int64_t>(shape.size()))};
  const auto ks = Lowerer::keep_shape(shape, dims);
  const int s = l.hidden(ks, ty);
  l.reduction(s, shape, dims, true, "sum", 1.0, [G, go, y, log, ty](ExprPool& p, const Idx& i) {
    int g = p.cast(G->load(p, go, i), ty);
    return log ? g : p.op("mul", ty, {g, p.cast(G->load(p, y, i), ty)});
  });
  l.pointwise(out, [G, go, y, s, ks, log, ty](ExprPool& p, const Idx& i) {
    int g = p.cast(G->load(p, go, i), ty), o = p.cast(G->load(p, y, i), ty), sv = G->load(p, s, Lowerer::bidx(ks, i));
    if (log) return p.op("sub", ty, {g, p.op("mul", ty, {p.op("exp", ty, {o}), sv})});
    return p.op("mul", ty, {o, p.op("sub", ty, {g, sv})});
  });
}

void lower_layer_norm(Lowerer& l, const Node& n) {
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  const LoweredGraph* G = l.lowered();
  const int x = static_cast<int>(n.arg(0).tensor_index());
  const auto shape = l.val(x).shape;
  const int64_t nd = static_cast<int64_t>(shape.size());
  const int64_t axis = nd - static_cast<int64_t>(n.arg(1).as_ints().size());
  std::vector<int64_t> dims;
  int64_t cnt = 1;
  for (int64_t d = axis; d < nd; ++d) {
    dims.push_back(d);
    cnt *= shape[static_cast<size_t>(d)];
  }
  const int w = n.arg(2).is_none() ? -1 : static_cast<int>(n.arg(2).tensor_index());
  const int b = n.arg(3).is_none() ? -1 : static_cast<int>(n.arg(3).tensor_index());
  const int eps = l.param(n.arg(4));
  // mean and rstd are results of their own, with buffers (graph outputs or reductions).
  const int mean = static_cast<int>(n.outputs()[1]), rstd = static_cast<int>(n.outputs()[2]);
  const auto ks = l.val(mean).shape;  // keepdim shape
  const double inv = 1.0 / static_cast<double>(cnt);
  l.reduction(mean, shape, dims, true, "sum", inv,
              [G, x, ty](ExprPool& p, const Idx& i) { return p.cast(G->load(p, x, i), ty); });
  auto xc = [G, x, mean, ks, ty](ExprPool& p, const Idx& i) {
    return p.op("sub", ty, {p.cast(G->load(p, x, i), ty), G->load(p, mean, Lowerer::bidx(ks, i))});
  };
  // The variance of the centred values: two passes, no cancellation of E[x^2] - E[x]^2.
  const int var = l.hidden(ks, ty);
  l.reduction(var, shape, dims, true, "sum", inv, [xc, ty](ExprPool& p, const Idx& i) {
    int c = xc(p, i);
    return p.op("mul", ty, {c, c});
  });
  l.pointwise(rstd, [G, var, eps, ty](ExprPool& p, const Idx& i) {
    return p.op("rsqrt", ty, {p.op("add", ty, {G->load(p, var, i), p.param(eps, ty)})});
  });
  const auto wshape = w >= 0 ? l.val(w).shape : std::vector<int64_t>{};
  const auto bshape = b >= 0 ? l.val(b).shape : std::vector<int64_t>{};
  l.pointwise(out, [G, xc, rstd, ks, w, b, wshape, bshape, ty](ExprPool& p, const Idx& i) {
    int y = p.op("mul", ty, {xc(p, i), G->load(p, rstd, Lowerer::bidx(ks, i))});
    if (w >= 0) y = p.op("mul", ty, {y, p.cast(G->load(p, w, Lowerer::bidx(wshape, i)), ty)});
    if (b >= 0) y = p.op("add", ty, {y, p.cast(G->load(p, b, Lowerer::bidx(bshape, i)), ty)});
    return y;
  });
}

void lower_layer_norm_backward(Lowerer& l, const Node& n) {
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  const LoweredGraph* G = l.lowered();
  const int go = static_cast<int>(n.arg(0).tensor_index());
  const int x = static_cast<int>(n.arg(1).tensor_index());
  const auto shape = l.val(x).shape;
  const int64_t nd = static_cast<int64_t>(shape.size());
  const int64_t axis = nd - static_cast<int64_t>(n.arg(2).as_ints().size());
  const int mean = static_cast<int>(n.arg(3).tensor_index()), rstd = static_cast<int>(n.arg(4).tensor_index());
  const int w = n.arg(5).is_none() ? -1 : static_cast<int>(n.arg(5).tensor_index());
  std::vector<int64_t> dims, lead;
  int64_t cnt = 1;
  for (int64_t d = 0; d < nd; ++d) {
    if (d >= axis) {
      dims.push_back(d);
      cnt *= shape[static_cast<size_t>(d)];
    } else {
      lead.push_back(d);
    }
  }
  const auto ks = l.val(mean).shape;
  const auto wshape = w >= 0 ? l.val(w).shape : std::vector<int64_t>{};
  auto xhat = [G, x, mean, rstd, ks, ty](ExprPool& p, const Idx& i) {
    int c = p.op("sub", ty, {p.cast(G->load(p, x, i), ty), G->load(p, mean, Lowerer::bidx(ks, i))});
    return p.op("mul", ty, {c, G->load(p, rstd, Lowerer::bidx(ks, i))});
  };
  auto gw = [G, go, w, wshape, ty](ExprPool& p, const Idx& i) {
    int g = p.cast(G->load(p, go, i), ty);
    return w >= 0 ? p.op("mul", ty, {g, p.cast(G->load(p, w, Lowerer::bidx(wshape, i)), ty)}) : g;
  };
  const int a = l.hidden(ks, ty), bsum = l.hidden(ks, ty);
  l.reduction(a, shape, dims, true, "sum", 1.0, gw);
  l.reduction(bsum, shape, dims, true, "sum", 1.0, [gw, xhat, ty](ExprPool& p, const Idx& i) {
    return p.op("mul", ty, {gw(p, i), xhat(p, i)});
  });
  const double inv = 1.0 / static_cast<double>(cnt);
  l.pointwise(out, [G, gw, xhat, a, bsum, rstd, ks, inv, ty](ExprPool& p, const Idx& i) {
    auto c = [&](double v) { return p.constant(v, ty); };
    int t = p.op("sub", ty, {gw(p, i), p.op("mul", ty, {G->load(p, a, Lowerer::bidx(ks, i)), c(inv)})});
    t = p.op("sub", ty,
             {t, p.op("mul", ty, {xhat(p, i), p.op("mul", ty, {G->load(p, bsum, Lowerer::bidx(ks, i)), c(inv)})})});
    return p.op("mul", ty, {t, G->load(p, rstd, Lowerer::bidx(ks, i))});
  });
  // Weight and bias gradients: sums over the leading dims, for the results the graph uses.
  const auto outs = n.outputs();
  if (outs.size() > 1 && outs[1] >= 0)
    l.reduction(static_cast<int>(outs[1]), shape, lead, false, "sum", 1.0,
                [G, go, xhat, ty](ExprPool& p, const Idx& i) {
                  return p.op("mul", ty, {p.cast(G->load(p, go, i), ty), xhat(p, i)});
                });
  if (outs.size() > 2 && outs[2] >= 0)
    l.reduction(static_cast<int>(outs[2]), shape, lead, false, "sum", 1.0,
                [G, go, ty](ExprPool& p, const Idx& i) { return p.cast(G->load(p, go, i), ty); });
}

void lower_nll_loss_forward(Lowerer& l, const Node& n) {
  const int64_t out = n.outputs()[0];
  const Ty ty = l.val(out).ty;
  const LoweredGraph* G = l.lowered();
  const int x = static_cast<int>(n.arg(0).tensor_index());
  const int target = static_cast<int>(n.arg(1).tensor_index());
  const bool mean = n.arg(3).as_int() == 1;
  const int64_t ignore = n.arg(4).as_int();
  const auto shape = l.val(x).shape;  // [N, C]
  const int64_t C = shape[1];
  const int tw = static_cast<int>(n.outputs()[1]);
  auto valid = [G, target, ignore](ExprPool& p, const Idx& i) {
    int t = p.cast(G->load(p, target, {i[0]}), Ty::i64);
    return std::make_pair(t, p.op("ne", Ty::b8, {t, p.constant(static_cast<double>(ignore), Ty::i64)}));
  };
  l.reduction(tw, {shape[0]}, {0}, false, "sum", 1.0, [valid, ty](ExprPool& p, const Idx& i) {
    return p.op("where", ty, {valid(p, i).second, p.constant(1.0, ty), p.constant(0.0, ty)});
  });
  const int s = l.hidden({}, ty);
  l.reduction(s, {shape[0]}, {0}, false, "sum", 1.0, [G, x, valid, C, ty](ExprPool& p, const Idx& i) {
    auto [t, ok] = valid(p, i);
    int v = p.cast(G->load(p, x, {i[0], Index::expr(clamped_index(p, t, C))}), ty);
    return p.op("where", ty, {ok, p.op("neg", ty, {v}), p.constant(0.0, ty)});
  });
  l.pointwise(out, [G, s, tw, mean, ty](ExprPool& p, const Idx&) {
    int sv = G->load(p, s, {});
    return mean ? p.op("div", ty, {sv, G->load(p, tw, {})}) : sv;
  });
}

}  // namespace kiln::inductor

namespace kiln::inductor {

// ---- Batch norm (training) ----
// Per-channel statistics over every dim but 1, as ATen's batch norm computes them: the mean, the
// biased variance of the centred values (two passes, no E[x^2] - E[x]^2), invstd = 1/sqrt(var +
// eps); running stats move by `momentum` towards the mean and the unbiased variance.

namespace {

// The reduced dims (all but the channel dim 1) and how many elements each channel has.
std::vector<int64_t> bn_dims(const std::vector<int64_t>& shape, int64_t* count) {
  std::vector<int64_t> dims;
  *count = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d == 1) continue;
    dims.push_back(static_cast<int64_t>(d));
    *count *= shape[d];
  }
  return dims;
}

// A per-channel value ([C]) at a full index of the input.
Idx channel(const Idx& i) { return Idx{i.at(1)}; }

}  // namespace

std::string claim_batch_norm(const Graph& g, const Node& n) {
  const bool backward = n.op() == "aten::native_batch_norm_backward";
  const auto x = g.value(n.arg(backward ? 1 : 0).tensor_index());
  if (x.ndim() < 2) return "input of fewer than 2 dims";
  const Ty ty = *ty_of(x.dtype());
  if (ty != Ty::f32 && ty != Ty::f64) return "not float32 or float64";
  int64_t count = 1;
  for (int64_t d = 0; d < x.ndim(); ++d)
    if (d != 1) count *= x.shape()[static_cast<size_t>(d)];
  if (count < 2) return "fewer than 2 values per channel";
  if (backward) {
    if (!n.arg(7).as_bool()) return "backward of evaluation mode";
    if (n.arg(5).is_none() || n.arg(6).is_none()) return "no saved mean or invstd";
  } else if (!n.arg(5).as_bool()) {
    return "evaluation mode";
  }
  for (size_t a = 0; a < n.num_args(); ++a) {
    const plugin::Arg arg = n.arg(a);
    if (arg.is_tensor() && *ty_of(g.value(arg.tensor_index()).dtype()) != ty) return "mixed dtypes";
  }
  return "";
}

// _native_batch_norm_legit_functional(input, weight?, bias?, running_mean, running_var, training,
// momentum, eps) -> (out, save_mean, save_invstd, running_mean', running_var')
void lower_batch_norm(Lowerer& l, const Node& n) {
  const auto outs = n.outputs();
  const Ty ty = l.val(outs[0]).ty;
  const LoweredGraph* G = l.lowered();
  const int x = static_cast<int>(n.arg(0).tensor_index());
  const auto shape = l.val(x).shape;
  int64_t count = 0;
  const auto dims = bn_dims(shape, &count);
  const int w = n.arg(1).is_none() ? -1 : static_cast<int>(n.arg(1).tensor_index());
  const int b = n.arg(2).is_none() ? -1 : static_cast<int>(n.arg(2).tensor_index());
  const int rm = static_cast<int>(n.arg(3).tensor_index()), rv = static_cast<int>(n.arg(4).tensor_index());
  const int momentum = l.param(n.arg(6)), eps = l.param(n.arg(7));
  const int mean = static_cast<int>(outs[1]), invstd = static_cast<int>(outs[2]);
  const std::vector<int64_t> cs{shape.at(1)};
  // ssd(p, c): the channel's sum of squared deviations from its mean, at a [C] index; the biased
  // variance divides it by count, the unbiased one by count - 1.
  std::function<int(ExprPool&, const Idx&)> ssd;
  if (l.cuda()) {
    // On CUDA, one pass over x: float64 sums of the deviations from a shift K (the channel's first
    // element) and of their squares, mean = K + S1/n and ssd = S2 - S1^2/n. Both sums reduce the
    // same rows and read nothing of each other, so they are one kernel (join_sibling_columns), where
    // mean-then-variance is two kernels that each read x. The shift keeps S2 - S1^2/n from
    // cancelling (its terms are of the order of the variance plus (mean - K)^2), and float64
    // accumulation keeps the rest 2^29 below float32's rounding: the result is as exact as the two
    // float32 passes, or more (ATen's own kernels use float32 Welford sums).
    const size_t nd = shape.size();
    auto first = [G, x, nd](ExprPool& p, const Index& c) {
      Idx at(nd, Index::constant(0));
      at[1] = c;
      return p.cast(G->load(p, x, at), Ty::f64);
    };
    auto dev = [G, x, first](ExprPool& p, const Idx& i) {
      return p.op("sub", Ty::f64, {p.cast(G->load(p, x, i), Ty::f64), first(p, i.at(1))});
    };
    const int s1 = l.hidden(cs, Ty::f64), s2 = l.hidden(cs, Ty::f64);
    l.reduction(s1, shape, dims, false, "sum", 1.0, dev);
    l.reduction(s2, shape, dims, false, "sum", 1.0, [dev](ExprPool& p, const Idx& i) {
      const int d = dev(p, i);
      return p.op("mul", Ty::f64, {d, d});
    });
    const double inv = 1.0 / static_cast<double>(count);
    l.pointwise(mean, [G, s1, first, inv, ty](ExprPool& p, const Idx& c) {
      return p.cast(p.op("add", Ty::f64,
                         {first(p, c.at(0)), p.op("mul", Ty::f64, {G->load(p, s1, c), p.constant(inv, Ty::f64)})}),
                    ty);
    });
    ssd = [G, s1, s2, inv, ty](ExprPool& p, const Idx& c) {
      const int a = G->load(p, s1, c);
      const int d =
          p.op("sub", Ty::f64,
               {G->load(p, s2, c), p.op("mul", Ty::f64, {p.op("mul", Ty::f64, {a, a}), p.constant(inv, Ty::f64)})});
      // Never below zero: rounding could take a constant channel's sum a hair under it.
      return p.cast(p.op("maximum", Ty::f64, {d, p.constant(0.0, Ty::f64)}), ty);
    };
  } else {
    // On the CPU, two passes: the mean, then the squared deviations from it (no E[x^2] - E[x]^2).
    l.reduction(mean, shape, dims, false, "sum", 1.0 / static_cast<double>(count),
                [G, x, ty](ExprPool& p, const Idx& i) { return p.cast(G->load(p, x, i), ty); });
    const int sq = l.hidden(cs, ty);
    l.reduction(sq, shape, dims, false, "sum", 1.0, [G, x, mean, ty](ExprPool& p, const Idx& i) {
      const int c = p.op("sub", ty, {p.cast(G->load(p, x, i), ty), G->load(p, mean, channel(i))});
      return p.op("mul", ty, {c, c});
    });
    ssd = [G, sq](ExprPool& p, const Idx& c) { return G->load(p, sq, c); };
  }
  auto xc = [G, x, mean, ty](ExprPool& p, const Idx& i) {
    return p.op("sub", ty, {p.cast(G->load(p, x, i), ty), G->load(p, mean, channel(i))});
  };
  const double inv = 1.0 / static_cast<double>(count), inv_unbiased = 1.0 / static_cast<double>(count - 1);
  l.pointwise(invstd, [ssd, eps, inv, ty](ExprPool& p, const Idx& i) {
    int var = p.op("mul", ty, {ssd(p, i), p.constant(inv, ty)});
    return p.op("div", ty, {p.constant(1.0, ty), p.op("sqrt", ty, {p.op("add", ty, {var, p.param(eps, ty)})})});
  });
  l.pointwise(outs[0], [G, xc, invstd, w, b, ty](ExprPool& p, const Idx& i) {
    int y = p.op("mul", ty, {xc(p, i), G->load(p, invstd, channel(i))});
    if (w >= 0) y = p.op("mul", ty, {y, p.cast(G->load(p, w, channel(i)), ty)});
    if (b >= 0) y = p.op("add", ty, {y, p.cast(G->load(p, b, channel(i)), ty)});
    return y;
  });
  // running = momentum * statistic + (1 - momentum) * running
  auto moved = [G, momentum, ty](ExprPool& p, int running, int statistic, const Idx& i) {
    int m = p.param(momentum, ty);
    int keep = p.op("sub", ty, {p.constant(1.0, ty), m});
    return p.op("add", ty, {p.op("mul", ty, {m, statistic}), p.op("mul", ty, {keep, G->load(p, running, i)})});
  };
  if (outs.size() > 3 && outs[3] >= 0)
    l.pointwise(outs[3],
                [G, moved, rm, mean](ExprPool& p, const Idx& i) { return moved(p, rm, G->load(p, mean, i), i); });
  if (outs.size() > 4 && outs[4] >= 0)
    l.pointwise(outs[4], [moved, rv, ssd, inv_unbiased, ty](ExprPool& p, const Idx& i) {
      return moved(p, rv, p.op("mul", ty, {ssd(p, i), p.constant(inv_unbiased, ty)}), i);
    });
}

// native_batch_norm_backward(grad_out, input, weight?, running_mean?, running_var?, save_mean,
// save_invstd, train, eps, output_mask) -> (grad_input, grad_weight, grad_bias), in training mode:
// dx = (dy - sum(dy)/n - (x - mean) * invstd^2 * sum(dy * (x - mean))/n) * invstd * weight,
// dweight = sum(dy * (x - mean)) * invstd, dbias = sum(dy), as ATen computes them.
void lower_batch_norm_backward(Lowerer& l, const Node& n) {
  const auto outs = n.outputs();
  const Ty ty = l.val(n.arg(1).tensor_index()).ty;
  const LoweredGraph* G = l.lowered();
  const int go = static_cast<int>(n.arg(0).tensor_index()), x = static_cast<int>(n.arg(1).tensor_index());
  const int w = n.arg(2).is_none() ? -1 : static_cast<int>(n.arg(2).tensor_index());
  const int mean = static_cast<int>(n.arg(5).tensor_index()), invstd = static_cast<int>(n.arg(6).tensor_index());
  const auto shape = l.val(x).shape;
  int64_t count = 0;
  const auto dims = bn_dims(shape, &count);
  const std::vector<int64_t> cs{shape.at(1)};
  auto dy = [G, go, ty](ExprPool& p, const Idx& i) { return p.cast(G->load(p, go, i), ty); };
  auto xc = [G, x, mean, ty](ExprPool& p, const Idx& i) {
    return p.op("sub", ty, {p.cast(G->load(p, x, i), ty), G->load(p, mean, channel(i))});
  };
  const bool want_bias = outs.size() > 2 && outs[2] >= 0;
  const int sum_dy = want_bias ? static_cast<int>(outs[2]) : l.hidden(cs, ty);
  l.reduction(sum_dy, shape, dims, false, "sum", 1.0, dy);
  const int dot = l.hidden(cs, ty);
  l.reduction(dot, shape, dims, false, "sum", 1.0, [dy, xc, ty](ExprPool& p, const Idx& i) {
    return p.op("mul", ty, {dy(p, i), xc(p, i)});
  });
  if (outs.size() > 1 && outs[1] >= 0)
    l.pointwise(outs[1], [G, dot, invstd, ty](ExprPool& p, const Idx& i) {
      return p.op("mul", ty, {G->load(p, dot, i), G->load(p, invstd, i)});
    });
  if (outs[0] < 0) return;
  const double inv = 1.0 / static_cast<double>(count);
  l.pointwise(outs[0], [G, dy, xc, sum_dy, dot, invstd, w, inv, ty](ExprPool& p, const Idx& i) {
    const Idx c = channel(i);
    int is = G->load(p, invstd, c);
    int proj = p.op("mul", ty, {p.op("mul", ty, {G->load(p, dot, c), p.constant(inv, ty)}), p.op("mul", ty, {is, is})});
    int t = p.op("sub", ty, {dy(p, i), p.op("mul", ty, {G->load(p, sum_dy, c), p.constant(inv, ty)})});
    t = p.op("sub", ty, {t, p.op("mul", ty, {xc(p, i), proj})});
    int scale = w >= 0 ? p.op("mul", ty, {is, p.cast(G->load(p, w, c), ty)}) : is;
    return p.op("mul", ty, {t, scale});
  });
}

void lower_embedding_backward(Lowerer& l, const Node& n) {
  // grad_weight[k, c] = sum over the tokens t (in order) whose index is k of grad[t..., c]; a
  // token at padding_idx adds nowhere (its row's gradient stays zero), nor does an index outside
  // the table (eager stops on one).
  const int64_t out = n.outputs()[0];
  ValueInfo& info = l.val(out);
  const Ty ty = info.ty;
  const LoweredGraph* G = l.lowered();
  const int grad = static_cast<int>(n.arg(0).tensor_index()), ind = static_cast<int>(n.arg(1).tensor_index());
  const int64_t padding = n.arg(3).as_int();
  Scatter sc;
  sc.key = [G, ind, padding](ExprPool& p, const Idx& r) {
    const int t = p.cast(G->load(p, ind, r), Ty::i64);
    if (padding < 0) return t;
    return p.op(
        "where", Ty::i64,
        {p.op("eq", Ty::b8, {t, p.constant(static_cast<double>(padding), Ty::i64)}), p.constant(-1, Ty::i64), t});
  };
  sc.term = [G, grad, ty](ExprPool& p, const Idx& o, const Idx& r) {
    Idx at = r;
    at.push_back(o.at(1));
    return p.cast(G->load(p, grad, at), ty);
  };
  info.kind = ValueInfo::Kind::Reduction;
  info.red.combine = "sum";
  info.red.scale = 1.0;
  info.red.red_shape = l.val(ind).shape;
  info.red.body = [sc, ty](ExprPool& p, const Idx& o, const Idx& r) {
    const int hit = p.op("eq", Ty::b8, {sc.key(p, r), index_value(p, o.at(0))});
    return p.op("where", ty, {hit, sc.term(p, o, r), p.constant(0, ty)});
  };
  info.red.scatter = std::move(sc);
}

}  // namespace kiln::inductor
