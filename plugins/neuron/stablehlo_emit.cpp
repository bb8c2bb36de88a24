#include "stablehlo_emit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "boundary.h"
#include "padding.h"

namespace kiln::neuron {

namespace {

// Matmuls and convolutions in full float32: a PJRT plugin may otherwise round their inputs (XLA's
// GPU compiler uses TF32 for float32 by default, 10-bit mantissas, which moved cnn's and gpt's
// parameters by 9e-3 in 8 steps on the H200), while ATen computes them in float32 here.
constexpr const char* kHighest = ", precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]";

using kiln::plugin::Graph;
using kiln::plugin::Node;
using kiln::plugin::Unimplemented;

// Element-wise ops with one tensor operand: ATen name -> StableHLO op.
const std::map<std::string, std::string>& unary_ops() {
  static const std::map<std::string, std::string> m = {
      {"aten::neg", "stablehlo.negate"},      {"aten::abs", "stablehlo.abs"},
      {"aten::exp", "stablehlo.exponential"}, {"aten::log", "stablehlo.log"},
      {"aten::sqrt", "stablehlo.sqrt"},       {"aten::rsqrt", "stablehlo.rsqrt"},
      {"aten::tanh", "stablehlo.tanh"},       {"aten::sigmoid", "stablehlo.logistic"},
  };
  return m;
}

// Binary ops of two tensors (broadcast to the result's shape) or of a tensor and a Scalar.
const std::map<std::string, std::string>& binary_ops() {
  static const std::map<std::string, std::string> m = {
      {"aten::add.Tensor", "stablehlo.add"},      {"aten::sub.Tensor", "stablehlo.subtract"},
      {"aten::mul.Tensor", "stablehlo.multiply"}, {"aten::div.Tensor", "stablehlo.divide"},
      {"aten::add.Scalar", "stablehlo.add"},      {"aten::sub.Scalar", "stablehlo.subtract"},
      {"aten::mul.Scalar", "stablehlo.multiply"}, {"aten::div.Scalar", "stablehlo.divide"},
      {"aten::maximum", "stablehlo.maximum"},     {"aten::minimum", "stablehlo.minimum"},
  };
  return m;
}

std::string tensor_type(const std::vector<int64_t>& shape, const char* element = "f32") {
  std::string t = "tensor<";
  for (int64_t s : shape) t += std::to_string(s) + "x";
  return t + element + ">";
}

// The StableHLO element type of a value the emitter takes: f32, or i64 (the loss's targets).
const char* element_type(const kiln::plugin::Value& v) {
  if (kiln::plugin::is_float32(v.dtype())) return "f32";
  if (v.dtype().code == kDLInt && v.dtype().bits == 64 && v.dtype().lanes == 1) return "i64";
  throw Unimplemented("a " + kiln::plugin::dtype_name(v.dtype()) + " value; only float32 and int64 are emitted");
}

bool is_int64(const kiln::plugin::Value& v) {
  return v.dtype().code == kDLInt && v.dtype().bits == 64 && v.dtype().lanes == 1;
}

// An f32 literal MLIR reads back to the same float: 9 significant digits, always with an exponent.
std::string f32_literal(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.8e", static_cast<double>(static_cast<float>(v)));
  return buf;
}

class Emitter {
 public:
  Emitter(const Graph& g, const PaddingPlan* pad) : g_(g), pad_(pad) {}

  std::string module() {
    std::ostringstream head;
    const auto ins = g_.inputs(), outs = g_.outputs();
    layout_.inputs.assign(ins.size(), {});
    layout_.outputs.assign(outs.size(), {});
    for (size_t i = 0; i < ins.size(); ++i) {
      const auto v = g_.value(ins[i]);
      const std::string arg = "%arg" + std::to_string(i);
      const char* e = element_type(v);
      // An input dense in another order of its dims is taken as it lies in memory (the dims in
      // storage order) and transposed to the graph's shape: PJRT reads it where it is.
      const auto order = boundary_order(v);
      head << (i ? ", " : "") << arg << ": " << tensor_type(permuted(v.shape(), order), e);
      names_[ins[i]] = arg;
      if (order.empty()) continue;
      layout_.inputs[i] = order;
      std::vector<int64_t> back(order.size());  // the storage dim of each of the graph's dims
      for (size_t k = 0; k < order.size(); ++k) back[static_cast<size_t>(order[k])] = static_cast<int64_t>(k);
      names_[ins[i]] = op("stablehlo.transpose", {arg}, {tensor_type(permuted(v.shape(), order), e)},
                          tensor_type(v.shape(), e), "permutation = " + i64_array(back));
    }
    first_scalar_ = ins.size();
    for (size_t i = 0; i < g_.num_nodes(); ++i) node(g_.node(static_cast<int64_t>(i)));
    // The run-time scalars the nodes read, after the inputs, as rank-0 f32 parameters.
    for (size_t k = 0; k < scalars_.size(); ++k)
      head << (ins.size() + k ? ", " : "") << "%arg" << ins.size() + k << ": tensor<f32>";
    // The size symbols' real values, after them (padding).
    for (size_t k = 0; pad_ && k < pad_->num_symbols; ++k)
      head << (ins.size() + scalars_.size() + k ? ", " : "") << "%size" << k << ": tensor<i64>";
    std::string ret_values, ret_types;
    for (size_t k = 0; k < outs.size(); ++k) {
      auto it = names_.find(outs[k]);
      if (it == names_.end()) throw Unimplemented("output value " + std::to_string(outs[k]) + " is not computed");
      const auto v = g_.value(outs[k]);
      const char* e = element_type(v);
      // An output dense in another order of its dims is returned in that order, PJRT's dense result
      // then being the output's memory as it lies.
      const auto order = boundary_order(v);
      std::string r = it->second;
      if (!order.empty()) {
        layout_.outputs[k] = order;
        r = op("stablehlo.transpose", {r}, {tensor_type(v.shape(), e)}, tensor_type(permuted(v.shape(), order), e),
               "permutation = " + i64_array(order));
      }
      ret_values += (k ? ", " : "") + r;
      ret_types += (k ? ", " : "") + tensor_type(permuted(v.shape(), order), e);
    }
    std::ostringstream m;
    m << "module @kiln_group {\n"
      << "  func.func public @main(" << head.str() << ") -> (" << ret_types << ") {\n"
      << body_.str() << "    \"func.return\"(" << ret_values << ") : (" << ret_types << ") -> ()\n"
      << "  }\n"
      << "}\n";
    return m.str();
  }

  const std::vector<int32_t>& runtime_scalars() const { return scalars_; }
  const BoundaryLayout& layout() const { return layout_; }

 private:
  // The storage order a boundary value is passed in: empty where it is row-major, or where its
  // strides are no permutation of a dense layout (PJRT is then handed its strides, as before).
  static std::vector<int64_t> boundary_order(const kiln::plugin::Value& v) {
    auto order = storage_order(v.shape(), v.strides());
    if (!order || is_row_major(*order)) return {};
    return *order;
  }

  static std::vector<int64_t> permuted(const std::vector<int64_t>& shape, const std::vector<int64_t>& order) {
    if (order.empty()) return shape;
    std::vector<int64_t> p;
    for (int64_t d : order) p.push_back(shape[static_cast<size_t>(d)]);
    return p;
  }

  std::string fresh() { return "%" + std::to_string(next_++); }

  std::string op(const std::string& name, const std::vector<std::string>& args, const std::vector<std::string>& types,
                 const std::string& result_type, const std::string& attrs = "") {
    const std::string r = fresh();
    body_ << "    " << r << " = \"" << name << "\"(";
    for (size_t i = 0; i < args.size(); ++i) body_ << (i ? ", " : "") << args[i];
    body_ << ")" << (attrs.empty() ? "" : " {" + attrs + "}") << " : (";
    for (size_t i = 0; i < types.size(); ++i) body_ << (i ? ", " : "") << types[i];
    body_ << ") -> " << result_type << "\n";
    return r;
  }

  std::string splat(double c, const std::vector<int64_t>& shape) {
    const std::string r = fresh();
    body_ << "    " << r << " = \"stablehlo.constant\"() {value = dense<" << f32_literal(c)
          << "> : " << tensor_type(shape) << "} : () -> " << tensor_type(shape) << "\n";
    return r;
  }

  std::string splat_i64(int64_t c, const std::vector<int64_t>& shape) {
    const std::string r = fresh();
    body_ << "    " << r << " = \"stablehlo.constant\"() {value = dense<" << c << "> : " << tensor_type(shape, "i64")
          << "} : () -> " << tensor_type(shape, "i64") << "\n";
    return r;
  }

  // A Scalar argument as an f32 tensor of `shape`: a constant, or, for a run-time scalar, a rank-0
  // parameter of @main (after the inputs) broadcast, so that one executable serves every value.
  std::string number(const kiln::plugin::Arg& a, const std::vector<int64_t>& shape) {
    const int32_t k = a.runtime_scalar();
    if (k < 0) return splat(a.as_double(), shape);
    auto it = std::find(scalars_.begin(), scalars_.end(), k);
    const size_t pos = static_cast<size_t>(it - scalars_.begin());
    if (it == scalars_.end()) scalars_.push_back(k);
    return op("stablehlo.broadcast_in_dim", {"%arg" + std::to_string(first_scalar_ + pos)}, {"tensor<f32>"},
              tensor_type(shape), "broadcast_dimensions = array<i64>");
  }

  // Value v as a tensor of `shape` (ATen's broadcasting: trailing dims line up, size-1 dims grow).
  std::string broadcast(int64_t v, const std::vector<int64_t>& shape) {
    const auto from = g_.value(v).shape();
    const std::string name = names_.at(v);
    if (from == shape) return name;
    if (from.size() > shape.size()) throw Unimplemented("an operand of more dims than the result");
    const size_t lead = shape.size() - from.size();
    std::string dims = "array<i64";
    for (size_t d = 0; d < from.size(); ++d) {
      if (from[d] != 1 && from[d] != shape[lead + d]) throw Unimplemented("operand shapes that do not broadcast");
      dims += (d ? ", " : ": ") + std::to_string(lead + d);
    }
    dims += ">";
    // A size-1 dim that grows is left out of the mapping, with its operand reshaped without it.
    std::vector<int64_t> kept;
    std::string kept_dims = "array<i64";
    bool first = true;
    for (size_t d = 0; d < from.size(); ++d) {
      if (from[d] == 1 && shape[lead + d] != 1) continue;
      kept.push_back(from[d]);
      kept_dims += (first ? ": " : ", ") + std::to_string(lead + d);
      first = false;
    }
    kept_dims += ">";
    std::string src = name;
    if (kept.size() != from.size()) src = op("stablehlo.reshape", {name}, {tensor_type(from)}, tensor_type(kept));
    return op("stablehlo.broadcast_in_dim", {src}, {tensor_type(kept)}, tensor_type(shape),
              "broadcast_dimensions = " + kept_dims);
  }

  // A node, reading the operands the padding plan masks for it in their place.
  void node(const Node& n) {
    const auto it =
        pad_ ? pad_->masks.find(n.index()) : std::map<int64_t, std::vector<PaddingPlan::Mask>>::const_iterator();
    if (!pad_ || it == pad_->masks.end()) return node_body(n);
    std::vector<std::pair<int64_t, std::string>> saved;
    for (const PaddingPlan::Mask& m : it->second) {
      saved.emplace_back(m.value, names_.at(m.value));
      names_[m.value] = masked(m);
    }
    node_body(n);
    for (const auto& [v, name] : saved) names_[v] = name;
  }

