// Convolutions on channels-last activations (CUDA).
//
// cuDNN's fastest convolution kernels on recent GPUs work on NHWC data; handed NCHW tensors, ATen
// either runs slower NCHW kernels (the weight gradient) or converts every operand to NHWC and the
// result back inside each call. PyTorch's compiler picks channels-last for graphs with
// convolutions for that reason. This pass does the same with the step's layouts only: no value
// changes, only where its elements sit in memory.
//
//  - Every 2-D convolution's weight is read through `clone(w, memory_format=channels_last)`, made
//    once a step and shared by the forward and the backward. ATen then runs the convolution in
//    NHWC whatever the activation's layout (cudnn_conv_suggest_memory_format: either operand in
//    channels-last), and its results, the forward's output and the backward's input gradient,
//    come out channels-last: the graph says so.
//  - A convolution's input that stays in another layout (the batch, a graph input) is read through
//    one channels-last clone too, shared with the backward: cuDNN would convert it in every call,
//    and the backward would convert its gradient to the input's layout.
//  - The weight gradient comes out channels-last too; a `clone(.., memory_format=contiguous)`
//    after it gives the rest of the step (the optimizer, the .grad the user sees) the layout
//    eager gives it. So does a convolution's result that leaves the step or is read through a view.
//  - The activations around the convolutions (their inputs and outputs, and what element-wise ops
//    and batch norm make of them, forward and backward) are marked channels-last, so that the
//    backend's kernels that produce them write NHWC and cuDNN converts nothing. A value keeps its
//    layout when it is a graph input or output, is read through a view (whose strides derive from
//    it), or is made by an op not known to keep its input's layout.
//
// The layouts only steer speed: a backend reads and writes every value through its strides, and
// an eager op that returns another layout than the graph says still returns the same values.
#include <algorithm>
#include <map>
#include <set>

#include <c10/core/MemoryFormat.h>

#include "kiln/internal/op_info.h"
#include "kiln/internal/passes.h"

