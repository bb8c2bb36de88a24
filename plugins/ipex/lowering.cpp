#include "lowering.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>

#include <unistd.h>

#include <oneapi/dnnl/dnnl.hpp>
#include <oneapi/dnnl/dnnl_debug.h>

#include "dnnl_loader.h"

namespace kiln::ipex {

namespace {

// oneDNN's GELU (the erf form and the tanh form, alone or as a matmul post-op) approximates: in
// float32 its relative error reaches 7e-5 in the negative tail, where x * Phi(x) is small, against
// ATen's 1e-7. float32 GELU stays with ATen; in bfloat16 the error is far below the type's own.
// oneDNN's batch norm forward sums the statistics in float; ATen's CPU kernel in double. In the cnn
// workload that moved a batch-norm bias 7.7e-4 from eager in 12 steps, where eager itself moves
// 2.1e-5 from a one-ulp start: the forward stays with ATen (the backward, checked, does not drift).
const char* const kFloatBatchNormStatistics =
    "batch norm forward: oneDNN sums the statistics in float, ATen in double (cnn drifted 7.7e-4 from "
    "eager in 12 steps, beyond eager's noise floor)";

const char* const kFloat32Gelu =
    "float32 GELU: oneDNN's approximates it (relative error up to 7e-5 where the "
    "result is small); ATen's is exact";

// oneDNN's softmax and log-softmax round differently from ATen's (its exp and log are its own).
// A loss near zero (a model that fits its batch) is -log(1 + d) with d small, so a difference in
// the last bits of the sum is a large relative one: gpt's loss was 1.4e-4 from eager's after 20
// steps on a Xeon, where eager's own noise floor is 5.5e-7 (with ATen's: 3.7e-7). float32
// softmax stays with ATen, as float32 GELU does; bfloat16's own rounding is far coarser.
const char* const kFloat32Softmax =
    "float32 softmax / log-softmax: oneDNN's rounds differently from ATen's, and a loss near zero "
    "magnifies it (gpt's loss 1.4e-4 from eager's after 20 steps); ATen's is eager's";

using namespace kiln::plugin;
using dnnl::algorithm;
using dnnl::memory;
using dnnl::prop_kind;

bool is_bf16(DLDataType t) { return t.code == kDLBfloat && t.bits == 16 && t.lanes == 1; }

std::string dims_text(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
  return s + "]";
}

// "f32[4,5]", "bf16[5,4]{1,5}" (strides only when not contiguous).
std::string value_text(const Value& v) {
  std::string s = is_float32(v.dtype()) ? "f32" : is_bf16(v.dtype()) ? "bf16" : dtype_name(v.dtype());
  s += dims_text(v.shape());
  if (!v.is_contiguous()) {
    std::string st = dims_text(v.strides());
    s += "{" + st.substr(1, st.size() - 2) + "}";
  }
  return s;
}

// "aten::mm(f32[4,5], f32[5,3])": names the node in every message.
std::string node_text(const Graph& g, const Node& n) {
  std::string s = n.op() + "(";
  const std::vector<int64_t> ins = n.inputs();
  for (size_t i = 0; i < ins.size(); ++i) s += (i ? ", " : "") + value_text(g.value(ins[i]));
  return s + ")";
}

const char* status_name(dnnl_status_t s) { return dnnl_status2str(s); }

[[noreturn]] void fail(const std::string& where, const dnnl::error& e) {
  throw Error(KILN_ERROR_INTERNAL,
              where + ": oneDNN " + std::string(e.what()) + " (status dnnl_" + status_name(e.status) + ")");
}

// ---- What is taken ----------------------------------------------------------------------------

// Every tensor of a node: float32, or bfloat16 where bf16 is on; one dtype; on the CPU; not empty.
std::string check_tensors(const Graph& g, const Node& n, const Support& support, bool same_dtype_everywhere = true) {
  std::vector<int64_t> all = n.inputs();
  for (int64_t o : n.outputs())
    if (o >= 0) all.push_back(o);
  if (all.empty()) return "no tensors";
  const DLDataType first = g.value(all[0]).dtype();
  for (int64_t vi : all) {
    const Value v = g.value(vi);
    if (v.device().device_type != kDLCPU) return "a tensor is not on the CPU";
    if (is_bf16(v.dtype())) {
      if (!support.bf16) return "bf16 needs AVX-512-BF16 or AMX, which this CPU lacks";
    } else if (!is_float32(v.dtype())) {
      return "dtype " + dtype_name(v.dtype()) + " (float32 and bf16 only)";
    }
    if (same_dtype_everywhere && !same_dtype(v.dtype(), first)) return "mixed dtypes";
    if (v.ndim() == 0) return "a 0-d tensor";
    if (v.numel() == 0) return "an empty tensor";
  }
  return "";
}

// A matrix operand oneDNN's matmul reads in place: the last two dims have a unit stride (row- or
// column-major), batch strides any.
bool matrix_layout(const Value& v) {
  const auto st = v.strides();
  const auto sh = v.shape();
  const size_t r = st.size();
  if (r < 2) return false;
  for (int64_t s : st)
    if (s < 0) return false;
  const bool row = st[r - 1] == 1 || sh[r - 1] == 1;
  const bool col = st[r - 2] == 1 || sh[r - 2] == 1;
  return row || col;
}

std::optional<double> constant_number(const Node& n, const char* name) {
  const std::optional<Arg> a = n.find_arg(name);
  if (!a || a->runtime_scalar() >= 0) return std::nullopt;
  if (a->tag() != KILN_ARG_INT && a->tag() != KILN_ARG_DOUBLE) return std::nullopt;
  return a->as_double();
}

std::optional<int64_t> tensor_arg(const Node& n, const char* name) {
  const std::optional<Arg> a = n.find_arg(name);
  if (!a || !a->is_tensor()) return std::nullopt;
  return a->tensor_index();
}

bool none_arg(const Node& n, const char* name) {
  const std::optional<Arg> a = n.find_arg(name);
  return a && a->is_none();
}

std::optional<std::string> string_arg(const Node& n, const char* name) {
  const std::optional<Arg> a = n.find_arg(name);
  if (!a || a->tag() != KILN_ARG_STRING) return std::nullopt;
  return a->as_string();
}

int64_t normalize_dim(int64_t d, int rank) { return d < 0 ? d + rank : d; }

// The bias of addmm (or the other operand of a fused add) as oneDNN reads it against an [M,N]
// result: [N], [1,N] (per column) or the full [M,N].
bool bias_like(const Value& b, const std::vector<int64_t>& out) {
  const auto s = b.shape();
  if (s.size() == 1) return s[0] == out.back() && b.is_contiguous();
  if (s.size() != out.size()) return false;
  if (s == out) return b.strides().back() == 1 || s.back() == 1;
  for (size_t d = 0; d + 1 < s.size(); ++d)
    if (s[d] != 1) return false;
  return s.back() == out.back() && b.is_contiguous();
}

const char* const kAttentionBackward = "aten::_scaled_dot_product_flash_attention_for_cpu_backward";
constexpr double kAttentionScoreMiB = 256;  // the most the backward's score matrices may take

// [B,H,T,D] with a unit stride in D (as scaled_dot_product_attention's views of q, k and v are).
bool attention_operand(const Value& v, const std::vector<int64_t>& shape) {
  const std::vector<int64_t> st = v.strides();
  return v.shape() == shape && st[3] == 1 && std::all_of(st.begin(), st.end(), [](int64_t s) { return s >= 0; });
}

// ATen's CPU flash-attention backward in bf16 as matmuls on oneDNN (docs/backends/ipex.md,
// "Attention's backward"): no dropout, no mask other than the causal one, one sequence length.
std::string why_not_attention_backward(const Graph& g, const Node& n, const Support& support) {
  const auto outs = n.outputs();
  const auto grad = tensor_arg(n, "grad_out"), q = tensor_arg(n, "query"), k = tensor_arg(n, "key"),
             v = tensor_arg(n, "value"), out = tensor_arg(n, "out"), lse = tensor_arg(n, "logsumexp");
  if (!grad || !q || !k || !v || !out || !lse || outs.size() != 3) return "unexpected arguments";
  for (int64_t o : outs)
    if (o < 0) return "a gradient not asked for";
  const Value qv = g.value(*q);
  if (is_float32(qv.dtype()))
    return "float32 attention backward (bf16 only: in float32 ATen's kernel is eager's rounding)";
  if (std::string e = check_tensors(g, n, support, /*same_dtype_everywhere=*/false); !e.empty()) return e;
  const auto shape = qv.shape();
  if (shape.size() != 4) return "not [batch, heads, sequence, head size]";
  const char* names[] = {"grad_out", "query", "key", "value", "out", "grad_query", "grad_key", "grad_value"};
  const int64_t tensors[] = {*grad, *q, *k, *v, *out, outs[0], outs[1], outs[2]};
  for (size_t t = 0; t < 8; ++t) {
    const Value tv = g.value(tensors[t]);
    if (!is_bf16(tv.dtype())) return std::string("mixed dtypes: ") + names[t] + " is " + value_text(tv);
    if (!attention_operand(tv, shape))
      return std::string(names[t]) + " is " + value_text(tv) +
             ": not query's shape, or no unit stride in the head size";
  }
  const Value l = g.value(*lse);
  if (!is_float32(l.dtype()) || l.shape() != std::vector<int64_t>{shape[0], shape[1], shape[2]})
    return "logsumexp not float32 [batch, heads, sequence]";
  // The whole score matrices are kept (two float32 and two bf16: 12 bytes a score), where ATen's
  // kernel works through blocks of the sequence: long sequences stay with it.
  const double score_mib = 12.0 * static_cast<double>(shape[0] * shape[1]) * static_cast<double>(shape[2]) *
                           static_cast<double>(shape[2]) / (1 << 20);
  if (score_mib > kAttentionScoreMiB)
    return "the score matrices would take " + std::to_string(static_cast<int64_t>(score_mib)) + " MiB (more than " +
           std::to_string(static_cast<int64_t>(kAttentionScoreMiB)) + "; ATen's kernel works in blocks)";
  const auto dropout = constant_number(n, "dropout_p");
  if (!dropout || *dropout != 0.0) return "dropout";
  const auto causal = n.find_arg("is_causal");
  if (!causal || causal->tag() != KILN_ARG_BOOL) return "is_causal not a constant";
  if (!none_arg(n, "attn_mask")) return "an attention mask";
  if (!none_arg(n, "scale") && !constant_number(n, "scale")) return "scale not a constant";
  return "";
}

std::string why_not_node(const Graph& g, const Node& n, const Support& support) {
  const std::string op = n.op();
  auto outs = n.outputs();
  auto v = [&](int64_t i) { return g.value(i); };
  if (op == "aten::mm" || op == "aten::bmm" || op == "aten::addmm") {
    if (std::string e = check_tensors(g, n, support); !e.empty()) return e;
    const bool addmm = op == "aten::addmm";
    const auto a = tensor_arg(n, addmm ? "mat1" : "self"), b = tensor_arg(n, addmm ? "mat2" : "mat2");
    if (!a || !b || outs.size() != 1) return "unexpected arguments";
    const size_t rank = op == "aten::bmm" ? 3 : 2;
    if (static_cast<size_t>(v(*a).ndim()) != rank || static_cast<size_t>(v(*b).ndim()) != rank) return "rank";
    if (!matrix_layout(v(*a)) || !matrix_layout(v(*b)) || !matrix_layout(v(outs[0])))
      return "an operand whose matrix dims have no unit stride";
    if (addmm) {
      const auto bias = tensor_arg(n, "self");
      const auto beta = constant_number(n, "beta"), alpha = constant_number(n, "alpha");
      if (!bias || !beta || !alpha) return "beta/alpha not constant numbers";
      if (!bias_like(v(*bias), v(outs[0]).shape())) return "a bias that is not [N], [1,N] or [M,N]";
    }
    return "";
  }
  if (op == "aten::relu" || op == "aten::gelu") {
    if (std::string e = check_tensors(g, n, support); !e.empty()) return e;
    if (op == "aten::gelu" && is_float32(v(outs[0]).dtype())) return kFloat32Gelu;
    if (op == "aten::gelu") {
      const auto approx = string_arg(n, "approximate");
      if (!approx || (*approx != "none" && *approx != "tanh")) return "approximate is neither 'none' nor 'tanh'";
    }
    if (!v(n.inputs()[0]).is_contiguous() || !v(outs[0]).is_contiguous()) return "not contiguous";
    return "";
  }
  if (op == "aten::threshold_backward" || op == "aten::gelu_backward") {
    if (std::string e = check_tensors(g, n, support); !e.empty()) return e;
    const auto grad = tensor_arg(n, "grad_output"), self = tensor_arg(n, "self");
    if (!grad || !self || outs.size() != 1) return "unexpected arguments";
    if (v(*grad).shape() != v(*self).shape() || v(*grad).shape() != v(outs[0]).shape()) return "broadcasting";
    if (op == "aten::gelu_backward" && is_float32(v(outs[0]).dtype())) return kFloat32Gelu;
    if (!v(*grad).is_contiguous() || !v(*self).is_contiguous() || !v(outs[0]).is_contiguous()) return "not contiguous";
    if (op == "aten::threshold_backward") {
      const auto t = constant_number(n, "threshold");
      if (!t || *t != 0.0) return "a threshold other than 0 (ReLU's)";
    } else {
      const auto approx = string_arg(n, "approximate");
      if (!approx || (*approx != "none" && *approx != "tanh")) return "approximate is neither 'none' nor 'tanh'";
    }
    return "";
  }
  if (op == "aten::_softmax" || op == "aten::_log_softmax") {
    if (is_float32(v(outs[0]).dtype())) return kFloat32Softmax;
    if (std::string e = check_tensors(g, n, support); !e.empty()) return e;
    const auto h = n.find_arg("half_to_float");
    if (!h || h->tag() != KILN_ARG_BOOL || h->as_bool()) return "half_to_float";
    if (!v(n.inputs()[0]).is_contiguous() || !v(outs[0]).is_contiguous()) return "not contiguous";
    return "";
  }
  if (op == "aten::_softmax_backward_data" || op == "aten::_log_softmax_backward_data") {
    if (is_float32(v(outs[0]).dtype())) return kFloat32Softmax;
    if (std::string e = check_tensors(g, n, support); !e.empty()) return e;
    const auto grad = tensor_arg(n, "grad_output"), out = tensor_arg(n, "output");
    const auto idt = n.find_arg("input_dtype");
    if (!grad || !out || !idt || idt->tag() != KILN_ARG_SCALAR_TYPE) return "unexpected arguments";
    if (!same_dtype(idt->as_dtype(), v(*grad).dtype())) return "input_dtype differs from the gradient's";
    if (v(*grad).shape() != v(*out).shape()) return "broadcasting";
    if (!v(*grad).is_contiguous() || !v(*out).is_contiguous() || !v(outs[0]).is_contiguous()) return "not contiguous";
    return "";
  }
  if (op == "aten::native_layer_norm" || op == "aten::native_layer_norm_backward") {
    // float32 only: oneDNN keeps the statistics in float32, LibTorch keeps bf16 ones in bf16.
    if (std::string e = check_tensors(g, n, support); !e.empty()) return e;
    for (int64_t o : outs)
      if (o >= 0 && !is_float32(v(o).dtype())) return "bf16 layer norm (float32 only)";
    const auto input = tensor_arg(n, "input");
    const auto ns = n.find_arg("normalized_shape");
    if (!input || !ns || ns->tag() != KILN_ARG_INT_LIST) return "unexpected arguments";
    const auto shape = v(*input).shape();
    const auto norm = ns->as_ints();
    if (norm.empty() || norm.size() > shape.size() ||
        !std::equal(norm.begin(), norm.end(), shape.end() - static_cast<long>(norm.size())))
      return "normalized_shape is not the input's trailing dims";
    for (int64_t i : n.inputs())
      if (!v(i).is_contiguous()) return "not contiguous";
    for (int64_t o : outs)
      if (o >= 0 && !v(o).is_contiguous()) return "not contiguous";
    const bool backward = op == "aten::native_layer_norm_backward";
    const char* w = "weight";
    if (backward) {
      const auto mask = n.find_arg("output_mask");
      if (!mask || mask->tag() != KILN_ARG_BOOL_LIST) return "unexpected arguments";
      const auto m = mask->as_ints();
      if (m.size() != 3 || !m[0] || outs.size() != 3 || outs[0] < 0) return "no grad_input asked for";
      if (none_arg(n, w) && ((m[1] && outs[1] >= 0) || (m[2] && outs[2] >= 0)))
        return "weight or bias gradients without a weight";
    } else if (outs.size() != 3 || outs[0] < 0 || outs[1] < 0 || outs[2] < 0) {
      return "unexpected results";
    }
    return "";
  }
  if (op == "aten::_native_batch_norm_legit_functional") return kFloatBatchNormStatistics;
  if (op == "aten::native_batch_norm_backward") {
    // Training mode, float32 (a bf16 input comes with float32 statistics: mixed dtypes), contiguous,
    // 2 to 5 dims.
    if (std::string e = check_tensors(g, n, support); !e.empty()) return e;
    for (int64_t o : outs)
      if (o >= 0 && !is_float32(v(o).dtype())) return "bf16 batch norm (float32 only)";
    const auto input = tensor_arg(n, "input");
    if (!input) return "unexpected arguments";
    const auto shape = v(*input).shape();
    if (shape.size() < 2 || shape.size() > 5) return "input of other than 2 to 5 dims";
    int64_t count = 1;
    for (size_t d = 0; d < shape.size(); ++d)
      if (d != 1) count *= shape[d];
    if (count < 2) return "fewer than 2 values per channel";
    for (int64_t i : n.inputs())
      if (!v(i).is_contiguous()) return "not contiguous";
    for (int64_t o : outs)
      if (o >= 0 && !v(o).is_contiguous()) return "not contiguous";
    const auto training = n.find_arg("train");
    if (!training || training->tag() != KILN_ARG_BOOL || !training->as_bool()) return "evaluation mode";
    if (!constant_number(n, "eps")) return "eps not a constant";
    if (!tensor_arg(n, "save_mean") || !tensor_arg(n, "save_invstd")) return "no saved statistics";
    const auto mask = n.find_arg("output_mask");
    if (!mask || mask->tag() != KILN_ARG_BOOL_LIST) return "unexpected arguments";
    const auto m = mask->as_ints();
    if (m.size() != 3 || outs.size() != 3 || !m[0] || outs[0] < 0) return "no grad_input asked for";
    if (none_arg(n, "weight") && ((m[1] && outs[1] >= 0) || (m[2] && outs[2] >= 0)))
      return "weight or bias gradients without a weight";
    return "";
  }
  if (op == "aten::convolution" || op == "aten::convolution_backward") {
    if (std::string e = check_tensors(g, n, support); !e.empty()) return e;
    const auto input = tensor_arg(n, "input");
    const auto weight = tensor_arg(n, "weight");
    if (!input || !weight) return "unexpected arguments";
    if (v(*input).ndim() != 4 || v(*weight).ndim() != 4) return "not a 2-d convolution (NCHW)";
    const auto tr = n.find_arg("transposed");
    const auto groups = n.find_arg("groups");
    if (!tr || tr->tag() != KILN_ARG_BOOL || tr->as_bool()) return "transposed convolution";
    if (!groups || groups->tag() != KILN_ARG_INT || groups->as_int() != 1) return "grouped convolution";
    for (const char* list : {"stride", "padding", "dilation"}) {
      const auto a = n.find_arg(list);
      if (!a || a->tag() != KILN_ARG_INT_LIST || a->as_ints().size() != 2) return std::string("unexpected ") + list;
    }
    for (int64_t i : n.inputs())
      if (!v(i).is_contiguous()) return "not contiguous (NCHW only)";
    for (int64_t o : outs)
      if (o >= 0 && !v(o).is_contiguous()) return "not contiguous (NCHW only)";
    if (op == "aten::convolution_backward") {
      const auto mask = n.find_arg("output_mask");
      if (!mask || mask->tag() != KILN_ARG_BOOL_LIST || mask->as_ints().size() != 3 || outs.size() != 3)
        return "unexpected arguments";
    }
    return "";
  }
  if (op == kAttentionBackward) return why_not_attention_backward(g, n, support);
  return "not an op the ipex backend lowers";
}

bool is_matmul(const std::string& op) { return op == "aten::mm" || op == "aten::addmm" || op == "aten::bmm"; }

// add.Tensor is taken only as a post-op of the matmul whose result it adds to (alpha 1, the other
// operand [N], [1,N] or the full result), where that result has no other use.
std::string why_not_add(const Graph& g, const Node& n, const Support& support) {
  const auto self = tensor_arg(n, "self"), other = tensor_arg(n, "other");
  const auto alpha = constant_number(n, "alpha");
  if (!self || !other || !alpha || *alpha != 1.0 || *self == *other || n.outputs().size() != 1)
    return "add.Tensor is taken only after a matmul, with alpha 1";
  for (int64_t i = 0; i < static_cast<int64_t>(g.num_nodes()); ++i) {
    const Node p = g.node(i);
    if (!is_matmul(p.op()) || p.outputs().size() != 1) continue;
    const int64_t r = p.outputs()[0];
    if (r != *self && r != *other) continue;
    if (!why_not_node(g, p, support).empty()) continue;
    int uses = 0;
    for (int64_t k = 0; k < static_cast<int64_t>(g.num_nodes()); ++k)
      for (int64_t in : g.node(k).inputs()) uses += in == r;
    for (int64_t o : g.outputs()) uses += o == r;
    const Value res = g.value(r), o = g.value(r == *self ? *other : *self), out = g.value(n.outputs()[0]);
    if (uses == 1 && same_dtype(o.dtype(), res.dtype()) && same_dtype(out.dtype(), res.dtype()) &&
        o.device().device_type == kDLCPU && o.numel() > 0 && bias_like(o, res.shape()) && out.shape() == res.shape() &&
        matrix_layout(out))
      return "";
  }
  return "add.Tensor is taken only as a post-op of the matmul whose only use it is";
}

// ---- The compiled group -------------------------------------------------------------------------

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

memory::data_type dnnl_type(DLDataType t) { return is_bf16(t) ? memory::data_type::bf16 : memory::data_type::f32; }

size_t element_size(DLDataType t) { return (t.bits * t.lanes + 7) / 8; }

// One value the group touches: a subgraph input, a subgraph output, or a buffer of its own.
struct Slot {
  DLDataType dtype{};
  std::vector<int64_t> shape, strides;
  size_t bytes = 0;          // the extent the strides reach, in bytes
  int64_t temp_offset = -1;  // >= 0: a temporary at this offset of the group's buffer
};

struct Step {
  std::string what;
  dnnl::primitive prim;
  std::unordered_map<int, memory> args;
  std::vector<std::pair<memory, size_t>> binds;  // memory object, slot whose pointer it gets
  std::function<void(const std::vector<char*>&)> host;
  bool reorder = false;  // a layout conversion around a primitive (for the profile)
};

// `profile = true`: every step of every group compiled with it, timed; printed at exit (stderr),
// by kind (primitive, reorder, host) and by step (the op and its shapes), median ms per call times
// calls, so that a few slow calls on a busy machine do not decide.
class Profile {
 public:
  static Profile& get() {
    static Profile* p = [] {
      auto* prof = new Profile;
      std::atexit([] { Profile::get().print(); });
      return prof;
    }();
    return *p;
  }
  void add(const std::string& kind, const std::string& name, double ms) {
    std::lock_guard<std::mutex> lock(mu_);
    by_kind_[kind].push_back(ms);
    by_name_[kind + "  " + name].push_back(ms);
  }

