#include "kiln/internal/executor.h"

#include <cstdlib>

#include <stdexcept>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace kiln {
namespace {

std::pair<std::string, std::string> split_op(const std::string& op) {
  const auto colons = op.find("::");
  const auto dot = op.find('.', colons == std::string::npos ? 0 : colons + 2);
  if (dot == std::string::npos) return {op, ""};
  return {op.substr(0, dot), op.substr(dot + 1)};
}

bool optional_tensor_list(const c10::Argument& a) {
  c10::TypePtr t = a.real_type();
  if (t->kind() == c10::TypeKind::OptionalType) t = t->castRaw<c10::OptionalType>()->getElementType();
  if (t->kind() != c10::TypeKind::ListType) return false;
  return t->castRaw<c10::ListType>()->getElementType()->kind() == c10::TypeKind::OptionalType;
}

c10::IValue scalar_ivalue(const ir::Arg& a) {
  switch (a.kind) {
    case ir::Arg::Kind::Bool: return a.is_scalar ? c10::IValue(c10::Scalar(a.i != 0)) : c10::IValue(a.i != 0);
    case ir::Arg::Kind::Int: return a.is_scalar ? c10::IValue(c10::Scalar(a.i)) : c10::IValue(a.i);
    default: return a.is_scalar ? c10::IValue(c10::Scalar(a.d)) : c10::IValue(a.d);
  }
}

}  // namespace

c10::IValue arg_to_ivalue(const ir::Arg& a, const c10::Argument& sa, const std::vector<at::Tensor>& env) {
  using K = ir::Arg::Kind;
  switch (a.kind) {
    case K::None:
      // An undefined tensor handed to a non-optional Tensor parameter (cuDNN attention's backward
      // takes the forward's undefined philox tensors): the kernel expects a Tensor IValue.
      if (sa.type()->kind() == c10::TypeKind::TensorType) return at::Tensor();
      return {};
    case K::Tensor: return env[static_cast<size_t>(a.value)];
    case K::TensorList:
      if (optional_tensor_list(sa)) {
        c10::List<std::optional<at::Tensor>> l;
        for (auto v : a.values)
          l.push_back(v == ir::kNoValue ? std::optional<at::Tensor>()
                                        : std::optional<at::Tensor>(env[static_cast<size_t>(v)]));
        return l;
      } else {
        c10::List<at::Tensor> l;
        for (auto v : a.values) l.push_back(env[static_cast<size_t>(v)]);
        return l;
      }
    case K::Bool:
    case K::Int:
    case K::Double: return scalar_ivalue(a);
    case K::IntList: return c10::IValue(a.ints);
    case K::DoubleList: return c10::IValue(a.doubles);
    case K::BoolList: {
      c10::List<bool> l;
      for (auto b : a.ints) l.push_back(b != 0);
      return l;
    }
    case K::String: return c10::IValue(a.s);
    case K::ScalarType: return c10::IValue(static_cast<c10::ScalarType>(a.i));
    case K::Layout: return c10::IValue(static_cast<c10::Layout>(a.i));
    case K::MemoryFormat: return c10::IValue(static_cast<c10::MemoryFormat>(a.i));
    case K::Device: return c10::IValue(c10::Device(a.s));
  }
  return {};
}

// ---- PreparedNode ----

bool PreparedNode::writes_arguments() const { return handle_->schema().is_mutable(); }

std::vector<ir::ValueId> PreparedNode::written_values() const {
  std::vector<ir::ValueId> out;
  const auto& sargs = handle_->schema().arguments();
  for (size_t i = 0; i < sargs.size() && i < args_.size(); ++i) {
    const auto* alias = sargs[i].alias_info();
    if (!alias || !alias->isWrite()) continue;
    if (args_[i].slot == Slot::Tensor) out.push_back(args_[i].value);
    if (args_[i].slot == Slot::TensorList || args_[i].slot == Slot::OptionalTensorList)
      out.insert(out.end(), args_[i].values.begin(), args_[i].values.end());
  }
  return out;
}

PreparedNode::PreparedNode(const ir::Node& node)
    : op_(node.op), outputs_(node.outputs), returns_list_(node.returns_list) {
  auto [name, overload] = split_op(node.op);
  auto h = c10::Dispatcher::singleton().findOp({name, overload});
  if (!h) throw std::runtime_error("eager executor: unknown op " + node.op);
  handle_ = std::make_shared<const c10::OperatorHandle>(*h);
  const auto& sargs = h->schema().arguments();
  if (sargs.size() != node.args.size())
    throw std::runtime_error("eager executor: " + node.op + " takes " + std::to_string(sargs.size()) +
                             " arguments, the node has " + std::to_string(node.args.size()));
  static const std::vector<at::Tensor> no_env;
  for (size_t i = 0; i < sargs.size(); ++i) {
    const auto& a = node.args[i];
    ArgSlot s;
    if (a.kind == ir::Arg::Kind::Tensor) {
      s.slot = Slot::Tensor;
      s.value = a.value;
    } else if (a.kind == ir::Arg::Kind::TensorList) {
      s.slot = optional_tensor_list(sargs[i]) ? Slot::OptionalTensorList : Slot::TensorList;
      s.values = a.values;
    } else if (a.scalar_input >= 0) {
      s.slot = Slot::Scalar;
      s.scalar_input = a.scalar_input;
      s.as_scalar = a.is_scalar;
    } else {
      s.constant = arg_to_ivalue(a, sargs[i], no_env);
    }
    args_.push_back(std::move(s));
  }
}

