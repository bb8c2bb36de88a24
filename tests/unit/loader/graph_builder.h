// Builds KilnGraphView graphs by hand for tests that drive plugins through the ABI before the
// pipeline exists. Owns every array the view points into; the view lives as long as the builder.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "kiln/plugin_api.h"

namespace kiln::test {

class GraphBuilder {
 public:
  static DLDataType f32() { return DLDataType{kDLFloat, 32, 1}; }
  static DLDataType f64() { return DLDataType{kDLFloat, 64, 1}; }

  // A new contiguous CPU tensor value; returns its index.
  int64_t value(std::vector<int64_t> shape, DLDataType dtype = f32()) {
    shapes_.push_back(std::move(shape));
    KilnValue v{};
    v.struct_size = KILN_VALUE_STRUCT_SIZE;
    v.id = 100 + static_cast<int64_t>(values_.size());
    v.dtype = dtype;
    v.ndim = static_cast<int32_t>(shapes_.back().size());
    v.device = DLDevice{kDLCPU, 0};
    v.shape = shapes_.back().data();
    v.strides = nullptr;
    values_.push_back(v);
    value_ptrs_.push_back(&values_.back());
    return static_cast<int64_t>(values_.size() - 1);
  }

  static KilnArg arg(KilnArgTag tag, const char* name) {
    KilnArg a{};
    a.runtime_scalar = -1;
    a.struct_size = KILN_ARG_STRUCT_SIZE;
    a.tag = tag;
    a.name = name;
    return a;
  }
  static KilnArg tensor(const char* name, int64_t value_index) {
    KilnArg a = arg(KILN_ARG_TENSOR, name);
    a.i = value_index;
    return a;
  }
  static KilnArg integer(const char* name, int64_t v) {
    KilnArg a = arg(KILN_ARG_INT, name);
    a.i = v;
    return a;
  }
  static KilnArg number(const char* name, double v) {
    KilnArg a = arg(KILN_ARG_DOUBLE, name);
    a.d = v;
    return a;
  }

  // A node `op` ("aten::add.Tensor") with every schema argument; its tensor inputs are taken from
  // the TENSOR arguments. Returns the node index.
  int64_t node(const std::string& op, std::vector<KilnArg> args, std::vector<int64_t> outputs) {
    strings_.push_back(op);
    const std::string& full = strings_.back();
    auto dot = full.find('.');
    strings_.push_back(full.substr(0, dot));
    const std::string& name = strings_.back();
    strings_.push_back(dot == std::string::npos ? "" : full.substr(dot + 1));
    const std::string& overload = strings_.back();
    arg_store_.push_back(std::move(args));
    std::vector<const KilnArg*> ptrs;
    std::vector<int64_t> inputs;
    for (const auto& a : arg_store_.back()) {
      ptrs.push_back(&a);
      if (a.tag == KILN_ARG_TENSOR) inputs.push_back(a.i);
    }
    arg_ptrs_.push_back(std::move(ptrs));
    index_lists_.push_back(std::move(inputs));
    const auto& in = index_lists_.back();
    index_lists_.push_back(std::move(outputs));
    const auto& out = index_lists_.back();
    KilnNode n{};
    n.struct_size = KILN_NODE_STRUCT_SIZE;
    n.id = 1000 + static_cast<int64_t>(nodes_.size());
    n.op = full.c_str();
    n.name = name.c_str();
    n.overload = overload.c_str();
    n.num_args = arg_ptrs_.back().size();
    n.args = arg_ptrs_.back().data();
    n.num_inputs = in.size();
    n.inputs = in.data();
    n.num_outputs = out.size();
    n.outputs = out.data();
    nodes_.push_back(n);
    node_ptrs_.push_back(&nodes_.back());
    return static_cast<int64_t>(nodes_.size() - 1);
  }

  void inputs(std::vector<int64_t> v) { inputs_ = std::move(v); }
  void outputs(std::vector<int64_t> v) { outputs_ = std::move(v); }

  const KilnGraphView* view() {
    view_ = KilnGraphView{};
    view_.struct_size = KILN_GRAPH_VIEW_STRUCT_SIZE;
    view_.num_values = value_ptrs_.size();
    view_.values = value_ptrs_.data();
    view_.num_nodes = node_ptrs_.size();
    view_.nodes = node_ptrs_.data();
    view_.num_inputs = inputs_.size();
    view_.inputs = inputs_.data();
    view_.num_outputs = outputs_.size();
    view_.outputs = outputs_.data();
    return &view_;
  }

 private:
  std::deque<std::vector<int64_t>> shapes_;
  std::deque<KilnValue> values_;
  std::vector<const KilnValue*> value_ptrs_;
  std::deque<std::string> strings_;
  std::deque<std::vector<KilnArg>> arg_store_;
  std::deque<std::vector<const KilnArg*>> arg_ptrs_;
  std::deque<std::vector<int64_t>> index_lists_;
  std::deque<KilnNode> nodes_;
  std::vector<const KilnNode*> node_ptrs_;
  std::vector<int64_t> inputs_, outputs_;
  KilnGraphView view_{};
};

}  // namespace kiln::test