 private:
  static double estimate(std::vector<double> v) {
    if (v.empty()) return 0;
    std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
    return v[v.size() / 2] * static_cast<double>(v.size());
  }
  void print() {
    std::lock_guard<std::mutex> lock(mu_);
    std::fprintf(stderr, "ipex profile (all executions of the process; median ms per call x calls):\n");
    std::vector<std::pair<double, std::string>> rows;
    std::map<std::string, double> kind_ms;
    for (const auto& [k, v] : by_name_) {
      rows.emplace_back(estimate(v), k);
      kind_ms[k.substr(0, k.find("  "))] += rows.back().first;
    }
    for (const auto& [k, v] : by_kind_)
      std::fprintf(stderr, "  %-10s %10.1f ms  %8zu calls\n", k.c_str(), kind_ms[k], v.size());
    std::sort(rows.rbegin(), rows.rend());
    for (size_t i = 0; i < rows.size() && i < 40; ++i) {
      const auto& v = by_name_[rows[i].second];
      std::fprintf(stderr, "  %10.1f ms %7zu x %8.3f ms  %s\n", rows[i].first, v.size(),
                   rows[i].first / static_cast<double>(v.size()), rows[i].second.c_str());
    }
  }
  std::mutex mu_;
  std::map<std::string, std::vector<double>> by_kind_, by_name_;
};

class Program : public Executable {
 public:
  Program(std::vector<Slot> slots, size_t n_in, size_t n_out, std::vector<Step> steps, size_t temp_bytes,
          bool profile = false)
      : slots_(std::move(slots)),
        n_in_(n_in),
        n_out_(n_out),
        steps_(std::move(steps)),
        stream_(engine()),
        profile_(profile) {
    if (temp_bytes > 0) {
      void* p = std::aligned_alloc(64, (temp_bytes + 63) / 64 * 64);
      if (!p) throw std::bad_alloc();
      temps_.reset(static_cast<char*>(p));
    }
  }

