#include "lowering.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>

namespace kiln::inductor {

using plugin::Arg;
using plugin::Graph;
using plugin::Node;
using plugin::Unimplemented;

namespace {

// ---- The op table ----

enum class Cls { Unary, Binary, BinaryScalar, Compare, CompareScalar, Special, Reduction, View, Extern };

const std::map<std::string, Cls>& op_table() {
  static const std::map<std::string, Cls> t = {
      // pointwise
      {"aten::neg", Cls::Unary}, {"aten::relu", Cls::Unary}, {"aten::sigmoid", Cls::Unary},
      {"aten::tanh", Cls::Unary}, {"aten::exp", Cls::Unary}, {"aten::log", Cls::Unary},
      {"aten::sqrt", Cls::Unary}, {"aten::rsqrt", Cls::Unary}, {"aten::abs", Cls::Unary},
      {"aten::reciprocal", Cls::Unary}, {"aten::erf", Cls::Unary}, {"aten::silu", Cls::Unary},
      {"aten::clone", Cls::Unary}, {"aten::_to_copy", Cls::Unary},
      {"aten::add.Tensor", Cls::Binary}, {"aten::sub.Tensor", Cls::Binary}, {"aten::mul.Tensor", Cls::Binary},
      {"aten::div.Tensor", Cls::Binary}, {"aten::maximum", Cls::Binary}, {"aten::minimum", Cls::Binary},
      {"aten::rsub.Tensor", Cls::Binary},
      {"aten::add.Scalar", Cls::BinaryScalar}, {"aten::sub.Scalar", Cls::BinaryScalar},
      {"aten::mul.Scalar", Cls::BinaryScalar}, {"aten::div.Scalar", Cls::BinaryScalar},
      {"aten::rsub.Scalar", Cls::BinaryScalar}, {"aten::pow.Tensor_Scalar", Cls::BinaryScalar},
      {"aten::clamp_min", Cls::BinaryScalar}, {"aten::clamp_max", Cls::BinaryScalar},
      {"aten::eq.Tensor", Cls::Compare}, {"aten::ne.Tensor", Cls::Compare}, {"aten::lt.Tensor", Cls::Compare},
      {"aten::le.Tensor", Cls::Compare}, {"aten::gt.Tensor", Cls::Compare}, {"aten::ge.Tensor", Cls::Compare},
      {"aten::eq.Scalar", Cls::CompareScalar}, {"aten::ne.Scalar", Cls::CompareScalar},
      {"aten::lt.Scalar", Cls::CompareScalar}, {"aten::le.Scalar", Cls::CompareScalar},
      {"aten::gt.Scalar", Cls::CompareScalar}, {"aten::ge.Scalar", Cls::CompareScalar},
      {"aten::clamp", Cls::Special}, {"aten::gelu", Cls::Special}, {"aten::gelu_backward", Cls::Special},
      {"aten::sigmoid_backward", Cls::Special}, {"aten::tanh_backward", Cls::Special},
      {"aten::threshold_backward", Cls::Special}, {"aten::where.self", Cls::Special},
      {"aten::addcmul", Cls::Special}, {"aten::addcdiv", Cls::Special}, {"aten::lerp.Scalar", Cls::Special},
      {"aten::fill.Scalar", Cls::Special}, {"aten::full", Cls::Special}, {"aten::zeros", Cls::Special},
      {"aten::ones", Cls::Special}, {"aten::zeros_like", Cls::Special}, {"aten::ones_like", Cls::Special},
      {"aten::full_like", Cls::Special}, {"aten::nll_loss_backward", Cls::Special},
      {"aten::max_pool2d_with_indices", Cls::Special},
      // reductions and composites with reductions
      {"aten::sum.dim_IntList", Cls::Reduction}, {"aten::sum", Cls::Reduction},
      {"aten::mean.dim", Cls::Reduction}, {"aten::mean", Cls::Reduction},
      {"aten::amax", Cls::Reduction}, {"aten::amin", Cls::Reduction},
      {"aten::_softmax", Cls::Reduction}, {"aten::_log_softmax", Cls::Reduction},
      {"aten::_softmax_backward_data", Cls::Reduction}, {"aten::_log_softmax_backward_data", Cls::Reduction},
      {"aten::native_layer_norm", Cls::Reduction}, {"aten::native_layer_norm_backward", Cls::Reduction},
      {"aten::nll_loss_forward", Cls::Reduction},
      // views: index math
      {"aten::t", Cls::View}, {"aten::permute", Cls::View}, {"aten::transpose.int", Cls::View},
      {"aten::expand", Cls::View}, {"aten::unsqueeze", Cls::View}, {"aten::squeeze.dim", Cls::View},
      {"aten::squeeze.dims", Cls::View}, {"aten::squeeze", Cls::View}, {"aten::select.int", Cls::View},
      {"aten::slice.Tensor", Cls::View}, {"aten::view", Cls::View}, {"aten::_unsafe_view", Cls::View},
      {"aten::reshape", Cls::View}, {"aten::alias", Cls::View}, {"aten::detach", Cls::View},
      // extern kernels: ATen through call_eager
      {"aten::mm", Cls::Extern}, {"aten::addmm", Cls::Extern}, {"aten::bmm", Cls::Extern},
      {"aten::baddbmm", Cls::Extern}, {"aten::convolution", Cls::Extern},
      {"aten::convolution_backward", Cls::Extern},
      {"aten::_scaled_dot_product_flash_attention_for_cpu", Cls::Extern},
      {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", Cls::Extern},
      {"aten::embedding", Cls::Extern}, {"aten::embedding_dense_backward", Cls::Extern},
  };
  return t;
}

// ABI 1.1's run-time scalar index of an argument, -1 for a constant (always -1 with a 1.0 header).
int32_t rt_scalar(const Arg& a) {
#if KILN_ABI_VERSION_MINOR >= 1
  return a.runtime_scalar();
#else
  (void)a;
  return -1;
#endif
}

int64_t norm_dim(int64_t d, int64_t nd) { return d < 0 ? d + std::max<int64_t>(nd, 1) : d; }

bool is_number(const Arg& a) { return a.tag() == KILN_ARG_INT || a.tag() == KILN_ARG_DOUBLE || a.tag() == KILN_ARG_BOOL; }

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size());
  int64_t acc = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    s[d] = acc;
    acc *= std::max<int64_t>(shape[d], 1);
  }
  return s;
}

// Reduction dims of an optional int list argument: None or [] means all dims.
std::vector<int64_t> reduce_dims(const Arg& a, int64_t nd) {
  std::vector<int64_t> dims;
  if (!a.is_none()) dims = a.as_ints();
  if (dims.empty())
    for (int64_t d = 0; d < nd; ++d) dims.push_back(d);
  for (auto& d : dims) d = norm_dim(d, nd);
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  return dims;
}

// max_pool2d's window, from kernel_size, stride, padding, dilation and ceil_mode (lists of one or
// two; an empty stride is the kernel size).
struct PoolWindow {
  int64_t kh = 0, kw = 0, sh = 0, sw = 0;
};

