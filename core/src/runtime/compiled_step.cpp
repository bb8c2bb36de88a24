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
#include "kiln/compile.h"

#include <algorithm>
#include <mutex>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include <ATen/Context.h>
#include <c10/util/StringUtil.h>

#include "kiln/internal/backend.h"
#include "kiln/internal/plugin_crash.h"
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
  };
  std::map<std::vector<int64_t>, std::unique_ptr<Entry>> cache;
  Entry* last = nullptr;

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
    last = nullptr;
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
    po.channels_last = args.runtime.channels_last;
    po.compile_threads = args.runtime.compile_threads > 0
                             ? args.runtime.compile_threads
                             : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    RunOptions ro;
    ro.cpu_block_cache = args.runtime.cpu_block_cache;
    ro.cpu_block_cache_max_mb = args.runtime.cpu_block_cache_max_mb;
    ro.graph_copies = args.runtime.graph_copies;
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
    stats.last_compile_seconds = seconds_since(t0);
    ++stats.compiles;
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
    if (static_cast<int>(cache.size()) >= args.runtime.recompile_limit) {
      warn_once(c10::str("kiln: recompile_limit (", args.runtime.recompile_limit,
                         ") reached; steps with a new input signature run eagerly"));
      stats.last_fallback = "recompile_limit";
      return eager(inputs);
    }
    auto owned = std::make_unique<Entry>();
    Entry& e = *owned;
    e.shapeless = guards->signature(inputs, /*with_sizes=*/false);
    last = &e;
    cache.emplace(std::move(sig), std::move(owned));
    if (auto f = failed_captures.find(e.shapeless); f != failed_captures.end()) {
      e.reason = f->second;
      stats.last_fallback = f->second;
      log_debug("kiln: a new input shape, the same cause as an earlier failed capture: " + f->second);
      return eager(inputs);
    }
    return capture_and_plan(inputs, e);
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
      cache.erase(it);
      it = cache.end();
    }
    if (it == cache.end()) return capture_new(inputs, std::move(sig));
    Entry& e = *it->second;
    last = &e;
    if (!e.compiled) return eager(inputs);
    // Nothing of a failed attempt may survive it: the optimizers' host state (step counts, state
    // entries) and the placeholder gradients are put back before the eager step runs.
    const OptimizerSnapshot snapshot(state.optimizers);
    auto undo = [&] {
      snapshot.restore();
      StepProbe::undo_placeholders(e.probe);
    };
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
      // again with it as a run-time scalar.
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
  if (s.args.compile_enabled()) {
    // A named backend that cannot run here throws (BackendSelectionError, with its reason).
    s.resolved = resolve_backend(s.args);
    s.backend_reasons = s.resolved.choice.reasons;
    for (const auto& n : s.resolved.notes) {
      log_info("kiln: " + n);
      s.backend_reasons.push_back(n);
    }
  } else {
    s.resolved.choice.backend = s.resolved.name = "eager";
    s.backend_reasons = {"torch_compile is off: LibTorch runs the step"};
  }
}
CompiledStep::~CompiledStep() = default;
CompiledStep::CompiledStep(CompiledStep&&) noexcept = default;
CompiledStep& CompiledStep::operator=(CompiledStep&&) noexcept = default;

std::vector<at::Tensor> CompiledStep::operator()(const std::vector<at::Tensor>& inputs) { return impl_->step(inputs); }
bool CompiledStep::last_step_compiled() const { return impl_->last_compiled; }
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