  void execute(const DLTensor* in, size_t n_in, DLTensor* out, size_t n_out, void*) override {
    if (n_in != n_in_ || n_out != n_out_)
      throw Error(KILN_ERROR_INVALID_ARGUMENT, "ipex: expected " + std::to_string(n_in_) + " inputs and " +
                                                   std::to_string(n_out_) + " outputs, got " + std::to_string(n_in) +
                                                   " and " + std::to_string(n_out));
    std::vector<char*> ptr(slots_.size(), nullptr);
    for (size_t i = 0; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      if (s.temp_offset >= 0) {
        ptr[i] = temps_.get() + s.temp_offset;
        continue;
      }
      const bool is_in = i < n_in_;
      const DLTensor* t = is_in ? &in[i] : &out[i - n_in_];
      const std::string which = is_in ? "input " + std::to_string(i) : "output " + std::to_string(i - n_in_);
      if (!t->data && s.bytes > 0) throw Error(KILN_ERROR_INVALID_ARGUMENT, "ipex: " + which + " has no data");
      Tensor view(t);
      if (!same_dtype(view.dtype(), s.dtype) || view.shape() != s.shape || view.strides() != s.strides)
        throw Error(KILN_ERROR_INVALID_ARGUMENT, "ipex: " + which + " is " + dtype_name(view.dtype()) +
                                                     dims_text(view.shape()) + " strides " + dims_text(view.strides()) +
                                                     ", compiled for " + dtype_name(s.dtype) + dims_text(s.shape) +
                                                     " strides " + dims_text(s.strides));
      if (view.device().device_type != kDLCPU)
        throw Error(KILN_ERROR_INVALID_ARGUMENT, "ipex: " + which + " is not on the CPU");
      ptr[i] = view.data<char>();
    }
    for (Step& st : steps_) {
      try {
        for (auto& [mem, slot] : st.binds) mem.set_data_handle(ptr[slot]);
        auto run = [&] {
          if (st.host) st.host(ptr);
          else st.prim.execute(stream_, st.args);
        };
        if (!profile_) {
          run();
          continue;
        }
        const auto t0 = std::chrono::steady_clock::now();  // only when profiling: no clock read per step
        run();
        stream_.wait();
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        Profile::get().add(st.host ? "host" : st.reorder ? "reorder" : "primitive", st.what, ms);
      } catch (const dnnl::error& e) {
        fail(st.what, e);
      }
    }
    stream_.wait();
  }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::vector<Slot> slots_;
  size_t n_in_, n_out_;
  std::vector<Step> steps_;
  dnnl::stream stream_;
  std::unique_ptr<char, Free> temps_;
  bool profile_ = false;
};

class Builder {
 public:
  Builder(const Graph& g) : g_(g) {}