std::optional<PoolWindow> pool_window(const Node& n, size_t first_arg, std::string* why) {
  auto pair = [](const std::vector<int64_t>& v, int64_t dflt_h, int64_t dflt_w) -> std::optional<std::pair<int64_t, int64_t>> {
    if (v.empty()) return std::make_pair(dflt_h, dflt_w);
    if (v.size() == 1) return std::make_pair(v[0], v[0]);
    if (v.size() == 2) return std::make_pair(v[0], v[1]);
    return std::nullopt;
  };
  for (size_t k = first_arg; k < first_arg + 4; ++k)
    if (n.arg(k).tag() != KILN_ARG_INT_LIST) {
      *why = "window arguments";
      return std::nullopt;
    }
  auto kernel = pair(n.arg(first_arg).as_ints(), -1, -1);
  if (!kernel || kernel->first <= 0 || kernel->second <= 0 || n.arg(first_arg).as_ints().empty()) {
    *why = "kernel size";
    return std::nullopt;
  }
  auto stride = pair(n.arg(first_arg + 1).as_ints(), kernel->first, kernel->second);
  auto padding = pair(n.arg(first_arg + 2).as_ints(), 0, 0);
  auto dilation = pair(n.arg(first_arg + 3).as_ints(), 1, 1);
  if (!stride || stride->first <= 0 || stride->second <= 0) {
    *why = "stride";
    return std::nullopt;
  }
  // Padding (windows reading -inf outside the input) and dilation are left to ATen.
  if (!padding || padding->first != 0 || padding->second != 0) {
    *why = "padding";
    return std::nullopt;
  }
  if (!dilation || dilation->first != 1 || dilation->second != 1) {
    *why = "dilation";
    return std::nullopt;
  }
  if (n.arg(first_arg + 4).tag() != KILN_ARG_BOOL || n.arg(first_arg + 4).as_bool()) {
    *why = "ceil_mode";
    return std::nullopt;
  }
  // Each window is unrolled into a chain of compares.
  if (kernel->first * kernel->second > 16) {
    *why = "window larger than 16 elements";
    return std::nullopt;
  }
  return PoolWindow{kernel->first, kernel->second, stride->first, stride->second};
}

int index_value(ExprPool& p, const Index& ix) {
  Expr e;
  e.k = Expr::K::IndexVal;
  e.ty = Ty::i64;
  e.idx = ix;
  return p.add(std::move(e));
}

class Lowerer {
 public:
  Lowerer(const Graph& g, const LoweringOptions& opts, LoweredGraph* out) : g_(g), opts_(opts), L_(out) {}

  void run() {
    L_->values.resize(g_.num_values());
    L_->num_inputs = g_.inputs().size();
    L_->num_outputs = g_.outputs().size();
    for (size_t v = 0; v < g_.num_values(); ++v) {
      const auto val = g_.value(static_cast<int64_t>(v));
      auto ty = ty_of(val.dtype());
      if (!ty) throw Unimplemented("value " + std::to_string(val.id()) + " has dtype " + plugin::dtype_name(val.dtype()));
      ValueInfo& info = L_->values[v];
      info.ty = *ty;
      info.shape = val.shape();
      info.strides = val.strides();
      info.storage_offset = val.raw()->storage_offset;
      info.order = -1;
    }
    for (int64_t in : g_.inputs()) {
      ValueInfo& info = L_->values[static_cast<size_t>(in)];
      info.kind = ValueInfo::Kind::Input;
      info.materialized = true;
    }
    for (size_t i = 0; i < g_.num_nodes(); ++i) {
      Node n = g_.node(static_cast<int64_t>(i));
      std::string why = why_not_claimed(g_, n, opts_);
      if (!why.empty()) throw Unimplemented(n.op() + ": " + why);
      for (int64_t v : n.inputs()) L_->values[static_cast<size_t>(v)].users++;
      lower_node(n);
      for (int64_t v : n.outputs()) L_->values[static_cast<size_t>(v)].order = order_++;
    }
    finish();
  }

 private:
  ValueInfo& val(int64_t v) { return L_->values[static_cast<size_t>(v)]; }
  const LoweredGraph* G() const { return L_; }

  int param(const Arg& a) {
    ScalarParam p;
    p.value = a.as_double();
    p.runtime_scalar = rt_scalar(a);
    L_->params.push_back(p);
    return static_cast<int>(L_->params.size() - 1);
  }
  int param_value(double v) {
    L_->params.push_back(ScalarParam{v, -1});
    return static_cast<int>(L_->params.size() - 1);
  }

  // A hidden intermediate (softmax's max, layer norm's variance): contiguous, always materialized.
  int hidden(std::vector<int64_t> shape, Ty ty) {
    ValueInfo info;
    info.ty = ty;
    info.strides = contiguous_strides(shape);
    info.shape = std::move(shape);
    info.users = 2;
    info.order = order_++;
    L_->values.push_back(std::move(info));
    return static_cast<int>(L_->values.size() - 1);
  }

  // Right-aligned broadcasting of `in` to an index of rank out_rank.
  static Idx bidx(const std::vector<int64_t>& in_shape, const Idx& idx) {
    Idx r(in_shape.size());
    const size_t off = idx.size() - in_shape.size();
    for (size_t d = 0; d < in_shape.size(); ++d) r[d] = in_shape[d] == 1 ? Index::constant(0) : idx[off + d];
    return r;
  }
  // A loader of `v` broadcast to the index of another value.
  std::function<int(ExprPool&, const Idx&)> bload(int64_t v, Ty as) {
    const LoweredGraph* G = L_;
    const std::vector<int64_t> shape = val(v).shape;
    const int vi = static_cast<int>(v);
    return [G, shape, vi, as](ExprPool& p, const Idx& idx) { return p.cast(G->load(p, vi, bidx(shape, idx)), as); };
  }

  void pointwise(int64_t out, std::function<int(ExprPool&, const Idx&)> body) {
    ValueInfo& info = val(out);
    info.kind = ValueInfo::Kind::Pointwise;
    info.body = std::move(body);
  }

  void view(int64_t out, int64_t src, std::function<Idx(const Idx&)> remap) {
    ValueInfo& info = val(out);
    info.kind = ValueInfo::Kind::View;
    info.src = static_cast<int>(src);
    const LoweredGraph* G = L_;
    const int s = static_cast<int>(src);
    info.body = [G, s, remap](ExprPool& p, const Idx& idx) { return G->load(p, s, remap(idx)); };
  }

  // out[o] = scale * combine_r body(full input index); `dims` are the reduced dims of `in_shape`.
  void reduction(int out, const std::vector<int64_t>& in_shape, const std::vector<int64_t>& dims, bool keepdim,
                 const std::string& combine, double scale, std::function<int(ExprPool&, const Idx&)> body) {
    ValueInfo& info = val(out);
    info.kind = ValueInfo::Kind::Reduction;
    info.red.combine = combine;
    info.red.scale = scale;
    info.red.red_shape.clear();
    for (auto d : dims) info.red.red_shape.push_back(in_shape[static_cast<size_t>(d)]);
    const size_t nd = in_shape.size();
    std::vector<char> reduced(nd, 0);
    for (auto d : dims) reduced[static_cast<size_t>(d)] = 1;
    const size_t out_rank = info.shape.size();
    info.red.body = [body, reduced, keepdim, nd, out_rank](ExprPool& p, const Idx& out_idx, const Idx& red_idx) {
      Idx full(nd);
      size_t r = 0, o = 0;
      for (size_t d = 0; d < nd; ++d) {
        if (reduced[d]) {
          full[d] = red_idx[r++];
          if (keepdim) ++o;
        } else {
          full[d] = o < out_rank ? out_idx[o++] : Index::constant(0);
        }
      }
      return body(p, full);
    };
  }

  std::vector<int64_t> keep_shape(const std::vector<int64_t>& shape, const std::vector<int64_t>& dims) {
    std::vector<int64_t> s = shape;
    for (auto d : dims) s[static_cast<size_t>(d)] = 1;
    return s;
  }

