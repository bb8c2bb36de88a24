#include "lowering.h"

#include "gemm_fold.h"
#include "lowerer.h"
#include "materialize.h"
#include "op_registry.h"

namespace kiln::inductor {

using plugin::Arg;
using plugin::Graph;
using plugin::Node;
using plugin::Unimplemented;

// The rules every op follows; the entry's flags say which apply, its claim rule adds its own. The
// order of the checks is the order of the reasons a debug log gives.
namespace {

// Whether the CUDA kernels compute this node of an extern op themselves (OpEntry::cuda_claim).
bool generated_on_cuda(const OpEntry& op, const Graph& g, const Node& n, Target target) {
  return target == Target::Cuda && op.cuda_claim && op.cuda_claim(g, n).empty();
}

}  // namespace

std::string why_not_claimed(const Graph& g, const Node& n, const LoweringOptions& opts) {
  const OpEntry* op = find_op(n.op());
  if (!op) return "not an op the inductor lowers";
  const bool is_extern = op->kind == OpKind::Extern && !generated_on_cuda(*op, g, n, opts.target);
  if (is_extern && !opts.extern_kernels) return "extern kernels are off";
  for (size_t i = 0; i < n.num_args(); ++i) {
    Arg a = n.arg(i);
    if (a.tag() == KILN_ARG_TENSOR_LIST) return "tensor list arguments";
    if (rt_scalar(a) >= 0 && !opts.runtime_scalars) return "run-time scalar, and run-time scalars are off";
    if (rt_scalar(a) >= 0 && is_extern) return "run-time scalar in an extern kernel";
  }
  const bool cuda = opts.target == Target::Cuda;
  std::optional<DLDevice> device;
  auto check_value = [&](int64_t v) -> std::string {
    if (v < 0) return "undefined result";
    auto val = g.value(v);
    const DLDevice d = val.device();
    if (d.device_type != (cuda ? kDLCUDA : kDLCPU)) return cuda ? "not on a CUDA device" : "not on the CPU";
    if (device && device->device_id != d.device_id) return "values on two devices";
    device = d;
    auto ty = ty_of(val.dtype());
    // bfloat16 is stored as bfloat16 and computed in float, by the CUDA and the C++ kernels alike.
    if (!ty) return "dtype " + plugin::dtype_name(val.dtype());
    // A bfloat16 matmul or convolution on the CPU stays with ATen: called from a group (its result
    // into the group's buffer) ATen's bf16 addmm took 0.59 ms where the same call eagerly took 0.42
    // (mlp's [256,784] x [784,512]), and mlp's and cnn's autocast steps got slower than eager's.
    if (*ty == Ty::bf16 && is_extern && !cuda) return "a bf16 extern op on the CPU (ATen's runs it faster eagerly)";
    return "";
  };
  for (int64_t v : n.inputs())
    if (auto w = check_value(v); !w.empty()) return w;
  for (int64_t v : n.outputs())
    if (auto w = check_value(v); !w.empty()) return w;
  if (n.outputs().empty()) return "no results";
  if (op->float_result && !is_float(*ty_of(g.value(n.outputs()[0]).dtype()))) return "integer arithmetic";
  if (std::string why = op->claim(g, n); !why.empty()) return why;
  if (op->nonempty_inputs)
    for (int64_t v : n.inputs())
      if (g.value(v).numel() == 0) return "empty input";
  if (op->numeric_scalar && !is_number(n.arg(1))) return "non-numeric scalar";
  return "";
}

std::optional<Target> target_of(const Graph& g, const Node& n) {
  std::optional<Target> t;
  auto see = [&](int64_t v) {
    if (v < 0) return true;
    const int32_t type = g.value(v).device().device_type;
    const std::optional<Target> here = type == kDLCPU    ? std::optional<Target>(Target::Cpu)
                                       : type == kDLCUDA ? std::optional<Target>(Target::Cuda)
                                                         : std::nullopt;
    if (!here || (t && *t != *here)) return false;
    t = here;
    return true;
  };
  for (int64_t v : n.inputs())
    if (!see(v)) return std::nullopt;
  for (int64_t v : n.outputs())
    if (!see(v)) return std::nullopt;
  return t;
}

bool is_view_op(const std::string& op) {
  const OpEntry* e = find_op(op);
  return e && e->kind == OpKind::View;
}

bool is_extern_op(const std::string& op) {
  const OpEntry* e = find_op(op);
  return e && e->kind == OpKind::Extern;
}

bool is_extern_node(const Graph& g, const Node& n, Target target) {
  const OpEntry* e = find_op(n.op());
  return e && e->kind == OpKind::Extern && !generated_on_cuda(*e, g, n, target);
}

std::unique_ptr<LoweredGraph> lower(const Graph& g, const LoweringOptions& opts) {
  // The loaders capture the LoweredGraph's address: it lives on the heap and never moves.
  auto out = std::make_unique<LoweredGraph>();
  LoweredGraph* L = out.get();
  L->values.resize(g.num_values());
  L->num_inputs = g.inputs().size();
  L->num_outputs = g.outputs().size();
  for (size_t v = 0; v < g.num_values(); ++v) {
    const auto val = g.value(static_cast<int64_t>(v));
    auto ty = ty_of(val.dtype());
    if (!ty) throw Unimplemented("value " + std::to_string(val.id()) + " has dtype " + plugin::dtype_name(val.dtype()));
    ValueInfo& info = L->values[v];
    info.ty = *ty;
    info.shape = val.shape();
    info.strides = val.strides();
    info.storage_offset = val.raw()->storage_offset;
    info.order = -1;
  }
  for (int64_t in : g.inputs()) {
    ValueInfo& info = L->values[static_cast<size_t>(in)];
    info.kind = ValueInfo::Kind::Input;
    info.materialized = true;
  }
  Lowerer lowerer(g, L, opts.target == Target::Cuda);
  for (size_t i = 0; i < g.num_nodes(); ++i) {
    Node n = g.node(static_cast<int64_t>(i));
    std::string why = why_not_claimed(g, n, opts);
    if (!why.empty()) throw Unimplemented(n.op() + ": " + why);
    for (int64_t v : n.inputs()) L->values[static_cast<size_t>(v)].users++;
    const OpEntry& op = *find_op(n.op());
    int64_t into = -1;  // the matmul this node folded into
    if (opts.gemms) {
      auto f = opts.gemms->folded_into.find(n.index());
      if (f != opts.gemms->folded_into.end()) into = f->second;
    }
    if (into >= 0) {
      // Computed by the matmul it folded into: its results are that matmul's.
      for (int64_t v : n.outputs()) {
        ValueInfo& info = L->values[static_cast<size_t>(v)];
        info.kind = ValueInfo::Kind::Extern;
        info.ext.node = static_cast<int>(into);
        info.materialized = true;
      }
    } else {
      (generated_on_cuda(op, g, n, opts.target) ? op.cuda_lower : op.lower)(lowerer, n);
    }
    for (int64_t v : n.outputs()) L->values[static_cast<size_t>(v)].order = lowerer.next_order();
  }
  if (opts.gemms) {
    for (const auto& [node, f] : opts.gemms->gemms) L->extern_inputs[static_cast<int>(node)] = f.inputs();
    for (int64_t v : opts.gemms->dead) {
      ValueInfo& info = L->values[static_cast<size_t>(v)];
      info.dead = true;
      info.materialized = false;
    }
  }
  materialize(g, L);
  return out;
}

}  // namespace kiln::inductor