  // The slot of value `v`, made on first use (a temporary unless it is an input or output).
  size_t slot(int64_t v) {
    auto it = slot_of_.find(v);
    if (it != slot_of_.end()) return it->second;
    const Value val = g_.value(v);
    Slot s;
    s.dtype = val.dtype();
    s.shape = val.shape();
    s.strides = val.strides();
    s.bytes = extent(s.shape, s.strides) * element_size(s.dtype);
    slots_.push_back(s);
    slot_of_[v] = slots_.size() - 1;
    if (!io_done_) return slots_.size() - 1;
    slots_.back().temp_offset = reserve(s.bytes);
    return slots_.size() - 1;
  }
  // A scratch buffer of `bytes` (a primitive's own layout of a value).
  size_t scratch_bytes(size_t bytes) {
    Slot s;
    s.dtype = DLDataType{kDLUInt, 8, 1};
    s.shape = {static_cast<int64_t>(bytes)};
    s.strides = {1};
    s.bytes = bytes;
    s.temp_offset = reserve(bytes);
    slots_.push_back(s);
    return slots_.size() - 1;
  }
  // A scratch buffer of the group (not a value): float32 [n].
  size_t scratch(int64_t n) {
    Slot s;
    s.dtype = dtype_float32();
    s.shape = {n};
    s.strides = {1};
    s.bytes = static_cast<size_t>(n) * 4;
    s.temp_offset = reserve(s.bytes);
    slots_.push_back(s);
    return slots_.size() - 1;
  }
  void inputs_and_outputs_done() { io_done_ = true; }

  memory::desc md(size_t slot) const {
    const Slot& s = slots_[slot];
    return memory::desc(memory::dims(s.shape.begin(), s.shape.end()), dnnl_type(s.dtype),
                        memory::dims(s.strides.begin(), s.strides.end()));
  }
  // Slot `slot` seen with other dims (a contiguous reshape).
  memory::desc md_as(size_t slot, const memory::dims& dims) const {
    return memory::desc(dims, dnnl_type(slots_[slot].dtype), contiguous(dims));
  }
  static memory::dims contiguous(const memory::dims& dims) {
    memory::dims st(dims.size());
    int64_t acc = 1;
    for (size_t d = dims.size(); d-- > 0;) {
      st[d] = acc;
      acc *= dims[d];
    }
    return st;
  }

  // Binds `arg` of `step` to the memory of `slot` with descriptor `desc`.
  void bind(Step& step, int arg, const memory::desc& desc, size_t slot) {
    memory m(desc, engine(), DNNL_MEMORY_NONE);
    step.args[arg] = m;
    step.binds.emplace_back(m, slot);
  }

  const Slot& slot_info(size_t s) const { return slots_[s]; }
  std::vector<Slot> take_slots() { return std::move(slots_); }
  size_t temp_bytes() const { return temp_bytes_; }
  const Graph& graph() const { return g_; }

 private:
  static size_t extent(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
    size_t e = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 0) return 0;
      e += static_cast<size_t>((shape[d] - 1) * strides[d]);
    }
    return e;
  }
  int64_t reserve(size_t bytes) {
    const int64_t at = static_cast<int64_t>(temp_bytes_);
    temp_bytes_ += (bytes + 63) / 64 * 64;
    return at;
  }

  const Graph& g_;
  std::vector<Slot> slots_;
  std::map<int64_t, size_t> slot_of_;
  bool io_done_ = false;
  size_t temp_bytes_ = 0;
};

// ---- max-autotune-no-cudagraphs: oneDNN's implementations of a matmul, timed ------------------

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string md_text(const memory::desc& md) {
  std::string t = std::to_string(static_cast<int>(md.get_data_type())) + ":";
  for (auto d : md.get_dims()) t += " " + std::to_string(d);
  t += " /";
  for (auto st : md.get_strides()) t += " " + std::to_string(st);
  return t;
}

