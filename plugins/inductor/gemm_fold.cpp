#include "gemm_fold.h"

#include <algorithm>

namespace kiln::inductor {

using plugin::Arg;
using plugin::Graph;
using plugin::Node;

std::vector<int64_t> GemmFold::inputs() const {
  std::vector<int64_t> r = {x, y};
  for (int64_t v : {bias, c, aux_in})
    if (v >= 0) r.push_back(v);
  return r;
}

std::vector<int64_t> GemmFold::outputs() const {
  std::vector<int64_t> r = {d};
  for (int64_t v : {aux_out, bias_grad})
    if (v >= 0) r.push_back(v);
  return r;
}

namespace {

bool is_reshape_op(const std::string& op) {
  return op == "aten::view" || op == "aten::_unsafe_view" || op == "aten::reshape";
}

bool float_ty(DLDataType t, bool* bf16) {
  if (t.lanes != 1) return false;
  if (t.code == kDLFloat && t.bits == 32) return *bf16 = false, true;
  if (t.code == kDLBfloat && t.bits == 16) return *bf16 = true, true;
  return false;
}

bool same_dtype(DLDataType a, DLDataType b) { return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes; }

double number(const Node& n, const char* name, double dflt) {
  auto a = n.find_arg(name);
  if (!a || a->is_none()) return dflt;
  if (a->runtime_scalar() >= 0) return -1e300;  // a value that may change: not folded
  if (a->tag() == KILN_ARG_BOOL) return a->as_bool() ? 1 : 0;
  if (a->tag() != KILN_ARG_INT && a->tag() != KILN_ARG_DOUBLE) return -1e300;
  return a->as_double();
}

std::string string_arg(const Node& n, const char* name) {
  auto a = n.find_arg(name);
  return a && a->tag() == KILN_ARG_STRING ? a->as_string() : "";
}

int64_t tensor_arg(const Node& n, const char* name) {
  auto a = n.find_arg(name);
  return a && a->is_tensor() ? a->tensor_index() : -1;
}

class Planner {
 public:
  Planner(const Graph& g, const std::function<std::string(const GemmSpec&)>& supported) : g_(g), ok_(supported) {
    readers_.resize(g.num_values());
    producer_.assign(g.num_values(), -1);
    for (size_t i = 0; i < g.num_nodes(); ++i) {
      const Node n = g.node(static_cast<int64_t>(i));
      for (int64_t v : n.inputs())
        if (v >= 0) readers_[static_cast<size_t>(v)].push_back(static_cast<int64_t>(i));
      for (int64_t v : n.outputs())
        if (v >= 0) producer_[static_cast<size_t>(v)] = static_cast<int64_t>(i);
    }
    is_output_.assign(g.num_values(), 0);
    for (int64_t v : g.outputs()) is_output_[static_cast<size_t>(v)] = 1;
  }

  GemmPlan plan(bool epilogues) {
    for (size_t i = 0; i < g_.num_nodes(); ++i) {
      const Node n = g_.node(static_cast<int64_t>(i));
      if (n.op() != "aten::mm" && n.op() != "aten::addmm") continue;
      GemmFold f;
      if (!base(n, &f)) continue;
      if (epilogues) fold_reader(&f);
      plan_.gemms.emplace(f.node, f);
      for (int64_t u : f.folded) plan_.folded_into[u] = f.node;
    }
    if (epilogues) fold_bias_grads();
    return std::move(plan_);
  }

 private:
  // A 2-D float32 or bfloat16 matrix with a unit stride, or nothing.
  bool matrix(int64_t v, DLDataType* dt, int64_t* rows, int64_t* cols, int64_t* rs, int64_t* cs) const {
    if (v < 0) return false;
    const auto val = g_.value(v);
    bool bf16 = false;
    if (val.ndim() != 2 || !float_ty(val.dtype(), &bf16)) return false;
    *dt = val.dtype();
    *rows = val.shape()[0], *cols = val.shape()[1];
    *rs = val.strides()[0], *cs = val.strides()[1];
    return true;
  }

  // Contiguous, `numel` elements, last dim `n`: the same memory as a dense [numel / n, n] matrix.
  bool dense_rows(int64_t v, int64_t numel, int64_t n, DLDataType dt) const {
    const auto val = g_.value(v);
    if (!same_dtype(val.dtype(), dt) || val.numel() != numel || !val.is_contiguous()) return false;
    const auto shape = val.shape();
    return !shape.empty() && shape.back() == n && val.raw()->storage_offset == 0;
  }