  void lower_node(const Node& n);
  void lower_pointwise(const Node& n, Cls cls);
  void lower_special(const Node& n);
  void lower_reduction(const Node& n);
  void lower_view(const Node& n);
  void alias_extern_output(int64_t out);
  void finish();

  const Graph& g_;
  LoweringOptions opts_;
  LoweredGraph* L_;
  int order_ = 0;
};

void Lowerer::lower_node(const Node& n) {
  const Cls cls = op_table().at(n.op());
  switch (cls) {
    case Cls::Unary: case Cls::Binary: case Cls::BinaryScalar: case Cls::Compare: case Cls::CompareScalar:
      lower_pointwise(n, cls);
      return;
    case Cls::Special: lower_special(n); return;
    case Cls::Reduction: lower_reduction(n); return;
    case Cls::View: lower_view(n); return;
    case Cls::Extern:
      for (int64_t v : n.outputs()) {
        val(v).kind = ValueInfo::Kind::Extern;
        val(v).ext.node = static_cast<int>(n.index());
        val(v).materialized = true;
      }
      return;
  }
}

void Lowerer::lower_pointwise(const Node& n, Cls cls) {
  const std::string op = n.op();
  const int64_t out = n.outputs()[0];
  const Ty ty = val(out).ty;
  const std::string base = n.name().substr(6);  // after "aten::"
  if (cls == Cls::Unary) {
    auto x = bload(n.arg(0).tensor_index(), ty);
    std::string f = base;
    pointwise(out, [x, f, ty](ExprPool& p, const Idx& idx) {
      int a = x(p, idx);
      if (f == "clone" || f == "_to_copy") return a;
      if (f == "silu") return p.op("mul", ty, {a, p.op("sigmoid", ty, {a})});
      return p.op(f, ty, {a});
    });
    return;
  }
  if (cls == Cls::Compare || cls == Cls::CompareScalar) {
    const int64_t a = n.arg(0).tensor_index();
    Ty ct = val(a).ty;
    std::function<int(ExprPool&, const Idx&)> y;
    if (cls == Cls::Compare) {
      const int64_t b = n.arg(1).tensor_index();
      if (is_float(val(b).ty) && !is_float(ct)) ct = val(b).ty;
      y = bload(b, ct);
    } else {
      const int k = param(n.arg(1));
      y = [k, ct](ExprPool& p, const Idx&) { return p.param(k, ct); };
    }
    auto x = bload(a, ct);
    std::string f = base;
    pointwise(out, [x, y, f](ExprPool& p, const Idx& idx) { return p.op(f, Ty::b8, {x(p, idx), y(p, idx)}); });
    return;
  }
  auto x = bload(n.arg(0).tensor_index(), ty);
  std::function<int(ExprPool&, const Idx&)> y;
  if (cls == Cls::Binary) {
    y = bload(n.arg(1).tensor_index(), ty);
  } else {
    const int k = param(n.arg(1));
    y = [k, ty](ExprPool& p, const Idx&) { return p.param(k, ty); };
  }
  int alpha = -1;
  if (auto a = n.find_arg("alpha"); a && is_number(*a) && !(rt_scalar(*a) < 0 && a->as_double() == 1.0))
    alpha = param(*a);
  std::string f = base;
  if (f == "pow") {
    const double e = n.arg(1).as_double();
    const bool rt = rt_scalar(n.arg(1)) >= 0;
    pointwise(out, [x, y, e, rt, ty](ExprPool& p, const Idx& idx) {
      int a = x(p, idx);
      if (!rt && e == 2.0) return p.op("mul", ty, {a, a});
      if (!rt && e == 1.0) return a;
      if (!rt && e == 0.5) return p.op("sqrt", ty, {a});
      if (!rt && e == -0.5) return p.op("rsqrt", ty, {a});
      if (!rt && e == -1.0) return p.op("reciprocal", ty, {a});
      if (!rt && e == 3.0) return p.op("mul", ty, {a, p.op("mul", ty, {a, a})});
      return p.op("pow", ty, {a, y(p, idx)});
    });
    return;
  }
  if (f == "clamp_min") f = "maximum";
  if (f == "clamp_max") f = "minimum";
  pointwise(out, [x, y, f, alpha, ty](ExprPool& p, const Idx& idx) {
    int a = x(p, idx), b = y(p, idx);
    if (alpha >= 0) b = p.op("mul", ty, {b, p.param(alpha, ty)});
    if (f == "rsub") return p.op("sub", ty, {b, a});
    return p.op(f, ty, {a, b});
  });
}