// Scratch memory for each argument of a primitive (0.5 in every float element, zeros elsewhere).
struct ScratchArgs {
  std::vector<std::unique_ptr<char[]>> buffers;
  std::unordered_map<int, memory> mem;
  explicit ScratchArgs(const std::vector<std::pair<int, memory::desc>>& args) {
    for (const auto& [arg, md] : args) {
      const size_t bytes = md.get_size();
      buffers.emplace_back(new char[bytes + 64]());
      char* p = buffers.back().get();
      p += (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64;
      if (md.get_data_type() == memory::data_type::f32)
        for (size_t i = 0; i + 4 <= bytes; i += 4) {
          const float h = 0.5f;
          std::memcpy(p + i, &h, 4);
        }
      else if (md.get_data_type() == memory::data_type::bf16)
        for (size_t i = 0; i + 2 <= bytes; i += 2) {
          const uint16_t h = 0x3f00;
          std::memcpy(p + i, &h, 2);
        }
      mem.emplace(arg, memory(md, engine(), p));
    }
  }
};

// The median time in milliseconds of each primitive on the same scratch arguments: each run once
// to warm up, then in turns (one run of each per round, so that a slower moment of the machine
// falls on all of them) until 20 ms a primitive or 25 rounds have passed.
std::vector<double> time_in_turns(const std::vector<dnnl::primitive>& prims,
                                  const std::vector<std::pair<int, memory::desc>>& args, dnnl::stream& stream) {
  ScratchArgs scratch(args);
  for (const auto& p : prims) p.execute(stream, scratch.mem);
  stream.wait();
  std::vector<std::vector<double>> runs(prims.size());
  double total = 0;
  for (int round = 0; round < 25 && (round < 3 || total < 20.0 * static_cast<double>(prims.size())); ++round)
    for (size_t i = 0; i < prims.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      prims[i].execute(stream, scratch.mem);
      stream.wait();
      runs[i].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      total += runs[i].back();
    }
  std::vector<double> median;
  for (auto& r : runs) {
    std::sort(r.begin(), r.end());
    median.push_back(r[r.size() / 2]);
  }
  return median;
}

// The matmul implementation to use: oneDNN's first choice, or under tuning the fastest of those
// it offers (`make` builds the first choice afresh: next_impl moves a descriptor in place).
dnnl::matmul::primitive_desc tuned_matmul(const Tuning& t, const std::function<dnnl::matmul::primitive_desc()>& make,
                                          const std::vector<std::pair<int, memory::desc>>& args,
                                          const std::string& post_text, const std::string& what) {
  dnnl::matmul::primitive_desc first = make();
  if (!t.enabled) return first;
  // oneDNN's implementation list is short (a handful for matmul); 32 entries cover it.
  constexpr int kMaxImpls = 32;
  auto nth = [&](int k) {
    dnnl::matmul::primitive_desc pd = make();
    for (int j = 0; j < k; ++j)
      if (!pd.next_impl()) return std::optional<dnnl::matmul::primitive_desc>();
    return std::optional<dnnl::matmul::primitive_desc>(pd);
  };
  std::string key_text = "ipex-matmul-tune 1\noneDNN " + dnnl_library().version + " isa " +
                         std::to_string(static_cast<unsigned>(dnnl_get_effective_cpu_isa())) + "\n" + post_text;
  for (const auto& [arg, md] : args) key_text += "\n" + std::to_string(arg) + " " + md_text(md);
  char key[17];
  std::snprintf(key, sizeof key, "%016llx", static_cast<unsigned long long>(fnv1a(key_text)));
  const std::string path = t.dir.empty() ? "" : t.dir + "/" + key + ".tune";
  if (!path.empty()) {
    std::ifstream in(path);
    std::string word, name;
    if (in && in >> word && word == "impl" && std::getline(in >> std::ws, name)) {
      for (int k = 0; k < kMaxImpls; ++k) {
        auto pd = nth(k);
        if (!pd) break;
        if (pd->impl_info_str() == name) {
          if (t.info) t.info("max-autotune: " + what + ": " + name + " (tuned earlier: " + path + ")");
          return *pd;
        }
      }
      if (t.warn)
        t.warn("max-autotune: " + path + " names " + name + ", which oneDNN does not offer here: timing again");
    } else if (std::filesystem::exists(path) && t.warn) {
      t.warn("max-autotune: " + path + " is not a tuning record (first line 'impl <name>'): timing again");
    }
  }
  // oneDNN's list, each implementation once (the list may name one implementation several
  // times), in its order: index 0 is its first choice. On a CPU with AVX2 only, f32 matmuls have
  // one (gemm:jit), and tuning only records that.
  std::vector<dnnl::matmul::primitive_desc> pds;
  std::vector<std::string> names;
  std::vector<dnnl::primitive> prims;
  for (int k = 0; k < kMaxImpls; ++k) {
    auto pd = nth(k);
    if (!pd) break;
    const std::string name = pd->impl_info_str();
    if (std::find(names.begin(), names.end(), name) != names.end()) continue;
    // The reference implementations (ref:...) are oneDNN's correctness baseline, hundreds of
    // times slower: never a candidate.
    if (k > 0 && name.rfind("ref:", 0) == 0) continue;
    try {
      prims.push_back(dnnl::matmul(*pd));
    } catch (const dnnl::error&) {
      continue;  // an implementation that cannot be made here is not a candidate
    }
    pds.push_back(*pd);
    names.push_back(name);
  }
  if (prims.empty()) return first;
  size_t best = 0;
  std::string line = "max-autotune: " + what + ": ";
  std::vector<double> ms;
  if (prims.size() == 1) {
    line += "oneDNN offers one implementation, " + names[0];
  } else {
    dnnl::stream stream(engine());
    ms = time_in_turns(prims, args, stream);
    for (size_t i = 1; i < ms.size(); ++i)
      if (ms[i] < ms[best]) best = i;
    if (!(ms[best] <= 0.97 * ms[0])) best = 0;
    line += std::to_string(prims.size()) + " implementations timed (";
    char t_ms[32];
    for (size_t i = 0; i < ms.size(); ++i) {
      std::snprintf(t_ms, sizeof t_ms, "%.3f", ms[i]);
      line += (i ? ", " : "") + names[i] + " " + t_ms + " ms";
    }
    line += "): " + names[best] + (best == 0 ? " (oneDNN's first choice)" : "");
  }
  if (t.info) t.info(line);
  if (!path.empty()) {
    std::ostringstream rec;
    rec << "impl " << names[best] << "\n";
    for (size_t i = 0; i < ms.size(); ++i) rec << "timed " << ms[i] << " ms " << names[i] << "\n";
    // A temporary name of its own for each write: two contexts of the plugin in one process may
    // tune the same matmul at once.
    static std::atomic<uint64_t> writes{0};
    const std::string tmp = path + ".tmp" + std::to_string(::getpid()) + "." + std::to_string(writes++);
    std::ofstream out(tmp);
    out << rec.str();
    out.close();
    std::error_code ec;
    if (out) std::filesystem::rename(tmp, path, ec);
    if (!out || ec) {
      std::filesystem::remove(tmp, ec);
      if (t.warn) t.warn("max-autotune: could not write " + path + ": the next compile times this matmul again");
    }
  }
  return pds[best];
}

// ---- Lowerings ----------------------------------------------------------------------------------

algorithm gelu_algorithm(const Node& n) {
  return *string_arg(n, "approximate") == "tanh" ? algorithm::eltwise_gelu_tanh : algorithm::eltwise_gelu_erf;
}

// A matmul node and the element-wise nodes fused after it: relu, gelu, add of a tensor.
void lower_matmul(Builder& b, const std::vector<Node>& chain, std::vector<Step>& steps, const Tuning& tuning) {
  const Graph& g = b.graph();
  const Node& n = chain[0];
  const bool addmm = n.op() == "aten::addmm";
  Step st;
  st.what = node_text(g, n);
  for (size_t i = 1; i < chain.size(); ++i) st.what += " + " + chain[i].op();
  const size_t src = b.slot(*tensor_arg(n, addmm ? "mat1" : "self"));
  const size_t wei = b.slot(*tensor_arg(n, "mat2"));
  const size_t dst = b.slot(chain.back().outputs()[0]);
  const memory::desc dst_md = b.md(dst);
  const memory::dims out_dims = dst_md.get_dims();
  dnnl::post_ops po;
  int post = 0;
  std::vector<std::pair<int, size_t>> post_srcs;  // post-op index, slot
  auto binary_md = [&](size_t slot) {
    const Slot& s = b.slot_info(slot);
    memory::dims dims(s.shape.begin(), s.shape.end()), strides(s.strides.begin(), s.strides.end());
    while (dims.size() < out_dims.size()) {
      strides.insert(strides.begin(), dims.empty() ? 1 : dims[0] * strides[0]);
      dims.insert(dims.begin(), 1);
    }
    return memory::desc(dims, dnnl_type(s.dtype), strides);
  };
  std::optional<size_t> bias;
  memory::desc bias_md;
  if (addmm) {
    const size_t bs = b.slot(*tensor_arg(n, "self"));
    const double beta = *constant_number(n, "beta"), alpha = *constant_number(n, "alpha");
    const Slot& bsl = b.slot_info(bs);
    const bool row_bias = bsl.shape.size() == 1 || bsl.shape[0] == 1;
    if (beta == 1.0 && alpha == 1.0 && row_bias) {
      bias = bs;
      bias_md = memory::desc({1, out_dims.back()}, dnnl_type(bsl.dtype), {out_dims.back(), 1});
    } else if (beta == 0.0) {
      // beta 0: the bias is not read at all (LibTorch ignores even NaN there).
      if (alpha != 1.0) po.append_eltwise(algorithm::eltwise_linear, static_cast<float>(alpha), 0.f), ++post;
    } else {
      // beta * bias + alpha * (a @ b) = beta * (alpha / beta * (a @ b) + bias).
      if (alpha / beta != 1.0)
        po.append_eltwise(algorithm::eltwise_linear, static_cast<float>(alpha / beta), 0.f), ++post;
      po.append_binary(algorithm::binary_add, binary_md(bs));
      post_srcs.emplace_back(post++, bs);
      if (beta != 1.0) po.append_eltwise(algorithm::eltwise_linear, static_cast<float>(beta), 0.f), ++post;
    }
  }
  int64_t tail = n.outputs()[0];
  for (size_t i = 1; i < chain.size(); ++i) {
    const Node& p = chain[i];
    const std::string op = p.op();
    if (op == "aten::relu") {
      po.append_eltwise(algorithm::eltwise_relu, 0.f, 0.f);
    } else if (op == "aten::gelu") {
      po.append_eltwise(gelu_algorithm(p), 0.f, 0.f);
    } else {  // add.Tensor, alpha 1: the other operand
      const int64_t self = *tensor_arg(p, "self"), other = *tensor_arg(p, "other");
      const size_t os = b.slot(self == tail ? other : self);
      po.append_binary(algorithm::binary_add, binary_md(os));
      post_srcs.emplace_back(post, os);
    }
    ++post;
    tail = p.outputs()[0];
  }
  dnnl::primitive_attr attr;
  attr.set_post_ops(po);
  auto make = [&] {
    return bias ? dnnl::matmul::primitive_desc(engine(), b.md(src), b.md(wei), bias_md, dst_md, attr)
                : dnnl::matmul::primitive_desc(engine(), b.md(src), b.md(wei), dst_md, attr);
  };
  // What the tuner keys and times: the operands' descriptors and the post-ops.
  std::vector<std::pair<int, memory::desc>> timing_args = {
      {DNNL_ARG_SRC, b.md(src)}, {DNNL_ARG_WEIGHTS, b.md(wei)}, {DNNL_ARG_DST, dst_md}};
  if (bias) timing_args.emplace_back(DNNL_ARG_BIAS, bias_md);
  for (auto [idx, slot] : post_srcs)
    timing_args.emplace_back(DNNL_ARG_ATTR_MULTIPLE_POST_OP(idx) | DNNL_ARG_SRC_1, binary_md(slot));
  std::string post_text = n.op();
  if (addmm)
    post_text += " beta " + std::to_string(*constant_number(n, "beta")) + " alpha " +
                 std::to_string(*constant_number(n, "alpha"));
  for (size_t i = 1; i < chain.size(); ++i)
    post_text +=
        " " + chain[i].op() + (chain[i].op() == "aten::gelu" ? ":" + *string_arg(chain[i], "approximate") : "");
  dnnl::matmul::primitive_desc pd;
  try {
    pd = tuned_matmul(tuning, make, timing_args, post_text, st.what);
  } catch (const dnnl::error& e) {
    throw Unimplemented(st.what + ": oneDNN has no matmul for these layouts (status dnnl_" + status_name(e.status) +
                        ")");
  }
  st.prim = dnnl::matmul(pd);
  b.bind(st, DNNL_ARG_SRC, b.md(src), src);
  b.bind(st, DNNL_ARG_WEIGHTS, b.md(wei), wei);
  if (bias) b.bind(st, DNNL_ARG_BIAS, bias_md, *bias);
  b.bind(st, DNNL_ARG_DST, dst_md, dst);
  for (auto [idx, slot] : post_srcs)
    b.bind(st, DNNL_ARG_ATTR_MULTIPLE_POST_OP(idx) | DNNL_ARG_SRC_1, binary_md(slot), slot);
  steps.push_back(std::move(st));
}

void lower_eltwise(Builder& b, const Node& n, std::vector<Step>& steps) {
  const Graph& g = b.graph();
  Step st;
  st.what = node_text(g, n);
  const std::string op = n.op();
  const bool backward = op == "aten::threshold_backward" || op == "aten::gelu_backward";
  const algorithm alg =
      (op == "aten::relu" || op == "aten::threshold_backward") ? algorithm::eltwise_relu : gelu_algorithm(n);
  const size_t src = b.slot(*tensor_arg(n, "self"));
  const size_t out = b.slot(n.outputs()[0]);
  const memory::desc md = b.md(src);
  auto fwd = dnnl::eltwise_forward::primitive_desc(engine(), prop_kind::forward_training, alg, md, md, 0.f, 0.f);
  if (!backward) {
    st.prim = dnnl::eltwise_forward(fwd);
    b.bind(st, DNNL_ARG_SRC, md, src);
    b.bind(st, DNNL_ARG_DST, md, out);
  } else {
    const size_t grad = b.slot(*tensor_arg(n, "grad_output"));
    auto bwd = dnnl::eltwise_backward::primitive_desc(engine(), alg, md, md, md, 0.f, 0.f, fwd);
    st.prim = dnnl::eltwise_backward(bwd);
    b.bind(st, DNNL_ARG_SRC, md, src);
    b.bind(st, DNNL_ARG_DIFF_DST, md, grad);
    b.bind(st, DNNL_ARG_DIFF_SRC, md, out);
  }
  steps.push_back(std::move(st));
}

void lower_softmax(Builder& b, const Node& n, std::vector<Step>& steps) {
  const Graph& g = b.graph();
  Step st;
  st.what = node_text(g, n);
  const std::string op = n.op();
  const bool log = op.find("log_softmax") != std::string::npos;
  const algorithm alg = log ? algorithm::softmax_log : algorithm::softmax_accurate;
  const size_t out = b.slot(n.outputs()[0]);
  const memory::desc md = b.md(out);
  const int axis = static_cast<int>(normalize_dim(n.find_arg("dim")->as_int(), md.get_ndims()));
  auto fwd = dnnl::softmax_forward::primitive_desc(engine(), prop_kind::forward_training, alg, md, md, axis);
  if (op == "aten::_softmax" || op == "aten::_log_softmax") {
    st.prim = dnnl::softmax_forward(fwd);
    b.bind(st, DNNL_ARG_SRC, md, b.slot(*tensor_arg(n, "self")));
    b.bind(st, DNNL_ARG_DST, md, out);
  } else {
    auto bwd = dnnl::softmax_backward::primitive_desc(engine(), alg, md, md, md, axis, fwd);
    st.prim = dnnl::softmax_backward(bwd);
    b.bind(st, DNNL_ARG_DST, md, b.slot(*tensor_arg(n, "output")));
    b.bind(st, DNNL_ARG_DIFF_DST, md, b.slot(*tensor_arg(n, "grad_output")));
    b.bind(st, DNNL_ARG_DIFF_SRC, md, out);
  }
  steps.push_back(std::move(st));
}

float bf16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest, ties to even, as ATen's c10::BFloat16 (NaN stays NaN).
uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);  // branch-free: vectorizes
}