  bool base(const Node& n, GemmFold* f) const {
    const bool addmm = n.op() == "aten::addmm";
    const int64_t x = tensor_arg(n, addmm ? "mat1" : "self"), y = tensor_arg(n, addmm ? "mat2" : "mat2");
    if (n.outputs().size() != 1 || n.outputs()[0] < 0) return false;
    const int64_t d = n.outputs()[0];
    DLDataType xt, yt, dt;
    int64_t xr, xc, xrs, xcs, yr, yc, yrs, ycs, dr, dc, drs, dcs;
    if (!matrix(x, &xt, &xr, &xc, &xrs, &xcs) || !matrix(y, &yt, &yr, &yc, &yrs, &ycs) ||
        !matrix(d, &dt, &dr, &dc, &drs, &dcs))
      return false;
    if (!same_dtype(xt, yt) || !same_dtype(xt, dt) || xc != yr || dr != xr || dc != yc) return false;
    if (dcs != 1 && dc > 1) return false;
    GemmSpec s;
    float_ty(dt, &s.bf16);
    s.m = xr, s.n = yc, s.k = xc;
    s.x_rs = xrs, s.x_cs = xcs, s.y_rs = yrs, s.y_cs = ycs;
    s.d_ld = dr > 1 ? drs : std::max<int64_t>(dc, 1);
    f->node = n.index();
    f->x = x, f->y = y, f->d = d;
    if (addmm) {
      if (number(n, "alpha", 1) != 1 || number(n, "beta", 1) != 1) return false;
      const int64_t b = tensor_arg(n, "self");
      if (b < 0) return false;
      const auto bv = g_.value(b);
      if (!same_dtype(bv.dtype(), dt)) return false;
      const auto bs = bv.shape(), bst = bv.strides();
      if (bv.ndim() == 1 && bs[0] == s.n && (bst[0] == 1 || s.n == 1)) {
        s.bias = true, f->bias = b;
      } else if (bv.ndim() == 2 && bs[0] == 1 && bs[1] == s.n && (bst[1] == 1 || s.n == 1)) {
        s.bias = true, f->bias = b;
      } else if (bv.ndim() == 2 && bs[0] == s.m && bs[1] == s.n && (bst[1] == 1 || s.n == 1) && bst[0] >= s.n) {
        s.c = true, s.c_ld = bst[0], f->c = b;
      } else {
        return false;
      }
    }
    if (!s.why_not().empty() || !ok_(s).empty()) return false;
    f->spec = s;
    return true;
  }

  // The GEMM's result and the reshapes of it that keep its memory (contiguous, same elements,
  // rows of n), each with its reshape node.
  std::vector<int64_t> aliases(int64_t d, int64_t numel, int64_t n, DLDataType dt, std::vector<int64_t>* views) const {
    std::vector<int64_t> out = {d};
    for (size_t i = 0; i < out.size(); ++i)
      for (int64_t u : readers_[static_cast<size_t>(out[i])]) {
        const Node r = g_.node(u);
        if (!is_reshape_op(r.op()) || r.outputs().size() != 1 || r.outputs()[0] < 0) continue;
        if (!dense_rows(r.outputs()[0], numel, n, dt)) continue;
        out.push_back(r.outputs()[0]);
        if (views) views->push_back(u);
      }
    return out;
  }

  // A value produced before node `before` (or a group input): one the GEMM can read.
  bool ready_before(int64_t v, int64_t before) const { return producer_[static_cast<size_t>(v)] < before; }

  // Whether value `v` is computed from node `node`'s results (nodes before `node` are not).
  bool depends_on(int64_t v, int64_t node) const {
    std::vector<int64_t> todo = {v};
    std::vector<char> seen(g_.num_values(), 0);
    while (!todo.empty()) {
      const int64_t w = todo.back();
      todo.pop_back();
      if (w < 0 || seen[static_cast<size_t>(w)]) continue;
      seen[static_cast<size_t>(w)] = 1;
      const int64_t p = producer_[static_cast<size_t>(w)];
      if (p == node) return true;
      if (p < node) continue;
      // A node folded into a matmul is computed there: it waits for that matmul's inputs too.
      auto in = plan_.folded_into.find(p);
      const Node pn = g_.node(in == plan_.folded_into.end() ? p : in->second);
      for (int64_t u : pn.inputs()) todo.push_back(u);
      for (int64_t u : g_.node(p).inputs()) todo.push_back(u);
    }
    return false;
  }

