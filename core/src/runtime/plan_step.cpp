#include "plan_step.h"

#include <algorithm>
#include <map>
#include <sstream>

#include <c10/util/StringUtil.h>

#include "kiln/log.h"
#include "kiln/internal/op_info.h"
#include "kiln/internal/partition.h"
#include "kiln/internal/plugin_registry.h"

namespace kiln {

namespace {

// The step's device: its parameters', else any input's (CUDA first).
c10::Device step_device(const ir::Graph& g) {
  for (int pass = 0; pass < 2; ++pass)
    for (const auto& in : g.inputs) {
      const auto& d = g.value(in.value).meta.device;
      if (d.is_cuda() && (pass == 1 || in.role == ir::InputRole::Parameter)) return d;
    }
  for (const auto& in : g.inputs)
    if (in.role == ir::InputRole::Parameter) return g.value(in.value).meta.device;
  return c10::Device(c10::kCPU);
}

// Why a CUDA step cannot be one CUDA graph: a CPU tensor computed or read inside it cannot be
// replayed (0-dim CPU tensors are kernel arguments and are allowed, as PyTorch allows CPU scalars).
std::string cpu_tensor_in(const ir::Graph& g) {
  for (const auto& in : g.inputs) {
    const auto& m = g.value(in.value).meta;
    if (!m.device.is_cuda() && m.numel() > 1)
      return c10::str("cpu device (input '", in.name, "' is a ", m.device, " tensor)");
  }
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (auto v : g.nodes[i].outputs)
      if (v != ir::kNoValue && !g.value(v).meta.device.is_cuda() && g.value(v).meta.numel() > 1)
        return c10::str("cpu device (node ", i, " ", g.nodes[i].op, " makes a ", g.value(v).meta.device, " tensor)");
  return "";
}

// Turns g's run-time scalars into 0-dim tensors on the plan's device, read from one buffer per
// dtype that the runner fills before every call. Returns why not ("" when done or nothing to do);
// g is unchanged then.
std::string lift(StepPlan& plan, ir::Graph& g) {
  if (g.scalar_inputs.empty()) return "";
  ir::Graph lg = g;
  std::vector<LiftedScalar> lifted;
  auto bad = lift_runtime_scalars(lg, &lifted);
  if (!bad.empty())
    return "a run-time scalar argument of " + bad.front() +
           " (a CUDA graph bakes kernel arguments; kiln turns run-time scalars of add, sub, mul, div, addcdiv, "
           "addcmul, lerp, pow and fill into device tensors, not of this op)";
  g = std::move(lg);
  plan.lifted = std::move(lifted);
  for (const auto& l : plan.lifted) {
    size_t b = 0;
    while (b < plan.scalar_buffers.size() && plan.scalar_buffers[b].first != l.dtype) ++b;
    if (b == plan.scalar_buffers.size()) plan.scalar_buffers.emplace_back(l.dtype, 0);
    plan.lifted_at.emplace_back(b, plan.scalar_buffers[b].second++);
  }
  return "";
}

// The bindings of every input and output (write-back planning).
void bind(StepPlan& plan, const CapturedStep& cs, bool writeback_copy) {
  const ir::Graph& g = plan.graph;
  for (const auto& in : g.inputs) {
    InputBinding b;
    b.value = in.value;
    if (in.role == ir::InputRole::Scalar) {
      for (size_t k = 0; k < plan.lifted.size(); ++k)
        if (plan.lifted[k].value == in.value) b.lifted = static_cast<int>(k);
      if (b.lifted < 0) throw std::runtime_error("no run-time scalar for graph input '" + in.name + "'");
    } else if (auto u = cs.user.find(in.name); u != cs.user.end()) {
      b.user = u->second;
    } else if (auto t = cs.bound.find(in.name); t != cs.bound.end()) {
      b.tensor = t->second;
      if (auto p = cs.grad_inputs.find(in.name); p != cs.grad_inputs.end()) b.grad_of = p->second;
    } else if (auto c = plan.constants.find(in.value); c != plan.constants.end()) {
      b.tensor = c->second;
    } else {
      throw std::runtime_error("no tensor for graph input '" + in.name + "'");
    }
    plan.inputs.push_back(std::move(b));
  }
  for (const auto& o : g.outputs) {
    OutputBinding b;
    b.role = o.role;
    b.value = o.value;
    b.index = o.target;
    switch (o.role) {
      case ir::OutputRole::WriteBack: {
        const auto& target = g.inputs.at(static_cast<size_t>(o.target));
        auto t = cs.bound.find(target.name);
        if (t == cs.bound.end())
          throw std::runtime_error("the step writes its input '" + target.name +
                                   "'; kiln does not write user inputs back yet");
        b.target = t->second;
        if (auto p = cs.grad_inputs.find(target.name); p != cs.grad_inputs.end()) b.grad_of = p->second;
        break;
      }
      case ir::OutputRole::Gradient: b.target = cs.grad_params.at(static_cast<size_t>(o.target)); break;
      case ir::OutputRole::Result:
        if (o.target < 0) continue;
        break;
    }
    plan.outputs.push_back(std::move(b));
  }
  // A write-back may hand its value's storage to the target only when no other output (a result,
  // a gradient, another write-back) is the same value, and never into a CUDA graph's replay (its
  // buffers are fixed addresses).
  std::map<ir::ValueId, int> uses;
  for (const auto& o : plan.outputs) ++uses[o.value];
  for (auto& o : plan.outputs)
    o.adopt = o.role == ir::OutputRole::WriteBack && uses[o.value] == 1 && !plan.cuda_graph && !writeback_copy;
}

std::string describe(const StepPlan& plan) {
  std::ostringstream os;
  os << "device " << plan.device << "\n";
  if (plan.partition) {
    const auto& s = plan.partition->stats;
    os << "backend " << plan.partition->plugin->name() << ": " << s.nodes_compiled << " of " << s.nodes << " nodes in "
       << s.groups_compiled << " of " << s.groups << " groups\n";
  } else {
    os << "backend none: every node on the eager executor\n";
  }
  os << "cuda graph " << (plan.cuda_graph ? "yes" : "no");
  if (!plan.graph_skip.empty()) os << " (skipped: " << plan.graph_skip << ")";
  os << "\nrun-time scalars " << plan.num_scalars << ", lifted " << plan.lifted.size() << "\n";
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    const auto& b = plan.inputs[i];
    const auto& in = plan.graph.inputs[i];
    os << "input %" << b.value << " " << ir::to_string(in.role) << " \"" << in.name << "\" <- ";
    if (b.user >= 0) os << "user input " << b.user;
    else if (b.lifted >= 0) os << "run-time scalar " << plan.lifted[static_cast<size_t>(b.lifted)].scalar;
    else os << "tensor read in place";
    os << "\n";
  }
  for (const auto& b : plan.outputs) {
    os << "output %" << b.value << " " << ir::to_string(b.role);
    if (b.role != ir::OutputRole::WriteBack) os << " " << b.index;
    if (b.adopt) os << " (may adopt the value's storage)";
    os << "\n";
  }
  return os.str();
}

}  // namespace