// The backward of scaled_dot_product_attention (bf16, no dropout, causal or not), from what ATen's
// CPU flash-attention forward saved (its output and the rows' logsumexp of the scaled scores):
//   S = Q K^T (float32), P = exp(scale S - lse) (0 above the diagonal when causal),
//   dV = P^T dO, dP = dO V^T, dS = scale P (dP - rowsum(dO * O)), dQ = dS K, dK = dS^T Q,
// the four products as oneDNN matmuls of bf16 operands with float32 accumulation (P and dS
// rounded to bf16 for them, as ATen's kernel rounds them), the element-wise part in float32 on
// the host. ATen's kernel works through blocks of the sequence and is slow on short ones (4.3 ms
// against 1.4 ms for these matmuls done with ATen's own ops, gpt's [8,6,64,64] on 2 cores).
void lower_attention_backward(Builder& b, const Node& n, std::vector<Step>& steps) {
  const Graph& g = b.graph();
  const std::string what = node_text(g, n);
  const size_t grad = b.slot(*tensor_arg(n, "grad_out")), q = b.slot(*tensor_arg(n, "query")),
               k = b.slot(*tensor_arg(n, "key")), v = b.slot(*tensor_arg(n, "value")),
               out = b.slot(*tensor_arg(n, "out")), lse = b.slot(*tensor_arg(n, "logsumexp"));
  const auto outs = n.outputs();
  const size_t dq = b.slot(outs[0]), dk = b.slot(outs[1]), dv = b.slot(outs[2]);
  const auto shape = b.slot_info(q).shape;
  const int64_t B = shape[0], H = shape[1], T = shape[2], D = shape[3];
  const bool causal = n.find_arg("is_causal")->as_bool();
  const double scale_d = none_arg(n, "scale") ? 1.0 / std::sqrt(static_cast<double>(D)) : *constant_number(n, "scale");
  const float scale = static_cast<float>(scale_d);
  const int64_t rows = B * H * T, square = T * T;
  const size_t s_f32 = b.scratch(rows * T), dp_f32 = b.scratch(rows * T);
  const size_t p_bf16 = b.scratch_bytes(static_cast<size_t>(rows * T) * 2),
               ds_bf16 = b.scratch_bytes(static_cast<size_t>(rows * T) * 2);
  const memory::dims sq_dims{B, H, T, T}, sq_strides{H * square, square, T, 1}, sq_t_strides{H * square, square, 1, T};
  const memory::desc sq_f32(sq_dims, memory::data_type::f32, sq_strides);
  const memory::desc sq_bf16(sq_dims, memory::data_type::bf16, sq_strides);
  const memory::desc sq_bf16_t(sq_dims, memory::data_type::bf16, sq_t_strides);  // the transpose
  // Slot `s` ([B,H,T,D]) as is, or as its transpose [B,H,D,T].
  auto operand = [&](size_t s, bool transposed) {
    const Slot& sl = b.slot_info(s);
    memory::dims dims{B, H, T, D}, st(sl.strides.begin(), sl.strides.end());
    if (transposed) std::swap(dims[2], dims[3]), std::swap(st[2], st[3]);
    return memory::desc(dims, memory::data_type::bf16, st);
  };
  auto matmul = [&](const char* name, const memory::desc& a, size_t a_slot, const memory::desc& w, size_t w_slot,
                    const memory::desc& d, size_t d_slot) {
    Step st;
    st.what = what + " (" + name + ")";
    st.prim = dnnl::matmul(dnnl::matmul::primitive_desc(engine(), a, w, d));
    b.bind(st, DNNL_ARG_SRC, a, a_slot);
    b.bind(st, DNNL_ARG_WEIGHTS, w, w_slot);
    b.bind(st, DNNL_ARG_DST, d, d_slot);
    steps.push_back(std::move(st));
  };
  matmul("S = Q K^T", operand(q, false), q, operand(k, true), k, sq_f32, s_f32);
  const auto lse_strides = b.slot_info(lse).strides;
  Step probs;
  probs.what = what + " (P)";
  probs.host = [=](const std::vector<char*>& p) {
    float* s = reinterpret_cast<float*>(p[s_f32]);
    uint16_t* pb = reinterpret_cast<uint16_t*>(p[p_bf16]);
    const float* l = reinterpret_cast<const float*>(p[lse]);
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < T; ++i) {
          const float li = l[bi * lse_strides[0] + h * lse_strides[1] + i * lse_strides[2]];
          const int64_t row = ((bi * H + h) * T + i) * T, last = causal ? i + 1 : T;
          for (int64_t j = 0; j < last; ++j) s[row + j] = std::exp(scale * s[row + j] - li);
          for (int64_t j = 0; j < last; ++j) pb[row + j] = float_to_bf16(s[row + j]);
          std::fill(s + row + last, s + row + T, 0.f);
          std::fill(pb + row + last, pb + row + T, uint16_t{0});
        }
  };
  steps.push_back(std::move(probs));
  matmul("dV = P^T dO", sq_bf16_t, p_bf16, operand(grad, false), grad, operand(dv, false), dv);
  matmul("dP = dO V^T", operand(grad, false), grad, operand(v, true), v, sq_f32, dp_f32);
  const auto g_st = b.slot_info(grad).strides, o_st = b.slot_info(out).strides;
  Step dscores;
  dscores.what = what + " (dS)";
  dscores.host = [=](const std::vector<char*>& p) {
    const float* pr = reinterpret_cast<const float*>(p[s_f32]);
    const float* dp = reinterpret_cast<const float*>(p[dp_f32]);
    const uint16_t* go = reinterpret_cast<const uint16_t*>(p[grad]);
    const uint16_t* o = reinterpret_cast<const uint16_t*>(p[out]);
    uint16_t* ds = reinterpret_cast<uint16_t*>(p[ds_bf16]);
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < T; ++i) {
          const uint16_t* gr = go + bi * g_st[0] + h * g_st[1] + i * g_st[2];
          const uint16_t* orow = o + bi * o_st[0] + h * o_st[1] + i * o_st[2];
          float di = 0.f;
          for (int64_t d = 0; d < D; ++d) di += bf16_to_float(gr[d]) * bf16_to_float(orow[d]);
          const int64_t row = ((bi * H + h) * T + i) * T, last = causal ? i + 1 : T;
          for (int64_t j = 0; j < last; ++j) ds[row + j] = float_to_bf16(scale * pr[row + j] * (dp[row + j] - di));
          std::fill(ds + row + last, ds + row + T, uint16_t{0});  // P is 0 there
        }
  };
  steps.push_back(std::move(dscores));
  matmul("dQ = dS K", sq_bf16, ds_bf16, operand(k, false), k, operand(dq, false), dq);
  matmul("dK = dS^T Q", sq_bf16_t, ds_bf16, operand(q, false), q, operand(dk, false), dk);
}

// Batch norm's backward in training mode: oneDNN's batch_normalization_backward over the input as
// it is (N, C, spatial). ATen saves invstd = 1/sqrt(var + eps); oneDNN takes the (biased)
// variance, which a host step gives back from invstd (in double).
void lower_batch_norm_backward(Builder& b, const Node& n, std::vector<Step>& steps) {
  const Graph& g = b.graph();
  const std::string what = node_text(g, n);
  const size_t input = b.slot(*tensor_arg(n, "input"));
  const auto shape = b.slot_info(input).shape;
  const memory::dims dims(shape.begin(), shape.end());
  const int64_t channels = shape[1];
  const memory::desc data_md = b.md_as(input, dims);
  const memory::desc vec_md({channels}, memory::data_type::f32, memory::dims{1});
  const auto weight = tensor_arg(n, "weight");
  const auto outs = n.outputs();
  const double eps = *constant_number(n, "eps");
  const size_t variance = b.scratch(channels);
  const size_t mean = b.slot(*tensor_arg(n, "save_mean")), invstd = b.slot(*tensor_arg(n, "save_invstd"));
  Step to_var;
  to_var.what = what + " (variance)";
  to_var.host = [variance, invstd, channels, eps](const std::vector<char*>& p) {
    const float* is = reinterpret_cast<const float*>(p[invstd]);
    float* var = reinterpret_cast<float*>(p[variance]);
    for (int64_t c = 0; c < channels; ++c) {
      const double i = is[c];
      var[c] = static_cast<float>(1.0 / (i * i) - eps);
    }
  };
  steps.push_back(std::move(to_var));
  auto flags = dnnl::normalization_flags::none;
  if (weight) flags |= dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
  auto fwd = dnnl::batch_normalization_forward::primitive_desc(engine(), prop_kind::forward_training, data_md, data_md,
                                                               static_cast<float>(eps), flags);
  auto pd = dnnl::batch_normalization_backward::primitive_desc(engine(), prop_kind::backward, data_md, data_md, data_md,
                                                               static_cast<float>(eps), flags, fwd);
  Step st;
  st.what = what;
  st.prim = dnnl::batch_normalization_backward(pd);
  b.bind(st, DNNL_ARG_SRC, data_md, input);
  b.bind(st, DNNL_ARG_DIFF_DST, data_md, b.slot(*tensor_arg(n, "grad_out")));
  b.bind(st, DNNL_ARG_MEAN, vec_md, mean);
  b.bind(st, DNNL_ARG_VARIANCE, vec_md, variance);
  b.bind(st, DNNL_ARG_DIFF_SRC, data_md, b.slot(outs[0]));
  if (weight) {
    b.bind(st, DNNL_ARG_SCALE, vec_md, b.slot(*weight));
    b.bind(st, DNNL_ARG_DIFF_SCALE, vec_md, outs[1] >= 0 ? b.slot(outs[1]) : b.scratch(channels));
    b.bind(st, DNNL_ARG_DIFF_SHIFT, vec_md, outs[2] >= 0 ? b.slot(outs[2]) : b.scratch(channels));
  }
  steps.push_back(std::move(st));
}