  void fold_reader(GemmFold* f) {
    GemmSpec& s = f->spec;
    if (s.c) return;
    const DLDataType dt = g_.value(f->d).dtype();
    const int64_t numel = s.m * s.n;
    if (!dense_rows(f->d, numel, s.n, dt)) return;
    std::vector<int64_t> views;
    const std::vector<int64_t> al = aliases(f->d, numel, s.n, dt, &views);
    // Readers of the result other than the reshapes, and whether a result leaves the group.
    std::vector<int64_t> readers;
    bool leaves = false;
    for (int64_t a : al) {
      leaves = leaves || is_output_[static_cast<size_t>(a)];
      for (int64_t u : readers_[static_cast<size_t>(a)])
        if (std::find(views.begin(), views.end(), u) == views.end() &&
            std::find(readers.begin(), readers.end(), u) == readers.end())
          readers.push_back(u);
    }
    auto reads_alias_as = [&](const Node& u, const char* name) {
      const int64_t v = tensor_arg(u, name);
      return v >= 0 && std::find(al.begin(), al.end(), v) != al.end();
    };
    auto dense_out = [&](const Node& u) {
      return u.outputs().size() == 1 && u.outputs()[0] >= 0 && dense_rows(u.outputs()[0], numel, s.n, dt);
    };
    for (int64_t ui : readers) {
      if (plan_.folded_into.count(ui)) continue;
      const Node u = g_.node(ui);
      GemmSpec t = s;
      GemmFold h = *f;
      h.folded = {ui};
      h.d = u.outputs().empty() ? -1 : u.outputs()[0];
      t.d_ld = s.n;
      const bool alone = readers.size() == 1 && !leaves;
      if (u.op() == "aten::gelu" && s.bf16 && string_arg(u, "approximate") == "tanh" && reads_alias_as(u, "self") &&
          dense_out(u)) {
        t.act = GemmAct::Gelu;
        if (!alone) {
          // The other readers read the GELU's input: the GEMM writes it as aux.
          if (s.d_ld != s.n) continue;
          t.aux = true, t.aux_ld = s.n, h.aux_out = f->d;
        }
      } else if (u.op() == "aten::relu" && alone && reads_alias_as(u, "self") && dense_out(u)) {
        t.act = GemmAct::Relu;
      } else if (u.op() == "aten::add.Tensor" && alone && number(u, "alpha", 1) == 1 && dense_out(u)) {
        // The other operand (with addmm's bias, both fold): same dtype, shape and memory layout as the sum, ready
        // before the GEMM.
        const int64_t a = tensor_arg(u, "self"), b = tensor_arg(u, "other");
        if (a < 0 || b < 0) continue;
        const bool first = std::find(al.begin(), al.end(), a) != al.end();
        const int64_t r = first ? b : a;
        if (std::find(al.begin(), al.end(), r) != al.end()) continue;
        if (!dense_rows(r, numel, s.n, dt) || g_.value(r).shape() != g_.value(h.d).shape()) continue;
        if (!ready_before(r, f->node)) continue;
        t.c = true, t.c_ld = s.n, h.c = r;
      } else if (u.op() == "aten::gelu_backward" && s.bf16 && alone && !s.bias &&
                 string_arg(u, "approximate") == "tanh" && reads_alias_as(u, "grad_output") && dense_out(u)) {
        const int64_t pre = tensor_arg(u, "self");
        if (pre < 0 || std::find(al.begin(), al.end(), pre) != al.end()) continue;
        if (!dense_rows(pre, numel, s.n, dt) || !ready_before(pre, f->node)) continue;
        t.act = GemmAct::DGelu, t.aux = true, t.aux_ld = s.n, h.aux_in = pre;
      } else {
        continue;
      }
      if (!t.why_not().empty() || !ok_(t).empty()) continue;
      h.spec = t;
      if (h.aux_out < 0)
        for (int64_t a : al) plan_.dead.insert(a);
      *f = h;
      return;
    }
  }

  // A sum over every dim but the last, into a dense vector of the same dtype.
  bool bias_grad_sum(const Node& n, int64_t* in, int64_t* len) const {
    if (n.op() != "aten::sum.dim_IntList" || n.outputs().size() != 1 || n.outputs()[0] < 0) return false;
    auto dt = n.find_arg("dtype");
    if (dt && !dt->is_none()) return false;
    *in = tensor_arg(n, "self");
    if (*in < 0) return false;
    const auto iv = g_.value(*in), ov = g_.value(n.outputs()[0]);
    const int nd = iv.ndim();
    if (nd < 2 || !same_dtype(iv.dtype(), ov.dtype()) || !ov.is_contiguous()) return false;
    auto dims = n.find_arg("dim");
    if (!dims || dims->tag() != KILN_ARG_INT_LIST) return false;
    std::vector<int64_t> ds = dims->as_ints();
    for (auto& d : ds) d = d < 0 ? d + nd : d;
    std::sort(ds.begin(), ds.end());
    ds.erase(std::unique(ds.begin(), ds.end()), ds.end());
    if (static_cast<int>(ds.size()) != nd - 1 || ds.back() != nd - 2) return false;
    *len = iv.shape().back();
    return ov.numel() == *len;
  }