  // A size symbol's real value (a parameter), or an expression of them, as a tensor<i64>.
  std::string size_value(const SizeExpr& e) {
    if (!e.symbolic()) return splat_i64(e.constant, {});
    if (auto it = size_values_.find(e.text()); it != size_values_.end()) return it->second;
    const std::string I = "tensor<i64>";
    std::string r = "%size" + std::to_string(e.factors[0]);
    for (size_t k = 1; k < e.factors.size(); ++k)
      r = op("stablehlo.multiply", {r, "%size" + std::to_string(e.factors[k])}, {I, I}, I);
    if (e.num != 1) r = op("stablehlo.multiply", {splat_i64(e.num, {}), r}, {I, I}, I);
    if (e.den != 1) r = op("stablehlo.divide", {r, splat_i64(e.den, {})}, {I, I}, I);
    if (e.constant) r = op("stablehlo.add", {r, splat_i64(e.constant, {})}, {I, I}, I);
    size_values_[e.text()] = r;
    return r;
  }

  std::string to_f32(const std::string& i64_scalar) {
    return op("stablehlo.convert", {i64_scalar}, {"tensor<i64>"}, "tensor<f32>");
  }

  // Where value v (padded) holds real elements along `dims`: an i1 tensor of its shape, "" when
  // none of those dims is padded. Element i of a dim of factors (outermost first) is real when
  // each factor's digit of i, (i / the buckets inside it) % its bucket, is below its real size.
  std::string real_elements(int64_t v, const std::vector<int64_t>& dims) {
    const auto shape = g_.value(v).shape();
    const std::string I = tensor_type(shape, "i64"), B = tensor_type(shape, "i1");
    std::string valid;
    for (int64_t d : dims) {
      const PaddedDim& pd = pad_->values.at(static_cast<size_t>(v)).at(static_cast<size_t>(d));
      int64_t inner = 1;
      for (size_t j = pd.size(); j-- > 0;) {
        const SubDim& s = pd[j];
        if (s.real.symbolic()) {
          std::string idx = op("stablehlo.iota", {}, {}, I, "iota_dimension = " + std::to_string(d) + " : i64");
          if (inner > 1) idx = op("stablehlo.divide", {idx, splat_i64(inner, shape)}, {I, I}, I);
          if (j > 0) idx = op("stablehlo.remainder", {idx, splat_i64(s.bucket, shape)}, {I, I}, I);
          const std::string lim = op("stablehlo.broadcast_in_dim", {size_value(s.real)}, {"tensor<i64>"}, I,
                                     "broadcast_dimensions = array<i64>");
          const std::string c = op("stablehlo.compare", {idx, lim}, {I, I}, B,
                                   "comparison_direction = #stablehlo<comparison_direction LT>");
          valid = valid.empty() ? c : op("stablehlo.and", {valid, c}, {B, B}, B);
        }
        inner *= s.bucket;
      }
    }
    return valid;
  }

  std::string masked(const PaddingPlan::Mask& m) {
    const std::string x = names_.at(m.value);
    const std::string valid = real_elements(m.value, m.dims);
    if (valid.empty()) return x;
    const auto shape = g_.value(m.value).shape();
    const char* e = element_type(g_.value(m.value));
    std::string fill;
    if (m.integer) fill = splat_i64(m.int_fill, shape);
    else if (std::isinf(m.fill)) fill = splat_bits(m.fill < 0 ? "0xFF800000" : "0x7F800000", shape);
    else fill = splat(m.fill, shape);
    return op("stablehlo.select", {valid, x, fill},
              {tensor_type(shape, "i1"), tensor_type(shape, e), tensor_type(shape, e)}, tensor_type(shape, e));
  }

  // A Scalar argument that follows the sizes (a mean's n, or 1/n), from the real sizes.
  std::string size_scalar(const KilnSizeSite& s, const std::vector<int64_t>& shape) {
    std::string f = to_f32(size_value(SizeExpr::of(s)));
    if (s.reciprocal) f = op("stablehlo.divide", {splat(1.0, {}), f}, {"tensor<f32>", "tensor<f32>"}, "tensor<f32>");
    return op("stablehlo.broadcast_in_dim", {f}, {"tensor<f32>"}, tensor_type(shape),
              "broadcast_dimensions = array<i64>");
  }

  void node_body(const Node& n) {
    const std::string why = why_not_emitted(g_, n);
    if (!why.empty()) throw Unimplemented("node " + std::to_string(n.index()) + " (" + n.op() + "): " + why);
    const std::string o = n.op();
    const int64_t out = n.outputs().at(0);
    const auto shape = out >= 0 ? g_.value(out).shape() : std::vector<int64_t>{};
    const std::string T = tensor_type(shape);
    std::string r;
    if (o == "aten::clone" || o == "aten::alias" || o == "aten::detach") {
      // A clone into any memory format: the same values, and where they lie in memory is the
      // boundary's business (a result that leaves the group is returned in its storage order).
      r = names_.at(n.arg(0).tensor_index());
    } else if (o == "aten::nll_loss_forward") {
      nll_loss_forward(n);
      return;
    } else if (o == "aten::nll_loss_backward") {
      r = nll_loss_backward(n, shape);
    } else if (o == "aten::native_layer_norm") {
      layer_norm(n);
      return;
    } else if (o == "aten::native_layer_norm_backward") {
      layer_norm_backward(n);
      return;
    } else if (o == "aten::split.Tensor") {
      split(n);
      return;
    } else if (o == "aten::_scaled_dot_product_flash_attention_for_cpu") {
      attention(n);
      return;
    } else if (o == "aten::_scaled_dot_product_flash_attention_for_cpu_backward") {
      attention_backward(n);
      return;
    } else if (o == "aten::slice.Tensor") {
      const int64_t x = n.arg(0).tensor_index();
      const auto in = g_.value(x).shape();
      const int64_t rank = static_cast<int64_t>(in.size());
      int64_t d = n.arg(1).as_int();
      d = d < 0 ? d + rank : d;
      const int64_t size = in[static_cast<size_t>(d)];
      auto clamp = [&](const kiln::plugin::Arg& a, int64_t dflt) {
        if (a.is_none()) return dflt;
        int64_t v = a.as_int();
        if (v < 0) v += size;
        return std::min(std::max(v, int64_t{0}), size);
      };
      const int64_t start = clamp(n.arg(2), 0), end = std::max(clamp(n.arg(3), size), start);
      r = slice(names_.at(x), in, d, start, end, n.arg(4).as_int());
    } else if (o == "aten::cat") {
      const auto parts = n.arg(0).as_ints();
      int64_t d = n.arg(1).as_int();
      d = d < 0 ? d + static_cast<int64_t>(shape.size()) : d;
      std::vector<std::string> names, types;
      for (int64_t v : parts) names.push_back(names_.at(v)), types.push_back(tensor_type(g_.value(v).shape()));
      r = op("stablehlo.concatenate", names, types, T, "dimension = " + std::to_string(d) + " : i64");
    } else if (o == "aten::mean.dim") {
      const int64_t x = n.arg(0).tensor_index();
      const auto in = g_.value(x).shape();
      std::vector<int64_t> dims = reduced_dims(n.arg(1), in.size());
      int64_t count = 1;
      for (int64_t d : dims) count *= in[static_cast<size_t>(d)];
      std::vector<int64_t> red;
      const std::string s = reduce(names_.at(x), in, dims, "stablehlo.add", "0.00000000e+00", &red);
      std::string divisor = splat(static_cast<double>(count), red);
      if (pad_) {  // padded dims count their real elements
        std::string c;
        bool padded = false;
        for (int64_t d : dims)
          for (const SubDim& sd : pad_->values.at(static_cast<size_t>(x)).at(static_cast<size_t>(d))) {
            padded = padded || sd.real.symbolic();
            const std::string f = size_value(sd.real);
            c = c.empty() ? f : op("stablehlo.multiply", {c, f}, {"tensor<i64>", "tensor<i64>"}, "tensor<i64>");
          }
        if (padded)
          divisor = op("stablehlo.broadcast_in_dim", {to_f32(c)}, {"tensor<f32>"}, tensor_type(red),
                       "broadcast_dimensions = array<i64>");
      }
      const std::string m =
          op("stablehlo.divide", {s, divisor}, {tensor_type(red), tensor_type(red)}, tensor_type(red));
      r = red == shape ? m : op("stablehlo.reshape", {m}, {tensor_type(red)}, T);
    } else if (o == "aten::gelu" || o == "aten::gelu_backward") {
      r = gelu(n, shape, o == "aten::gelu_backward");
    } else if (o == "aten::convolution") {
      r = convolution(n, shape);
    } else if (o == "aten::convolution_backward") {
      convolution_backward(n);
      return;
    } else if (o == "aten::_native_batch_norm_legit_functional") {
      batch_norm(n);
      return;
    } else if (o == "aten::native_batch_norm_backward") {
      batch_norm_backward(n);
      return;
    } else if (o == "aten::add.Scalar" && is_int64(g_.value(out))) {
      // A counter (batch norm's num_batches_tracked): int64 + other * alpha.
      const std::string I = tensor_type(shape, "i64");
      const int64_t add = static_cast<int64_t>(n.arg(1).as_double()) * static_cast<int64_t>(n.arg(2).as_double());
      r = op("stablehlo.add", {names_.at(n.arg(0).tensor_index()), splat_i64(add, shape)}, {I, I}, I);
    } else if (o == "aten::embedding") {
      r = embedding(n, shape);
    } else if (o == "aten::embedding_dense_backward") {
      r = embedding_backward(n, shape);
    } else if (o == "aten::addcmul" || o == "aten::addcdiv") {
      // self + value * tensor1 * tensor2 (or / tensor2), in the order ATen's CPU kernel computes it.
      const std::string v =
          op("stablehlo.multiply", {number(n.arg(3), shape), broadcast(n.arg(1).tensor_index(), shape)}, {T, T}, T);
      const std::string q = op(o == "aten::addcmul" ? "stablehlo.multiply" : "stablehlo.divide",
                               {v, broadcast(n.arg(2).tensor_index(), shape)}, {T, T}, T);
      r = op("stablehlo.add", {broadcast(n.arg(0).tensor_index(), shape), q}, {T, T}, T);
    } else if (auto u = unary_ops().find(o); u != unary_ops().end()) {
      r = op(u->second, {broadcast(n.arg(0).tensor_index(), shape)}, {T}, T);
    } else if (o == "aten::relu") {
      r = op("stablehlo.maximum", {broadcast(n.arg(0).tensor_index(), shape), splat(0.0, shape)}, {T, T}, T);
    } else if (o == "aten::threshold_backward") {
      // grad where self > threshold, else 0.
      const std::string x = broadcast(n.arg(1).tensor_index(), shape);
      const std::string p =
          op("stablehlo.compare", {x, splat(n.arg(2).as_double(), shape)}, {T, T}, "tensor<" + dims_of(shape) + "i1>",
             "comparison_direction = #stablehlo<comparison_direction GT>");
      r = op("stablehlo.select", {p, broadcast(n.arg(0).tensor_index(), shape), splat(0.0, shape)},
             {"tensor<" + dims_of(shape) + "i1>", T, T}, T);
    } else if (o == "aten::mm" || o == "aten::bmm" || o == "aten::addmm") {
      r = matmul(n, shape);
    } else if (o == "aten::t" || o == "aten::permute" || o == "aten::transpose.int") {
      const int64_t x = n.arg(0).tensor_index();
      const auto in = g_.value(x).shape();
      const int64_t rank = static_cast<int64_t>(in.size());
      std::vector<int64_t> perm(in.size());
      for (size_t d = 0; d < perm.size(); ++d) perm[d] = static_cast<int64_t>(d);
      if (o == "aten::permute") {
        perm = n.arg(1).as_ints();
        for (auto& d : perm) d = d < 0 ? d + rank : d;
      } else if (o == "aten::transpose.int") {
        int64_t a = n.arg(1).as_int(), b = n.arg(2).as_int();
        std::swap(perm[static_cast<size_t>(a < 0 ? a + rank : a)], perm[static_cast<size_t>(b < 0 ? b + rank : b)]);
      } else if (rank == 2) {
        std::swap(perm[0], perm[1]);
      }
      r = op("stablehlo.transpose", {names_.at(x)}, {tensor_type(in)}, T, "permutation = " + i64_array(perm));
    } else if (o == "aten::view" || o == "aten::_unsafe_view" || o == "aten::reshape") {
      const int64_t x = n.arg(0).tensor_index();
      const char* e = element_type(g_.value(x));  // f32, or int64 targets reshaped for the loss
      r = op("stablehlo.reshape", {names_.at(x)}, {tensor_type(g_.value(x).shape(), e)}, tensor_type(shape, e));
    } else if (o == "aten::expand") {
      r = broadcast(n.arg(0).tensor_index(), shape);
    } else if (o == "aten::sum" || o == "aten::sum.dim_IntList") {
      r = sum(n, shape);
    } else if (o == "aten::max_pool2d_with_indices") {
      max_pool(n);
      return;
    } else if (o == "aten::max_pool2d_with_indices_backward") {
      r = max_pool_backward(n, shape);
    } else if (o == "aten::_softmax" || o == "aten::_softmax_backward_data") {
      r = softmax(n, shape, o == "aten::_softmax_backward_data");
    } else if (o == "aten::_log_softmax" || o == "aten::_log_softmax_backward_data") {
      r = log_softmax(n, shape, o == "aten::_log_softmax_backward_data");
    } else {
      const std::string& hlo = binary_ops().at(o);
      const std::string a = broadcast(n.arg(0).tensor_index(), shape);
      std::string b;
      if (n.arg(1).is_tensor()) b = broadcast(n.arg(1).tensor_index(), shape);
      else if (auto site = pad_ ? pad_->scalar_sites.find({n.index(), 1}) : decltype(pad_->scalar_sites.end()){};
               pad_ && site != pad_->scalar_sites.end())
        b = size_scalar(site->second, shape);
      else b = number(n.arg(1), shape);
      // add/sub: other * alpha first, as ATen does.
      if (auto alpha = n.find_arg("alpha"); alpha && (o == "aten::add.Tensor" || o == "aten::sub.Tensor" ||
                                                      o == "aten::add.Scalar" || o == "aten::sub.Scalar")) {
        if (alpha->runtime_scalar() >= 0 || alpha->as_double() != 1.0)
          b = op("stablehlo.multiply", {b, number(*alpha, shape)}, {T, T}, T);
      }
      r = op(hlo, {a, b}, {T, T}, T);
    }
    names_[out] = r;
  }

