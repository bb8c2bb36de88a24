// Views: index math on the viewed value, no copy. A reshape that index math cannot express
// addresses the root buffer with the result's own strides instead (ValueInfo::Kind::Reshape).
#include <algorithm>

#include "ops.h"

namespace kiln::inductor {

using plugin::Graph;
using plugin::Node;

std::string claim_expand(const Graph& g, const Node& n) {
  if (g.value(n.arg(0).tensor_index()).ndim() > g.value(n.outputs()[0]).ndim()) return "bad expand";
  return "";
}

namespace {

int64_t src_rank(Lowerer& l, const Node& n) {
  return static_cast<int64_t>(l.val(n.arg(0).tensor_index()).shape.size());
}

void permute_view(Lowerer& l, const Node& n, std::vector<int64_t> perm) {
  l.view(n.outputs()[0], n.arg(0).tensor_index(), [perm](const Idx& i) {
    Idx r(perm.size());
    for (size_t d = 0; d < perm.size(); ++d) r[static_cast<size_t>(perm[d])] = i[d];
    return r;
  });
}

std::vector<int64_t> identity_perm(int64_t nd) {
  std::vector<int64_t> perm(static_cast<size_t>(nd));
  for (int64_t d = 0; d < nd; ++d) perm[static_cast<size_t>(d)] = d;
  return perm;
}

}  // namespace

void lower_same_index_view(Lowerer& l, const Node& n) {
  l.view(n.outputs()[0], n.arg(0).tensor_index(), [](const Idx& i) { return i; });
}

void lower_reshape(Lowerer& l, const Node& n) {
  const int64_t out = n.outputs()[0];
  const int64_t src = n.arg(0).tensor_index();
  if (l.val(src).shape == l.val(out).shape) {
    lower_same_index_view(l, n);
    return;
  }
  // Address the root buffer with this value's own strides.
  int root = static_cast<int>(src);
  while (!l.val(root).materialized &&
         (l.val(root).kind == ValueInfo::Kind::View || l.val(root).kind == ValueInfo::Kind::Reshape))
    root = l.val(root).src;
  l.val(root).materialized = true;
  ValueInfo& info = l.val(out);
  info.kind = ValueInfo::Kind::Reshape;
  info.src = root;
}

void lower_t(Lowerer& l, const Node& n) {
  const int64_t nd = src_rank(l, n);
  std::vector<int64_t> perm = identity_perm(nd);
  if (nd == 2) std::swap(perm[0], perm[1]);
  permute_view(l, n, perm);
}

void lower_permute(Lowerer& l, const Node& n) {
  const int64_t nd = src_rank(l, n);
  std::vector<int64_t> perm = n.arg(1).as_ints();
  for (auto& d : perm) d = norm_dim(d, nd);
  permute_view(l, n, perm);
}

void lower_transpose(Lowerer& l, const Node& n) {
  const int64_t nd = src_rank(l, n);
  std::vector<int64_t> perm = identity_perm(nd);
  std::swap(perm[static_cast<size_t>(norm_dim(n.arg(1).as_int(), nd))],
            perm[static_cast<size_t>(norm_dim(n.arg(2).as_int(), nd))]);
  permute_view(l, n, perm);
}

void lower_expand(Lowerer& l, const Node& n) {
  const auto in_shape = l.val(n.arg(0).tensor_index()).shape;
  l.view(n.outputs()[0], n.arg(0).tensor_index(), [in_shape](const Idx& i) { return Lowerer::bidx(in_shape, i); });
}

void lower_unsqueeze(Lowerer& l, const Node& n) {
  const int64_t d0 = norm_dim(n.arg(1).as_int(), src_rank(l, n) + 1);
  l.view(n.outputs()[0], n.arg(0).tensor_index(), [d0](const Idx& i) {
    Idx r;
    for (size_t d = 0; d < i.size(); ++d)
      if (static_cast<int64_t>(d) != d0) r.push_back(i[d]);
    return r;
  });
}

void lower_squeeze(Lowerer& l, const Node& n, Squeeze which) {
  const auto in_shape = l.val(n.arg(0).tensor_index()).shape;
  const int64_t nd = static_cast<int64_t>(in_shape.size());
  std::vector<char> drop(static_cast<size_t>(nd), 0);
  if (which == Squeeze::AllOnes) {
    for (int64_t d = 0; d < nd; ++d) drop[static_cast<size_t>(d)] = in_shape[static_cast<size_t>(d)] == 1;
  } else {
    std::vector<int64_t> ds = which == Squeeze::Dim ? std::vector<int64_t>{n.arg(1).as_int()} : n.arg(1).as_ints();
    // A dim whose extent is not 1 stays, as in ATen.
    for (auto d : ds) {
      d = norm_dim(d, nd);
      if (d < nd && in_shape[static_cast<size_t>(d)] == 1) drop[static_cast<size_t>(d)] = 1;
    }
  }
  l.view(n.outputs()[0], n.arg(0).tensor_index(), [drop](const Idx& i) {
    Idx r;
    size_t k = 0;
    for (size_t d = 0; d < drop.size(); ++d) r.push_back(drop[d] ? Index::constant(0) : i[k++]);
    return r;
  });
}

void lower_select(Lowerer& l, const Node& n) {
  const auto in_shape = l.val(n.arg(0).tensor_index()).shape;
  const int64_t d0 = norm_dim(n.arg(1).as_int(), static_cast<int64_t>(in_shape.size()));
  int64_t index = n.arg(2).as_int();
  if (index < 0) index += in_shape[static_cast<size_t>(d0)];
  l.view(n.outputs()[0], n.arg(0).tensor_index(), [d0, index](const Idx& i) {
    Idx r = i;
    r.insert(r.begin() + d0, Index::constant(index));
    return r;
  });
}

void lower_slice(Lowerer& l, const Node& n) {
  const auto in_shape = l.val(n.arg(0).tensor_index()).shape;
  const int64_t d0 = norm_dim(n.arg(1).as_int(), static_cast<int64_t>(in_shape.size()));
  const int64_t size = in_shape[static_cast<size_t>(d0)];
  int64_t start = n.arg(2).is_none() ? 0 : n.arg(2).as_int();
  if (start < 0) start += size;
  start = std::clamp<int64_t>(start, 0, size);
  const int64_t step = n.arg(4).as_int();
  l.view(n.outputs()[0], n.arg(0).tensor_index(), [d0, start, step](const Idx& i) {
    Idx r = i;
    r[static_cast<size_t>(d0)] = Index::constant(start) + i[static_cast<size_t>(d0)].scaled(step);
    return r;
  });
}

}  // namespace kiln::inductor
