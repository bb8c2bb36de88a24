// A stand-in for libSynapse.so, built only for the tests and never installed: it implements the
// entry points the hpu_backend calls (plugins/hpu_backend/synapse_abi.h), checks that they are
// called as the public API describes (live handles, tensors with a dtype and a geometry, every
// node's operands produced before it reads them, operand counts, dtypes and sizes each kernel's
// contract allows, compile before launch, every persistent tensor given a big enough device buffer
// at launch, the workspace, copies inside mapped host memory and device allocations, every
// allocation freed before the device is released), records each graph, and at synLaunchExt runs
// it with ATen: each GUID computed as its documented meaning. A broken rule is a violation: the
// call returns a failing synStatus, the message goes to stderr and to kiln_fake_synapse_report(),
// and with KILN_FAKE_SYNAPSE_ABORT=1 the process aborts.
//
// Failures on request, read at each call: KILN_FAKE_SYNAPSE_FAIL_COMPILE=1 (or =<guid>: graphs with
// that kernel) fails synGraphCompile; KILN_FAKE_SYNAPSE_FAIL_LAUNCH=1 fails synLaunchExt;
// KILN_FAKE_SYNAPSE_DEVICE_MEMORY=<bytes> makes synDeviceMalloc run out beyond that many bytes.
#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "synapse_abi.h"

namespace syn = kiln::hpu::syn;

namespace {

struct FSection {
  bool destroyed = false;
};

struct FTensor {
  std::string name;
  int32_t dtype = 0;
  std::vector<int64_t> sizes;      // fastest first, as set (the largest sizes)
  std::vector<int64_t> min_sizes;  // the smallest, where set
  bool has_geometry = false;
  bool shape_tensor = false;  // holds no data: a launch gives its sizes
  FSection* section = nullptr;
  bool destroyed = false;
};

struct FNode {
  std::string guid, name;
  std::vector<FTensor*> in, out;
  std::vector<uint8_t> params;
};

struct FGraph {
  int32_t device_type = 0;
  std::vector<std::unique_ptr<FTensor>> tensors;
  std::vector<std::unique_ptr<FSection>> sections;
  std::vector<FNode> nodes;
};

// A compiled graph: its tensors in ATen's order of dims (slowest first), nodes by tensor index.
struct RTensor {
  std::string name;
  int32_t dtype = 0;
  std::vector<int64_t> shape;      // the largest sizes
  std::vector<int64_t> min_shape;  // the smallest (the same for a static tensor)
  bool persistent = false;
  bool shape_tensor = false;
  bool dynamic() const { return min_shape != shape; }
};
struct RNode {
  std::string guid, name;
  std::vector<int> in, out;
  std::vector<uint8_t> params;
};
struct FRecipe {
  std::string name;
  std::vector<RTensor> tensors;
  std::vector<RNode> nodes;
  uint64_t workspace = 0;
};

struct FStream {};

struct State {
  std::mutex mu;
  bool initialized = false;
  bool acquired = false;
  syn::DeviceId device = 7;
  std::set<FGraph*> graphs;
  std::set<FRecipe*> recipes;
  std::set<FStream*> streams;
  std::map<uint64_t, uint64_t> allocations;  // address -> bytes
  std::map<uintptr_t, uint64_t> host_maps;   // address -> bytes
  uint64_t allocated = 0;
  std::vector<std::string> violations;
  std::string last_error;
  int64_t compiles = 0, launches = 0, nodes_run = 0, serialized = 0, deserialized = 0, releases = 0;
  std::map<std::string, int64_t> guids_run;
};

// Never destroyed: the plugin's own teardown may call in during the process's exit.
State& st() {
  static State* s = new State;
  return *s;
}

syn::Status violation(const std::string& m, syn::Status s = syn::kInvalidArgument) {
  st().violations.push_back(m);
  st().last_error = m;
  std::fprintf(stderr, "fake libSynapse: VIOLATION: %s\n", m.c_str());
  if (const char* a = std::getenv("KILN_FAKE_SYNAPSE_ABORT"); a && std::string(a) == "1") std::abort();
  return s;
}

syn::Status injected(const std::string& m, syn::Status s) {
  st().last_error = "injected: " + m;
  std::fprintf(stderr, "fake libSynapse: injected failure: %s\n", m.c_str());
  return s;
}

std::string env(const char* n) {
  const char* v = std::getenv(n);
  return v ? v : "";
}

#define FAKE_LOCK std::lock_guard<std::mutex> lock_(st().mu)
#define NEED_INIT(call) \
  if (!st().initialized) return violation(std::string(call) + " before synInitialize", syn::kUninitialized)

bool live_graph(syn::GraphHandle g) { return st().graphs.count(reinterpret_cast<FGraph*>(g)) > 0; }

FTensor* find_tensor(syn::TensorHandle t) {
  auto* p = reinterpret_cast<FTensor*>(t);
  for (FGraph* g : st().graphs)
    for (auto& x : g->tensors)
      if (x.get() == p && !x->destroyed) return p;
  return nullptr;
}

at::ScalarType scalar_type(int32_t d) {
  switch (d) {
    case syn::kTypeFloat: return at::kFloat;
    case syn::kTypeBf16: return at::kBFloat16;
    case syn::kTypeInt32: return at::kInt;
    case syn::kTypeInt8: return at::kChar;
    case syn::kTypeInt16: return at::kShort;
    default: return at::kFloat;
  }
}

const char* suffix_of(int32_t d) {
  switch (d) {
    case syn::kTypeFloat: return "f32";
    case syn::kTypeBf16: return "bf16";
    case syn::kTypeInt32: return "i32";
    case syn::kTypeInt8: return "i8";
    default: return "?";
  }
}

uint64_t bytes_of(const RTensor& t) {
  uint64_t n = at::elementSize(scalar_type(t.dtype));
  for (int64_t s : t.shape) n *= static_cast<uint64_t>(s);
  return n;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? "," : "") + std::to_string(s[i]);
  return t + "]";
}

template <class P>
bool read_params(const RNode& n, P* p) {
  if (n.params.size() != sizeof(P)) return false;
  std::memcpy(p, n.params.data(), sizeof(P));
  return true;
}

// ATen's dim of Synapse's dim s (fastest first) in a tensor of `rank` dims.
int64_t aten_dim(int64_t s, size_t rank) { return static_cast<int64_t>(rank) - 1 - s; }

// The kernel's name without its dtype suffix, and the suffix ("" for the MME and data-movement
// nodes, which take any dtype).
std::pair<std::string, std::string> split_guid(const std::string& guid) {
  for (const char* sfx : {"_f32", "_bf16", "_i32", "_i8"}) {
    const std::string s = sfx;
    if (guid.size() > s.size() && guid.compare(guid.size() - s.size(), s.size(), s) == 0)
      return {guid.substr(0, guid.size() - s.size()), s.substr(1)};
  }
  return {guid, ""};
}

