#include "synapse_lower.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

namespace kiln::hpu {

namespace {

using kiln::plugin::Arg;
using kiln::plugin::Graph;
using kiln::plugin::Node;
using kiln::plugin::Unimplemented;

// Synapse's TPC kernels take at most five dims on every Gaudi (eight on later ones).
constexpr int kMaxRank = 5;

bool is_bf16(DLDataType t) { return t.code == kDLBfloat && t.bits == 16 && t.lanes == 1; }
bool is_int64(DLDataType t) { return t.code == kDLInt && t.bits == 64 && t.lanes == 1; }
bool is_float(DLDataType t) { return kiln::plugin::is_float32(t) || is_bf16(t); }

// Element-wise ops of one operand: ATen name -> TPC kernel name (the dtype suffix added).
const std::map<std::string, std::string>& unary_kernels() {
  static const std::map<std::string, std::string> m = {
      {"aten::neg", "neg_fwd"},         {"aten::exp", "exp_fwd"},     {"aten::log", "log_fwd"},
      {"aten::sqrt", "sqrt_fwd"},       {"aten::rsqrt", "rsqrt_fwd"}, {"aten::tanh", "tanh_fwd"},
      {"aten::sigmoid", "sigmoid_fwd"}, {"aten::relu", "relu_fwd"},
  };
  return m;
}

// Binary ops (a tensor and a tensor or a Scalar, broadcast to the result).
const std::map<std::string, std::string>& binary_kernels() {
  static const std::map<std::string, std::string> m = {
      {"aten::add.Tensor", "add_fwd"},  {"aten::sub.Tensor", "sub_fwd"}, {"aten::mul.Tensor", "mult_fwd"},
      {"aten::div.Tensor", "div_fwd"},  {"aten::add.Scalar", "add_fwd"}, {"aten::sub.Scalar", "sub_fwd"},
      {"aten::mul.Scalar", "mult_fwd"}, {"aten::div.Scalar", "div_fwd"},
  };
  return m;
}

const std::set<std::string>& structural_ops() {
  static const std::set<std::string> s = {"aten::mm",
                                          "aten::addmm",
                                          "aten::bmm",
                                          "aten::t",
                                          "aten::permute",
                                          "aten::transpose.int",
                                          "aten::view",
                                          "aten::_unsafe_view",
                                          "aten::reshape",
                                          "aten::clone",
                                          "aten::alias",
                                          "aten::detach",
                                          "aten::threshold_backward",
                                          "aten::gelu",
                                          "aten::gelu_backward",
                                          "aten::sum",
                                          "aten::sum.dim_IntList",
                                          "aten::mean.dim",
                                          "aten::_softmax",
                                          "aten::_softmax_backward_data",
                                          "aten::_log_softmax",
                                          "aten::_log_softmax_backward_data",
                                          "aten::nll_loss_forward",
                                          "aten::nll_loss_backward",
                                          "aten::addcmul",
                                          "aten::addcdiv",
                                          "aten::native_layer_norm",
                                          "aten::native_layer_norm_backward",
                                          "aten::_native_batch_norm_legit_functional",
                                          "aten::native_batch_norm_backward",
                                          "aten::embedding",
                                          "aten::embedding_dense_backward",
                                          "aten::convolution",
                                          "aten::convolution_backward"};
  return s;
}

// The Scalar arguments that may be run-time scalars: the .Scalar ops' other, add's and sub's
// alpha, addcmul's and addcdiv's value (an optimizer's changing learning rate and bias
// corrections); each becomes a persistent one-element tensor written at every launch.
bool runtime_scalar_allowed(const std::string& o, size_t i, const Arg& a) {
  if (binary_kernels().count(o) && o.find(".Scalar") != std::string::npos && i == 1) return true;
  if (a.name() == "alpha" && binary_kernels().count(o)) return true;
  return (o == "aten::addcmul" || o == "aten::addcdiv") && i == 3;
}

std::string ints_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

const char* dtype_suffix(syn::DataType t) {
  switch (t) {
    case syn::kTypeBf16: return "bf16";
    case syn::kTypeInt32: return "i32";
    case syn::kTypeInt8: return "i8";
    default: return "f32";
  }
}

// A float as the dump writes it: enough digits to read the same float back.
std::string float_text(float f) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", static_cast<double>(f));
  return b;
}

template <class P>
std::vector<uint8_t> bytes_of(const P& p) {
  std::vector<uint8_t> b(sizeof p);
  std::memcpy(b.data(), &p, sizeof p);
  return b;
}

class Lowering {
 public:
  explicit Lowering(const Graph& g) : g_(g) {}

  SynGraph run() {
    const auto ins = g_.inputs();
    out_.inputs.assign(ins.size(), -1);
    for (size_t i = 0; i < ins.size(); ++i) {
      const auto v = g_.value(ins[i]);
      SynTensor t;
      t.name = "in" + std::to_string(i);
      t.shape = v.shape();
      t.kind = SynTensor::Kind::kInput;
      t.index = static_cast<int64_t>(i);
      t.widened = is_int64(v.dtype());
      t.dtype = t.widened ? syn::kTypeInt32 : dtype_of(v.dtype());
      // A value handed in twice (the same input in two places) is read from its first tensor.
      if (tensor_of_.count(ins[i])) continue;
      out_.inputs[i] = add(t);
      tensor_of_[ins[i]] = out_.inputs[i];
    }
    for (size_t i = 0; i < g_.num_nodes(); ++i) node(g_.node(static_cast<int64_t>(i)));
    const auto outs = g_.outputs();
    for (size_t k = 0; k < outs.size(); ++k) {
      int32_t t = materialized(outs[k], "output " + std::to_string(k));
      // A result that is an input, or a tensor already handed out, is copied into a tensor of its
      // own: each persistent output gets its own device buffer.
      if (out_.tensors[static_cast<size_t>(t)].kind != SynTensor::Kind::kWorkspace) {
        SynTensor c = out_.tensors[static_cast<size_t>(t)];
        c.kind = SynTensor::Kind::kWorkspace;
        const int32_t copy = add(c);
        emit("memcpy", "output" + std::to_string(k) + ".copy", {t}, {copy});
        t = copy;
      }
      SynTensor& o = out_.tensors[static_cast<size_t>(t)];
      o.kind = SynTensor::Kind::kOutput;
      o.index = static_cast<int64_t>(k);
      o.name = "out" + std::to_string(k);
      o.widened = is_int64(g_.value(outs[k]).dtype());
      out_.outputs.push_back(t);
    }
    return std::move(out_);
  }

 private:
  static syn::DataType dtype_of(DLDataType t) {
    if (kiln::plugin::is_float32(t)) return syn::kTypeFloat;
    if (is_bf16(t)) return syn::kTypeBf16;
    if (is_int64(t)) return syn::kTypeInt32;
    throw Unimplemented("a " + kiln::plugin::dtype_name(t) + " value");
  }

  int32_t add(SynTensor t) {
    if (t.name.empty()) t.name = "t" + std::to_string(out_.tensors.size());
    out_.tensors.push_back(std::move(t));
    return static_cast<int32_t>(out_.tensors.size() - 1);
  }

  int32_t workspace(const std::vector<int64_t>& shape, syn::DataType dtype) {
    SynTensor t;
    t.shape = shape;
    t.dtype = dtype;
    return add(t);
  }

  const SynTensor& tensor(int32_t t) const { return out_.tensors[static_cast<size_t>(t)]; }

  void emit(const std::string& guid, const std::string& name, std::vector<int32_t> in, std::vector<int32_t> out,
            std::vector<uint8_t> params = {}, std::string params_text = "") {
    SynNode n;
    n.guid = guid;
    n.name = name;
    n.inputs = std::move(in);
    n.outputs = std::move(out);
    n.params = std::move(params);
    n.params_text = std::move(params_text);
    out_.nodes.push_back(std::move(n));
  }

