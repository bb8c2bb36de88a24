#include "schedule.h"

#include <algorithm>
#include <set>

namespace kiln::inductor {

std::vector<int64_t> stripped(std::vector<int64_t> s) {
  while (!s.empty() && s.back() == 1) s.pop_back();
  return s;
}

int64_t prod(const std::vector<int64_t>& s) {
  int64_t p = 1;
  for (auto x : s) p *= x;
  return p;
}

int64_t group_size(const std::vector<int64_t>& shape, const std::vector<int>& group) {
  int64_t n = 1;
  for (int d : group) n *= shape[static_cast<size_t>(d)];
  return n;
}

namespace {

std::vector<int64_t> lcp(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::vector<int64_t> r;
  for (size_t i = 0; i < a.size() && i < b.size() && a[i] == b[i]; ++i) r.push_back(a[i]);
  return r;
}

// The shape a stage iterates as outer + inner: a reduction's kept dims, a pointwise value's shape.
std::vector<int64_t> stage_shape(const ValueInfo& v) {
  return v.kind == ValueInfo::Kind::Reduction ? stripped(v.shape) : v.shape;
}

// Evaluates a stage's body over fresh variables, `outer` of them being the kernel's outer ones.
struct Trial {
  ExprPool pool;
  std::vector<int> outer_vars;
  int root = -1;
};

Trial trial_eval(const LoweredGraph& L, int v, size_t outer_rank) {
  Trial t;
  const ValueInfo& info = L.values[static_cast<size_t>(v)];
  Idx idx;
  for (size_t d = 0; d < info.shape.size(); ++d) {
    int var = t.pool.new_var();
    if (d < outer_rank) t.outer_vars.push_back(var);
    idx.push_back(Index::var(var));
  }
  if (info.kind == ValueInfo::Kind::Reduction) {
    Idx red;
    for (size_t d = 0; d < info.red.red_shape.size(); ++d) red.push_back(Index::var(t.pool.new_var()));
    t.root = info.red.body(t.pool, idx, red);
  } else {
    t.root = L.compute(t.pool, v, idx);
  }
  return t;
}

}  // namespace

bool legal_in_kernel(const LoweredGraph& L, int v, size_t rank, const std::set<int>& in_kernel) {
  Trial t = trial_eval(L, v, rank);
  for (size_t e = 0; e < t.pool.size(); ++e) {
    const Expr& x = t.pool.at(static_cast<int>(e));
    if (x.k != Expr::K::Load || !in_kernel.count(x.value)) continue;
    if (!x.logical_known || x.logical.size() < rank) return false;
    for (size_t d = 0; d < rank; ++d)
      if (!x.logical[d].is_var(t.outer_vars[d])) return false;
  }
  return true;
}

namespace {

// A reduction whose loads walk memory along the last kept dim: vectorize across kept elements.
bool is_column(const LoweredGraph& L, int v) {
  const ValueInfo& info = L.values[static_cast<size_t>(v)];
  const auto s = stripped(info.shape);
  if (s.empty() || s.back() < 4 || info.red.red_shape.empty()) return false;
  Trial t = trial_eval(L, v, s.size());
  const int last = t.outer_vars.back();
  const int inner_red = t.pool.new_var() - 1;  // the last variable made: the innermost reduced dim
  bool along_kept = false;
  for (size_t e = 0; e < t.pool.size(); ++e) {
    const Expr& x = t.pool.at(static_cast<int>(e));
    // A load that does not move with the kept dim (a layer norm's per-row mean and rstd in its
    // weight gradient) is the same for every column: it says nothing about the layout.
    if (x.k != Expr::K::Load || x.idx.coef(last) == 0) continue;
    if (x.idx.coef(inner_red) == 1) return false;  // rows are contiguous: a row reduction is better
    if (x.idx.coef(last) == 1) along_kept = true;
  }
  return along_kept;
}

bool pointwise_kind(const ValueInfo& v) {
  return v.kind == ValueInfo::Kind::Pointwise || v.kind == ValueInfo::Kind::View || v.kind == ValueInfo::Kind::Reshape;
}

}  // namespace

// Neighbouring live dims d, e merge when each index has coef(d) == coef(e) * shape[e]; then
// i_d * coef(d) + i_e * coef(e) is (i_d * shape[e] + i_e) * coef(e), one variable. Dims of extent 1
// are left out (always index 0).
std::vector<std::vector<int>> merged_dims(const LoweredGraph& L, const std::vector<int>& stages,
                                          const std::vector<int64_t>& shape) {
  ExprPool pool;
  std::vector<int> vars;
  Idx idx;
  for (size_t d = 0; d < shape.size(); ++d) {
    vars.push_back(pool.new_var());
    idx.push_back(Index::var(vars.back()));
  }
  std::vector<Index> accesses;
  for (int v : stages) {
    L.compute(pool, v, idx);
    accesses.push_back(LoweredGraph::offset(L.values[static_cast<size_t>(v)], idx));
  }
  for (size_t e = 0; e < pool.size(); ++e) {
    const Expr& x = pool.at(static_cast<int>(e));
    if (x.k == Expr::K::Load || x.k == Expr::K::IndexVal) accesses.push_back(x.idx);
  }
  std::vector<std::vector<int>> groups;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !groups.empty();
    if (merge) {
      const int prev = groups.back().back();
      for (const Index& ix : accesses)
        if (ix.coef(vars[static_cast<size_t>(prev)]) != ix.coef(vars[d]) * shape[d]) {
          merge = false;
          break;
        }
    }
    if (merge) groups.back().push_back(static_cast<int>(d));
    else groups.push_back({static_cast<int>(d)});
  }
  return groups;
}

