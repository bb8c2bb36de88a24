// See scratch_plan.h.
#include "scratch_plan.h"

#include <algorithm>
#include <numeric>

namespace kiln::inductor {

namespace {

// Index variables 0..rank-1 of a fresh pool: made in the same order in every pool, so that equal
// indices have equal keys across pools.
Idx index_vars(ExprPool& pool, size_t rank) {
  Idx idx;
  for (size_t d = 0; d < rank; ++d) idx.push_back(Index::var(pool.new_var()));
  return idx;
}

// Stage `v`'s definition at its index variables, evaluated into `pool` (whose loads are what the
// emitted code reads, or more): a reduction's body and scatter, else the value itself.
void evaluate_stage(const LoweredGraph& L, int v, ExprPool& pool) {
  const ValueInfo& info = L.values[static_cast<size_t>(v)];
  const Idx idx = index_vars(pool, info.shape.size());
  if (info.kind != ValueInfo::Kind::Reduction) {
    L.compute(pool, v, idx);
    return;
  }
  Idx red;
  for (size_t d = 0; d < info.red.red_shape.size(); ++d) red.push_back(Index::var(pool.new_var()));
  info.red.body(pool, idx, red);
  if (info.red.scatter) {
    info.red.scatter->key(pool, red);
    info.red.scatter->term(pool, idx, red);
  }
}

}  // namespace

int buffer_of(const LoweredGraph& L, int64_t v) {
  if (v < 0) return -1;
  auto r = static_cast<size_t>(v);
  while (L.values[r].buffer < 0 && L.values[r].src >= 0) r = static_cast<size_t>(L.values[r].src);
  return L.values[r].buffer;
}

ScratchPlan plan_scratch(const std::vector<int64_t>& slot_bytes, size_t first_slot,
                         const std::vector<std::set<int>>& touches, int64_t align, int64_t slack) {
  const size_t n = slot_bytes.size();
  ScratchPlan plan;
  plan.offset.assign(n, 0);
  plan.last_use.assign(touches.size(), {});
  std::vector<int64_t> size(n);
  for (size_t s = 0; s < n; ++s) {
    size[s] = (std::max<int64_t>(slot_bytes[s], 1) + slack + align - 1) / align * align;
    plan.unplanned += size[s];
  }
  // Each slot's first and last step; a slot no step touches is never alive.
  constexpr int kNever = -1;
  std::vector<int> first(n, kNever), last(n, kNever);
  bool unknown = false;
  for (size_t t = 0; t < touches.size(); ++t)
    for (int b : touches[t]) {
      if (b < 0) unknown = true;
      if (b < static_cast<int>(first_slot) || b >= static_cast<int>(first_slot + n)) continue;
      const size_t s = static_cast<size_t>(b) - first_slot;
      if (first[s] == kNever) first[s] = static_cast<int>(t);
      last[s] = static_cast<int>(t);
    }
  if (unknown) {
    // One place per slot, as without a plan.
    int64_t at = 0;
    for (size_t s = 0; s < n; ++s) {
      plan.offset[s] = at;
      at += size[s];
    }
    plan.bytes = at;
    return plan;
  }
  for (size_t s = 0; s < n; ++s)
    if (last[s] != kNever) plan.last_use[static_cast<size_t>(last[s])].push_back(static_cast<int>(s));
  std::vector<size_t> by_size(n);
  std::iota(by_size.begin(), by_size.end(), size_t{0});
  std::stable_sort(by_size.begin(), by_size.end(), [&](size_t a, size_t b) { return size[a] > size[b]; });
  struct Placed {
    int64_t lo, hi;  // bytes [lo, hi)
    int first, last;
  };
  std::vector<Placed> placed;
  for (size_t s : by_size) {
    if (first[s] == kNever) continue;  // offset 0: nothing reads or writes it
    // The byte ranges of the placed slots alive while this one is, lowest first; the first gap
    // that fits takes it.
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (const Placed& p : placed)
      if (p.first <= last[s] && first[s] <= p.last) busy.emplace_back(p.lo, p.hi);
    std::sort(busy.begin(), busy.end());
    int64_t at = 0;
    for (const auto& [lo, hi] : busy) {
      if (at + size[s] <= lo) break;
      at = std::max(at, hi);
    }
    plan.offset[s] = at;
    placed.push_back({at, at + size[s], first[s], last[s]});
    plan.bytes = std::max(plan.bytes, at + size[s]);
  }
  plan.planned = true;
  return plan;
}

std::vector<std::set<int>> cpu_step_touches(const LoweredGraph& L, const Program& P,
                                            const std::vector<std::vector<int64_t>>& extern_reads,
                                            const std::vector<std::vector<int64_t>>& extern_writes) {
  std::vector<std::set<int>> touches(P.steps.size());
  for (size_t t = 0; t < P.steps.size(); ++t) {
    std::set<int>& out = touches[t];
    const Step& st = P.steps[t];
    if (st.kernel < 0) {
      const auto node = static_cast<size_t>(st.extern_node);
      for (const auto* list : {&extern_reads.at(node), &extern_writes.at(node)})
        for (int64_t v : *list)
          if (v >= 0) out.insert(buffer_of(L, v));
      continue;
    }
    for (int v : P.kernels[static_cast<size_t>(st.kernel)].stages) {
      out.insert(buffer_of(L, v));
      // Every buffer the stage's definition loads (what the emitted code reads, or more).
      ExprPool trial;
      evaluate_stage(L, v, trial);
      for (size_t e = 0; e < trial.size(); ++e) {
        const Expr& x = trial.at(static_cast<int>(e));
        if (x.k == Expr::K::Load) out.insert(x.buf);
      }
    }
  }
  return touches;
}

std::vector<int64_t> cpu_inplace_outputs(const LoweredGraph& L, const Program& P, const std::vector<int64_t>& wanted,
                                         const std::vector<std::set<int>>& touches) {
  std::vector<int64_t> ok(wanted.size(), -1);
  for (size_t k = 0; k < wanted.size(); ++k) {
    if (wanted[k] < 0) continue;
    const int in = static_cast<int>(wanted[k]), out = static_cast<int>(L.num_inputs + k);
    // The one step that touches the output first must be its writer; a kernel stage stores it.
    int writer = -1;
    for (size_t t = 0; t < P.steps.size() && writer < 0; ++t)
      if (touches[t].count(out) || touches[t].count(-1)) writer = static_cast<int>(t);
    if (writer < 0 || P.steps[static_cast<size_t>(writer)].kernel < 0) continue;
    const KernelPlan& K = P.kernels[static_cast<size_t>(P.steps[static_cast<size_t>(writer)].kernel)];
    if (K.column) continue;
    bool safe = true;
    // No extern step after it either: ATen's kernels are what may fail in an execute, and a failure
    // must come before the first write into an input (the executable promises so: inplace_atomic).
    for (size_t t = static_cast<size_t>(writer) + 1; t < P.steps.size() && safe; ++t)
      safe = !touches[t].count(in) && !touches[t].count(-1) && P.steps[t].kernel >= 0;
    int stores_out = -1;
    for (size_t p = 0; p < K.stages.size() && safe; ++p) {
      const int b = buffer_of(L, K.stages[p]);
      if (b == in || b < 0) safe = false;
      if (b == out) safe = safe && stores_out < 0, stores_out = static_cast<int>(p);
    }
    if (!safe || stores_out < 0) continue;
    // Each stage in a pool of its own (a pool shares equal expressions), its index variables made
    // in the same order, so that equal indices have equal keys across pools: in a row kernel the
    // outer variables are the same for every stage.
    const ValueInfo& o = L.values[static_cast<size_t>(K.stages[static_cast<size_t>(stores_out)])];
    ExprPool at_pool;
    const std::string at = LoweredGraph::offset(o, index_vars(at_pool, o.shape.size())).key();
    for (size_t p = 0; p < K.stages.size() && safe; ++p) {
      const int v = K.stages[p];
      const ValueInfo& info = L.values[static_cast<size_t>(v)];
      ExprPool trial;
      evaluate_stage(L, v, trial);
      const bool pointwise = info.kind == ValueInfo::Kind::Pointwise || info.kind == ValueInfo::Kind::View ||
                             info.kind == ValueInfo::Kind::Reshape;
      // A stage that reads the input: element-wise, of the output's shape, at the element the
      // output's stage stores, and not after it (one thread computes a row's stages in turn, or
      // each stage finishes before the next begins).
      for (size_t e = 0; e < trial.size() && safe; ++e) {
        const Expr& x = trial.at(static_cast<int>(e));
        if (x.k != Expr::K::Load || x.buf != in) continue;
        safe = pointwise && p <= static_cast<size_t>(stores_out) && info.shape == o.shape && x.idx.key() == at;
      }
    }
    if (safe) ok[k] = wanted[k];
  }
  return ok;
}

}  // namespace kiln::inductor