  std::string kernel(const std::string& base, syn::DataType t) const { return base + "_" + dtype_suffix(t); }

  // `src` with its dims permuted as ATen's permute(perm) does: output dim j is input dim perm[j].
  // Synapse numbers dims fastest first, so its permutation is perm reversed on both sides.
  int32_t transpose(int32_t src, const std::vector<int64_t>& perm) {
    const auto& s = tensor(src).shape;
    const int64_t rank = static_cast<int64_t>(s.size());
    std::vector<int64_t> out_shape;
    for (int64_t d : perm) out_shape.push_back(s[static_cast<size_t>(d)]);
    const int32_t t = workspace(out_shape, tensor(src).dtype);
    syn::TransposeParams tp{};
    for (int d = 0; d < syn::kMaxDimensions; ++d) tp.permutation[d] = d;
    std::string text = "permutation=[";
    for (int64_t k = 0; k < rank; ++k) {
      tp.permutation[k] = static_cast<int32_t>(rank - 1 - perm[static_cast<size_t>(rank - 1 - k)]);
      text += (k ? "," : "") + std::to_string(tp.permutation[k]);
    }
    tp.tensor_dim = static_cast<uint32_t>(rank);
    emit("transpose", name_ + ".transpose", {src}, {t}, bytes_of(tp), text + "] dims=" + std::to_string(rank));
    return t;
  }

  // The tensor holding value v, a pending transpose (aten::t) written out first.
  int32_t materialized(int64_t v, const std::string& what) {
    if (auto p = pending_t_.find(v); p != pending_t_.end()) {
      const int32_t t = transpose(p->second, {1, 0});
      pending_t_.erase(p);
      tensor_of_[v] = t;
      return t;
    }
    auto it = tensor_of_.find(v);
    if (it == tensor_of_.end())
      throw Unimplemented(what + " reads value " + std::to_string(v) + ", which the lowering did not produce");
    return it->second;
  }

  int32_t operand(const Node& n, size_t i) { return materialized(n.arg(i).tensor_index(), n.op()); }

  // `t` with `rank` dims (size-1 dims in front), as the TPC kernels broadcast operands of equal rank.
  int32_t as_rank(int32_t t, size_t rank) {
    const auto s = tensor(t).shape;
    if (s.size() == rank) return t;
    std::vector<int64_t> r(rank - s.size(), 1);
    r.insert(r.end(), s.begin(), s.end());
    const int32_t o = workspace(r, tensor(t).dtype);
    emit("reshape", name_ + ".reshape", {t}, {o});
    return o;
  }

  // A Scalar as a tensor of `rank` size-1 dims of `dtype`: a constant kernel's output, or for a
  // run-time scalar a persistent tensor the executable writes before each launch.
  int32_t number(const Arg& a, size_t rank, syn::DataType dtype) {
    const std::vector<int64_t> ones(rank, 1);
    const int32_t k = a.runtime_scalar();
    if (k >= 0) {
      SynTensor t;
      t.name = "scalar" + std::to_string(out_.scalars.size());
      t.shape = ones;
      t.dtype = dtype;
      t.kind = SynTensor::Kind::kScalar;
      t.index = k;
      const int32_t id = add(t);
      out_.scalars.push_back(id);
      return id;
    }
    return constant(a.as_double(), ones, dtype);
  }

  int32_t constant(double value, const std::vector<int64_t>& shape, syn::DataType dtype) {
    const int32_t t = workspace(shape, dtype);
    syn::ConstantParams p{};
    if (dtype == syn::kTypeInt32) {
      p.constant.i = static_cast<int32_t>(value);
      emit(kernel("constant", dtype), name_ + ".constant", {}, {t}, bytes_of(p),
           "constant=" + std::to_string(p.constant.i));
    } else {
      p.constant.f = static_cast<float>(value);
      emit(kernel("constant", dtype), name_ + ".constant", {}, {t}, bytes_of(p),
           "constant=" + float_text(p.constant.f));
    }
    return t;
  }

  int32_t binary(const std::string& base, int32_t a, int32_t b, const std::vector<int64_t>& shape, syn::DataType dtype,
                 const std::string& suffix = "") {
    const int32_t ra = as_rank(a, shape.size()), rb = as_rank(b, shape.size());
    const int32_t o = workspace(shape, dtype);
    emit(kernel(base, dtype), name_ + suffix, {ra, rb}, {o});
    return o;
  }

  int32_t reshape(int32_t t, const std::vector<int64_t>& shape) {
    if (tensor(t).shape == shape) return t;
    const int32_t o = workspace(shape, tensor(t).dtype);
    emit("reshape", name_ + ".reshape", {t}, {o});
    return o;
  }

  // Synapse numbers dims fastest first: ATen's dim d of a rank-r tensor is r - 1 - d.
  static int32_t syn_dim(int64_t d, size_t rank) { return static_cast<int32_t>(static_cast<int64_t>(rank) - 1 - d); }

  static std::vector<int64_t> dims_of(const Arg& a, size_t rank) {
    std::vector<int64_t> dims;
    if (!a.is_none()) dims = a.as_ints();
    if (dims.empty())
      for (size_t d = 0; d < rank; ++d) dims.push_back(static_cast<int64_t>(d));
    for (auto& d : dims) d = d < 0 ? d + static_cast<int64_t>(rank) : d;
    std::sort(dims.begin(), dims.end());
    dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
    return dims;
  }

  // A sum or mean over `dims`: one reduction kernel per dim (each keeps its dim with size 1; a mean
  // of means over equal-sized slices is the mean), then a reshape to the result's shape.
  // In bfloat16 over several dims the chain runs in float32 between two casts: ATen accumulates a
  // bfloat16 sum in float32 and rounds once, and a bfloat16 partial sum per dim would round each time.
  int32_t reduce(const std::string& base, int32_t x, const std::vector<int64_t>& dims,
                 const std::vector<int64_t>& result) {
    const syn::DataType dt = tensor(x).dtype;
    const bool widen = dt == syn::kTypeBf16 && dims.size() > 1;
    int32_t cur = widen ? cast(x, syn::kTypeFloat) : x;
    auto shape = tensor(x).shape;
    for (int64_t d : dims) {
      shape[static_cast<size_t>(d)] = 1;
      const int32_t o = workspace(shape, tensor(cur).dtype);
      syn::ReductionParams p{static_cast<uint32_t>(syn_dim(d, shape.size()))};
      emit(kernel(base, tensor(cur).dtype), name_ + ".dim" + std::to_string(d), {cur}, {o}, bytes_of(p),
           "reduction_dimension=" + std::to_string(p.reduction_dimension));
      cur = o;
    }
    if (widen) cur = cast(cur, dt);
    return reshape(cur, result);
  }

  int32_t cast(int32_t t, syn::DataType to) {
    const int32_t o = workspace(tensor(t).shape, to);
    emit(std::string("cast_") + dtype_suffix(tensor(t).dtype) + "_to_" + dtype_suffix(to), name_ + ".cast", {t}, {o});
    return o;
  }

  // `t` as `to`: itself, or cast.
  int32_t as_dtype(int32_t t, syn::DataType to) { return tensor(t).dtype == to ? t : cast(t, to); }
  int32_t f32(int32_t t) { return as_dtype(t, syn::kTypeFloat); }