// Checks node `n` of recipe `r` against its kernel's contract; "" when it holds.
std::string check_node(const FRecipe& r, const RNode& n) {
  auto [base, sfx] = split_guid(n.guid);
  auto T = [&](int i) -> const RTensor& { return r.tensors[static_cast<size_t>(i)]; };
  auto count = [&](size_t ins, size_t outs) -> std::string {
    if (n.in.size() != ins || n.out.size() != outs)
      return "takes " + std::to_string(ins) + " inputs and " + std::to_string(outs) + " outputs, given " +
             std::to_string(n.in.size()) + " and " + std::to_string(n.out.size());
    return "";
  };
  auto same_dtype = [&](int32_t want) -> std::string {
    for (int i : n.in)
      if (T(i).dtype != want)
        return "input \"" + T(i).name + "\" is " + suffix_of(T(i).dtype) + ", not " + suffix_of(want);
    for (int i : n.out)
      if (T(i).dtype != want)
        return "output \"" + T(i).name + "\" is " + suffix_of(T(i).dtype) + ", not " + suffix_of(want);
    return "";
  };
  auto dtype_of_suffix = [&]() -> int32_t {
    if (sfx == "f32") return syn::kTypeFloat;
    if (sfx == "bf16") return syn::kTypeBf16;
    if (sfx == "i32") return syn::kTypeInt32;
    return syn::kTypeInt8;
  };
  static const std::set<std::string> unary = {"neg_fwd",   "exp_fwd",  "log_fwd",     "sqrt_fwd",
                                              "rsqrt_fwd", "tanh_fwd", "sigmoid_fwd", "relu_fwd"};
  static const std::set<std::string> binary = {"add_fwd", "sub_fwd", "mult_fwd", "div_fwd"};
  std::string e;
  if (base == "gemm" || base == "batch_gemm") {
    if (!(e = count(2, 1)).empty()) return e;
    if (!(e = same_dtype(T(n.in[0]).dtype)).empty()) return e;
    syn::GemmParams p{};
    if (!read_params(n, &p)) return "parameters are not a synGEMMParams";
    const size_t rank = base == "gemm" ? 2 : T(n.out[0]).shape.size();
    if (base == "batch_gemm" && rank < 3) return "batch_gemm of fewer than 3 dims";
    for (int i : {n.in[0], n.in[1], n.out[0]})
      if (T(i).shape.size() != rank) return "operand \"" + T(i).name + "\" is not of " + std::to_string(rank) + " dims";
    auto a = T(n.in[0]).shape, b = T(n.in[1]).shape;
    if (p.transpose_a) std::swap(a[rank - 1], a[rank - 2]);
    if (p.transpose_b) std::swap(b[rank - 1], b[rank - 2]);
    auto o = a;
    o[rank - 1] = b[rank - 1];
    if (a[rank - 1] != b[rank - 2] || o != T(n.out[0]).shape || !std::equal(a.begin(), a.end() - 2, b.begin()))
      return "sizes " + shape_text(T(n.in[0]).shape) + " x " + shape_text(T(n.in[1]).shape) + " (transpose " +
             std::to_string(p.transpose_a) + std::to_string(p.transpose_b) + ") do not give " +
             shape_text(T(n.out[0]).shape);
    return "";
  }
  if (base == "spatial_convolution" || base == "dedx" || base == "dedw") {
    // NHWC: spatial_convolution (x [N,H,W,C], w [R,S,C,K]) -> y [N,H',W',K]; dedx (dy, w) -> dx;
    // dedw (dy, x) -> dw. The stand-in takes symmetric padding.
    if (!(e = count(2, 1)).empty()) return e;
    if (!(e = same_dtype(T(n.in[0]).dtype)).empty()) return e;
    if (!sfx.empty()) return "has a dtype suffix";
    syn::ConvolutionParams p{};
    if (!read_params(n, &p)) return "parameters are not a synConvolutionParams";
    if (p.pad_left != p.pad_right || p.pad_top != p.pad_bottom) return "asymmetric padding";
    if (p.groups != 1) return "groups other than 1";
    for (int i : {n.in[0], n.in[1], n.out[0]})
      if (T(i).shape.size() != 4) return "operand \"" + T(i).name + "\" is not of 4 dims";
    const auto& x = base == "spatial_convolution" ? T(n.in[0]).shape
                    : base == "dedx"              ? T(n.out[0]).shape
                                                  : T(n.in[1]).shape;
    const auto& w = base == "dedw" ? T(n.out[0]).shape : T(n.in[1]).shape;
    const auto& y = base == "spatial_convolution" ? T(n.out[0]).shape : T(n.in[0]).shape;
    if (w[0] != p.kernel_h || w[1] != p.kernel_w) return "the weight's R and S are not the kernel's size";
    if (x[3] != w[2] || y[3] != w[3] || x[0] != y[0]) return "channels or batch do not line up";
    const int64_t h = (x[1] + 2 * p.pad_top - p.dilation_h * (w[0] - 1) - 1) / p.stride_h + 1;
    const int64_t wd = (x[2] + 2 * p.pad_left - p.dilation_w * (w[1] - 1) - 1) / p.stride_w + 1;
    if (y[1] != h || y[2] != wd)
      return "output " + shape_text(y) + " is not the convolution of " + shape_text(x) + " by " + shape_text(w);
    return "";
  }
  if (base == "reshape") {
    // A reshape whose output changes size reads its actual sizes from a shape tensor (input 1) of
    // the output's geometry.
    const bool dynamic = T(n.out[0]).dynamic();
    if (!(e = count(dynamic ? 2 : 1, 1)).empty())
      return e + (dynamic ? " (an output that changes size takes a shape tensor)" : "");
    if (dynamic) {
      const RTensor& s = T(n.in[1]);
      if (!s.shape_tensor) return "input \"" + s.name + "\" is not a shape tensor";
      if (s.shape != T(n.out[0]).shape || s.min_shape != T(n.out[0]).min_shape)
        return "shape tensor \"" + s.name + "\" has another geometry than the output";
    }
    if (T(n.in[0]).dtype != T(n.out[0]).dtype) return "input and output dtypes differ";
    if (!sfx.empty()) return "has a dtype suffix";
    const auto& in = T(n.in[0]);
    const auto& out = T(n.out[0]);
    auto elements = [](const std::vector<int64_t>& v) {
      int64_t k = 1;
      for (int64_t d : v) k *= d;
      return k;
    };
    if (elements(in.shape) != elements(out.shape) || elements(in.min_shape) != elements(out.min_shape))
      return "reshapes " + shape_text(in.shape) + " (at least " + shape_text(in.min_shape) + ") to " +
             shape_text(out.shape) + " (at least " + shape_text(out.min_shape) + ")";
    return "";
  }
  for (int i : n.in)
    if (T(i).shape_tensor) return "reads shape tensor \"" + T(i).name + "\", which only a reshape takes";
  if (base == "memcpy" || base == "transpose") {
    if (!(e = count(1, 1)).empty()) return e;
    if (!(e = same_dtype(T(n.in[0]).dtype)).empty()) return e;
    if (!sfx.empty()) return "has a dtype suffix";
    const auto& in = T(n.in[0]).shape;
    const auto& out = T(n.out[0]).shape;
    if (base == "memcpy") return in == out ? "" : "copies " + shape_text(in) + " to " + shape_text(out);
    syn::TransposeParams p{};
    if (!read_params(n, &p)) return "parameters are not a synTransposeParams";
    if (p.tensor_dim != in.size() || in.size() != out.size()) return "tensor_dim does not match the operands";
    for (size_t j = 0; j < out.size(); ++j) {
      const int32_t s = p.permutation[aten_dim(static_cast<int64_t>(j), out.size())];
      if (s < 0 || s >= static_cast<int32_t>(in.size()) || out[j] != in[static_cast<size_t>(aten_dim(s, in.size()))])
        return "permutation does not map " + shape_text(in) + " to " + shape_text(out);
    }
    return "";
  }
  if (sfx.empty()) return "unknown kernel (no dtype suffix)";
  const int32_t dt = dtype_of_suffix();
  if (base == "constant") {
    if (!(e = count(0, 1)).empty()) return e;
    syn::ConstantParams p{};
    if (!read_params(n, &p)) return "parameters are not ns_ConstantKernel::Params";
    return same_dtype(dt);
  }
  if (unary.count(base)) {
    if (!(e = count(1, 1)).empty()) return e;
    if (!n.params.empty()) return "takes no parameters";
    if (T(n.in[0]).shape != T(n.out[0]).shape) return "input and output sizes differ";
    return same_dtype(dt);
  }
  if (base == "gelu_fwd" || base == "gelu_bwd") {
    // fwd (x) -> y; bwd (grad, x) -> grad_x; the parameter picks the tanh approximation.
    if (!(e = count(base == "gelu_bwd" ? 2 : 1, 1)).empty()) return e;
    syn::GeluParams p{};
    if (!read_params(n, &p)) return "parameters are not ns_GeluKernel::Params";
    for (int i : n.in)
      if (T(i).shape != T(n.out[0]).shape) return "operand sizes differ";
    return same_dtype(dt);
  }
  if (binary.count(base) || base == "relu_bwd" || base == "not_equal_fwd") {
    if (!(e = count(2, 1)).empty()) return e;
    if (base == "not_equal_fwd") {
      if (T(n.in[0]).dtype != dt || T(n.in[1]).dtype != dt || T(n.out[0]).dtype != syn::kTypeInt8)
        return "not_equal takes two inputs of its dtype and gives int8";
    } else if (!(e = same_dtype(dt)).empty()) {
      return e;
    }
    const auto& o = T(n.out[0]).shape;
    for (int i : n.in) {
      const auto& s = T(i).shape;
      if (s.size() != o.size()) return "input \"" + T(i).name + "\" has another rank than the output";
      for (size_t d = 0; d < s.size(); ++d)
        if (s[d] != o[d] && s[d] != 1)
          return "input \"" + T(i).name + "\" " + shape_text(s) + " does not broadcast to " + shape_text(o);
    }
    if (base == "relu_bwd" && T(n.in[0]).shape != o) return "relu_bwd's grad must have the output's sizes";
    return "";
  }
  if (base.rfind("cast_", 0) == 0 && base.size() > 8 && base.compare(base.size() - 3, 3, "_to") == 0) {
    // cast_<from>_to_<to>: the input of the first dtype, the output of the second.
    if (!(e = count(1, 1)).empty()) return e;
    const std::string from = base.substr(5, base.size() - 8);
    if (from != suffix_of(T(n.in[0]).dtype)) return "cast from " + from + " given " + suffix_of(T(n.in[0]).dtype);
    if (T(n.out[0]).dtype != dt) return "cast to " + sfx + " writing " + suffix_of(T(n.out[0]).dtype);
    if (T(n.in[0]).shape != T(n.out[0]).shape) return "input and output sizes differ";
    return "";
  }
  if (base == "reduce_sum_fwd" || base == "reduce_mean_fwd") {
    if (!(e = count(1, 1)).empty()) return e;
    if (!(e = same_dtype(dt)).empty()) return e;
    syn::ReductionParams p{};
    if (!read_params(n, &p)) return "parameters are not ns_Reduction::Params";
    auto s = T(n.in[0]).shape;
    if (p.reduction_dimension >= s.size()) return "reduction_dimension beyond the input's dims";
    s[static_cast<size_t>(aten_dim(p.reduction_dimension, s.size()))] = 1;
    if (s != T(n.out[0]).shape) return "output " + shape_text(T(n.out[0]).shape) + " is not the input reduced";
    return "";
  }
  if (base == "softmax_fwd" || base == "logsoftmax_fwd" || base == "softmax_bwd" || base == "logsoftmax_bwd") {
    const bool bwd = base.find("bwd") != std::string::npos;
    if (!(e = count(bwd ? 2 : 1, 1)).empty()) return e;
    if (!(e = same_dtype(dt)).empty()) return e;
    syn::SoftmaxParams p{};
    if (!read_params(n, &p)) return "parameters are not ns_Softmax::Params";
    for (int i : n.in)
      if (T(i).shape != T(n.out[0]).shape) return "operand sizes differ";
    if (p.dim < 0 || p.dim >= static_cast<int32_t>(T(n.out[0]).shape.size())) return "dim beyond the tensor's dims";
    return "";
  }
  if (base == "nll_loss_fwd" || base == "nll_loss_bwd") {
    // fwd (x, target) -> loss; bwd (x, target, grad of the loss) -> grad_x. The loss (and its
    // grad) is one element, or one per row in none mode.
    const bool bwd = base == "nll_loss_bwd";
    if (!(e = count(bwd ? 3 : 2, 1)).empty()) return e;
    syn::NllLossParams p{};
    if (!read_params(n, &p)) return "parameters are not ns_NLLLossKernel::ParamsOptionalIgnoreIndex";
    const auto& x = T(n.in[0]);
    const auto& t = T(n.in[1]);
    if (x.dtype != dt || t.dtype != syn::kTypeInt32 || T(n.out[0]).dtype != dt)
      return "takes " + sfx + " log-probabilities and int32 targets";
    if (x.shape.size() != 2 || t.shape != std::vector<int64_t>{x.shape[0]})
      return "log-probabilities " + shape_text(x.shape) + " and targets " + shape_text(t.shape) + " do not match";
    if (p.mode != syn::kNllMean && p.mode != syn::kNllSum && p.mode != syn::kNllNone) return "unknown mode";
    if (bwd && (T(n.out[0]).shape != x.shape || T(n.in[2]).dtype != dt)) return "grad_input must match the input";
    const std::vector<int64_t> loss = p.mode == syn::kNllNone ? t.shape : std::vector<int64_t>{1};
    if (T(bwd ? n.in[2] : n.out[0]).shape != loss) return "the loss is not " + shape_text(loss);
    return "";
  }
  if (base == "layer_norm_fwd" || base == "layer_norm_bwd") {
    // fwd (x, beta, gamma) -> (y, mean, rstd); bwd (x, grad_y, mean, rstd, gamma) -> (grad_x,
    // grad_beta, grad_gamma): over the fastest dim, mean and rstd of the input's rank with it 1.
    // x, y and their grads are of the kernel's dtype; gamma, beta, mean, rstd and their grads float32.
    const bool bwd = base == "layer_norm_bwd";
    if (!(e = count(bwd ? 5 : 3, 3)).empty()) return e;
    for (size_t i = 0; i < n.in.size(); ++i)
      if (T(n.in[i]).dtype != (i < (bwd ? 2u : 1u) ? dt : syn::kTypeFloat))
        return "input " + std::to_string(i) + " is " + suffix_of(T(n.in[i]).dtype);
    for (size_t i = 0; i < n.out.size(); ++i)
      if (T(n.out[i]).dtype != (i == 0 ? dt : syn::kTypeFloat))
        return "output " + std::to_string(i) + " is " + suffix_of(T(n.out[i]).dtype);
    syn::LayerNormParams p{};
    if (!read_params(n, &p)) return "parameters are not ns_LayerNormKernel::Params";
    const auto& x = T(n.in[0]).shape;
    if (x.size() < 2) return "an input of fewer than two dims";
    auto stat = x;
    stat.back() = 1;
    const std::vector<int64_t> c = {x.back()};
    const std::vector<std::vector<int64_t>> ins =
        bwd ? std::vector<std::vector<int64_t>>{x, x, stat, stat, c} : std::vector<std::vector<int64_t>>{x, c, c};
    const std::vector<std::vector<int64_t>> outs =
        bwd ? std::vector<std::vector<int64_t>>{x, c, c} : std::vector<std::vector<int64_t>>{x, stat, stat};
    for (size_t i = 0; i < ins.size(); ++i)
      if (T(n.in[i]).shape != ins[i]) return "input " + std::to_string(i) + " is not " + shape_text(ins[i]);
    for (size_t i = 0; i < outs.size(); ++i)
      if (T(n.out[i]).shape != outs[i]) return "output " + std::to_string(i) + " is not " + shape_text(outs[i]);
    return "";
  }
  if (base == "batch_norm_fwd" || base == "batch_norm_bwd") {
    // On NHWC tensors ([N, H, W, C], C fastest), per channel. fwd (x, beta, gamma, running_mean,
    // running_var) -> (y, mean, istd, running_mean', running_var'); bwd (x, grad_y, mean, istd,
    // gamma) -> (grad_x, grad_beta, grad_gamma). x, y and their grads are of the kernel's dtype,
    // every per-channel tensor float32 of [C].
    const bool bwd = base == "batch_norm_bwd";
    if (!(e = count(5, bwd ? 3 : 5)).empty()) return e;
    syn::BatchNormParams p{};
    if (!read_params(n, &p)) return "parameters are not ns_BatchNormKernel::ParamsV2";
    if (!p.is_training) return "the stand-in runs training batch norm only";
    const auto& x = T(n.in[0]).shape;
    if (x.size() != 4) return "an input of other than 4 dims";
    const std::vector<int64_t> c = {x[3]};
    for (size_t i = 0; i < n.in.size(); ++i) {
      const bool big = i == 0 || (bwd && i == 1);
      if (T(n.in[i]).dtype != (big ? dt : syn::kTypeFloat) || T(n.in[i]).shape != (big ? x : c))
        return "input " + std::to_string(i) + " is " + suffix_of(T(n.in[i]).dtype) + shape_text(T(n.in[i]).shape);
    }
    for (size_t i = 0; i < n.out.size(); ++i) {
      if (T(n.out[i]).dtype != (i == 0 ? dt : syn::kTypeFloat) || T(n.out[i]).shape != (i == 0 ? x : c))
        return "output " + std::to_string(i) + " is " + suffix_of(T(n.out[i]).dtype) + shape_text(T(n.out[i]).shape);
    }
    return "";
  }
  if (base == "gather_fwd" || base == "embedding_dense_pt_bwd") {
    if (!(e = count(2, 1)).empty()) return e;
    const auto& a = T(n.in[0]);
    const auto& idx = T(n.in[1]);
    if (a.dtype != dt || T(n.out[0]).dtype != dt || idx.dtype != syn::kTypeInt32)
      return "takes " + sfx + " data and int32 indices";
    if (base == "gather_fwd") {
      syn::GatherParams p{};
      if (!read_params(n, &p)) return "parameters are not ns_GatherKernel::Params";
      if (a.shape.size() != 2 || p.axis != 1) return "the stand-in gathers rows of a table of two dims (axis 1)";
      auto o = idx.shape;
      o.push_back(a.shape[1]);
      return o == T(n.out[0]).shape ? "" : "output is not " + shape_text(o);
    }
    syn::EmbeddingBackwardParams p{};
    if (!read_params(n, &p)) return "parameters are not ns_EmbeddingDensePtBwdKernel::Params";
    const std::vector<int64_t> lead(a.shape.begin(), a.shape.end() - 1);
    if (lead != idx.shape) return "grad " + shape_text(a.shape) + " does not match indices " + shape_text(idx.shape);
    if (T(n.out[0]).shape != std::vector<int64_t>{p.num_weights, a.shape.back()})
      return "output is not [num_weights, D]";
    return "";
  }
  return "unknown kernel";
}