  static std::string i64_array(const std::vector<int64_t>& v) {
    std::string a = "array<i64";
    for (size_t i = 0; i < v.size(); ++i) a += (i ? ", " : ": ") + std::to_string(v[i]);
    return a + ">";
  }

  static std::string int_list(const std::vector<int64_t>& v) {
    std::string a = "[";
    for (size_t i = 0; i < v.size(); ++i) a += (i ? ", " : "") + std::to_string(v[i]);
    return a + "]";
  }

  // mm, bmm (contracting the last dim of a with the one before last of b, bmm's batch dim 0), and
  // addmm as beta * bias + alpha * (a @ b), as ATen computes it.
  std::string matmul(const Node& n, const std::vector<int64_t>& shape) {
    const std::string o = n.op();
    const size_t first = o == "aten::addmm" ? 1 : 0;
    const int64_t a = n.arg(first).tensor_index(), b = n.arg(first + 1).tensor_index();
    const auto as = g_.value(a).shape(), bs = g_.value(b).shape();
    const bool batched = o == "aten::bmm";
    const std::string dims = batched
                                 ? "#stablehlo.dot<lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], "
                                   "lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]>"
                                 : "#stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>";
    const std::string T = tensor_type(shape);
    std::string r = op("stablehlo.dot_general", {names_.at(a), names_.at(b)}, {tensor_type(as), tensor_type(bs)}, T,
                       "dot_dimension_numbers = " + dims + kHighest);
    if (o != "aten::addmm") return r;
    const double beta = n.arg(3).as_double(), alpha = n.arg(4).as_double();
    if (alpha != 1.0) r = op("stablehlo.multiply", {r, splat(alpha, shape)}, {T, T}, T);
    if (beta == 0.0) return r;  // ATen ignores the bias then (NaN in it included)
    std::string bias = broadcast(n.arg(0).tensor_index(), shape);
    if (beta != 1.0) bias = op("stablehlo.multiply", {bias, splat(beta, shape)}, {T, T}, T);
    return op("stablehlo.add", {bias, r}, {T, T}, T);
  }

  // `x` (of shape `in`) reduced over `dims` (sorted) with `combine` ("stablehlo.add",
  // "stablehlo.maximum") from `init` (an f32 literal); the result has the other dims, in order.
  std::string reduce(const std::string& x, const std::vector<int64_t>& in, const std::vector<int64_t>& dims,
                     const std::string& combine, const std::string& init, std::vector<int64_t>* out_shape) {
    std::vector<int64_t> reduced;
    for (size_t d = 0; d < in.size(); ++d)
      if (!std::binary_search(dims.begin(), dims.end(), static_cast<int64_t>(d))) reduced.push_back(in[d]);
    const std::string start = fresh();
    body_ << "    " << start << " = \"stablehlo.constant\"() {value = dense<" << init << "> : tensor<f32>} : () -> "
          << "tensor<f32>\n";
    const std::string r = fresh();
    body_ << "    " << r << " = \"stablehlo.reduce\"(" << x << ", " << start << ") ({\n"
          << "    ^bb0(%lhs: tensor<f32>, %rhs: tensor<f32>):\n"
          << "      %acc = \"" << combine << "\"(%lhs, %rhs) : (tensor<f32>, tensor<f32>) -> tensor<f32>\n"
          << "      \"stablehlo.return\"(%acc) : (tensor<f32>) -> ()\n"
          << "    }) {dimensions = " << i64_array(dims) << "} : (" << tensor_type(in) << ", tensor<f32>) -> "
          << tensor_type(reduced) << "\n";
    *out_shape = reduced;
    return r;
  }

  // A reduction's result (the dims of `full` but `d`) broadcast back along dim `d`.
  std::string spread(const std::string& r, const std::vector<int64_t>& full, int64_t d) {
    std::vector<int64_t> kept_dims, kept;
    for (size_t k = 0; k < full.size(); ++k)
      if (static_cast<int64_t>(k) != d) kept_dims.push_back(static_cast<int64_t>(k)), kept.push_back(full[k]);
    return op("stablehlo.broadcast_in_dim", {r}, {tensor_type(kept)}, tensor_type(full),
              "broadcast_dimensions = " + i64_array(kept_dims));
  }

  // A float32 sum over some dims (all for aten::sum); kept size-1 dims come back by a reshape to
  // the result's own shape.
  std::string sum(const Node& n, const std::vector<int64_t>& shape) {
    const int64_t x = n.arg(0).tensor_index();
    const auto in = g_.value(x).shape();
    const int64_t rank = static_cast<int64_t>(in.size());
    std::vector<int64_t> dims;
    if (n.op() == "aten::sum.dim_IntList" && !n.arg(1).is_none() && !n.arg(1).as_ints().empty()) {
      for (int64_t d : n.arg(1).as_ints()) dims.push_back(d < 0 ? d + rank : d);
    } else {
      for (int64_t d = 0; d < rank; ++d) dims.push_back(d);
    }
    std::sort(dims.begin(), dims.end());
    dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
    std::vector<int64_t> reduced;
    const std::string r = reduce(names_.at(x), in, dims, "stablehlo.add", "0.00000000e+00", &reduced);
    if (reduced == shape) return r;
    return op("stablehlo.reshape", {r}, {tensor_type(reduced)}, tensor_type(shape));
  }

  // log_softmax as ATen's CPU kernel computes it: x - max - log(sum(exp(x - max))); its backward
  // grad - exp(output) * sum(grad).
  std::string log_softmax(const Node& n, const std::vector<int64_t>& shape, bool backward) {
    const int64_t rank = static_cast<int64_t>(shape.size());
    int64_t d = backward ? n.arg(2).as_int() : n.arg(1).as_int();
    d = d < 0 ? d + rank : d;
    const std::string T = tensor_type(shape);
    std::vector<int64_t> red;
    if (backward) {
      const std::string grad = names_.at(n.arg(0).tensor_index()), out = names_.at(n.arg(1).tensor_index());
      const std::string s = spread(reduce(grad, shape, {d}, "stablehlo.add", "0.00000000e+00", &red), shape, d);
      const std::string p = op("stablehlo.exponential", {out}, {T}, T);
      return op("stablehlo.subtract", {grad, op("stablehlo.multiply", {p, s}, {T, T}, T)}, {T, T}, T);
    }
    const std::string x = names_.at(n.arg(0).tensor_index());
    const std::string m = spread(reduce(x, shape, {d}, "stablehlo.maximum", "0xFF800000", &red), shape, d);
    const std::string shifted = op("stablehlo.subtract", {x, m}, {T, T}, T);
    const std::string e = op("stablehlo.exponential", {shifted}, {T}, T);
    const std::string sr = reduce(e, shape, {d}, "stablehlo.add", "0.00000000e+00", &red);
    const std::string l = spread(op("stablehlo.log", {sr}, {tensor_type(red)}, tensor_type(red)), shape, d);
    return op("stablehlo.subtract", {shifted, l}, {T, T}, T);
  }

  // nll_loss over [N, C] log-probabilities and int64 targets [N], as ATen's CPU kernel computes it:
  // the row's target column picked by comparing an iota of class indices with the target (a one-hot
  // select, summed over the classes: exact, one non-zero per row), rows whose target is ignore_index
  // contributing nothing. Per row -x[i, t_i] * w[t_i]; reduction none returns those (total_weight
  // 0), sum their sum, mean their sum over total_weight, the sum of the rows' weights (their count
  // without a weight).
  struct Picked {
    std::string hit;     // [N, C] i1: column == target and the row is not ignored
    std::string valid;   // [N] i1: target != ignore_index
    std::string weight;  // [N] f32: w[t_i], 0 for ignored rows
  };
  Picked pick(const Node& n, size_t target_arg, int64_t N, int64_t C) {
    const std::vector<int64_t> nc = {N, C}, nv = {N};
    const int64_t target = n.arg(target_arg).tensor_index();
    const auto w = n.arg(target_arg + 1);
    const int64_t ignore = n.arg(target_arg + 3).as_int();
    const std::string I1 = tensor_type(nc, "i1"), V1 = tensor_type(nv, "i1");
    Picked p;
    const std::string iota = op("stablehlo.iota", {}, {}, tensor_type(nc, "i64"), "iota_dimension = 1 : i64");
    const std::string t = op("stablehlo.broadcast_in_dim", {names_.at(target)}, {tensor_type(nv, "i64")},
                             tensor_type(nc, "i64"), "broadcast_dimensions = array<i64: 0>");
    const std::string eq = op("stablehlo.compare", {iota, t}, {tensor_type(nc, "i64"), tensor_type(nc, "i64")}, I1,
                              "comparison_direction = #stablehlo<comparison_direction EQ>");
    p.valid = op("stablehlo.compare", {names_.at(target), splat_i64(ignore, nv)},
                 {tensor_type(nv, "i64"), tensor_type(nv, "i64")}, V1,
                 "comparison_direction = #stablehlo<comparison_direction NE>");
    const std::string vb =
        op("stablehlo.broadcast_in_dim", {p.valid}, {V1}, I1, "broadcast_dimensions = array<i64: 0>");
    p.hit = op("stablehlo.and", {eq, vb}, {I1, I1}, I1);
    std::string wt;
    if (w.is_none()) {
      wt = splat(1.0, nv);
    } else {
      const std::string wb = op("stablehlo.broadcast_in_dim", {names_.at(w.tensor_index())}, {tensor_type({C})},
                                tensor_type(nc), "broadcast_dimensions = array<i64: 1>");
      const std::string sel =
          op("stablehlo.select", {p.hit, wb, splat(0.0, nc)}, {I1, tensor_type(nc), tensor_type(nc)}, tensor_type(nc));
      std::vector<int64_t> red;
      wt = reduce(sel, nc, {1}, "stablehlo.add", "0.00000000e+00", &red);
    }
    p.weight =
        op("stablehlo.select", {p.valid, wt, splat(0.0, nv)}, {V1, tensor_type(nv), tensor_type(nv)}, tensor_type(nv));
    return p;
  }

