// `kiln bench gpt --dynamic MIN:MAX` (bench_dynamic.h): the modes, their steps and the report.
#include "bench_dynamic.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include "bench_kernels.h"  // rounded, significant, Json
#include "kiln/compile.h"
#include "kiln/config.h"
#include "kiln/internal/backend.h"
#include "kiln/workloads.h"

namespace kiln::cli {

std::string parse_dynamic_range(const std::string& text, int64_t* min, int64_t* max) {
  const std::string usage = "use MIN:MAX, two sequence lengths with 1 <= MIN <= MAX (e.g. 16:48)";
  const auto colon = text.find(':');
  auto number = [](const std::string& t, int64_t* v) {
    if (t.empty() || t.size() > 9 || t.find_first_not_of("0123456789") != std::string::npos) return false;
    return std::from_chars(t.data(), t.data() + t.size(), *v).ec == std::errc();
  };
  if (colon == std::string::npos || !number(text.substr(0, colon), min) || !number(text.substr(colon + 1), max))
    return "--dynamic '" + text + "': " + usage;
  if (*min < 1) return "--dynamic '" + text + "': MIN must be at least 1; " + usage;
  if (*min > *max)
    return "--dynamic '" + text + "': MIN (" + std::to_string(*min) + ") is above MAX (" + std::to_string(*max) +
           "); " + usage;
  return "";
}

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kWorkloadSeed = 1234;  // kiln bench's weights and batch (cmd_bench.cpp)

// One mode of the run: what it is, and what its steps measured.
struct Mode {
  std::string name;     // as the table prints it
  std::string key;      // its JSON key: eager, kiln, kiln_dynamic_false, kiln_static, eager_noisy
  std::string dynamic;  // kiln's [runtime] dynamic for it; "" for LibTorch eager
  bool kiln = false;
  bool noisy = false;  // --check: LibTorch eager from weights one unit in the last place away
  std::vector<int64_t> lengths;
  std::unique_ptr<Workload> w;
  std::unique_ptr<CompiledStep> compiled;  // kiln: its step, kept for the same-length comparison
  int64_t batch = 0;
  std::vector<double> ms;
  std::vector<char> warmup;  // per step: a warm-up step (bench_dynamic.h)
  std::vector<float> losses;
  double compile_s = 0;  // StepStats' compile and specialisation seconds, summed over the steps
  StepStats stats;
  std::string runs_on = "eager";
  std::string chosen, why;                 // kiln: the backend its CompiledStep chose, and why
  size_t groups = 0, groups_compiled = 0;  // the last plan's claimed groups, and of them compiled
  // Sums.
  double warmup_s = 0, steady_s = 0;
  int warmup_steps = 0, steady_steps = 0;
  int64_t tokens = 0, steady_tokens = 0;
  double tokens_per_s() const { return warmup_s + steady_s > 0 ? tokens / (warmup_s + steady_s) : 0; }
  double steady_tokens_per_s() const { return steady_s > 0 ? steady_tokens / steady_s : 0; }
};

std::string mode_cache_dir(const std::string& cache_dir, const std::string& key) {
  return cache_dir + "/bench-dynamic-" + key;
}

void run_mode(Mode& m, const DynamicBenchOptions& o, const TrainingArguments& base, bool cuda) {
  m.w = std::make_unique<Workload>(make_workload(o.workload, {o.device, kWorkloadSeed, o.batch, o.optimizer, o.dtype}));
  if (m.noisy) {
    at::NoGradGuard no_grad;
    for (auto& p : m.w->model->parameters())
      if (at::isFloatingType(p.scalar_type())) p.mul_(1 + std::ldexp(1.0, -23) * (2 * at::rand_like(p) - 1));
  }
  m.batch = m.w->input.size(0);
  // Every length's batch made before the first step: slicing is the data loader's work, not the step's.
  std::map<int64_t, std::vector<at::Tensor>> batches;
  for (const int64_t t : m.lengths)
    if (!batches.count(t)) batches.emplace(t, workload_batch(*m.w, t));
  WorkloadStep eager = workload_step(*m.w);
  std::unique_ptr<CompiledStep>& compiled = m.compiled;
  if (m.kiln) {
    TrainingArguments args = base;
    args.runtime.dynamic = m.dynamic;
    // A compile cache of its own per mode, so that no mode loads kernels another one compiled: every
    // mode is cold on a first run and warm on the next alike.
    if (!args.runtime.cache_dir.empty()) args.runtime.cache_dir = mode_cache_dir(base.runtime.cache_dir, m.key);
    compiled = std::make_unique<CompiledStep>(compile_step(eager, {{m.w->model}, {m.w->optimizer.get()}}, args));
  }
  for (size_t s = 0; s < m.lengths.size(); ++s) {
    const auto& batch = batches.at(m.lengths[s]);
    StepStats before;
    if (compiled) {
      const StepStats& st = compiled->stats();
      before.compiles = st.compiles, before.shape_specialisations = st.shape_specialisations;
      before.rebuilds = st.rebuilds, before.recaptures = st.recaptures, before.graphs_recorded = st.graphs_recorded;
    }
    const auto t0 = Clock::now();
    at::Tensor loss = (compiled ? (*compiled)(batch) : eager(batch))[0];
    if (cuda) torch::cuda::synchronize();
    m.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    m.losses.push_back(loss.item<float>());
    bool warm = s == 0;
    if (compiled) {
      const StepStats& st = compiled->stats();
      if (st.compiles != before.compiles) warm = true, m.compile_s += st.last_compile_seconds;
      if (st.shape_specialisations != before.shape_specialisations)
        warm = true, m.compile_s += st.last_specialise_seconds;
      if (st.rebuilds != before.rebuilds || st.recaptures != before.recaptures ||
          st.graphs_recorded != before.graphs_recorded)
        warm = true;
    }
    m.warmup.push_back(warm);
    const int64_t tokens = m.batch * m.lengths[s];
    m.tokens += tokens;
    if (warm) {
      m.warmup_s += m.ms.back() / 1000, ++m.warmup_steps;
    } else {
      m.steady_s += m.ms.back() / 1000, ++m.steady_steps, m.steady_tokens += tokens;
    }
  }
  if (compiled) {
    m.stats = compiled->stats();
    for (const auto& g : m.stats.groups) {
      ++m.groups;
      if (g.compiled) ++m.groups_compiled;
    }
    m.chosen = compiled->backend();
    for (const auto& r : compiled->backend_reasons()) m.why += (m.why.empty() ? "" : "; ") + r;
    const bool ran =
        m.chosen != "eager" && m.stats.compiled_steps > 0 && (m.groups_compiled > 0 || m.stats.graphs_recorded > 0);
    m.runs_on = ran ? m.chosen : "eager";
  } else {
    m.stats.steps = m.stats.eager_steps = static_cast<int>(m.lengths.size());
  }
}

// ---- Same length: the dynamic step against a static plan at each of a few lengths ----
//
// The main table's static mode runs every step at the mean length, while the dynamic step's steady
// figure mixes short and long steps; where a step is bound by the host at short lengths and by the
// device at long ones, the mix alone is slower than the mean (the time of a step is not linear in
// its length). This compares like with like: at each length, steps of the dynamic mode's own
// compiled step (its family's plan for that length) against a static plan made for that length
// alone (dynamic = "false"), one of each per round, every step timed alone.

struct SameLength {
  int64_t length = 0;
  int rounds = 0;
  double dynamic_s = 0, static_s = 0;
  int64_t tokens = 0;                                    // per side
  bool dynamic_compiled = true, static_compiled = true;  // every timed step ran a compiled plan
};

bool plan_changed(const StepStats& a, const StepStats& b) {
  return a.compiles != b.compiles || a.shape_specialisations != b.shape_specialisations || a.rebuilds != b.rebuilds ||
         a.recaptures != b.recaptures || a.graphs_recorded != b.graphs_recorded;
}

// Runs `step` untimed until a step ran compiled without planning or recording anything (at most 6).
void settle(CompiledStep& step, const std::vector<at::Tensor>& batch, bool cuda) {
  for (int i = 0; i < 6; ++i) {
    const StepStats before = step.stats();
    step(batch);
    if (cuda) torch::cuda::synchronize();
    if (!plan_changed(before, step.stats()) && step.stats().compiled_steps > before.compiled_steps) return;
  }
}

std::vector<SameLength> same_length(Mode& dyn, const std::vector<int64_t>& lengths, int rounds,
                                    const DynamicBenchOptions& o, const TrainingArguments& base, bool cuda) {
  std::vector<SameLength> out;
  if (!dyn.compiled || rounds <= 0) return out;
  auto w =
      std::make_unique<Workload>(make_workload(o.workload, {o.device, kWorkloadSeed, o.batch, o.optimizer, o.dtype}));
  TrainingArguments args = base;
  args.runtime.dynamic = "false";
  args.runtime.recompile_limit = std::max<int>(args.runtime.recompile_limit, static_cast<int>(lengths.size()) + 4);
  if (!args.runtime.cache_dir.empty())
    args.runtime.cache_dir = mode_cache_dir(base.runtime.cache_dir, "kiln_same_length");
  CompiledStep fixed = compile_step(workload_step(*w), {{w->model}, {w->optimizer.get()}}, args);
  auto timed = [&](CompiledStep& step, const std::vector<at::Tensor>& batch, double* seconds, bool* compiled) {
    const StepStats before = step.stats();
    const auto t0 = Clock::now();
    step(batch);
    if (cuda) torch::cuda::synchronize();
    *seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    const StepStats& after = step.stats();
    *compiled = *compiled && after.compiled_steps > before.compiled_steps && !plan_changed(before, after);
  };
  for (const int64_t t : lengths) {
    SameLength r;
    r.length = t;
    const auto dyn_batch = workload_batch(*dyn.w, t), fixed_batch = workload_batch(*w, t);
    settle(*dyn.compiled, dyn_batch, cuda);
    settle(fixed, fixed_batch, cuda);
    for (int i = 0; i < rounds; ++i) {
      timed(*dyn.compiled, dyn_batch, &r.dynamic_s, &r.dynamic_compiled);
      timed(fixed, fixed_batch, &r.static_s, &r.static_compiled);
      ++r.rounds;
      r.tokens += dyn.batch * t;
    }
    out.push_back(r);
  }
  return out;
}

// ---- --check: each dynamic kiln mode against LibTorch eager on the same lengths ----

struct Check {
  bool ok = true;
  std::string failure;
  double tolerance = 0, worst_loss = 0, worst_param = 0, worst_loss_floor = 0, worst_param_floor = 0;
  std::string worst_param_name;
  int first_loss_diff = -1;
};

double rel_err(const at::Tensor& out, const at::Tensor& ref) {
  auto o = out.detach().to(at::kDouble).cpu(), r = ref.detach().to(at::kDouble).cpu();
  const double num = (o - r).norm().item<double>();
  const double den = r.norm().item<double>();
  if (std::isnan(num)) return INFINITY;
  return den == 0 ? num : num / den;
}

// As kiln bench's --check judges (cmd_bench.cpp): the tolerance for the precision and the code that
// ran, or ten times LibTorch eager's own distance from weights one ulp away where that is larger.
// Steps that ran eagerly are what a dynamic run measures, so they do not fail it; a backend that
// ran nothing of the step does.
Check check_mode(const Mode& k, const Mode& e, const Mode* noisy, const DynamicBenchOptions& o,
                 const std::string& requested) {
  Check c;
  bool generated = false;
  for (const auto& part : split_backends(k.runs_on)) generated = generated || part == "inductor" || part == "neuron";
  c.tolerance = o.tolerance >= 0 ? o.tolerance : k.w->autocast_bf16 ? 1e-2 : generated ? 1e-4 : 1e-5;
  const bool floor_applies = o.tolerance < 0 && noisy;
  double worst_excess = 0;
  auto judge = [&](double err, double floor, double* worst, double* worst_floor, std::string* name,
                   const std::string& what) {
    const double allowed = floor_applies ? std::max(c.tolerance, 10 * floor) : c.tolerance;
    if (err > *worst) *worst = err, *worst_floor = floor, *name = what;
    worst_excess = std::max(worst_excess, std::isnan(err) ? INFINITY : err / allowed);
  };
  std::string unused;
  for (size_t s = 0; s < e.losses.size(); ++s) {
    const double ev = e.losses[s], kv = k.losses[s];
    auto rel = [ev](double v) { return std::isnan(v) ? INFINITY : std::fabs(v - ev) / std::max(std::fabs(ev), 1e-12); };
    judge(rel(kv), noisy ? rel(noisy->losses[s]) : 0.0, &c.worst_loss, &c.worst_loss_floor, &unused, "");
    if (c.first_loss_diff < 0 && ev != kv) c.first_loss_diff = static_cast<int>(s) + 1;
  }
  auto pe = e.w->model->named_parameters(), pk = k.w->model->named_parameters();
  std::vector<at::Tensor> pn;
  if (noisy)
    for (const auto& p : noisy->w->model->named_parameters()) pn.push_back(p.value());
  for (size_t i = 0; i < pe.size(); ++i) {
    judge(rel_err(pk[i].value(), pe[i].value()), pn.empty() ? 0.0 : rel_err(pn[i], pe[i].value()), &c.worst_param,
          &c.worst_param_floor, &c.worst_param_name, pe[i].key());
    if (!o.check_grads) continue;
    const at::Tensor ge = pe[i].value().grad(), gk = pk[i].value().grad();
    if (ge.defined() != gk.defined()) {
      c.worst_param = INFINITY, c.worst_param_name = pe[i].key() + ".grad (defined on one side only)";
      worst_excess = INFINITY;
    } else if (ge.defined()) {
      const at::Tensor gn = pn.empty() ? at::Tensor() : pn[i].grad();
      judge(rel_err(gk, ge), gn.defined() ? rel_err(gn, ge) : 0.0, &c.worst_param, &c.worst_param_floor,
            &c.worst_param_name, pe[i].key() + ".grad");
    }
  }
  if (worst_excess > 1) c.failure = floor_applies ? "beyond tolerance and noise floor" : "beyond tolerance";
  else if (k.runs_on == "eager" && requested != "eager")
    c.failure = "backend '" + requested + "' ran nothing of the step (runs on: eager)";
  c.ok = c.failure.empty();
  return c;
}

// ---- Report ----

std::string ratio_text(double num, double den) {
  char buf[32];
  if (den <= 0 || num <= 0) return "-";
  std::snprintf(buf, sizeof buf, "%.2fx", num / den);
  return buf;
}

Json mode_json(const Mode& m, const Mode& eager, const Check* c) {
  const StepStats& st = m.stats;
  Json j = {{"name", m.name},
            {"key", m.key},
            {"dynamic", m.dynamic},
            {"runs_on", m.runs_on},
            {"steps", static_cast<int>(m.lengths.size())},
            {"compiled_steps", st.compiled_steps},
            {"eager_steps", st.eager_steps},
            {"compiles", st.compiles},
            {"shape_specialisations", st.shape_specialisations},
            {"rebuilds", st.rebuilds},
            {"recaptures", st.recaptures},
            {"shape_evictions", st.shape_evictions},
            {"graphs_recorded", st.graphs_recorded},
            {"dynamic_dims", st.dynamic_dims},
            {"last_recompile_reason", st.last_recompile_reason},
            {"last_fallback", st.last_fallback},
            {"claimed_groups", m.groups},
            {"backend_groups", m.groups_compiled},
            {"compile_s", rounded(m.compile_s, 4)},
            {"warmup_s", rounded(m.warmup_s, 4)},
            {"warmup_steps", m.warmup_steps},
            {"steady_s", rounded(m.steady_s, 4)},
            {"steady_steps", m.steady_steps},
            {"tokens", m.tokens},
            {"steady_tokens", m.steady_tokens},
            {"tokens_per_s", rounded(m.tokens_per_s(), 1)},
            {"steady_tokens_per_s", rounded(m.steady_tokens_per_s(), 1)},
            {"ratio", rounded(eager.tokens_per_s() > 0 ? m.tokens_per_s() / eager.tokens_per_s() : 0, 4)},
            {"steady_ratio",
             rounded(eager.steady_tokens_per_s() > 0 ? m.steady_tokens_per_s() / eager.steady_tokens_per_s() : 0, 4)},
            {"final_loss", m.losses.empty() ? 0.0 : static_cast<double>(m.losses.back())}};
  if (c)
    j["check"] = {{"ok", c->ok},
                  {"failure", c->failure},
                  {"tolerance", significant(c->tolerance, 6)},
                  {"max_loss_rel_err", significant(c->worst_loss, 4)},
                  {"max_param_rel_err", significant(c->worst_param, 4)},
                  {"worst_param", c->worst_param_name},
                  {"first_loss_diff_step", c->first_loss_diff},
                  {"loss_noise_floor", significant(c->worst_loss_floor, 4)},
                  {"param_noise_floor", significant(c->worst_param_floor, 4)}};
  return j;
}

}  // namespace

