#include "kiln/ir.h"

#include <stdexcept>
#include <string>

namespace kiln::ir {

int64_t TensorMeta::numel() const {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

bool TensorMeta::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) continue;
    if (strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

bool TensorMeta::operator==(const TensorMeta& o) const {
  return dtype == o.dtype && shape == o.shape && strides == o.strides && storage_offset == o.storage_offset &&
         device == o.device;
}

bool Arg::operator==(const Arg& o) const {
  return kind == o.kind && value == o.value && values == o.values && i == o.i && (d == o.d || (d != d && o.d != o.d)) &&
         ints == o.ints && doubles == o.doubles && s == o.s && is_scalar == o.is_scalar &&
         scalar_input == o.scalar_input;
}

ValueId Graph::add_value(const TensorMeta& meta) {
  Value v;
  v.id = static_cast<ValueId>(values.size());
  v.meta = meta;
  values.push_back(std::move(v));
  return values.back().id;
}

ValueId Graph::add_input(const TensorMeta& meta, InputRole role, std::string name) {
  ValueId id = add_value(meta);
  inputs.push_back({id, role, std::move(name)});
  return id;
}

int32_t Graph::add_node(Node node) {
  const auto index = static_cast<int32_t>(nodes.size());
  for (size_t k = 0; k < node.outputs.size(); ++k) {
    if (node.outputs[k] == kNoValue) continue;
    auto& v = value(node.outputs[k]);
    v.producer = index;
    v.producer_output = static_cast<int32_t>(k);
  }
  nodes.push_back(std::move(node));
  return index;
}

std::vector<ValueId> Graph::node_inputs(const Node& n) {
  std::vector<ValueId> ids;
  for (const auto& a : n.args) {
    if (a.kind == Arg::Kind::Tensor) ids.push_back(a.value);
    else if (a.kind == Arg::Kind::TensorList)
      for (auto v : a.values)
        if (v != kNoValue) ids.push_back(v);
  }
  return ids;
}

void Graph::reindex() {
  for (auto& v : values) v.producer = -1, v.producer_output = 0;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (size_t k = 0; k < nodes[i].outputs.size(); ++k) {
      if (nodes[i].outputs[k] == kNoValue) continue;
      auto& v = value(nodes[i].outputs[k]);
      v.producer = static_cast<int32_t>(i);
      v.producer_output = static_cast<int32_t>(k);
    }
}

void Graph::verify() const {
  std::vector<char> defined(values.size(), 0);
  auto fail = [](const std::string& what) { throw std::logic_error("kiln IR verify: " + what); };
  for (const auto& in : inputs) {
    if (in.value < 0 || static_cast<size_t>(in.value) >= values.size())
      fail("input '" + in.name + "' refers to value %" + std::to_string(in.value) + " out of range");
    if (defined[in.value]) fail("value %" + std::to_string(in.value) + " is a graph input twice");
    defined[in.value] = 1;
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto& n = nodes[i];
    const std::string where = "node " + std::to_string(i) + " (" + n.op + ")";
    for (const auto& a : n.args)
      if (a.scalar_input >= 0 && static_cast<size_t>(a.scalar_input) >= scalar_inputs.size())
        fail(where + " uses run-time scalar $" + std::to_string(a.scalar_input) + ", but the graph declares " +
             std::to_string(scalar_inputs.size()));
    for (auto v : node_inputs(n)) {
      if (v < 0 || static_cast<size_t>(v) >= values.size())
        fail(where + " reads value %" + std::to_string(v) + " out of range");
      if (!defined[v]) fail(where + " reads %" + std::to_string(v) + " before it is defined");
    }
    for (auto v : n.outputs) {
      if (v == kNoValue) continue;
      if (v < 0 || static_cast<size_t>(v) >= values.size())
        fail(where + " defines value %" + std::to_string(v) + " out of range");
      if (defined[v]) fail(where + " defines %" + std::to_string(v) + " a second time");
      defined[v] = 1;
    }
  }
  for (const auto& out : outputs) {
    if (out.value < 0 || static_cast<size_t>(out.value) >= values.size() || !defined[out.value])
      fail("output '" + out.name + "' refers to undefined value %" + std::to_string(out.value));
    if (out.role == OutputRole::WriteBack && (out.target < 0 || static_cast<size_t>(out.target) >= inputs.size()))
      fail("write-back output '" + out.name + "' targets input " + std::to_string(out.target) + " out of range");
  }
}

const char* to_string(InputRole r) {
  switch (r) {
    case InputRole::UserInput: return "input";
    case InputRole::Parameter: return "param";
    case InputRole::Buffer: return "buffer";
    case InputRole::Gradient: return "grad";
    case InputRole::OptimizerState: return "state";
    case InputRole::Constant: return "const";
    case InputRole::Scalar: return "scalar";
  }
  return "?";
}

const char* to_string(OutputRole r) {
  switch (r) {
    case OutputRole::Result: return "result";
    case OutputRole::WriteBack: return "writeback";
    case OutputRole::Gradient: return "grad";
  }
  return "?";
}

const char* to_string(Phase p) {
  switch (p) {
    case Phase::Unknown: return "";
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Optimizer: return "optimizer";
    case Phase::Recompute: return "recompute";
  }
  return "";
}

}  // namespace kiln::ir
