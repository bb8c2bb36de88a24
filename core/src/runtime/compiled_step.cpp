// CompiledStep: guards, the per-signature cache, the capture step, the compiled step and the eager
// fallback.
//
// Signature (guards): every input's sizes, dtype, device and requires_grad; every parameter's
// sizes, dtype, device and requires_grad; every module's training flag; autocast state; grad mode.
// A new signature is captured and compiled (no eager warm-up needed once optimizer state exists);
// past args.runtime.recompile_limit signatures kiln warns once and runs new signatures eagerly.
//
// Optimizer scalars: LibTorch's C++ optimizers compute some arguments on the host (Adam's bias
// corrections change every step; a scheduler changes lr). Each compiled step first replays the
// optimizers' step() under probe_calls (no kernels run, host state advances) and compares every
// scalar argument with the graph's. A scalar that changed becomes a run-time scalar input of the
// graph (Arg::scalar_input) and the graph is re-planned once; from then on it is bound per step.
//
// Whole-step CUDA graphs (mode reduce-overhead or max-autotune, or the cudagraphs backend, with the
// step on CUDA; docs/backends/cudagraphs.md): run-time scalars become 0-dim device tensors
// (lift_runtime_scalars) filled before every call; the first compiled step of a plan runs on the
// capture stream (warm-up) and is then recorded (cuda_graph_step.cpp); later steps copy the user
// inputs into static buffers and launch the graph. A capture failure warns once ("skipping
// cudagraphs due to ...") and the plan runs uncaptured.
#include "kiln/compile.h"

#include <chrono>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "kiln/backend.h"
#include "kiln/capture.h"
#include "kiln/executor.h"
#include "kiln/log.h"
#include "kiln/op_info.h"
#include "kiln/partitioned_executor.h"
#include "kiln/passes.h"
#include "cpu_block_cache.h"
#include "cuda_graph_step.h"
#include "optimizer_probe.h"

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;

// KILN_WRITEBACK_COPY=1: write-backs always copy (no storage adoption; see adopt_storage).
bool storage_swap_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_WRITEBACK_COPY");
    return !(v && *v && std::string(v) != "0");
  }();
  return on;
}

// Runs a compiled graph given its inputs bound in env, with the step's run-time scalars.
struct GraphExecutor {
  virtual ~GraphExecutor() = default;
  // stream: the device stream to run on (cudaStream_t; null: the current one), for plugin groups.
  virtual void run(std::vector<at::Tensor>& env, const std::vector<c10::IValue>& scalars, void* stream) = 0;
};

struct EagerGraphExecutor final : GraphExecutor {
  explicit EagerGraphExecutor(const ir::Graph& g) : ex(g) {}
  void run(std::vector<at::Tensor>& env, const std::vector<c10::IValue>& scalars, void*) override {
    ex.run(env, &scalars);
  }
  EagerExecutor ex;
};

// Backend groups through the plugin ABI, the rest eagerly.
struct PartitionedGraphExecutor final : GraphExecutor {
  PartitionedGraphExecutor(const ir::Graph& g, const ResolvedBackend& b, const std::string& debug_dir)
      : ex(g, b.plugin, b.mode, debug_dir) {}
  void run(std::vector<at::Tensor>& env, const std::vector<c10::IValue>& scalars, void* stream) override {
    ex.run(env, &scalars, stream);
  }
  PartitionedExecutor ex;
};

// The optimizer state tensors LibTorch's optimizers keep, by name.
void optimizer_state_tensors(const torch::optim::OptimizerParamState& st,
                             std::vector<std::pair<std::string, at::Tensor>>& out) {
  if (auto* s = dynamic_cast<const torch::optim::SGDParamState*>(&st)) {
    out.emplace_back("momentum_buffer", s->momentum_buffer());
  } else if (auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(&st)) {
    out.emplace_back("exp_avg", s->exp_avg());
    out.emplace_back("exp_avg_sq", s->exp_avg_sq());
    out.emplace_back("max_exp_avg_sq", s->max_exp_avg_sq());
  } else if (auto* s = dynamic_cast<const torch::optim::AdamParamState*>(&st)) {
    out.emplace_back("exp_avg", s->exp_avg());
    out.emplace_back("exp_avg_sq", s->exp_avg_sq());
    out.emplace_back("max_exp_avg_sq", s->max_exp_avg_sq());
  } else if (auto* s = dynamic_cast<const torch::optim::RMSpropParamState*>(&st)) {
    out.emplace_back("square_avg", s->square_avg());
    out.emplace_back("momentum_buffer", s->momentum_buffer());
    out.emplace_back("grad_avg", s->grad_avg());
  } else if (auto* s = dynamic_cast<const torch::optim::AdagradParamState*>(&st)) {
    out.emplace_back("sum", s->sum());
  }
}

bool arg_matches(const ir::Arg& a, const c10::IValue& v) {
  switch (a.kind) {
    case ir::Arg::Kind::Int:
      return v.isInt() ? v.toInt() == a.i : v.isDouble() ? v.toDouble() == static_cast<double>(a.i) : false;
    case ir::Arg::Kind::Double:
      return v.isDouble() ? v.toDouble() == a.d : v.isInt() ? static_cast<double>(v.toInt()) == a.d : false;
    case ir::Arg::Kind::Bool:
      return v.isBool() && (v.toBool() ? 1 : 0) == a.i;
    default:
      return true;  // lists, strings, dtypes: not step-dependent in any LibTorch optimizer
  }
}

c10::IValue scalar_value(const ir::Arg& a, const c10::IValue& v) {
  switch (a.kind) {
    case ir::Arg::Kind::Int: return v.isInt() ? v : c10::IValue(static_cast<int64_t>(v.toDouble()));
    case ir::Arg::Kind::Bool: return c10::IValue(v.toBool());
    default: return c10::IValue(v.isInt() ? static_cast<double>(v.toInt()) : v.toDouble());
  }
}

}  // namespace