// native_layer_norm keeps rstd = 1/sqrt(var + eps); oneDNN keeps the variance. Forward writes rstd
// from oneDNN's variance, backward gives oneDNN the variance back from rstd (both float32 loops).
void lower_layer_norm(Builder& b, const Node& n, std::vector<Step>& steps) {
  const Graph& g = b.graph();
  const std::string what = node_text(g, n);
  const bool backward = n.op() == "aten::native_layer_norm_backward";
  const size_t input = b.slot(*tensor_arg(n, "input"));
  const auto shape = b.slot_info(input).shape;
  const auto norm = n.find_arg("normalized_shape")->as_ints();
  int64_t cols = 1, rows = 1;
  for (size_t d = 0; d < shape.size(); ++d) (d + norm.size() < shape.size() ? rows : cols) *= shape[d];
  const memory::dims dims = {rows, cols};
  const memory::desc data_md = b.md_as(input, dims);
  const memory::desc stat_md({rows}, memory::data_type::f32, memory::dims{1});
  const memory::desc vec_md({cols}, memory::data_type::f32, memory::dims{1});
  const auto weight = tensor_arg(n, "weight"), bias = tensor_arg(n, "bias");
  const auto outs = n.outputs();
  const size_t variance = b.scratch(rows);
  if (!backward) {
    const float eps = static_cast<float>(n.find_arg("eps")->as_double());
    auto flags = dnnl::normalization_flags::none;
    if (weight) flags |= dnnl::normalization_flags::use_scale;
    if (bias) flags |= dnnl::normalization_flags::use_shift;
    auto pd = dnnl::layer_normalization_forward::primitive_desc(engine(), prop_kind::forward_training, data_md, data_md,
                                                                stat_md, eps, flags);
    Step st;
    st.what = what;
    st.prim = dnnl::layer_normalization_forward(pd);
    b.bind(st, DNNL_ARG_SRC, data_md, input);
    b.bind(st, DNNL_ARG_DST, data_md, b.slot(outs[0]));
    const size_t mean = b.slot(outs[1]);
    b.bind(st, DNNL_ARG_MEAN, stat_md, mean);
    b.bind(st, DNNL_ARG_VARIANCE, stat_md, variance);
    if (weight) b.bind(st, DNNL_ARG_SCALE, vec_md, b.slot(*weight));
    if (bias) b.bind(st, DNNL_ARG_SHIFT, vec_md, b.slot(*bias));
    steps.push_back(std::move(st));
    Step rstd;
    rstd.what = what + " (rstd)";
    const size_t r = b.slot(outs[2]);
    rstd.host = [variance, r, rows, eps](const std::vector<char*>& p) {
      const float* var = reinterpret_cast<const float*>(p[variance]);
      float* out = reinterpret_cast<float*>(p[r]);
      for (int64_t i = 0; i < rows; ++i) out[i] = 1.f / std::sqrt(var[i] + eps);
    };
    steps.push_back(std::move(rstd));
    return;
  }
  // The backward has no eps argument: any eps gives the same result, as oneDNN adds back what is
  // taken off here. 1e-5 keeps var + eps well away from zero.
  const float eps = 1e-5f;
  const size_t mean = b.slot(*tensor_arg(n, "mean")), rstd = b.slot(*tensor_arg(n, "rstd"));
  Step to_var;
  to_var.what = what + " (variance)";
  to_var.host = [variance, rstd, rows, eps](const std::vector<char*>& p) {
    const float* rs = reinterpret_cast<const float*>(p[rstd]);
    float* var = reinterpret_cast<float*>(p[variance]);
    for (int64_t i = 0; i < rows; ++i) var[i] = 1.f / (rs[i] * rs[i]) - eps;
  };
  steps.push_back(std::move(to_var));
  auto flags = dnnl::normalization_flags::none;
  if (weight) flags |= dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
  auto fwd = dnnl::layer_normalization_forward::primitive_desc(engine(), prop_kind::forward_training, data_md, data_md,
                                                               stat_md, eps, flags);
  auto pd = dnnl::layer_normalization_backward::primitive_desc(engine(), prop_kind::backward, data_md, data_md, data_md,
                                                               stat_md, eps, flags, fwd);
  Step st;
  st.what = what;
  st.prim = dnnl::layer_normalization_backward(pd);
  b.bind(st, DNNL_ARG_SRC, data_md, input);
  b.bind(st, DNNL_ARG_DIFF_DST, data_md, b.slot(*tensor_arg(n, "grad_out")));
  b.bind(st, DNNL_ARG_MEAN, stat_md, mean);
  b.bind(st, DNNL_ARG_VARIANCE, stat_md, variance);
  b.bind(st, DNNL_ARG_DIFF_SRC, data_md, b.slot(outs[0]));
  if (weight) {
    b.bind(st, DNNL_ARG_SCALE, vec_md, b.slot(*weight));
    // oneDNN asks for the shift with use_shift, although the backward does not read it.
    b.bind(st, DNNL_ARG_SHIFT, vec_md, bias ? b.slot(*bias) : b.scratch(cols));
    b.bind(st, DNNL_ARG_DIFF_SCALE, vec_md, outs[1] >= 0 ? b.slot(outs[1]) : b.scratch(cols));
    b.bind(st, DNNL_ARG_DIFF_SHIFT, vec_md, outs[2] >= 0 ? b.slot(outs[2]) : b.scratch(cols));
  }
  steps.push_back(std::move(st));
}

memory::dims int_list(const Node& n, const char* name) {
  const auto v = n.find_arg(name)->as_ints();
  return memory::dims(v.begin(), v.end());
}

memory::desc any_layout(const memory::desc& md) {
  return memory::desc(md.get_dims(), md.get_data_type(), memory::format_tag::any);
}

// The slot holding `slot` (plain layout `plain`) in the layout `want` a primitive chose: the slot
// itself when they agree, else a temporary filled by a reorder step added now.
size_t reorder_in(Builder& b, std::vector<Step>& steps, const std::string& what, size_t slot, const memory::desc& plain,
                  const memory::desc& want) {
  if (want == plain) return slot;
  const size_t to = b.scratch_bytes(want.get_size());
  Step st;
  st.what = what;
  st.reorder = true;
  st.prim = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), plain, engine(), want));
  b.bind(st, DNNL_ARG_FROM, plain, slot);
  b.bind(st, DNNL_ARG_TO, want, to);
  steps.push_back(std::move(st));
  return to;
}

// The other way: where a primitive writes `slot` in layout `have`, a temporary, and the step that
// reorders it into the slot's plain layout (to be added after the primitive).
struct Out {
  size_t written;
  std::optional<Step> copy;
};
Out reorder_out(Builder& b, const std::string& what, size_t slot, const memory::desc& plain, const memory::desc& have) {
  if (have == plain) return {slot, std::nullopt};
  const size_t from = b.scratch_bytes(have.get_size());
  Step st;
  st.what = what;
  st.reorder = true;
  st.prim = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), have, engine(), plain));
  b.bind(st, DNNL_ARG_FROM, have, from);
  b.bind(st, DNNL_ARG_TO, plain, slot);
  return {from, std::move(st)};
}

