// StepRecorder and probe_calls: the two ModeHandlers of kiln's capture.
#include <algorithm>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/StringUtil.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/graph_task.h>

#include "dispatch_mode.h"
#include "kiln/internal/capture.h"

namespace kiln {
namespace {

ir::TensorMeta meta_of(const at::Tensor& t) {
  ir::TensorMeta m;
  m.dtype = t.scalar_type();
  m.shape = t.sizes().vec();
  m.strides = t.strides().vec();
  m.storage_offset = t.storage_offset();
  m.device = t.device();
  return m;
}

const c10::Type& base_type(const c10::Argument& a, bool& optional) {
  const c10::TypePtr& t = a.real_type();
  optional = false;
  if (t->kind() == c10::TypeKind::OptionalType) {
    optional = true;
    return *t->castRaw<c10::OptionalType>()->getElementType();
  }
  return *t;
}

std::string ivalue_tag(const c10::IValue& v) { return v.tagKind(); }

// An index list (aten::index.Tensor's `indices`) with a boolean or byte mask among its tensors.
bool has_mask_index(const c10::IValue& indices) {
  if (!indices.isList()) return false;
  for (const auto& e : indices.toListRef()) {
    if (e.isNone() || !e.isTensor() || !e.toTensor().defined()) continue;
    const auto t = e.toTensor().scalar_type();
    if (t == at::kBool || t == at::kByte) return true;
  }
  return false;
}

}  // namespace

std::string op_full_name(const c10::OperatorHandle& op) {
  const auto& n = op.operator_name();
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

bool is_data_dependent_op(const std::string& op) {
  static const std::unordered_set<std::string> ops = {"aten::_local_scalar_dense",
                                                      "aten::nonzero",
                                                      "aten::nonzero_numpy",
                                                      "aten::masked_select",
                                                      "aten::unique_dim",
                                                      "aten::_unique",
                                                      "aten::_unique2",
                                                      "aten::unique_consecutive",
                                                      "aten::unique_dim_consecutive",
                                                      "aten::repeat_interleave.Tensor",
                                                      "aten::equal",
                                                      "aten::is_nonzero",
                                                      "aten::_assert_async",
                                                      "aten::_assert_async.msg",
                                                      "aten::bincount",
                                                      "aten::item",
                                                      "aten::allclose",
                                                      "aten::_assert_scalar",
                                                      "aten::set_.source_Storage",
                                                      "aten::set_.source_Storage_storage_offset",
                                                      "aten::set_.source_Tensor",
                                                      "aten::set_"};
  return ops.count(op) > 0;
}

bool ivalue_to_arg(const c10::IValue& v, const c10::Argument& schema_arg,
                   const std::function<ir::ValueId(const at::Tensor&)>& tensor_value, ir::Arg& out, std::string& why) {
  using K = ir::Arg::Kind;
  using TK = c10::TypeKind;
  bool optional = false;
  const c10::Type& t = base_type(schema_arg, optional);
  out = ir::Arg::none();
  if (v.isNone()) return true;
  switch (t.kind()) {
    case TK::TensorType: {
      const auto& tensor = v.toTensor();
      if (!tensor.defined()) return true;
      out = ir::Arg::tensor(tensor_value(tensor));
      return out.value != ir::kNoValue || (why = "an untracked alias of a tensor the step wrote", false);
    }
    case TK::ListType: {
      const auto& elem = t.castRaw<c10::ListType>()->getElementType();
      const auto ek = elem->kind();
      if (ek == TK::TensorType ||
          (ek == TK::OptionalType && elem->castRaw<c10::OptionalType>()->getElementType()->kind() == TK::TensorType)) {
        std::vector<ir::ValueId> ids;
        for (const auto& e : v.toListRef()) {
          if (e.isNone() || !e.toTensor().defined()) {
            ids.push_back(ir::kNoValue);
            continue;
          }
          auto id = tensor_value(e.toTensor());
          if (id == ir::kNoValue) return why = "an untracked alias of a tensor the step wrote", false;
          ids.push_back(id);
        }
        out = ir::Arg::tensor_list(std::move(ids));
        return true;
      }
      if (ek == TK::IntType || ek == TK::SymIntType) {
        std::vector<int64_t> ints;
        for (const auto& e : v.toListRef()) {
          if (e.isSymInt()) {
            auto s = e.toSymInt();
            if (!s.is_heap_allocated()) ints.push_back(s.as_int_unchecked());
            else return why = "a symbolic integer argument", false;
          } else {
            ints.push_back(e.toInt());
          }
        }
        out = ir::Arg::int_list(std::move(ints));
        return true;
      }
      if (ek == TK::FloatType) {
        out.kind = K::DoubleList;
        for (const auto& e : v.toListRef()) out.doubles.push_back(e.toDouble());
        return true;
      }
      if (ek == TK::BoolType) {
        out.kind = K::BoolList;
        for (const auto& e : v.toListRef()) out.ints.push_back(e.toBool() ? 1 : 0);
        return true;
      }
      why = "a list argument of type " + t.str();
      return false;
    }
    case TK::NumberType:  // Scalar
      if (v.isInt()) out = ir::Arg::integer(v.toInt());
      else if (v.isDouble()) out = ir::Arg::real(v.toDouble());
      else if (v.isBool()) out = ir::Arg::boolean(v.toBool());
      else if (v.isSymInt() && !v.toSymInt().is_heap_allocated())
        out = ir::Arg::integer(v.toSymInt().as_int_unchecked());
      else return why = "a Scalar argument holding " + ivalue_tag(v), false;
      out.is_scalar = true;
      return true;
    case TK::IntType:
    case TK::SymIntType:
      if (v.isInt()) out = ir::Arg::integer(v.toInt());
      else if (v.isSymInt() && !v.toSymInt().is_heap_allocated())
        out = ir::Arg::integer(v.toSymInt().as_int_unchecked());
      else return why = "an int argument holding " + ivalue_tag(v), false;
      return true;
    case TK::FloatType: out = ir::Arg::real(v.toDouble()); return true;
    case TK::BoolType: out = ir::Arg::boolean(v.toBool()); return true;
    case TK::StringType:
      out.kind = K::String;
      out.s = v.toStringRef();
      return true;
    case TK::ScalarTypeType: out = ir::Arg::scalar_type(static_cast<c10::ScalarType>(v.toInt())); return true;
    case TK::LayoutType:
      out.kind = K::Layout;
      out.i = v.toInt();
      return true;
    case TK::MemoryFormatType:
      out.kind = K::MemoryFormat;
      out.i = v.toInt();
      return true;
    case TK::DeviceObjType:
      out.kind = K::Device;
      out.s = v.toDevice().str();
      return true;
    default: why = "an argument of type " + t.str(); return false;
  }
}

// ---- StepRecorder ----

struct StepRecorder::State : capture_detail::ModeHandler {
  std::mutex mu;
  std::unordered_map<const c10::TensorImpl*, size_t> known_index;
  std::vector<KnownTensor> known;

  ir::Graph graph;
  std::vector<at::Tensor> input_tensors;
  std::vector<int> input_user_index;

  // Identity of every tensor seen, by TensorImpl and by StorageImpl. The weak references keep
  // the addresses from being reused by a later allocation while the step runs, without raising
  // use counts (AccumulateGrad steals a gradient only when nobody else holds it).
  std::unordered_map<const c10::TensorImpl*, ir::ValueId> impl_value;
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> impl_refs;
  std::unordered_map<const c10::StorageImpl*, int32_t> storage_id;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> storage_refs;
  std::unordered_map<int32_t, std::vector<const c10::TensorImpl*>> storage_impls;

  bool recording = true;
  bool backward_seen = false;
  // Host reads let through: which values the recorded nodes have used so far (a read is allowed
  // only of a value already used on the device), and the numbers read (that must not come back as
  // an argument: host code computed something from them).
  std::vector<char> used_on_device;
  std::vector<double> read_values;
  std::vector<std::string> host_reads;
  // Set before the real kernel runs, read after it: a read whose number to remember, an
  // equal(x, x) whose answer to check.
  bool pending_read = false;
  bool pending_equal = false;
  CaptureFailure failure;
  int constants = 0;

  void fail(std::string op, std::string reason) {
    if (!recording) return;
    recording = false;
    failure = {std::move(op), std::move(reason)};
  }

  // Where a value comes from, for messages: a tensor the step was given by what it is ("parameter
  // fc1.weight", "the step's input 0"), a computed one by its op and the module whose parameter it
  // is nearest to ("aten::gt in module fc2 (after parameter fc2.weight)"), or the input it is
  // nearest to when no parameter is.
  std::string describe(ir::ValueId v) const {
    if (v == ir::kNoValue || static_cast<size_t>(v) >= graph.values.size()) return "a tensor the step made on the host";
    auto input_text = [&](const ir::Input& in) -> std::string {
      switch (in.role) {
        case ir::InputRole::UserInput: return "the step's input " + in.name.substr(in.name.find('.') + 1);
        case ir::InputRole::Parameter: return "parameter " + in.name;
        case ir::InputRole::Gradient: return "the gradient of " + in.name.substr(5);
        case ir::InputRole::Buffer: return "buffer " + in.name;
        case ir::InputRole::OptimizerState: return "optimizer state " + in.name.substr(in.name.find('.') + 1);
        default: return "a constant tensor";
      }
    };
    auto input_of = [&](ir::ValueId x) -> const ir::Input* {
      for (const auto& in : graph.inputs)
        if (in.value == x) return &in;
      return nullptr;
    };
    if (const auto* in = input_of(v)) return input_text(*in);
    const int32_t producer = graph.value(v).producer;
    if (producer < 0) return "a tensor the step made on the host";
    std::string text = graph.nodes[static_cast<size_t>(producer)].op;
    // Breadth first through what it was computed from: the nearest parameter names the module.
    std::vector<ir::ValueId> queue = {v};
    std::set<ir::ValueId> seen = {v};
    const ir::Input* nearest_input = nullptr;
    for (size_t i = 0; i < queue.size() && i < 512; ++i) {
      if (const auto* in = input_of(queue[i])) {
        if (in->role == ir::InputRole::Parameter) {
          const size_t dot = in->name.rfind('.');
          return text + (dot == std::string::npos
                             ? " (after parameter " + in->name + ")"
                             : " in module " + in->name.substr(0, dot) + " (after parameter " + in->name + ")");
        }
        if (!nearest_input) nearest_input = in;
        continue;
      }
      const int32_t p = graph.value(queue[i]).producer;
      if (p < 0) continue;
      for (auto x : ir::Graph::node_inputs(graph.nodes[static_cast<size_t>(p)]))
        if (seen.insert(x).second) queue.push_back(x);
    }
    return nearest_input ? text + " of " + input_text(*nearest_input) : text;
  }

  // The first tensor argument of the op about to run, described.
  std::string describe_first_tensor(const torch::jit::Stack& stack, size_t n_args) {
    for (size_t i = stack.size() - n_args; i < stack.size(); ++i)
      if (stack[i].isTensor() && stack[i].toTensor().defined()) return describe(value_for_arg(stack[i].toTensor()));
    return "";
  }

  int32_t storage_of(const at::Tensor& t, bool& known_storage) {
    const auto* st = t.storage().unsafeGetStorageImpl();
    auto it = storage_id.find(st);
    known_storage = it != storage_id.end();
    if (known_storage) return it->second;
    const auto id = static_cast<int32_t>(storage_id.size());
    storage_id.emplace(st, id);
    storage_refs.emplace_back(t.storage().getWeakStorageImpl());
    return id;
  }

  void bind(const at::Tensor& t, ir::ValueId v, int32_t storage) {
    auto* impl = t.unsafeGetTensorImpl();
    auto [it, inserted] = impl_value.insert_or_assign(impl, v);
    if (inserted) {
      impl_refs.emplace_back(t.getIntrusivePtr());
      storage_impls[storage].push_back(impl);
    }
  }

  // The value of a tensor read as an argument. Tensors first seen here are graph inputs.
  ir::ValueId value_for_arg(const at::Tensor& t) {
    auto* impl = t.unsafeGetTensorImpl();
    if (auto it = impl_value.find(impl); it != impl_value.end()) return it->second;
    if (!t.has_storage()) return ir::kNoValue;
    bool known_storage = false;
    const int32_t sid = storage_of(t, known_storage);
    if (known_storage) {
      // A new TensorImpl over memory the step already uses (`.data()`, shallow copies): the same
      // value when it looks at the same elements, else an alias kiln cannot follow; except another
      // of the step's own inputs over its inputs' memory (a batch and its targets as shifted views
      // of one token tensor), which is an input of its own (functionalization refuses it if the
      // step writes that memory).
      const auto meta = meta_of(t);
      for (const auto* other : storage_impls[sid]) {
        const auto v = impl_value.at(other);
        if (graph.value(v).meta == meta) {
          bind(t, v, sid);
          return v;
        }
      }
      const auto k = known_index.find(impl);
      const bool an_inputs = std::any_of(storage_impls[sid].begin(), storage_impls[sid].end(),
                                         [&](const auto* o) { return graph.value(impl_value.at(o)).producer < 0; });
      if (k == known_index.end() || known[k->second].role != ir::InputRole::UserInput || !an_inputs)
        return ir::kNoValue;
      const auto v = graph.add_input(meta, ir::InputRole::UserInput, known[k->second].name);
      graph.value(v).storage = sid;
      input_tensors.push_back(t);
      input_user_index.push_back(known[k->second].user_index);
      bind(t, v, sid);
      return v;
    }
    ir::InputRole role = ir::InputRole::Constant;
    std::string name;
    int user = -1;
    if (auto k = known_index.find(impl); k != known_index.end()) {
      role = known[k->second].role;
      name = known[k->second].name;
      user = known[k->second].user_index;
    } else {
      name = "const." + std::to_string(constants++);
    }
    const auto v = graph.add_input(meta_of(t), role, name);
    graph.value(v).storage = sid;
    input_tensors.push_back(t);
    input_user_index.push_back(user);
    bind(t, v, sid);
    return v;
  }

  void on_dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
    const auto& schema = op.schema();
    const auto& sargs = schema.arguments();
    const auto& srets = schema.returns();
    ir::Node node;
    bool record = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (recording) {
        node.op = op_full_name(op);
        if (node.op == "aten::_local_scalar_dense") {
          host_read(*(stack->end() - 1));
        } else if (node.op == "aten::equal" && same_value(*(stack->end() - 2), *(stack->end() - 1))) {
          // equal(x, x): true whatever x holds (ATen answers it from the tensors' identity without
          // reading them). nn::MultiheadAttention asks it to pick its self-attention path.
          pending_equal = true;
        } else if (is_data_dependent_op(node.op)) {
          const std::string of = describe_first_tensor(*stack, sargs.size());
          fail(node.op, "its result depends on tensor data (" + node.op + (of.empty() ? "" : " of " + of) + ")");
        } else if (node.op == "aten::index.Tensor" && has_mask_index(*(stack->end() - 1))) {
          // x[mask]: as many elements as the mask holds true values. ATen finds them inside the
          // op (a nonzero the recorder does not see), so a replay would keep the first count.
          const std::string of = describe_first_tensor(*stack, sargs.size());
          fail(node.op, "its result depends on tensor data (" + node.op + (of.empty() ? "" : " of " + of) +
                            " with a boolean mask)");
        } else {
          record = true;
          const size_t n = sargs.size();
          auto first = stack->end() - static_cast<std::ptrdiff_t>(n);
          std::string why;
          auto lookup = [&](const at::Tensor& t) { return value_for_arg(t); };
          for (size_t i = 0; i < n && record; ++i) {
            ir::Arg a;
            if (!ivalue_to_arg(first[static_cast<std::ptrdiff_t>(i)], sargs[i], lookup, a, why)) {
              fail(node.op, node.op + " takes " + why + " (argument '" + sargs[i].name() + "')");
              record = false;
            }
            node.args.push_back(std::move(a));
          }
          if (torch::autograd::get_current_graph_task_id() != -1) {
            node.phase = ir::Phase::Backward;
            backward_seen = true;
          } else {
            node.phase = backward_seen ? ir::Phase::Optimizer : ir::Phase::Forward;
          }
        }
      }
    }

    op.callBoxed(stack);

    if (!record) {
      std::lock_guard<std::mutex> lock(mu);
      if (pending_equal) {
        pending_equal = false;
        if (recording && (stack->empty() || !stack->back().isBool() || !stack->back().toBool()))
          fail("aten::equal", "its result depends on tensor data (aten::equal)");
        return;
      }
      if (pending_read && recording && !stack->empty()) {
        const auto& r = stack->back();
        if (r.isDouble() || r.isInt() || r.isBool())
          read_values.push_back(r.isDouble() ? r.toDouble() : r.isInt() ? static_cast<double>(r.toInt()) : r.toBool());
      }
      pending_read = false;
      return;
    }
    std::lock_guard<std::mutex> lock(mu);
    if (!recording) return;
    const size_t nret = srets.size();
    auto first = stack->end() - static_cast<std::ptrdiff_t>(nret);
    auto add_result = [&](const at::Tensor& t, const c10::Argument& ret) -> bool {
      if (!t.defined()) {
        node.outputs.push_back(ir::kNoValue);
        return true;
      }
      if (!t.has_storage()) {
        fail(node.op, node.op + " returned a tensor without storage");
        return false;
      }
      bool known_storage = false;
      const int32_t sid = storage_of(t, known_storage);
      const auto v = graph.add_value(meta_of(t));
      graph.value(v).storage = sid;
      bind(t, v, sid);
      node.outputs.push_back(v);
      return true;
    };
    for (size_t k = 0; k < nret; ++k) {
      const auto& iv = first[static_cast<std::ptrdiff_t>(k)];
      if (iv.isTensor()) {
        if (!add_result(iv.toTensor(), srets[k])) return;
      } else if (iv.isTensorList()) {
        node.returns_list = true;
        for (const auto& e : iv.toListRef())
          if (!add_result(e.toTensor(), srets[k])) return;
      } else if (iv.isNone()) {
        node.outputs.push_back(ir::kNoValue);
      } else if (iv.isInt() && (srets[k].type()->kind() == c10::TypeKind::IntType ||
                                srets[k].type()->kind() == c10::TypeKind::SymIntType)) {
        // An int result of a non-data-dependent op is a function of shapes (flash and cuDNN
        // attention return their max sequence lengths): the ops that read it got it as a constant
        // argument, and shapes are guarded. It has no tensor value.
        node.outputs.push_back(ir::kNoValue);
      } else {
        fail(node.op, node.op + " returns " + ivalue_tag(iv) + ", a value that depends on tensor data");
        return;
      }
    }
    for (const auto& a : node.args) {
      if (!read_values.empty() && passes_read_value(a)) {
        fail(node.op, node.op +
                          " takes a number the step read from a tensor on the host (.item()); host arithmetic "
                          "on tensor values cannot be replayed");
        return;
      }
      for (auto v : a.kind == ir::Arg::Kind::Tensor ? std::vector<ir::ValueId>{a.value} : a.values)
        if (v != ir::kNoValue) {
          if (used_on_device.size() <= static_cast<size_t>(v)) used_on_device.resize(static_cast<size_t>(v) + 1, 0);
          used_on_device[static_cast<size_t>(v)] = 1;
        }
    }
    graph.add_node(std::move(node));
  }

