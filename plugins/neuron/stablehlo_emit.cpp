#include "stablehlo_emit.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

namespace kiln::neuron {

namespace {

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
  explicit Emitter(const Graph& g) : g_(g) {}

  std::string module() {
    std::ostringstream head;
    const auto ins = g_.inputs(), outs = g_.outputs();
    for (size_t i = 0; i < ins.size(); ++i) {
      const auto v = g_.value(ins[i]);
      names_[ins[i]] = "%arg" + std::to_string(i);
      head << (i ? ", " : "") << names_[ins[i]] << ": " << tensor_type(v.shape(), element_type(v));
    }
    first_scalar_ = ins.size();
    for (size_t i = 0; i < g_.num_nodes(); ++i) node(g_.node(static_cast<int64_t>(i)));
    // The run-time scalars the nodes read, after the inputs, as rank-0 f32 parameters.
    for (size_t k = 0; k < scalars_.size(); ++k)
      head << (ins.size() + k ? ", " : "") << "%arg" << ins.size() + k << ": tensor<f32>";
    std::string ret_values, ret_types;
    for (size_t k = 0; k < outs.size(); ++k) {
      auto it = names_.find(outs[k]);
      if (it == names_.end()) throw Unimplemented("output value " + std::to_string(outs[k]) + " is not computed");
      const auto v = g_.value(outs[k]);
      ret_values += (k ? ", " : "") + it->second;
      ret_types += (k ? ", " : "") + tensor_type(v.shape(), element_type(v));
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

 private:
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

  void node(const Node& n) {
    const std::string why = why_not_emitted(g_, n);
    if (!why.empty()) throw Unimplemented("node " + std::to_string(n.index()) + " (" + n.op() + "): " + why);
    const std::string o = n.op();
    const int64_t out = n.outputs().at(0);
    const auto shape = g_.value(out).shape();
    const std::string T = tensor_type(shape);
    std::string r;
    if (o == "aten::clone" || o == "aten::alias" || o == "aten::detach") {
      r = names_.at(n.arg(0).tensor_index());
    } else if (o == "aten::nll_loss_forward") {
      nll_loss_forward(n);
      return;
    } else if (o == "aten::nll_loss_backward") {
      r = nll_loss_backward(n, shape);
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
      r = op("stablehlo.reshape", {names_.at(x)}, {tensor_type(g_.value(x).shape())}, T);
    } else if (o == "aten::expand") {
      r = broadcast(n.arg(0).tensor_index(), shape);
    } else if (o == "aten::sum" || o == "aten::sum.dim_IntList") {
      r = sum(n, shape);
    } else if (o == "aten::_log_softmax" || o == "aten::_log_softmax_backward_data") {
      r = log_softmax(n, shape, o == "aten::_log_softmax_backward_data");
    } else {
      const std::string& hlo = binary_ops().at(o);
      const std::string a = broadcast(n.arg(0).tensor_index(), shape);
      std::string b = n.arg(1).is_tensor() ? broadcast(n.arg(1).tensor_index(), shape) : number(n.arg(1), shape);
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
                       "dot_dimension_numbers = " + dims);
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

  static std::string dims_of(const std::vector<int64_t>& shape) {
    std::string d;
    for (int64_t s : shape) d += std::to_string(s) + "x";
    return d;
  }

  const Graph& g_;
  std::map<int64_t, std::string> names_;
  std::ostringstream body_;
  int next_ = 0;
  size_t first_scalar_ = 0;       // the parameter number of the first run-time scalar
  std::vector<int32_t> scalars_;  // the run-time scalars read, in parameter order
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
                                                   "aten::nll_loss_forward",
                                                   "aten::nll_loss_backward",
                                                   "aten::addcmul",
                                                   "aten::addcdiv"};
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
  if (n.outputs().size() != 1) return "more than one result";
  for (int64_t v : n.outputs())
    if (!kiln::plugin::is_float32(g.value(v).dtype()))
      return "a " + kiln::plugin::dtype_name(g.value(v).dtype()) + " result";
  for (int64_t v : n.inputs())
    if (!kiln::plugin::is_float32(g.value(v).dtype()))
      return "a " + kiln::plugin::dtype_name(g.value(v).dtype()) + " operand";
  if (o == "aten::sum" || o == "aten::sum.dim_IntList")
    if (auto dt = n.find_arg("dtype"); dt && !dt->is_none()) return "a sum into another dtype";
  if (o == "aten::_log_softmax" && n.arg(2).as_bool()) return "half_to_float";
  if (o == "aten::clone") {
    if (auto mf = n.find_arg("memory_format"); mf && !mf->is_none() && mf->raw()->i != KILN_MEMORY_FORMAT_PRESERVE &&
                                               mf->raw()->i != KILN_MEMORY_FORMAT_CONTIGUOUS)
      return "a clone into another memory format";
  }
  return "";
}

std::string emit_stablehlo(const Graph& g, std::vector<int32_t>* runtime_scalars) {
  Emitter e(g);
  std::string m = e.module();
  if (runtime_scalars) *runtime_scalars = e.runtime_scalars();
  return m;
}

}  // namespace kiln::neuron
