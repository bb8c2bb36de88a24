// CompiledStep: the cache of plans by signature, and the dispatch of every call to one of
// capture, plan, run, or the eager step.
//
//   call 1                      eager (so that optimizer state exists)
//   a new signature             capture (step_capture) -> probe look-ahead -> plan (plan_step)
//   a known signature           guards -> optimizer probe -> run (step_runner)
//   anything failed             the eager step, from exactly the state eager would see
//
// Guards (step_guards.h): the input signature selects the plan; a change in the modules' structure
// drops every plan and captures again. The optimizer probe (optimizer_probe.h) replays every
// optimizer's step() on the host before each compiled step: its calls must still be the captured
// ones (else the step is captured again) and it yields the run-time scalars' values. Past
// args.runtime.recompile_limit signatures or recaptures kiln warns once and runs eagerly.
//
// Dynamic shapes ([runtime] dynamic, mark_dynamic): the signatures that differ only in their
// inputs' sizes form a family. Its first shape is captured and planned static. When a second shape
// comes, it is captured too (that step is real either way) and the two captures are unified
// (ir/shape_unify): each size-derived number becomes an expression over the dimensions that
// changed. Every later shape those symbols cover is planned from the symbolic step without running
// the step function (a specialisation), checked against the inputs it is given, and kept in a
// cache of dynamic_shape_cache plans (least recently used dropped) that recompile_limit does not
// count. A shape it does not cover (another dimension changed, a size 0 or 1) is captured and
// unified again, or planned static when the captures cannot be unified.
#include "kiln/compile.h"

#include <algorithm>
#include <mutex>
#include <chrono>
#include <list>
#include <map>
#include <set>
#include <thread>

#include <ATen/Context.h>
#include <c10/util/StringUtil.h>

#include "kiln/internal/backend.h"
#include "kiln/internal/plugin_crash.h"
#include "kiln/internal/shape_unify.h"
#include "kiln/log.h"
#include "optimizer_probe.h"
#include "plan_step.h"
#include "step_capture.h"
#include "step_guards.h"
#include "step_runner.h"

namespace kiln {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

struct CompiledStep::Impl {
  StepFn fn;
  StepState state;
  TrainingArguments args;
  ResolvedBackend resolved;  // plugin null: every node runs on the eager executor
  std::vector<std::string> backend_reasons;
  StepStats stats;
  bool last_compiled = false;
  std::set<std::string> warned;
  std::unique_ptr<StepGuards> guards;
  std::unique_ptr<StepProbe> probe;
  bool structure_eager = false;  // the structure kept changing past recompile_limit: every step runs eagerly
  // Captures that failed, by signature without sizes: a new shape with the same cause runs eagerly
  // at once instead of paying another failing capture.
  std::map<std::vector<int64_t>, std::string> failed_captures;

  struct Entry {
    std::vector<int64_t> shapeless;
    bool compiled = false;
    bool retry = false;  // captured again at the next step
    std::string reason;  // why it runs eagerly
    CapturedStep captured;
    ProbeState probe;
    std::vector<c10::IValue> scalars;  // the run-time scalars' values for the next run
    std::unique_ptr<StepRunner> runner;
    bool specialised = false;  // planned from its family's symbolic step, not captured
  };
  std::map<std::vector<int64_t>, std::unique_ptr<Entry>> cache;
  Entry* last = nullptr;
  int captured_entries = 0;  // entries of `cache` made by a capture (what recompile_limit counts)

  // The signatures that differ only in the inputs' sizes (dynamic shapes).
  struct Family {
    struct Capture {
      std::vector<int64_t> sig;
      CapturedStep captured;
      ProbeState probe;
    };
    std::vector<Capture> captures;  // captured shapes, the first first (the symbolic step's base)
    std::optional<ir::SymbolicStep> sym;
    size_t base = 0;                            // the capture whose bindings the symbolic step's graph has
    std::vector<std::pair<int, int64_t>> dims;  // per symbol: (input, dim)
    std::string refused;                        // why its shapes cannot share a symbolic step ("" if they can)
    std::list<std::vector<int64_t>> lru;        // specialised signatures, the most recently used first
    std::shared_ptr<SymbolicGroups> groups;     // compiled groups its plans share (symbolic_groups.h)
  };
  std::map<std::vector<int64_t>, Family> families;  // by signature without sizes
  std::set<std::pair<int, int64_t>> marked;         // mark_dynamic: (input, dim)
  // The memory pool the CUDA graphs of a signature's shapes share, by signature without sizes.
  std::map<std::vector<int64_t>, std::shared_ptr<SharedGraphPool>> graph_pools;