  // Whether two arguments are the same value of the step (the same tensor, or a view with the
  // same sizes, strides and offset over the same memory).
  bool same_value(const c10::IValue& a, const c10::IValue& b) {
    if (!a.isTensor() || !b.isTensor() || !a.toTensor().defined() || !b.toTensor().defined()) return false;
    const auto va = value_for_arg(a.toTensor()), vb = value_for_arg(b.toTensor());
    return va != ir::kNoValue && va == vb;
  }

  // `.item()` (aten::_local_scalar_dense) of a tensor the step already used on the device is let
  // through: clip_grad_norm_ reads its total norm that way, after scaling the gradients with it on
  // the device, only to return it. A read of a value not used yet is what host control flow looks
  // like (`if (x.max().item() > 0)`), and stops the capture.
  void host_read(const c10::IValue& arg) {
    const std::string op = "aten::_local_scalar_dense";
    if (!arg.isTensor()) return fail(op, "its result depends on tensor data (" + op + ")");
    const auto& t = arg.toTensor();
    auto it = impl_value.find(t.unsafeGetTensorImpl());
    const ir::ValueId v = it != impl_value.end() ? it->second : ir::kNoValue;
    if (v == ir::kNoValue || static_cast<size_t>(v) >= used_on_device.size() || !used_on_device[static_cast<size_t>(v)])
      return fail(op, "it reads a tensor's value on the host (.item(), " + op + ", of " + describe(v) +
                          ") before the step uses that tensor on the device: host code may decide on it");
    pending_read = true;
    host_reads.push_back(".item() of " + describe(v) + ", already used on the device");
  }