namespace kiln {
namespace {

bool floating(c10::ScalarType t) {
  return t == c10::ScalarType::Float || t == c10::ScalarType::Half || t == c10::ScalarType::BFloat16 ||
         t == c10::ScalarType::Double;
}

// NCHW sizes, NHWC order in memory: what at::MemoryFormat::ChannelsLast gives.
std::vector<int64_t> channels_last_strides(const std::vector<int64_t>& s) {
  return c10::get_channels_last_strides_2d(s);
}

bool is_4d(const ir::TensorMeta& m) { return m.shape.size() == 4; }

// Ops whose result has the layout of their same-shaped tensor inputs in ATen (element-wise and
// batch norm), or which this pass knows the result layout of (the convolutions).
bool keeps_layout(const ir::Node& n) {
  static const std::set<std::string> ops = {"aten::relu",
                                            "aten::threshold_backward",
                                            "aten::add.Tensor",
                                            "aten::sub.Tensor",
                                            "aten::mul.Tensor",
                                            "aten::div.Tensor",
                                            "aten::add.Scalar",
                                            "aten::sub.Scalar",
                                            "aten::mul.Scalar",
                                            "aten::div.Scalar",
                                            "aten::neg",
                                            "aten::sigmoid",
                                            "aten::sigmoid_backward",
                                            "aten::tanh",
                                            "aten::tanh_backward",
                                            "aten::silu",
                                            "aten::silu_backward",
                                            "aten::gelu",
                                            "aten::gelu_backward",
                                            "aten::hardtanh",
                                            "aten::hardtanh_backward",
                                            "aten::leaky_relu",
                                            "aten::leaky_relu_backward",
                                            "aten::where.self",
                                            "aten::native_dropout_backward",
                                            "aten::_native_batch_norm_legit_functional",
                                            "aten::native_batch_norm_backward",
                                            "aten::convolution",
                                            "aten::convolution_backward"};
  if (ops.count(n.op)) return true;
  // clone and _to_copy keep the layout unless told another memory format.
  if (n.op == "aten::clone" || n.op == "aten::_to_copy") {
    for (const auto& a : n.args)
      if (a.kind == ir::Arg::Kind::MemoryFormat && a.i != static_cast<int64_t>(c10::MemoryFormat::Preserve))
        return false;
    return true;
  }
  return false;
}

bool is_conv2d(const ir::Graph& g, const ir::Node& n, bool any_device) {
  if (n.op != "aten::convolution" || n.args.size() != 9) return false;
  if (n.args[0].kind != ir::Arg::Kind::Tensor || n.args[1].kind != ir::Arg::Kind::Tensor) return false;
  if (n.args[6].kind != ir::Arg::Kind::Bool || n.args[6].i) return false;  // transposed
  const auto& x = g.value(n.args[0].value).meta;
  const auto& w = g.value(n.args[1].value).meta;
  return is_4d(x) && is_4d(w) && floating(x.dtype) && floating(w.dtype) && (any_device || x.device.is_cuda()) &&
         x.device == w.device;
}

ir::Node clone_node(ir::ValueId from, ir::ValueId to, c10::MemoryFormat format, ir::Phase phase) {
  ir::Node c;
  c.op = "aten::clone";
  c.phase = phase;
  ir::Arg mf;
  mf.kind = ir::Arg::Kind::MemoryFormat;
  mf.i = static_cast<int64_t>(format);
  c.args = {ir::Arg::tensor(from), mf};
  c.outputs = {to};
  return c;
}

}  // namespace

size_t channels_last_convolutions(ir::Graph& g, bool any_device) {
  std::vector<int32_t> convs;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (is_conv2d(g, g.nodes[i], any_device)) convs.push_back(static_cast<int32_t>(i));
  if (convs.empty()) return 0;

  std::vector<char> is_output(g.values.size(), 0), is_input(g.values.size(), 0);
  for (const auto& o : g.outputs) is_output[static_cast<size_t>(o.value)] = 1;
  for (const auto& in : g.inputs) is_input[static_cast<size_t>(in.value)] = 1;

  // New nodes go right before the node at the index they are keyed by.
  std::vector<std::vector<ir::Node>> before(g.nodes.size() + 1);
  std::vector<std::vector<ir::Node>> after(g.nodes.size());
  std::map<ir::ValueId, ir::ValueId> weight_cl;  // weight -> its channels-last clone
  std::vector<ir::ValueId> seeds;
  auto replace_uses = [&](ir::ValueId old_v, ir::ValueId new_v, size_t from_node) {
    for (size_t i = from_node; i < g.nodes.size(); ++i)
      for (auto& a : g.nodes[i].args) {
        if (a.kind == ir::Arg::Kind::Tensor && a.value == old_v) a.value = new_v;
        for (auto& v : a.values)
          if (v == old_v) v = new_v;
      }
    for (auto& o : g.outputs)
      if (o.value == old_v) o.value = new_v;
  };

  for (int32_t ci : convs) {
    ir::Node& n = g.nodes[static_cast<size_t>(ci)];
    const ir::ValueId w = n.args[1].value;
    auto it = weight_cl.find(w);
    if (it == weight_cl.end()) {
      ir::TensorMeta m = g.value(w).meta;
      m.strides = channels_last_strides(m.shape);
      m.storage_offset = 0;
      const ir::ValueId wc = g.add_value(m);
      before[static_cast<size_t>(ci)].push_back(clone_node(w, wc, c10::MemoryFormat::ChannelsLast, n.phase));
      it = weight_cl.emplace(w, wc).first;
    }
    n.args[1].value = it->second;
    seeds.push_back(n.args[0].value);
    seeds.push_back(n.outputs[0]);
  }
  // The backwards of those convolutions (same weight value, not transposed): their weight too.
  std::vector<std::pair<size_t, size_t>> aten_made;  // (node, output) whose layout ATen picks
  for (int32_t ci : convs) aten_made.push_back({static_cast<size_t>(ci), 0});
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    ir::Node& n = g.nodes[i];
    if (n.op != "aten::convolution_backward" || n.args.size() != 11 || n.outputs.size() != 3) continue;
    if (n.args[2].kind != ir::Arg::Kind::Tensor || n.args[7].kind != ir::Arg::Kind::Bool || n.args[7].i) continue;
    auto it = weight_cl.find(n.args[2].value);
    if (it == weight_cl.end()) continue;
    n.args[2].value = it->second;
    seeds.push_back(n.args[0].value);
    seeds.push_back(n.args[1].value);
    aten_made.push_back({i, 0});
    aten_made.push_back({i, 1});
  }

