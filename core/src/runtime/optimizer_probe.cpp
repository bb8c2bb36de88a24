#include "optimizer_probe.h"

#include <set>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "kiln/log.h"
#include "kiln/internal/op_info.h"

#include <typeinfo>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <c10/util/TypeIndex.h>

namespace kiln {
namespace {

bool same_tensor(const c10::IValue& arg, const at::Tensor& want) {
  if (!arg.isTensor()) return false;
  const auto& t = arg.toTensor();
  if (!t.defined()) return false;
  if (t.unsafeGetTensorImpl() == want.unsafeGetTensorImpl()) return true;
  // `.data()` and other shallow copies: a new TensorImpl over the same memory.
  return t.has_storage() && want.has_storage() && t.storage().is_alias_of(want.storage()) &&
         t.sizes() == want.sizes() && t.strides() == want.strides() && t.storage_offset() == want.storage_offset();
}

std::string describe_call(const ProbeCall& c, size_t j) { return c10::str("call ", j, " (", c.op, ")"); }

}  // namespace

std::string optimizer_name(const torch::optim::Optimizer& opt, size_t index) {
  return c10::str("optimizer ", index, " (", c10::demangle(typeid(opt).name()), ")");
}

OptimizerSnapshot::OptimizerSnapshot(const std::vector<torch::optim::Optimizer*>& optimizers) {
  saved_.reserve(optimizers.size());
  for (auto* o : optimizers) {
    Saved s{o, {}};
    s.state.reserve(o->state().size());
    for (const auto& [key, st] : o->state()) s.state.emplace_back(key, st ? st->clone() : nullptr);
    saved_.push_back(std::move(s));
  }
}

void OptimizerSnapshot::restore() const {
  for (const auto& s : saved_) {
    auto& state = s.opt->state();
    state.clear();
    for (const auto& [key, st] : s.state) state[key] = st ? st->clone() : nullptr;
  }
}

size_t optimizer_state_entries(const std::vector<torch::optim::Optimizer*>& optimizers) {
  size_t n = 0;
  for (auto* o : optimizers) n += o->state().size();
  return n;
}

std::string match_optimizer_calls(const ir::Graph& raw, const std::unordered_map<int32_t, at::Tensor>& storage_tensor,
                                  const std::vector<std::vector<ProbeCall>>& calls,
                                  const std::vector<std::string>& names, OptimizerSites& out) {
  const auto& nodes = raw.nodes;
  std::vector<bool> used(nodes.size(), false);
  out.assign(calls.size(), {});
  // The arguments of node i that must be a given tensor: those whose storage is a parameter's,
  // a buffer's or an optimizer state tensor's.
  auto site_of = [&](size_t i) {
    OptimizerCallSite s;
    s.node = static_cast<int32_t>(i);
    const auto& n = nodes[i];
    for (size_t k = 0; k < n.args.size(); ++k) {
      const auto& a = n.args[k];
      if (a.kind != ir::Arg::Kind::Tensor || a.value == ir::kNoValue) continue;
      auto it = storage_tensor.find(raw.value(a.value).storage);
      if (it != storage_tensor.end()) s.same_tensor.emplace_back(static_cast<int32_t>(k), it->second);
    }
    return s;
  };
  for (size_t o = 0; o < calls.size(); ++o) {
    const auto& c = calls[o];
    if (c.empty()) continue;
    bool found = false;
    size_t best_prefix = 0;  // the longest partial match, for the message
    for (size_t start = 0; start + c.size() <= nodes.size() && !found; ++start) {
      size_t k = 0;
      for (; k < c.size(); ++k) {
        const auto& n = nodes[start + k];
        if (used[start + k] || n.phase == ir::Phase::Backward || n.op != c[k].op) break;
        auto s = site_of(start + k);
        bool ok = true;
        for (const auto& [arg, t] : s.same_tensor)
          ok = ok && static_cast<size_t>(arg) < c[k].args.size() && same_tensor(c[k].args[static_cast<size_t>(arg)], t);
        if (!ok) break;
      }
      best_prefix = std::max(best_prefix, k);
      if (k != c.size()) continue;
      found = true;
      for (size_t j = 0; j < c.size(); ++j) {
        used[start + j] = true;
        out[o].push_back(site_of(start + j));
      }
    }
    if (!found) {
      const std::string at = best_prefix < c.size() ? " (the closest run of captured nodes differs at " +
                                                          describe_call(c[best_prefix], best_prefix) + ")"
                                                    : "";
      return c10::str(names[o], ": its step() makes ", c.size(),
                      " calls that are not in the captured step on the same tensors", at,
                      "; each optimizer passed to kiln must step once in the step function, after the backward that "
                      "made its gradients");
    }
  }
  return "";
}

std::string check_optimizer_calls(const ir::Graph& raw, const OptimizerSites& sites,
                                  const std::vector<std::vector<ProbeCall>>& calls,
                                  const std::vector<std::string>& names) {
  for (size_t o = 0; o < sites.size(); ++o) {
    const auto& c = calls[o];
    const auto& s = sites[o];
    if (c.size() != s.size())
      return c10::str(names[o], " made ", c.size(), " calls in step(), the captured step has ", s.size());
    for (size_t j = 0; j < c.size(); ++j) {
      const auto& n = raw.nodes[static_cast<size_t>(s[j].node)];
      if (n.op != c[j].op)
        return c10::str(names[o], " called ", c[j].op, " where the captured step has ", n.op, " (call ", j, ")");
      for (const auto& [arg, t] : s[j].same_tensor)
        if (static_cast<size_t>(arg) >= c[j].args.size() || !same_tensor(c[j].args[static_cast<size_t>(arg)], t))
          return c10::str(names[o], ": ", describe_call(c[j], j),
                          " no longer works on the tensors the step was captured with (argument ", arg,
                          "); its state or parameters were replaced (torch::load, a new parameter)");
    }
  }
  return "";
}

namespace {

bool arg_matches(const ir::Arg& a, const c10::IValue& v) {
  switch (a.kind) {
    case ir::Arg::Kind::Int:
      return v.isInt() ? v.toInt() == a.i : v.isDouble() ? v.toDouble() == static_cast<double>(a.i) : false;
    case ir::Arg::Kind::Double:
      return v.isDouble() ? v.toDouble() == a.d : v.isInt() ? static_cast<double>(v.toInt()) == a.d : false;
    case ir::Arg::Kind::Bool: return v.isBool() && (v.toBool() ? 1 : 0) == a.i;
    default: return true;  // lists, strings, dtypes: not step-dependent in any LibTorch optimizer
  }
}

c10::IValue scalar_value(const ir::Arg& a, const c10::IValue& v) {
  switch (a.kind) {
    case ir::Arg::Kind::Int: return v.isInt() ? v : c10::IValue(static_cast<int64_t>(v.toDouble()));
    case ir::Arg::Kind::Bool: return c10::IValue(v.toBool());
    default: return c10::IValue(v.isInt() ? static_cast<double>(v.toInt()) : v.toDouble());
  }
}

bool is_scalar_arg(const ir::Arg& a) {
  return a.kind == ir::Arg::Kind::Int || a.kind == ir::Arg::Kind::Double || a.kind == ir::Arg::Kind::Bool;
}

// Every scalar argument of every call: a slot's value goes to `scalars`; a value that differs from
// the capture's becomes a new slot. Returns whether a slot was added.
bool bind_scalars(const ir::Graph& raw, const OptimizerSites& sites, const std::vector<std::vector<ProbeCall>>& calls,
                  ScalarSlots& slots, std::vector<c10::IValue>& scalars) {
  bool added = false;
  scalars.resize(slots.size());
  for (size_t o = 0; o < calls.size(); ++o)
    for (size_t j = 0; j < calls[o].size(); ++j) {
      const auto node = sites[o][j].node;
      const auto& n = raw.nodes[static_cast<size_t>(node)];
      for (size_t k = 0; k < n.args.size(); ++k) {
        const auto& a = n.args[k];
        if (!is_scalar_arg(a)) continue;
        const auto& v = calls[o][j].args[k];
        const std::pair<int32_t, int32_t> at{node, static_cast<int32_t>(k)};
        auto slot = slots.find(at);
        if (slot == slots.end()) {
          if (arg_matches(a, v)) continue;
          slot = slots.emplace(at, static_cast<int32_t>(slots.size())).first;
          scalars.resize(slots.size());
          added = true;
        }
        scalars[static_cast<size_t>(slot->second)] = scalar_value(a, v);
      }
    }
  return added;
}

}  // namespace

StepProbe::StepProbe(std::vector<torch::optim::Optimizer*> optimizers, Warn warn_once)
    : optimizers_(std::move(optimizers)), warn_once_(std::move(warn_once)) {
  for (size_t o = 0; o < optimizers_.size(); ++o) {
    if (!optimizers_[o]) throw std::invalid_argument(c10::str("kiln: StepState optimizer ", o, " is null"));
    names_.push_back(optimizer_name(*optimizers_[o], o));
  }
}

// The optimizers skip parameters without a gradient; the graph computes them all, so a probe lends
// a placeholder gradient to each parameter the step makes one for.
void StepProbe::lend_placeholders(const CapturedStep& cs, ProbeState& ps) const {
  ps.placed.clear();
  ps.placeholders.resize(cs.grad_params.size());
  for (size_t i = 0; i < cs.grad_params.size(); ++i) {
    auto p = cs.grad_params[i];
    if (!p.defined() || p.grad().defined()) continue;
    if (!ps.placeholders[i].defined()) ps.placeholders[i] = at::empty_like(p);
    p.mutable_grad() = ps.placeholders[i];
    ps.placed.push_back(p);
  }
}

void StepProbe::undo_placeholders(ProbeState& ps) {
  for (auto& p : ps.placed) p.mutable_grad().reset();
  ps.placed.clear();
}

std::vector<std::vector<ProbeCall>> StepProbe::replay() const {
  std::vector<std::vector<ProbeCall>> calls(optimizers_.size());
  for (size_t o = 0; o < optimizers_.size(); ++o)
    calls[o] = probe_calls([&] {
      c10::NoGradGuard no_grad;
      optimizers_[o]->step();
    });
  return calls;
}

// A parameter written in the step by something other than the listed optimizers' step(): an
// optimizer the user did not pass in StepState replays with the scalars of the capture (Adam's
// bias corrections would never move, its step count never advance). A hand-written update
// (p -= lr * grad) is fine, so this warns rather than falling back. A parameter a listed optimizer
// updates too is left alone: what else writes it (a clamp after the update, a skipped update put
// back) is not another optimizer.
void StepProbe::warn_unlisted_updates(const CapturedStep& cs, const ProbeState& ps) const {
  std::map<int32_t, std::string> param_storage;
  for (const auto& in : cs.raw.inputs)
    if (in.role == ir::InputRole::Parameter) param_storage[cs.raw.value(in.value).storage] = in.name;
  std::set<int32_t> listed;
  for (const auto& per : ps.sites)
    for (const auto& c : per) listed.insert(c.node);
  // The storages node i writes.
  auto written = [&](size_t i) {
    std::vector<int32_t> out;
    const auto& n = cs.raw.nodes[i];
    const auto& info = op_info(n.op);
    if (!info.is_mutable || !info.handle) return out;
    const auto& schema_args = info.handle->schema().arguments();
    for (size_t k = 0; k < schema_args.size() && k < n.args.size(); ++k) {
      const auto* alias = schema_args[k].alias_info();
      if (alias && alias->isWrite() && n.args[k].kind == ir::Arg::Kind::Tensor && n.args[k].value != ir::kNoValue)
        out.push_back(cs.raw.value(n.args[k].value).storage);
    }
    return out;
  };
  std::set<int32_t> optimized;
  for (const int32_t i : listed)
    for (const int32_t st : written(static_cast<size_t>(i))) optimized.insert(st);
  for (size_t i = 0; i < cs.raw.nodes.size(); ++i) {
    const auto& n = cs.raw.nodes[i];
    if (n.phase == ir::Phase::Backward || listed.count(static_cast<int32_t>(i))) continue;
    for (const int32_t st : written(i)) {
      if (optimized.count(st)) continue;
      auto p = param_storage.find(st);
      if (p == param_storage.end()) continue;
      warn_once_(c10::str("kiln: the step updates parameter '", p->second, "' with ", n.op,
                          " outside the optimizers given to kiln (StepState::optimizers): if an optimizer makes "
                          "that update, pass it there, or its host state (step counts, bias corrections, learning "
                          "rate) will not advance in compiled steps"));
      return;
    }
  }
}

void StepProbe::look_ahead(const CapturedStep& cs, ProbeState& ps) const {
  if (optimizers_.empty()) return;
  const OptimizerSnapshot snapshot(optimizers_);
  lend_placeholders(cs, ps);
  try {
    const auto calls = replay();
    if (match_optimizer_calls(cs.raw, cs.storage_tensor, calls, names_, ps.sites).empty()) {
      ps.sites_found = true;
      warn_unlisted_updates(cs, ps);
      std::vector<c10::IValue> ignored;
      bind_scalars(cs.raw, ps.sites, calls, ps.slots, ignored);
    } else {
      ps.sites.clear();
    }
  } catch (const std::exception& ex) {
    log_debug(std::string("kiln: the optimizers' look-ahead after the capture failed: ") + ex.what());
    ps.sites.clear();
    ps.sites_found = false;
  }
  undo_placeholders(ps);
  snapshot.restore();
}

std::string StepProbe::probe(const CapturedStep& cs, ProbeState& ps, std::vector<c10::IValue>& scalars,
                             bool* new_slots) const {
  *new_slots = false;
  if (optimizers_.empty()) {
    if (!ps.sites_found) warn_unlisted_updates(cs, ps);
    ps.sites_found = true;
    return "";
  }
  lend_placeholders(cs, ps);
  const auto calls = replay();
  std::string why;
  if (!ps.sites_found) {
    why = match_optimizer_calls(cs.raw, cs.storage_tensor, calls, names_, ps.sites);
    if (!why.empty()) return why;
    ps.sites_found = true;
    warn_unlisted_updates(cs, ps);
  } else {
    why = check_optimizer_calls(cs.raw, ps.sites, calls, names_);
    if (!why.empty()) return why;
  }
  *new_slots = bind_scalars(cs.raw, ps.sites, calls, ps.slots, scalars);
  return "";
}

}  // namespace kiln