  int32_t gemm(const std::string& guid, int64_t a, int64_t b, const std::vector<int64_t>& shape, syn::DataType dtype) {
    // An operand that is aten::t of a tensor is read through the GEMM's transpose flag instead of
    // a transpose kernel.
    syn::GemmParams p{false, false};
    auto source = [&](int64_t v, bool* flag) {
      if (auto it = pending_t_.find(v); it != pending_t_.end()) {
        *flag = true;
        return it->second;
      }
      return materialized(v, guid);
    };
    const int32_t ta = source(a, &p.transpose_a), tb = source(b, &p.transpose_b);
    const int32_t o = workspace(shape, dtype);
    emit(guid, name_, {ta, tb}, {o}, bytes_of(p),
         std::string("transpose_a=") + (p.transpose_a ? "1" : "0") + " transpose_b=" + (p.transpose_b ? "1" : "0"));
    return o;
  }

  void node(const Node& n) {
    const std::string why = why_not_lowered(g_, n);
    if (!why.empty()) throw Unimplemented("node " + std::to_string(n.index()) + " (" + n.op() + "): " + why);
    const std::string o = n.op();
    name_ = "n" + std::to_string(n.index());
    const int64_t out = n.outputs().at(0);
    const auto ov = g_.value(out);
    const auto shape = ov.shape();
    const syn::DataType dt = is_int64(ov.dtype()) ? syn::kTypeInt32 : dtype_of(ov.dtype());
    const size_t rank = shape.size();
    int32_t r = -1;
    if (o == "aten::clone" || o == "aten::alias" || o == "aten::detach") {
      const int64_t x = n.arg(0).tensor_index();
      if (auto p = pending_t_.find(x); p != pending_t_.end()) {
        pending_t_[out] = p->second;
        return;
      }
      r = materialized(x, o);
    } else if (o == "aten::t") {
      const int64_t x = n.arg(0).tensor_index();
      if (g_.value(x).ndim() < 2) {
        r = materialized(x, o);
      } else if (auto p = pending_t_.find(x); p != pending_t_.end()) {
        r = p->second;  // t(t(x)) is x
      } else {
        pending_t_[out] = materialized(x, o);  // written out only where something other than a GEMM reads it
        return;
      }
    } else if (o == "aten::permute" || o == "aten::transpose.int") {
      const int64_t x = n.arg(0).tensor_index();
      const int64_t in_rank = g_.value(x).ndim();
      std::vector<int64_t> perm(static_cast<size_t>(in_rank));
      for (int64_t d = 0; d < in_rank; ++d) perm[static_cast<size_t>(d)] = d;
      if (o == "aten::permute") {
        perm = n.arg(1).as_ints();
        for (auto& d : perm) d = d < 0 ? d + in_rank : d;
      } else {
        int64_t a = n.arg(1).as_int(), b = n.arg(2).as_int();
        a = a < 0 ? a + in_rank : a;
        b = b < 0 ? b + in_rank : b;
        std::swap(perm[static_cast<size_t>(a)], perm[static_cast<size_t>(b)]);
      }
      bool identity = true;
      for (size_t d = 0; d < perm.size(); ++d) identity = identity && perm[d] == static_cast<int64_t>(d);
      if (identity) {
        r = materialized(x, o);
      } else if (in_rank == 2 && !pending_t_.count(x)) {
        pending_t_[out] = materialized(x, o);  // as aten::t: a GEMM reads it through its flag
        return;
      } else {
        r = transpose(materialized(x, o), perm);
      }
    } else if (o == "aten::view" || o == "aten::_unsafe_view" || o == "aten::reshape") {
      r = reshape(operand(n, 0), shape);
    } else if (o == "aten::mm") {
      r = gemm("gemm", n.arg(0).tensor_index(), n.arg(1).tensor_index(), shape, dt);
    } else if (o == "aten::bmm") {
      r = gemm("batch_gemm", n.arg(0).tensor_index(), n.arg(1).tensor_index(), shape, dt);
    } else if (o == "aten::addmm") {
      // beta * bias + alpha * (a @ b), as ATen computes it; a beta of 0 ignores the bias.
      r = gemm("gemm", n.arg(1).tensor_index(), n.arg(2).tensor_index(), shape, dt);
      const double beta = n.arg(3).as_double(), alpha = n.arg(4).as_double();
      if (alpha != 1.0)
        r = binary("mult_fwd", r, constant(alpha, std::vector<int64_t>(rank, 1), dt), shape, dt, ".alpha");
      if (beta != 0.0) {
        int32_t bias = operand(n, 0);
        if (beta != 1.0)
          bias = binary("mult_fwd", bias, constant(beta, std::vector<int64_t>(tensor(bias).shape.size(), 1), dt),
                        tensor(bias).shape, dt, ".beta");
        r = binary("add_fwd", bias, r, shape, dt, ".bias");
      }
    } else if (auto u = unary_kernels().find(o); u != unary_kernels().end()) {
      r = workspace(shape, dt);
      emit(kernel(u->second, dt), name_, {operand(n, 0)}, {r});
    } else if (o == "aten::gelu" || o == "aten::gelu_backward") {
      // (self, approximate) and (grad_output, self, approximate): the backward takes the grad,
      // then the forward's input; the parameter chooses the tanh approximation or the exact form.
      const bool bwd = o == "aten::gelu_backward";
      syn::GeluParams p{n.arg(bwd ? 2 : 1).as_string() == "tanh"};
      std::vector<int32_t> in = {operand(n, 0)};
      if (bwd) in.push_back(operand(n, 1));
      r = workspace(shape, dt);
      emit(kernel(bwd ? "gelu_bwd" : "gelu_fwd", dt), name_, in, {r}, bytes_of(p),
           std::string("approximation=") + (p.approximation ? "1" : "0"));
    } else if (o == "aten::threshold_backward") {
      // grad where self > 0: relu's backward (only a threshold of 0 is claimed).
      r = workspace(shape, dt);
      emit(kernel("relu_bwd", dt), name_, {as_rank(operand(n, 0), rank), as_rank(operand(n, 1), rank)}, {r});
    } else if (auto b = binary_kernels().find(o); b != binary_kernels().end()) {
      const int32_t a = operand(n, 0);
      int32_t other = n.arg(1).is_tensor() ? operand(n, 1) : number(n.arg(1), rank, dt);
      // add and sub: other * alpha first, as ATen does.
      if (auto alpha = n.find_arg("alpha"); alpha && (alpha->runtime_scalar() >= 0 || alpha->as_double() != 1.0))
        other = binary("mult_fwd", other, number(*alpha, rank, dt), shape, dt, ".alpha");
      r = binary(b->second, a, other, shape, dt);
    } else if (o == "aten::addcmul" || o == "aten::addcdiv") {
      // self + (value * tensor1) * tensor2 (or / tensor2), in the order ATen's CPU kernel computes it.
      const int32_t v = binary("mult_fwd", operand(n, 1), number(n.arg(3), rank, dt), shape, dt, ".value");
      const int32_t q = binary(o == "aten::addcmul" ? "mult_fwd" : "div_fwd", v, operand(n, 2), shape, dt, ".t2");
      r = binary("add_fwd", operand(n, 0), q, shape, dt);
    } else if (o == "aten::sum" || o == "aten::sum.dim_IntList") {
      const int32_t x = operand(n, 0);
      const size_t in_rank = tensor(x).shape.size();
      std::vector<int64_t> dims;
      if (o == "aten::sum")
        for (size_t d = 0; d < in_rank; ++d) dims.push_back(static_cast<int64_t>(d));
      else dims = dims_of(n.arg(1), in_rank);
      r = reduce("reduce_sum_fwd", x, dims, shape);
    } else if (o == "aten::mean.dim") {
      const int32_t x = operand(n, 0);
      r = reduce("reduce_mean_fwd", x, dims_of(n.arg(1), tensor(x).shape.size()), shape);
    } else if (o == "aten::_softmax" || o == "aten::_log_softmax") {
      int64_t d = n.arg(1).as_int();
      d = d < 0 ? d + static_cast<int64_t>(rank) : d;
      syn::SoftmaxParams p{syn_dim(d, rank)};
      r = workspace(shape, dt);
      emit(kernel(o == "aten::_softmax" ? "softmax_fwd" : "logsoftmax_fwd", dt), name_, {operand(n, 0)}, {r},
           bytes_of(p), "dim=" + std::to_string(p.dim));
    } else if (o == "aten::_softmax_backward_data" || o == "aten::_log_softmax_backward_data") {
      // (grad_output, output, dim, input_dtype): the kernel takes the forward's output, then the grad.
      int64_t d = n.arg(2).as_int();
      d = d < 0 ? d + static_cast<int64_t>(rank) : d;
      syn::SoftmaxParams p{syn_dim(d, rank)};
      r = workspace(shape, dt);
      emit(kernel(o == "aten::_softmax_backward_data" ? "softmax_bwd" : "logsoftmax_bwd", dt), name_,
           {operand(n, 1), operand(n, 0)}, {r}, bytes_of(p), "dim=" + std::to_string(p.dim));
    } else if (o == "aten::nll_loss_forward") {
      nll_loss_forward(n, dt);
      return;
    } else if (o == "aten::native_layer_norm") {
      // (input, normalized_shape, weight, bias, eps) -> (out, mean, rstd): over the last dim. The
      // kernel takes the bias before the weight, and its weight, bias, mean and rstd are float32
      // whatever the input's type: bfloat16 ones are cast on the way in and out.
      syn::LayerNormParams p{true, static_cast<float>(n.arg(4).as_double())};
      const auto outs = n.outputs();
      std::vector<int32_t> res = {workspace(shape, dt)};
      for (size_t k = 1; k < 3; ++k) res.push_back(workspace(g_.value(outs[k]).shape(), syn::kTypeFloat));
      emit(kernel("layer_norm_fwd", dt), name_, {operand(n, 0), f32(operand(n, 3)), f32(operand(n, 2))}, res,
           bytes_of(p), "eps=" + float_text(p.eps));
      for (size_t k = 0; k < 3; ++k) tensor_of_[outs[k]] = as_dtype(res[k], dtype_of(g_.value(outs[k]).dtype()));
      return;
    } else if (o == "aten::native_layer_norm_backward") {
      // (grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask) ->
      // (grad_input, grad_weight, grad_bias); the kernel gives the bias's gradient before the
      // weight's, both float32; a result not asked for is computed into the workspace.
      const int32_t x = operand(n, 1);
      const int64_t C = tensor(x).shape.back();
      const std::vector<int32_t> res = {workspace(tensor(x).shape, dt), workspace({C}, syn::kTypeFloat),
                                        workspace({C}, syn::kTypeFloat)};
      syn::LayerNormParams p{false, 0.0f};
      emit(kernel("layer_norm_bwd", dt), name_,
           {x, operand(n, 0), f32(operand(n, 3)), f32(operand(n, 4)), f32(operand(n, 5))}, res, bytes_of(p));
      const auto outs = n.outputs();
      const int32_t order[3] = {res[0], res[2], res[1]};
      for (size_t k = 0; k < 3; ++k)
        if (outs[k] >= 0) tensor_of_[outs[k]] = as_dtype(order[k], dtype_of(g_.value(outs[k]).dtype()));
      return;
    } else if (o == "aten::_native_batch_norm_legit_functional") {
      batch_norm(n, dt);
      return;
    } else if (o == "aten::native_batch_norm_backward") {
      batch_norm_backward(n, dt);
      return;
    } else if (o == "aten::convolution") {
      // (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups): the
      // MME's spatial_convolution on NHWC tensors, kiln's NCHW ones transposed in and out, then
      // the bias.
      const auto p = conv_params(n, 3, tensor(operand(n, 1)).shape);
      const int32_t x = transpose(operand(n, 0), {0, 2, 3, 1});
      const int32_t w = transpose(operand(n, 1), {2, 3, 1, 0});
      const int32_t y = workspace({shape[0], shape[2], shape[3], shape[1]}, dt);
      emit("spatial_convolution", name_, {x, w}, {y}, bytes_of(p), conv_text(p));
      r = transpose(y, {0, 3, 1, 2});
      if (!n.arg(2).is_none())
        r = binary("add_fwd", r, reshape(operand(n, 2), {1, shape[1], 1, 1}), shape, dt, ".bias");
    } else if (o == "aten::convolution_backward") {
      // (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
      // output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias): dedx and
      // dedw on NHWC tensors, the bias's gradient a sum over N, H and W; only the results used.
      const auto outs = n.outputs();
      const int32_t w_in = operand(n, 2);
      const auto p = conv_params(n, 4, tensor(w_in).shape);
      const int32_t g = transpose(operand(n, 0), {0, 2, 3, 1});
      if (outs[0] >= 0) {
        const int32_t w = transpose(w_in, {2, 3, 1, 0});
        const auto xs = g_.value(outs[0]).shape();
        const int32_t dx = workspace({xs[0], xs[2], xs[3], xs[1]}, dt);
        emit("dedx", name_ + ".dedx", {g, w}, {dx}, bytes_of(p), conv_text(p));
        tensor_of_[outs[0]] = transpose(dx, {0, 3, 1, 2});
      }
      if (outs[1] >= 0) {
        const int32_t x = transpose(operand(n, 1), {0, 2, 3, 1});
        const auto ws = tensor(w_in).shape;
        const int32_t dw = workspace({ws[2], ws[3], ws[1], ws[0]}, dt);
        emit("dedw", name_ + ".dedw", {g, x}, {dw}, bytes_of(p), conv_text(p));
        tensor_of_[outs[1]] = transpose(dw, {3, 2, 0, 1});
      }
      if (outs[2] >= 0)
        tensor_of_[outs[2]] = reduce("reduce_sum_fwd", operand(n, 0), {0, 2, 3}, g_.value(outs[2]).shape());
      return;
    } else if (o == "aten::embedding") {
      // (weight, indices, padding_idx, scale_grad_by_freq, sparse): rows of the table (its dim 0,
      // Synapse's dim 1) picked by the indices.
      syn::GatherParams p{1};
      r = workspace(shape, dt);
      emit(kernel("gather_fwd", dt), name_, {operand(n, 0), operand(n, 1)}, {r}, bytes_of(p), "axis=1");
    } else if (o == "aten::embedding_dense_backward") {
      // (grad_output, indices, num_weights, padding_idx, scale_grad_by_freq).
      syn::EmbeddingBackwardParams p{static_cast<int32_t>(n.arg(2).as_int()), static_cast<int32_t>(n.arg(3).as_int()),
                                     false};
      r = workspace(shape, dt);
      emit(kernel("embedding_dense_pt_bwd", dt), name_, {operand(n, 0), operand(n, 1)}, {r}, bytes_of(p),
           "num_weights=" + std::to_string(p.num_weights) + " padding_idx=" + std::to_string(p.padding_idx));
    } else if (o == "aten::nll_loss_backward") {
      // (grad_output, self, target, weight, reduction, ignore_index, total_weight). The kernel in
      // sum mode (none mode, a grad per row, for reduction none), and for a mean a division by the
      // total_weight given, as ATen divides (a total_weight from elsewhere than this step's forward
      // included).
      syn::NllLossParams p{n.arg(4).as_int() == 0 ? syn::kNllNone : syn::kNllSum,
                           static_cast<int32_t>(n.arg(5).as_int())};
      r = workspace(shape, dt);
      emit(kernel("nll_loss_bwd", dt), name_, {operand(n, 1), operand(n, 2), operand(n, 0)}, {r}, bytes_of(p),
           nll_text(p));
      if (n.arg(4).as_int() == 1) r = binary("div_fwd", r, operand(n, 6), shape, dt, ".mean");
    }
    if (r < 0) throw Unimplemented("node " + std::to_string(n.index()) + " (" + o + ") was not lowered");
    tensor_of_[out] = r;
  }