  void warn_once(const std::string& msg) {
    if (warned.insert(msg).second) log_warn(msg);
  }

  void fallback(const std::string& why) {
    stats.last_fallback = why;
    if (args.runtime.fullgraph) throw CompileError(why + " (fullgraph = true)");
    warn_once(why + "; running this step eagerly");
  }

  std::vector<at::Tensor> eager(const std::vector<at::Tensor>& inputs) {
    ++stats.eager_steps;
    last_compiled = false;
    return fn(inputs);
  }

  void drop_plans() {
    cache.clear();
    families.clear();
    graph_pools.clear();
    captured_entries = 0;
    last = nullptr;
  }

  // Adds the slots of `from` that `to` lacks, numbered after `to`'s (a slot's number is its index
  // among the step's run-time scalars).
  static void merge_slots(ScalarSlots& to, const ScalarSlots& from) {
    for (const auto& [at, idx] : from)
      if (!to.count(at)) to.emplace(at, static_cast<int32_t>(to.size()));
  }

  bool dynamic_on() const { return args.runtime.dynamic != "false" || !marked.empty(); }

  // "input 0 dim 1 changed 37 -> 52", for each dimension of a user input that differs between
  // two captures; with the (input, dim) pairs.
  static std::string changed_dims(const CapturedStep& a, const CapturedStep& b,
                                  std::vector<std::pair<int, int64_t>>* dims = nullptr) {
    std::string text;
    for (size_t i = 0; i < a.raw.inputs.size() && i < b.raw.inputs.size(); ++i) {
      const auto& in = a.raw.inputs[i];
      if (in.role != ir::InputRole::UserInput) continue;
      const auto u = a.user.find(in.name);
      if (u == a.user.end()) continue;
      const auto& sa = a.raw.value(in.value).meta.shape;
      const auto& sb = b.raw.value(b.raw.inputs[i].value).meta.shape;
      for (size_t d = 0; d < sa.size() && d < sb.size(); ++d) {
        if (sa[d] == sb[d]) continue;
        text += c10::str(text.empty() ? "" : ", ", "input ", u->second, " dim ", d, " changed ", sa[d], " -> ", sb[d]);
        if (dims) dims->emplace_back(u->second, static_cast<int64_t>(d));
      }
    }
    return text;
  }