void Lowerer::lower_special(const Node& n) {
  const std::string op = n.op();
  const int64_t out = n.outputs()[0];
  const Ty ty = val(out).ty;
  auto cst = [ty](ExprPool& p, double c) { return p.constant(c, ty); };
  if (op == "aten::clamp") {
    auto x = bload(n.arg(0).tensor_index(), ty);
    const int lo = n.arg(1).is_none() ? -1 : param(n.arg(1));
    const int hi = n.arg(2).is_none() ? -1 : param(n.arg(2));
    pointwise(out, [x, lo, hi, ty](ExprPool& p, const Idx& idx) {
      int a = x(p, idx);
      if (lo >= 0) a = p.op("maximum", ty, {a, p.param(lo, ty)});
      if (hi >= 0) a = p.op("minimum", ty, {a, p.param(hi, ty)});
      return a;
    });
  } else if (op == "aten::gelu" || op == "aten::gelu_backward") {
    const bool bwd = op == "aten::gelu_backward";
    auto g = bwd ? bload(n.arg(0).tensor_index(), ty) : nullptr;
    auto x = bload(n.arg(bwd ? 1 : 0).tensor_index(), ty);
    const bool tanh_approx = n.arg(bwd ? 2 : 1).as_string() == "tanh";
    pointwise(out, [g, x, bwd, tanh_approx, ty, cst](ExprPool& p, const Idx& idx) {
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
      const double k0 = M_SQRT2 * M_2_SQRTPI * 0.5, k1 = 0.044715;
      int x3 = mul(a, mul(a, a));
      int inner = mul(cst(p, k0), add(a, mul(cst(p, k1), x3)));
      int th = p.op("tanh", ty, {inner});
      if (!bwd) return mul(mul(cst(p, 0.5), a), add(cst(p, 1.0), th));
      int left = mul(cst(p, 0.5), add(cst(p, 1.0), th));
      int dinner = mul(cst(p, k0), add(cst(p, 1.0), mul(cst(p, 3 * k1), mul(a, a))));
      int right = mul(mul(cst(p, 0.5), a), mul(p.op("sub", ty, {cst(p, 1.0), mul(th, th)}), dinner));
      return mul(g(p, idx), add(left, right));
    });
  } else if (op == "aten::sigmoid_backward" || op == "aten::tanh_backward") {
    auto g = bload(n.arg(0).tensor_index(), ty);
    auto y = bload(n.arg(1).tensor_index(), ty);
    const bool sig = op == "aten::sigmoid_backward";
    pointwise(out, [g, y, sig, ty, cst](ExprPool& p, const Idx& idx) {
      int o = y(p, idx);
      int d = sig ? p.op("mul", ty, {o, p.op("sub", ty, {cst(p, 1.0), o})})
                  : p.op("sub", ty, {cst(p, 1.0), p.op("mul", ty, {o, o})});
      return p.op("mul", ty, {g(p, idx), d});
    });
  } else if (op == "aten::threshold_backward") {
    auto g = bload(n.arg(0).tensor_index(), ty);
    auto x = bload(n.arg(1).tensor_index(), ty);
    const int th = param(n.arg(2));
    pointwise(out, [g, x, th, ty, cst](ExprPool& p, const Idx& idx) {
      int c = p.op("le", Ty::b8, {x(p, idx), p.param(th, ty)});
      return p.op("where", ty, {c, cst(p, 0.0), g(p, idx)});
    });
  } else if (op == "aten::where.self") {
    auto c = bload(n.arg(0).tensor_index(), Ty::b8);
    auto a = bload(n.arg(1).tensor_index(), ty);
    auto b = bload(n.arg(2).tensor_index(), ty);
    pointwise(out, [c, a, b, ty](ExprPool& p, const Idx& idx) { return p.op("where", ty, {c(p, idx), a(p, idx), b(p, idx)}); });
  } else if (op == "aten::addcmul" || op == "aten::addcdiv") {
    auto s = bload(n.arg(0).tensor_index(), ty);
    auto t1 = bload(n.arg(1).tensor_index(), ty);
    auto t2 = bload(n.arg(2).tensor_index(), ty);
    const int v = param(n.arg(3));
    const std::string f = op == "aten::addcmul" ? "mul" : "div";
    pointwise(out, [s, t1, t2, v, f, ty](ExprPool& p, const Idx& idx) {
      int q = p.op(f, ty, {t1(p, idx), t2(p, idx)});
      return p.op("add", ty, {s(p, idx), p.op("mul", ty, {p.param(v, ty), q})});
    });
  } else if (op == "aten::lerp.Scalar") {
    auto s = bload(n.arg(0).tensor_index(), ty);
    auto e = bload(n.arg(1).tensor_index(), ty);
    const int w = param(n.arg(2));
    pointwise(out, [s, e, w, ty](ExprPool& p, const Idx& idx) {
      int a = s(p, idx);
      return p.op("add", ty, {a, p.op("mul", ty, {p.param(w, ty), p.op("sub", ty, {e(p, idx), a})})});
    });
  } else if (op == "aten::fill.Scalar" || op == "aten::full" || op == "aten::full_like") {
    const int k = param(n.arg(1));
    pointwise(out, [k, ty](ExprPool& p, const Idx&) { return p.param(k, ty); });
  } else if (op == "aten::zeros" || op == "aten::zeros_like" || op == "aten::ones" || op == "aten::ones_like") {
    const double c = (op == "aten::ones" || op == "aten::ones_like") ? 1.0 : 0.0;
    pointwise(out, [c, ty](ExprPool& p, const Idx&) { return p.constant(c, ty); });
  } else if (op == "aten::nll_loss_backward") {
    // grad_input[n, c] = (c == target[n] && target[n] != ignore) ? -grad * (mean ? 1/total_weight : 1) : 0
    auto go = bload(n.arg(0).tensor_index(), ty);
    const int target = static_cast<int>(n.arg(2).tensor_index());
    const bool mean = n.arg(4).as_int() == 1;
    const int64_t ignore = n.arg(5).as_int();
    auto tw = bload(n.arg(6).tensor_index(), ty);
    const LoweredGraph* G = L_;
    pointwise(out, [G, go, target, mean, ignore, tw, ty, cst](ExprPool& p, const Idx& idx) {
      int t = p.cast(G->load(p, target, {idx[0]}), Ty::i64);
      Expr col;
      col.k = Expr::K::IndexVal;
      col.ty = Ty::i64;
      col.idx = idx[1];
      int hit = p.op("and", Ty::b8, {p.op("eq", Ty::b8, {t, p.add(col)}),
                                     p.op("ne", Ty::b8, {t, p.constant(static_cast<double>(ignore), Ty::i64)})});
      int v = p.op("neg", ty, {go(p, Idx{})});
      if (mean) v = p.op("div", ty, {v, tw(p, Idx{})});
      return p.op("where", ty, {hit, v, cst(p, 0.0)});
    });
  } else if (op == "aten::max_pool2d_with_indices") {
    // out[.., oh, ow] = the window's maximum and its index h * W + w in the input plane, taken in
    // ATen's order (rows, then columns): a later element replaces the maximum when it is larger or
    // NaN, so the first of equal maxima and the last NaN win, as in ATen's kernel.
    std::string why;
    const PoolWindow win = *pool_window(n, 1, &why);
    const int64_t x = n.arg(0).tensor_index();
    const int64_t W = val(x).shape.back();
    const LoweredGraph* G = L_;
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
          const int take = p.op("where", Ty::b8, {p.op("gt", Ty::b8, {v, m}), p.constant(1, Ty::b8),
                                                  p.op("ne", Ty::b8, {v, v})});
          m = p.op("where", ty, {take, v, m});
          mi = p.op("where", Ty::i64, {take, at, mi});
        }
      return want_index ? mi : m;
    };
    pointwise(out, [chain](ExprPool& p, const Idx& idx) { return chain(p, idx, false); });
    pointwise(n.outputs()[1], [chain](ExprPool& p, const Idx& idx) { return chain(p, idx, true); });
  } else {
    throw Unimplemented(op + " has no lowering");
  }
}