  // The convolution's parameters from its stride, padding and dilation (arguments `at` to at + 2),
  // groups (at + 5) and the weight's [K, C, R, S].
  syn::ConvolutionParams conv_params(const Node& n, size_t at, const std::vector<int64_t>& w) const {
    const auto stride = n.arg(at).as_ints(), pad = n.arg(at + 1).as_ints(), dil = n.arg(at + 2).as_ints();
    syn::ConvolutionParams p{};
    p.kernel_w = static_cast<uint32_t>(w[3]);
    p.kernel_h = static_cast<uint32_t>(w[2]);
    p.stride_w = static_cast<uint32_t>(stride[1]);
    p.stride_h = static_cast<uint32_t>(stride[0]);
    p.pad_left = p.pad_right = static_cast<int32_t>(pad[1]);
    p.pad_top = p.pad_bottom = static_cast<int32_t>(pad[0]);
    p.dilation_w = static_cast<uint32_t>(dil[1]);
    p.dilation_h = static_cast<uint32_t>(dil[0]);
    p.activation.num_channels = 1;
    p.groups = static_cast<uint32_t>(n.arg(at + 5).as_int());
    return p;
  }

  static std::string conv_text(const syn::ConvolutionParams& p) {
    return "kernel=" + std::to_string(p.kernel_w) + "x" + std::to_string(p.kernel_h) +
           " stride=" + std::to_string(p.stride_w) + "x" + std::to_string(p.stride_h) +
           " pad=" + std::to_string(p.pad_left) + "," + std::to_string(p.pad_right) + "," + std::to_string(p.pad_top) +
           "," + std::to_string(p.pad_bottom) + " dilation=" + std::to_string(p.dilation_w) + "x" +
           std::to_string(p.dilation_h) + " groups=" + std::to_string(p.groups);
  }