  // After a capture of a family's new shape: unify it with the family's first capture, so that
  // later shapes are planned without a capture. Keeps what it needs of the entry.
  void learn_shape(const std::vector<int64_t>& sig, Entry& e) {
    Family& f = families[e.shapeless];
    // Captures kept to unify with: the first, and the latest few.
    if (f.captures.size() >= 4) {
      const size_t drop = f.base == 1 ? 2 : 1;
      f.captures.erase(f.captures.begin() + static_cast<std::ptrdiff_t>(drop));
      if (drop < f.base) --f.base;
    }
    f.captures.push_back({sig, e.captured, e.probe});
    if (f.captures.size() < 2) return;
    // The new shape is unified with the earlier capture it differs from in the most dimensions,
    // so that every dimension seen changing stays symbolic.
    size_t pick = 0, most = 0;
    for (size_t k = 0; k + 1 < f.captures.size(); ++k) {
      std::vector<std::pair<int, int64_t>> d;
      changed_dims(f.captures[k].captured, f.captures.back().captured, &d);
      if (d.size() > most) most = d.size(), pick = k;
    }
    const Family::Capture& a = f.captures[pick];
    Family::Capture& b = f.captures.back();
    std::vector<std::pair<int, int64_t>> dims;
    const std::string changed = changed_dims(a.captured, b.captured, &dims);
    if (changed.empty()) return;  // the same sizes (captured again)
    stats.last_recompile_reason = changed;
    auto per_shape = [&](const std::string& why) {
      f.refused = why;
      stats.last_recompile_reason = changed + ": " + why;
      log_info("kiln: " + stats.last_recompile_reason);
    };
    if (args.runtime.dynamic == "false") {
      for (const auto& d : dims)
        if (!marked.count(d)) return per_shape("compiled for this shape (dynamic = false)");
    }
    // The optimizers' scalars change from step to step, not with the sizes: the second capture
    // is given the first's, so that only sizes differ; the probe binds the current values anyway
    // (run-time scalars), and one that still differs from the graph becomes one at its first run.
    ir::Graph second = b.captured.raw;
    auto same_as_first = [&](int32_t node) {
      if (node < 0 || static_cast<size_t>(node) >= second.nodes.size()) return;
      const auto& from = a.captured.raw.nodes[static_cast<size_t>(node)];
      auto& to = second.nodes[static_cast<size_t>(node)];
      if (from.op != to.op || from.args.size() != to.args.size()) return;
      for (size_t k = 0; k < to.args.size(); ++k) {
        const auto kind = to.args[k].kind;
        if (kind != from.args[k].kind) continue;
        if (kind == ir::Arg::Kind::Double) to.args[k].d = from.args[k].d;
        if (kind == ir::Arg::Kind::Int || kind == ir::Arg::Kind::Bool) to.args[k].i = from.args[k].i;
      }
    };
    if (a.captured.raw.nodes.size() == second.nodes.size()) {
      for (const ProbeState* ps : {&a.probe, static_cast<const ProbeState*>(&b.probe)}) {
        for (const auto& [slot, idx] : ps->slots) same_as_first(slot.first);
        for (const auto& opt : ps->sites)
          for (const auto& site : opt) same_as_first(site.node);
      }
    }
    const auto t0 = Clock::now();
    ir::UnifyResult u = ir::unify_captures(a.captured.raw, second);
    if (!u.step) {
      return per_shape("the step cannot be planned for both shapes at once (" + u.failure +
                       "); compiled for each shape");
    }
    f.sym = std::move(u.step);
    f.base = pick;
    f.refused.clear();
    f.dims.clear();
    stats.dynamic_dims.clear();
    for (const auto& sym : f.sym->symbols) {
      const auto it = a.captured.user.find(sym.input);
      const int input = it == a.captured.user.end() ? -1 : it->second;
      f.dims.emplace_back(input, sym.dim);
      stats.dynamic_dims.push_back(c10::str("input ", input, " dim ", sym.dim));
    }
    // The base keeps the slots found since (a learning rate scheduled later): shapes planned from
    // it start with every run-time scalar the family knows of.
    merge_slots(f.captures[pick].probe.slots, b.probe.slots);
    stats.last_recompile_reason = changed + ": compiling with " + (dims.size() > 1 ? "them" : "it") + " symbolic";
    log_info(c10::str("kiln: ", stats.last_recompile_reason, " (", f.sym->symbols_text(), "; ", f.sym->sites.size(),
                      " size-derived numbers, unified in ", seconds_since(t0), " s)"));
  }