// Runs node `n` of `r` on `env` (a tensor per recipe tensor) as ATen computes its meaning.
void run_node(const FRecipe& r, const RNode& n, std::vector<at::Tensor>& env) {
  auto [base, sfx] = split_guid(n.guid);
  auto in = [&](size_t i) { return env[static_cast<size_t>(n.in[i])]; };
  const RTensor& ot = r.tensors[static_cast<size_t>(n.out[0])];
  const auto shape = ot.shape;
  const at::ScalarType dtype = scalar_type(ot.dtype);
  at::Tensor o;
  if (base == "gemm" || base == "batch_gemm") {
    syn::GemmParams p{};
    read_params(n, &p);
    at::Tensor a = in(0), b = in(1);
    if (p.transpose_a) a = a.transpose(-1, -2);
    if (p.transpose_b) b = b.transpose(-1, -2);
    o = base == "gemm" ? at::mm(a, b) : at::matmul(a, b);
  } else if (base == "reshape") {
    o = in(0).reshape(n.in.size() > 1 ? in(1).sizes() : at::IntArrayRef(shape));
  } else if (base == "memcpy") {
    o = in(0).clone();
  } else if (base == "transpose") {
    syn::TransposeParams p{};
    read_params(n, &p);
    std::vector<int64_t> perm;
    for (size_t j = 0; j < shape.size(); ++j)
      perm.push_back(aten_dim(p.permutation[aten_dim(static_cast<int64_t>(j), shape.size())], shape.size()));
    o = in(0).permute(perm).contiguous();
  } else if (base == "constant") {
    if (ot.dynamic()) throw std::runtime_error("a constant whose sizes change");
    syn::ConstantParams p{};
    read_params(n, &p);
    o = ot.dtype == syn::kTypeInt32 ? at::full(shape, p.constant.i, at::TensorOptions().dtype(dtype))
                                    : at::full(shape, p.constant.f, at::TensorOptions().dtype(dtype));
  } else if (base == "add_fwd") {
    o = at::add(in(0), in(1));
  } else if (base == "sub_fwd") {
    o = at::sub(in(0), in(1));
  } else if (base == "mult_fwd") {
    o = at::mul(in(0), in(1));
  } else if (base == "div_fwd") {
    o = at::div(in(0), in(1));
  } else if (base == "neg_fwd") {
    o = at::neg(in(0));
  } else if (base == "exp_fwd") {
    o = at::exp(in(0));
  } else if (base == "log_fwd") {
    o = at::log(in(0));
  } else if (base == "sqrt_fwd") {
    o = at::sqrt(in(0));
  } else if (base == "rsqrt_fwd") {
    o = at::rsqrt(in(0));
  } else if (base == "tanh_fwd") {
    o = at::tanh(in(0));
  } else if (base == "sigmoid_fwd") {
    o = at::sigmoid(in(0));
  } else if (base == "relu_fwd") {
    o = at::relu(in(0));
  } else if (base == "spatial_convolution" || base == "dedx" || base == "dedw") {
    syn::ConvolutionParams p{};
    read_params(n, &p);
    const std::vector<int64_t> stride = {p.stride_h, p.stride_w}, pad = {p.pad_top, p.pad_left},
                               dil = {p.dilation_h, p.dilation_w};
    auto nchw = [](const at::Tensor& t) { return t.permute({0, 3, 1, 2}); };
    auto kcrs = [](const at::Tensor& t) { return t.permute({3, 2, 0, 1}); };
    if (base == "spatial_convolution") {
      o = at::convolution(nchw(in(0)), kcrs(in(1)), {}, stride, pad, dil, false, {0, 0}, 1).permute({0, 2, 3, 1});
    } else if (base == "dedx") {
      auto xs = shape;  // [N, H, W, C]; N as the gradient's where the batch changes
      xs[0] = in(0).size(0);
      const at::Tensor x = at::empty({xs[0], xs[3], xs[1], xs[2]}, in(0).options());
      o = std::get<0>(at::convolution_backward(nchw(in(0)), x, kcrs(in(1)), std::nullopt, stride, pad, dil, false,
                                               {0, 0}, 1, {true, false, false}))
              .permute({0, 2, 3, 1});
    } else {
      const auto& ws = shape;  // [R, S, C, K]
      const at::Tensor w = at::empty({ws[3], ws[2], ws[0], ws[1]}, in(0).options());
      o = std::get<1>(at::convolution_backward(nchw(in(0)), nchw(in(1)), w, std::nullopt, stride, pad, dil, false,
                                               {0, 0}, 1, {false, true, false}))
              .permute({2, 3, 1, 0});
    }
  } else if (base == "gelu_fwd" || base == "gelu_bwd") {
    syn::GeluParams p{};
    read_params(n, &p);
    const char* approximate = p.approximation ? "tanh" : "none";
    o = base == "gelu_fwd" ? at::gelu(in(0), approximate) : at::gelu_backward(in(0), in(1), approximate);
  } else if (base == "relu_bwd") {
    o = at::where(in(1) > 0, in(0), at::zeros({}, in(0).options()));
  } else if (base == "not_equal_fwd") {
    o = at::ne(in(0), in(1)).to(at::kChar);
  } else if (base.rfind("cast_", 0) == 0) {
    o = in(0).to(dtype);
  } else if (base == "reduce_sum_fwd" || base == "reduce_mean_fwd") {
    syn::ReductionParams p{};
    read_params(n, &p);
    const int64_t d = aten_dim(p.reduction_dimension, in(0).dim());
    o = base == "reduce_sum_fwd" ? at::sum(in(0), {d}, true) : at::mean(in(0), {d}, true);
  } else if (base == "softmax_fwd" || base == "logsoftmax_fwd") {
    syn::SoftmaxParams p{};
    read_params(n, &p);
    const int64_t d = aten_dim(p.dim, shape.size());
    o = base == "softmax_fwd" ? at::_softmax(in(0), d, false) : at::_log_softmax(in(0), d, false);
  } else if (base == "softmax_bwd" || base == "logsoftmax_bwd") {
    // (output of the forward, grad of it).
    syn::SoftmaxParams p{};
    read_params(n, &p);
    const int64_t d = aten_dim(p.dim, shape.size());
    o = base == "softmax_bwd" ? at::_softmax_backward_data(in(1), in(0), d, dtype)
                              : at::_log_softmax_backward_data(in(1), in(0), d, dtype);
  } else if (base == "nll_loss_fwd") {
    syn::NllLossParams p{};
    read_params(n, &p);
    const int64_t reduction = p.mode == syn::kNllMean ? 1 : p.mode == syn::kNllSum ? 2 : 0;
    o = std::get<0>(at::nll_loss_forward(in(0), in(1).to(at::kLong), {}, reduction, p.ignore_index));
    if (!ot.dynamic()) o = o.reshape(shape);  // a reduced loss of one element
  } else if (base == "nll_loss_bwd") {
    // (input, target, grad of the loss); a mean divides by the rows whose target is not ignored.
    syn::NllLossParams p{};
    read_params(n, &p);
    const int64_t reduction = p.mode == syn::kNllMean ? 1 : p.mode == syn::kNllSum ? 2 : 0;
    const at::Tensor target = in(1).to(at::kLong);
    const at::Tensor total = at::ne(target, p.ignore_index).sum().to(in(0).scalar_type());
    const at::Tensor grad = reduction == 0 ? in(2) : in(2).reshape({});
    o = at::nll_loss_backward(grad, in(0), target, {}, reduction, p.ignore_index, total);
  } else if (base == "layer_norm_fwd") {
    syn::LayerNormParams p{};
    read_params(n, &p);
    auto [y, mean, rstd] = at::native_layer_norm(in(0), {in(0).size(-1)}, in(2), in(1), p.eps);
    // Statistics keep the normalized dim with size 1.
    std::vector<int64_t> stat(in(0).sizes().begin(), in(0).sizes().end());
    stat.back() = 1;
    for (size_t k : {1u, 2u})
      env[static_cast<size_t>(n.out[k])] = (k == 1 ? mean : rstd).reshape(stat).to(at::kFloat).contiguous();
    o = y;
  } else if (base == "layer_norm_bwd") {
    // ATen shapes the bias's gradient after the bias, which the kernel does not take (its value
    // does not enter any gradient).
    auto [dx, dw, db] = at::native_layer_norm_backward(in(1), in(0), {in(0).size(-1)}, in(2), in(3), in(4),
                                                       at::zeros_like(in(4)), {true, true, true});
    env[static_cast<size_t>(n.out[1])] = db.to(at::kFloat).contiguous();
    env[static_cast<size_t>(n.out[2])] = dw.to(at::kFloat).contiguous();
    o = dx;
  } else if (base == "batch_norm_fwd") {
    // Training: ATen's functional batch norm on the input as a dense NCHW tensor (the running
    // statistics updated with momentum, the variance unbiased), the result back to NHWC. Dense, as
    // eager has it: ATen's channels-last kernels sum in another order, and a channel's sum of
    // gradients that nearly cancels then differs far beyond float32's rounding.
    syn::BatchNormParams p{};
    read_params(n, &p);
    auto [y, mean, istd, rm, rv] = at::_native_batch_norm_legit_functional(
        in(0).permute({0, 3, 1, 2}).contiguous(), in(2), in(1), in(3), in(4), true, p.momentum, p.epsilon);
    env[static_cast<size_t>(n.out[1])] = mean.to(at::kFloat).contiguous();
    env[static_cast<size_t>(n.out[2])] = istd.to(at::kFloat).contiguous();
    env[static_cast<size_t>(n.out[3])] = rm.to(at::kFloat).contiguous();
    env[static_cast<size_t>(n.out[4])] = rv.to(at::kFloat).contiguous();
    o = y.permute({0, 2, 3, 1});
  } else if (base == "batch_norm_bwd") {
    syn::BatchNormParams p{};
    read_params(n, &p);
    auto [dx, dw, db] = at::native_batch_norm_backward(in(1).permute({0, 3, 1, 2}).contiguous(),
                                                       in(0).permute({0, 3, 1, 2}).contiguous(), in(4), {}, {}, in(2),
                                                       in(3), true, p.epsilon, {true, true, true});
    env[static_cast<size_t>(n.out[1])] = db.to(at::kFloat).contiguous();
    env[static_cast<size_t>(n.out[2])] = dw.to(at::kFloat).contiguous();
    o = dx.permute({0, 2, 3, 1});
  } else if (base == "gather_fwd") {
    o = at::embedding(in(0), in(1).to(at::kLong));
  } else if (base == "embedding_dense_pt_bwd") {
    syn::EmbeddingBackwardParams p{};
    read_params(n, &p);
    o = at::embedding_dense_backward(in(0), in(1).to(at::kLong), p.num_weights, p.padding_idx, p.scale_grad_by_freq);
  }
  if (!o.defined()) throw std::runtime_error("no reference for " + n.guid);
  // The element-wise kernels broadcast their operands to the output's sizes, which may be larger
  // than the operands' own broadcast (a static output only: one that changes size takes theirs).
  if ((base == "add_fwd" || base == "sub_fwd" || base == "mult_fwd" || base == "div_fwd") && !ot.dynamic() &&
      o.sizes() != at::IntArrayRef(shape))
    o = o.expand(shape);
  env[static_cast<size_t>(n.out[0])] = o.to(dtype).contiguous();
  st().guids_run[n.guid]++;
  st().nodes_run++;
}