  // ATen's reduction (0 none, 1 mean, 2 sum) as the kernel's mode.
  static int32_t nll_mode(int64_t reduction) {
    return reduction == 0 ? syn::kNllNone : reduction == 1 ? syn::kNllMean : syn::kNllSum;
  }

  static std::string nll_text(const syn::NllLossParams& p) {
    return std::string("mode=") +
           (p.mode == syn::kNllMean  ? "mean"
            : p.mode == syn::kNllSum ? "sum"
                                     : "none") +
           " ignore_index=" + std::to_string(p.ignore_index);
  }

  static std::string batch_norm_text(const syn::BatchNormParams& p) {
    return "momentum=" + float_text(p.momentum) + " eps=" + float_text(p.epsilon) +
           " training=" + (p.is_training ? "1" : "0");
  }

  // (input, weight, bias, running_mean, running_var, training, momentum, eps) -> (out, save_mean,
  // save_invstd, running_mean_out, running_var_out), in training: batch_norm_fwd on the input as
  // NHWC (kiln's NCHW transposed in and the result out, as for the convolutions), the bias before
  // the weight, its four per-channel results float32 as ATen's are. The kernel normalizes with the
  // batch's mean and biased variance (save_invstd = 1 / sqrt(var + eps)) and updates the running
  // statistics as ATen does: (1 - momentum) * running + momentum * batch, the variance unbiased.
  void batch_norm(const Node& n, syn::DataType dt) {
    const int32_t x = transpose(operand(n, 0), {0, 2, 3, 1});
    const auto xs = tensor(x).shape;
    std::vector<int32_t> res = {workspace(xs, dt)};
    for (int k = 0; k < 4; ++k) res.push_back(workspace({xs[3]}, syn::kTypeFloat));
    syn::BatchNormParams p;
    std::memset(&p, 0, sizeof p);
    p.momentum = static_cast<float>(n.arg(6).as_double());
    p.epsilon = static_cast<float>(n.arg(7).as_double());
    p.is_training = true;
    emit(kernel("batch_norm_fwd", dt), name_, {x, operand(n, 2), operand(n, 1), operand(n, 3), operand(n, 4)}, res,
         bytes_of(p), batch_norm_text(p));
    const auto outs = n.outputs();
    tensor_of_[outs[0]] = transpose(res[0], {0, 3, 1, 2});
    for (size_t k = 1; k < 5; ++k) tensor_of_[outs[k]] = res[k];
  }

  // (grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
  // output_mask) -> (grad_input, grad_weight, grad_bias), in training: batch_norm_bwd on NHWC
  // tensors from the saved mean and invstd (the running statistics do not enter); the kernel gives
  // the bias's gradient before the weight's. A result not asked for is computed into the workspace.
  void batch_norm_backward(const Node& n, syn::DataType dt) {
    const int32_t x = transpose(operand(n, 1), {0, 2, 3, 1});
    const int32_t g = transpose(operand(n, 0), {0, 2, 3, 1});
    const auto xs = tensor(x).shape;
    const std::vector<int32_t> res = {workspace(xs, dt), workspace({xs[3]}, syn::kTypeFloat),
                                      workspace({xs[3]}, syn::kTypeFloat)};
    syn::BatchNormParams p;
    std::memset(&p, 0, sizeof p);
    p.epsilon = static_cast<float>(n.arg(8).as_double());
    p.is_training = true;
    emit(kernel("batch_norm_bwd", dt), name_, {x, g, operand(n, 5), operand(n, 6), operand(n, 2)}, res, bytes_of(p),
         batch_norm_text(p));
    const auto outs = n.outputs();
    if (outs[0] >= 0) tensor_of_[outs[0]] = transpose(res[0], {0, 3, 1, 2});
    if (outs[1] >= 0) tensor_of_[outs[1]] = res[2];
    if (outs[2] >= 0) tensor_of_[outs[2]] = res[1];
  }

  // (self, target, weight, reduction, ignore_index) -> (output, total_weight). The kernel gives the
  // loss (one per row for reduction none); total_weight, without a class weight, is the count of
  // rows whose target is not ignore_index: not_equal, cast to the float type, summed (0 for
  // reduction none, as ATen leaves it).
  void nll_loss_forward(const Node& n, syn::DataType dt) {
    const int32_t x = operand(n, 0), target = operand(n, 1);
    syn::NllLossParams p{nll_mode(n.arg(3).as_int()), static_cast<int32_t>(n.arg(4).as_int())};
    const auto outs = n.outputs();
    const int32_t loss = workspace(g_.value(outs[0]).shape(), dt);
    emit(kernel("nll_loss_fwd", dt), name_, {x, target}, {loss}, bytes_of(p), nll_text(p));
    tensor_of_[outs[0]] = loss;
    if (outs.size() < 2 || outs[1] < 0) return;
    if (p.mode == syn::kNllNone) {
      tensor_of_[outs[1]] = constant(0.0, g_.value(outs[1]).shape(), dt);
      return;
    }
    const int64_t rows = tensor(target).shape.at(0);
    const int32_t ignore = constant(static_cast<double>(p.ignore_index), {1}, syn::kTypeInt32);
    const int32_t kept = workspace({rows}, syn::kTypeInt8);
    emit("not_equal_fwd_i32", name_ + ".kept", {target, ignore}, {kept});
    const int32_t as_float = workspace({rows}, dt);
    emit(std::string("cast_i8_to_") + dtype_suffix(dt), name_ + ".cast", {kept}, {as_float});
    tensor_of_[outs[1]] = reduce("reduce_sum_fwd", as_float, {0}, g_.value(outs[1]).shape());
  }