  // A shape the family's symbolic step covers: a plan for it without a capture. Null when it is
  // not covered (a dimension that is not a symbol changed, a symbol is 0 or 1); throws when
  // planning fails.
  Entry* specialise_new(const std::vector<at::Tensor>& inputs, const std::vector<int64_t>& sig, Family& f,
                        const std::vector<int64_t>& shapeless) {
    const Family::Capture& base = f.captures[f.base];
    std::vector<int64_t> sizes;
    for (const auto& [input, dim] : f.dims) {
      if (input < 0 || static_cast<size_t>(input) >= inputs.size() || !inputs[input].defined() ||
          dim >= inputs[input].dim())
        return nullptr;
      const int64_t n = inputs[input].size(dim);
      if (n < 2) return nullptr;
      sizes.push_back(n);
    }
    ir::Graph g;
    try {
      g = ir::specialise(*f.sym, sizes);
    } catch (const std::invalid_argument& ex) {
      log_debug(std::string("kiln: a new shape the symbolic step does not cover: ") + ex.what());
      return nullptr;
    }
    // Every user input of the specialised graph must be what the step is given now: a dimension
    // that is not a symbol may have changed too.
    for (const auto& in : g.inputs) {
      if (in.role != ir::InputRole::UserInput) continue;
      const auto u = base.captured.user.find(in.name);
      if (u == base.captured.user.end() || static_cast<size_t>(u->second) >= inputs.size()) return nullptr;
      const at::Tensor& t = inputs[u->second];
      const auto& m = g.value(in.value).meta;
      if (!t.defined() || t.sizes() != c10::IntArrayRef(m.shape) || t.strides() != c10::IntArrayRef(m.strides))
        return nullptr;
    }
    const auto t0 = Clock::now();
    auto owned = std::make_unique<Entry>();
    Entry& e = *owned;
    e.shapeless = shapeless;
    e.specialised = true;
    e.captured = base.captured;
    e.captured.raw = std::move(g);
    e.probe.sites = base.probe.sites;
    e.probe.sites_found = base.probe.sites_found;
    e.probe.slots = base.probe.slots;
    e.probe.placeholders = base.probe.placeholders;
    cache.emplace(sig, std::move(owned));
    f.lru.push_front(sig);
    while (static_cast<int>(f.lru.size()) > args.runtime.dynamic_shape_cache) {
      if (auto old = cache.find(f.lru.back()); old != cache.end() && old->second.get() == last) last = nullptr;
      cache.erase(f.lru.back());
      f.lru.pop_back();
      ++stats.shape_evictions;
    }
    try {
      make_plan(e);
      e.compiled = true;
    } catch (const std::exception& ex) {
      e.reason = std::string("kiln: planning the step for a new shape from its symbolic form failed: ") + ex.what();
      fallback(e.reason);
    }
    stats.last_specialise_seconds = seconds_since(t0);
    ++stats.shape_specialisations;
    log_debug(c10::str("kiln: planned the step for a new shape (", f.sym->symbols_text(), " at ", sizes, ") in ",
                       stats.last_specialise_seconds, " s"));
    return &e;
  }

  // Parameters, buffers or submodules changed since the step was captured: every plan reads the old
  // ones, so all are dropped and the step is captured again. Returns false once that happened more
  // than recompile_limit times: the step then runs eagerly.
  bool check_structure() {
    if (structure_eager) return false;
    if (!guards->structure_changed()) return true;
    guards->collect();
    drop_plans();
    if (stats.recaptures >= args.runtime.recompile_limit) {
      structure_eager = true;
      fallback(c10::str("kiln: the modules' parameters, buffers, submodules or options changed again after ",
                        stats.recaptures, " captures (recompile_limit); the step runs eagerly from now on"));
      return false;
    }
    log_info("kiln: the modules' parameters, buffers, submodules or options changed; capturing the step again");
    failed_captures.clear();
    ++stats.recaptures;
    return true;
  }

  // Plan and runner for the entry's capture and its run-time scalar slots.
  void make_plan(Entry& e) {
    PlanOptions po;
    po.dump_dir = args.debug.dump_dir;
    po.lift_runtime_scalars = args.debug.lift_runtime_scalars;
    po.batch_optimizer = args.experimental.batch_optimizer;
    po.overlap_collectives = !args.debug.no_comm_overlap;
    po.writeback_copy = args.runtime.writeback_copy;
    po.activation_memory_budget = args.runtime.activation_memory_budget;
    po.channels_last = args.runtime.channels_last;
    po.compile_threads = args.runtime.compile_threads > 0
                             ? args.runtime.compile_threads
                             : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    // The family's shapes share their compiled groups (a backend with symbolic shapes compiles a
    // group once for every size).
    if (dynamic_on()) {
      auto& groups = families[e.shapeless].groups;
      if (!groups) groups = std::make_shared<SymbolicGroups>();
      po.symbolic_groups = groups;
    }
    RunOptions ro;
    ro.cpu_block_cache = args.runtime.cpu_block_cache;
    ro.cpu_block_cache_max_mb = args.runtime.cpu_block_cache_max_mb;
    ro.graph_copies = args.runtime.graph_copies;
    auto& pool = graph_pools[e.shapeless];
    if (!pool) pool = std::make_shared<SharedGraphPool>();
    ro.graph_pool = pool;
    ro.check_meta = args.debug.check_meta;
    ro.verify_groups = args.debug.verify_groups;
    auto plan = plan_step(e.captured, e.probe.slots, resolved, po);
    // Which groups the backend's own code runs (empty when no backend runs any node).
    stats.groups = plan->partition ? plan->partition->outcomes : std::vector<GroupOutcome>{};
    e.runner.reset();
    e.runner = std::make_unique<StepRunner>(std::move(plan), resolved.graph_plugin, ro, stats,
                                            [this](const std::string& m) { warn_once(m); });
  }