  // Users of every value, for the activations' layouts (views among them).
  std::vector<std::vector<int32_t>> users(g.values.size());
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (auto v : ir::Graph::node_inputs(g.nodes[i])) users[static_cast<size_t>(v)].push_back(static_cast<int32_t>(i));
  auto read_through_view = [&](ir::ValueId v) {
    for (int32_t u : users[static_cast<size_t>(v)])
      if (op_info(g.nodes[static_cast<size_t>(u)].op).is_view) return true;
    return false;
  };
  std::vector<char> marked(g.values.size(), 0);
  auto mark = [&](ir::ValueId v) {
    ir::TensorMeta& m = g.value(v).meta;
    m.strides = channels_last_strides(m.shape);
    m.storage_offset = 0;
    if (static_cast<size_t>(v) >= marked.size()) marked.resize(g.values.size(), 0);
    marked[static_cast<size_t>(v)] = 1;
  };

  // What the convolutions return comes out channels-last from ATen: the graph says so. Where the
  // rest of the step needs eager's layout (a graph output, a view's source, a weight gradient
  // for the optimizer and .grad), a contiguous clone after it gives that.
  size_t clones_after = 0;
  for (const auto& [i, k] : aten_made) {
    const ir::ValueId v = g.nodes[i].outputs[k];
    if (v == ir::kNoValue) continue;
    const ir::TensorMeta& m = g.value(v).meta;
    if (!is_4d(m) || m.storage_offset != 0 || !m.is_contiguous()) continue;
    const bool weight_grad = g.nodes[i].op == "aten::convolution_backward" && k == 1;
    if (weight_grad || is_output[static_cast<size_t>(v)] || read_through_view(v)) {
      const ir::ValueId out = g.add_value(m);
      replace_uses(v, out, i + 1);
      is_output.resize(g.values.size(), 0);
      is_input.resize(g.values.size(), 0);
      std::swap(is_output[static_cast<size_t>(v)], is_output[static_cast<size_t>(out)]);
      after[i].push_back(clone_node(v, out, c10::MemoryFormat::Contiguous, g.nodes[i].phase));
      ++clones_after;
      users.resize(g.values.size());
      users[static_cast<size_t>(v)].clear();  // now read only by the clone
    }
    mark(v);
    if (!weight_grad) seeds.push_back(v);
  }
  users.resize(g.values.size());
  marked.resize(g.values.size(), 0);