  bool passes_read_value(const ir::Arg& a) const {
    for (double r : read_values) {
      if (a.kind == ir::Arg::Kind::Double && a.d == r) return true;
      if (a.kind == ir::Arg::Kind::Int && r == static_cast<double>(static_cast<int64_t>(r)) &&
          a.i == static_cast<int64_t>(r) && a.is_scalar)
        return true;
    }
    return false;
  }
};

StepRecorder::StepRecorder(std::vector<KnownTensor> known) : s_(std::make_unique<State>()) {
  s_->known = std::move(known);
  for (size_t i = 0; i < s_->known.size(); ++i)
    if (s_->known[i].tensor.defined()) s_->known_index.emplace(s_->known[i].tensor.unsafeGetTensorImpl(), i);
}

StepRecorder::~StepRecorder() = default;

std::vector<at::Tensor> StepRecorder::run(const std::function<std::vector<at::Tensor>()>& step) {
  std::vector<at::Tensor> results;
  {
    capture_detail::ModeGuard guard(s_.get());
    results = step();
  }
  return results;
}

bool StepRecorder::ok() const { return s_->recording; }
const std::vector<std::string>& StepRecorder::host_reads() const { return s_->host_reads; }
const CaptureFailure& StepRecorder::failure() const { return s_->failure; }