// The recipe as text, for synRecipeSerialize: one line per tensor and per node (params in hex).
std::string recipe_text(const FRecipe& r) {
  std::ostringstream s;
  s << "fake-synapse-recipe 2\n"
    << r.name << "\n"
    << r.workspace << " " << r.tensors.size() << " " << r.nodes.size() << "\n";
  for (const auto& t : r.tensors) {
    s << t.name << " " << t.dtype << " " << t.persistent << " " << t.shape_tensor << " " << t.shape.size();
    for (int64_t d : t.shape) s << " " << d;
    for (int64_t d : t.min_shape) s << " " << d;
    s << "\n";
  }
  for (const auto& n : r.nodes) {
    s << n.guid << " " << n.name << " " << n.in.size();
    for (int i : n.in) s << " " << i;
    s << " " << n.out.size();
    for (int i : n.out) s << " " << i;
    s << " " << n.params.size();
    for (uint8_t b : n.params) s << " " << static_cast<int>(b);
    s << "\n";
  }
  return s.str();
}

bool parse_recipe(const std::string& text, FRecipe* r) {
  std::istringstream s(text);
  std::string magic;
  int version = 0;
  size_t nt = 0, nn = 0;
  if (!(s >> magic >> version) || magic != "fake-synapse-recipe" || version != 2) return false;
  if (!(s >> r->name >> r->workspace >> nt >> nn) || nt > 1000000 || nn > 1000000) return false;
  for (size_t i = 0; i < nt; ++i) {
    RTensor t;
    size_t rank = 0;
    if (!(s >> t.name >> t.dtype >> t.persistent >> t.shape_tensor >> rank) || rank > 25) return false;
    t.shape.resize(rank);
    t.min_shape.resize(rank);
    for (auto& d : t.shape)
      if (!(s >> d)) return false;
    for (auto& d : t.min_shape)
      if (!(s >> d)) return false;
    r->tensors.push_back(t);
  }
  for (size_t i = 0; i < nn; ++i) {
    RNode n;
    size_t k = 0;
    if (!(s >> n.guid >> n.name >> k) || k > 16) return false;
    n.in.resize(k);
    for (auto& x : n.in)
      if (!(s >> x) || x < 0 || static_cast<size_t>(x) >= nt) return false;
    if (!(s >> k) || k > 16) return false;
    n.out.resize(k);
    for (auto& x : n.out)
      if (!(s >> x) || x < 0 || static_cast<size_t>(x) >= nt) return false;
    if (!(s >> k) || k > 4096) return false;
    n.params.resize(k);
    for (auto& b : n.params) {
      int v = 0;
      if (!(s >> v)) return false;
      b = static_cast<uint8_t>(v);
    }
    r->nodes.push_back(n);
  }
  return true;
}

