// kiln IR: a whole training step as one graph of ATen operations.
//
// SSA values carry tensor metadata (dtype, shape, strides, storage offset, device). Nodes are
// named by their ATen schema ("aten::addmm", "aten::add.Tensor", "aten::add_.Tensor") and keep
// every argument in schema order, tensors as value references and the rest as constants, so a
// node can always be replayed through the dispatcher's boxed interface. Graph inputs say what
// they are (parameter, gradient, optimizer state, user input, ...), and after functionalization
// graph outputs say which input each one writes back to.
//
// The text form (ir_text.h) round-trips; it is what KILN_DEBUG_DIR dumps and golden tests read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace kiln::ir {

using ValueId = int32_t;
constexpr ValueId kNoValue = -1;

struct TensorMeta {
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  int64_t storage_offset = 0;
  c10::Device device = c10::Device(c10::kCPU);

  int64_t numel() const;
  bool is_contiguous() const;
  bool operator==(const TensorMeta& o) const;
  bool operator!=(const TensorMeta& o) const { return !(*this == o); }
};

struct Value {
  ValueId id = kNoValue;
  TensorMeta meta;
  int32_t producer = -1;  // index of the producing node, -1 for graph inputs
  int32_t producer_output = 0;
  // Before functionalization only: values with the same storage id share memory (views of one
  // another, or one tensor before and after an in-place op). -1 after functionalization.
  int32_t storage = -1;
};

// One argument of a node, in schema order.
struct Arg {
  enum class Kind : uint8_t {
    None,          // an absent optional
    Tensor,        // a value: `value`
    TensorList,    // values: `values` (kNoValue for an absent element of Tensor?[])
    Bool,          // `i` (0 or 1)
    Int,           // `i`  (also SymInt, and integral Scalars)
    Double,        // `d`  (also floating Scalars)
    IntList,       // `ints`
    DoubleList,    // `doubles`
    BoolList,      // `ints` (0 or 1)
    String,        // `s`
    ScalarType,    // `i` holds the c10::ScalarType
    Device,        // `s` holds the device string ("cpu", "cuda:0")
    Layout,        // `i` holds the c10::Layout
    MemoryFormat,  // `i` holds the c10::MemoryFormat
  };
  Kind kind = Kind::None;
  ValueId value = kNoValue;
  std::vector<ValueId> values;
  int64_t i = 0;
  double d = 0.0;
  std::vector<int64_t> ints;
  std::vector<double> doubles;
  std::string s;
  // Whether an Int/Double/Bool came from a `Scalar` parameter (matters when rebuilding IValues).
  bool is_scalar = false;
  // >= 0: this Int/Double/Bool is a run-time scalar, Graph::scalar_inputs[scalar_input], bound
  // on every call (e.g. Adam's bias corrections, which change every step); `i`/`d` hold the value
  // seen at capture. Passes must not fold it or merge nodes on its captured value.
  int32_t scalar_input = -1;

  static Arg none() { return {}; }
  static Arg tensor(ValueId v) {
    Arg a;
    a.kind = Kind::Tensor;
    a.value = v;
    return a;
  }
  static Arg tensor_list(std::vector<ValueId> vs) {
    Arg a;
    a.kind = Kind::TensorList;
    a.values = std::move(vs);
    return a;
  }
  static Arg boolean(bool b) {
    Arg a;
    a.kind = Kind::Bool;
    a.i = b;
    return a;
  }
  static Arg integer(int64_t v) {
    Arg a;
    a.kind = Kind::Int;
    a.i = v;
    return a;
  }
  static Arg real(double v) {
    Arg a;
    a.kind = Kind::Double;
    a.d = v;
    return a;
  }
  static Arg int_list(std::vector<int64_t> v) {
    Arg a;
    a.kind = Kind::IntList;
    a.ints = std::move(v);
    return a;
  }
  static Arg scalar_type(c10::ScalarType t) {
    Arg a;
    a.kind = Kind::ScalarType;
    a.i = static_cast<int64_t>(t);
    return a;
  }