  // The capture step: runs the step for real while recording it, then plans it.
  std::vector<at::Tensor> capture_and_plan(const std::vector<at::Tensor>& inputs, Entry& e) {
    const auto t0 = Clock::now();
    CaptureOutcome c = capture_step(fn, inputs, state, *guards);
    ++stats.eager_steps;
    last_compiled = false;
    std::string failure = c.failure;
    e.retry = c.retry;
    if (failure.empty()) {
      e.captured = std::move(c.step);
      try {
        // The optimizers' next step() replayed on the host finds the scalars that change from step
        // to step, so that this first plan is final.
        probe->look_ahead(e.captured, e.probe);
        make_plan(e);
        e.compiled = true;
      } catch (const std::exception& ex) {
        failure = std::string("kiln: compiling the step failed: ") + ex.what();
      }
    }
    if (failure.empty()) {
      stats.last_compile_seconds = seconds_since(t0);
      ++stats.compiles;
    } else {
      ++stats.failed_captures;
    }
    if (!failure.empty()) {
      e.compiled = false;
      e.reason = failure;
      if (e.retry) {
        log_info(failure + "; capturing the step again at the next step");
      } else {
        failed_captures.emplace(e.shapeless, failure);
        fallback(failure);
      }
    } else {
      log_info(c10::str("kiln: compiled the step (", e.runner->plan().graph.nodes.size(), " nodes, ",
                        e.captured.raw.nodes.size(), " captured) in ", stats.last_compile_seconds, " s"));
    }
    return std::move(c.results);
  }

  // A signature seen for the first time: captured and planned, unless past the limit or its capture
  // already failed for another shape.
  std::vector<at::Tensor> capture_new(const std::vector<at::Tensor>& inputs, std::vector<int64_t> sig) {
    if (captured_entries >= args.runtime.recompile_limit) {
      warn_once(c10::str("kiln: recompile_limit (", args.runtime.recompile_limit,
                         ") reached; steps with a new input signature run eagerly"));
      stats.last_fallback = "recompile_limit";
      return eager(inputs);
    }
    auto owned = std::make_unique<Entry>();
    Entry& e = *owned;
    e.shapeless = guards->signature(inputs, /*with_sizes=*/false);
    last = &e;
    cache.emplace(sig, std::move(owned));
    ++captured_entries;
    if (auto f = failed_captures.find(e.shapeless); f != failed_captures.end()) {
      e.reason = f->second;
      stats.last_fallback = f->second;
      log_debug("kiln: a new input shape, the same cause as an earlier failed capture: " + f->second);
      return eager(inputs);
    }
    auto results = capture_and_plan(inputs, e);
    if (e.compiled) learn_shape(sig, e);
    return results;
  }

  // What a plan read changed (an optimizer's state or calls): the plan is dropped and the step is
  // captured again; past recompile_limit such changes, the signature runs eagerly.
  std::vector<at::Tensor> recapture(const std::vector<at::Tensor>& inputs, std::vector<int64_t> sig, Entry& e,
                                    const std::string& why) {
    if (stats.recaptures >= args.runtime.recompile_limit) {
      e.compiled = false;
      e.reason = why;
      fallback(c10::str(why, "; the step was captured again ", stats.recaptures,
                        " times already (recompile_limit), so this signature now runs eagerly"));
      return eager(inputs);
    }
    ++stats.recaptures;
    log_info(why + "; capturing the step again");
    // The family's captures and plans read what changed too: its shapes are learnt again.
    if (auto f = families.find(e.shapeless); f != families.end()) {
      for (const auto& s : f->second.lru) cache.erase(s);
      families.erase(f);
    }
    if (!e.specialised) --captured_entries;
    cache.erase(sig);
    last = nullptr;
    return capture_new(inputs, std::move(sig));
  }