struct CompiledStep::Impl {
  StepFn fn;
  StepState state;
  TrainingArguments args;
  ResolvedBackend resolved;  // plugin null: every node runs on the eager executor
  std::vector<std::string> backend_reasons;
  StepStats stats;
  bool last_compiled = false;
  std::vector<std::shared_ptr<torch::nn::Module>> all_modules;
  std::vector<std::pair<std::string, at::Tensor>> params;  // unique, named
  std::set<std::string> warned;
  std::vector<std::string> optimizer_names;
  struct Structure {
    std::vector<const void*> addresses;
    std::string options;
    bool operator==(const Structure& o) const { return addresses == o.addresses && options == o.options; }
  };
  Structure structure;                 // structure_now() when the state was collected
  bool structure_eager = false;        // it kept changing past recompile_limit: every step runs eagerly
  // Captures that failed, by signature without sizes: a new shape with the same cause runs eagerly
  // at once instead of paying another failing capture.
  std::map<std::vector<int64_t>, std::string> failed_captures;

  struct InBind {
    ir::ValueId value;
    int user = -1;
    at::Tensor tensor;
    int lifted = -1;  // a lifted run-time scalar: Entry::lifted[lifted]
  };
  struct OutBind {
    enum Kind { Result, WriteBack, Grad } kind;
    ir::ValueId value;
    at::Tensor target;  // WriteBack: the tensor written; Grad: the parameter
    int result = -1;
    bool adopt = false;  // WriteBack: the target may take the value's storage (see adopt_storage)
  };

  struct Entry {
    bool compiled = false;
    bool retry = false;               // the capture is to be done again at the next step
    std::vector<int64_t> shapeless;   // the signature without sizes (failed_captures' key)
    std::string reason;
    // From the capture.
    ir::Graph raw;
    std::unordered_map<std::string, at::Tensor> bound;  // input name -> tensor read in place
    std::unordered_map<std::string, int> user;           // input name -> user input index
    std::unordered_map<std::string, at::Tensor> grad_of;  // "grad.<p>" output -> parameter
    size_t num_results = 0;
    std::vector<at::Tensor> grad_placeholder_for;  // params whose grad must be defined for the probe
    std::vector<at::Tensor> grad_placeholders;
    std::vector<at::Tensor> placed;  // parameters given a placeholder gradient by this step's probe
    // Probe matching: each optimizer's calls in the raw graph (found at the first compiled step),
    // the tensors they must work on, and the run-time scalar slots.
    std::unordered_map<int32_t, at::Tensor> storage_tensor;  // raw storage id -> parameter/buffer/state
    OptimizerSites sites;
    bool sites_found = false;
    std::map<std::pair<int32_t, int32_t>, int32_t> slot_scalar;  // (raw node, arg) -> scalar input
    // The executable.
    ir::Graph graph;
    std::unordered_map<ir::ValueId, at::Tensor> constants;
    // Under a CUDA graph, the address of every tensor the graph reads in place: torch::load gives
    // a parameter new memory (Tensor::set_), which a replay would not see.
    std::vector<std::pair<at::Tensor, const void*>> graph_addresses;
    std::unique_ptr<GraphExecutor> exec;
    std::vector<InBind> ins;
    std::vector<OutBind> outs;
    std::vector<c10::IValue> scalars;
    std::vector<at::Tensor> env;
    // Whole-step CUDA graph.
    bool graphs = false;
    bool draws_random = false;  // the plan has a random op: its graph registers the CUDA generator
    c10::Device graph_device = c10::Device(c10::kCPU);
    std::vector<LiftedScalar> lifted;          // run-time scalars as 0-dim device tensors
    std::vector<at::Tensor> scalar_buffers;    // one device buffer per dtype of lifted scalars
    std::vector<std::pair<size_t, int64_t>> lifted_at;  // per lifted scalar: (buffer, index)
    std::unique_ptr<cudagraph::Step> cg;       // the recorded graph of this plan
  };
  std::map<std::vector<int64_t>, std::unique_ptr<Entry>> cache;
  Entry* last = nullptr;

  void warn_once(const std::string& msg) {
    if (warned.insert(msg).second) log_warn(msg);
  }

  void collect_state() {
    all_modules.clear();
    params.clear();
    structure = structure_now();
    std::set<const c10::TensorImpl*> seen;
    for (size_t m = 0; m < state.modules.size(); ++m) {
      const auto& mod = state.modules[m];
      const std::string prefix = state.modules.size() > 1 ? "module" + std::to_string(m) + "." : "";
      for (auto& sub : mod->modules(/*include_self=*/true)) all_modules.push_back(sub);
      for (auto& p : mod->named_parameters(true))
        if (seen.insert(p.value().unsafeGetTensorImpl()).second) params.emplace_back(prefix + p.key(), p.value());
    }
  }

  // Every module, parameter and buffer the step can see, by address (parameters replaced, a module
  // added, a buffer re-registered all change it), and every module's options as LibTorch prints
  // them ("torch::nn::Dropout(p=0.5, inplace=false)"): the forward reads those on the host, so a
  // capture bakes them (a dropout probability or a batch norm momentum changed between steps).
  Structure structure_now() const {
    Structure out;
    out.addresses.reserve(structure.addresses.size());
    out.options.reserve(structure.options.size());
    std::ostringstream os;
    std::function<void(const torch::nn::Module&)> walk = [&](const torch::nn::Module& m) {
      out.addresses.push_back(&m);
      for (const auto& p : m.parameters(/*recurse=*/false)) out.addresses.push_back(p.unsafeGetTensorImpl());
      for (const auto& b : m.buffers(/*recurse=*/false)) out.addresses.push_back(b.unsafeGetTensorImpl());
      m.pretty_print(os);
      os << '\n';
      for (const auto& c : m.children()) walk(*c);
    };
    for (const auto& m : state.modules) walk(*m);
    out.options = os.str();
    return out;
  }

  // Parameters, buffers or submodules changed since the step was captured: every plan reads the old
  // ones, so all are dropped and the step is captured again.
  // Returns false once that happened more than recompile_limit times: the step then runs eagerly.
  bool check_structure() {
    if (structure_eager) return false;
    if (structure_now() == structure) return true;
    if (stats.recaptures >= args.runtime.recompile_limit) {
      structure_eager = true;
      collect_state();
      cache.clear();
      last = nullptr;
      fallback(c10::str("kiln: the modules' parameters, buffers, submodules or options changed again after ", stats.recaptures,
                        " captures (recompile_limit); the step runs eagerly from now on"));
      return false;
    }
    log_info("kiln: the modules' parameters, buffers, submodules or options changed; capturing the step again");
    collect_state();
    cache.clear();
    failed_captures.clear();
    last = nullptr;
    ++stats.recaptures;
    return true;
  }

