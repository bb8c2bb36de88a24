#include "step_runner.h"

#include <chrono>
#include <cstring>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/StringUtil.h>

#include "kiln/internal/executor.h"
#include "kiln/log.h"
#include "cpu_block_cache.h"
#include "cuda_graph_step.h"

namespace kiln {

namespace {
using Clock = std::chrono::steady_clock;

// A write-back without the copy: the target (a parameter, an optimizer state tensor) takes the new
// value's storage, and its old storage is freed. Only on the CPU, for dense tensors of the same
// layout, when nothing else can see either storage: the target's storage has no other tensor (no
// view, no alias the user kept from .detach()) and the value's storage is the value's alone.
// LibTorch's optimizers and the user keep the same TensorImpl, which now reads the new values: what
// a copy would have given, without moving the bytes (AdamW on gpt writes back 128 MB per step).
// Returns false (copy instead) when any condition fails.
bool adopt_storage(const at::Tensor& target, at::Tensor& v) {
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
}  // namespace

// The plan's nodes: split with the backend when it runs some, else all on the eager executor.
struct StepRunner::Executor {
  std::optional<EagerExecutor> eager;
  std::optional<PartitionedExecutor> partitioned;
  // How far the last run got: the partitioned executor's unit, or SIZE_MAX once it has finished
  // (or for the eager executor, whose failures are ATen's own and would be eager's too).
  mutable size_t reached = SIZE_MAX;
  // What the run writes into, copied before its first write when a compiled group may fail after it.
  mutable PartitionedExecutor::Saved saved;
  // `undoable`: copy what the run writes first where needed (not while a CUDA graph is recorded,
  // whose replays could not be undone: the copy would only cost every replay).
  void run(std::vector<at::Tensor>& env, const std::vector<c10::IValue>& scalars, void* stream, bool undoable) const {
    reached = SIZE_MAX;
    if (partitioned) {
      saved.clear();
      partitioned->run(env, &scalars, stream, &reached, undoable ? &saved : nullptr);
      saved.clear();
      reached = SIZE_MAX;
      return;
    }
    eager->run(env, &scalars);
  }
  // Whether the run that just failed leaves every tensor it was given as it was: it failed before
  // its first write, or after it with a copy of all it writes, which is put back here (`restored`).
  bool failed_untouched(bool* restored) const {
    *restored = false;
    if (!partitioned) return false;
    if (reached < partitioned->first_writing_unit()) return true;
    if (reached == SIZE_MAX || !saved.taken) return false;
    saved.restore();
    *restored = true;
    return true;
  }
};

StepRunner::StepRunner(std::shared_ptr<const StepPlan> plan, std::shared_ptr<const LoadedPlugin> graph_plugin,
                       const RunOptions& options, StepStats& stats, Warn warn_once)
    : plan_(std::move(plan)),
      graph_plugin_(std::move(graph_plugin)),
      options_(options),
      stats_(stats),
      warn_once_(std::move(warn_once)),
      exec_(std::make_unique<Executor>()) {
  if (plan_->backend_runs_nodes())
    exec_->partitioned.emplace(plan_->run_graph, plan_->partition, options_.verify_groups);
  else exec_->eager.emplace(plan_->run_graph, std::vector<int32_t>{}, std::vector<ir::ValueId>{}, options_.check_meta);
  env_.assign(plan_->run_graph.values.size(), at::Tensor());
  for (const auto& [dtype, n] : plan_->scalar_buffers)
    scalar_buffers_.push_back(at::zeros({n}, at::TensorOptions(dtype).device(plan_->device)));
  graphs_ = plan_->cuda_graph;
  if (!plan_->graph_skip.empty()) skip_graph(plan_->graph_skip);
  if (graphs_ && !graph_plugin_) skip_graph("no plugin records CUDA graphs");
}

StepRunner::~StepRunner() = default;

void StepRunner::skip_graph(const std::string& why) {
  graphs_ = false;
  stats_.last_graph_skip = "kiln: skipping cudagraphs due to " + why;
  warn_once_(stats_.last_graph_skip + "; the step runs without a CUDA graph");
}

// Writes the current run-time scalars into the lifted scalars' device buffers: one host-to-device
// copy per dtype, on the current stream, before the step's kernels (or the graph launch).
void StepRunner::fill_scalars(const std::vector<c10::IValue>& scalars) {
  if (plan_->lifted.empty()) return;
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  // Pinned memory from LibTorch's caching host allocator: the non-blocking copy records an event on
  // the block, which is not handed out again before the copy has read it.
  for (size_t b = 0; b < scalar_buffers_.size(); ++b)
    scalar_buffers_[b].copy_(scalar_values(b, scalars), /*non_blocking=*/true);
}

at::Tensor StepRunner::scalar_values(size_t b, const std::vector<c10::IValue>& scalars) const {
  const auto& lifted = plan_->lifted;
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  const auto& buf = scalar_buffers_[b];
  at::Tensor host = at::empty({buf.numel()}, buf.options().device(at::kCPU).pinned_memory(buf.is_cuda()));
  AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, host.scalar_type(), "kiln_fill_scalars", [&] {
    scalar_t* p = host.data_ptr<scalar_t>();
    for (size_t k = 0; k < lifted.size(); ++k) {
      if (plan_->lifted_at[k].first != b) continue;
      const c10::IValue& v = scalars.at(static_cast<size_t>(lifted[k].scalar));
      const double d = v.isDouble() ? v.toDouble()
                       : v.isInt()  ? static_cast<double>(v.toInt())
                       : v.isBool() ? v.toBool()
                                    : 0.0;
      if (!lifted[k].reciprocal) {
        p[plan_->lifted_at[k].second] = static_cast<scalar_t>(d);
      } else {
        // As ATen's CUDA division by a host scalar: 1/s in double, then rounded to the operand's
        // math type (1/s in float differs in the last bit for about half the values: AdamW's
        // 1/sqrt(1 - 0.999^3) does, and the lifted step drifted from eager).
        using opmath_t = at::opmath_type<scalar_t>;
        p[plan_->lifted_at[k].second] = static_cast<scalar_t>(static_cast<opmath_t>(1.0 / d));
      }
    }
  });
  return host;
}

void StepRunner::bind(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>* statics) {
  size_t k = 0;
  for (const auto& b : plan_->inputs) {
    at::Tensor t;
    if (b.user >= 0) t = statics ? (*statics)[k++] : inputs.at(static_cast<size_t>(b.user));
    else if (b.lifted >= 0) {
      const auto& [buf, idx] = plan_->lifted_at[static_cast<size_t>(b.lifted)];
      t = scalar_buffers_[buf].select(0, idx);
    } else t = b.grad_of.defined() ? b.grad_of.grad() : b.tensor;
    env_[static_cast<size_t>(b.value)] = std::move(t);
  }
}

// The step's device work: the executor and the write-back copies (recorded into the graph).
void StepRunner::run_body(const std::vector<c10::IValue>& scalars, void* stream, bool undoable) {
  exec_->run(env_, scalars, stream, undoable);
  if (exec_->partitioned) {
    const auto failed = static_cast<int>(exec_->partitioned->groups_failed_in_run());
    if (failed > counted_failed_groups_) {
      stats_.failed_groups += failed - counted_failed_groups_;
      counted_failed_groups_ = failed;
      stats_.last_fallback = "kiln: " + exec_->partitioned->last_group_failure();
    }
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  for (const auto& o : plan_->outputs) {
    if (o.role != ir::OutputRole::WriteBack) continue;
    auto& v = env_[static_cast<size_t>(o.value)];
    const at::Tensor& target = o.grad_of.defined() ? o.grad_of.grad() : o.target;
    if (v.is_same(target)) continue;
    if (o.adopt && adopt_storage(target, v)) {
      ++stats_.adopted_writebacks;
      continue;
    }
    target.copy_(v);
    ++stats_.copied_writebacks;
  }
}

// The host side of a finished step: versions, .grad, results. clone_results: results live in a
// graph's static buffers, which the next replay overwrites.
std::vector<at::Tensor> StepRunner::finish(bool clone_results) {
  std::vector<at::Tensor> results(plan_->num_results);
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    for (size_t k = 0; k < plan_->outputs.size(); ++k) {
      const auto& o = plan_->outputs[k];
      auto& v = env_[static_cast<size_t>(o.value)];
      switch (o.role) {
        case ir::OutputRole::WriteBack:
          (o.grad_of.defined() ? o.grad_of.grad() : o.target).unsafeGetTensorImpl()->bump_version();
          break;
        case ir::OutputRole::Gradient: const_cast<at::Tensor&>(o.target).mutable_grad() = v; break;
        case ir::OutputRole::Result:
          // A replay's result already copied out by the graph itself is this step's own tensor.
          if (clone_results && k < fresh_results_.size() && fresh_results_[k].defined())
            results[static_cast<size_t>(o.index)] = std::move(fresh_results_[k]);
          else results[static_cast<size_t>(o.index)] = clone_results ? v.clone() : v;
          break;
      }
    }
  }
  fresh_results_.clear();
  for (auto& t : env_) t.reset();
  ++stats_.compiled_steps;
  return results;
}

std::vector<at::Tensor> StepRunner::run(const std::vector<at::Tensor>& inputs,
                                        const std::vector<c10::IValue>& scalars) {
  if (graphs_) {
    if (cg_ && cg_->recorded()) return replay(inputs, scalars);  // fills the scalars itself
    fill_scalars(scalars);
    return warm_up_and_record(inputs, scalars);
  }
  fill_scalars(scalars);
  bind(inputs);
  // A gradient the step makes anew (its zero_grad set the old one to None, and the graph does not
  // read it) is released now, as the eager step's zero_grad releases it, rather than when the new
  // one replaces it at the end: otherwise the old and the new gradients are alive together. Not
  // for a recorded graph, whose gradients are its own buffers.
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    for (const auto& o : plan_->outputs)
      if (o.role == ir::OutputRole::Gradient && o.target.grad().defined())
        const_cast<at::Tensor&>(o.target).mutable_grad() = at::Tensor();
  }
  {
    // CPU memory of the step from kiln's block cache (cpu_block_cache.h).
    std::optional<ScopedCpuBlockCache> cache;
    if (!plan_->device.is_cuda() && options_.cpu_block_cache)
      cache.emplace(static_cast<size_t>(options_.cpu_block_cache_max_mb) << 20);
    // On CUDA, LibTorch's current stream: a plugin's kernels run where the ATen ops around them do.
    try {
      run_body(scalars, cudagraph::current_stream(plan_->device), /*undoable=*/true);
    } catch (const std::exception& ex) {
      bool restored = false;
      const bool untouched = exec_->failed_untouched(&restored);
      for (auto& t : env_) t.reset();
      if (untouched) throw StepFailedUntouched(ex.what(), restored);
      throw;
    }
  }
  return finish(false);
}