  void nll_loss_forward(const Node& n) {
    const int64_t x = n.arg(0).tensor_index();
    const auto in = g_.value(x).shape();
    const int64_t N = in[0], C = in[1];
    const std::vector<int64_t> nc = {N, C}, nv = {N};
    const int64_t reduction = n.arg(3).as_int();
    const Picked p = pick(n, 1, N, C);
    const std::string NC = tensor_type(nc), NV = tensor_type(nv), S = tensor_type({});
    std::vector<int64_t> red;
    const std::string sel =
        op("stablehlo.select", {p.hit, names_.at(x), splat(0.0, nc)}, {tensor_type(nc, "i1"), NC, NC}, NC);
    const std::string xt = reduce(sel, nc, {1}, "stablehlo.add", "0.00000000e+00", &red);
    const std::string per_row =
        op("stablehlo.select",
           {p.valid, op("stablehlo.negate", {op("stablehlo.multiply", {xt, p.weight}, {NV, NV}, NV)}, {NV}, NV),
            splat(0.0, nv)},
           {tensor_type(nv, "i1"), NV, NV}, NV);
    std::string loss, total;
    if (reduction == 0) {
      loss = per_row;
      total = splat(0.0, {});
    } else {
      loss = reduce(per_row, nv, {0}, "stablehlo.add", "0.00000000e+00", &red);
      total = reduce(p.weight, nv, {0}, "stablehlo.add", "0.00000000e+00", &red);
      if (reduction == 1) loss = op("stablehlo.divide", {loss, total}, {S, S}, S);
    }
    names_[n.outputs()[0]] = loss;
    names_[n.outputs()[1]] = total;
  }

  // grad_input: 0 but at [i, t_i] of rows not ignored, where it is w[t_i] * -(grad / total_weight)
  // (mean), w[t_i] * -grad (sum) or -w[t_i] * grad[i] (none).
  std::string nll_loss_backward(const Node& n, const std::vector<int64_t>& shape) {
    const int64_t N = shape[0], C = shape[1];
    const std::vector<int64_t> nc = {N, C}, nv = {N};
    const int64_t reduction = n.arg(4).as_int();
    const Picked p = pick(n, 2, N, C);
    const std::string NC = tensor_type(nc), NV = tensor_type(nv), S = tensor_type({});
    const std::string go = names_.at(n.arg(0).tensor_index());
    std::string g;
    if (reduction == 0) {
      g = go;
    } else {
      std::string s = go;
      if (reduction == 1) s = op("stablehlo.divide", {go, names_.at(n.arg(6).tensor_index())}, {S, S}, S);
      g = op("stablehlo.broadcast_in_dim", {s}, {S}, NV, "broadcast_dimensions = array<i64>");
    }
    const std::string per_row =
        op("stablehlo.multiply", {p.weight, op("stablehlo.negate", {g}, {NV}, NV)}, {NV, NV}, NV);
    const std::string spread_rows =
        op("stablehlo.broadcast_in_dim", {per_row}, {NV}, NC, "broadcast_dimensions = array<i64: 0>");
    return op("stablehlo.select", {p.hit, spread_rows, splat(0.0, nc)}, {tensor_type(nc, "i1"), NC, NC}, NC);
  }

  // The dims a reduction's IntList (or None: all) names, made positive, sorted, without repeats.
  static std::vector<int64_t> reduced_dims(const kiln::plugin::Arg& a, size_t rank) {
    std::vector<int64_t> dims;
    if (!a.is_none()) dims = a.as_ints();
    for (auto& d : dims) d = d < 0 ? d + static_cast<int64_t>(rank) : d;
    if (dims.empty()) {
      for (size_t d = 0; d < rank; ++d) dims.push_back(static_cast<int64_t>(d));
    }
    std::sort(dims.begin(), dims.end());
    dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
    return dims;
  }

  std::string bin(const char* name, const std::string& a, const std::string& b, const std::vector<int64_t>& shape) {
    const std::string T = tensor_type(shape);
    return op(name, {a, b}, {T, T}, T);
  }
  std::string un(const char* name, const std::string& a, const std::vector<int64_t>& shape) {
    const std::string T = tensor_type(shape);
    return op(name, {a}, {T}, T);
  }
  std::string reshape(const std::string& a, const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
    if (from == to) return a;
    return op("stablehlo.reshape", {a}, {tensor_type(from)}, tensor_type(to));
  }
  // `a` of shape `from` placed along `dims` of `to`.
  std::string bcast(const std::string& a, const std::vector<int64_t>& from, const std::vector<int64_t>& to,
                    const std::vector<int64_t>& dims) {
    return op("stablehlo.broadcast_in_dim", {a}, {tensor_type(from)}, tensor_type(to),
              "broadcast_dimensions = " + i64_array(dims));
  }
  static std::vector<int64_t> iota_vec(int64_t from, int64_t to) {
    std::vector<int64_t> v;
    for (int64_t i = from; i < to; ++i) v.push_back(i);
    return v;
  }

  // Elements [start, end) step `step` of dim d.
  std::string slice(const std::string& x, const std::vector<int64_t>& in, int64_t d, int64_t start, int64_t end,
                    int64_t step) {
    std::vector<int64_t> lo(in.size(), 0), hi = in, st(in.size(), 1), out = in;
    lo[static_cast<size_t>(d)] = start;
    hi[static_cast<size_t>(d)] = end;
    st[static_cast<size_t>(d)] = step;
    out[static_cast<size_t>(d)] = (end - start + step - 1) / step;
    return op(
        "stablehlo.slice", {x}, {tensor_type(in)}, tensor_type(out),
        "start_indices = " + i64_array(lo) + ", limit_indices = " + i64_array(hi) + ", strides = " + i64_array(st));
  }

  void split(const Node& n) {
    const int64_t x = n.arg(0).tensor_index();
    const auto in = g_.value(x).shape();
    const int64_t rank = static_cast<int64_t>(in.size());
    int64_t d = n.arg(2).as_int();
    d = d < 0 ? d + rank : d;
    const int64_t size = n.arg(1).as_int(), total = in[static_cast<size_t>(d)];
    const auto outs = n.outputs();
    for (size_t k = 0; k < outs.size(); ++k) {
      const int64_t start = static_cast<int64_t>(k) * size;
      names_[outs[k]] = slice(names_.at(x), in, d, start, std::min(start + size, total), 1);
    }
  }

  // GELU as ATen's CPU kernel computes it, with erf (CHLO's erfc, which XLA and every StableHLO
  // consumer built on it lowers): x * 0.5 * (1 + erf(x / sqrt(2))); its backward
  // dy * (0.5 * (1 + erf(x / sqrt(2))) + x * exp(-x^2 / 2) / sqrt(2 pi)). "tanh": the forward's
  // 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))).
  std::string gelu(const Node& n, const std::vector<int64_t>& shape, bool backward) {
    const std::string x = broadcast(n.arg(backward ? 1 : 0).tensor_index(), shape);
    const std::string approx = n.arg(backward ? 2 : 1).as_string();
    if (approx == "tanh") {
      const double beta = M_SQRT2 * M_2_SQRTPI * 0.5, kappa = 0.044715;
      const std::string cube = bin("stablehlo.multiply", bin("stablehlo.multiply", x, x, shape), x, shape);
      const std::string inner =
          bin("stablehlo.multiply", splat(beta, shape),
              bin("stablehlo.add", x, bin("stablehlo.multiply", splat(kappa, shape), cube, shape), shape), shape);
      const std::string half_x = bin("stablehlo.multiply", splat(0.5, shape), x, shape);
      return bin("stablehlo.multiply", half_x,
                 bin("stablehlo.add", splat(1.0, shape), un("stablehlo.tanh", inner, shape), shape), shape);
    }
    // 1 + erf(x / sqrt(2)) as erfc(-x / sqrt(2)): the same value, without the cancellation that
    // costs 1 + erf(...) its accuracy for negative x (at x = -4 XLA's erf leaves about 1e-5 of the
    // result wrong; erfc keeps its relative accuracy there).
    const std::string one_plus = un("chlo.erfc", bin("stablehlo.multiply", x, splat(-M_SQRT1_2, shape), shape), shape);
    if (!backward)
      return bin("stablehlo.multiply", bin("stablehlo.multiply", x, splat(0.5, shape), shape), one_plus, shape);
    const std::string cdf = bin("stablehlo.multiply", splat(0.5, shape), one_plus, shape);
    const std::string sq = bin("stablehlo.multiply", bin("stablehlo.multiply", x, x, shape), splat(-0.5, shape), shape);
    const std::string pdf = bin("stablehlo.multiply", splat(M_2_SQRTPI * M_SQRT1_2 * 0.5, shape),
                                un("stablehlo.exponential", sq, shape), shape);
    const std::string dy = broadcast(n.arg(0).tensor_index(), shape);
    return bin("stablehlo.multiply", dy, bin("stablehlo.add", cdf, bin("stablehlo.multiply", x, pdf, shape), shape),
               shape);
  }

  // Layer norm over the last k dims: mean, then the variance of the centred values (as ATen's
  // row-wise moments compute them), rstd = 1 / sqrt(var + eps), y = (x * rstd - mean * rstd) * w + b.
  struct Norm {
    std::vector<int64_t> in, batch, norm_dims, batch_dims, stat_shape;
    int64_t count = 1;
  };
  Norm norm_shapes(int64_t x, const kiln::plugin::Arg& normalized_shape) {
    Norm s;
    s.in = g_.value(x).shape();
    const size_t k = normalized_shape.as_ints().size(), rank = s.in.size();
    for (size_t d = 0; d < rank; ++d) {
      if (d + k < rank) {
        s.batch.push_back(s.in[d]);
        s.batch_dims.push_back(static_cast<int64_t>(d));
        s.stat_shape.push_back(s.in[d]);
      } else {
        s.norm_dims.push_back(static_cast<int64_t>(d));
        s.count *= s.in[d];
        s.stat_shape.push_back(1);
      }
    }
    return s;
  }