void Lowerer::lower_reduction(const Node& n) {
  const std::string op = n.op();
  const int64_t out = n.outputs()[0];
  const Ty ty = val(out).ty;
  const LoweredGraph* G = L_;
  if (op == "aten::sum.dim_IntList" || op == "aten::sum" || op == "aten::mean.dim" || op == "aten::mean" ||
      op == "aten::amax" || op == "aten::amin") {
    const int64_t x = n.arg(0).tensor_index();
    const auto shape = val(x).shape;
    const int64_t nd = static_cast<int64_t>(shape.size());
    const bool full = op == "aten::sum" || op == "aten::mean";
    std::vector<int64_t> dims;
    bool keepdim = false;
    if (full) {
      for (int64_t d = 0; d < nd; ++d) dims.push_back(d);
    } else {
      dims = reduce_dims(n.arg(1), nd);
      keepdim = n.arg(2).as_bool();
    }
    std::string combine = "sum";
    if (op == "aten::amax") combine = "max";
    if (op == "aten::amin") combine = "min";
    double scale = 1.0;
    if (op == "aten::mean.dim" || op == "aten::mean") {
      int64_t cnt = 1;
      for (auto d : dims) cnt *= shape[static_cast<size_t>(d)];
      scale = cnt ? 1.0 / static_cast<double>(cnt) : NAN;
    }
    const int xi = static_cast<int>(x);
    reduction(static_cast<int>(out), shape, dims, keepdim, combine, scale,
              [G, xi, ty](ExprPool& p, const Idx& i) { return p.cast(G->load(p, xi, i), ty); });
    return;
  }
  if (op == "aten::_softmax" || op == "aten::_log_softmax") {
    const int x = static_cast<int>(n.arg(0).tensor_index());
    const auto shape = val(x).shape;
    const std::vector<int64_t> dims = {norm_dim(n.arg(1).as_int(), static_cast<int64_t>(shape.size()))};
    const bool log = op == "aten::_log_softmax";
    const auto ks = keep_shape(shape, dims);
    const int m = hidden(ks, ty);
    reduction(m, shape, dims, true, "max", 1.0, [G, x, ty](ExprPool& p, const Idx& i) { return p.cast(G->load(p, x, i), ty); });
    const int s = hidden(ks, ty);
    auto xm = [G, x, m, ks, ty](ExprPool& p, const Idx& i) {
      return p.op("sub", ty, {p.cast(G->load(p, x, i), ty), G->load(p, m, bidx(ks, i))});
    };
    reduction(s, shape, dims, true, "sum", 1.0, [xm, ty](ExprPool& p, const Idx& i) { return p.op("exp", ty, {xm(p, i)}); });
    pointwise(out, [G, xm, s, ks, log, ty](ExprPool& p, const Idx& i) {
      int sv = G->load(p, s, bidx(ks, i));
      if (log) return p.op("sub", ty, {xm(p, i), p.op("log", ty, {sv})});
      return p.op("div", ty, {p.op("exp", ty, {xm(p, i)}), sv});
    });
    return;
  }
  if (op == "aten::_softmax_backward_data" || op == "aten::_log_softmax_backward_data") {
    const int go = static_cast<int>(n.arg(0).tensor_index());
    const int y = static_cast<int>(n.arg(1).tensor_index());
    const auto shape = val(go).shape;
    const std::vector<int64_t> dims = {norm_dim(n.arg(2).as_int(), static_cast<int64_t>(shape.size()))};
    const bool log = op == "aten::_log_softmax_backward_data";
    const auto ks = keep_shape(shape, dims);
    const int s = hidden(ks, ty);
    reduction(s, shape, dims, true, "sum", 1.0, [G, go, y, log, ty](ExprPool& p, const Idx& i) {
      int g = p.cast(G->load(p, go, i), ty);
      return log ? g : p.op("mul", ty, {g, p.cast(G->load(p, y, i), ty)});
    });
    pointwise(out, [G, go, y, s, ks, log, ty](ExprPool& p, const Idx& i) {
      int g = p.cast(G->load(p, go, i), ty), o = p.cast(G->load(p, y, i), ty), sv = G->load(p, s, bidx(ks, i));
      if (log) return p.op("sub", ty, {g, p.op("mul", ty, {p.op("exp", ty, {o}), sv})});
      return p.op("mul", ty, {o, p.op("sub", ty, {g, sv})});
    });
    return;
  }
  if (op == "aten::native_layer_norm") {
    const int x = static_cast<int>(n.arg(0).tensor_index());
    const auto shape = val(x).shape;
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
    const int eps = param(n.arg(4));
    const int mean = static_cast<int>(n.outputs()[1]), rstd = static_cast<int>(n.outputs()[2]);
    const auto ks = val(mean).shape;  // keepdim shape
    const double inv = 1.0 / static_cast<double>(cnt);
    reduction(mean, shape, dims, true, "sum", inv, [G, x, ty](ExprPool& p, const Idx& i) { return p.cast(G->load(p, x, i), ty); });
    auto xc = [G, x, mean, ks, ty](ExprPool& p, const Idx& i) {
      return p.op("sub", ty, {p.cast(G->load(p, x, i), ty), G->load(p, mean, bidx(ks, i))});
    };
    const int var = hidden(ks, ty);
    reduction(var, shape, dims, true, "sum", inv, [xc, ty](ExprPool& p, const Idx& i) {
      int c = xc(p, i);
      return p.op("mul", ty, {c, c});
    });
    pointwise(rstd, [G, var, eps, ty](ExprPool& p, const Idx& i) {
      return p.op("rsqrt", ty, {p.op("add", ty, {G->load(p, var, i), p.param(eps, ty)})});
    });
    const auto wshape = w >= 0 ? val(w).shape : std::vector<int64_t>{};
    const auto bshape = b >= 0 ? val(b).shape : std::vector<int64_t>{};
    pointwise(out, [G, xc, rstd, ks, w, b, wshape, bshape, ty](ExprPool& p, const Idx& i) {
      int y = p.op("mul", ty, {xc(p, i), G->load(p, rstd, bidx(ks, i))});
      if (w >= 0) y = p.op("mul", ty, {y, p.cast(G->load(p, w, bidx(wshape, i)), ty)});
      if (b >= 0) y = p.op("add", ty, {y, p.cast(G->load(p, b, bidx(bshape, i)), ty)});
      return y;
    });
    // rstd is an output of its own; mean too (both have buffers as graph outputs or as reductions).
    return;
  }
  if (op == "aten::native_layer_norm_backward") {
    const int go = static_cast<int>(n.arg(0).tensor_index());
    const int x = static_cast<int>(n.arg(1).tensor_index());
    const auto shape = val(x).shape;
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
    const auto ks = val(mean).shape;
    const auto wshape = w >= 0 ? val(w).shape : std::vector<int64_t>{};
    auto xhat = [G, x, mean, rstd, ks, ty](ExprPool& p, const Idx& i) {
      int c = p.op("sub", ty, {p.cast(G->load(p, x, i), ty), G->load(p, mean, bidx(ks, i))});
      return p.op("mul", ty, {c, G->load(p, rstd, bidx(ks, i))});
    };
    auto gw = [G, go, w, wshape, ty](ExprPool& p, const Idx& i) {
      int g = p.cast(G->load(p, go, i), ty);
      return w >= 0 ? p.op("mul", ty, {g, p.cast(G->load(p, w, bidx(wshape, i)), ty)}) : g;
    };
    const int a = hidden(ks, ty), bsum = hidden(ks, ty);
    reduction(a, shape, dims, true, "sum", 1.0, gw);
    reduction(bsum, shape, dims, true, "sum", 1.0,
              [gw, xhat, ty](ExprPool& p, const Idx& i) { return p.op("mul", ty, {gw(p, i), xhat(p, i)}); });
    const double inv = 1.0 / static_cast<double>(cnt);
    pointwise(out, [G, gw, xhat, a, bsum, rstd, ks, inv, ty](ExprPool& p, const Idx& i) {
      auto c = [&](double v) { return p.constant(v, ty); };
      int t = p.op("sub", ty, {gw(p, i), p.op("mul", ty, {G->load(p, a, bidx(ks, i)), c(inv)})});
      t = p.op("sub", ty, {t, p.op("mul", ty, {xhat(p, i), p.op("mul", ty, {G->load(p, bsum, bidx(ks, i)), c(inv)})})});
      return p.op("mul", ty, {t, G->load(p, rstd, bidx(ks, i))});
    });
    const auto outs = n.outputs();
    if (outs.size() > 1 && outs[1] >= 0)
      reduction(static_cast<int>(outs[1]), shape, lead, false, "sum", 1.0, [G, go, xhat, ty](ExprPool& p, const Idx& i) {
        return p.op("mul", ty, {p.cast(G->load(p, go, i), ty), xhat(p, i)});
      });
    if (outs.size() > 2 && outs[2] >= 0)
      reduction(static_cast<int>(outs[2]), shape, lead, false, "sum", 1.0,
                [G, go, ty](ExprPool& p, const Idx& i) { return p.cast(G->load(p, go, i), ty); });
    return;
  }
  if (op == "aten::nll_loss_forward") {
    const int x = static_cast<int>(n.arg(0).tensor_index());
    const int target = static_cast<int>(n.arg(1).tensor_index());
    const bool mean = n.arg(3).as_int() == 1;
    const int64_t ignore = n.arg(4).as_int();
    const auto shape = val(x).shape;  // [N, C]
    const int64_t C = shape[1];
    const int tw = static_cast<int>(n.outputs()[1]);
    auto valid = [G, target, ignore](ExprPool& p, const Idx& i) {
      int t = p.cast(G->load(p, target, {i[0]}), Ty::i64);
      return std::make_pair(t, p.op("ne", Ty::b8, {t, p.constant(static_cast<double>(ignore), Ty::i64)}));
    };
    reduction(tw, {shape[0]}, {0}, false, "sum", 1.0, [valid, ty](ExprPool& p, const Idx& i) {
      return p.op("where", ty, {valid(p, i).second, p.constant(1.0, ty), p.constant(0.0, ty)});
    });
    const int s = hidden({}, ty);
    reduction(s, {shape[0]}, {0}, false, "sum", 1.0, [G, x, valid, C, ty](ExprPool& p, const Idx& i) {
      auto [t, ok] = valid(p, i);
      // Clamped so that a bad target can never read outside the row (eager rejects it anyway).
      int tc = p.op("minimum", Ty::i64, {p.op("maximum", Ty::i64, {t, p.constant(0, Ty::i64)}), p.constant(static_cast<double>(C - 1), Ty::i64)});
      int v = p.cast(G->load(p, x, {i[0], Index::expr(tc)}), ty);
      return p.op("where", ty, {ok, p.op("neg", ty, {v}), p.constant(0.0, ty)});
    });
    pointwise(out, [G, s, tw, mean, ty](ExprPool& p, const Idx&) {
      int sv = G->load(p, s, {});
      return mean ? p.op("div", ty, {sv, G->load(p, tw, {})}) : sv;
    });
    return;
  }
  throw Unimplemented(op + " has no lowering");
}