  const Graph& g_;
  SynGraph out_;
  std::map<int64_t, int32_t> tensor_of_;  // kiln value -> tensor
  std::map<int64_t, int32_t> pending_t_;  // kiln value = aten::t of this tensor, not yet written out
  std::string name_;
};

std::string why_not_nll_loss(const Graph& g, const Node& n, bool backward) {
  const size_t first = backward ? 1 : 0;
  const auto x = g.value(n.arg(first).tensor_index());
  const auto t = g.value(n.arg(first + 1).tensor_index());
  if (x.ndim() != 2) return "log-probabilities of " + std::to_string(x.ndim()) + " dims (only [N, C] is lowered)";
  if (!is_int64(t.dtype()) || t.ndim() != 1) return "targets that are not int64 of one dim";
  if (!n.arg(first + 2).is_none()) return "a class weight (the weighted kernels are not lowered)";
  const int64_t reduction = n.arg(first + 3).as_int();
  if (reduction < 0 || reduction > 2) return "an unknown reduction";
  if (backward && !is_float(g.value(n.arg(0).tensor_index()).dtype())) return "a grad that is not a float";
  return "";
}

}  // namespace

std::string why_not_lowered(const Graph& g, const Node& n) {
  const std::string o = n.op();
  if (!unary_kernels().count(o) && !binary_kernels().count(o) && !structural_ops().count(o))
    return "no Synapse lowering for " + o + " yet";
  for (int64_t v : n.outputs())
    if (v < 0 && o != "aten::nll_loss_forward" && o != "aten::native_layer_norm_backward" &&
        o != "aten::convolution_backward" && o != "aten::native_batch_norm_backward")
      return "an undefined result";
  for (size_t i = 0; i < n.num_args(); ++i) {
    const auto a = n.arg(i);
    if (a.runtime_scalar() >= 0 && !runtime_scalar_allowed(o, i, a)) return "a run-time scalar argument";
  }
  const bool layer_norm = o == "aten::native_layer_norm" || o == "aten::native_layer_norm_backward";
  const bool batch_norm = o == "aten::_native_batch_norm_legit_functional" || o == "aten::native_batch_norm_backward";
  const bool several = o == "aten::nll_loss_forward" || layer_norm || batch_norm || o == "aten::convolution_backward";
  if (!several && n.outputs().size() != 1) return "more than one result";
  // One float type per node (targets aside): the kernels are chosen by it. A norm's weight, bias
  // and statistics (`stats`) are float32 in the kernels whatever the input's type.
  DLDataType first{};
  bool seen = false;
  const bool indexed = o == "aten::nll_loss_forward" || o == "aten::nll_loss_backward" || o == "aten::embedding" ||
                       o == "aten::embedding_dense_backward";
  const bool view = o == "aten::view" || o == "aten::_unsafe_view" || o == "aten::reshape" || o == "aten::clone" ||
                    o == "aten::alias" || o == "aten::detach";
  const bool counter = (o == "aten::add.Scalar" || o == "aten::add.Tensor") && n.arg(0).is_tensor() &&
                       is_int64(g.value(n.arg(0).tensor_index()).dtype());
  std::vector<int64_t> values = n.inputs();
  for (int64_t v : n.outputs())
    if (v >= 0) values.push_back(v);
  std::set<int64_t> stats;
  if (layer_norm || batch_norm) {
    const bool bwd = o == "aten::native_layer_norm_backward" || o == "aten::native_batch_norm_backward";
    std::set<int64_t> main = {n.arg(0).tensor_index(), n.outputs()[0]};
    if (bwd) main.insert(n.arg(1).tensor_index());
    for (int64_t v : values)
      if (!main.count(v)) stats.insert(v);
  }
  for (int64_t v : values) {
    const auto val = g.value(v);
    if (val.ndim() > kMaxRank)
      return "a tensor of " + std::to_string(val.ndim()) + " dims (the kernels take " + std::to_string(kMaxRank) + ")";
    if (val.numel() == 0) return "a tensor without elements (Synapse's sizes are at least 1)";
    if (is_int64(val.dtype()) && (indexed || view || counter)) continue;  // targets, views of them, counters
    if (!is_float(val.dtype())) return "a " + kiln::plugin::dtype_name(val.dtype()) + " tensor";
    if (stats.count(v)) continue;
    if (seen && !kiln::plugin::same_dtype(first, val.dtype())) return "float32 and bfloat16 tensors in one node";
    first = val.dtype();
    seen = true;
  }
  for (int64_t v : stats) {
    const auto t = g.value(v).dtype();
    if (batch_norm && !kiln::plugin::is_float32(t))
      return "batch norm with " + kiln::plugin::dtype_name(t) + " weights or statistics (float32 ones are lowered)";
    if (!kiln::plugin::is_float32(t) && !kiln::plugin::same_dtype(first, t))
      return "float32 and bfloat16 tensors in one node";
  }
  if (counter) {
    // A counter's step (batch norm's num_batches_tracked): an int32 add on the device, the value
    // narrowed on the way in and widened on the way out.
    if (g.value(n.arg(0).tensor_index()).numel() != 1) return "an int64 add of more than one element";
    if (n.arg(1).is_tensor() || n.arg(1).runtime_scalar() >= 0) return "an int64 add of other than a constant";
    const double step = n.arg(1).as_double();
    if (step != std::floor(step) || std::fabs(step) > 1e6) return "an int64 add of other than a small integer";
    if (auto alpha = n.find_arg("alpha"); alpha && (alpha->runtime_scalar() >= 0 || alpha->as_double() != 1.0))
      return "an int64 add with alpha";
    if (!is_int64(g.value(n.outputs()[0]).dtype())) return "an int64 add into another dtype";
  }
  if (view && !values.empty()) {
    const bool in64 = is_int64(g.value(n.arg(0).tensor_index()).dtype());
    if (in64 != is_int64(g.value(n.outputs()[0]).dtype())) return "a view that changes the dtype";
    if (in64 && o != "aten::view" && o != "aten::_unsafe_view" && o != "aten::reshape") return "a copy of int64 values";
  }
  if (o == "aten::nll_loss_forward" || o == "aten::nll_loss_backward")
    return why_not_nll_loss(g, n, o == "aten::nll_loss_backward");
  if (o == "aten::embedding" || o == "aten::embedding_dense_backward") {
    if (!is_int64(g.value(n.arg(1).tensor_index()).dtype())) return "indices that are not int64";
    for (int64_t v : values)
      if (v != n.arg(1).tensor_index() && is_int64(g.value(v).dtype())) return "an int64 table or gradient";
    if (g.value(o == "aten::embedding" ? n.arg(0).tensor_index() : n.outputs()[0]).ndim() != 2)
      return "an embedding table not of two dims";
    if (n.arg(o == "aten::embedding" ? 3 : 4).as_bool()) return "scale_grad_by_freq";
    if (o == "aten::embedding" && n.arg(4).as_bool()) return "a sparse embedding";
  }
  if (o == "aten::convolution" || o == "aten::convolution_backward") {
    const bool bwd = o == "aten::convolution_backward";
    const size_t at = bwd ? 4 : 3;
    if (g.value(n.arg(bwd ? 1 : 0).tensor_index()).ndim() != 4) return "a convolution of other than [N, C, H, W]";
    for (size_t i = at; i < at + 3; ++i)
      if (n.arg(i).as_ints().size() != 2) return "strides, padding or dilation not given per spatial dim";
    if (n.arg(at + 3).as_bool()) return "a transposed convolution";
    if (n.arg(at + 5).as_int() != 1) return "a grouped convolution";
  }
  if (o == "aten::native_layer_norm" || o == "aten::native_layer_norm_backward") {
    const bool bwd = o == "aten::native_layer_norm_backward";
    const auto x = g.value(n.arg(bwd ? 1 : 0).tensor_index());
    if (n.arg(bwd ? 2 : 1).as_ints().size() != 1) return "a layer norm over other than the last dim";
    if (x.ndim() < 2) return "a layer norm of fewer than two dims";
    if (n.arg(bwd ? 5 : 2).is_none() || n.arg(bwd ? 6 : 3).is_none()) return "a layer norm without weight and bias";
  }
  if (o == "aten::gelu" || o == "aten::gelu_backward") {
    const std::string a = n.arg(o == "aten::gelu" ? 1 : 2).as_string();
    if (a != "none" && a != "tanh") return "gelu with approximate '" + a + "'";
  }
  if (batch_norm) {
    const bool bwd = o == "aten::native_batch_norm_backward";
    if (g.value(n.arg(bwd ? 1 : 0).tensor_index()).ndim() != 4) return "a batch norm of other than [N, C, H, W]";
    if (!n.arg(bwd ? 7 : 5).as_bool()) return "batch norm in eval mode (training is lowered)";
    if (n.arg(2).is_none() || (!bwd && n.arg(1).is_none()))
      return "a batch norm without weight and bias (the affine one is lowered)";
    if (bwd && (n.arg(5).is_none() || n.arg(6).is_none())) return "a batch norm backward without the saved statistics";
  }
  if (o == "aten::threshold_backward" && n.arg(2).as_double() != 0.0)
    return "a threshold other than 0 (relu's backward is lowered)";
  if (o == "aten::addmm") {
    if (n.arg(3).runtime_scalar() >= 0 || n.arg(4).runtime_scalar() >= 0) return "a run-time beta or alpha";
    if (g.value(n.arg(1).tensor_index()).ndim() != 2) return "addmm of other than matrices";
  }
  if (o == "aten::bmm" && g.value(n.arg(0).tensor_index()).ndim() != 3) return "bmm of other than [B, M, K]";
  if (o == "aten::sum" || o == "aten::sum.dim_IntList" || o == "aten::mean.dim")
    if (auto dt = n.find_arg("dtype"); dt && !dt->is_none()) return "a reduction into another dtype";
  if ((o == "aten::_softmax" || o == "aten::_log_softmax") && n.arg(2).as_bool()) return "half_to_float";
  if (o == "aten::_softmax_backward_data" || o == "aten::_log_softmax_backward_data")
    if (!kiln::plugin::same_dtype(n.arg(3).as_dtype(), g.value(n.outputs()[0]).dtype()))
      return "a backward into another dtype";
  if (o == "aten::sum" || o == "aten::sum.dim_IntList" || o == "aten::mean.dim" || o == "aten::mm" ||
      o == "aten::_softmax" || o == "aten::_log_softmax")
    if (g.value(n.arg(0).tensor_index()).ndim() == 0) return "a rank-0 operand";
  return "";
}