  // with_sizes = false: the same without sizes (ranks only), the key of failed_captures.
  std::vector<int64_t> signature(const std::vector<at::Tensor>& inputs, bool with_sizes = true) const {
    std::vector<int64_t> sig;
    sig.reserve(16 + inputs.size() * 8 + params.size() * 4);
    auto add_tensor = [&](const at::Tensor& t) {
      if (!t.defined()) {
        sig.push_back(-1);
        return;
      }
      sig.push_back(t.dim());
      if (with_sizes)
        for (auto s : t.sizes()) sig.push_back(s);
      sig.push_back(static_cast<int64_t>(t.scalar_type()));
      sig.push_back(static_cast<int64_t>(t.device().type()) * 1000 + t.device().index());
      sig.push_back(t.requires_grad());
    };
    for (const auto& t : inputs) add_tensor(t);
    sig.push_back(-2);
    for (const auto& p : params) add_tensor(p.second);
    sig.push_back(-3);
    for (const auto& m : all_modules) sig.push_back(m->is_training());
    sig.push_back(c10::GradMode::is_enabled());
    sig.push_back(at::autocast::is_autocast_enabled(at::kCUDA));
    sig.push_back(at::autocast::is_autocast_enabled(at::kCPU));
    sig.push_back(static_cast<int64_t>(at::autocast::get_autocast_dtype(at::kCUDA)));
    return sig;
  }

  std::vector<at::Tensor> eager(const std::vector<at::Tensor>& inputs) {
    ++stats.eager_steps;
    last_compiled = false;
    return fn(inputs);
  }

  std::vector<KnownTensor> known_tensors(const std::vector<at::Tensor>& inputs) {
    std::vector<KnownTensor> known;
    for (size_t i = 0; i < inputs.size(); ++i)
      known.push_back({inputs[i], ir::InputRole::UserInput, "input." + std::to_string(i), static_cast<int>(i)});
    std::unordered_map<const void*, std::string> param_name;
    for (const auto& [name, p] : params) {
      known.push_back({p, ir::InputRole::Parameter, name});
      param_name[p.unsafeGetTensorImpl()] = name;
      if (p.grad().defined()) known.push_back({p.grad(), ir::InputRole::Gradient, "grad." + name});
    }
    for (size_t m = 0; m < state.modules.size(); ++m) {
      const std::string prefix = state.modules.size() > 1 ? "module" + std::to_string(m) + "." : "";
      for (auto& b : state.modules[m]->named_buffers(true))
        if (b.value().defined()) known.push_back({b.value(), ir::InputRole::Buffer, prefix + b.key()});
    }
    for (size_t o = 0; o < state.optimizers.size(); ++o) {
      for (const auto& [key, st] : state.optimizers[o]->state()) {
        auto it = param_name.find(key);
        const std::string pname = it != param_name.end() ? it->second : "param" + std::to_string(known.size());
        std::vector<std::pair<std::string, at::Tensor>> ts;
        optimizer_state_tensors(*st, ts);
        for (auto& [field, t] : ts)
          if (t.defined())
            known.push_back({t, ir::InputRole::OptimizerState,
                             "optimizer" + (o ? std::to_string(o) : std::string()) + "." + pname + "." + field});
      }
    }
    return known;
  }