  bool operator==(const Arg& o) const;
  bool operator!=(const Arg& o) const { return !(*this == o); }
};

// Which part of the training step recorded a node. The probe matches optimizer calls only among
// nodes that are not Backward; batch_optimizer works on Optimizer nodes.
enum class Phase : uint8_t {
  Unknown,  // made by a pass, or a graph built by hand
  Forward,
  Backward,   // recorded while autograd ran the backward
  Optimizer,  // after the backward
  Recompute,  // a forward node computed again in the backward (rematerialize: [runtime] activation_memory_budget)
};

struct Node {
  std::string op;         // "aten::add.Tensor": schema name, ".overload" when not empty
  std::vector<Arg> args;  // every argument, in schema order
  // Tensor results, flattened (a Tensor[] result is expanded); kNoValue for an undefined tensor
  // result (e.g. convolution_backward's bias gradient when output_mask says so).
  std::vector<ValueId> outputs;
  bool returns_list = false;  // the schema returns Tensor[] (outputs are its elements)
  Phase phase = Phase::Unknown;
};

// What a graph input is. The step's state lives in these; the compiled step reads them in place.
enum class InputRole : uint8_t {
  UserInput,       // the batch, passed to step()
  Parameter,       // a model parameter (updated in place by the optimizer)
  Buffer,          // a module buffer (e.g. BatchNorm running stats)
  Gradient,        // a parameter's .grad
  OptimizerState,  // momentum, exp_avg, exp_avg_sq, step, ...
  Constant,        // any other tensor the step read (captured by value)
  Scalar,          // a run-time scalar as a 0-dim tensor, filled before every call (lift_runtime_scalars)
};

struct Input {
  ValueId value = kNoValue;
  InputRole role = InputRole::Constant;
  std::string name;  // "model.0.weight", "optimizer.state.3.exp_avg", "input.0"
};

enum class OutputRole : uint8_t {
  Result,     // returned to the user (the loss): result number `target` of the step function
  WriteBack,  // written back into the storage of input `target` (a functionalized mutation)
  Gradient,   // the new .grad of parameter number `target` (the step's parameter order)
};

struct Output {
  ValueId value = kNoValue;
  OutputRole role = OutputRole::Result;
  // Result: the result's index (-1: not returned, e.g. a hand-built graph's only output);
  // WriteBack: index into Graph::inputs; Gradient: the parameter's index.
  int32_t target = -1;
  std::string name;
};

// A scalar argument bound at run time (see Arg::scalar_input).
struct ScalarInput {
  Arg::Kind kind = Arg::Kind::Double;  // Int, Double or Bool
  std::string name;                    // "optimizer.scalar.3"
};

struct Graph {
  std::vector<Value> values;
  std::vector<Node> nodes;
  std::vector<Input> inputs;
  std::vector<Output> outputs;
  std::vector<ScalarInput> scalar_inputs;

  ValueId add_value(const TensorMeta& meta);
  ValueId add_input(const TensorMeta& meta, InputRole role, std::string name);
  // Appends a node and sets its outputs' producer fields.
  int32_t add_node(Node node);
  const Value& value(ValueId id) const { return values.at(static_cast<size_t>(id)); }
  Value& value(ValueId id) { return values.at(static_cast<size_t>(id)); }

  // Every value id a node reads (tensor and tensor-list arguments), in argument order.
  static std::vector<ValueId> node_inputs(const Node& n);
  // Rewrites producer fields from the node list (after passes reorder or remove nodes).
  void reindex();
  // Throws std::logic_error naming the node when a value is used before it is defined, defined
  // twice, or out of range.
  void verify() const;
};

const char* to_string(InputRole r);
const char* to_string(OutputRole r);
const char* to_string(Phase p);  // "" for Unknown

}  // namespace kiln::ir