void Lowerer::lower_view(const Node& n) {
  const std::string op = n.op();
  const int64_t out = n.outputs()[0];
  const int64_t src = n.arg(0).tensor_index();
  const auto in_shape = val(src).shape;
  const auto out_shape = val(out).shape;
  const int64_t nd = static_cast<int64_t>(in_shape.size());
  if (op == "aten::alias" || op == "aten::detach" ||
      ((op == "aten::view" || op == "aten::_unsafe_view" || op == "aten::reshape") && in_shape == out_shape)) {
    view(out, src, [](const Idx& i) { return i; });
  } else if (op == "aten::t" || op == "aten::permute" || op == "aten::transpose.int") {
    std::vector<int64_t> perm(static_cast<size_t>(nd));
    for (int64_t d = 0; d < nd; ++d) perm[static_cast<size_t>(d)] = d;
    if (op == "aten::t") {
      if (nd == 2) std::swap(perm[0], perm[1]);
    } else if (op == "aten::permute") {
      perm = n.arg(1).as_ints();
      for (auto& d : perm) d = norm_dim(d, nd);
    } else {
      std::swap(perm[static_cast<size_t>(norm_dim(n.arg(1).as_int(), nd))],
                perm[static_cast<size_t>(norm_dim(n.arg(2).as_int(), nd))]);
    }
    view(out, src, [perm](const Idx& i) {
      Idx r(perm.size());
      for (size_t d = 0; d < perm.size(); ++d) r[static_cast<size_t>(perm[d])] = i[d];
      return r;
    });
  } else if (op == "aten::expand") {
    view(out, src, [in_shape](const Idx& i) { return bidx(in_shape, i); });
  } else if (op == "aten::unsqueeze") {
    const int64_t d0 = norm_dim(n.arg(1).as_int(), nd + 1);
    view(out, src, [d0](const Idx& i) {
      Idx r;
      for (size_t d = 0; d < i.size(); ++d)
        if (static_cast<int64_t>(d) != d0) r.push_back(i[d]);
      return r;
    });
  } else if (op == "aten::squeeze.dim" || op == "aten::squeeze.dims" || op == "aten::squeeze") {
    std::vector<char> drop(static_cast<size_t>(nd), 0);
    if (op == "aten::squeeze") {
      for (int64_t d = 0; d < nd; ++d) drop[static_cast<size_t>(d)] = in_shape[static_cast<size_t>(d)] == 1;
    } else {
      std::vector<int64_t> ds = op == "aten::squeeze.dim" ? std::vector<int64_t>{n.arg(1).as_int()} : n.arg(1).as_ints();
      for (auto d : ds) {
        d = norm_dim(d, nd);
        if (d < nd && in_shape[static_cast<size_t>(d)] == 1) drop[static_cast<size_t>(d)] = 1;
      }
    }
    view(out, src, [drop](const Idx& i) {
      Idx r;
      size_t k = 0;
      for (size_t d = 0; d < drop.size(); ++d) r.push_back(drop[d] ? Index::constant(0) : i[k++]);
      return r;
    });
  } else if (op == "aten::select.int") {
    const int64_t d0 = norm_dim(n.arg(1).as_int(), nd);
    int64_t index = n.arg(2).as_int();
    if (index < 0) index += in_shape[static_cast<size_t>(d0)];
    view(out, src, [d0, index](const Idx& i) {
      Idx r = i;
      r.insert(r.begin() + d0, Index::constant(index));
      return r;
    });
  } else if (op == "aten::slice.Tensor") {
    const int64_t d0 = norm_dim(n.arg(1).as_int(), nd);
    const int64_t size = in_shape[static_cast<size_t>(d0)];
    int64_t start = n.arg(2).is_none() ? 0 : n.arg(2).as_int();
    if (start < 0) start += size;
    start = std::clamp<int64_t>(start, 0, size);
    const int64_t step = n.arg(4).as_int();
    view(out, src, [d0, start, step](const Idx& i) {
      Idx r = i;
      r[static_cast<size_t>(d0)] = Index::constant(start) + i[static_cast<size_t>(d0)].scaled(step);
      return r;
    });
  } else {
    // A reshape: address the root buffer with this value's own strides.
    int root = static_cast<int>(src);
    while (!val(root).materialized && (val(root).kind == ValueInfo::Kind::View || val(root).kind == ValueInfo::Kind::Reshape))
      root = val(root).src;
    val(root).materialized = true;
    ValueInfo& info = val(out);
    info.kind = ValueInfo::Kind::Reshape;
    info.src = root;
  }
}

void Lowerer::alias_extern_output(int64_t out) {
  ValueInfo& o = val(out);
  if (o.kind != ValueInfo::Kind::View) return;
  int root = o.src;
  while (val(root).kind == ValueInfo::Kind::View && !val(root).materialized) root = val(root).src;
  ValueInfo& r = val(root);
  // A result already placed (an output itself, or aliased by another output) keeps its buffer.
  if (r.kind != ValueInfo::Kind::Extern || r.buffer >= 0) return;
  if (r.ty != o.ty || r.shape != o.shape || r.storage_offset != o.storage_offset) return;
  for (size_t d = 0; d < o.shape.size(); ++d)
    if (o.shape[d] != 1 && o.strides[d] != r.strides[d]) return;
  // The views must map every index to itself (dims of extent 1 aside).
  ExprPool trial;
  Idx idx;
  for (size_t d = 0; d < o.shape.size(); ++d) idx.push_back(Index::var(trial.new_var()));
  const Expr& x = trial.at(L_->compute(trial, static_cast<int>(out), idx));
  if (x.k != Expr::K::Load || x.value != root || !x.logical_known || x.logical.size() != idx.size()) return;
  for (size_t d = 0; d < idx.size(); ++d)
    if (o.shape[d] != 1 && x.logical[d].key() != idx[d].key()) return;
  r.buffer = o.buffer;
  o.alias_of = root;
}

