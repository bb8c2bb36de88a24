#include <deque>
#include <unordered_map>

#include <ATen/core/dispatch/Dispatcher.h>

#include "kiln/internal/op_info.h"
#include "kiln/internal/partition.h"

namespace kiln {

DLDataType to_dl_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return {kDLFloat, 32, 1};
    case c10::ScalarType::Double: return {kDLFloat, 64, 1};
    case c10::ScalarType::Half: return {kDLFloat, 16, 1};
    case c10::ScalarType::BFloat16: return {kDLBfloat, 16, 1};
    case c10::ScalarType::Long: return {kDLInt, 64, 1};
    case c10::ScalarType::Int: return {kDLInt, 32, 1};
    case c10::ScalarType::Short: return {kDLInt, 16, 1};
    case c10::ScalarType::Char: return {kDLInt, 8, 1};
    case c10::ScalarType::Byte: return {kDLUInt, 8, 1};
    case c10::ScalarType::Bool: return {KILN_DL_BOOL, 8, 1};
    case c10::ScalarType::ComplexFloat: return {kDLComplex, 64, 1};
    case c10::ScalarType::ComplexDouble: return {kDLComplex, 128, 1};
    default: return {kDLOpaqueHandle, static_cast<uint8_t>(c10::elementSize(t) * 8), 1};
  }
}

DLDevice to_dl_device(const c10::Device& d) {
  if (d.is_cuda()) return {kDLCUDA, d.has_index() ? d.index() : 0};
  return {kDLCPU, 0};
}

DLTensor to_dl_tensor(const at::Tensor& t) {
  DLTensor d{};
  d.data = t.data_ptr();  // already offset by the storage offset
  d.device = to_dl_device(t.device());
  d.ndim = static_cast<int32_t>(t.dim());
  d.dtype = to_dl_dtype(t.scalar_type());
  d.shape = const_cast<int64_t*>(t.sizes().data());
  d.strides = const_cast<int64_t*>(t.strides().data());
  d.byte_offset = 0;
  return d;
}

struct GraphView::Storage {
  // deques: element addresses stay put while we append.
  std::deque<KilnValue> values;
  std::deque<KilnArg> args;
  std::deque<KilnNode> nodes;
  std::deque<std::vector<int64_t>> int_arrays;
  std::deque<std::vector<double>> double_arrays;
  std::deque<std::string> strings;
  std::vector<const KilnValue*> value_ptrs;
  std::vector<const KilnNode*> node_ptrs;
  std::deque<std::vector<const KilnArg*>> arg_ptr_arrays;
  std::vector<int64_t> inputs, outputs;
  std::vector<KilnSizeSymbol> symbols;
  std::vector<KilnSizeSite> sites;

  const int64_t* ints(std::vector<int64_t> v) {
    int_arrays.push_back(std::move(v));
    return int_arrays.back().data();
  }
  const char* str(std::string s) {
    strings.push_back(std::move(s));
    return strings.back().c_str();
  }

  void add_value(const ir::Graph& g, ir::ValueId id) {
    const auto& m = g.value(id).meta;
    KilnValue v{};
    v.struct_size = KILN_VALUE_STRUCT_SIZE;
    v.id = id;
    v.dtype = to_dl_dtype(m.dtype);
    v.ndim = static_cast<int32_t>(m.shape.size());
    v.device = to_dl_device(m.device);
    v.shape = ints(m.shape);
    v.strides = ints(m.strides);
    v.storage_offset = m.storage_offset;
    values.push_back(v);
    value_ptrs.push_back(&values.back());
  }