SynGraph lower(const Graph& g) { return Lowering(g).run(); }

double constant_value(const SynGraph& g, const SynNode& n) {
  syn::ConstantParams p{};
  std::memcpy(&p, n.params.data(), std::min(n.params.size(), sizeof p));
  return g.tensors[static_cast<size_t>(n.outputs.at(0))].dtype == syn::kTypeInt32 ? p.constant.i : p.constant.f;
}

std::optional<SynGraph> dynamic_graph(const SynGraph& low, const SynGraph& high, std::string* why) {
  auto refuse = [&](const std::string& m) -> std::optional<SynGraph> {
    *why = m;
    return std::nullopt;
  };
  if (low.tensors.size() != high.tensors.size() || low.nodes.size() != high.nodes.size() || low.inputs != high.inputs ||
      low.outputs != high.outputs || low.scalars != high.scalars)
    return refuse("its lowerings at the smallest and largest sizes differ in their tensors or nodes");
  SynGraph g = high;
  for (size_t i = 0; i < g.tensors.size(); ++i) {
    SynTensor& t = g.tensors[i];
    const SynTensor& l = low.tensors[i];
    if (l.shape.size() != t.shape.size() || l.dtype != t.dtype || l.kind != t.kind || l.name != t.name)
      return refuse(
          "tensor "
          " + t.name + "
          " has another rank or dtype at the smallest sizes");
    for (size_t d = 0; d < t.shape.size(); ++d)
      if (l.shape[d] > t.shape[d])
        return refuse(
            "tensor "
            " + t.name + "
            " is smaller at the largest sizes");
    if (l.shape != t.shape) {
      if (t.kind == SynTensor::Kind::kScalar) return refuse("a run-time scalar whose sizes change");
      t.min_shape = l.shape;
    }
  }
  // Constants whose value follows the sizes become persistent size scalars (a launch writes the
  // value the lowering at its sizes gives); their node leaves the graph.
  std::vector<SynNode> nodes;
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const SynNode& n = g.nodes[k];
    const SynNode& l = low.nodes[k];
    if (n.guid != l.guid || n.inputs != l.inputs || n.outputs != l.outputs)
      return refuse("node " + n.name + " (" + n.guid + ") differs between its smallest and largest sizes");
    if (n.params == l.params) {
      nodes.push_back(n);
      continue;
    }
    SynTensor& out = g.tensors[static_cast<size_t>(n.outputs.at(0))];
    if (n.guid.rfind("constant_", 0) != 0 || out.kind != SynTensor::Kind::kWorkspace || out.dynamic())
      return refuse("node " + n.name + " (" + n.guid + ") has parameters that follow the sizes (" + l.params_text +
                    " at the smallest, " + n.params_text + " at the largest)");
    out.kind = SynTensor::Kind::kSizeScalar;
    out.index = static_cast<int64_t>(k);
    out.name = "size_scalar" + std::to_string(g.size_scalars.size());
    g.size_scalars.push_back(n.outputs[0]);
  }
  g.nodes = std::move(nodes);
  // A reshape whose output changes size reads its actual sizes from a shape tensor.
  for (SynNode& n : g.nodes) {
    if (n.guid != "reshape") continue;
    const int32_t o = n.outputs.at(0);
    if (!g.tensors[static_cast<size_t>(o)].dynamic()) continue;
    SynTensor st;
    st.name = "shape" + std::to_string(g.shape_tensors.size());
    st.shape = g.tensors[static_cast<size_t>(o)].shape;
    st.min_shape = g.tensors[static_cast<size_t>(o)].min_shape;
    st.dtype = syn::kTypeInt32;
    st.kind = SynTensor::Kind::kShape;
    st.index = o;
    g.tensors.push_back(st);
    const int32_t id = static_cast<int32_t>(g.tensors.size() - 1);
    g.shape_tensors.push_back(id);
    n.inputs.push_back(id);
  }
  return g;
}

namespace {

// c * (the product of free symbols), c = num / den: a tensor's element count over the symbols.
struct Monomial {
  int64_t num = 1, den = 1;
  std::vector<int32_t> symbols;  // sorted, with repeats
  void times(int64_t n, int64_t d) {
    num *= n;
    den *= d;
    const int64_t g = std::gcd(num, den);
    if (g > 1) num /= g, den /= g;
  }
};

}  // namespace