  auto eligible = [&](ir::ValueId v) {
    const ir::Value& val = g.value(v);
    const ir::TensorMeta& m = val.meta;
    if (!is_4d(m) || !floating(m.dtype) || m.shape[1] <= 1 || m.shape[2] * m.shape[3] <= 1) return false;
    if (is_input[static_cast<size_t>(v)] || is_output[static_cast<size_t>(v)] || val.producer < 0) return false;
    if (m.storage_offset != 0 || !m.is_contiguous()) return false;
    const ir::Node& p = g.nodes[static_cast<size_t>(val.producer)];
    if (!keeps_layout(p) || p.op == "aten::convolution" || p.op == "aten::convolution_backward") return false;
    // Batch norm's forward and backward: only their first result is an activation.
    if ((p.op == "aten::_native_batch_norm_legit_functional" || p.op == "aten::native_batch_norm_backward") &&
        val.producer_output != 0)
      return false;
    return !read_through_view(v);
  };
  // From the convolutions' operands and results, through element-wise ops and batch norm.
  std::vector<char> visited(g.values.size(), 0);
  while (!seeds.empty()) {
    const ir::ValueId v = seeds.back();
    seeds.pop_back();
    if (v == ir::kNoValue || visited[static_cast<size_t>(v)]) continue;
    if (!marked[static_cast<size_t>(v)]) {
      if (!eligible(v)) continue;
      mark(v);
    }
    visited[static_cast<size_t>(v)] = 1;
    const auto& shape = g.value(v).meta.shape;
    const auto same_shape = [&](ir::ValueId o) { return o != ir::kNoValue && g.value(o).meta.shape == shape; };
    // Its producer's same-shaped inputs, and its element-wise users' results and other inputs.
    const ir::Node& p = g.nodes[static_cast<size_t>(g.value(v).producer)];
    if (p.op != "aten::convolution" && p.op != "aten::convolution_backward")
      for (auto in : ir::Graph::node_inputs(p))
        if (same_shape(in)) seeds.push_back(in);
    for (int32_t u : users[static_cast<size_t>(v)]) {
      const ir::Node& un = g.nodes[static_cast<size_t>(u)];
      if (!keeps_layout(un) || un.op == "aten::convolution" || un.op == "aten::convolution_backward") continue;
      for (auto o : un.outputs)
        if (same_shape(o)) seeds.push_back(o);
      for (auto in : ir::Graph::node_inputs(un))
        if (same_shape(in)) seeds.push_back(in);
    }
  }

  // A convolution's input that stays in another layout (a graph input: the batch; a value read
  // through a view) is read through one channels-last clone, shared by the forward and its
  // backward. cuDNN would convert it in every call; and its backward converts the gradient it
  // is given to the input's layout, then makes the weight gradient in that layout.
  std::map<ir::ValueId, ir::ValueId> input_cl;
  auto input_clone = [&](ir::ValueId x, size_t at, ir::Phase phase) {
    auto it = input_cl.find(x);
    if (it != input_cl.end()) return it->second;
    ir::TensorMeta m = g.value(x).meta;
    m.strides = channels_last_strides(m.shape);
    m.storage_offset = 0;
    const ir::ValueId xc = g.add_value(m);
    before[at].push_back(clone_node(x, xc, c10::MemoryFormat::ChannelsLast, phase));
    return input_cl.emplace(x, xc).first->second;
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    ir::Node& n = g.nodes[i];
    const bool fwd = n.op == "aten::convolution" && std::binary_search(convs.begin(), convs.end(), int32_t(i));
    const bool bwd =
        n.op == "aten::convolution_backward" && n.args.size() == 11 && n.args[2].kind == ir::Arg::Kind::Tensor &&
        std::any_of(weight_cl.begin(), weight_cl.end(), [&](const auto& kv) { return kv.second == n.args[2].value; });
    if (!fwd && !bwd) continue;
    ir::Arg& in = n.args[fwd ? 0 : 1];
    if (in.kind != ir::Arg::Kind::Tensor) continue;
    const ir::TensorMeta& m = g.value(in.value).meta;
    if (m.shape[1] > 1 && m.strides == channels_last_strides(m.shape) && m.storage_offset == 0) continue;
    in.value = input_clone(in.value, i, n.phase);
  }

  std::vector<ir::Node> nodes;
  nodes.reserve(g.nodes.size() + weight_cl.size() + clones_after);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (auto& c : before[i]) nodes.push_back(std::move(c));
    nodes.push_back(std::move(g.nodes[i]));
    for (auto& c : after[i]) nodes.push_back(std::move(c));
  }
  g.nodes = std::move(nodes);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (size_t k = 0; k < g.nodes[i].outputs.size(); ++k)
      if (const ir::ValueId o = g.nodes[i].outputs[k]; o != ir::kNoValue) {
        g.value(o).producer = static_cast<int32_t>(i);
        g.value(o).producer_output = static_cast<int32_t>(k);
      }
  return convs.size();
}

}  // namespace kiln