namespace {
thread_local const std::string* t_current_op = nullptr;
}

const char* current_node_op() { return t_current_op ? t_current_op->c_str() : ""; }

void PreparedNode::run(std::vector<at::Tensor>& env, const std::vector<c10::IValue>* scalars) const {
  t_current_op = &op_;
  thread_local std::vector<c10::IValue> stack;
  stack.clear();
  stack.reserve(args_.size());
  for (const auto& s : args_) {
    switch (s.slot) {
      case Slot::Constant: stack.push_back(s.constant); break;
      case Slot::Tensor: stack.emplace_back(env[static_cast<size_t>(s.value)]); break;
      case Slot::TensorList: {
        c10::List<at::Tensor> l;
        l.reserve(s.values.size());
        for (auto v : s.values) l.push_back(env[static_cast<size_t>(v)]);
        stack.emplace_back(std::move(l));
        break;
      }
      case Slot::OptionalTensorList: {
        c10::List<std::optional<at::Tensor>> l;
        for (auto v : s.values)
          l.push_back(v == ir::kNoValue ? std::optional<at::Tensor>()
                                        : std::optional<at::Tensor>(env[static_cast<size_t>(v)]));
        stack.emplace_back(std::move(l));
        break;
      }
      case Slot::Scalar: {
        const auto& v = scalars->at(static_cast<size_t>(s.scalar_input));
        stack.push_back(s.as_scalar ? c10::IValue(v.toScalar()) : v);
        break;
      }
    }
  }
  handle_->callBoxed(&stack);
  if (returns_list_) {
    auto list = stack.at(0).toTensorList();
    for (size_t k = 0; k < outputs_.size(); ++k)
      if (outputs_[k] != ir::kNoValue) env[static_cast<size_t>(outputs_[k])] = list.get(k);
    return;
  }
  for (size_t k = 0; k < outputs_.size(); ++k) {
    if (outputs_[k] == ir::kNoValue) continue;
    auto& iv = stack[k];
    env[static_cast<size_t>(outputs_[k])] = iv.isTensor() ? std::move(iv).toTensor() : at::Tensor();
  }
}

// ---- EagerExecutor ----

EagerExecutor::EagerExecutor(const ir::Graph& graph, std::vector<int32_t> nodes, std::vector<ir::ValueId> keep,
                             bool check_meta) {
  if (nodes.empty())
    for (size_t i = 0; i < graph.nodes.size(); ++i) nodes.push_back(static_cast<int32_t>(i));
  std::vector<char> keep_v(graph.values.size(), 0);
  for (auto v : keep) keep_v[static_cast<size_t>(v)] = 1;
  for (const auto& o : graph.outputs) keep_v[static_cast<size_t>(o.value)] = 1;
  std::vector<int32_t> last(graph.values.size(), -1);
  for (size_t k = 0; k < nodes.size(); ++k) {
    const auto& n = graph.nodes.at(static_cast<size_t>(nodes[k]));
    for (auto v : ir::Graph::node_inputs(n)) last[static_cast<size_t>(v)] = static_cast<int32_t>(k);
    // A result nobody reads dies right after its node.
    for (auto v : n.outputs)
      if (v != ir::kNoValue && last[static_cast<size_t>(v)] < static_cast<int32_t>(k))
        last[static_cast<size_t>(v)] = static_cast<int32_t>(k);
  }
  free_after_.resize(nodes.size());
  for (size_t v = 0; v < last.size(); ++v)
    if (last[v] >= 0 && !keep_v[v]) free_after_[static_cast<size_t>(last[v])].push_back(static_cast<ir::ValueId>(v));
  nodes_.reserve(nodes.size());
  for (auto i : nodes) nodes_.emplace_back(graph.nodes.at(static_cast<size_t>(i)));
  if (check_meta) {
    for (auto i : nodes) {
      const auto& n = graph.nodes.at(static_cast<size_t>(i));
      check_meta_.emplace_back();
      for (auto v : n.outputs)
        if (v != ir::kNoValue) check_meta_.back().emplace_back(v, graph.value(v).meta);
      check_where_.push_back(c10::str("node ", i, " (", n.op, ")"));
    }
  }
}

void EagerExecutor::run_node(const ir::Node& node, std::vector<at::Tensor>& env,
                             const std::vector<c10::IValue>* scalars) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  PreparedNode(node).run(env, scalars);
}

void EagerExecutor::run(std::vector<at::Tensor>& env, const std::vector<c10::IValue>* scalars) const {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  for (size_t k = 0; k < nodes_.size(); ++k) {
    nodes_[k].run(env, scalars);
    if (!check_meta_.empty())
      for (const auto& [v, m] : check_meta_[k]) {
        const at::Tensor& t = env[static_cast<size_t>(v)];
        if (t.defined() && (t.scalar_type() != m.dtype || t.sizes() != c10::IntArrayRef(m.shape)))
          throw std::runtime_error(c10::str("KILN_CHECK_META: ", check_where_[k], " made %", v, " ", t.scalar_type(),
                                            t.sizes(), "; the graph says ", m.dtype, c10::IntArrayRef(m.shape)));
      }
    for (auto v : free_after_[k]) env[static_cast<size_t>(v)].reset();
  }
}

}  // namespace kiln