ir::ValueId StepRecorder::value_of(const at::Tensor& t) const {
  if (!t.defined()) return ir::kNoValue;
  auto it = s_->impl_value.find(t.unsafeGetTensorImpl());
  if (it != s_->impl_value.end()) return it->second;
  // A tensor the step handed back through a shallow copy (`.detach()` outside the dispatcher).
  if (!t.has_storage()) return ir::kNoValue;
  auto st = s_->storage_id.find(t.storage().unsafeGetStorageImpl());
  if (st == s_->storage_id.end()) return ir::kNoValue;
  const auto meta = meta_of(t);
  for (const auto* other : s_->storage_impls[st->second]) {
    const auto v = s_->impl_value.at(other);
    if (s_->graph.value(v).meta == meta) return v;
  }
  return ir::kNoValue;
}

void StepRecorder::add_output(ir::ValueId v, std::string name, ir::OutputRole role, int32_t target) {
  s_->graph.outputs.push_back({v, role, target, std::move(name)});
}

ir::Graph& StepRecorder::graph() { return s_->graph; }
const std::vector<at::Tensor>& StepRecorder::input_tensors() const { return s_->input_tensors; }
const std::vector<int>& StepRecorder::input_user_index() const { return s_->input_user_index; }

// ---- probe ----

namespace {

struct Prober : capture_detail::ModeHandler {
  std::mutex mu;
  std::vector<ProbeCall> calls;
  at::Tensor placeholder;