namespace {

// Loops over merged dims for a kernel whose stages are all pointwise of one shape, when the stages
// stay legal under them: a single stage always; several only when each reads the earlier ones at
// its own outer index (its whole index when everything merged into one loop).
void merge_loops(const LoweredGraph& L, KernelPlan& K) {
  if (K.column || K.stages.empty()) return;
  const std::vector<int64_t> shape = L.values[static_cast<size_t>(K.stages[0])].shape;
  for (int v : K.stages) {
    const ValueInfo& info = L.values[static_cast<size_t>(v)];
    if (!pointwise_kind(info) || info.shape != shape) return;
  }
  auto groups = merged_dims(L, K.stages, shape);
  if (groups.empty()) return;
  // Nothing merged and nothing of extent 1: the plain loops are the same.
  if (groups.size() == shape.size()) return;
  std::vector<int64_t> outer;
  for (size_t g = 0; g + 1 < groups.size(); ++g) outer.push_back(group_size(shape, groups[g]));
  if (K.stages.size() > 1) {
    const bool flat = groups.size() == 1;
    const size_t rank = flat ? shape.size() : static_cast<size_t>(groups.back().front());
    std::set<int> in_kernel;
    for (int v : K.stages) {
      if (!legal_in_kernel(L, v, rank, in_kernel)) return;
      in_kernel.insert(v);
    }
    if (flat) {
      outer = {group_size(shape, groups[0])};
      K.flat = true;
    }
  }
  K.outer = outer;
  K.groups = std::move(groups);
}

}  // namespace

void walk_stores_in_memory_order(const LoweredGraph& L, Program& P) {
  for (KernelPlan& K : P.kernels) {
    if (K.column || K.stages.size() != 1) continue;
    const ValueInfo& info = L.values[static_cast<size_t>(K.stages[0])];
    if (!pointwise_kind(info)) continue;
    const std::vector<int64_t>& shape = info.shape;
    auto groups = K.groups.empty() ? merged_dims(L, K.stages, shape) : K.groups;
    if (groups.size() < 2) continue;
    ExprPool pool;
    Idx idx;
    std::vector<int> vars;
    for (size_t d = 0; d < shape.size(); ++d) {
      vars.push_back(pool.new_var());
      idx.push_back(Index::var(vars.back()));
    }
    const Index store = LoweredGraph::offset(info, idx);
    auto stride = [&](const std::vector<int>& g) { return store.coef(vars[static_cast<size_t>(g.back())]); };
    auto sorted = groups;
    std::stable_sort(sorted.begin(), sorted.end(),
                     [&](const std::vector<int>& a, const std::vector<int>& b) { return stride(a) > stride(b); });
    if (sorted == groups) continue;
    K.outer.clear();
    for (size_t g = 0; g + 1 < sorted.size(); ++g) K.outer.push_back(group_size(shape, sorted[g]));
    K.groups = std::move(sorted);
  }
}

namespace {
// Whether v's reduction reads any of `values` (from their buffers: a column kernel's stages are
// only complete at its end).
bool reads_any(const LoweredGraph& L, int v, const std::set<int>& values) {
  const ValueInfo& info = L.values[static_cast<size_t>(v)];
  ExprPool pool;
  Idx idx, red_idx;
  for (size_t d = 0; d < info.shape.size(); ++d) idx.push_back(Index::var(pool.new_var()));
  for (size_t d = 0; d < info.red.red_shape.size(); ++d) red_idx.push_back(Index::var(pool.new_var()));
  const int root = info.red.body(pool, idx, red_idx);
  std::vector<int> stack{root};
  std::set<int> seen;
  while (!stack.empty()) {
    const int e = stack.back();
    stack.pop_back();
    if (!seen.insert(e).second) continue;
    const Expr& x = pool.at(e);
    if (x.k == Expr::K::Load) {
      if (values.count(x.value)) return true;
      for (int u : values)
        if (x.buf >= 0 && x.buf == L.values[static_cast<size_t>(u)].buffer) return true;
    }
    for (int c : x.args) stack.push_back(c);
    for (const auto& [ee, k] : x.idx.exprs) stack.push_back(ee);
  }
  return false;
}
}  // namespace