// Buffers: inputs and outputs are the execute() tensors; every other materialized value gets a
// scratch slot. Pointwise values read by several consumers get a buffer when recomputing them
// would cost more than a load.
void Lowerer::finish() {
  const auto outs = g_.outputs();
  const auto ins = g_.inputs();
  for (size_t i = 0; i < ins.size(); ++i) val(ins[i]).buffer = static_cast<int>(i);
  std::set<int64_t> seen;
  for (size_t j = 0; j < outs.size(); ++j) {
    if (!seen.insert(outs[j]).second) throw Unimplemented("a value is output twice");
    if (val(outs[j]).kind == ValueInfo::Kind::Input) throw Unimplemented("an input is passed through as an output");
    val(outs[j]).materialized = true;
    val(outs[j]).buffer = static_cast<int>(ins.size() + j);
  }
  // An output that is an extern kernel's result seen through views that change nothing (the
  // detach of a matmul's weight gradient, a transpose of a transpose) gets the kernel's result
  // written straight into its buffer; otherwise the result would go to scratch and be copied.
  for (size_t j = 0; j < outs.size(); ++j) alias_extern_output(outs[j]);
  // Extern arguments must be tensors in memory.
  for (size_t i = 0; i < g_.num_nodes(); ++i) {
    Node n = g_.node(static_cast<int64_t>(i));
    if (op_table().at(n.op()) != Cls::Extern) continue;
    for (int64_t v : n.inputs()) {
      int root = static_cast<int>(v);
      while (!val(root).materialized && (val(root).kind == ValueInfo::Kind::View || val(root).kind == ValueInfo::Kind::Reshape))
        root = val(root).src;
      val(root).materialized = true;
    }
  }
  for (auto& info : L_->values) {
    if (info.kind == ValueInfo::Kind::Reduction || info.kind == ValueInfo::Kind::Extern) info.materialized = true;
  }
  for (size_t v = 0; v < L_->values.size(); ++v) {
    ValueInfo& info = L_->values[v];
    if (info.materialized || info.kind != ValueInfo::Kind::Pointwise || info.users < 2) continue;
    ExprPool trial;
    Idx idx;
    for (size_t d = 0; d < info.shape.size(); ++d) idx.push_back(Index::var(trial.new_var()));
    L_->compute(trial, static_cast<int>(v), idx);
    if (trial.size() > 12) info.materialized = true;
  }
  const size_t first_scratch = ins.size() + outs.size();
  for (size_t v = 0; v < L_->values.size(); ++v) {
    ValueInfo& info = L_->values[v];
    if (!info.materialized || info.buffer >= 0) continue;
    info.buffer = static_cast<int>(first_scratch + L_->scratch_bytes.size());
    L_->scratch_bytes.push_back(std::max<int64_t>(info.extent(), 1) * static_cast<int64_t>(ty_size(info.ty)));
  }
  // The order to compute materialized values in: dependencies first (found by evaluating each
  // definition once), creation order among independent ones.
  std::vector<int> cand;
  for (size_t v = 0; v < L_->values.size(); ++v)
    if (L_->values[v].materialized && L_->values[v].kind != ValueInfo::Kind::Input && L_->values[v].alias_of < 0)
      cand.push_back(static_cast<int>(v));
  // A value computed by the extern it aliases.
  auto producer = [&](int v) { return L_->values[static_cast<size_t>(v)].alias_of >= 0 ? L_->values[static_cast<size_t>(v)].alias_of : v; };
  std::stable_sort(cand.begin(), cand.end(), [&](int a, int b) { return L_->values[a].order < L_->values[b].order; });
  std::map<int, std::vector<int>> deps;
  for (int v : cand) {
    const ValueInfo& info = L_->values[static_cast<size_t>(v)];
    std::vector<int>& d = deps[v];
    if (info.kind == ValueInfo::Kind::Extern) {
      for (int64_t in : g_.node(info.ext.node).inputs()) {
        int root = static_cast<int>(in);
        while (!val(root).materialized && (val(root).kind == ValueInfo::Kind::View || val(root).kind == ValueInfo::Kind::Reshape))
          root = val(root).src;
        d.push_back(producer(root));
      }
      continue;
    }
    ExprPool trial;
    Idx idx;
    for (size_t k = 0; k < info.shape.size(); ++k) idx.push_back(Index::var(trial.new_var()));
    if (info.kind == ValueInfo::Kind::Reduction) {
      Idx red;
      for (size_t k = 0; k < info.red.red_shape.size(); ++k) red.push_back(Index::var(trial.new_var()));
      info.red.body(trial, idx, red);
    } else {
      L_->compute(trial, v, idx);
    }
    for (size_t e = 0; e < trial.size(); ++e) {
      const Expr& x = trial.at(static_cast<int>(e));
      if (x.k == Expr::K::Load && x.value >= 0 && x.value != v) d.push_back(producer(x.value));
    }
  }
  std::vector<char> state(L_->values.size(), 0);
  std::vector<int> order;
  std::function<void(int)> visit = [&](int v) {
    if (state[static_cast<size_t>(v)] == 2 || !deps.count(v)) return;
    if (state[static_cast<size_t>(v)] == 1) throw std::logic_error("cycle among materialized values");
    state[static_cast<size_t>(v)] = 1;
    for (int d : deps[v]) visit(d);
    state[static_cast<size_t>(v)] = 2;
    order.push_back(v);
  };
  for (int v : cand) visit(v);
  L_->order = std::move(order);
}

}  // namespace

void validate_graph(const Graph& g) {
  const KilnGraphView* raw = g.raw();
  const size_t nv = raw->num_values;
  auto bad = [](const std::string& what) { throw plugin::Error(KILN_ERROR_INVALID_ARGUMENT, "malformed graph: " + what); };
  auto in_range = [nv](int64_t v) { return v >= 0 && static_cast<uint64_t>(v) < nv; };
  if (nv && !raw->values) bad("values is NULL");
  if (raw->num_nodes && !raw->nodes) bad("nodes is NULL");
  if (raw->num_inputs && !raw->inputs) bad("inputs is NULL");
  if (raw->num_outputs && !raw->outputs) bad("outputs is NULL");
  for (size_t v = 0; v < nv; ++v) {
    const KilnValue* val = raw->values[v];
    if (!val) bad("value " + std::to_string(v) + " is NULL");
    if (val->ndim < 0 || val->ndim > 64) bad("value " + std::to_string(v) + " has rank " + std::to_string(val->ndim));
    if (val->ndim > 0 && !val->shape) bad("value " + std::to_string(v) + " of rank " + std::to_string(val->ndim) + " has no shape");
    for (int32_t d = 0; d < val->ndim; ++d)
      if (val->shape[d] < 0) bad("value " + std::to_string(v) + " has extent " + std::to_string(val->shape[d]) + " in dim " + std::to_string(d));
  }
  for (size_t i = 0; i < raw->num_inputs; ++i)
    if (!in_range(raw->inputs[i]))
      bad("graph input " + std::to_string(i) + " names value index " + std::to_string(raw->inputs[i]) + " (graph has " +
          std::to_string(nv) + " values)");
  for (size_t i = 0; i < raw->num_outputs; ++i)
    if (!in_range(raw->outputs[i]))
      bad("graph output " + std::to_string(i) + " names value index " + std::to_string(raw->outputs[i]) + " (graph has " +
          std::to_string(nv) + " values)");
  for (size_t ni = 0; ni < raw->num_nodes; ++ni) {
    const KilnNode* n = raw->nodes[ni];
    if (!n) bad("node " + std::to_string(ni) + " is NULL");
    const std::string where = "node " + std::to_string(ni) + " (" + (n->op ? n->op : "?") + ")";
    if (!n->op) bad(where + " has no op name");
    if (n->num_args && !n->args) bad(where + ": args is NULL");
    if (n->num_inputs && !n->inputs) bad(where + ": inputs is NULL");
    if (n->num_outputs && !n->outputs) bad(where + ": outputs is NULL");
    for (size_t a = 0; a < n->num_args; ++a) {
      const KilnArg* arg = n->args[a];
      if (!arg) bad(where + ": argument " + std::to_string(a) + " is NULL");
      const std::string an = where + ": argument " + std::to_string(a) + " '" + (arg->name ? arg->name : "") + "'";
      if (arg->tag == KILN_ARG_TENSOR && !in_range(arg->i))
        bad(an + " names value index " + std::to_string(arg->i) + " (graph has " + std::to_string(nv) + " values)");
      if (arg->tag == KILN_ARG_TENSOR_LIST || arg->tag == KILN_ARG_INT_LIST || arg->tag == KILN_ARG_BOOL_LIST) {
        if (arg->len && !arg->ints) bad(an + ": list of " + std::to_string(arg->len) + " without elements");
        if (arg->tag == KILN_ARG_TENSOR_LIST)
          for (size_t k = 0; k < arg->len; ++k)
            if (arg->ints[k] != -1 && !in_range(arg->ints[k]))
              bad(an + ": element " + std::to_string(k) + " names value index " + std::to_string(arg->ints[k]) +
                  " (graph has " + std::to_string(nv) + " values)");
      }
      if (arg->tag == KILN_ARG_DOUBLE_LIST && arg->len && !arg->doubles)
        bad(an + ": list of " + std::to_string(arg->len) + " without elements");
    }
    for (size_t k = 0; k < n->num_inputs; ++k)
      if (!in_range(n->inputs[k]))
        bad(where + ": input " + std::to_string(k) + " names value index " + std::to_string(n->inputs[k]) + " (graph has " +
            std::to_string(nv) + " values)");
    for (size_t k = 0; k < n->num_outputs; ++k)  // -1: a result nobody uses
      if (n->outputs[k] != -1 && !in_range(n->outputs[k]))
        bad(where + ": result " + std::to_string(k) + " names value index " + std::to_string(n->outputs[k]) + " (graph has " +
            std::to_string(nv) + " values)");
  }
}

