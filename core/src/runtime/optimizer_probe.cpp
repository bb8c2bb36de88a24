#include "optimizer_probe.h"

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
        if (used[start + k] || n.phase == "backward" || n.op != c[k].op) break;
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
          return c10::str(names[o], ": ", describe_call(c[j], j), " no longer works on the tensors the step was captured with (argument ",
                          arg, "); its state or parameters were replaced (torch::load, a new parameter)");
    }
  }
  return "";
}

}  // namespace kiln