// The device allocation holding [address, address + bytes), or none.
bool in_allocation(uint64_t address, uint64_t bytes) {
  auto it = st().allocations.upper_bound(address);
  if (it == st().allocations.begin()) return false;
  --it;
  return address >= it->first && address + bytes <= it->first + it->second;
}

bool in_host_map(uint64_t address, uint64_t bytes) {
  auto it = st().host_maps.upper_bound(static_cast<uintptr_t>(address));
  if (it == st().host_maps.begin()) return false;
  --it;
  return address >= it->first && address + bytes <= it->first + it->second;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) syn::Status synInitialize() {
  FAKE_LOCK;
  if (st().initialized) return syn::kAlreadyInitialized;
  st().initialized = true;
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synDestroy() {
  FAKE_LOCK;
  NEED_INIT("synDestroy");
  if (st().acquired) violation("synDestroy while the device is still acquired");
  st().initialized = false;
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synDeviceAcquire(syn::DeviceId* id, const char* pci_bus) {
  FAKE_LOCK;
  NEED_INIT("synDeviceAcquire");
  if (!id) return violation("synDeviceAcquire: null device id pointer");
  if (pci_bus) return violation("synDeviceAcquire: the stand-in has no PCI bus " + std::string(pci_bus));
  if (st().acquired) return violation("synDeviceAcquire: the device is already acquired", syn::kDeviceAlreadyAcquired);
  st().acquired = true;
  *id = st().device;
  return syn::kSuccess;
}

#define NEED_DEVICE(call, id)                \
  NEED_INIT(call);                           \
  if (!st().acquired || (id) != st().device) \
  return violation(std::string(call) + ": device " + std::to_string(id) + " is not acquired", syn::kInvalidArgument)

__attribute__((visibility("default"))) syn::Status synDeviceRelease(syn::DeviceId id) {
  FAKE_LOCK;
  NEED_DEVICE("synDeviceRelease", id);
  // Everything made on the device must be gone by now.
  if (!st().allocations.empty())
    violation("synDeviceRelease with " + std::to_string(st().allocations.size()) + " device allocation(s) not freed");
  if (!st().host_maps.empty())
    violation("synDeviceRelease with " + std::to_string(st().host_maps.size()) + " host mapping(s) not unmapped");
  if (!st().recipes.empty())
    violation("synDeviceRelease with " + std::to_string(st().recipes.size()) + " recipe(s) not destroyed");
  if (!st().graphs.empty())
    violation("synDeviceRelease with " + std::to_string(st().graphs.size()) + " graph(s) not destroyed");
  if (!st().streams.empty())
    violation("synDeviceRelease with " + std::to_string(st().streams.size()) + " stream(s) not destroyed");
  st().acquired = false;
  st().releases++;
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synDeviceGetInfo(syn::DeviceId id, syn::DeviceInfo* info) {
  FAKE_LOCK;
  NEED_DEVICE("synDeviceGetInfo", id);
  if (!info) return violation("synDeviceGetInfo: null info");
  std::memset(info, 0, sizeof *info);
  info->device_id = id;
  info->dram_size = 1ull << 36;
  info->dram_enabled = 1;
  info->device_type = syn::kDeviceGaudi2;
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synStreamCreateGeneric(syn::StreamHandle* s, syn::DeviceId id,
                                                                          uint32_t flags) {
  FAKE_LOCK;
  NEED_DEVICE("synStreamCreateGeneric", id);
  if (!s) return violation("synStreamCreateGeneric: null stream pointer");
  auto* f = new FStream;
  st().streams.insert(f);
  *s = reinterpret_cast<syn::StreamHandle>(f);
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synStreamDestroy(syn::StreamHandle s) {
  FAKE_LOCK;
  NEED_INIT("synStreamDestroy");
  auto* f = reinterpret_cast<FStream*>(s);
  if (!st().streams.erase(f)) return violation("synStreamDestroy: not a live stream");
  delete f;
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synStreamSynchronize(syn::StreamHandle s) {
  FAKE_LOCK;
  NEED_INIT("synStreamSynchronize");
  if (!st().streams.count(reinterpret_cast<FStream*>(s))) return violation("synStreamSynchronize: not a live stream");
  return syn::kSuccess;  // every copy and launch has finished when its call returns
}

__attribute__((visibility("default"))) syn::Status synGraphCreate(syn::GraphHandle* g, int32_t device_type) {
  FAKE_LOCK;
  NEED_INIT("synGraphCreate");
  if (!g) return violation("synGraphCreate: null graph pointer");
  if (device_type != syn::kDeviceGaudi2)
    return violation("synGraphCreate: device type " + std::to_string(device_type) +
                         " is not the acquired device's (synDeviceGetInfo says Gaudi2)",
                     syn::kDeviceTypeMismatch);
  auto* f = new FGraph;
  f->device_type = device_type;
  st().graphs.insert(f);
  *g = reinterpret_cast<syn::GraphHandle>(f);
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synGraphDestroy(syn::GraphHandle g) {
  FAKE_LOCK;
  NEED_INIT("synGraphDestroy");
  auto* f = reinterpret_cast<FGraph*>(g);
  if (!st().graphs.erase(f)) return violation("synGraphDestroy: not a live graph");
  delete f;
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synSectionCreate(syn::SectionHandle* s, uint64_t descriptor,
                                                                    syn::GraphHandle g) {
  FAKE_LOCK;
  NEED_INIT("synSectionCreate");
  if (!s || !live_graph(g)) return violation("synSectionCreate: null section pointer or not a live graph");
  auto* f = reinterpret_cast<FGraph*>(g);
  f->sections.push_back(std::make_unique<FSection>());
  *s = reinterpret_cast<syn::SectionHandle>(f->sections.back().get());
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synSectionDestroy(syn::SectionHandle s) {
  FAKE_LOCK;
  NEED_INIT("synSectionDestroy");
  for (FGraph* g : st().graphs)
    for (auto& x : g->sections)
      if (x.get() == reinterpret_cast<FSection*>(s) && !x->destroyed) {
        x->destroyed = true;
        return syn::kSuccess;
      }
  return violation("synSectionDestroy: not a live section");
}

__attribute__((visibility("default"))) syn::Status synTensorHandleCreate(syn::TensorHandle* t, syn::GraphHandle g,
                                                                         int32_t type, const char* name) {
  FAKE_LOCK;
  NEED_INIT("synTensorHandleCreate");
  if (!t || !live_graph(g)) return violation("synTensorHandleCreate: null tensor pointer or not a live graph");
  if (type != syn::kDataTensor && type != syn::kShapeTensor)
    return violation("synTensorHandleCreate: tensor type " + std::to_string(type));
  if (!name || !*name) return violation("synTensorHandleCreate: a tensor without a name");
  auto* f = reinterpret_cast<FGraph*>(g);
  for (auto& x : f->tensors)
    if (x->name == name)
      return violation(std::string("synTensorHandleCreate: name \"") + name + "\" used twice", syn::kNameIsAlreadyUsed);
  f->tensors.push_back(std::make_unique<FTensor>());
  f->tensors.back()->name = name;
  f->tensors.back()->shape_tensor = type == syn::kShapeTensor;
  *t = reinterpret_cast<syn::TensorHandle>(f->tensors.back().get());
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synTensorAssignToSection(syn::TensorHandle t, syn::SectionHandle s,
                                                                            uint64_t offset) {
  FAKE_LOCK;
  NEED_INIT("synTensorAssignToSection");
  FTensor* f = find_tensor(t);
  if (!f) return violation("synTensorAssignToSection: not a live tensor");
  if (offset != 0) return violation("synTensorAssignToSection: the stand-in takes one tensor per section, offset 0");
  if (f->shape_tensor) return violation("synTensorAssignToSection: \"" + f->name + "\" is a shape tensor (no data)");
  f->section = reinterpret_cast<FSection*>(s);
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synTensorSetGeometry(syn::TensorHandle t,
                                                                        const syn::TensorGeometry* geo, int32_t type) {
  FAKE_LOCK;
  NEED_INIT("synTensorSetGeometry");
  FTensor* f = find_tensor(t);
  if (!f || !geo) return violation("synTensorSetGeometry: not a live tensor, or null geometry");
  if (type != syn::kGeometryMaxSizes && type != syn::kGeometryMinSizes)
    return violation("synTensorSetGeometry: geometry type " + std::to_string(type));
  if (geo->dims < 1 || geo->dims > 5)
    return violation("synTensorSetGeometry: " + std::to_string(geo->dims) + " dims for \"" + f->name + "\"",
                     syn::kInvalidTensorDimensions);
  std::vector<int64_t>& sizes = type == syn::kGeometryMinSizes ? f->min_sizes : f->sizes;
  sizes.assign(geo->sizes, geo->sizes + geo->dims);
  for (int64_t s : sizes)
    if (s < 1) return violation("synTensorSetGeometry: a size below 1 for \"" + f->name + "\"");
  if (type == syn::kGeometryMaxSizes) f->has_geometry = true;
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synTensorSetDeviceDataType(syn::TensorHandle t, int32_t dtype) {
  FAKE_LOCK;
  NEED_INIT("synTensorSetDeviceDataType");
  FTensor* f = find_tensor(t);
  if (!f) return violation("synTensorSetDeviceDataType: not a live tensor");
  if (dtype != syn::kTypeFloat && dtype != syn::kTypeBf16 && dtype != syn::kTypeInt32 && dtype != syn::kTypeInt8)
    return violation("synTensorSetDeviceDataType: dtype " + std::to_string(dtype) + " for \"" + f->name + "\"");
  f->dtype = dtype;
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synTensorDestroy(syn::TensorHandle t) {
  FAKE_LOCK;
  NEED_INIT("synTensorDestroy");
  FTensor* f = find_tensor(t);
  if (!f) return violation("synTensorDestroy: not a live tensor");
  f->destroyed = true;
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synNodeCreate(syn::GraphHandle g, const syn::TensorHandle* inputs,
                                                                 const syn::TensorHandle* outputs, uint32_t num_inputs,
                                                                 uint32_t num_outputs, const void* params,
                                                                 unsigned params_size, const char* guid,
                                                                 const char* name, const char**, const char**) {
  FAKE_LOCK;
  NEED_INIT("synNodeCreate");
  if (!live_graph(g)) return violation("synNodeCreate: not a live graph");
  if (!guid || !*guid) return violation("synNodeCreate: no GUID");
  if ((params_size && !params) || (num_inputs && !inputs) || (num_outputs && !outputs))
    return violation(std::string("synNodeCreate ") + guid + ": null operands or parameters");
  auto* f = reinterpret_cast<FGraph*>(g);
  FNode n;
  n.guid = guid;
  n.name = name ? name : "";
  auto take = [&](const syn::TensorHandle* list, uint32_t count, std::vector<FTensor*>* out) -> std::string {
    for (uint32_t i = 0; i < count; ++i) {
      FTensor* t = find_tensor(list[i]);
      bool mine = false;
      for (auto& x : f->tensors) mine = mine || x.get() == t;
      if (!t || !mine) return "operand " + std::to_string(i) + " is not a live tensor of this graph";
      if (!t->has_geometry || !t->dtype) return "tensor \"" + t->name + "\" has no geometry or dtype yet";
      out->push_back(t);
    }
    return "";
  };
  std::string e = take(inputs, num_inputs, &n.in);
  if (e.empty()) e = take(outputs, num_outputs, &n.out);
  if (!e.empty()) return violation("synNodeCreate " + n.guid + " \"" + n.name + "\": " + e);
  for (FTensor* o : n.out)
    for (const FNode& m : f->nodes)
      for (FTensor* x : m.out)
        if (x == o) return violation("synNodeCreate " + n.guid + ": tensor \"" + o->name + "\" is written twice");
  n.params.assign(static_cast<const uint8_t*>(params), static_cast<const uint8_t*>(params) + params_size);
  f->nodes.push_back(std::move(n));
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synGraphCompile(syn::RecipeHandle* recipe, syn::GraphHandle g,
                                                                   const char* name, const char*) {
  FAKE_LOCK;
  NEED_INIT("synGraphCompile");
  if (!recipe || !live_graph(g)) return violation("synGraphCompile: null recipe pointer or not a live graph");
  auto* f = reinterpret_cast<FGraph*>(g);
  const std::string fail = env("KILN_FAKE_SYNAPSE_FAIL_COMPILE");
  if (fail == "1") return injected("synGraphCompile of " + std::string(name ? name : ""), syn::kFail);
  auto r = std::make_unique<FRecipe>();
  r->name = name ? name : "";
  std::map<FTensor*, int> index;
  for (auto& t : f->tensors) {
    if (t->destroyed) continue;
    RTensor rt;
    rt.name = t->name;
    rt.dtype = t->dtype;
    rt.shape_tensor = t->shape_tensor;
    rt.persistent = (t->section && !t->section->destroyed) || t->shape_tensor;
    for (size_t d = t->sizes.size(); d-- > 0;) rt.shape.push_back(t->sizes[d]);
    // Without smallest sizes a tensor's sizes are fixed; with them, each is at most the largest.
    rt.min_shape = rt.shape;
    if (!t->min_sizes.empty()) {
      if (t->min_sizes.size() != t->sizes.size())
        return violation("synGraphCompile: tensor \"" + t->name + "\" has smallest and largest sizes of other ranks");
      rt.min_shape.clear();
      for (size_t d = t->min_sizes.size(); d-- > 0;) rt.min_shape.push_back(t->min_sizes[d]);
      for (size_t d = 0; d < rt.shape.size(); ++d)
        if (rt.min_shape[d] > rt.shape[d])
          return violation("synGraphCompile: tensor \"" + t->name + "\" has smallest sizes " +
                           shape_text(rt.min_shape) + " above its largest " + shape_text(rt.shape));
    }
    index[t.get()] = static_cast<int>(r->tensors.size());
    r->tensors.push_back(rt);
  }
  // Every tensor a node reads is persistent (an input) or written by an earlier node.
  std::set<FTensor*> written;
  for (const FNode& n : f->nodes) {
    if (!fail.empty() && n.guid == fail) return injected("synGraphCompile of a graph with " + fail, syn::kFail);
    RNode rn;
    rn.guid = n.guid;
    rn.name = n.name;
    rn.params = n.params;
    for (FTensor* t : n.in) {
      if (!index.count(t)) return violation("synGraphCompile: node \"" + n.name + "\" reads a destroyed tensor");
      if (!written.count(t) && !(t->section && !t->section->destroyed) && !t->shape_tensor)
        return violation("synGraphCompile: node \"" + n.name + "\" (" + n.guid + ") reads \"" + t->name +
                         "\", which no earlier node writes and which is not persistent");
      rn.in.push_back(index[t]);
    }
    for (FTensor* t : n.out) {
      if (t->shape_tensor)
        return violation("synGraphCompile: node \"" + n.name + "\" writes shape tensor \"" + t->name + "\"");
      written.insert(t);
      rn.out.push_back(index[t]);
    }
    const std::string why = check_node(*r, rn);
    if (!why.empty()) return violation("synGraphCompile: node \"" + n.name + "\" (" + n.guid + "): " + why);
    r->nodes.push_back(rn);
  }
  for (size_t i = 0; i < r->tensors.size(); ++i) {
    const RTensor& t = r->tensors[i];
    if (!t.persistent) r->workspace += (bytes_of(t) + 127) / 128 * 128;
  }
  st().compiles++;
  *recipe = reinterpret_cast<syn::RecipeHandle>(r.get());
  st().recipes.insert(r.release());
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synRecipeDestroy(syn::RecipeHandle recipe) {
  FAKE_LOCK;
  NEED_INIT("synRecipeDestroy");
  auto* r = reinterpret_cast<FRecipe*>(recipe);
  if (!st().recipes.erase(r)) return violation("synRecipeDestroy: not a live recipe");
  delete r;
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synRecipeSerialize(syn::RecipeHandle recipe, const char* file) {
  FAKE_LOCK;
  NEED_INIT("synRecipeSerialize");
  auto* r = reinterpret_cast<FRecipe*>(recipe);
  if (!st().recipes.count(r) || !file) return violation("synRecipeSerialize: not a live recipe, or no file");
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out << recipe_text(*r);
  if (!out) return syn::kFail;
  st().serialized++;
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synRecipeDeSerialize(syn::RecipeHandle* recipe, const char* file) {
  FAKE_LOCK;
  NEED_INIT("synRecipeDeSerialize");
  if (!recipe || !file) return violation("synRecipeDeSerialize: null recipe pointer or file");
  std::ifstream in(file, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  auto r = std::make_unique<FRecipe>();
  if (!in || !parse_recipe(text.str(), r.get())) return syn::kFail;
  st().deserialized++;
  *recipe = reinterpret_cast<syn::RecipeHandle>(r.get());
  st().recipes.insert(r.release());
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synWorkspaceGetSize(uint64_t* size, syn::RecipeHandle recipe) {
  FAKE_LOCK;
  NEED_INIT("synWorkspaceGetSize");
  auto* r = reinterpret_cast<FRecipe*>(recipe);
  if (!size || !st().recipes.count(r)) return violation("synWorkspaceGetSize: not a live recipe");
  *size = r->workspace;
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synTensorRetrieveIds(syn::RecipeHandle recipe, const char** names,
                                                                        uint64_t* ids, uint32_t count) {
  FAKE_LOCK;
  NEED_INIT("synTensorRetrieveIds");
  auto* r = reinterpret_cast<FRecipe*>(recipe);
  if (!st().recipes.count(r) || !names || !ids) return violation("synTensorRetrieveIds: not a live recipe");
  for (uint32_t i = 0; i < count; ++i) {
    ids[i] = UINT64_MAX;
    for (size_t k = 0; k < r->tensors.size(); ++k)
      if (r->tensors[k].persistent && names[i] && r->tensors[k].name == names[i]) ids[i] = k;
    if (ids[i] == UINT64_MAX)
      return violation(std::string("synTensorRetrieveIds: no persistent tensor \"") + (names[i] ? names[i] : "") +
                       "\" in recipe " + r->name);
  }
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synDeviceMalloc(syn::DeviceId id, uint64_t size, uint64_t req,
                                                                   uint32_t flags, uint64_t* address) {
  FAKE_LOCK;
  NEED_DEVICE("synDeviceMalloc", id);
  if (!address || size == 0) return violation("synDeviceMalloc: null address pointer or size 0");
  const std::string limit = env("KILN_FAKE_SYNAPSE_DEVICE_MEMORY");
  if (!limit.empty() && st().allocated + size > std::stoull(limit))
    return injected("synDeviceMalloc of " + std::to_string(size) + " bytes beyond " + limit, syn::kOutOfDeviceMemory);
  void* p = std::calloc(1, size);
  if (!p) return syn::kOutOfDeviceMemory;
  *address = reinterpret_cast<uint64_t>(p);
  st().allocations[*address] = size;
  st().allocated += size;
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synDeviceFree(syn::DeviceId id, uint64_t address, uint32_t) {
  FAKE_LOCK;
  NEED_DEVICE("synDeviceFree", id);
  auto it = st().allocations.find(address);
  if (it == st().allocations.end()) return violation("synDeviceFree: not a live allocation");
  st().allocated -= it->second;
  st().allocations.erase(it);
  std::free(reinterpret_cast<void*>(address));
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synHostMap(syn::DeviceId id, uint64_t size, const void* buffer) {
  FAKE_LOCK;
  NEED_DEVICE("synHostMap", id);
  if (!buffer || !size) return violation("synHostMap: null buffer or size 0");
  st().host_maps[reinterpret_cast<uintptr_t>(buffer)] = size;
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synHostUnmap(syn::DeviceId id, const void* buffer) {
  FAKE_LOCK;
  NEED_DEVICE("synHostUnmap", id);
  if (!st().host_maps.erase(reinterpret_cast<uintptr_t>(buffer))) return violation("synHostUnmap: not mapped");
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synMemCopyAsync(syn::StreamHandle s, uint64_t src, uint64_t size,
                                                                   uint64_t dst, int32_t direction) {
  FAKE_LOCK;
  NEED_INIT("synMemCopyAsync");
  if (!st().streams.count(reinterpret_cast<FStream*>(s))) return violation("synMemCopyAsync: not a live stream");
  const bool h2d = direction == syn::kHostToDram, d2h = direction == syn::kDramToHost;
  if (!h2d && !d2h) return violation("synMemCopyAsync: direction " + std::to_string(direction));
  if (!(h2d ? in_host_map(src, size) : in_allocation(src, size)))
    return violation(std::string("synMemCopyAsync: the source is not inside ") +
                     (h2d ? "mapped host memory" : "a device allocation"));
  if (!(h2d ? in_allocation(dst, size) : in_host_map(dst, size)))
    return violation(std::string("synMemCopyAsync: the destination is not inside ") +
                     (h2d ? "a device allocation" : "mapped host memory"));
  std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), size);
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synLaunchExt(syn::StreamHandle s,
                                                                const syn::LaunchTensorInfo* tensors, uint32_t count,
                                                                uint64_t workspace, syn::RecipeHandle recipe,
                                                                uint32_t flags) {
  FAKE_LOCK;
  NEED_INIT("synLaunchExt");
  if (!st().streams.count(reinterpret_cast<FStream*>(s))) return violation("synLaunchExt: not a live stream");
  auto* r = reinterpret_cast<FRecipe*>(recipe);
  if (!st().recipes.count(r)) return violation("synLaunchExt: not a live (compiled) recipe");
  if (flags != 0) return violation("synLaunchExt: flags " + std::to_string(flags) + " (tensors are named by id)");
  if (r->workspace && !in_allocation(workspace, r->workspace))
    return violation("synLaunchExt: recipe " + r->name + " needs a workspace of " + std::to_string(r->workspace) +
                     " bytes in device memory");
  if (env("KILN_FAKE_SYNAPSE_FAIL_LAUNCH") == "1") return injected("synLaunchExt of " + r->name, syn::kFail);
  // Each persistent tensor once, at sizes between its smallest and largest (the compiled sizes for
  // a static one); a data tensor inside a device allocation big enough for them.
  std::vector<uint64_t> where(r->tensors.size(), 0);
  std::vector<bool> given(r->tensors.size(), false);
  std::vector<std::vector<int64_t>> launched(r->tensors.size());
  auto within = [&](const RTensor& t, const std::vector<int64_t>& v) {
    if (v.size() != t.shape.size()) return false;
    for (size_t d = 0; d < v.size(); ++d)
      if (v[d] < t.min_shape[d] || v[d] > t.shape[d]) return false;
    return true;
  };
  auto range_text = [&](const RTensor& t) {
    return t.dynamic() ? shape_text(t.min_shape) + " to " + shape_text(t.shape) : shape_text(t.shape);
  };
  for (uint32_t i = 0; i < count; ++i) {
    const auto& info = tensors[i];
    if (info.tensor_id >= r->tensors.size() || !r->tensors[info.tensor_id].persistent)
      return violation("synLaunchExt: tensor id " + std::to_string(info.tensor_id) + " is not a persistent tensor of " +
                       r->name);
    const RTensor& t = r->tensors[info.tensor_id];
    if (given[info.tensor_id]) return violation("synLaunchExt: tensor \"" + t.name + "\" given twice");
    if (info.tensor_type != (t.shape_tensor ? syn::kShapeTensor : syn::kDataTensor))
      return violation("synLaunchExt: tensor \"" + t.name + "\" given as tensor type " +
                       std::to_string(info.tensor_type));
    std::vector<int64_t> sizes;
    for (size_t d = t.shape.size(); d-- > 0;) sizes.push_back(static_cast<int64_t>(info.tensor_size[d]));
    if (!within(t, sizes))
      return violation("synLaunchExt: tensor \"" + t.name + "\" launched with sizes " + shape_text(sizes) +
                       ", and it was compiled for " + range_text(t));
    RTensor actual = t;
    actual.shape = sizes;
    if (!t.shape_tensor && !in_allocation(info.device_address, bytes_of(actual)))
      return violation("synLaunchExt: tensor \"" + t.name + "\" is not inside a device allocation of " +
                       std::to_string(bytes_of(actual)) + " bytes");
    given[info.tensor_id] = true;
    where[info.tensor_id] = info.device_address;
    launched[info.tensor_id] = sizes;
  }
  for (size_t k = 0; k < r->tensors.size(); ++k)
    if (r->tensors[k].persistent && !given[k])
      return violation("synLaunchExt: persistent tensor \"" + r->tensors[k].name + "\" of " + r->name +
                       " is not given");
  std::vector<at::Tensor> env(r->tensors.size());
  for (size_t k = 0; k < r->tensors.size(); ++k) {
    if (!given[k]) continue;
    const auto opts = at::TensorOptions().dtype(scalar_type(r->tensors[k].dtype));
    // A shape tensor holds no data: its sizes are what a reshape reads.
    env[k] = r->tensors[k].shape_tensor ? at::empty(launched[k], opts)
                                        : at::from_blob(reinterpret_cast<void*>(where[k]), launched[k], opts).clone();
  }
  for (const RNode& n : r->nodes) {
    try {
      run_node(*r, n, env);
    } catch (const std::exception& e) {
      const std::string what = e.what();
      return violation("synLaunchExt: node \"" + n.name + "\" (" + n.guid + "): " + what.substr(0, what.find('\n')),
                       syn::kFail);
    }
    // What the node wrote must fit the geometry its outputs were compiled with: the sizes of one
    // that changes size, the element count of a static one.
    for (int o : n.out) {
      const RTensor& t = r->tensors[static_cast<size_t>(o)];
      if (!env[static_cast<size_t>(o)].defined())
        return violation("synLaunchExt: node \"" + n.name + "\" (" + n.guid + ") wrote nothing to \"" + t.name + "\"",
                         syn::kFail);
      const auto v = env[static_cast<size_t>(o)].sizes().vec();
      if (t.dynamic() ? !within(t, v)
                      : env[static_cast<size_t>(o)].numel() !=
                            static_cast<int64_t>(bytes_of(t) / at::elementSize(scalar_type(t.dtype))))
        return violation("synLaunchExt: node \"" + n.name + "\" (" + n.guid + ") wrote \"" + t.name + "\" at sizes " +
                         shape_text(v) + ", outside " + range_text(t) + " it was compiled for");
    }
  }
  for (const RNode& n : r->nodes)
    for (int o : n.out)
      if (given[static_cast<size_t>(o)]) {
        const at::Tensor& v = env[static_cast<size_t>(o)];
        const auto sizes = v.sizes().vec();
        if (r->tensors[o].dynamic() ? sizes != launched[static_cast<size_t>(o)] : v.nbytes() != bytes_of(r->tensors[o]))
          return violation("synLaunchExt: output \"" + r->tensors[o].name + "\" was launched with sizes " +
                           shape_text(launched[static_cast<size_t>(o)]) + " and has " + shape_text(sizes));
        std::memcpy(reinterpret_cast<void*>(where[static_cast<size_t>(o)]), v.data_ptr(), v.nbytes());
      }
  st().launches++;
  return syn::kSuccess;
}

__attribute__((visibility("default"))) syn::Status synStatusGetBriefDescription(syn::Status s, char* text, size_t len) {
  std::string d = s == syn::kSuccess             ? "success"
                  : s == syn::kOutOfDeviceMemory ? "out of device memory"
                  : s == syn::kFail              ? "failure"
                  : s == syn::kInvalidArgument   ? "invalid argument"
                                                 : "error";
  {
    FAKE_LOCK;
    // The stand-in's own account of the last failure, once.
    if (!st().last_error.empty() && s != syn::kSuccess) d += ": " + st().last_error;
    st().last_error.clear();
  }
  std::snprintf(text, len, "%s", d.c_str());
  return syn::kSuccess;
}

// For the tests: counters and every violation so far, one per line.
__attribute__((visibility("default"))) const char* kiln_fake_synapse_report() {
  FAKE_LOCK;
  static std::string text;
  std::ostringstream s;
  s << "compiles " << st().compiles << "\nlaunches " << st().launches << "\nnodes_run " << st().nodes_run
    << "\nserialized " << st().serialized << "\ndeserialized " << st().deserialized << "\nreleases " << st().releases
    << "\nlive_allocations " << st().allocations.size() << "\nlive_recipes " << st().recipes.size() << "\nviolations "
    << st().violations.size() << "\n";
  for (const auto& [g, n] : st().guids_run) s << "guid " << g << " " << n << "\n";
  for (const auto& v : st().violations) s << "violation " << v << "\n";
  text = s.str();
  return text.c_str();
}

}  // extern "C"
