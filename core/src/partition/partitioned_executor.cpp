#include "kiln/internal/partitioned_executor.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <set>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/StringUtil.h>

#include "kiln/log.h"
#include "kiln/internal/op_info.h"
#include "kiln/internal/passes.h"
#include "kiln/internal/plugin_crash.h"
#include "kiln/internal/plugin_registry.h"
#include "kiln/internal/symbolic_groups.h"
#include "../runtime/cpu_block_cache.h"

namespace kiln {

bool node_can_be_claimed(const ir::Node& node, bool plugin_takes_runtime_scalars) {
  // A random op stays on ATen's kernel, drawing from LibTorch's generator in captured order: a
  // plugin's own random numbers would not be the eager step's.
  if (node_draws_random_numbers(node)) return false;
  for (const auto& a : node.args)
    if (a.scalar_input >= 0 && !plugin_takes_runtime_scalars) return false;
  for (auto v : node.outputs)
    if (v == ir::kNoValue) return false;
  return true;
}

namespace {

// A compiled group with in-place outputs whose executable promised that a failed execute wrote
// none of their inputs (ABI 2.5).
bool in_place_atomic(const CompiledGroup& g) {
  return g.exe && !g.exe->inplace_outputs().empty() && g.exe->failure_leaves_inputs();
}

// In-place outputs to offer the plugin (ABI 2.2), by group and output: the group input whose
// memory the output may be computed into, or -1. Output v of group G is offered input j when v is
// written back into the graph input whose value G reads as input j (the step's new parameter or
// optimizer state), in the same layout, and that memory is not read again after G: no unit after
// G in the run order reads the input or a view of it, no graph output but the write-back shows
// it, and no other input of G is a view of it (the plugin could not know that two of its inputs
// share memory). Slots count every group as one unit; a group that does not compile runs its
// nodes in its place, so the order around it is the same.
std::vector<std::vector<int64_t>> inplace_proposals(const ir::Graph& g, const Partition& part) {
  // Which tensor's memory each value is (views of views of an input: the input).
  std::vector<ir::ValueId> root(g.values.size());
  for (size_t v = 0; v < root.size(); ++v) root[v] = static_cast<ir::ValueId>(v);
  for (const auto& n : g.nodes) {
    if (!op_info(n.op).is_view) continue;
    const auto ins = ir::Graph::node_inputs(n);
    if (ins.empty()) continue;
    for (auto o : n.outputs)
      if (o != ir::kNoValue) root[static_cast<size_t>(o)] = root[static_cast<size_t>(ins.front())];
  }
  std::vector<int32_t> slot_of_group(part.groups.size(), -1);
  std::vector<int32_t> last_read(g.values.size(), -1);
  int32_t slot = 0;
  for (auto u : part.order) {
    if (u >= 0) {
      for (auto v : ir::Graph::node_inputs(g.nodes[static_cast<size_t>(u)]))
        last_read[static_cast<size_t>(root[static_cast<size_t>(v)])] = slot;
    } else {
      slot_of_group[static_cast<size_t>(-u - 1)] = slot;
      for (auto v : part.groups[static_cast<size_t>(-u - 1)].inputs)
        last_read[static_cast<size_t>(root[static_cast<size_t>(v)])] = slot;
    }
    ++slot;
  }
  std::vector<int> output_uses(g.values.size(), 0), shown(g.values.size(), 0);
  std::vector<ir::ValueId> written_into(g.values.size(), ir::kNoValue);  // the input a write-back replaces
  for (const auto& o : g.outputs) {
    ++output_uses[static_cast<size_t>(o.value)];
    ++shown[static_cast<size_t>(root[static_cast<size_t>(o.value)])];
    if (o.role == ir::OutputRole::WriteBack)
      written_into[static_cast<size_t>(o.value)] = g.inputs[static_cast<size_t>(o.target)].value;
  }
  std::vector<std::vector<int64_t>> proposals(part.groups.size());
  for (size_t gi = 0; gi < part.groups.size(); ++gi) {
    const auto& pg = part.groups[gi];
    auto& prop = proposals[gi];
    prop.assign(pg.outputs.size(), -1);
    for (size_t k = 0; k < pg.outputs.size(); ++k) {
      const ir::ValueId v = pg.outputs[k], in = written_into[static_cast<size_t>(v)];
      if (in == ir::kNoValue) continue;
      const auto at = std::find(pg.inputs.begin(), pg.inputs.end(), in);
      if (at == pg.inputs.end() || output_uses[static_cast<size_t>(v)] != 1 || shown[static_cast<size_t>(in)] != 0 ||
          last_read[static_cast<size_t>(in)] > slot_of_group[gi] || !(g.value(v).meta == g.value(in).meta))
        continue;
      bool other_view = false;
      for (auto w : pg.inputs) other_view = other_view || (w != in && root[static_cast<size_t>(w)] == in);
      if (!other_view) prop[k] = at - pg.inputs.begin();
    }
    if (std::none_of(prop.begin(), prop.end(), [](int64_t j) { return j >= 0; })) prop.clear();
  }
  return proposals;
}

}  // namespace

std::shared_ptr<const CompiledPartition> compile_partition(const ir::Graph& g,
                                                           std::shared_ptr<const LoadedPlugin> plugin, KilnMode mode,
                                                           int compile_threads, SymbolicGroups* symbolic) {
  return compile_partition(g, std::vector<std::shared_ptr<const LoadedPlugin>>{std::move(plugin)},
                           std::vector<KilnMode>{mode}, compile_threads, symbolic);
}

std::shared_ptr<const CompiledPartition> compile_partition(const ir::Graph& g,
                                                           std::vector<std::shared_ptr<const LoadedPlugin>> plugins,
                                                           std::vector<KilnMode> modes, int compile_threads,
                                                           SymbolicGroups* symbolic) {
  if (plugins.empty() || plugins.size() != modes.size())
    throw std::logic_error("compile_partition: one mode for each of one or more plugins");
  auto cp = std::make_shared<CompiledPartition>();
  cp->plugin = plugins.front();
  cp->plugins = plugins;
  auto& stats = cp->stats;
  stats.nodes = g.nodes.size();
  // Each backend in turn claims among what the ones before it left: a node another backend took
  // first is not its to take, however it answers.
  std::vector<std::pair<int64_t, int32_t>> taken;  // (node, backend)
  {
    GraphView view(g);
    std::vector<char> owned(g.nodes.size(), 0);
    for (size_t b = 0; b < plugins.size(); ++b) {
      const bool takes_scalars = plugins[b]->accepts_runtime_scalars();
      std::vector<int64_t> raw = plugins[b]->claim(view.view());  // checked in range, no duplicates
      validate_claims(g, raw, plugins[b]->name());
      for (auto c : raw) {
        if (owned[c]) continue;
        ++stats.claimed;
        if (node_can_be_claimed(g.nodes[c], takes_scalars)) {
          taken.emplace_back(c, static_cast<int32_t>(b));
          owned[c] = 1;
        } else {
          ++stats.claims_dropped;
        }
      }
    }
  }
  std::sort(taken.begin(), taken.end());
  std::vector<int64_t> claimed;
  std::vector<int32_t> claimed_by;
  for (const auto& [node, b] : taken) claimed.push_back(node), claimed_by.push_back(b);
  // A family's later shapes find their partition made (symbolic_groups.h).
  std::string key;
  std::shared_ptr<const Partition> known;
  if (symbolic) {
    key = partition_key(g, claimed, claimed_by);
    known = symbolic->partition(key);
  }
  if (known) {
    cp->partition = *known;
  } else {
    cp->partition = partition_graph(g, claimed, claimed_by);
    if (symbolic) symbolic->keep_partition(std::move(key), cp->partition);
  }
  const Partition& part = cp->partition;
  stats.groups = part.groups.size();
  stats.claims_dropped += part.views_left_eager;

  // Compile every group; a group that does not compile runs its nodes eagerly. The plugin's calls
  // may overlap when it says they can (each group's view and result are its own); what became of
  // each group is then recorded in group order, so the outcome does not depend on the threads.
  struct Attempt {
    std::shared_ptr<PluginExecutable> exe;
    std::optional<PluginError> error;
    std::exception_ptr other;  // anything else thrown: rethrown as the serial loop would
  };
  std::vector<Attempt> attempts(part.groups.size());
  const auto proposals = inplace_proposals(g, part);
  // Backends with symbolic shapes: which groups an executable of another size serves, and which
  // are offered in symbolic form (decided one by one, before any compile runs).
  std::vector<std::optional<SymbolicGroups::Decision>> decisions(part.groups.size());
  if (symbolic) {
    for (size_t gi = 0; gi < part.groups.size(); ++gi) {
      const auto& pg = part.groups[gi];
      const auto& plugin = plugins[static_cast<size_t>(pg.backend)];
      if (!plugin->symbolic_shapes()) continue;
      std::string prefix = c10::str(plugin->name(), " mode ", modes[static_cast<size_t>(pg.backend)], " in place");
      for (auto j : proposals[gi]) prefix += c10::str(" ", j);
      decisions[gi] = symbolic->decide(g, pg, prefix);
      if (decisions[gi]->kind == SymbolicGroups::Decision::Kind::reuse) attempts[gi].exe = decisions[gi]->exe;
    }
  }
  const int64_t step = current_plugin_step();  // for a crash's message, on whichever thread compiles
  auto attempt = [&](size_t gi) {
    if (attempts[gi].exe) return;  // an executable of another size serves it
    const auto& pg = part.groups[gi];
    const auto& plugin = plugins[static_cast<size_t>(pg.backend)];
    const PluginStepScope at_step(step);
    const PluginGroupScope in_group(static_cast<int64_t>(gi));
    try {
      const auto& d = decisions[gi];
      if (d && d->kind == SymbolicGroups::Decision::Kind::compile_symbolic) {
        // The group graph has the subgraph view's numbering; its numbers are this size's.
        GraphView sub(d->graph);
        sub.set_symbols(d->symbols, abi_sites(*d->sym));
        attempts[gi].exe = plugin->compile(sub.view(), modes[static_cast<size_t>(pg.backend)], proposals[gi]);
      } else {
        GraphView sub(g, pg.nodes, pg.inputs, pg.outputs);
        attempts[gi].exe = plugin->compile(sub.view(), modes[static_cast<size_t>(pg.backend)], proposals[gi]);
      }
    } catch (const PluginError& e) {
      attempts[gi].error = e;
    } catch (...) {
      attempts[gi].other = std::current_exception();
    }
  };
  const bool concurrent =
      std::all_of(plugins.begin(), plugins.end(), [](const auto& p) { return p->concurrent_compile_safe(); });
  const size_t threads =
      concurrent ? std::min<size_t>(part.groups.size(), static_cast<size_t>(std::max(compile_threads, 1))) : 1;
  if (threads <= 1) {
    for (size_t gi = 0; gi < part.groups.size(); ++gi) {
      attempt(gi);
      if (attempts[gi].other) break;
    }
  } else {
    std::atomic<size_t> next{0};
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (size_t t = 0; t < threads; ++t)
      pool.emplace_back([&] {
        for (size_t gi = next++; gi < part.groups.size(); gi = next++) attempt(gi);
      });
    for (auto& th : pool) th.join();
  }
  stats.compile_threads = threads;
  cp->groups.resize(part.groups.size());
  cp->outcomes.reserve(part.groups.size());
  // A compile error the same plugin gave for an earlier group (a bad option fails every group the
  // same way): said once, then counted; (plugin, message) -> later groups.
  std::vector<std::pair<std::pair<std::string, std::string>, size_t>> repeated;
  for (size_t gi = 0; gi < part.groups.size(); ++gi) {
    if (attempts[gi].other) std::rethrow_exception(attempts[gi].other);
    const auto& pg = part.groups[gi];
    const auto& plugin = plugins[static_cast<size_t>(pg.backend)];
    auto& grp = cp->groups[gi];
    grp.group = pg;
    GroupOutcome& outcome = cp->outcomes.emplace_back();
    outcome.backend = plugin->name();
    outcome.nodes = pg.nodes.size();
    outcome.first_op = g.nodes[pg.nodes.front()].op;
    if (auto& d = decisions[gi]) {
      if (d->kind == SymbolicGroups::Decision::Kind::compile_symbolic) {
        const bool accepted = attempts[gi].exe && attempts[gi].exe->serves_all_sizes();
        if (accepted) {
          grp.symbols = d->symbols;
          ++stats.groups_symbolic;
          outcome.every_size = true;
        }
        symbolic->record(*d, attempts[gi].exe, accepted);
      } else if (d->kind == SymbolicGroups::Decision::Kind::reuse) {
        grp.symbols = d->symbols;
        ++stats.groups_reused;
        outcome.every_size = outcome.reused = true;
      }
    }
    if (attempts[gi].exe) {
      grp.exe = std::move(attempts[gi].exe);
      for (size_t k = 0; k < proposals[gi].size(); ++k) {
        if (proposals[gi][k] < 0) continue;
        ++stats.inplace_offered;
        const auto& acc = grp.exe->inplace_outputs();
        if (k < acc.size() && acc[k] >= 0) ++stats.inplace_accepted;
      }
      for (auto ni : pg.nodes) grp.nodes.push_back(g.nodes[ni]);
      for (auto v : pg.outputs) grp.output_meta.push_back(g.value(v).meta);
      outcome.compiled = true;
      ++stats.groups_compiled;
      stats.nodes_compiled += pg.nodes.size();
    } else {
      const PluginError& e = *attempts[gi].error;
      outcome.declined = e.code() == KILN_ERROR_UNIMPLEMENTED;
      outcome.reason = e.what();  // names the plugin and the error code
      if (e.code() != KILN_ERROR_UNIMPLEMENTED) {
        stats.compile_errors.push_back(e.what());
        const std::pair<std::string, std::string> key(plugin->name(), e.what());
        auto seen = std::find_if(repeated.begin(), repeated.end(), [&](const auto& r) { return r.first == key; });
        if (seen != repeated.end()) {
          ++seen->second;
        } else {
          repeated.emplace_back(key, 0);
          log_warn(c10::str("backend '", plugin->name(), "' failed to compile a group of ", pg.nodes.size(), " nodes (",
                            g.nodes[pg.nodes.front()].op, " ...); running them eagerly: ", e.what()));
        }
      }
    }
  }

  for (const auto& [key, more] : repeated)
    if (more > 0)
      log_warn(c10::str("backend '", key.first, "' failed to compile ", more, " more group", more == 1 ? "" : "s",
                        " with the same error; ", more == 1 ? "it runs" : "they run", " eagerly too"));

  // When each node runs: its unit's slot; a compiled group's nodes share one, marked -(slot + 1).
  cp->position.assign(g.nodes.size(), 0);
  int32_t slot = 0;
  for (auto u : part.order) {
    if (u >= 0) {
      cp->position[u] = slot++;
    } else if (cp->groups[-u - 1].exe) {
      for (auto ni : part.groups[-u - 1].nodes) cp->position[ni] = -(slot + 1);
      ++slot;
    } else {
      for (auto ni : part.groups[-u - 1].nodes) cp->position[ni] = slot++;
    }
  }
  std::string names;
  for (const auto& p : plugins) names += (names.empty() ? "" : "+") + p->name();
  if (stats.groups_symbolic || stats.groups_reused)
    log_debug(c10::str("backend '", names, "': ", stats.groups_reused,
                       " groups run by executables compiled for other sizes, ", stats.groups_symbolic,
                       " compiled for every size"));
  log_debug(c10::str("backend '", names, "': ", stats.nodes_compiled, " of ", stats.nodes, " nodes in ",
                     stats.groups_compiled, " compiled groups",
                     threads > 1 ? c10::str(" (", threads, " compiling at once)") : "", "; ", stats.inplace_accepted,
                     " of ", stats.inplace_offered, " write-backs offered in place computed over their inputs"));
  return cp;
}

std::string print_compiled_partition(const ir::Graph& g, const CompiledPartition& cp) {
  const auto& stats = cp.stats;
  std::string text = print_partition(g, cp.partition);
  std::string names;
  for (const auto& p : cp.plugins) names += (names.empty() ? "" : "+") + p->name();
  for (size_t gi = 0; gi < cp.partition.groups.size() && cp.plugins.size() > 1; ++gi)
    text += c10::str("group ", gi, " belongs to ", cp.plugins[cp.partition.groups[gi].backend]->name(), "\n");
  text += c10::str("plugin ", names, ": claimed ", stats.claimed, ", dropped ", stats.claims_dropped, ", groups ",
                   stats.groups, ", compiled ", stats.groups_compiled, " (", stats.nodes_compiled, " nodes), in place ",
                   stats.inplace_accepted, " of ", stats.inplace_offered, "\n");
  for (const auto& e : stats.compile_errors) text += "compile error: " + e + "\n";
  return text;
}

struct PartitionedExecutor::Failures {
  mutable std::mutex mu;
  std::vector<char> eager;  // by group
  size_t count = 0;
  std::string last;
};

PartitionedExecutor::PartitionedExecutor(const ir::Graph& g, std::shared_ptr<const CompiledPartition> partition,
                                         bool verify_groups, std::vector<ir::ValueId> keep)
    : partition_(std::move(partition)), verify_groups_(verify_groups) {
  init(g, std::move(keep));
}

PartitionedExecutor::PartitionedExecutor(const ir::Graph& g, std::shared_ptr<const LoadedPlugin> plugin, KilnMode mode)
    : partition_(compile_partition(g, std::move(plugin), mode)) {
  // Eager element-wise write-backs compute into the written tensor (out= variants).
  ir::Graph planned = g;
  compute_writebacks_in_place(planned, partition_->position);
  init(planned, {});
}

void PartitionedExecutor::init(const ir::Graph& planned, std::vector<ir::ValueId> keep) {
  const auto& part = partition_->partition;
  const auto& groups = partition_->groups;
  failures_ = std::make_unique<Failures>();
  failures_->eager.assign(groups.size(), 0);
  for (const auto& p : partition_->plugins) pass_scalars_ = pass_scalars_ || p->accepts_runtime_scalars();
  // Units in partition order; a group that did not compile becomes its nodes, in order. Each
  // unit's reads, for liveness: eager units from their node, groups from their inputs.
  std::vector<std::vector<ir::ValueId>> reads, writes;
  auto eager_unit = [&](int32_t ni) {
    Unit unit;
    unit.node = std::make_unique<PreparedNode>(planned.nodes[ni]);
    units_.push_back(std::move(unit));
    reads.push_back(ir::Graph::node_inputs(planned.nodes[ni]));
    writes.push_back(planned.nodes[ni].outputs);
  };
  for (auto u : part.order) {
    if (u >= 0) {
      eager_unit(u);
    } else if (groups[-u - 1].exe) {
      Unit unit;
      unit.group = -u - 1;
      units_.push_back(std::move(unit));
      reads.push_back(part.groups[-u - 1].inputs);
      writes.push_back(part.groups[-u - 1].outputs);
    } else {
      for (auto ni : part.groups[-u - 1].nodes) eager_unit(ni);
    }
  }

  first_writing_unit_ = units_.size();
  for (size_t ui = 0; ui < units_.size() && first_writing_unit_ == units_.size(); ++ui) {
    const Unit& unit = units_[ui];
    bool writes = false;
    if (unit.node) {
      writes = unit.node->writes_arguments();
    } else if (!verify_groups_) {
      for (int64_t j : groups[unit.group].exe->inplace_outputs()) writes = writes || j >= 0;
    }
    if (writes) first_writing_unit_ = ui;
  }
  // A compiled group at or after the first write can fail after something was written: then every
  // tensor written from there on is copied first, once a run, so that a failure can be undone.
  // A group whose failed execute leaves its in-place inputs untouched (ABI 2.5) runs eagerly in
  // its place instead (run): it needs no copy.
  save_at_ = units_.size();
  for (size_t ui = first_writing_unit_; ui < units_.size(); ++ui)
    if (!units_[ui].node && !in_place_atomic(groups[units_[ui].group])) save_at_ = first_writing_unit_;
  if (save_at_ < units_.size()) {
    std::set<ir::ValueId> seen;
    for (size_t ui = save_at_; ui < units_.size(); ++ui) {
      const Unit& unit = units_[ui];
      std::vector<ir::ValueId> written;
      if (unit.node) {
        written = unit.node->written_values();
      } else if (!verify_groups_) {
        const auto& inplace = groups[unit.group].exe->inplace_outputs();
        for (int64_t j : inplace)
          if (j >= 0) written.push_back(part.groups[unit.group].inputs[static_cast<size_t>(j)]);
      }
      for (auto v : written)
        if (v != ir::kNoValue && seen.insert(v).second) saved_values_.push_back(v);
    }
    int64_t bytes = 0;
    for (auto v : saved_values_) {
      const auto& m = planned.values[static_cast<size_t>(v)].meta;
      bytes += m.numel() * static_cast<int64_t>(c10::elementSize(m.dtype));
    }
    log_debug(c10::str("a compiled group runs after the step's first write: each run copies the ", saved_values_.size(),
                       " tensors it writes into (", bytes >> 20, " MiB) first, so that a failure can be undone"));
  }

  // Liveness: free each value after the last unit that reads it, unless it must be kept.
  std::vector<char> kept(planned.values.size(), 0);
  for (const auto& o : planned.outputs) kept[o.value] = 1;
  for (const auto& in : planned.inputs) kept[in.value] = 1;  // owned by the caller
  for (auto v : keep) kept[v] = 1;
  std::vector<int32_t> last(planned.values.size(), -1);
  for (size_t ui = 0; ui < units_.size(); ++ui)
    for (auto v : reads[ui]) last[v] = static_cast<int32_t>(ui);
  // A result nothing reads (a multi-result op's unused one) goes right after the unit that made it:
  // a view among them would otherwise keep its base alive to the end of the run.
  for (size_t ui = 0; ui < units_.size(); ++ui)
    for (auto v : writes[ui])
      if (v != ir::kNoValue && last[static_cast<size_t>(v)] < 0)
        last[static_cast<size_t>(v)] = static_cast<int32_t>(ui);
  for (size_t v = 0; v < last.size(); ++v)
    if (last[v] >= 0 && !kept[v]) units_[last[v]].free_after.push_back(static_cast<ir::ValueId>(v));
}

PartitionedExecutor::~PartitionedExecutor() = default;

size_t PartitionedExecutor::groups_failed_in_run() const {
  std::lock_guard<std::mutex> lock(failures_->mu);
  return failures_->count;
}

std::string PartitionedExecutor::last_group_failure() const {
  std::lock_guard<std::mutex> lock(failures_->mu);
  return failures_->last;
}

void PartitionedExecutor::Saved::take(const std::vector<at::Tensor>& written) {
  bool same = copies.size() == written.size();
  for (size_t i = 0; same && i < written.size(); ++i)
    same = copies[i].sizes().equals(written[i].sizes()) && copies[i].strides().equals(written[i].strides()) &&
           copies[i].scalar_type() == written[i].scalar_type() && copies[i].device() == written[i].device();
  if (!same) {
    copies.clear();
    for (const auto& t : written) copies.push_back(at::empty_strided(t.sizes(), t.strides(), t.options()));
  }
  targets = written;
  at::_foreach_copy_(copies, targets);
  taken = true;
}

void PartitionedExecutor::Saved::restore() {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  if (taken) at::_foreach_copy_(targets, copies);
  taken = false;
  targets.clear();
}

void PartitionedExecutor::run(std::vector<at::Tensor>& env, const std::vector<c10::IValue>* scalars, void* stream,
                              size_t* reached, Saved* saved) const {
  // Like the eager executor: below autograd and autocast, whose work the graph already holds.
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  std::vector<DLTensor> in, out;
  // The run-time scalars as KilnArgs, for plugins that take them (KILN_CAPABILITY_RUNTIME_SCALARS).
  std::vector<KilnArg> scalar_args;
  std::vector<const KilnArg*> scalar_ptrs;
  if (pass_scalars_ && scalars && !scalars->empty()) {
    scalar_args.resize(scalars->size());
    for (size_t k = 0; k < scalars->size(); ++k) {
      KilnArg& a = scalar_args[k];
      a.struct_size = KILN_ARG_STRUCT_SIZE;
      a.name = "";
      a.runtime_scalar = static_cast<int32_t>(k);
      const c10::IValue& v = (*scalars)[k];
      if (v.isBool()) a.tag = KILN_ARG_BOOL, a.i = v.toBool();
      else if (v.isInt()) a.tag = KILN_ARG_INT, a.i = v.toInt();
      else a.tag = KILN_ARG_DOUBLE, a.d = v.toScalar().toDouble();
      scalar_ptrs.push_back(&a);
    }
  }
  for (size_t ui = 0; ui < units_.size(); ++ui) {
    const Unit& unit = units_[ui];
    if (reached) *reached = ui;
    if (saved && ui == save_at_) {
      std::vector<at::Tensor> written;
      for (auto v : saved_values_)
        if (env[v].defined()) written.push_back(env[v]);
      saved->take(written);
    }
    if (unit.node) {
      unit.node->run(env, scalars);
    } else if (group_runs_eagerly(unit.group)) {
      run_group_eagerly(partition_->groups[unit.group], env, scalars);
    } else {
      const CompiledGroup& grp = partition_->groups[unit.group];
      in.clear();
      out.clear();
      for (auto v : grp.group.inputs) in.push_back(to_dl_tensor(env[v]));
      const auto& inplace = grp.exe->inplace_outputs();
      for (size_t k = 0; k < grp.group.outputs.size(); ++k) {
        const auto& m = grp.output_meta[k];
        auto& t = env[grp.group.outputs[k]];
        // An output the plugin computes over its input's memory (the input's new value, which
        // nothing after this group reads the old one of): no allocation, and no write-back copy.
        // Not under verify_groups, which reruns the group on the inputs afterwards.
        const int64_t j = inplace.empty() || verify_groups_ ? -1 : inplace[k];
        const at::Tensor* over = j >= 0 ? &env[grp.group.inputs[static_cast<size_t>(j)]] : nullptr;
        if (over && over->defined() && over->sizes().equals(m.shape) && over->strides().equals(m.strides) &&
            over->scalar_type() == m.dtype && over->device() == m.device) {
          t = *over;
        } else {
          t = empty_strided_step(m.shape, m.strides, at::TensorOptions(m.dtype).device(m.device));
        }
        out.push_back(to_dl_tensor(t));
      }
      // (a plugin that does not take run-time scalars is called with none: PluginExecutable::execute)
      const PluginGroupScope in_group(unit.group);
      try {
        if (!grp.symbols.empty()) {
          // An executable serving every size: this run's sizes, read off the group's inputs.
          int64_t sizes[16];
          const size_t n = std::min<size_t>(grp.symbols.size(), 16);
          for (size_t k = 0; k < n; ++k)
            sizes[k] = in[static_cast<size_t>(grp.symbols[k].input)].shape[grp.symbols[k].dim];
          grp.exe->execute_sized(in.data(), in.size(), out.data(), out.size(), scalar_ptrs.data(), scalar_ptrs.size(),
                                 sizes, n, stream);
        } else {
          grp.exe->execute(in.data(), in.size(), out.data(), out.size(), scalar_ptrs.data(), scalar_ptrs.size(),
                           stream);
        }
      } catch (const PluginError& ex) {
        if (!in_place_atomic(grp) || verify_groups_) throw;
        // Its in-place inputs are as they were (the plugin's promise): its nodes compute the same
        // results eagerly, and the run goes on. Later runs skip the executable.
        {
          std::lock_guard<std::mutex> lock(failures_->mu);
          failures_->eager[static_cast<size_t>(unit.group)] = 1;
          ++failures_->count;
          failures_->last = c10::str("compiled group ", unit.group, " (", grp.nodes.size(), " nodes, first ",
                                     grp.nodes.front().op, ") of '", grp.exe->plugin().name(), "' failed: ", ex.what(),
                                     "; it had written nothing (its executable computes outputs over its inputs and "
                                     "says a failure leaves them as they were), so its nodes ran eagerly in its "
                                     "place and the step went on; they run eagerly in later steps too");
          log_warn(failures_->last);
        }
        run_group_eagerly(grp, env, scalars);
      }
      if (verify_groups_) verify_group(grp, unit.group, env, scalars);
    }
    for (auto v : unit.free_after) env[v] = at::Tensor();
  }
}

bool PartitionedExecutor::group_runs_eagerly(int32_t group) const {
  std::lock_guard<std::mutex> lock(failures_->mu);
  return failures_->eager[static_cast<size_t>(group)] != 0;
}

void PartitionedExecutor::run_group_eagerly(const CompiledGroup& grp, std::vector<at::Tensor>& env,
                                            const std::vector<c10::IValue>* scalars) const {
  // Fresh results: an output that was to be computed over an input's memory is that input until
  // now, and must not be written through.
  for (auto v : grp.group.outputs) env[v] = at::Tensor();
  for (const auto& n : grp.nodes) EagerExecutor::run_node(n, env, scalars);
}

void PartitionedExecutor::verify_group(const CompiledGroup& grp, int32_t index, const std::vector<at::Tensor>& env,
                                       const std::vector<c10::IValue>* scalars) const {
  std::vector<at::Tensor> ref(env.size());
  for (auto v : grp.group.inputs) ref[v] = env[v];
  for (const auto& n : grp.nodes) EagerExecutor::run_node(n, ref, scalars);
  for (size_t k = 0; k < grp.group.outputs.size(); ++k) {
    const at::Tensor& got = env[grp.group.outputs[k]];
    const at::Tensor& want = ref[grp.group.outputs[k]];
    const auto gd = got.to(at::kDouble), wd = want.to(at::kDouble);
    const double denom = std::max(wd.norm().item<double>(), 1e-30);
    const double err = (gd - wd).norm().item<double>() / denom;
    const bool finite = gd.isfinite().all().item<bool>() || !wd.isfinite().all().item<bool>();
    const bool bad =
        !finite || err > (got.scalar_type() == at::kFloat || got.scalar_type() == at::kDouble ? 1e-5 : 1e-2);
    log(bad ? LogLevel::warn : LogLevel::debug,
        c10::str(
            "verify_groups: group ", index, " (", grp.nodes.size(), " nodes, first ", grp.nodes.front().op, ") output ",
            k, " (%", grp.group.outputs[k], ", produced by ",
            [&] {
              for (const auto& n : grp.nodes)
                for (auto o : n.outputs)
                  if (o == grp.group.outputs[k]) return n.op;
              return std::string("?");
            }(),
            "): relative error ", err, finite ? "" : " (non-finite values)"));
  }
}

}  // namespace kiln
