#include "kiln/internal/op_info.h"

#include <deque>
#include <mutex>
#include <unordered_map>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/function_schema.h>

#include "kiln/ir.h"

namespace kiln {

const OpInfo& op_info(const std::string& op) {
  static std::mutex mu;
  static std::unordered_map<std::string, OpInfo> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(op);
  if (it != cache.end()) return it->second;
  OpInfo info;
  const auto dot = op.find('.', op.find("::") == std::string::npos ? 0 : op.find("::") + 2);
  const std::string name = op.substr(0, dot);
  const std::string overload = dot == std::string::npos ? "" : op.substr(dot + 1);
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  if (handle) {
    info.found = true;
    const auto& schema = handle->schema();
    info.is_mutable = schema.is_mutable();
    for (const auto& ret : schema.returns())
      if (ret.alias_info() && !ret.alias_info()->isWrite()) info.is_view = true;
    info.nondeterministic = handle->hasTag(at::Tag::nondeterministic_seeded);
    // The handle is a cheap copy of a pointer into the dispatcher's registry, which lives for the
    // whole process; keep one copy per op so callers can hold a pointer to it.
    static std::deque<c10::OperatorHandle> handles;
    handles.push_back(*handle);
    info.handle = &handles.back();
  }
  return cache.emplace(op, info).first->second;
}

bool node_issues_collective(const ir::Node& n) {
  return n.op.rfind("_c10d_functional::", 0) == 0 && n.op != "_c10d_functional::wait_tensor";
}

bool node_draws_random_numbers(const ir::Node& n) {
  const OpInfo& info = op_info(n.op);
  if (!info.nondeterministic) return false;
  if (!info.handle) return true;
  const auto& params = info.handle->schema().arguments();
  for (size_t k = 0; k < params.size() && k < n.args.size(); ++k) {
    const auto& a = n.args[k];
    if (params[k].name() == "dropout_p" && a.kind == ir::Arg::Kind::Double && a.scalar_input < 0 && a.d == 0.0)
      return false;
    if (params[k].name() == "train" && a.kind == ir::Arg::Kind::Bool && a.i == 0) return false;
  }
  return true;
}

}  // namespace kiln