void join_sibling_columns(const LoweredGraph& L, Program& P, size_t most) {
  std::vector<KernelPlan> kernels;
  std::vector<Step> steps;
  for (const Step& st : P.steps) {
    if (st.kernel < 0) {
      steps.push_back(st);
      continue;
    }
    const KernelPlan& K = P.kernels[static_cast<size_t>(st.kernel)];
    if (K.column && K.stages.size() == 1 && !steps.empty() && steps.back().kernel >= 0) {
      KernelPlan& prev = kernels[static_cast<size_t>(steps.back().kernel)];
      const ValueInfo& a = L.values[static_cast<size_t>(prev.stages[0])];
      const ValueInfo& b = L.values[static_cast<size_t>(K.stages[0])];
      const std::set<int> in_prev(prev.stages.begin(), prev.stages.end());
      if (prev.column && prev.stages.size() < most && !a.red.scatter && !b.red.scatter && a.shape == b.shape &&
          a.red.red_shape == b.red.red_shape && !reads_any(L, K.stages[0], in_prev)) {
        prev.stages.push_back(K.stages[0]);
        prev.work += K.work;
        continue;
      }
    }
    kernels.push_back(K);
    steps.push_back(Step{static_cast<int>(kernels.size() - 1), -1});
  }
  P.kernels = std::move(kernels);
  P.steps = std::move(steps);
}

Program schedule(const LoweredGraph& L) {
  Program P;
  KernelPlan cur;
  std::set<int> in_kernel;
  bool open = false;
  std::set<int> extern_done;
  auto close = [&] {
    if (open) {
      merge_loops(L, cur);
      P.kernels.push_back(cur), P.steps.push_back(Step{static_cast<int>(P.kernels.size() - 1), -1});
    }
    open = false;
    cur = KernelPlan{};
    in_kernel.clear();
  };
  for (int v : L.order) {
    const ValueInfo& info = L.values[static_cast<size_t>(v)];
    if (info.kind == ValueInfo::Kind::Extern) {
      if (extern_done.insert(info.ext.node).second) {
        close();
        P.steps.push_back(Step{-1, info.ext.node});
      }
      continue;
    }
    const bool red = info.kind == ValueInfo::Kind::Reduction;
    const auto shape = stage_shape(info);
    const int64_t work =
        std::max<int64_t>(info.numel(), 1) * (red ? std::max<int64_t>(prod(info.red.red_shape), 1) : 1);
    // A scatter-add is a kernel of its own (the CUDA emitter's scatter); so is a column reduction.
    if (red && (info.red.scatter || is_column(L, v))) {
      close();
      cur.outer = shape;
      cur.stages = {v};
      cur.column = true;
      cur.work = work;
      open = true;
      close();
      continue;
    }
    if (open && !cur.column) {
      const auto p = lcp(cur.outer, shape);
      bool ok = !red || p.size() == shape.size();
      ok = ok && (!p.empty() || cur.outer.empty());
      ok = ok && (p == cur.outer || prod(p) >= 8);
      // A kernel without an outer loop runs each stage as its own loop nest; a large stage of
      // another shape is better off in a kernel of its own, whose loops can then be fused.
      if (ok && cur.outer.empty() && shape != stage_shape(L.values[static_cast<size_t>(cur.stages[0])]) &&
          (work >= kParallelThreshold || cur.work >= kParallelThreshold))
        ok = false;
      if (ok && !legal_in_kernel(L, v, p.size(), in_kernel)) ok = false;
      if (ok) {
        cur.outer = p;
        cur.stages.push_back(v);
        cur.work += work;
        in_kernel.insert(v);
        continue;
      }
    }
    close();
    cur.outer =
        red ? shape
            : (shape.size() >= 2 ? std::vector<int64_t>(shape.begin(), shape.end() - 1) : std::vector<int64_t>{});
    cur.stages = {v};
    cur.work = work;
    in_kernel.insert(v);
    open = true;
  }
  close();
  return P;
}

}  // namespace kiln::inductor