// The first step of a plan with CUDA graphs: runs for real on the capture stream (the warm-up),
// then records the graph that later steps replay.
std::vector<at::Tensor> StepRunner::warm_up_and_record(const std::vector<at::Tensor>& inputs,
                                                       const std::vector<c10::IValue>& scalars) {
  std::unique_ptr<cudagraph::Step> cg;
  try {
    std::shared_ptr<cudagraph::GraphPool> pool;
    if (options_.graph_pool) {
      if (!options_.graph_pool->pool) options_.graph_pool->pool = std::make_shared<cudagraph::GraphPool>(plan_->device);
      pool = options_.graph_pool->pool;
    }
    cg = std::make_unique<cudagraph::Step>(graph_plugin_, plan_->device, plan_->draws_random, std::move(pool));
  } catch (const std::exception& ex) {
    skip_graph(ex.what());
    bind(inputs);
    run_body(scalars, cudagraph::current_stream(plan_->device));
    return finish(false);
  }
  bind(inputs);
  // The warm-up is the signature's first compiled step, run for real: a plugin that fails in it
  // leaves the step undone as outside graphs (run_body's undo copy, then StepFailedUntouched), and
  // the step runs eagerly.
  try {
    cg->warm_up([&](void* stream) { run_body(scalars, stream, /*undoable=*/true); }, env_);
  } catch (const std::exception& ex) {
    bool restored = false;
    const bool untouched = exec_->failed_untouched(&restored);
    for (auto& t : env_) t.reset();
    if (untouched) throw StepFailedUntouched(ex.what(), restored);
    throw;
  }
  auto results = finish(false);
  // From here on the step's work is done and `results` are its results: whatever fails while the
  // graph is prepared or recorded skips the graph and keeps them. A failed recording is a
  // CaptureFailed (CUDA running out of memory inside it too: cuda_graph_step.cpp); the static
  // inputs and the copies' sources are allocated before the recording, outside it, where running
  // out of memory is LibTorch's OutOfMemoryError. Thrown on, that would reach CompiledStep as a
  // failed step after the step had updated the parameters: an error for the caller, and the
  // optimizers' host state (AdamW's step counts) put back behind parameters that moved.
  const auto t0 = Clock::now();
  try {
    // Static inputs: the user inputs' buffers the graph reads; replays copy new inputs into them.
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      for (const auto& b : plan_->inputs)
        if (b.user >= 0) {
          const auto& in = inputs.at(static_cast<size_t>(b.user));
          cg->static_inputs.push_back(at::empty_strided(in.sizes(), in.strides(), in.options()).copy_(in));
        }
    }
    // The copies of the batch in (and of changed run-time scalars) before the launch, and of the
    // results out after it, are work of their own on the stream, and the device idles between them
    // and the graph (about 15 us a step on an H200). Recorded inside the graph instead, with the
    // addresses each replay re-points (ABI 2.3), the stream sees nothing but graph launches.
    bool with_copies = options_.graph_copies && cg->takes_copies();
    for (;;) {
      gc_ = GraphCopies{};
      bind(inputs, &cg->static_inputs);
      if (with_copies) {
        // What the recording copies from, allocated before it (a clone inside it would be a kernel
        // of the graph): the values do not matter, each replay re-points the copies.
        gc_.scalar.assign(scalar_buffers_.size(), -1);
        gc_.scalar_host.resize(scalar_buffers_.size());
        for (size_t b = 0; b < scalar_buffers_.size(); ++b)
          if (scalar_buffers_[b].is_cuda() && scalar_buffers_[b].nbytes() > 0)
            gc_.scalar_host[b] = scalar_values(b, scalars);
        gc_.input.assign(cg->static_inputs.size(), -1);
        gc_.input_source.resize(cg->static_inputs.size());
        for (size_t k = 0; k < cg->static_inputs.size(); ++k) {
          const auto& st = cg->static_inputs[k];
          if (st.is_cuda() && st.is_contiguous() && st.nbytes() > 0) gc_.input_source[k] = at::empty_like(st);
        }
      }
      try {
        cg->record([&](void* stream) {
          if (with_copies) {
            for (size_t b = 0; b < scalar_buffers_.size(); ++b)
              if (gc_.scalar_host[b].defined())
                gc_.scalar[b] =
                    static_cast<int>(cg->record_copy(scalar_buffers_[b].data_ptr(), gc_.scalar_host[b].const_data_ptr(),
                                                     scalar_buffers_[b].nbytes(), true, stream));
            for (size_t k = 0; k < cg->static_inputs.size(); ++k)
              if (gc_.input_source[k].defined())
                gc_.input[k] = static_cast<int>(cg->record_copy(cg->static_inputs[k].data_ptr(),
                                                                gc_.input_source[k].const_data_ptr(),
                                                                cg->static_inputs[k].nbytes(), false, stream));
          }
          run_body(scalars, stream);
          if (with_copies) {
            gc_.result.assign(plan_->outputs.size(), -1);
            gc_.result_target.resize(plan_->outputs.size());
            for (size_t k = 0; k < plan_->outputs.size(); ++k) {
              if (plan_->outputs[k].role != ir::OutputRole::Result) continue;
              const auto& v = env_[static_cast<size_t>(plan_->outputs[k].value)];
              if (!v.defined() || !v.is_cuda() || !v.is_contiguous() || v.nbytes() == 0) continue;
              gc_.result_target[k] = at::empty_like(v);
              gc_.result[k] = static_cast<int>(
                  cg->record_copy(gc_.result_target[k].data_ptr(), v.const_data_ptr(), v.nbytes(), false, stream));
            }
          }
        });
        for (const auto& o : plan_->outputs) cg->static_outputs.push_back(env_[static_cast<size_t>(o.value)]);
        break;
      } catch (const cudagraph::CopiesRefused& f) {
        if (!with_copies) throw;
        for (auto& t : env_) t.reset();
        gc_ = GraphCopies{};
        log_info(std::string("kiln: recording the CUDA graph with the batch and result copies inside it failed (") +
                 f.what() + "); recording it with the copies around it");
        with_copies = false;
      }
    }
  } catch (const std::exception& ex) {
    for (auto& t : env_) t.reset();
    gc_ = GraphCopies{};
    cg.reset();
    if (dynamic_cast<const cudagraph::CaptureFailed*>(&ex)) {
      skip_graph(ex.what());
    } else {
      std::string what = ex.what();
      if (auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);  // ATen's backtrace
      skip_graph("the recording could not be prepared (" + what + ")");
    }
    return results;
  }
  stats_.graph_copies = static_cast<int>(cg->num_copies());
  for (auto& t : env_) t.reset();
  graph_addresses_.clear();
  for (const auto& b : plan_->inputs)
    if (b.user < 0 && b.lifted < 0 && b.tensor.defined()) {
      const at::Tensor& t = b.grad_of.defined() ? b.grad_of.grad() : b.tensor;
      graph_addresses_.push_back({b.grad_of.defined() ? b.grad_of : t, t.const_data_ptr(), b.grad_of.defined()});
    }
  cg_ = std::move(cg);
  ++stats_.graphs_recorded;
  log_info(c10::str("kiln: recorded the step as a CUDA graph (", plan_->graph.nodes.size(), " nodes, ",
                    plan_->lifted.size(), " run-time scalars as device tensors) in ",
                    std::chrono::duration<double>(Clock::now() - t0).count(), " s"));
  return results;
}