  // `index_of` maps value ids of the graph to value indices of the view.
  void add_node(const ir::Graph& g, int32_t node_index, const std::unordered_map<ir::ValueId, int64_t>& index_of) {
    const ir::Node& n = g.nodes[node_index];
    const OpInfo& info = op_info(n.op);
    const std::vector<c10::Argument>* params = info.found ? &info.handle->schema().arguments() : nullptr;
    auto idx = [&](ir::ValueId v) -> int64_t { return v == ir::kNoValue ? -1 : index_of.at(v); };
    arg_ptr_arrays.emplace_back();
    auto& arg_ptrs = arg_ptr_arrays.back();
    std::vector<int64_t> node_inputs;
    for (size_t i = 0; i < n.args.size(); ++i) {
      const ir::Arg& a = n.args[i];
      KilnArg k{};
      k.struct_size = KILN_ARG_STRUCT_SIZE;
      k.runtime_scalar = a.scalar_input;
      k.name = str(params && i < params->size() ? (*params)[i].name() : "arg" + std::to_string(i));
      using K = ir::Arg::Kind;
      switch (a.kind) {
        case K::None: k.tag = KILN_ARG_NONE; break;
        case K::Tensor:
          k.tag = KILN_ARG_TENSOR;
          k.i = idx(a.value);
          node_inputs.push_back(k.i);
          break;
        case K::TensorList: {
          k.tag = KILN_ARG_TENSOR_LIST;
          std::vector<int64_t> l;
          for (auto v : a.values) {
            l.push_back(idx(v));
            if (v != ir::kNoValue) node_inputs.push_back(l.back());
          }
          k.len = l.size();
          k.ints = ints(std::move(l));
          break;
        }
        case K::Bool:
          k.tag = KILN_ARG_BOOL;
          k.i = a.i;
          break;
        case K::Int:
          k.tag = KILN_ARG_INT;
          k.i = a.i;
          break;
        case K::Double:
          k.tag = KILN_ARG_DOUBLE;
          k.d = a.d;
          break;
        case K::IntList:
          k.tag = KILN_ARG_INT_LIST;
          k.len = a.ints.size();
          k.ints = ints(a.ints);
          break;
        case K::BoolList:
          k.tag = KILN_ARG_BOOL_LIST;
          k.len = a.ints.size();
          k.ints = ints(a.ints);
          break;
        case K::DoubleList:
          k.tag = KILN_ARG_DOUBLE_LIST;
          k.len = a.doubles.size();
          double_arrays.push_back(a.doubles);
          k.doubles = double_arrays.back().data();
          break;
        case K::String:
          k.tag = KILN_ARG_STRING;
          k.s = str(a.s);
          break;
        case K::ScalarType:
          k.tag = KILN_ARG_SCALAR_TYPE;
          k.dtype = to_dl_dtype(static_cast<c10::ScalarType>(a.i));
          break;
        case K::Device:
          k.tag = KILN_ARG_DEVICE;
          k.device = to_dl_device(c10::Device(a.s));
          break;
        case K::Layout:
          k.tag = KILN_ARG_LAYOUT;
          k.i = a.i;
          break;
        case K::MemoryFormat: {
          // c10::MemoryFormat: Contiguous 0, Preserve 1, ChannelsLast 2, ChannelsLast3d 3.
          k.tag = KILN_ARG_MEMORY_FORMAT;
          k.i = a.i;
          break;
        }
      }
      args.push_back(k);
      arg_ptrs.push_back(&args.back());
    }
    KilnNode kn{};
    kn.struct_size = KILN_NODE_STRUCT_SIZE;
    kn.id = node_index;
    kn.op = str(n.op);
    const auto dot = n.op.find('.', n.op.find("::") + 2);
    kn.name = str(n.op.substr(0, dot));
    kn.overload = str(dot == std::string::npos ? std::string() : n.op.substr(dot + 1));
    kn.num_args = arg_ptrs.size();
    kn.args = arg_ptrs.data();
    kn.num_inputs = node_inputs.size();
    kn.inputs = ints(std::move(node_inputs));
    std::vector<int64_t> outs;
    for (auto v : n.outputs) outs.push_back(idx(v));
    kn.num_outputs = outs.size();
    kn.outputs = ints(std::move(outs));
    nodes.push_back(kn);
    node_ptrs.push_back(&nodes.back());
  }

  void finish(KilnGraphView& view) {
    view.struct_size = KILN_GRAPH_VIEW_STRUCT_SIZE;
    view.num_values = value_ptrs.size();
    view.values = value_ptrs.data();
    view.num_nodes = node_ptrs.size();
    view.nodes = node_ptrs.data();
    view.num_inputs = inputs.size();
    view.inputs = inputs.data();
    view.num_outputs = outputs.size();
    view.outputs = outputs.data();
  }
};

GraphView::GraphView(const ir::Graph& g) : s_(std::make_unique<Storage>()) {
  std::unordered_map<ir::ValueId, int64_t> index_of;
  for (size_t v = 0; v < g.values.size(); ++v) {
    index_of[static_cast<ir::ValueId>(v)] = static_cast<int64_t>(v);
    s_->add_value(g, static_cast<ir::ValueId>(v));
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) s_->add_node(g, static_cast<int32_t>(i), index_of);
  for (const auto& in : g.inputs) s_->inputs.push_back(in.value);
  for (const auto& out : g.outputs) s_->outputs.push_back(out.value);
  s_->finish(view_);
}

GraphView::GraphView(const ir::Graph& g, const std::vector<int32_t>& nodes, const std::vector<ir::ValueId>& inputs,
                     const std::vector<ir::ValueId>& outputs)
    : s_(std::make_unique<Storage>()) {
  std::unordered_map<ir::ValueId, int64_t> index_of;
  auto add = [&](ir::ValueId v) {
    if (index_of.emplace(v, static_cast<int64_t>(s_->value_ptrs.size())).second) s_->add_value(g, v);
  };
  for (auto v : inputs) add(v);
  for (auto n : nodes)
    for (auto v : g.nodes[n].outputs)
      if (v != ir::kNoValue) add(v);
  for (auto n : nodes) s_->add_node(g, n, index_of);
  for (auto v : inputs) s_->inputs.push_back(index_of.at(v));
  for (auto v : outputs) s_->outputs.push_back(index_of.at(v));
  s_->finish(view_);
}

void GraphView::set_symbols(std::vector<KilnSizeSymbol> symbols, std::vector<KilnSizeSite> sites) {
  s_->symbols = std::move(symbols);
  s_->sites = std::move(sites);
  view_.num_symbols = s_->symbols.size();
  view_.symbols = s_->symbols.empty() ? nullptr : s_->symbols.data();
  view_.num_size_sites = s_->sites.size();
  view_.size_sites = s_->sites.empty() ? nullptr : s_->sites.data();
}

GraphView::~GraphView() = default;

}  // namespace kiln
