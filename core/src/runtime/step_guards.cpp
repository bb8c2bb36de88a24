#include "step_guards.h"

#include <functional>
#include <set>
#include <sstream>

#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>

namespace kiln {

StepGuards::StepGuards(const StepState& state) : state_(state) { collect(); }

void StepGuards::collect() {
  modules_.clear();
  params_.clear();
  structure_ = structure_now();
  std::set<const c10::TensorImpl*> seen;
  for (size_t m = 0; m < state_.modules.size(); ++m) {
    const auto& mod = state_.modules[m];
    const std::string prefix = state_.modules.size() > 1 ? "module" + std::to_string(m) + "." : "";
    for (auto& sub : mod->modules(/*include_self=*/true)) modules_.push_back(sub);
    for (auto& p : mod->named_parameters(true))
      if (seen.insert(p.value().unsafeGetTensorImpl()).second) params_.emplace_back(prefix + p.key(), p.value());
  }
}

StepGuards::Structure StepGuards::structure_now() const {
  Structure out;
  out.addresses.reserve(structure_.addresses.size());
  out.options.reserve(structure_.options.size());
  std::ostringstream os;
  std::function<void(const torch::nn::Module&)> walk = [&](const torch::nn::Module& m) {
    out.addresses.push_back(&m);
    for (const auto& p : m.parameters(/*recurse=*/false)) out.addresses.push_back(p.unsafeGetTensorImpl());
    for (const auto& b : m.buffers(/*recurse=*/false)) out.addresses.push_back(b.unsafeGetTensorImpl());
    m.pretty_print(os);  // "torch::nn::Dropout(p=0.5, inplace=false)"
    os << '\n';
    for (const auto& c : m.children()) walk(*c);
  };
  for (const auto& m : state_.modules) walk(*m);
  out.options = os.str();
  return out;
}

bool StepGuards::structure_changed() const { return !(structure_now() == structure_); }

std::vector<int64_t> StepGuards::signature(const std::vector<at::Tensor>& inputs, bool with_sizes) const {
  std::vector<int64_t> sig;
  sig.reserve(16 + inputs.size() * 8 + params_.size() * 4);
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
  for (const auto& p : params_) add_tensor(p.second);
  sig.push_back(-3);
  for (const auto& m : modules_) sig.push_back(m->is_training());
  sig.push_back(c10::GradMode::is_enabled());
  sig.push_back(at::autocast::is_autocast_enabled(at::kCUDA));
  sig.push_back(at::autocast::is_autocast_enabled(at::kCPU));
  sig.push_back(static_cast<int64_t>(at::autocast::get_autocast_dtype(at::kCUDA)));
  return sig;
}

}  // namespace kiln