std::vector<at::Tensor> StepRunner::replay(const std::vector<at::Tensor>& inputs,
                                           const std::vector<c10::IValue>& scalars) {
  for (const auto& [t, address, is_grad] : graph_addresses_)
    if ((is_grad ? t.grad().const_data_ptr() : t.const_data_ptr()) != address) {
      log_info(
          "kiln: a tensor the CUDA graph reads in place has new memory (torch::load, Tensor::set_); recording "
          "the graph again");
      cg_.reset();
      gc_ = GraphCopies{};
      graph_addresses_.clear();
      fill_scalars(scalars);
      return warm_up_and_record(inputs, scalars);
    }
  cg_->replay(graph_copies(inputs, scalars));
  for (size_t k = 0; k < plan_->outputs.size(); ++k)
    env_[static_cast<size_t>(plan_->outputs[k].value)] = cg_->static_outputs[k];
  ++stats_.graph_replays;
  return finish(true);
}

std::vector<KilnGraphCopy> StepRunner::graph_copies(const std::vector<at::Tensor>& inputs,
                                                    const std::vector<c10::IValue>& scalars) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  const size_t n = cg_->num_copies();
  std::vector<KilnGraphCopy> copies(n);
  const auto copy_index = [&](const std::vector<int>& v, size_t k) { return k < v.size() ? v[k] : -1; };
  // Run-time scalars: the graph copies from pinned memory that stays as it is while any launch may
  // read it; new values get a new block, and the old one goes back to the allocator once the
  // launches enqueued so far have run.
  for (size_t b = 0; b < scalar_buffers_.size(); ++b) {
    const int c = copy_index(gc_.scalar, b);
    if (c < 0) {  // copied before the launch, as fill_scalars does
      scalar_buffers_[b].copy_(scalar_values(b, scalars), /*non_blocking=*/true);
      continue;
    }
    at::Tensor host = scalar_values(b, scalars);
    auto& held = gc_.scalar_host[b];
    if (std::memcmp(host.const_data_ptr(), held.const_data_ptr(), held.nbytes()) != 0) {
      cudagraph::release_pinned_after_current_work(held, plan_->device);
      held = std::move(host);
    }
    copies[static_cast<size_t>(c)] = {scalar_buffers_[b].data_ptr(), held.const_data_ptr(), held.nbytes()};
  }
  // The batch: read where it is when it is a dense CUDA tensor of the recorded layout, else copied
  // first into the recorded source (ATen's copy: strides, dtype, another device).
  size_t k = 0;
  for (const auto& b : plan_->inputs) {
    if (b.user < 0) continue;
    auto& st = cg_->static_inputs[k];
    const auto& in = inputs.at(static_cast<size_t>(b.user));
    const int c = copy_index(gc_.input, k++);
    if (c < 0) {
      if (!in.is_same(st)) st.copy_(in);
      continue;
    }
    at::Tensor& source = gc_.input_source[k - 1];
    const bool in_place = in.is_cuda() && in.device() == st.device() && in.scalar_type() == st.scalar_type() &&
                          in.is_contiguous() && in.nbytes() == st.nbytes() &&
                          in.const_data_ptr() != st.const_data_ptr();
    if (!in_place) source.copy_(in);
    copies[static_cast<size_t>(c)] = {st.data_ptr(), in_place ? in.const_data_ptr() : source.const_data_ptr(),
                                      st.nbytes()};
  }
  // Results: each replay's own tensor, written by the graph's last copies.
  fresh_results_.assign(plan_->outputs.size(), at::Tensor());
  for (size_t o = 0; o < plan_->outputs.size(); ++o) {
    const int c = copy_index(gc_.result, o);
    if (c < 0) continue;
    const auto& v = cg_->static_outputs[o];
    fresh_results_[o] = at::empty_like(v);
    copies[static_cast<size_t>(c)] = {fresh_results_[o].data_ptr(), v.const_data_ptr(), v.nbytes()};
  }
  return copies;
}

}  // namespace kiln