  void layer_norm(const Node& n) {
    const int64_t x = n.arg(0).tensor_index();
    const Norm s = norm_shapes(x, n.arg(1));
    const std::string X = names_.at(x);
    std::vector<int64_t> red;
    const std::string sum = reduce(X, s.in, s.norm_dims, "stablehlo.add", "0.00000000e+00", &red);
    const std::string mean = bin("stablehlo.divide", sum, splat(static_cast<double>(s.count), s.batch), s.batch);
    const std::string xc = bin("stablehlo.subtract", X, bcast(mean, s.batch, s.in, s.batch_dims), s.in);
    const std::string ss =
        reduce(bin("stablehlo.multiply", xc, xc, s.in), s.in, s.norm_dims, "stablehlo.add", "0.00000000e+00", &red);
    const std::string var = bin("stablehlo.divide", ss, splat(static_cast<double>(s.count), s.batch), s.batch);
    const std::string rstd =
        bin("stablehlo.divide", splat(1.0, s.batch),
            un("stablehlo.sqrt", bin("stablehlo.add", var, splat(n.arg(4).as_double(), s.batch), s.batch), s.batch),
            s.batch);
    const std::string shift = un("stablehlo.negate", bin("stablehlo.multiply", mean, rstd, s.batch), s.batch);
    std::string y = bin("stablehlo.add", bin("stablehlo.multiply", X, bcast(rstd, s.batch, s.in, s.batch_dims), s.in),
                        bcast(shift, s.batch, s.in, s.batch_dims), s.in);
    const std::vector<int64_t> wshape(s.in.end() - static_cast<long>(s.norm_dims.size()), s.in.end());
    if (!n.arg(2).is_none())
      y = bin("stablehlo.multiply", y, bcast(names_.at(n.arg(2).tensor_index()), wshape, s.in, s.norm_dims), s.in);
    if (!n.arg(3).is_none())
      y = bin("stablehlo.add", y, bcast(names_.at(n.arg(3).tensor_index()), wshape, s.in, s.norm_dims), s.in);
    names_[n.outputs()[0]] = y;
    names_[n.outputs()[1]] = reshape(mean, s.batch, s.stat_shape);
    names_[n.outputs()[2]] = reshape(rstd, s.batch, s.stat_shape);
  }

  // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w and xhat = (x - mean) * rstd;
  // dw = sum over the batch of dy * xhat; db = sum over the batch of dy.
  void layer_norm_backward(const Node& n) {
    const int64_t x = n.arg(1).tensor_index();
    const Norm s = norm_shapes(x, n.arg(2));
    const std::string X = names_.at(x), dy = names_.at(n.arg(0).tensor_index());
    const std::string mean =
        bcast(reshape(names_.at(n.arg(3).tensor_index()), s.stat_shape, s.batch), s.batch, s.in, s.batch_dims);
    const std::string rstd =
        bcast(reshape(names_.at(n.arg(4).tensor_index()), s.stat_shape, s.batch), s.batch, s.in, s.batch_dims);
    const std::string xhat = bin("stablehlo.multiply", bin("stablehlo.subtract", X, mean, s.in), rstd, s.in);
    const std::vector<int64_t> wshape(s.in.end() - static_cast<long>(s.norm_dims.size()), s.in.end());
    std::string gw = dy;
    if (!n.arg(5).is_none())
      gw = bin("stablehlo.multiply", dy, bcast(names_.at(n.arg(5).tensor_index()), wshape, s.in, s.norm_dims), s.in);
    std::vector<int64_t> red;
    auto row_mean = [&](const std::string& v) {
      const std::string r = reduce(v, s.in, s.norm_dims, "stablehlo.add", "0.00000000e+00", &red);
      return bcast(bin("stablehlo.divide", r, splat(static_cast<double>(s.count), s.batch), s.batch), s.batch, s.in,
                   s.batch_dims);
    };
    const std::string m1 = row_mean(gw), m2 = row_mean(bin("stablehlo.multiply", gw, xhat, s.in));
    const std::string dx = bin("stablehlo.multiply", rstd,
                               bin("stablehlo.subtract", bin("stablehlo.subtract", gw, m1, s.in),
                                   bin("stablehlo.multiply", xhat, m2, s.in), s.in),
                               s.in);
    const auto outs = n.outputs();
    names_[outs[0]] = dx;
    if (outs.size() > 1 && outs[1] >= 0)
      names_[outs[1]] = reduce(bin("stablehlo.multiply", dy, xhat, s.in), s.in, s.batch_dims, "stablehlo.add",
                               "0.00000000e+00", &red);
    if (outs.size() > 2 && outs[2] >= 0)
      names_[outs[2]] = reduce(dy, s.in, s.batch_dims, "stablehlo.add", "0.00000000e+00", &red);
  }

  // embedding: rows of the weight gathered by the (flattened) int64 indices.
  std::string embedding(const Node& n, const std::vector<int64_t>& shape) {
    const int64_t w = n.arg(0).tensor_index(), idx = n.arg(1).tensor_index();
    const auto ws = g_.value(w).shape(), is = g_.value(idx).shape();
    const int64_t K = g_.value(idx).numel(), D = ws[1];
    const std::string flat =
        op("stablehlo.reshape", {names_.at(idx)}, {tensor_type(is, "i64")}, tensor_type({K}, "i64"));
    const std::string r =
        op("stablehlo.gather", {names_.at(w), flat}, {tensor_type(ws), tensor_type({K}, "i64")}, tensor_type({K, D}),
           "dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = "
           "[0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, " +
               std::to_string(D) + ">");
    return reshape(r, {K, D}, shape);
  }

  // embedding's backward: the gradient's rows added into a zero [num_weights, D] at their indices
  // (scatter with an add region), rows whose index is padding_idx left out.
  std::string embedding_backward(const Node& n, const std::vector<int64_t>& shape) {
    const int64_t gr = n.arg(0).tensor_index(), idx = n.arg(1).tensor_index();
    const auto gs = g_.value(gr).shape(), is = g_.value(idx).shape();
    const int64_t K = g_.value(idx).numel(), D = shape[1];
    const std::string I = tensor_type({K}, "i64");
    const std::string flat = reshape_typed(names_.at(idx), is, {K}, "i64");
    std::string upd = reshape(names_.at(gr), gs, {K, D});
    if (const int64_t pad = n.arg(3).as_int(); pad >= 0) {
      const std::string keep = op("stablehlo.compare", {flat, splat_i64(pad, {K})}, {I, I}, tensor_type({K}, "i1"),
                                  "comparison_direction = #stablehlo<comparison_direction NE>");
      const std::string kb = op("stablehlo.broadcast_in_dim", {keep}, {tensor_type({K}, "i1")},
                                tensor_type({K, D}, "i1"), "broadcast_dimensions = array<i64: 0>");
      upd = op("stablehlo.select", {kb, upd, splat(0.0, {K, D})},
               {tensor_type({K, D}, "i1"), tensor_type({K, D}), tensor_type({K, D})}, tensor_type({K, D}));
    }
    const std::string zero = splat(0.0, shape);
    const std::string r = fresh();
    body_ << "    " << r << " = \"stablehlo.scatter\"(" << zero << ", " << flat << ", " << upd << ") ({\n"
          << "    ^bb0(%lhs: tensor<f32>, %rhs: tensor<f32>):\n"
          << "      %acc = \"stablehlo.add\"(%lhs, %rhs) : (tensor<f32>, tensor<f32>) -> tensor<f32>\n"
          << "      \"stablehlo.return\"(%acc) : (tensor<f32>) -> ()\n"
          << "    }) {indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = "
             "[1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, "
             "unique_indices = false} : ("
          << tensor_type(shape) << ", " << I << ", " << tensor_type({K, D}) << ") -> " << tensor_type(shape) << "\n";
    return r;
  }

  std::string reshape_typed(const std::string& a, const std::vector<int64_t>& from, const std::vector<int64_t>& to,
                            const char* element) {
    if (from == to) return a;
    return op("stablehlo.reshape", {a}, {tensor_type(from, element)}, tensor_type(to, element));
  }

  // q [B, H, L, E] @ k^T as scores [B, H, L, S], scaled, the causal mask's upper triangle -inf.
  std::string scores(const std::string& q, const std::string& k, const std::vector<int64_t>& qs,
                     const std::vector<int64_t>& ks, double scale, bool causal, std::vector<int64_t>* ss) {
    *ss = {qs[0], qs[1], qs[2], ks[2]};
    std::string s = op("stablehlo.dot_general", {q, k}, {tensor_type(qs), tensor_type(ks)}, tensor_type(*ss),
                       "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0, 1], "
                       "rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], "
                       "rhs_contracting_dimensions = [3]>" +
                           std::string(kHighest));
    s = bin("stablehlo.multiply", s, splat(scale, *ss), *ss);
    if (!causal) return s;
    const std::string I = tensor_type(*ss, "i64");
    const std::string row = op("stablehlo.iota", {}, {}, I, "iota_dimension = 2 : i64");
    const std::string col = op("stablehlo.iota", {}, {}, I, "iota_dimension = 3 : i64");
    const std::string above = op("stablehlo.compare", {col, row}, {I, I}, tensor_type(*ss, "i1"),
                                 "comparison_direction = #stablehlo<comparison_direction GT>");
    return op("stablehlo.select", {above, splat_bits("0xFF800000", *ss), s},
              {tensor_type(*ss, "i1"), tensor_type(*ss), tensor_type(*ss)}, tensor_type(*ss));
  }

  std::string splat_bits(const char* bits, const std::vector<int64_t>& shape) {
    const std::string r = fresh();
    body_ << "    " << r << " = \"stablehlo.constant\"() {value = dense<" << bits << "> : " << tensor_type(shape)
          << "} : () -> " << tensor_type(shape) << "\n";
    return r;
  }

  // a [B, H, M, K] x b [B, H, K, N] (contracting a's dim ca with b's dim cb).
  std::string bmm4(const std::string& a, const std::string& b, const std::vector<int64_t>& as,
                   const std::vector<int64_t>& bs, int ca, int cb, const std::vector<int64_t>& out) {
    return op("stablehlo.dot_general", {a, b}, {tensor_type(as), tensor_type(bs)}, tensor_type(out),
              "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = "
              "[0, 1], lhs_contracting_dimensions = [" +
                  std::to_string(ca) + "], rhs_contracting_dimensions = [" + std::to_string(cb) + "]>" + kHighest);
  }

  double attention_scale(const kiln::plugin::Arg& a, int64_t e) {
    return a.is_none() ? 1.0 / std::sqrt(static_cast<double>(e)) : a.as_double();
  }

  // Attention as the math it is (no dropout, no mask but the causal one): softmax(q k^T * scale) v,
  // and logsumexp, the row's max plus the log of its sum of exponentials.
  void attention(const Node& n) {
    const int64_t q = n.arg(0).tensor_index(), k = n.arg(1).tensor_index(), v = n.arg(2).tensor_index();
    const auto qs = g_.value(q).shape(), ks = g_.value(k).shape(), vs = g_.value(v).shape();
    std::vector<int64_t> ss, red;
    const std::string s =
        scores(names_.at(q), names_.at(k), qs, ks, attention_scale(n.arg(6), qs[3]), n.arg(4).as_bool(), &ss);
    const std::string m = reduce(s, ss, {3}, "stablehlo.maximum", "0xFF800000", &red);
    const std::string p = un("stablehlo.exponential", bin("stablehlo.subtract", s, spread(m, ss, 3), ss), ss);
    const std::string l = reduce(p, ss, {3}, "stablehlo.add", "0.00000000e+00", &red);
    const std::vector<int64_t> os = {qs[0], qs[1], qs[2], vs[3]};
    const std::string pv = bmm4(p, names_.at(v), ss, vs, 3, 2, os);
    names_[n.outputs()[0]] = bin("stablehlo.divide", pv, spread(l, os, 3), os);
    names_[n.outputs()[1]] = bin("stablehlo.add", m, un("stablehlo.log", l, red), red);
  }