std::shared_ptr<const StepPlan> plan_step(const CapturedStep& cs, const ScalarSlots& slots,
                                          const ResolvedBackend& backend, const PlanOptions& options) {
  auto plan = std::make_shared<StepPlan>();
  plan->num_results = cs.num_results;
  ir::Graph g = cs.raw;
  // Run-time scalars found by the optimizer probe: arguments bound on every call.
  g.scalar_inputs.clear();
  for (const auto& [slot, q] : slots) {
    auto& a = g.nodes.at(static_cast<size_t>(slot.first)).args.at(static_cast<size_t>(slot.second));
    a.scalar_input = q;
    if (g.scalar_inputs.size() <= static_cast<size_t>(q)) g.scalar_inputs.resize(static_cast<size_t>(q) + 1);
    g.scalar_inputs[static_cast<size_t>(q)] = {a.kind, "optimizer.scalar." + std::to_string(q)};
  }
  plan->num_scalars = g.scalar_inputs.size();
  for (const auto& in : g.inputs)
    if (in.role == ir::InputRole::Constant) plan->constants[in.value] = cs.bound.at(in.name);

  PassRunner runner(g, options.dump_dir);
  run_graph_passes(runner, g, plan->constants);
  plan->device = step_device(g);
  // Data parallelism: only a step with an all_reduce has anything to move (and a pass to dump).
  const bool reduces = std::any_of(g.nodes.begin(), g.nodes.end(), node_issues_collective);
  if (options.overlap_collectives && reduces) runner.run("overlap_collectives", [&] { overlap_collectives(g); });

  // Whole-step CUDA graphs bake kernel arguments: run-time scalars become device tensors.
  const bool graph_asked = backend.cuda_graphs && plan->device.is_cuda();
  if (backend.cuda_graphs && !plan->device.is_cuda()) log_info("kiln: the step runs on the CPU; no CUDA graph");
  if (graph_asked) {
    plan->graph_skip = cpu_tensor_in(g);
    // A random op (dropout) draws from LibTorch's CUDA generator: the graph is recorded with the
    // generator registered (cudagraph::Step), so that each replay draws fresh numbers, eager's.
    for (const auto& n : g.nodes) plan->draws_random = plan->draws_random || node_draws_random_numbers(n);
  }
  if ((graph_asked && plan->graph_skip.empty()) || options.lift_runtime_scalars) {
    std::string why;
    runner.run("lift_runtime_scalars", [&] { why = lift(*plan, g); });
    if (graph_asked) plan->graph_skip = why;
    else if (!why.empty()) log_warn("kiln: [debug] lift_runtime_scalars: cannot lift " + why);
  }
  plan->cuda_graph = graph_asked && plan->graph_skip.empty();

  // The optimizer's per-parameter updates as multi-tensor ops, where ATen's kernels run them (on
  // CUDA; on the CPU only with no backend, since inductor fuses the optimizer there itself).
  if (options.batch_optimizer && (plan->device.is_cuda() || !backend.plugin)) {
    size_t folded = 0;
    runner.run("batch_optimizer", [&] { folded = batch_optimizer_updates(g); });
    log_info(
        c10::str("kiln: [experimental] batch_optimizer: ", folded, " optimizer nodes folded into multi-tensor ops"));
  }

  // cuDNN batch norm in native form where the backend takes both ends (it cannot compute cuDNN's
  // reserve space): asked with the plugin's own claim on the rewritten graph.
  if (backend.plugin && plan->device.is_cuda()) {
    if (auto pairs = cudnn_batch_norm_pairs(g); !pairs.empty()) {
      ir::Graph trial = g;
      to_native_batch_norm(trial, pairs);
      std::vector<int64_t> claimed;
      {
        GraphView view(trial);
        claimed = backend.plugin->claim(view.view());
      }
      std::sort(claimed.begin(), claimed.end());
      auto taken = [&](int32_t i) { return std::binary_search(claimed.begin(), claimed.end(), int64_t{i}); };
      std::vector<BatchNormPair> kept;
      for (const auto& p : pairs)
        if (taken(p.forward) && std::all_of(p.backwards.begin(), p.backwards.end(), taken)) kept.push_back(p);
      if (!kept.empty()) {
        runner.run("native_batch_norm", [&] { to_native_batch_norm(g, kept); });
        runner.run("dce_batch_norm", [&] { eliminate_dead_code(g); });
      }
      log_debug(c10::str("kiln: ", kept.size(), " of ", pairs.size(), " cuDNN batch norms in native form for backend '",
                         backend.plugin->name(), "' (it claims both ends)"));
    }
  }

  // Convolutions in NHWC, as cuDNN runs them fastest, with the backend's kernels around them
  // writing and reading that layout. "auto": where the step is one CUDA graph; without one, the
  // step is bound by the host's launches, to which the layout clones add. Only for a backend that
  // compiles some of the step: one that leaves every node to ATen (cudagraphs) runs eager's
  // kernels on eager's layouts, bit for bit.
  if (backend.plugin && plan->device.is_cuda() &&
      (options.channels_last == "always" || (options.channels_last == "auto" && plan->cuda_graph)) &&
      std::any_of(g.nodes.begin(), g.nodes.end(), [](const ir::Node& n) { return n.op == "aten::convolution"; })) {
    bool compiles = false;
    {
      GraphView view(g);
      compiles = !backend.plugin->claim(view.view()).empty();
    }
    size_t convs = 0;
    if (compiles) runner.run("channels_last", [&] { convs = channels_last_convolutions(g); });
    log_debug(
        c10::str("kiln: ", convs, " convolutions on channels-last activations",
                 compiles ? "" : c10::str(" (backend '", backend.plugin->name(), "' compiles none of the step)")));
  }

  // Under an activation memory budget, the backward computes again what the forward no longer keeps.
  if (options.activation_memory_budget < 1.0) {
    RematerializeResult rr;
    runner.run("rematerialize", [&] { rr = rematerialize(g, options.activation_memory_budget); });
    log_debug(c10::str("kiln: activation memory budget ", options.activation_memory_budget, ": the forward keeps ",
                       rr.kept_bytes_after >> 10, " KiB for the backward instead of ", rr.kept_bytes_before >> 10,
                       " KiB (", rr.dropped_tensors, " tensors computed again by ", rr.recomputed_nodes,
                       " nodes in the backward)"));
  }

  // The backend claims its nodes and compiles its groups; the rest runs on the eager executor.
  if (backend.plugin) {
    std::vector<std::shared_ptr<const LoadedPlugin>> plugins{backend.plugin};
    std::vector<KilnMode> modes{backend.mode};
    plugins.insert(plugins.end(), backend.then.begin(), backend.then.end());
    modes.insert(modes.end(), backend.then_modes.begin(), backend.then_modes.end());
    plan->partition = compile_partition(g, plugins, modes, options.compile_threads, options.symbolic_groups.get());
    runner.dump("partition.txt", print_compiled_partition(g, *plan->partition));
  }
  plan->graph = g;

  // Element-wise write-backs that run eagerly compute straight into the written tensor.
  const std::vector<int32_t> no_position;
  const auto& position = plan->backend_runs_nodes() ? plan->partition->position : no_position;
  runner.run("writebacks_in_place", [&] { compute_writebacks_in_place(g, position); });
  plan->run_graph = std::move(g);

  bind(*plan, cs, options.writeback_copy);
  runner.dump("plan.txt", describe(*plan));
  plan->passes = runner.records();
  std::string line = "kiln: passes:";
  for (const auto& r : plan->passes) line += c10::str(" ", r.name, " ", r.nodes_before, "->", r.nodes_after);
  log_debug(line);
  return plan;
}

}  // namespace kiln