  void on_dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
    const auto& schema = op.schema();
    const auto& sargs = schema.arguments();
    const auto& srets = schema.returns();
    const size_t n = sargs.size();
    std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(n), stack->end());
    stack->erase(stack->end() - static_cast<std::ptrdiff_t>(n), stack->end());
    for (const auto& ret : srets) {
      const auto* ai = ret.alias_info();
      bool pushed = false;
      if (ai && ai->isWrite()) {
        for (size_t i = 0; i < n && !pushed; ++i) {
          const auto* aa = sargs[i].alias_info();
          if (aa && aa->beforeSets() == ai->beforeSets()) {
            stack->push_back(args[i]);
            pushed = true;
          }
        }
      }
      if (pushed) continue;
      if (ret.type()->kind() == c10::TypeKind::TensorType) {
        if (!placeholder.defined()) placeholder = at::empty({0}, at::TensorOptions(at::kMeta));
        stack->push_back(placeholder);
      } else if (ret.type()->kind() == c10::TypeKind::ListType) {
        stack->push_back(c10::List<at::Tensor>());
      } else {
        stack->push_back(c10::IValue(0.0));
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    calls.push_back({op_full_name(op), std::move(args)});
  }
};

}  // namespace

std::vector<ProbeCall> probe_calls(const std::function<void()>& fn) {
  Prober prober;
  {
    capture_detail::ModeGuard guard(&prober);
    fn();
  }
  return std::move(prober.calls);
}

}  // namespace kiln