  // Its backward from logsumexp: P = exp(s - lse); dv = P^T dO; dS = P * (dO v^T - rowsum(dO * O));
  // dq = dS k * scale; dk = dS^T q * scale.
  void attention_backward(const Node& n) {
    const int64_t go = n.arg(0).tensor_index(), q = n.arg(1).tensor_index(), k = n.arg(2).tensor_index(),
                  v = n.arg(3).tensor_index(), o = n.arg(4).tensor_index(), lse = n.arg(5).tensor_index();
    const auto qs = g_.value(q).shape(), ks = g_.value(k).shape(), vs = g_.value(v).shape(), os = g_.value(o).shape();
    const double scale = attention_scale(n.arg(9), qs[3]);
    std::vector<int64_t> ss, red;
    const std::string s = scores(names_.at(q), names_.at(k), qs, ks, scale, n.arg(7).as_bool(), &ss);
    const std::string p =
        un("stablehlo.exponential", bin("stablehlo.subtract", s, spread(names_.at(lse), ss, 3), ss), ss);
    const std::string dv = bmm4(p, names_.at(go), ss, os, 2, 2, vs);
    const std::string dp = bmm4(names_.at(go), names_.at(v), os, vs, 3, 3, ss);
    const std::string dsum = reduce(bin("stablehlo.multiply", names_.at(go), names_.at(o), os), os, {3},
                                    "stablehlo.add", "0.00000000e+00", &red);
    const std::string ds = bin("stablehlo.multiply", p, bin("stablehlo.subtract", dp, spread(dsum, ss, 3), ss), ss);
    const std::string dq = bin("stablehlo.multiply", bmm4(ds, names_.at(k), ss, ks, 3, 2, qs), splat(scale, qs), qs);
    const std::string dk = bin("stablehlo.multiply", bmm4(ds, names_.at(q), ss, qs, 2, 2, ks), splat(scale, ks), ks);
    names_[n.outputs()[0]] = dq;
    names_[n.outputs()[1]] = dk;
    names_[n.outputs()[2]] = dv;
  }

  // "[[lo, hi], ...]" padding of a convolution.
  static std::string padding_attr(const std::vector<std::pair<int64_t, int64_t>>& p) {
    std::string a = "padding = dense<[";
    for (size_t i = 0; i < p.size(); ++i)
      a += (i ? ", [" : "[") + std::to_string(p[i].first) + ", " + std::to_string(p[i].second) + "]";
    return a + "]> : tensor<" + std::to_string(p.size()) + "x2xi64>";
  }

  std::string conv(const std::string& lhs, const std::string& rhs, const std::vector<int64_t>& ls,
                   const std::vector<int64_t>& rs, const std::vector<int64_t>& out, const std::string& dims,
                   const std::vector<int64_t>& strides, const std::vector<std::pair<int64_t, int64_t>>& pad,
                   const std::vector<int64_t>& lhs_dil, const std::vector<int64_t>& rhs_dil, int64_t groups) {
    return op(
        "stablehlo.convolution", {lhs, rhs}, {tensor_type(ls), tensor_type(rs)}, tensor_type(out),
        "batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<" + dims + ">, feature_group_count = " +
            std::to_string(groups) + " : i64, lhs_dilation = " + i64_array(lhs_dil) + ", " + padding_attr(pad) +
            ", precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>], rhs_dilation = " +
            i64_array(rhs_dil) + ", window_strides = " + i64_array(strides));
  }

  static std::string conv_layout(size_t spatial, const char* a, const char* b) {
    std::string s = std::string("[") + a + ", " + b;
    for (size_t i = 0; i < spatial; ++i) s += ", " + std::to_string(i);
    return s + "]";
  }

  // convolution (not transposed) over NC[D]HW with an O I/groups [k] kernel: stablehlo.convolution
  // with the strides, symmetric padding, kernel dilation and feature groups; the bias added along C.
  std::string convolution(const Node& n, const std::vector<int64_t>& shape) {
    const int64_t x = n.arg(0).tensor_index(), w = n.arg(1).tensor_index();
    const auto xs = g_.value(x).shape(), ws = g_.value(w).shape();
    const size_t sp = xs.size() - 2;
    const auto stride = n.arg(3).as_ints(), pad = n.arg(4).as_ints(), dil = n.arg(5).as_ints();
    std::vector<std::pair<int64_t, int64_t>> p;
    for (size_t i = 0; i < sp; ++i) p.emplace_back(pad[i], pad[i]);
    const std::string dims =
        conv_layout(sp, "b", "f") + "x" + conv_layout(sp, "o", "i") + "->" + conv_layout(sp, "b", "f");
    std::string r = conv(names_.at(x), names_.at(w), xs, ws, shape, dims, stride, p, std::vector<int64_t>(sp, 1), dil,
                         n.arg(8).as_int());
    if (n.arg(2).is_none()) return r;
    return bin("stablehlo.add", r, bcast(names_.at(n.arg(2).tensor_index()), {shape[1]}, shape, {1}), shape);
  }

  // convolution_backward (groups 1, not transposed): grad_input is the transposed convolution of
  // the gradient (lhs_dilation = stride) with the spatially reversed kernel, its in and out
  // features swapped; grad_weight a convolution of the input with the gradient over the batch
  // (window_strides = dilation, rhs_dilation = stride); grad_bias the gradient's sum over all but C.
  void convolution_backward(const Node& n) {
    const int64_t go = n.arg(0).tensor_index(), x = n.arg(1).tensor_index(), w = n.arg(2).tensor_index();
    const auto gs = g_.value(go).shape(), xs = g_.value(x).shape(), ws = g_.value(w).shape();
    const size_t sp = xs.size() - 2;
    const auto stride = n.arg(4).as_ints(), pad = n.arg(5).as_ints(), dil = n.arg(6).as_ints();
    const auto outs = n.outputs();
    std::vector<int64_t> sdims, ones(sp, 1);
    for (size_t i = 0; i < sp; ++i) sdims.push_back(static_cast<int64_t>(2 + i));
    if (outs[0] >= 0) {
      std::vector<std::pair<int64_t, int64_t>> p;
      for (size_t i = 0; i < sp; ++i) {
        const int64_t k = ws[2 + i], lo = dil[i] * (k - 1) - pad[i];
        p.emplace_back(lo, xs[2 + i] - 1 - (gs[2 + i] - 1) * stride[i] + pad[i]);
      }
      const std::string flipped = op("stablehlo.reverse", {names_.at(w)}, {tensor_type(ws)}, tensor_type(ws),
                                     "dimensions = " + i64_array(sdims));
      const std::string dims =
          conv_layout(sp, "b", "f") + "x" + conv_layout(sp, "i", "o") + "->" + conv_layout(sp, "b", "f");
      names_[outs[0]] = conv(names_.at(go), flipped, gs, ws, xs, dims, ones, p, stride, dil, 1);
    }
    if (outs[1] >= 0) {
      std::vector<std::pair<int64_t, int64_t>> p;
      for (size_t i = 0; i < sp; ++i) {
        const int64_t k = ws[2 + i];
        p.emplace_back(pad[i], (k - 1) * dil[i] + stride[i] * (gs[2 + i] - 1) + 1 - xs[2 + i] - pad[i]);
      }
      const std::string dims =
          conv_layout(sp, "f", "b") + "x" + conv_layout(sp, "i", "o") + "->" + conv_layout(sp, "f", "b");
      names_[outs[1]] = conv(names_.at(x), names_.at(go), xs, gs, ws, dims, dil, p, ones, stride, 1);
    }
    if (outs[2] >= 0) {
      std::vector<int64_t> red, all = {0};
      for (int64_t d : sdims) all.push_back(d);
      names_[outs[2]] = reduce(names_.at(go), gs, all, "stablehlo.add", "0.00000000e+00", &red);
    }
  }

  // A per-channel sum over N and the spatial dims in two stages, each image's plane first, then over
  // the batch, as ATen's CPU batch norm sums (one long float32 sum drifts from it).
  std::string channel_sum(const std::string& x, const std::vector<int64_t>& xs) {
    std::vector<int64_t> red, spatial;
    for (size_t d = 2; d < xs.size(); ++d) spatial.push_back(static_cast<int64_t>(d));
    std::string planes = x;
    std::vector<int64_t> ps = xs;
    if (!spatial.empty()) {
      planes = reduce(x, xs, spatial, "stablehlo.add", "0.00000000e+00", &red);
      ps = red;
    }
    return reduce(planes, ps, {0}, "stablehlo.add", "0.00000000e+00", &red);
  }

  // Training batch norm over N and the spatial dims, per channel C (dim 1): the batch's mean and
  // biased variance, invstd = 1 / sqrt(var + eps), y = x * (invstd * w) + (b - mean * invstd * w)
  // as ATen's CPU kernel; running stats updated with momentum, the variance unbiased.
  void batch_norm(const Node& n) {
    const int64_t x = n.arg(0).tensor_index();
    const auto xs = g_.value(x).shape();
    const std::vector<int64_t> cs = {xs[1]};
    int64_t count = xs[0];
    for (size_t d = 2; d < xs.size(); ++d) count *= xs[d];
    const std::string X = names_.at(x);
    const double m = static_cast<double>(count);
    const std::string mean = bin("stablehlo.divide", channel_sum(X, xs), splat(m, cs), cs);
    const std::string xc = bin("stablehlo.subtract", X, bcast(mean, cs, xs, {1}), xs);
    const std::string ss = channel_sum(bin("stablehlo.multiply", xc, xc, xs), xs);
    const std::string var = bin("stablehlo.divide", ss, splat(m, cs), cs);
    const std::string invstd =
        bin("stablehlo.divide", splat(1.0, cs),
            un("stablehlo.sqrt", bin("stablehlo.add", var, splat(n.arg(7).as_double(), cs), cs), cs), cs);
    std::string alpha = invstd, beta = un("stablehlo.negate", bin("stablehlo.multiply", mean, invstd, cs), cs);
    if (!n.arg(1).is_none()) {
      alpha = bin("stablehlo.multiply", invstd, names_.at(n.arg(1).tensor_index()), cs);
      beta = un("stablehlo.negate", bin("stablehlo.multiply", mean, alpha, cs), cs);
    }
    if (!n.arg(2).is_none()) beta = bin("stablehlo.add", names_.at(n.arg(2).tensor_index()), beta, cs);
    const auto outs = n.outputs();
    names_[outs[0]] =
        bin("stablehlo.add", bin("stablehlo.multiply", X, bcast(alpha, cs, xs, {1}), xs), bcast(beta, cs, xs, {1}), xs);
    names_[outs[1]] = mean;
    names_[outs[2]] = invstd;
    const double mom = n.arg(6).as_double();
    auto update = [&](const std::string& stat, int64_t running) {
      return bin("stablehlo.add", bin("stablehlo.multiply", splat(mom, cs), stat, cs),
                 bin("stablehlo.multiply", splat(1.0 - mom, cs), names_.at(running), cs), cs);
    };
    names_[outs[3]] = update(mean, n.arg(3).tensor_index());
    const std::string unbiased = bin("stablehlo.divide", ss, splat(m - 1, cs), cs);
    names_[outs[4]] = update(unbiased, n.arg(4).tensor_index());
  }