  // The capture step: runs the step for real while recording it, then compiles.
  std::vector<at::Tensor> capture_and_compile(const std::vector<at::Tensor>& inputs, Entry& e) {
    const auto t0 = Clock::now();
    std::set<const c10::TensorImpl*> grads_before;
    for (const auto& [name, p] : params)
      if (p.grad().defined()) grads_before.insert(p.grad().unsafeGetTensorImpl());
    const size_t state_entries = optimizer_state_entries(state.optimizers);
    StepRecorder rec(known_tensors(inputs));
    auto results = rec.run([&] { return fn(inputs); });
    ++stats.eager_steps;
    last_compiled = false;
    std::string failure;
    if (!rec.ok()) {
      failure = "kiln: the step cannot be captured: " + rec.failure().reason;
    } else if (optimizer_state_entries(state.optimizers) != state_entries) {
      // An optimizer made state for a parameter it had not stepped before (new parameters, or the
      // state was cleared): the recorded step creates that state instead of reading it. Captured
      // again at the next step, when the state exists.
      e.retry = true;
      failure = "kiln: an optimizer created state for new parameters during this step";
    } else {
      for (size_t k = 0; k < results.size() && failure.empty(); ++k) {
        const auto v = rec.value_of(results[k]);
        if (v == ir::kNoValue) failure = "kiln: the step's result " + std::to_string(k) + " was not computed by ATen ops in the step";
        else rec.add_output(v, "result." + std::to_string(k));
      }
      e.num_results = results.size();
      for (const auto& [name, p] : params) {
        const auto& g = p.grad();
        if (!g.defined() || grads_before.count(g.unsafeGetTensorImpl())) continue;
        const auto v = rec.value_of(g);
        if (v == ir::kNoValue) continue;
        rec.add_output(v, "grad." + name);
        e.grad_of["grad." + name] = p;
        e.grad_placeholder_for.push_back(p);
      }
      for (const auto& r : rec.host_reads())
        log_info("kiln: the step reads a value on the host (" + r + "); the compiled step computes it on the device, "
                 "and the host code that used it ran once, at capture");
    }
    if (failure.empty()) {
      e.raw = std::move(rec.graph());
      for (size_t i = 0; i < e.raw.inputs.size(); ++i) {
        const auto& in = e.raw.inputs[i];
        if (rec.input_user_index()[i] >= 0) {
          e.user[in.name] = rec.input_user_index()[i];
          continue;
        }
        e.bound[in.name] = rec.input_tensors()[i];
        if (in.role == ir::InputRole::Parameter || in.role == ir::InputRole::Buffer ||
            in.role == ir::InputRole::OptimizerState)
          e.storage_tensor[e.raw.value(in.value).storage] = rec.input_tensors()[i];
      }
      try {
        look_ahead(e);
        build(e);
        e.compiled = true;
      } catch (const std::exception& ex) {
        failure = std::string("kiln: compiling the step failed: ") + ex.what();
      }
    }
    stats.last_compile_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
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
      log_info(c10::str("kiln: compiled the step (", e.graph.nodes.size(), " nodes, ", e.raw.nodes.size(),
                        " captured) in ", stats.last_compile_seconds, " s"));
    }
    return results;
  }

  void fallback(const std::string& why) {
    stats.last_fallback = why;
    if (args.runtime.fullgraph) throw CompileError(why + " (fullgraph = true)");
    warn_once(why + "; running this step eagerly");
  }

  // From e.raw (and its run-time scalar slots) to an executable.
  void build(Entry& e) {
    ir::Graph g = e.raw;
    g.scalar_inputs.clear();
    for (const auto& [slot, q] : e.slot_scalar) {
      auto& a = g.nodes[static_cast<size_t>(slot.first)].args[static_cast<size_t>(slot.second)];
      a.scalar_input = q;
      if (g.scalar_inputs.size() <= static_cast<size_t>(q)) g.scalar_inputs.resize(static_cast<size_t>(q) + 1);
      g.scalar_inputs[static_cast<size_t>(q)] = {a.kind, "optimizer.scalar." + std::to_string(q)};
    }
    e.constants.clear();
    for (size_t i = 0; i < g.inputs.size(); ++i)
      if (g.inputs[i].role == ir::InputRole::Constant) e.constants[g.inputs[i].value] = e.bound.at(g.inputs[i].name);
    PipelineOptions popts;
    auto records = run_pipeline(g, e.constants, popts);
    std::string line = "kiln: passes:";
    for (const auto& r : records) line += c10::str(" ", r.name, " ", r.nodes_before, "->", r.nodes_after);
    log_debug(line);
    g.verify();
    plan_graphs(e, g);
    const bool eager_executor = !resolved.plugin || (resolved.cuda_graphs && resolved.plugin == resolved.graph_plugin &&
                                                     resolved.choice.backend == "cudagraphs");
    // KILN_BATCH_OPTIMIZER=1 (experimental): the optimizer's per-parameter updates as multi-tensor
    // ops, where ATen's kernels run them (on CUDA; on the CPU only with no backend claiming nodes,
    // since inductor fuses the optimizer there itself).
    if (const char* v = std::getenv("KILN_BATCH_OPTIMIZER"); v && *v && std::string(v) != "0" &&
        (e.graph_device.is_cuda() || eager_executor)) {
      const size_t before = g.nodes.size();
      const size_t folded = batch_optimizer_updates(g);
      log_info(c10::str("kiln: KILN_BATCH_OPTIMIZER: ", folded, " optimizer nodes folded into multi-tensor ops (",
                        before, " -> ", g.nodes.size(), " nodes)"));
    }
    stats.groups.clear();
    if (!eager_executor) {
      auto partitioned = std::make_unique<PartitionedGraphExecutor>(g, resolved, debug_dir(popts));
      stats.groups = partitioned->ex.groups();  // which groups the backend's own code runs
      e.exec = std::move(partitioned);
    } else {
      ir::Graph planned = g;
      compute_writebacks_in_place(planned);
      e.exec = std::make_unique<EagerGraphExecutor>(planned);
    }
    e.ins.clear();
    for (const auto& in : g.inputs) {
      InBind b{in.value};
      if (in.role == ir::InputRole::Scalar) {
        for (size_t k = 0; k < e.lifted.size(); ++k)
          if (e.lifted[k].value == in.value) {
            b.lifted = static_cast<int>(k);
            const auto& [buf, idx] = e.lifted_at[k];
            b.tensor = e.scalar_buffers[buf].select(0, idx);
          }
        if (b.lifted < 0) throw std::runtime_error("no run-time scalar for graph input '" + in.name + "'");
      } else if (auto u = e.user.find(in.name); u != e.user.end()) b.user = u->second;
      else if (auto t = e.bound.find(in.name); t != e.bound.end()) b.tensor = t->second;
      else if (auto c = e.constants.find(in.value); c != e.constants.end()) b.tensor = c->second;
      else throw std::runtime_error("no tensor for graph input '" + in.name + "'");
      e.ins.push_back(std::move(b));
    }
    e.outs.clear();
    for (const auto& o : g.outputs) {
      OutBind b{OutBind::Result, o.value, {}, -1};
      if (o.role == ir::OutputRole::WriteBack) {
        b.kind = OutBind::WriteBack;
        const auto& target = g.inputs.at(static_cast<size_t>(o.target));
        if (auto t = e.bound.find(target.name); t != e.bound.end()) b.target = t->second;
        else throw std::runtime_error("the step writes its input '" + target.name + "'; kiln does not write user inputs back yet");
      } else if (auto p = e.grad_of.find(o.name); p != e.grad_of.end()) {
        b.kind = OutBind::Grad;
        b.target = p->second;
      } else if (o.name.rfind("result.", 0) == 0) {
        b.result = std::stoi(o.name.substr(7));
      } else {
        continue;
      }
      e.outs.push_back(std::move(b));
    }
    // A write-back may hand its value's storage to the target only when no other output (a result,
    // a gradient, another write-back) is the same value, and never into a CUDA graph's replay
    // (its buffers are fixed addresses).
    {
      std::map<ir::ValueId, int> uses;
      for (const auto& o : e.outs) ++uses[o.value];
      for (auto& o : e.outs)
        o.adopt = o.kind == OutBind::WriteBack && uses[o.value] == 1 && !e.graphs && storage_swap_enabled();
    }
    e.scalars.assign(g.scalar_inputs.size(), c10::IValue());
    e.graph = std::move(g);
    e.env.assign(e.graph.values.size(), at::Tensor());
  }

  // A parameter written in the step by something other than the listed optimizers' step(): an
  // optimizer the user did not pass in StepState replays with the scalars of the capture (Adam's
  // bias corrections would never move, its step count never advance). A hand-written update
  // (p -= lr * grad) is fine, so this warns rather than falling back.
  void warn_unlisted_updates(const Entry& e) {
    std::map<int32_t, std::string> param_storage;
    for (const auto& in : e.raw.inputs)
      if (in.role == ir::InputRole::Parameter) param_storage[e.raw.value(in.value).storage] = in.name;
    std::set<int32_t> listed;
    for (const auto& per : e.sites)
      for (const auto& c : per) listed.insert(c.node);
    for (size_t i = 0; i < e.raw.nodes.size(); ++i) {
      const auto& n = e.raw.nodes[i];
      if (n.phase == "backward" || listed.count(static_cast<int32_t>(i))) continue;
      const auto& info = op_info(n.op);
      if (!info.is_mutable || !info.handle) continue;
      const auto& params = info.handle->schema().arguments();
      for (size_t k = 0; k < params.size() && k < n.args.size(); ++k) {
        const auto* alias = params[k].alias_info();
        if (!alias || !alias->isWrite() || n.args[k].kind != ir::Arg::Kind::Tensor) continue;
        auto p = param_storage.find(e.raw.value(n.args[k].value).storage);
        if (p == param_storage.end()) continue;
        warn_once(c10::str("kiln: the step updates parameter '", p->second, "' with ", n.op,
                           " outside the optimizers given to kiln (StepState::optimizers): if an optimizer makes "
                           "that update, pass it there, or its host state (step counts, bias corrections, learning "
                           "rate) will not advance in compiled steps"));
        return;
      }
    }
  }

  // The optimizers skip parameters without a gradient; the graph computes them all, so a probe lends
  // a placeholder gradient to each parameter the step makes one for. A failed probe takes them
  // back (undo_placeholders): an eager step must not accumulate into them.
  void lend_placeholders(Entry& e) {
    e.placed.clear();
    for (size_t i = 0; i < e.grad_placeholder_for.size(); ++i) {
      auto& p = e.grad_placeholder_for[i];
      if (p.grad().defined()) continue;
      if (e.grad_placeholders.size() <= i) e.grad_placeholders.resize(e.grad_placeholder_for.size());
      if (!e.grad_placeholders[i].defined()) e.grad_placeholders[i] = at::empty_like(p);
      p.mutable_grad() = e.grad_placeholders[i];
      e.placed.push_back(p);
    }
  }
  static void undo_placeholders(Entry& e) {
    for (auto& p : e.placed) p.mutable_grad().reset();
    e.placed.clear();
  }

  // Every optimizer's step() replayed on the host with no kernels, one optimizer at a time.
  std::vector<std::vector<ProbeCall>> probe_optimizers() {
    std::vector<std::vector<ProbeCall>> calls(state.optimizers.size());
    for (size_t o = 0; o < state.optimizers.size(); ++o)
      calls[o] = probe_calls([&] {
        c10::NoGradGuard no_grad;
        state.optimizers[o]->step();
      });
    return calls;
  }

  // Every scalar argument of every call: a run-time scalar slot is bound; a value that differs
  // from the capture's (a bias correction, a scheduled learning rate) becomes a new slot. Returns
  // whether a slot was added (the plan must be made again).
  static bool bind_scalars(Entry& e, const std::vector<std::vector<ProbeCall>>& calls) {
    bool changed = false;
    for (size_t o = 0; o < calls.size(); ++o)
      for (size_t j = 0; j < calls[o].size(); ++j) {
        const auto node = e.sites[o][j].node;
        const auto& raw = e.raw.nodes[static_cast<size_t>(node)];
        for (size_t k = 0; k < raw.args.size(); ++k) {
          const auto& a = raw.args[k];
          if (a.kind != ir::Arg::Kind::Int && a.kind != ir::Arg::Kind::Double && a.kind != ir::Arg::Kind::Bool) continue;
          const auto& v = calls[o][j].args[k];
          auto slot = e.slot_scalar.find({node, static_cast<int32_t>(k)});
          if (slot != e.slot_scalar.end()) {
            if (static_cast<size_t>(slot->second) < e.scalars.size())
              e.scalars[static_cast<size_t>(slot->second)] = scalar_value(a, v);
          } else if (!arg_matches(a, v)) {
            const auto q = static_cast<int32_t>(e.slot_scalar.size());
            e.slot_scalar[{node, static_cast<int32_t>(k)}] = q;
            changed = true;
          }
        }
      }
    return changed;
  }

  // Right after a capture: the optimizers' next step() replayed on the host finds their calls in
  // the graph and the scalars that the next step passes differently (Adam's bias corrections), so
  // that the first plan already takes them as run-time inputs and is not made twice. The
  // optimizers' host state and the gradients are put back afterwards. When the calls cannot be
  // matched here, the first compiled step's probe tries again and says why.
  void look_ahead(Entry& e) {
    if (state.optimizers.empty()) return;
    const OptimizerSnapshot snapshot(state.optimizers);
    lend_placeholders(e);
    try {
      const auto calls = probe_optimizers();
      if (match_optimizer_calls(e.raw, e.storage_tensor, calls, optimizer_names, e.sites).empty()) {
        e.sites_found = true;
        warn_unlisted_updates(e);
        bind_scalars(e, calls);
      } else {
        e.sites.clear();
      }
    } catch (const std::exception& ex) {
      log_debug(std::string("kiln: the optimizers' look-ahead after the capture failed: ") + ex.what());
      e.sites.clear();
      e.sites_found = false;
    }
    undo_placeholders(e);
    snapshot.restore();
  }

  // Replays the optimizers' step() without kernels, one optimizer at a time; checks that each made
  // the calls the captured graph holds, on the same tensors; binds run-time scalars. Returns false
  // (with the reason, naming the optimizer) when they no longer match. The optimizers' host state
  // has advanced either way: the caller restores it from a snapshot when this fails.
  bool probe(Entry& e, std::string& why) {
    if (state.optimizers.empty()) {
      if (!e.sites_found) warn_unlisted_updates(e);
      e.sites_found = true;
      return true;
    }
    lend_placeholders(e);
    auto calls = probe_optimizers();
    if (!e.sites_found) {
      why = match_optimizer_calls(e.raw, e.storage_tensor, calls, optimizer_names, e.sites);
      if (!why.empty()) return false;
      e.sites_found = true;
      warn_unlisted_updates(e);
    } else {
      why = check_optimizer_calls(e.raw, e.sites, calls, optimizer_names);
      if (!why.empty()) return false;
    }
    const bool changed = bind_scalars(e, calls);
    if (changed) {
      // Re-plan with the new run-time scalars, then bind them all from this probe.
      const auto b0 = Clock::now();
      build(e);
      ++stats.rebuilds;
      stats.probe_seconds -= std::chrono::duration<double>(Clock::now() - b0).count();  // the probe alone
      std::map<int32_t, const ProbeCall*> call_at;
      for (size_t o = 0; o < calls.size(); ++o)
        for (size_t j = 0; j < calls[o].size(); ++j) call_at[e.sites[o][j].node] = &calls[o][j];
      for (const auto& [slot, q] : e.slot_scalar)
        e.scalars[static_cast<size_t>(q)] =
            scalar_value(e.raw.nodes[static_cast<size_t>(slot.first)].args[static_cast<size_t>(slot.second)],
                         call_at.at(slot.first)->args[static_cast<size_t>(slot.second)]);
    }
    return true;
  }

  // Turns g's run-time scalars into 0-dim tensors on e.graph_device, read from one buffer per dtype
  // that fill_scalars writes before every call. Returns why not ("" when done or nothing to do).
  std::string lift(Entry& e, ir::Graph& g) {
    if (g.scalar_inputs.empty()) return "";
    ir::Graph lg = g;
    std::vector<LiftedScalar> lifted;
    auto bad = lift_runtime_scalars(lg, &lifted);
    if (!bad.empty())
      return "a run-time scalar argument of " + bad.front() +
             " (a CUDA graph bakes kernel arguments; kiln turns run-time scalars of add, sub, mul, div, addcdiv, "
             "addcmul, lerp, pow and fill into device tensors, not of this op)";
    g = std::move(lg);
    e.lifted = std::move(lifted);
    std::vector<std::pair<c10::ScalarType, int64_t>> bufs;  // (dtype, count)
    for (const auto& l : e.lifted) {
      size_t b = 0;
      while (b < bufs.size() && bufs[b].first != l.dtype) ++b;
      if (b == bufs.size()) bufs.emplace_back(l.dtype, 0);
      e.lifted_at.emplace_back(b, bufs[b].second++);
    }
    for (const auto& [dtype, n] : bufs)
      e.scalar_buffers.push_back(at::zeros({n}, at::TensorOptions(dtype).device(e.graph_device)));
    return "";
  }

  // The step's device: its parameters', else any input's (CUDA first).
  static c10::Device step_device(const ir::Graph& g) {
    for (int pass = 0; pass < 2; ++pass)
      for (const auto& in : g.inputs) {
        const auto& d = g.value(in.value).meta.device;
        if (d.is_cuda() && (pass == 1 || in.role == ir::InputRole::Parameter)) return d;
      }
    for (const auto& in : g.inputs)
      if (in.role == ir::InputRole::Parameter) return g.value(in.value).meta.device;
    return c10::Device(c10::kCPU);
  }

  // Whether this plan is recorded as a CUDA graph, and on which device; lifts run-time scalars
  // into device tensors (g changes) when it is. Warns once when a CUDA step cannot be graphed.
  void plan_graphs(Entry& e, ir::Graph& g) {
    e.cg.reset();
    e.graphs = false;
    e.lifted.clear();
    e.scalar_buffers.clear();
    e.lifted_at.clear();
    e.graph_device = step_device(g);
    if (!resolved.cuda_graphs) {
      // KILN_LIFT_RUNTIME_SCALARS=1 (a debugging aid): lift run-time scalars into tensors without
      // a graph, to tell the lifting's numerics from the graph's replay, on any device.
      if (const char* v = std::getenv("KILN_LIFT_RUNTIME_SCALARS"); v && *v && std::string(v) != "0") {
        const std::string why = lift(e, g);
        if (!why.empty()) warn_once("kiln: KILN_LIFT_RUNTIME_SCALARS: cannot lift " + why);
      }
      return;
    }
    if (!e.graph_device.is_cuda()) {
      log_info("kiln: the step runs on the CPU; no CUDA graph");
      return;
    }
    // A CPU tensor computed or read inside the step cannot be replayed by a CUDA graph (0-dim CPU
    // tensors are kernel arguments and are allowed, as PyTorch allows CPU scalars).
    std::string why;
    for (const auto& in : g.inputs) {
      const auto& m = g.value(in.value).meta;
      if (!m.device.is_cuda() && m.numel() > 1) {
        why = c10::str("cpu device (input '", in.name, "' is a ", m.device, " tensor)");
        break;
      }
    }
    for (size_t i = 0; i < g.nodes.size() && why.empty(); ++i)
      for (auto v : g.nodes[i].outputs)
        if (v != ir::kNoValue && !g.value(v).meta.device.is_cuda() && g.value(v).meta.numel() > 1) {
          why = c10::str("cpu device (node ", i, " ", g.nodes[i].op, " makes a ", g.value(v).meta.device, " tensor)");
          break;
        }
    // A random op (dropout) draws from LibTorch's CUDA generator: the graph is recorded with the
    // generator registered (cudagraph::Step), so that each replay draws fresh numbers, eager's.
    e.draws_random = false;
    for (const auto& n : g.nodes) e.draws_random = e.draws_random || node_draws_random_numbers(n);
    if (why.empty()) why = lift(e, g);
    if (!why.empty()) {
      const std::string msg = "kiln: skipping cudagraphs due to " + why;
      stats.last_graph_skip = msg;
      warn_once(msg + "; the step runs without a CUDA graph");
      return;
    }
    e.graphs = true;
  }

  // Writes the current run-time scalars into the lifted scalars' device buffers: one host-to-device
  // copy per dtype, on the current stream, before the step's kernels (or the graph launch).
  void fill_scalars(Entry& e) {
    if (e.lifted.empty()) return;
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    for (size_t b = 0; b < e.scalar_buffers.size(); ++b) {
      auto& buf = e.scalar_buffers[b];
      // Pinned memory from LibTorch's caching host allocator: the non-blocking copy records an
      // event on the block, which is not handed out again before the copy has read it.
      at::Tensor host = at::empty({buf.numel()}, buf.options().device(at::kCPU).pinned_memory(buf.is_cuda()));
      AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, host.scalar_type(), "kiln_fill_scalars", [&] {
        scalar_t* p = host.data_ptr<scalar_t>();
        for (size_t k = 0; k < e.lifted.size(); ++k) {
          if (e.lifted_at[k].first != b) continue;
          const c10::IValue& v = e.scalars.at(static_cast<size_t>(e.lifted[k].scalar));
          const double d = v.isDouble() ? v.toDouble() : v.isInt() ? static_cast<double>(v.toInt()) : v.isBool() ? v.toBool() : 0.0;
          if (!e.lifted[k].reciprocal) {
            p[e.lifted_at[k].second] = static_cast<scalar_t>(d);
          } else {
            // As ATen's CUDA division by a host scalar: 1/s in double, then rounded to the
            // operand's math type (1/s in float differs in the last bit for about half the
            // values: AdamW's 1/sqrt(1 - 0.999^3) does, and the lifted step drifted from eager).
            using opmath_t = at::opmath_type<scalar_t>;
            p[e.lifted_at[k].second] = static_cast<scalar_t>(static_cast<opmath_t>(1.0 / d));
          }
        }
      });
      buf.copy_(host, /*non_blocking=*/true);
    }
  }

  void bind(const std::vector<at::Tensor>& inputs, Entry& e, const std::vector<at::Tensor>* statics = nullptr) {
    auto& env = e.env;
    size_t k = 0;
    for (const auto& b : e.ins) {
      at::Tensor t = b.user >= 0 ? (statics ? (*statics)[k++] : inputs.at(static_cast<size_t>(b.user))) : b.tensor;
      env[static_cast<size_t>(b.value)] = std::move(t);
    }
  }

  // The step's device work: the executor and the write-back copies (recorded into the graph).
  void run_body(Entry& e, void* stream) {
    auto& env = e.env;
    e.exec->run(env, e.scalars, stream);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    for (const auto& o : e.outs) {
      if (o.kind != OutBind::WriteBack) continue;
      auto& v = env[static_cast<size_t>(o.value)];
      if (v.is_same(o.target)) continue;
      if (o.adopt && adopt_storage(o.target, v)) {
        ++stats.adopted_writebacks;
        continue;
      }
      o.target.copy_(v);
    }
  }

  // A write-back without the copy: the target (a parameter, an optimizer state tensor) takes the
  // new value's storage, and its old storage is freed. Only on the CPU, for dense tensors of the
  // same layout, when nothing else can see either storage: the target's storage has no other
  // tensor (no view, no alias the user kept from .detach()) and the value's storage is the
  // value's alone. LibTorch's optimizers and the user keep the same TensorImpl, which now reads
  // the new values: what a copy would have given, without moving the bytes (AdamW on gpt writes
  // back 128 MB per step). Returns false (copy instead) when any condition fails.
  static bool adopt_storage(const at::Tensor& target, at::Tensor& v) {
    if (!target.device().is_cpu() || v.device() != target.device() || v.scalar_type() != target.scalar_type())
      return false;
    if (target.is_view() || v.is_view() || target.storage_offset() != 0 || v.storage_offset() != 0) return false;
    if (!target.is_contiguous() || !v.is_contiguous() || target.sizes() != v.sizes() || target.strides() != v.strides())
      return false;
    if (!target.has_storage() || !v.has_storage() || target.is_inference() != v.is_inference()) return false;
    const auto& ts = target.storage();
    const auto& vs = v.storage();
    if (ts.use_count() != 1 || vs.use_count() != 1 || v.use_count() != 1) return false;
    if (ts.nbytes() != target.nbytes() || vs.nbytes() < v.nbytes() || !ts.resizable() || !vs.resizable()) return false;
    auto* impl = target.unsafeGetTensorImpl();
    if (!impl->allow_tensor_metadata_change()) return false;
    impl->set_storage_keep_dtype(vs);
    v.reset();
    return true;
  }

  // The host side of a finished step: versions, .grad, results. clone_results: results live in a
  // graph's static buffers, which the next replay overwrites.
  std::vector<at::Tensor> finish(Entry& e, bool clone_results) {
    auto& env = e.env;
    std::vector<at::Tensor> results(e.num_results);
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      for (const auto& o : e.outs) {
        auto& v = env[static_cast<size_t>(o.value)];
        switch (o.kind) {
          case OutBind::WriteBack: o.target.unsafeGetTensorImpl()->bump_version(); break;
          case OutBind::Grad: const_cast<at::Tensor&>(o.target).mutable_grad() = v; break;
          case OutBind::Result: results[static_cast<size_t>(o.result)] = clone_results ? v.clone() : v; break;
        }
      }
    }
    for (auto& t : env) t.reset();
    ++stats.compiled_steps;
    last_compiled = true;
    return results;
  }

  std::vector<at::Tensor> run_compiled(const std::vector<at::Tensor>& inputs, Entry& e) {
    fill_scalars(e);
    if (e.graphs) {
      if (e.cg && e.cg->recorded()) return replay(inputs, e);
      return warm_up_and_record(inputs, e);
    }
    bind(inputs, e);
    {
      // CPU memory of the step from kiln's block cache (runtime/cpu_block_cache.h).
      std::optional<ScopedCpuBlockCache> cache;
      if (!e.graph_device.is_cuda()) cache.emplace();
      run_body(e, nullptr);
    }
    return finish(e, false);
  }

  // The first step of a plan with CUDA graphs: runs for real on the capture stream (the warm-up),
  // then records the graph that later steps replay.
  std::vector<at::Tensor> warm_up_and_record(const std::vector<at::Tensor>& inputs, Entry& e) {
    std::unique_ptr<cudagraph::Step> cg;
    try {
      cg = std::make_unique<cudagraph::Step>(resolved.graph_plugin, e.graph_device, e.draws_random);
    } catch (const std::exception& ex) {
      e.graphs = false;
      stats.last_graph_skip = std::string("kiln: skipping cudagraphs due to ") + ex.what();
      warn_once(stats.last_graph_skip + "; the step runs without a CUDA graph");
      bind(inputs, e);
      run_body(e, nullptr);
      return finish(e, false);
    }
    bind(inputs, e);
    cg->warm_up([&](void* stream) { run_body(e, stream); }, e.env);
    auto results = finish(e, false);
    // Static inputs: the user inputs' buffers the graph reads; replays copy new inputs into them.
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      for (const auto& b : e.ins)
        if (b.user >= 0) {
          const auto& in = inputs.at(static_cast<size_t>(b.user));
          cg->static_inputs.push_back(at::empty_strided(in.sizes(), in.strides(), in.options()).copy_(in));
        }
    }
    bind(inputs, e, &cg->static_inputs);
    const auto t0 = Clock::now();
    try {
      cg->record([&](void* stream) { run_body(e, stream); });
      for (const auto& o : e.outs) cg->static_outputs.push_back(e.env[static_cast<size_t>(o.value)]);
    } catch (const cudagraph::CaptureFailed& f) {
      for (auto& t : e.env) t.reset();
      cg.reset();
      e.graphs = false;
      stats.last_graph_skip = std::string("kiln: skipping cudagraphs due to ") + f.what();
      warn_once(stats.last_graph_skip + "; the step runs without a CUDA graph");
      return results;
    }
    for (auto& t : e.env) t.reset();
    e.graph_addresses.clear();
    for (const auto& b : e.ins)
      if (b.user < 0 && b.tensor.defined()) e.graph_addresses.emplace_back(b.tensor, b.tensor.const_data_ptr());
    e.cg = std::move(cg);
    ++stats.graphs_recorded;
    log_info(c10::str("kiln: recorded the step as a CUDA graph (", e.graph.nodes.size(), " nodes, ", e.lifted.size(),
                      " run-time scalars as device tensors) in ",
                      std::chrono::duration<double>(Clock::now() - t0).count(), " s"));
    return results;
  }

  std::vector<at::Tensor> replay(const std::vector<at::Tensor>& inputs, Entry& e) {
    for (const auto& [t, address] : e.graph_addresses)
      if (t.const_data_ptr() != address) {
        log_info("kiln: a tensor the CUDA graph reads in place has new memory (torch::load, Tensor::set_); recording "
                 "the graph again");
        e.cg.reset();
        e.graph_addresses.clear();
        return warm_up_and_record(inputs, e);
      }
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      size_t k = 0;
      for (const auto& b : e.ins)
        if (b.user >= 0) {
          auto& st = e.cg->static_inputs[k++];
          const auto& in = inputs.at(static_cast<size_t>(b.user));
          if (!in.is_same(st)) st.copy_(in);
        }
    }
    e.cg->replay();
    for (size_t k = 0; k < e.outs.size(); ++k) e.env[static_cast<size_t>(e.outs[k].value)] = e.cg->static_outputs[k];
    ++stats.graph_replays;
    return finish(e, true);
  }

  // A signature seen for the first time: captured and compiled, unless past the limit or its capture
  // already failed for another shape.
  std::vector<at::Tensor> capture_new(const std::vector<at::Tensor>& inputs, std::vector<int64_t> sig) {
    if (static_cast<int>(cache.size()) >= args.runtime.recompile_limit) {
      warn_once(c10::str("kiln: recompile_limit (", args.runtime.recompile_limit,
                         ") reached; steps with a new input signature run eagerly"));
      stats.last_fallback = "recompile_limit";
      return eager(inputs);
    }
    auto e = std::make_unique<Entry>();
    e->shapeless = signature(inputs, /*with_sizes=*/false);
    last = e.get();
    auto& ref = *e;
    cache.emplace(std::move(sig), std::move(e));
    if (auto f = failed_captures.find(ref.shapeless); f != failed_captures.end()) {
      ref.reason = f->second;
      stats.last_fallback = f->second;
      log_debug("kiln: a new input shape, the same cause as an earlier failed capture: " + f->second);
      return eager(inputs);
    }
    return capture_and_compile(inputs, ref);
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
    if (!args.compile_enabled()) return eager(inputs);
    // The first step ever runs eagerly, so that optimizer state exists when the step is captured.
    if (stats.steps == 1) return eager(inputs);
    if (!check_structure()) return eager(inputs);
    auto sig = signature(inputs);
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
    // entries) is put back before the eager step runs.
    const OptimizerSnapshot snapshot(state.optimizers);
    std::string why;
    const auto p0 = Clock::now();
    const bool probed = probe(e, why);
    stats.probe_seconds += std::chrono::duration<double>(Clock::now() - p0).count();
    if (!probed) {
      snapshot.restore();
      undo_placeholders(e);
      return recapture(inputs, std::move(sig), e, "kiln: " + why);
    }
    try {
      return run_compiled(inputs, e);
    } catch (const std::exception& ex) {
      snapshot.restore();
      undo_placeholders(e);
      e.compiled = false;
      e.reason = std::string("kiln: the compiled step failed: ") + ex.what();
      stats.last_fallback = e.reason;
      throw CompileError(e.reason + " (the optimizers' host state was restored; parameters the step writes in place may "
                                    "be partly updated)");
    }
  }
};