int bench_dynamic(const DynamicBenchOptions& o) {
  const bool cuda = o.device == "cuda";
  if (cuda && o.check) {
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);  // before the first cuBLAS handle
    auto& ctx = at::globalContext();
    ctx.setDeterministicCuDNN(true);
    ctx.setDeterministicAlgorithms(true, /*warn_only=*/true);
  }
  const std::string attention = !o.attention.empty() ? o.attention : o.check ? "math" : "all";
  if (cuda && attention != "all") {
    auto& ctx = at::globalContext();
    ctx.setSDPUseMath(attention == "math");
    ctx.setSDPUseFlash(attention == "flash");
    ctx.setSDPUseMemEfficient(attention == "efficient");
    ctx.setSDPUseCuDNN(attention == "cudnn");
  }
  TrainingArguments args;
  args.torch_compile = true;
  args.log_level = "warn";  // the report is the output; KILN_LOG_LEVEL still overrides
  if (!o.backend.empty()) args.torch_compile_backend = o.backend;
  args.torch_compile_mode = o.mode;
  args.runtime.plugin_dirs = o.plugin_dirs;
  args.apply_env();
  args.validate();
  // The configuration's dynamic setting (KILN_DYNAMIC included) is the first kiln mode's; the
  // others set theirs in code, which compile_step's own reading of the environment must not undo.
  // Likewise each kiln mode's compile cache folder, made from the configured one (KILN_CACHE_DIR).
  const std::string config_dynamic = args.runtime.dynamic;
  unsetenv("KILN_DYNAMIC");
  unsetenv("KILN_CACHE_DIR");

  const std::vector<int64_t> lengths = dynamic_lengths(o.min_length, o.max_length, o.steps, o.seed);
  const std::set<int64_t> distinct(lengths.begin(), lengths.end());
  double mean = 0;
  for (const int64_t t : lengths) mean += static_cast<double>(t);
  mean /= static_cast<double>(lengths.size());
  const int64_t static_length = std::llround(mean);

  std::vector<Mode> modes;
  auto add = [&](std::string name, std::string key, std::string dynamic, bool kiln, bool at_mean) {
    Mode m;
    m.name = std::move(name), m.key = std::move(key), m.dynamic = std::move(dynamic), m.kiln = kiln;
    m.lengths = at_mean ? std::vector<int64_t>(lengths.size(), static_length) : lengths;
    modes.push_back(std::move(m));
  };
  add("LibTorch eager", "eager", "", false, false);
  add("kiln dynamic=" + config_dynamic, "kiln", config_dynamic, true, false);
  if (config_dynamic != "false") add("kiln dynamic=false", "kiln_dynamic_false", "false", true, false);
  add("kiln static T=" + std::to_string(static_length), "kiln_static", config_dynamic, true, true);
  for (auto& m : modes) run_mode(m, o, args, cuda);
  Mode noisy;
  if (o.check) {
    noisy.name = "LibTorch eager, weights one ulp away", noisy.key = "eager_noisy", noisy.noisy = true;
    noisy.lengths = lengths;
    run_mode(noisy, o, args, cuda);
  }

  // The backend, as the first kiln mode chose it (every kiln mode chooses alike).
  const std::string chosen = modes[1].chosen, why = modes[1].why;
  const Mode& eager = modes[0];
  std::map<std::string, Check> checks;
  bool all_ok = true;
  if (o.check)
    for (const auto& m : modes)
      if (m.kiln && m.key != "kiln_static") {
        checks[m.key] = check_mode(m, eager, &noisy, o, args.torch_compile_backend);
        all_ok = all_ok && checks[m.key].ok;
      }

  // After the check: these steps train the dynamic mode's model further.
  std::vector<SameLength> same;
  if (config_dynamic != "false") {
    std::vector<int64_t> at = {o.min_length, static_length, o.max_length};
    at.erase(std::unique(at.begin(), at.end()), at.end());
    same = same_length(modes[1], at, o.same_length_rounds, o, args, cuda);
  }
  double same_dyn_s = 0, same_static_s = 0;
  for (const auto& r : same) same_dyn_s += r.dynamic_s, same_static_s += r.static_s;
  const double same_ratio = same_dyn_s > 0 ? same_static_s / same_dyn_s : 0;

  if (o.trace)
    for (size_t s = 0; s < lengths.size(); ++s) {
      std::string line;
      for (const auto& m : modes) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "  %s T %lld: %.3f ms%s loss %.9g", m.key.c_str(),
                      static_cast<long long>(m.lengths[s]), m.ms[s], m.warmup[s] ? " (warm-up)" : "",
                      static_cast<double>(m.losses[s]));
        line += buf;
      }
      std::fprintf(stderr, "kiln bench: step %3zu%s\n", s + 1, line.c_str());
    }

  const int64_t span = o.max_length - o.min_length + 1;
  if (o.json) {
    Json j = {{"workload", o.workload},
              {"device", o.device},
              {"autocast_bf16", eager.w->autocast_bf16},
              {"steps", o.steps},
              {"batch", eager.batch},
              {"backend_requested", args.torch_compile_backend},
              {"backend_selected", chosen},
              {"backend_reasons", why},
              {"mode", o.mode},
              {"config_dynamic", config_dynamic},
              {"cache_dir", args.runtime.cache_dir.empty() ? "" : mode_cache_dir(args.runtime.cache_dir, "<mode>")}};
    j["dynamic"] = {{"min", o.min_length},
                    {"max", o.max_length},
                    {"seed", o.seed},
                    {"distinct_lengths", distinct.size()},
                    {"possible_lengths", span},
                    {"mean_length", rounded(mean, 3)},
                    {"static_length", static_length},
                    {"block_size", eager.w->block_size},
                    {"lengths", lengths}};
    j["modes"] = Json::array();
    for (const auto& m : modes) {
      auto it = checks.find(m.key);
      j["modes"].push_back(mode_json(m, eager, it == checks.end() ? nullptr : &it->second));
    }
    j["same_length"] = Json::array();
    for (const auto& r : same)
      j["same_length"].push_back({{"length", r.length},
                                  {"rounds", r.rounds},
                                  {"dynamic_tokens_per_s", rounded(r.tokens / r.dynamic_s, 1)},
                                  {"static_tokens_per_s", rounded(r.tokens / r.static_s, 1)},
                                  {"ratio", rounded(r.static_s / r.dynamic_s, 4)},
                                  {"dynamic_compiled", r.dynamic_compiled},
                                  {"static_compiled", r.static_compiled}});
    j["same_length_ratio"] = rounded(same_ratio, 4);
    std::printf("%s\n", json_text(j).c_str());
    return all_ok ? 0 : 1;
  }

  std::printf("kiln bench %s on %s%s, %d steps at sequence lengths %lld:%lld, batch %lld; backend: %s, mode %s\n",
              o.workload.c_str(), o.device.c_str(), eager.w->autocast_bf16 ? " (bf16 autocast)" : "", o.steps,
              static_cast<long long>(o.min_length), static_cast<long long>(o.max_length),
              static_cast<long long>(eager.batch), chosen.c_str(), o.mode.c_str());
  if (!why.empty()) std::printf("  why: %s\n", why.c_str());
  std::string head;
  for (size_t i = 0; i < std::min<size_t>(lengths.size(), 12); ++i) head += " " + std::to_string(lengths[i]);
  std::printf(
      "  lengths: seed %llu, %zu distinct of %lld possible, mean %.2f (the static plan runs every step at %lld); "
      "first:%s%s\n",
      static_cast<unsigned long long>(o.seed), distinct.size(), static_cast<long long>(span), mean,
      static_cast<long long>(static_length), head.c_str(), lengths.size() > 12 ? " ..." : "");
  std::printf(
      "  every step timed alone (ending in a device sync); warm-up: a mode's first step and every step that\n"
      "  captured, compiled, re-planned or specialised a plan, steady: the others; compiled: steps that ran a\n"
      "  compiled plan, of all; compiles: captures; specs: plans specialised from a symbolic step for a new\n"
      "  shape; compile s: their seconds; tok/s: batch x length summed over the steps, over their time;\n"
      "  x eager: tok/s over LibTorch eager's; compile caches: %s (one per kiln mode)\n",
      args.runtime.cache_dir.empty() ? "none" : mode_cache_dir(args.runtime.cache_dir, "<mode>").c_str());
  std::printf("  %-22s %-10s %9s %8s %6s %9s %17s %17s %11s %7s %11s %7s\n", "mode", "runs on", "compiled", "compiles",
              "specs", "compile s", "warm-up s (steps)", "steady s (steps)", "steady tok/s", "x eager", "all tok/s",
              "x eager");
  for (const auto& m : modes) {
    const StepStats& st = m.stats;
    char compiled_col[32], compile_s[32], warm[40], steady[40];
    std::snprintf(compiled_col, sizeof compiled_col, "%d/%zu", st.compiled_steps, m.lengths.size());
    std::snprintf(compile_s, sizeof compile_s, m.kiln ? "%.3f" : "-", m.compile_s);
    std::snprintf(warm, sizeof warm, "%.3f (%d)", m.warmup_s, m.warmup_steps);
    std::snprintf(steady, sizeof steady, "%.3f (%d)", m.steady_s, m.steady_steps);
    std::printf("  %-22s %-10s %9s %8s %6s %9s %17s %17s %11.1f %7s %11.1f %7s\n", m.name.c_str(), m.runs_on.c_str(),
                compiled_col, m.kiln ? std::to_string(st.compiles).c_str() : "-",
                m.kiln ? std::to_string(st.shape_specialisations).c_str() : "-", compile_s, warm, steady,
                m.steady_tokens_per_s(), ratio_text(m.steady_tokens_per_s(), eager.steady_tokens_per_s()).c_str(),
                m.tokens_per_s(), ratio_text(m.tokens_per_s(), eager.tokens_per_s()).c_str());
  }
  for (const auto& m : modes) {
    if (!m.kiln) continue;
    const StepStats& st = m.stats;
    std::string notes;
    auto note = [&](const std::string& s) { notes += (notes.empty() ? "" : "; ") + s; };
    // The first step and every capture step run eagerly by design; the others fell back.
    const int fell_back = std::max(0, st.eager_steps - 1 - st.compiles);
    if (fell_back > 0)
      note(std::to_string(fell_back) + " steps ran eagerly besides the first and the " + std::to_string(st.compiles) +
           " capture steps" + (st.last_fallback.empty() ? "" : " (last: " + st.last_fallback + ")"));
    if (!st.dynamic_dims.empty()) {
      std::string dims;
      for (const auto& d : st.dynamic_dims) dims += (dims.empty() ? "" : ", ") + d;
      note("symbolic: " + dims);
    }
    if (!st.last_recompile_reason.empty()) note("last compile: " + st.last_recompile_reason);
    if (st.shape_evictions > 0) note(std::to_string(st.shape_evictions) + " plans evicted");
    if (st.graphs_recorded > 0) note(std::to_string(st.graphs_recorded) + " CUDA graphs recorded");
    if (m.groups > m.groups_compiled)
      note(std::to_string(m.groups - m.groups_compiled) + " of the last plan's " + std::to_string(m.groups) +
           " claimed groups ran on kiln's eager executor");
    if (!notes.empty()) std::printf("  %s: %s\n", m.name.c_str(), notes.c_str());
  }
  for (const auto& m : modes) {
    auto it = checks.find(m.key);
    if (it == checks.end()) continue;
    const Check& c = it->second;
    std::printf("  check %s: %s (max loss rel err %.3e, max parameter%s rel err %.3e%s%s, tolerance %g)%s%s\n",
                m.name.c_str(), c.ok ? "PASS" : "FAIL", c.worst_loss, o.check_grads ? " or gradient" : "",
                c.worst_param, c.worst_param_name.empty() ? "" : " at ", c.worst_param_name.c_str(), c.tolerance,
                c.ok ? "" : ": ", c.failure.c_str());
    std::printf("    noise floor (eager from weights one ulp away; 10x it is allowed%s): loss %.3e, parameter %.3e\n",
                o.tolerance >= 0 ? ", not applied: --tolerance given" : "", c.worst_loss_floor, c.worst_param_floor);
  }
  if (!same.empty()) {
    std::printf(
        "  same length (%d rounds per length, each one step of the dynamic mode's own compiled step and one of a\n"
        "  static plan made for that length alone, dynamic = false; every step timed alone, after warm-up):\n",
        same.front().rounds);
    for (const auto& r : same)
      std::printf("    T=%-4lld dynamic %11.1f tok/s, static %11.1f tok/s: %.3f of static%s\n",
                  static_cast<long long>(r.length), r.tokens / r.dynamic_s, r.tokens / r.static_s,
                  r.static_s / r.dynamic_s,
                  r.dynamic_compiled && r.static_compiled ? "" : " (some timed steps did not run a compiled plan)");
    std::printf("    together: the dynamic step at %.3f of the static plans' tokens per second\n", same_ratio);
  }
  if (o.check) std::printf("  (the static mode trains other lengths than eager: not checked)\n");
  return all_ok ? 0 : 1;
}

}  // namespace kiln::cli