std::vector<SymbolRelation> symbol_relations(const Graph& symbolic) {
  const auto symbols = symbolic.symbols();
  std::vector<SymbolRelation> rel(symbols.size());
  std::map<std::pair<int64_t, int64_t>, KilnSizeSite> shape_site;
  for (const KilnSizeSite& s : symbolic.size_sites())
    if (s.kind == KILN_SIZE_SITE_SHAPE) shape_site[{s.at, s.elem}] = s;
  // The element count of value v with derived symbols written out; empty where a dim is not a
  // monomial (a site with a constant term).
  auto count = [&](int64_t v) -> std::optional<Monomial> {
    Monomial m;
    const auto shape = symbolic.value(v).shape();
    for (size_t d = 0; d < shape.size(); ++d) {
      auto it = shape_site.find({v, static_cast<int64_t>(d)});
      if (it == shape_site.end()) {
        m.times(shape[d], 1);
        continue;
      }
      const KilnSizeSite& s = it->second;
      if (s.constant != 0 || s.reciprocal || s.num <= 0) return std::nullopt;
      m.times(s.num, s.den);
      for (int32_t k = 0; k < s.num_factors; ++k) {
        const int32_t f = s.factors[k];
        if (f < 0 || static_cast<size_t>(f) >= rel.size()) return std::nullopt;
        const SymbolRelation& r = rel[static_cast<size_t>(f)];
        if (!r.derived) {
          m.symbols.push_back(f);
          continue;
        }
        m.times(r.num, r.den);
        m.symbols.insert(m.symbols.end(), r.factors.begin(), r.factors.end());
      }
    }
    std::sort(m.symbols.begin(), m.symbols.end());
    return m;
  };
  // A reshape keeps the element count: where, the common symbols cancelled, one side has a single
  // symbol the other lacks, that symbol is the other side over the rest. Until nothing changes.
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < symbolic.num_nodes(); ++i) {
      const Node n = symbolic.node(static_cast<int64_t>(i));
      const std::string o = n.op();
      if (o != "aten::view" && o != "aten::_unsafe_view" && o != "aten::reshape") continue;
      auto a = count(n.arg(0).tensor_index()), b = count(n.outputs().at(0));
      if (!a || !b) continue;
      std::vector<int32_t> only_a, only_b;
      std::set_difference(a->symbols.begin(), a->symbols.end(), b->symbols.begin(), b->symbols.end(),
                          std::back_inserter(only_a));
      std::set_difference(b->symbols.begin(), b->symbols.end(), a->symbols.begin(), a->symbols.end(),
                          std::back_inserter(only_b));
      // Where either side could be the derived one ([8, T] viewed as [8T]: T = 8T / 8 or 8T = 8 * T),
      // the one that is a whole multiple of the rest (8T), so the free symbols stay the smaller.
      auto whole = [](const Monomial& x, const Monomial& y) { return (y.num * x.den) % (y.den * x.num) == 0; };
      if (only_a.size() != 1 || (only_b.size() == 1 && !whole(*a, *b) && whole(*b, *a)))
        std::swap(a, b), std::swap(only_a, only_b);
      if (only_a.size() != 1 || std::count(only_b.begin(), only_b.end(), only_a[0])) continue;
      // a.c * x = b.c * rest, so x = (b.c / a.c) * rest.
      const int32_t x = only_a[0];
      SymbolRelation r;
      r.derived = true;
      Monomial c;
      c.times(b->num * a->den, b->den * a->num);
      r.num = c.num, r.den = c.den;
      r.factors = only_b;
      rel[static_cast<size_t>(x)] = r;
      // Relations written with x before are written without it now.
      for (auto& other : rel) {
        if (!other.derived || !std::count(other.factors.begin(), other.factors.end(), x)) continue;
        std::vector<int32_t> f;
        Monomial m;
        m.times(other.num, other.den);
        for (int32_t k : other.factors) {
          if (k != x) {
            f.push_back(k);
            continue;
          }
          m.times(r.num, r.den);
          f.insert(f.end(), r.factors.begin(), r.factors.end());
        }
        std::sort(f.begin(), f.end());
        other.num = m.num, other.den = m.den, other.factors = f;
      }
      changed = true;
    }
  }
  // Steps: a site that is c * s for one free symbol s with c = num / den needs s a multiple of den.
  for (const KilnSizeSite& s : symbolic.size_sites()) {
    if (s.num_factors < 1 || s.num_factors > 2 || s.num == 0) continue;
    Monomial m;
    m.times(s.num < 0 ? -s.num : s.num, s.den);
    bool ok = true;
    for (int32_t k = 0; k < s.num_factors && ok; ++k) {
      const int32_t f = s.factors[k];
      ok = f >= 0 && static_cast<size_t>(f) < rel.size();
      if (!ok) break;
      const SymbolRelation& r = rel[static_cast<size_t>(f)];
      if (!r.derived) {
        m.symbols.push_back(f);
      } else {
        m.times(r.num, r.den);
        m.symbols.insert(m.symbols.end(), r.factors.begin(), r.factors.end());
      }
    }
    if (!ok || m.symbols.size() != 1 || m.den == 1) continue;
    int64_t& step = rel[static_cast<size_t>(m.symbols[0])].step;
    step = std::lcm(step, m.den);
  }
  return rel;
}

std::optional<kiln::plugin::SizeBucket> size_range(const std::vector<SymbolRelation>& relations,
                                                   const std::string& policy, const std::vector<int64_t>& sizes) {
  if (relations.size() != sizes.size()) return std::nullopt;
  std::vector<int64_t> free;
  for (size_t i = 0; i < sizes.size(); ++i)
    if (!relations[i].derived) free.push_back(sizes[i]);
  auto fb = kiln::plugin::size_bucket(policy, free, "[plugin.hpu_backend] buckets");
  // Both ends on a multiple of the symbol's step (the call's own size is one).
  for (size_t i = 0, k = 0; i < sizes.size(); ++i) {
    if (relations[i].derived) continue;
    const int64_t st = relations[i].step;
    if (sizes[i] % st != 0) return std::nullopt;
    fb.low[k] = (fb.low[k] + st - 1) / st * st;
    fb.high[k] = (fb.high[k] + st - 1) / st * st;
    ++k;
  }
  kiln::plugin::SizeBucket b{sizes, sizes};
  // Each derived symbol at the free ones' values `at`; nullopt where it is not an integer >= 2.
  auto value = [&](const SymbolRelation& r, const std::vector<int64_t>& at) -> std::optional<int64_t> {
    int64_t p = r.num;
    for (int32_t f : r.factors) p *= at[static_cast<size_t>(f)];
    if (p % r.den != 0 || p / r.den < 2) return std::nullopt;
    return p / r.den;
  };
  std::vector<int64_t> low = sizes, high = sizes;
  for (size_t i = 0, k = 0; i < sizes.size(); ++i)
    if (!relations[i].derived) low[i] = fb.low[k], high[i] = fb.high[k++];
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (!relations[i].derived) continue;
    const auto at = value(relations[i], sizes), lo = value(relations[i], low), hi = value(relations[i], high);
    if (!at || *at != sizes[i] || !lo || !hi) return std::nullopt;
    b.low[i] = *lo, b.high[i] = *hi;
  }
  for (size_t i = 0; i < sizes.size(); ++i)
    if (!relations[i].derived) b.low[i] = low[i], b.high[i] = high[i];
  return b;
}

std::string SynGraph::dump() const {
  std::ostringstream s;
  s << "synapse graph {\n";
  auto kind = [](const SynTensor& t) -> std::string {
    switch (t.kind) {
      case SynTensor::Kind::kInput: return " input " + std::to_string(t.index);
      case SynTensor::Kind::kOutput: return " output " + std::to_string(t.index);
      case SynTensor::Kind::kScalar: return " runtime_scalar " + std::to_string(t.index);
      case SynTensor::Kind::kSizeScalar: return " size_scalar of node " + std::to_string(t.index);
      case SynTensor::Kind::kShape: return " shape_of " + std::to_string(t.index);
      default: return "";
    }
  };
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    s << "  tensor " << i << " \"" << t.name << "\" " << dtype_suffix(t.dtype) << ints_text(t.shape)
      << (t.dynamic() ? " min" + ints_text(t.min_shape) : "") << kind(t) << (t.widened ? " int64_on_host" : "") << "\n";
  }
  for (const auto& n : nodes) {
    s << "  node " << n.guid << " \"" << n.name << "\" (";
    for (size_t i = 0; i < n.inputs.size(); ++i) s << (i ? ", " : "") << n.inputs[i];
    s << ") -> (";
    for (size_t i = 0; i < n.outputs.size(); ++i) s << (i ? ", " : "") << n.outputs[i];
    s << ")";
    if (!n.params_text.empty()) s << " {" << n.params_text << "}";
    s << "\n";
  }
  s << "}\n";
  return s.str();
}

}  // namespace kiln::hpu