std::string why_not_claimed(const Graph& g, const Node& n, const LoweringOptions& opts) {
  auto it = op_table().find(n.op());
  if (it == op_table().end()) return "not an op the inductor lowers";
  const Cls cls = it->second;
  if (cls == Cls::Extern && !opts.extern_kernels) return "extern kernels are off";
  for (size_t i = 0; i < n.num_args(); ++i) {
    Arg a = n.arg(i);
    if (a.tag() == KILN_ARG_TENSOR_LIST) return "tensor list arguments";
    if (rt_scalar(a) >= 0 && !opts.runtime_scalars) return "run-time scalar without ABI 1.1";
    if (rt_scalar(a) >= 0 && cls == Cls::Extern) return "run-time scalar in an extern kernel";
  }
  auto check_value = [&](int64_t v) -> std::string {
    if (v < 0) return "undefined result";
    auto val = g.value(v);
    if (val.device().device_type != kDLCPU) return "not on the CPU";
    if (!ty_of(val.dtype())) return "dtype " + plugin::dtype_name(val.dtype());
    return "";
  };
  for (int64_t v : n.inputs())
    if (auto w = check_value(v); !w.empty()) return w;
  for (int64_t v : n.outputs())
    if (auto w = check_value(v); !w.empty()) return w;
  if (n.outputs().empty()) return "no results";
  const std::string op = n.op();
  auto out_ty = *ty_of(g.value(n.outputs()[0]).dtype());
  // Arithmetic runs in float types only (integer division and the like have their own rules).
  if ((cls == Cls::Unary || cls == Cls::Binary || cls == Cls::BinaryScalar || cls == Cls::Special || cls == Cls::Reduction) &&
      !is_float(out_ty) && op != "aten::clone" && op != "aten::_to_copy" && op != "aten::where.self" &&
      op != "aten::zeros" && op != "aten::zeros_like" && op != "aten::ones_like" && op != "aten::full" &&
      op != "aten::fill.Scalar" && op != "aten::full_like")
    return "integer arithmetic";
  auto arg_named = [&](const char* name) { return n.find_arg(name); };
  if (op == "aten::_to_copy") {
    auto dev = arg_named("device");
    if (dev && !dev->is_none() && dev->as_device().device_type != kDLCPU) return "copy to another device";
    auto lay = arg_named("layout");
    if (lay && !lay->is_none() && lay->raw()->i != KILN_LAYOUT_STRIDED) return "non-strided layout";
  }
  if (op == "aten::sum.dim_IntList" || op == "aten::sum" || op == "aten::mean.dim" || op == "aten::mean") {
    auto dt = arg_named("dtype");
    if (dt && !dt->is_none()) return "dtype argument";
  }
  if (op == "aten::gelu" || op == "aten::gelu_backward") {
    auto a = arg_named("approximate");
    if (!a || a->tag() != KILN_ARG_STRING) return "approximate";
    const std::string s = a->as_string();
    if (s != "none" && s != "tanh") return "approximate='" + s + "'";
  }
  if (op == "aten::nll_loss_forward" || op == "aten::nll_loss_backward") {
    auto w = arg_named("weight");
    if (w && !w->is_none()) return "class weights";
    auto r = arg_named("reduction");
    if (!r || r->tag() != KILN_ARG_INT || (r->as_int() != 1 && r->as_int() != 2)) return "reduction other than mean/sum";
    auto self = arg_named("self");
    if (!self || !self->is_tensor() || g.value(self->tensor_index()).ndim() != 2) return "input not 2-D";
  }
  if (op == "aten::expand" && g.value(n.arg(0).tensor_index()).ndim() > g.value(n.outputs()[0]).ndim())
    return "bad expand";
  if (op == "aten::max_pool2d_with_indices") {
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
  }
  if (op == "aten::native_layer_norm_backward" || op == "aten::native_layer_norm") {
    // Undefined results are checked above; bias gradients need nothing more.
  }
  if (cls == Cls::Reduction && op != "aten::sum.dim_IntList" && op != "aten::sum" && op != "aten::mean.dim" &&
      op != "aten::mean") {
    // amax/amin over an empty dim is an error in ATen, softmax and layer norm over one are edge
    // cases nobody trains on: with an empty input they run eagerly, with ATen's own answer.
    for (int64_t v : n.inputs())
      if (g.value(v).numel() == 0) return "empty input";
  }
  if (op == "aten::pow.Tensor_Scalar" && !is_number(n.arg(1))) return "exponent";
  if (cls == Cls::BinaryScalar || cls == Cls::CompareScalar) {
    if (!is_number(n.arg(1))) return "non-numeric scalar";
  }
  if (op == "aten::clamp") {
    if ((!n.arg(1).is_none() && !is_number(n.arg(1))) || (!n.arg(2).is_none() && !is_number(n.arg(2)))) return "clamp bounds";
  }
  return "";
}

bool is_view_op(const std::string& op) {
  auto it = op_table().find(op);
  return it != op_table().end() && it->second == Cls::View;
}

bool is_extern_op(const std::string& op) {
  auto it = op_table().find(op);
  return it != op_table().end() && it->second == Cls::Extern;
}

std::unique_ptr<LoweredGraph> lower(const Graph& g, const LoweringOptions& opts) {
  // The loaders capture the LoweredGraph's address: it lives on the heap and never moves.
  auto out = std::make_unique<LoweredGraph>();
  Lowerer(g, opts, out.get()).run();
  return out;
}

}  // namespace kiln::inductor