  // Its training backward from the saved mean and invstd, as ATen's CPU kernel:
  // dx = (dy - sum(dy) / M - (x - mean) * sum(dy * (x - mean)) * invstd^2 / M) * invstd * w,
  // dw = sum(dy * (x - mean)) * invstd, db = sum(dy).
  void batch_norm_backward(const Node& n) {
    const int64_t go = n.arg(0).tensor_index(), x = n.arg(1).tensor_index();
    const auto xs = g_.value(x).shape();
    const std::vector<int64_t> cs = {xs[1]};
    std::vector<int64_t> red;
    int64_t count = xs[0];
    for (size_t d = 2; d < xs.size(); ++d) count *= xs[d];
    const double m = static_cast<double>(count);
    const std::string dy = names_.at(go), X = names_.at(x);
    const std::string mean = names_.at(n.arg(5).tensor_index()), invstd = names_.at(n.arg(6).tensor_index());
    const std::string xc = bin("stablehlo.subtract", X, bcast(mean, cs, xs, {1}), xs);
    const std::string gsum = channel_sum(dy, xs);
    const std::string dotp = channel_sum(bin("stablehlo.multiply", dy, xc, xs), xs);
    const std::string k =
        bin("stablehlo.divide", bin("stablehlo.multiply", bin("stablehlo.multiply", dotp, invstd, cs), invstd, cs),
            splat(m, cs), cs);
    const std::string gmean = bin("stablehlo.divide", gsum, splat(m, cs), cs);
    std::string scale = invstd;
    if (!n.arg(2).is_none()) scale = bin("stablehlo.multiply", invstd, names_.at(n.arg(2).tensor_index()), cs);
    const std::string dx = bin("stablehlo.multiply",
                               bin("stablehlo.subtract", bin("stablehlo.subtract", dy, bcast(gmean, cs, xs, {1}), xs),
                                   bin("stablehlo.multiply", xc, bcast(k, cs, xs, {1}), xs), xs),
                               bcast(scale, cs, xs, {1}), xs);
    const auto outs = n.outputs();
    if (outs[0] >= 0) names_[outs[0]] = dx;
    if (outs.size() > 1 && outs[1] >= 0) names_[outs[1]] = bin("stablehlo.multiply", dotp, invstd, cs);
    if (outs.size() > 2 && outs[2] >= 0) names_[outs[2]] = gsum;
  }

  // softmax as ATen's CPU kernel: exp(x - max) / sum(exp(x - max)); its backward
  // output * (grad - sum(grad * output)).
  std::string softmax(const Node& n, const std::vector<int64_t>& shape, bool backward) {
    const int64_t rank = static_cast<int64_t>(shape.size());
    int64_t d = backward ? n.arg(2).as_int() : n.arg(1).as_int();
    d = d < 0 ? d + rank : d;
    std::vector<int64_t> red;
    if (backward) {
      const std::string grad = names_.at(n.arg(0).tensor_index()), out = names_.at(n.arg(1).tensor_index());
      const std::string s = spread(
          reduce(bin("stablehlo.multiply", grad, out, shape), shape, {d}, "stablehlo.add", "0.00000000e+00", &red),
          shape, d);
      return bin("stablehlo.multiply", out, bin("stablehlo.subtract", grad, s, shape), shape);
    }
    const std::string x = names_.at(n.arg(0).tensor_index());
    const std::string m = spread(reduce(x, shape, {d}, "stablehlo.maximum", "0xFF800000", &red), shape, d);
    const std::string e = un("stablehlo.exponential", bin("stablehlo.subtract", x, m, shape), shape);
    const std::string sum = spread(reduce(e, shape, {d}, "stablehlo.add", "0.00000000e+00", &red), shape, d);
    return bin("stablehlo.divide", e, sum, shape);
  }

  // A pooling size, stride, padding or dilation: one int for both dims, or two.
  static std::vector<int64_t> pool_arg(const kiln::plugin::Arg& a) {
    auto v = a.as_ints();
    if (v.size() == 1) v.push_back(v[0]);
    return v;
  }

  // max_pool2d_with_indices: a reduce_window over the values and their flat index in the plane
  // (h * W + w), keeping the larger value, the smaller index among equals and a NaN over a number,
  // as ATen's scan in order keeps the first maximum and any NaN; padding is -inf at an index past
  // every real one, so a real element always wins its window.
  void max_pool(const Node& n) {
    const int64_t x = n.arg(0).tensor_index();
    const auto xs = g_.value(x).shape(), os = g_.value(n.outputs()[0]).shape();
    const std::string XI = tensor_type(xs, "i64");
    const std::string h = op("stablehlo.iota", {}, {}, XI, "iota_dimension = 2 : i64");
    const std::string w = op("stablehlo.iota", {}, {}, XI, "iota_dimension = 3 : i64");
    const std::string flat =
        op("stablehlo.add", {op("stablehlo.multiply", {h, splat_i64(xs[3], xs)}, {XI, XI}, XI), w}, {XI, XI}, XI);
    const std::string ninf = fresh();
    body_ << "    " << ninf << " = \"stablehlo.constant\"() {value = dense<0xFF800000> : tensor<f32>} : () -> "
          << "tensor<f32>\n";
    const std::string last = fresh();
    body_ << "    " << last
          << " = \"stablehlo.constant\"() {value = dense<9223372036854775807> : tensor<i64>} : () -> tensor<i64>\n";
    const auto k = pool_arg(n.arg(1)), pad = pool_arg(n.arg(3)), dil = pool_arg(n.arg(4));
    const auto st = n.arg(2).as_ints().empty() ? k : pool_arg(n.arg(2));
    std::string padding = "dense<[[0, 0], [0, 0]";
    for (size_t i = 0; i < 2; ++i) {
      const int64_t hi = (os[2 + i] - 1) * st[i] + dil[i] * (k[i] - 1) + 1 - xs[2 + i] - pad[i];
      padding += ", [" + std::to_string(pad[i]) + ", " + std::to_string(std::max(hi, int64_t{0})) + "]";
    }
    padding += "]> : tensor<4x2xi64>";
    const std::string F = "tensor<f32>", I = "tensor<i64>", B = "tensor<i1>";
    auto cmp = [&](const char* r, const char* a, const char* b, const char* dir, const std::string& t) {
      body_ << "      " << r << " = \"stablehlo.compare\"(" << a << ", " << b
            << ") {comparison_direction = #stablehlo<comparison_direction " << dir << ">} : (" << t << ", " << t
            << ") -> " << B << "\n";
    };
    auto logic = [&](const char* r, const char* name, const char* a, const char* b) {
      body_ << "      " << r << " = \"" << name << "\"(" << a << ", " << b << ") : (" << B << ", " << B << ") -> " << B
            << "\n";
    };
    const std::string r = fresh();
    body_ << "    " << r << ":2 = \"stablehlo.reduce_window\"(" << names_.at(x) << ", " << flat << ", " << ninf << ", "
          << last << ") ({\n"
          << "    ^bb0(%a: tensor<f32>, %ai: tensor<i64>, %b: tensor<f32>, %bi: tensor<i64>):\n";
    cmp("%gt", "%b", "%a", "GT", F);
    cmp("%eq", "%b", "%a", "EQ", F);
    cmp("%lt", "%bi", "%ai", "LT", I);
    cmp("%bn", "%b", "%b", "NE", F);
    cmp("%an", "%a", "%a", "NE", F);
    logic("%nans", "stablehlo.and", "%bn", "%an");
    logic("%same", "stablehlo.or", "%eq", "%nans");
    logic("%tie", "stablehlo.and", "%same", "%lt");
    body_ << "      %num = \"stablehlo.not\"(%an) : (" << B << ") -> " << B << "\n";
    logic("%nan", "stablehlo.and", "%bn", "%num");
    logic("%more", "stablehlo.or", "%gt", "%tie");
    logic("%take", "stablehlo.or", "%more", "%nan");
    body_ << "      %v = \"stablehlo.select\"(%take, %b, %a) : (" << B << ", " << F << ", " << F << ") -> " << F << "\n"
          << "      %i = \"stablehlo.select\"(%take, %bi, %ai) : (" << B << ", " << I << ", " << I << ") -> " << I
          << "\n"
          << "      \"stablehlo.return\"(%v, %i) : (" << F << ", " << I << ") -> ()\n"
          << "    }) {padding = " << padding << ", window_dilations = array<i64: 1, 1, " << dil[0] << ", " << dil[1]
          << ">, window_dimensions = array<i64: 1, 1, " << k[0] << ", " << k[1]
          << ">, window_strides = array<i64: 1, 1, " << st[0] << ", " << st[1] << ">} : (" << tensor_type(xs) << ", "
          << XI << ", " << F << ", " << I << ") -> (" << tensor_type(os) << ", " << tensor_type(os, "i64") << ")\n";
    names_[n.outputs()[0]] = r + "#0";
    names_[n.outputs()[1]] = r + "#1";
  }

  // Its backward: each gradient added at its window's maximum (the indices), a scatter with an add
  // region over [N * C, H * W] indexed by (plane, index).
  std::string max_pool_backward(const Node& n, const std::vector<int64_t>& shape) {
    const int64_t go = n.arg(0).tensor_index(), ix = n.arg(7).tensor_index();
    const auto gs = g_.value(go).shape();
    const int64_t NC = shape[0] * shape[1], HW = shape[2] * shape[3], P = gs[2] * gs[3], K = NC * P;
    const std::string g = reshape(names_.at(go), gs, {K});
    const std::string idx = reshape_typed(names_.at(ix), gs, {K, 1}, "i64");
    const std::string plane = reshape_typed(
        op("stablehlo.iota", {}, {}, tensor_type({NC, P}, "i64"), "iota_dimension = 0 : i64"), {NC, P}, {K, 1}, "i64");
    const std::string at =
        op("stablehlo.concatenate", {plane, idx}, {tensor_type({K, 1}, "i64"), tensor_type({K, 1}, "i64")},
           tensor_type({K, 2}, "i64"), "dimension = 1 : i64");
    const std::string zero = splat(0.0, {NC, HW});
    const std::string r = fresh();
    body_
        << "    " << r << " = \"stablehlo.scatter\"(" << zero << ", " << at << ", " << g << ") ({\n"
        << "    ^bb0(%lhs: tensor<f32>, %rhs: tensor<f32>):\n"
        << "      %acc = \"stablehlo.add\"(%lhs, %rhs) : (tensor<f32>, tensor<f32>) -> tensor<f32>\n"
        << "      \"stablehlo.return\"(%acc) : (tensor<f32>) -> ()\n"
        << "    }) {indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = "
           "[0, 1], scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 1>, unique_indices = false} : ("
        << tensor_type({NC, HW}) << ", " << tensor_type({K, 2}, "i64") << ", " << tensor_type({K}) << ") -> "
        << tensor_type({NC, HW}) << "\n";
    return reshape(r, {NC, HW}, shape);
  }

  static std::string dims_of(const std::vector<int64_t>& shape) {
    std::string d;
    for (int64_t s : shape) d += std::to_string(s) + "x";
    return d;
  }