CompiledStep::CompiledStep(StepFn fn, StepState state, TrainingArguments args) : impl_(std::make_unique<Impl>()) {
  impl_->fn = std::move(fn);
  impl_->state = std::move(state);
  impl_->args = std::move(args);
  // The environment wins over the file and the code, here as in Trainer (docs/config.md).
  impl_->args.apply_env();
  impl_->args.validate();
  set_log_level(impl_->args.log_level);
  impl_->collect_state();
  for (size_t o = 0; o < impl_->state.optimizers.size(); ++o) {
    if (!impl_->state.optimizers[o]) throw std::invalid_argument(c10::str("kiln: StepState optimizer ", o, " is null"));
    impl_->optimizer_names.push_back(optimizer_name(*impl_->state.optimizers[o], o));
  }
  if (impl_->args.compile_enabled()) {
    // A named backend that cannot run here throws (BackendSelectionError, with its reason).
    impl_->resolved = resolve_backend(impl_->args);
    impl_->backend_reasons = impl_->resolved.choice.reasons;
    for (const auto& n : impl_->resolved.notes) {
      log_info("kiln: " + n);
      impl_->backend_reasons.push_back(n);
    }
  } else {
    impl_->resolved.choice.backend = "eager";
    impl_->backend_reasons = {"torch_compile is off: LibTorch runs the step"};
  }
}
CompiledStep::~CompiledStep() = default;
CompiledStep::CompiledStep(CompiledStep&&) noexcept = default;
CompiledStep& CompiledStep::operator=(CompiledStep&&) noexcept = default;

std::vector<at::Tensor> CompiledStep::operator()(const std::vector<at::Tensor>& inputs) { return impl_->step(inputs); }
bool CompiledStep::last_step_compiled() const { return impl_->last_compiled; }
const StepStats& CompiledStep::stats() const { return impl_->stats; }
const ir::Graph* CompiledStep::captured_graph() const {
  return impl_->last && !impl_->last->raw.nodes.empty() ? &impl_->last->raw : nullptr;
}
const ir::Graph* CompiledStep::compiled_graph() const {
  return impl_->last && impl_->last->exec ? &impl_->last->graph : nullptr;
}
const TrainingArguments& CompiledStep::args() const { return impl_->args; }
const std::string& CompiledStep::backend() const { return impl_->resolved.choice.backend; }
const std::vector<std::string>& CompiledStep::backend_reasons() const { return impl_->backend_reasons; }

CompiledStep compile_step(StepFn fn, StepState state, TrainingArguments args) {
  return CompiledStep(std::move(fn), std::move(state), std::move(args));
}

}  // namespace kiln