  void fold_bias_grads() {
    for (size_t i = 0; i < g_.num_nodes(); ++i) {
      const Node n = g_.node(static_cast<int64_t>(i));
      int64_t r = -1, len = 0;
      if (plan_.folded_into.count(n.index()) || !bias_grad_sum(n, &r, &len)) continue;
      const DLDataType dt = g_.value(r).dtype();
      const int64_t numel = g_.value(r).numel();
      if (!dense_rows(r, numel, len, dt)) continue;
      // The summed matrix's reshapes (the [B*T, C] view a matmul reads of a [B, T, C] gradient),
      // and its [C, B*T] transposes.
      std::vector<int64_t> same = {r};
      for (size_t k = 0; k < same.size(); ++k) {
        for (int64_t u : readers_[static_cast<size_t>(same[k])]) {
          const Node v = g_.node(u);
          if (is_reshape_op(v.op()) && v.outputs().size() == 1 && v.outputs()[0] >= 0 &&
              dense_rows(v.outputs()[0], numel, len, dt) &&
              std::find(same.begin(), same.end(), v.outputs()[0]) == same.end())
            same.push_back(v.outputs()[0]);
        }
        // The producer's side too: the sum may read a reshape of what the matmul reads.
        const int64_t p = producer_[static_cast<size_t>(same[k])];
        if (p >= 0 && is_reshape_op(g_.node(p).op())) {
          const int64_t src = g_.node(p).arg(0).is_tensor() ? g_.node(p).arg(0).tensor_index() : -1;
          if (src >= 0 && dense_rows(src, numel, len, dt) && std::find(same.begin(), same.end(), src) == same.end())
            same.push_back(src);
        }
      }
      auto in_same = [&](int64_t v) { return std::find(same.begin(), same.end(), v) != same.end(); };
      for (auto& [node, f] : plan_.gemms) {
        if (f.bias_grad >= 0) continue;
        GemmSpec t = f.spec;
        if (f.spec.act == GemmAct::DGelu && in_same(f.d) && f.spec.n == len) {
          t.bias_grad = GemmBiasGrad::OfD;
        } else if (f.spec.act == GemmAct::None && !f.spec.bias && !f.spec.c && in_same(f.y) && f.spec.n == len &&
                   f.spec.y_cs == 1 && f.spec.y_rs == len) {
          t.bias_grad = GemmBiasGrad::OfY;  // column sums of Y = the sum over its rows
        } else if (f.spec.act == GemmAct::None && !f.spec.bias && !f.spec.c && f.spec.m == len && f.spec.x_rs == 1 &&
                   f.spec.x_cs == len && producer_[static_cast<size_t>(f.x)] >= 0) {
          // X = the summed matrix transposed: row sums of X.
          const Node t_node = g_.node(producer_[static_cast<size_t>(f.x)]);
          const bool transposed = t_node.op() == "aten::t" || t_node.op() == "aten::transpose.int";
          if (!transposed || !t_node.arg(0).is_tensor() || !in_same(t_node.arg(0).tensor_index())) continue;
          t.bias_grad = GemmBiasGrad::OfX;
        } else {
          continue;
        }
        // The sum's result is then computed at the matmul: nothing the matmul reads may need it.
        bool cycle = false;
        for (int64_t v : f.inputs()) cycle = cycle || depends_on(v, n.index());
        if (cycle || !t.why_not().empty() || !ok_(t).empty()) continue;
        f.spec = t;
        f.bias_grad = n.outputs()[0];
        f.folded.push_back(n.index());
        plan_.folded_into[n.index()] = node;
        break;
      }
    }
  }

  const Graph& g_;
  const std::function<std::string(const GemmSpec&)>& ok_;
  std::vector<std::vector<int64_t>> readers_;
  std::vector<int64_t> producer_;
  std::vector<char> is_output_;
  GemmPlan plan_;
};

}  // namespace

GemmPlan plan_gemms(const Graph& g, bool epilogues, const std::function<std::string(const GemmSpec&)>& supported) {
  return Planner(g, supported).plan(epilogues);
}

}  // namespace kiln::inductor