  std::vector<at::Tensor> step(const std::vector<at::Tensor>& inputs) {
    ++stats.steps;
    const PluginStepScope at_step(stats.steps);  // names the step if a plugin crashes in it
    if (!args.compile_enabled()) return eager(inputs);
    // The first step ever runs eagerly, so that optimizer state exists when the step is captured.
    if (stats.steps == 1) return eager(inputs);
    if (!check_structure()) return eager(inputs);
    auto sig = guards->signature(inputs);
    auto it = cache.find(sig);
    if (it != cache.end() && it->second->retry) {
      if (!it->second->specialised) --captured_entries;
      cache.erase(it);
      it = cache.end();
    }
    if (it == cache.end() && dynamic_on()) {
      auto shapeless = guards->signature(inputs, /*with_sizes=*/false);
      auto f = families.find(shapeless);
      if (f != families.end() && f->second.sym) {
        if (specialise_new(inputs, sig, f->second, shapeless)) it = cache.find(sig);
      }
    }
    if (it == cache.end()) return capture_new(inputs, std::move(sig));
    Entry& e = *it->second;
    last = &e;
    if (e.specialised) {
      // Most recently used first, for the cache's bound.
      auto& lru = families[e.shapeless].lru;
      for (auto l = lru.begin(); l != lru.end(); ++l)
        if (*l == it->first) {
          lru.splice(lru.begin(), lru, l);
          break;
        }
    }
    if (!e.compiled) return eager(inputs);
    // Nothing of a failed attempt may survive it: the optimizers' host state (step counts, state
    // entries) and the placeholder gradients are put back before the eager step runs.
    const OptimizerSnapshot snapshot(state.optimizers);
    auto undo = [&] {
      snapshot.restore();
      StepProbe::undo_placeholders(e.probe);
    };
    // A gradient the plan accumulates into must still be there, as it was (the plan reads each
    // parameter's gradient of the call, or, read through a part of it, the tensor it captured).
    for (const auto& r : e.captured.read_grads) {
      const at::Tensor& g = r.param.grad();
      const bool fits = g.defined() && g.sizes() == r.grad.sizes() && g.strides() == r.grad.strides() &&
                        g.dtype() == r.grad.dtype() && g.device() == r.grad.device() &&
                        (r.rebound || g.is_same(r.grad));
      if (!fits)
        return recapture(inputs, std::move(sig), e,
                         "kiln: the gradient of " + r.name + (g.defined() ? " is another tensor" : " was set to none") +
                             " since the step was captured accumulating into it");
    }
    for (const auto& [name, p] : e.captured.none_grads)
      if (p.grad().defined())
        return recapture(inputs, std::move(sig), e,
                         "kiln: the parameter " + name +
                             " has a gradient now and had none when the step was captured (the step may "
                             "accumulate into it)");
    bool new_slots = false;
    const auto p0 = Clock::now();
    const std::string why = probe->probe(e.captured, e.probe, e.scalars, &new_slots);
    stats.probe_seconds += seconds_since(p0);
    if (!why.empty()) {
      undo();
      return recapture(inputs, std::move(sig), e, "kiln: " + why);
    }
    if (new_slots) {
      // A scalar the look-ahead saw constant changed (a learning rate scheduled later): planned
      // again with it as a run-time scalar. Shapes planned later from the family start with it.
      if (auto f = families.find(e.shapeless); f != families.end() && !f->second.captures.empty())
        merge_slots(f->second.captures[f->second.base].probe.slots, e.probe.slots);
      try {
        make_plan(e);
        ++stats.rebuilds;
      } catch (const std::exception& ex) {
        undo();
        e.compiled = false;
        e.reason = std::string("kiln: planning the step again failed: ") + ex.what();
        fallback(e.reason);
        return eager(inputs);
      }
    }
    // The random generators, when the step draws random numbers: a failed compiled step may have
    // drawn some before it failed, and the eager step that replaces it must draw what eager would.
    std::vector<std::pair<at::Generator, at::Tensor>> rng;
    if (e.runner->plan().draws_random) {
      for (const c10::Device d : {c10::Device(c10::kCPU), e.runner->plan().device}) {
        if (!rng.empty() && d == rng.front().first.device()) continue;
        at::Generator g = at::globalContext().defaultGenerator(d);
        std::lock_guard<std::mutex> lock(g.mutex());
        rng.emplace_back(g, g.get_state());
      }
    }
    try {
      auto results = e.runner->run(inputs, e.scalars);
      last_compiled = true;
      return results;
    } catch (const StepFailedUntouched& ex) {
      // Nothing the step was given has changed: put back the host state and the generators and
      // run the step eagerly, which is what eager training computes. The signature stays eager.
      undo();
      for (auto& [g, st] : rng) {
        std::lock_guard<std::mutex> lock(g.mutex());
        g.set_state(st);
      }
      e.compiled = false;
      e.reason = std::string(ex.restored() ? "kiln: the compiled step failed after it had written into parameters or "
                                             "optimizer state, which kiln put back from a copy taken before the first "
                                             "write: "
                                           : "kiln: the compiled step failed before it changed any parameter, buffer, "
                                             "gradient or optimizer state: ") +
                 ex.what();
      fallback(e.reason + "; nothing was lost, and the later steps of this input signature run eagerly too");
      return eager(inputs);
    } catch (const std::exception& ex) {
      undo();
      e.compiled = false;
      e.reason = std::string("kiln: the compiled step failed: ") + ex.what();
      stats.last_fallback = e.reason;
      throw CompileError(e.reason +
                         " (the optimizers' host state was restored; parameters the step writes in place may "
                         "be partly updated)");
    }
  }
};

CompiledStep::CompiledStep(StepFn fn, StepState state, TrainingArguments args) : impl_(std::make_unique<Impl>()) {
  auto& s = *impl_;
  s.fn = std::move(fn);
  s.state = std::move(state);
  s.args = std::move(args);
  // The environment wins over the file and the code, here as in Trainer (docs/config.md).
  s.args.apply_env();
  s.args.validate();
  set_log_level(s.args.log_level);
  s.guards = std::make_unique<StepGuards>(s.state);
  s.probe = std::make_unique<StepProbe>(s.state.optimizers, [&s](const std::string& m) { s.warn_once(m); });
  for (const auto& m : s.args.runtime.mark_dynamic) {  // "input:dim", checked by validate()
    const auto colon = m.find(':');
    s.marked.emplace(std::stoi(m.substr(0, colon)), std::stoll(m.substr(colon + 1)));
  }
  if (s.args.compile_enabled()) {
    // A named backend that cannot run here throws (BackendSelectionError, with its reason).
    s.resolved = resolve_backend(s.args);
    s.backend_reasons = s.resolved.choice.reasons;
    for (const auto& n : s.resolved.notes) {
      log_info("kiln: " + n);
      s.backend_reasons.push_back(n);
    }
  } else {
    s.resolved.choice.backend = s.resolved.name = "none";
    s.backend_reasons = {"torch_compile is off: LibTorch runs the step"};
  }
}
CompiledStep::~CompiledStep() = default;
CompiledStep::CompiledStep(CompiledStep&&) noexcept = default;
CompiledStep& CompiledStep::operator=(CompiledStep&&) noexcept = default;

std::vector<at::Tensor> CompiledStep::operator()(const std::vector<at::Tensor>& inputs) { return impl_->step(inputs); }
bool CompiledStep::last_step_compiled() const { return impl_->last_compiled; }
void CompiledStep::mark_dynamic(size_t input, int64_t dim) {
  if (dim < 0) throw std::invalid_argument(c10::str("kiln::CompiledStep::mark_dynamic: dim ", dim, " is negative"));
  impl_->marked.emplace(static_cast<int>(input), dim);
}
const StepStats& CompiledStep::stats() const { return impl_->stats; }
const ir::Graph* CompiledStep::captured_graph() const {
  return impl_->last && !impl_->last->captured.raw.nodes.empty() ? &impl_->last->captured.raw : nullptr;
}
const ir::Graph* CompiledStep::compiled_graph() const {
  return impl_->last && impl_->last->runner ? &impl_->last->runner->plan().graph : nullptr;
}
const TrainingArguments& CompiledStep::args() const { return impl_->args; }
const std::string& CompiledStep::backend() const { return impl_->resolved.name; }
const std::vector<std::string>& CompiledStep::backend_reasons() const { return impl_->backend_reasons; }

CompiledStep compile_step(StepFn fn, StepState state, TrainingArguments args) {
  return CompiledStep(std::move(fn), std::move(state), std::move(args));
}

}  // namespace kiln
