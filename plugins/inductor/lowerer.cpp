#include "lowerer.h"

#include <algorithm>
#include <utility>

namespace kiln::inductor {

using plugin::Arg;
using plugin::Node;

int32_t rt_scalar(const Arg& a) { return a.runtime_scalar(); }

int64_t norm_dim(int64_t d, int64_t nd) { return d < 0 ? d + std::max<int64_t>(nd, 1) : d; }

bool is_number(const Arg& a) {
  return a.tag() == KILN_ARG_INT || a.tag() == KILN_ARG_DOUBLE || a.tag() == KILN_ARG_BOOL;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size());
  int64_t acc = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    s[d] = acc;
    acc *= std::max<int64_t>(shape[d], 1);
  }
  return s;
}

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

std::optional<PoolWindow> pool_window(const Node& n, size_t first_arg, std::string* why) {
  auto pair = [](const std::vector<int64_t>& v, int64_t dflt_h,
                 int64_t dflt_w) -> std::optional<std::pair<int64_t, int64_t>> {
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

int clamped_index(ExprPool& p, int i64_value, int64_t n) {
  return p.op(
      "minimum", Ty::i64,
      {p.op("maximum", Ty::i64, {i64_value, p.constant(0, Ty::i64)}), p.constant(static_cast<double>(n - 1), Ty::i64)});
}

int Lowerer::param(const Arg& a) {
  ScalarParam p;
  p.value = a.as_double();
  p.runtime_scalar = rt_scalar(a);
  L_->params.push_back(p);
  return static_cast<int>(L_->params.size() - 1);
}

int Lowerer::hidden(std::vector<int64_t> shape, Ty ty) {
  ValueInfo info;
  // A row statistic of bfloat16 data (softmax's maximum and sum, layer norm's variance) is kept in
  // float, as ATen's kernels keep it in their accumulate type.
  info.ty = ty == Ty::bf16 ? Ty::f32 : ty;
  info.strides = contiguous_strides(shape);
  info.shape = std::move(shape);
  info.users = 2;
  info.order = order_++;
  L_->values.push_back(std::move(info));
  return static_cast<int>(L_->values.size() - 1);
}

Idx Lowerer::bidx(const std::vector<int64_t>& in_shape, const Idx& idx) {
  Idx r(in_shape.size());
  const size_t off = idx.size() - in_shape.size();
  for (size_t d = 0; d < in_shape.size(); ++d) r[d] = in_shape[d] == 1 ? Index::constant(0) : idx[off + d];
  return r;
}

Loader Lowerer::bload(int64_t v, Ty as) {
  const LoweredGraph* G = L_;
  const std::vector<int64_t> shape = val(v).shape;
  const int vi = static_cast<int>(v);
  return [G, shape, vi, as](ExprPool& p, const Idx& idx) { return p.cast(G->load(p, vi, bidx(shape, idx)), as); };
}

void Lowerer::pointwise(int64_t out, Loader body) {
  ValueInfo& info = val(out);
  info.kind = ValueInfo::Kind::Pointwise;
  info.body = std::move(body);
}

void Lowerer::view(int64_t out, int64_t src, std::function<Idx(const Idx&)> remap) {
  ValueInfo& info = val(out);
  info.kind = ValueInfo::Kind::View;
  info.src = static_cast<int>(src);
  const LoweredGraph* G = L_;
  const int s = static_cast<int>(src);
  info.body = [G, s, remap](ExprPool& p, const Idx& idx) { return G->load(p, s, remap(idx)); };
}

void Lowerer::reduction(int out, const std::vector<int64_t>& in_shape, const std::vector<int64_t>& dims, bool keepdim,
                        const std::string& combine, double scale, Loader body) {
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

std::vector<int64_t> Lowerer::keep_shape(const std::vector<int64_t>& shape, const std::vector<int64_t>& dims) {
  std::vector<int64_t> s = shape;
  for (auto d : dims) s[static_cast<size_t>(d)] = 1;
  return s;
}

}  // namespace kiln::inductor