// 2-d convolution, NCHW tensors. oneDNN picks its own (blocked) layouts for the data and the
// weights, as LibTorch's and IPEX's convolutions do: its direct AVX-512/AMX kernels need them, and
// the plain-layout path is a slower im2col + GEMM. The group reorders into and out of them around
// each primitive, the weights once per step.
void lower_convolution(Builder& b, const Node& n, std::vector<Step>& steps) {
  const Graph& g = b.graph();
  const std::string what = node_text(g, n);
  const bool backward = n.op() == "aten::convolution_backward";
  const memory::dims stride = int_list(n, "stride"), pad = int_list(n, "padding");
  memory::dims dilation = int_list(n, "dilation");
  for (auto& d : dilation) d -= 1;  // oneDNN counts the gaps
  const size_t input = b.slot(*tensor_arg(n, "input")), weight = b.slot(*tensor_arg(n, "weight"));
  const auto outs = n.outputs();
  const memory::desc src_md = b.md(input), wei_md = b.md(weight);
  const memory::dim oc = wei_md.get_dims()[0];
  const memory::desc bias_md({oc}, wei_md.get_data_type(), memory::dims{1});
  const size_t dst_slot = backward ? b.slot(*tensor_arg(n, "grad_output")) : b.slot(outs[0]);
  const memory::desc dst_md = b.md(dst_slot);
  const auto bias = backward ? std::nullopt : tensor_arg(n, "bias");
  const auto mask = backward ? n.find_arg("output_mask")->as_ints() : std::vector<int64_t>{};
  const bool want_bias = backward && mask[2] && outs[2] >= 0;
  const auto fwd_kind = prop_kind::forward_training;
  const algorithm direct = algorithm::convolution_direct;
  auto fwd = (bias || want_bias)
                 ? dnnl::convolution_forward::primitive_desc(engine(), fwd_kind, direct, any_layout(src_md),
                                                             any_layout(wei_md), bias_md, any_layout(dst_md), stride,
                                                             dilation, pad, pad)
                 : dnnl::convolution_forward::primitive_desc(engine(), fwd_kind, direct, any_layout(src_md),
                                                             any_layout(wei_md), any_layout(dst_md), stride, dilation,
                                                             pad, pad);
  if (!backward) {
    const size_t src = reorder_in(b, steps, what + " (input layout)", input, src_md, fwd.src_desc());
    const size_t wei = reorder_in(b, steps, what + " (weight layout)", weight, wei_md, fwd.weights_desc());
    Out dst = reorder_out(b, what + " (output layout)", dst_slot, dst_md, fwd.dst_desc());
    Step st;
    st.what = what;
    st.prim = dnnl::convolution_forward(fwd);
    b.bind(st, DNNL_ARG_SRC, fwd.src_desc(), src);
    b.bind(st, DNNL_ARG_WEIGHTS, fwd.weights_desc(), wei);
    if (bias) b.bind(st, DNNL_ARG_BIAS, bias_md, b.slot(*bias));
    b.bind(st, DNNL_ARG_DST, fwd.dst_desc(), dst.written);
    steps.push_back(std::move(st));
    if (dst.copy) steps.push_back(std::move(*dst.copy));
    return;
  }
  if (mask[0] && outs[0] >= 0) {
    auto pd = dnnl::convolution_backward_data::primitive_desc(engine(), direct, any_layout(src_md), any_layout(wei_md),
                                                              any_layout(dst_md), stride, dilation, pad, pad, fwd);
    const size_t dd = reorder_in(b, steps, what + " (gradient layout)", dst_slot, dst_md, pd.diff_dst_desc());
    const size_t wei = reorder_in(b, steps, what + " (weight layout)", weight, wei_md, pd.weights_desc());
    Out ds = reorder_out(b, what + " (input gradient layout)", b.slot(outs[0]), src_md, pd.diff_src_desc());
    Step st;
    st.what = what + " (data)";
    st.prim = dnnl::convolution_backward_data(pd);
    b.bind(st, DNNL_ARG_DIFF_DST, pd.diff_dst_desc(), dd);
    b.bind(st, DNNL_ARG_WEIGHTS, pd.weights_desc(), wei);
    b.bind(st, DNNL_ARG_DIFF_SRC, pd.diff_src_desc(), ds.written);
    steps.push_back(std::move(st));
    if (ds.copy) steps.push_back(std::move(*ds.copy));
  }
  const bool want_weights = mask[1] && outs[1] >= 0;
  if (want_weights || want_bias) {
    auto pd = want_bias ? dnnl::convolution_backward_weights::primitive_desc(
                              engine(), direct, any_layout(src_md), any_layout(wei_md), bias_md, any_layout(dst_md),
                              stride, dilation, pad, pad, fwd)
                        : dnnl::convolution_backward_weights::primitive_desc(engine(), direct, any_layout(src_md),
                                                                             any_layout(wei_md), any_layout(dst_md),
                                                                             stride, dilation, pad, pad, fwd);
    const size_t src = reorder_in(b, steps, what + " (input layout)", input, src_md, pd.src_desc());
    const size_t dd = reorder_in(b, steps, what + " (gradient layout)", dst_slot, dst_md, pd.diff_dst_desc());
    const size_t gw_slot = want_weights ? b.slot(outs[1]) : b.scratch_bytes(wei_md.get_size());
    Out dw = reorder_out(b, what + " (weight gradient layout)", gw_slot, wei_md, pd.diff_weights_desc());
    Step st;
    st.what = what + " (weights)";
    st.prim = dnnl::convolution_backward_weights(pd);
    b.bind(st, DNNL_ARG_SRC, pd.src_desc(), src);
    b.bind(st, DNNL_ARG_DIFF_DST, pd.diff_dst_desc(), dd);
    b.bind(st, DNNL_ARG_DIFF_WEIGHTS, pd.diff_weights_desc(), dw.written);
    if (want_bias) b.bind(st, DNNL_ARG_DIFF_BIAS, bias_md, b.slot(outs[2]));
    steps.push_back(std::move(st));
    if (dw.copy) steps.push_back(std::move(*dw.copy));
  }
}

}  // namespace

bool cpu_has_bf16() {
  if (!dnnl_library().loaded) return false;
  const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
}

std::string why_not(const Graph& g, int64_t i, const Support& support) {
  const Node n = g.node(i);
  for (int64_t o : n.outputs())
    if (o >= 0) g.value(o);  // throws for an index outside the graph
  for (int64_t in : n.inputs()) g.value(in);
  if (n.op() == "aten::add.Tensor") return why_not_add(g, n, support);
  return why_not_node(g, n, support);
}

std::unique_ptr<Executable> compile_group(const Graph& g, const Support& support, const Tuning& tuning, bool profile) {
  const DnnlLibrary& lib = dnnl_library();
  if (!lib.loaded) throw Error(KILN_ERROR_UNAVAILABLE, lib.error);
  const int64_t num_nodes = static_cast<int64_t>(g.num_nodes());
  for (int64_t i = 0; i < num_nodes; ++i)
    if (std::string why = why_not(g, i, support); !why.empty())
      throw Unimplemented("node " + std::to_string(i) + " " + node_text(g, g.node(i)) + ": " + why);

  Builder b(g);
  for (int64_t v : g.inputs()) b.slot(v);
  const size_t n_in = g.inputs().size();
  for (int64_t v : g.outputs()) b.slot(v);
  // An output that is also an input, or one value under two output positions, would need a copy.
  {
    std::map<int64_t, int> seen;
    for (int64_t v : g.inputs()) seen[v]++;
    for (int64_t v : g.outputs())
      if (seen[v]++)
        throw Unimplemented("value " + std::to_string(v) + " is both an input and an output, or two outputs");
  }
  b.inputs_and_outputs_done();

  // Uses of every value inside the group, and which values leave it.
  std::map<int64_t, int> uses;
  std::map<int64_t, std::vector<int64_t>> consumers;
  for (int64_t i = 0; i < num_nodes; ++i)
    for (int64_t v : g.node(i).inputs()) {
      uses[v]++;
      consumers[v].push_back(i);
    }
  std::map<int64_t, bool> leaves;
  for (int64_t v : g.outputs()) leaves[v] = true;

  // Fusion: a matmul absorbs the relu, gelu or add (alpha 1) that is the only user of its result,
  // then the one after that, while the result goes nowhere else. The fused primitive runs where the
  // last absorbed node stood, so the other operand of an add is ready by then.
  std::map<int64_t, std::vector<int64_t>> chain_at;  // position -> nodes (matmul first)
  std::vector<bool> absorbed(static_cast<size_t>(num_nodes), false);
  for (int64_t i = 0; i < num_nodes; ++i) {
    const Node n = g.node(i);
    if (!is_matmul(n.op())) continue;
    std::vector<int64_t> chain = {i};
    int64_t tail = n.outputs()[0];
    const DLDataType dt = g.value(tail).dtype();
    const auto out_shape = g.value(tail).shape();
    while (!leaves[tail] && uses[tail] == 1) {
      const int64_t c = consumers[tail][0];
      const Node p = g.node(c);
      const std::string op = p.op();
      bool ok = false;
      if (op == "aten::relu" || (op == "aten::gelu" && !is_float32(dt))) {
        ok = true;
      } else if (op == "aten::add.Tensor" && p.outputs().size() == 1) {
        const auto self = tensor_arg(p, "self"), other = tensor_arg(p, "other");
        const auto alpha = constant_number(p, "alpha");
        if (self && other && alpha && *alpha == 1.0 && *self != *other) {
          const Value o = g.value(*self == tail ? *other : *self);
          ok = same_dtype(o.dtype(), dt) && o.device().device_type == kDLCPU && o.numel() > 0 &&
               bias_like(o, out_shape) && g.value(p.outputs()[0]).shape() == out_shape &&
               same_dtype(g.value(p.outputs()[0]).dtype(), dt);
        }
      }
      if (!ok) break;
      // The fused result is written with the strides of the last node's output.
      if (!matrix_layout(g.value(p.outputs()[0]))) break;
      chain.push_back(c);
      absorbed[static_cast<size_t>(c)] = true;
      tail = p.outputs()[0];
    }
    chain_at[chain.back()] = chain;
  }

  std::vector<Step> steps;
  for (int64_t i = 0; i < num_nodes; ++i) {
    const Node n = g.node(i);
    const std::string op = n.op();
    try {
      if (auto it = chain_at.find(i); it != chain_at.end()) {
        std::vector<Node> chain;
        for (int64_t k : it->second) chain.push_back(g.node(k));
        lower_matmul(b, chain, steps, tuning);
        continue;
      }
      if (absorbed[static_cast<size_t>(i)] || is_matmul(op)) continue;  // runs in a fused step
      if (op == "aten::add.Tensor")
        throw Unimplemented("node " + std::to_string(i) + " " + node_text(g, n) + ": add only fused after a matmul");
      if (op == "aten::relu" || op == "aten::gelu" || op == "aten::threshold_backward" || op == "aten::gelu_backward")
        lower_eltwise(b, n, steps);
      else if (op.find("softmax") != std::string::npos) lower_softmax(b, n, steps);
      else if (op.find("layer_norm") != std::string::npos) lower_layer_norm(b, n, steps);
      else if (op == "aten::native_batch_norm_backward") lower_batch_norm_backward(b, n, steps);
      else if (op == kAttentionBackward) lower_attention_backward(b, n, steps);
      else lower_convolution(b, n, steps);
    } catch (const dnnl::error& e) {
      throw Unimplemented(node_text(g, n) + ": oneDNN has no primitive for it (status dnnl_" + status_name(e.status) +
                          ": " + e.what() + ")");
    }
  }
  const size_t temp_bytes = b.temp_bytes();
  return std::make_unique<Program>(b.take_slots(), n_in, g.outputs().size(), std::move(steps), temp_bytes, profile);
}

}  // namespace kiln::ipex