  const Graph& g_;
  const PaddingPlan* pad_ = nullptr;
  std::map<std::string, std::string> size_values_;  // a size expression's text -> its tensor<i64>
  std::map<int64_t, std::string> names_;
  std::ostringstream body_;
  int next_ = 0;
  size_t first_scalar_ = 0;       // the parameter number of the first run-time scalar
  std::vector<int32_t> scalars_;  // the run-time scalars read, in parameter order
  BoundaryLayout layout_;
};

}  // namespace

namespace {

// The Scalar arguments that may be run-time scalars (read from a parameter of @main): the "other"
// of the .Scalar binary ops, add's and sub's alpha, addcmul's and addcdiv's value.
bool runtime_scalar_allowed(const std::string& o, size_t i, const kiln::plugin::Arg& a) {
  if (binary_ops().count(o) && i == 1) return true;
  if (a.name() == "alpha" &&
      (o == "aten::add.Tensor" || o == "aten::sub.Tensor" || o == "aten::add.Scalar" || o == "aten::sub.Scalar"))
    return true;
  return (o == "aten::addcmul" || o == "aten::addcdiv") && i == 3;
}

std::string why_not_nll_loss(const Graph& g, const Node& n, bool backward) {
  const size_t first = backward ? 1 : 0;  // the log-probabilities
  const auto x = g.value(n.arg(first).tensor_index());
  const auto t = g.value(n.arg(first + 1).tensor_index());
  if (x.ndim() != 2) return "log-probabilities of " + std::to_string(x.ndim()) + " dims (only [N, C] is emitted)";
  if (!is_int64(t) || t.ndim() != 1) return "targets that are not int64 of one dim";
  const auto w = n.arg(first + 2);
  if (!w.is_none() && (!kiln::plugin::is_float32(g.value(w.tensor_index()).dtype()) ||
                       g.value(w.tensor_index()).shape() != std::vector<int64_t>{x.shape()[1]}))
    return "a class weight that is not float32 of [C]";
  const int64_t reduction = n.arg(first + 3).as_int();
  if (reduction < 0 || reduction > 2) return "an unknown reduction";
  for (int64_t v : n.outputs())
    if (!kiln::plugin::is_float32(g.value(v).dtype()))
      return "a " + kiln::plugin::dtype_name(g.value(v).dtype()) + " result";
  if (backward) {
    for (size_t i : {size_t{0}, size_t{6}})
      if (!kiln::plugin::is_float32(g.value(n.arg(i).tensor_index()).dtype()))
        return "a grad or total weight not float32";
    if (g.value(n.arg(0).tensor_index()).ndim() != (reduction == 0 ? 1 : 0)) return "a grad of another shape";
  }
  return "";
}

}  // namespace

std::string why_not_emitted(const Graph& g, const Node& n) {
  const std::string o = n.op();
  static const std::set<std::string> structural = {"aten::relu",
                                                   "aten::threshold_backward",
                                                   "aten::clone",
                                                   "aten::alias",
                                                   "aten::detach",
                                                   "aten::mm",
                                                   "aten::bmm",
                                                   "aten::addmm",
                                                   "aten::t",
                                                   "aten::permute",
                                                   "aten::transpose.int",
                                                   "aten::view",
                                                   "aten::_unsafe_view",
                                                   "aten::reshape",
                                                   "aten::expand",
                                                   "aten::sum",
                                                   "aten::sum.dim_IntList",
                                                   "aten::_log_softmax",
                                                   "aten::_log_softmax_backward_data",
                                                   "aten::_softmax",
                                                   "aten::_softmax_backward_data",
                                                   "aten::max_pool2d_with_indices",
                                                   "aten::max_pool2d_with_indices_backward",
                                                   "aten::nll_loss_forward",
                                                   "aten::nll_loss_backward",
                                                   "aten::addcmul",
                                                   "aten::addcdiv",
                                                   "aten::mean.dim",
                                                   "aten::gelu",
                                                   "aten::gelu_backward",
                                                   "aten::native_layer_norm",
                                                   "aten::native_layer_norm_backward",
                                                   "aten::split.Tensor",
                                                   "aten::slice.Tensor",
                                                   "aten::cat",
                                                   "aten::embedding",
                                                   "aten::embedding_dense_backward",
                                                   "aten::convolution",
                                                   "aten::convolution_backward",
                                                   "aten::_native_batch_norm_legit_functional",
                                                   "aten::native_batch_norm_backward",
                                                   "aten::_scaled_dot_product_flash_attention_for_cpu",
                                                   "aten::_scaled_dot_product_flash_attention_for_cpu_backward"};
  // Ops of several results (the rest have one), and the operand that may be int64 (indices).
  static const std::set<std::string> several = {"aten::native_layer_norm",
                                                "aten::native_layer_norm_backward",
                                                "aten::convolution_backward",
                                                "aten::_native_batch_norm_legit_functional",
                                                "aten::native_batch_norm_backward",
                                                "aten::max_pool2d_with_indices",
                                                "aten::split.Tensor",
                                                "aten::_scaled_dot_product_flash_attention_for_cpu",
                                                "aten::_scaled_dot_product_flash_attention_for_cpu_backward"};
  const bool known = unary_ops().count(o) || binary_ops().count(o) || structural.count(o);
  if (!known) return "no StableHLO lowering for " + o + " yet";
  for (int64_t v : n.outputs())
    if (v < 0) return "an undefined result";
  for (size_t i = 0; i < n.num_args(); ++i) {
    const auto a = n.arg(i);
    if (a.runtime_scalar() >= 0 && !runtime_scalar_allowed(o, i, a)) return "a run-time scalar argument";
  }
  if (o == "aten::nll_loss_forward" || o == "aten::nll_loss_backward")
    return why_not_nll_loss(g, n, o == "aten::nll_loss_backward");
  if (n.outputs().size() != 1 && !several.count(o)) return "more than one result";
  if (o == "aten::add.Scalar" && is_int64(g.value(n.outputs()[0]))) {
    // A counter: int64 + int * int.
    if (!is_int64(g.value(n.arg(0).tensor_index())) || n.arg(1).tag() != KILN_ARG_INT ||
        n.arg(2).tag() != KILN_ARG_INT || n.arg(1).runtime_scalar() >= 0 || n.arg(2).runtime_scalar() >= 0)
      return "an int64 add of other than ints";
    return "";
  }
  if (o == "aten::max_pool2d_with_indices" || o == "aten::max_pool2d_with_indices_backward") {
    const bool bwd = o == "aten::max_pool2d_with_indices_backward";
    const auto x = g.value(n.arg(bwd ? 1 : 0).tensor_index());
    if (x.ndim() != 4 || !kiln::plugin::is_float32(x.dtype())) return "pooling other than float32 [N, C, H, W]";
    for (size_t i = bwd ? 2 : 1; i < (bwd ? 6u : 5u); ++i) {
      const size_t len = n.arg(i).as_ints().size();
      if (len > 2 || (len == 0 && i != (bwd ? 3u : 2u))) return "pooling sizes not given per dim";
    }
    if (bwd && (!is_int64(g.value(n.arg(7).tensor_index())) ||
                !kiln::plugin::is_float32(g.value(n.arg(0).tensor_index()).dtype())))
      return "a gradient or indices of another dtype";
    return "";
  }
  if ((o == "aten::view" || o == "aten::_unsafe_view" || o == "aten::reshape") && is_int64(g.value(n.outputs()[0])) &&
      is_int64(g.value(n.arg(0).tensor_index())))
    return "";  // int64 indices or targets reshaped
  if (o == "aten::convolution" || o == "aten::convolution_backward") {
    const bool bwd = o == "aten::convolution_backward";
    const auto x = g.value(n.arg(bwd ? 1 : 0).tensor_index());
    if (x.ndim() < 3) return "a convolution without spatial dims";
    const size_t sp = static_cast<size_t>(x.ndim() - 2), at = bwd ? 4 : 3;
    for (size_t i = at; i < at + 3; ++i)
      if (n.arg(i).as_ints().size() != sp) return "strides, padding or dilation not given per spatial dim";
    if (n.arg(at + 3).as_bool()) return "a transposed convolution";
    if (bwd && n.arg(at + 5).as_int() != 1) return "a grouped convolution's backward";
  }
  if ((o == "aten::_native_batch_norm_legit_functional" && !n.arg(5).as_bool()) ||
      (o == "aten::native_batch_norm_backward" && !n.arg(7).as_bool()))
    return "batch norm in eval mode";
  for (int64_t v : n.outputs())
    if (!kiln::plugin::is_float32(g.value(v).dtype()))
      return "a " + kiln::plugin::dtype_name(g.value(v).dtype()) + " result";
  const bool indexed = o == "aten::embedding" || o == "aten::embedding_dense_backward";
  for (int64_t v : n.inputs()) {
    if (indexed && v == n.arg(1).tensor_index()) {
      if (!is_int64(g.value(v))) return "indices that are not int64";
      continue;
    }
    if (!kiln::plugin::is_float32(g.value(v).dtype()))
      return "a " + kiln::plugin::dtype_name(g.value(v).dtype()) + " operand";
  }
  if (o == "aten::mean.dim")
    if (auto dt = n.find_arg("dtype"); dt && !dt->is_none()) return "a mean into another dtype";
  if (o == "aten::gelu" || o == "aten::gelu_backward") {
    const std::string a = n.arg(o == "aten::gelu" ? 1 : 2).as_string();
    if (a != "none" && (a != "tanh" || o == "aten::gelu_backward")) return "gelu with approximate '" + a + "'";
  }
  if (o == "aten::slice.Tensor" && n.arg(4).as_int() < 1) return "a slice step below 1";
  if (o == "aten::cat") {
    const auto rank = g.value(n.outputs()[0]).ndim();
    for (int64_t v : n.arg(0).as_ints())
      if (g.value(v).ndim() != rank) return "tensors of different ranks";
  }
  if (indexed && g.value(o == "aten::embedding" ? n.arg(0).tensor_index() : n.outputs()[0]).ndim() != 2)
    return "an embedding table not of two dims";
  if (o == "aten::embedding_dense_backward" && n.arg(4).as_bool()) return "scale_grad_by_freq";
  if (o.rfind("aten::_scaled_dot_product_flash_attention_for_cpu", 0) == 0) {
    const bool bwd = o != "aten::_scaled_dot_product_flash_attention_for_cpu";
    const size_t first = bwd ? 1 : 0, rest = bwd ? 6 : 3;
    for (size_t i = first; i < first + 3; ++i)
      if (g.value(n.arg(i).tensor_index()).ndim() != 4) return "attention over other than [B, H, L, E]";
    if (n.arg(rest).as_double() != 0.0) return "attention with dropout";
    if (!n.arg(rest + 2).is_none()) return "attention with a mask tensor";
    if (n.outputs().size() != (bwd ? 3u : 2u)) return "an unexpected number of results";
  }
  if (o == "aten::sum" || o == "aten::sum.dim_IntList")
    if (auto dt = n.find_arg("dtype"); dt && !dt->is_none()) return "a sum into another dtype";
  if ((o == "aten::_log_softmax" || o == "aten::_softmax") && n.arg(2).as_bool()) return "half_to_float";
  return "";
}

bool is_elementwise(const std::string& o) {
  static const std::set<std::string> more = {"aten::relu",    "aten::threshold_backward",
                                             "aten::gelu",    "aten::gelu_backward",
                                             "aten::addcmul", "aten::addcdiv",
                                             "aten::clone",   "aten::alias",
                                             "aten::detach"};
  return unary_ops().count(o) || binary_ops().count(o) || more.count(o);
}

std::string emit_stablehlo(const Graph& g, std::vector<int32_t>* runtime_scalars, BoundaryLayout* layout,
                           const PaddingPlan* padding) {
  Emitter e(g, padding);
  std::string m = e.module();
  if (runtime_scalars) *runtime_scalars = e.runtime_scalars();
  if (layout) *layout = e.layout();
  return m;
}

}  // namespace kiln::neuron
