// The C++ layer over kiln/plugin_api.h for plugin authors. Header-only, C++17, no LibTorch.
//
// A plugin derives from kiln::plugin::Plugin, describes itself, and ends with
// KILN_DEFINE_PLUGIN(MyPlugin). This layer fills the C function table, turns every exception into
// a KilnError at the boundary (nothing thrown ever crosses into the host), and gives bounds-checked
// views over the graph, the arguments and the tensors. The C header stays the contract: nothing
// here changes what crosses the boundary.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kiln/plugin_api.h"

// The concrete error type behind the opaque KilnError of this side of the boundary. Each side
// (each plugin library, and the host) has its own copy; an error is only ever read and freed
// through the table of the side that made it.
struct KilnError {
  KilnErrorCode code;
  std::string message;
};

namespace kiln::plugin {

// Thrown inside a plugin; becomes a KilnError with this code at the boundary.
class Error : public std::runtime_error {
 public:
  Error(KilnErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  KilnErrorCode code() const { return code_; }

 private:
  KilnErrorCode code_;
};

// From compile: "I do not compile this (yet); run these nodes eagerly."
class Unimplemented : public Error {
 public:
  explicit Unimplemented(const std::string& message) : Error(KILN_ERROR_UNIMPLEMENTED, message) {}
};

inline const char* error_code_name(KilnErrorCode code) {
  switch (code) {
    case KILN_ERROR_UNKNOWN: return "unknown";
    case KILN_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case KILN_ERROR_UNIMPLEMENTED: return "unimplemented";
    case KILN_ERROR_UNAVAILABLE: return "unavailable";
    case KILN_ERROR_OUT_OF_MEMORY: return "out of memory";
    case KILN_ERROR_INTERNAL: return "internal";
    case KILN_ERROR_ABI_MISMATCH: return "ABI mismatch";
    default: return "unrecognized error code";
  }
}

inline const char* mode_name(KilnMode mode) {
  switch (mode) {
    case KILN_MODE_DEFAULT: return "default";
    case KILN_MODE_REDUCE_OVERHEAD: return "reduce-overhead";
    case KILN_MODE_MAX_AUTOTUNE: return "max-autotune";
    case KILN_MODE_MAX_AUTOTUNE_NO_CUDAGRAPHS: return "max-autotune-no-cudagraphs";
    default: return "unknown";
  }
}

inline const char* device_kind_name(KilnDeviceKind kind) {
  switch (kind) {
    case KILN_DEVICE_CPU: return "cpu";
    case KILN_DEVICE_CUDA: return "cuda";
    case KILN_DEVICE_GAUDI: return "gaudi";
    case KILN_DEVICE_NEURON: return "neuron";
    default: return "unknown";
  }
}

// ---- dtypes --------------------------------------------------------------------------------

inline bool same_dtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}
inline constexpr DLDataType dtype_float32() { return DLDataType{kDLFloat, 32, 1}; }
inline bool is_float32(DLDataType t) { return same_dtype(t, dtype_float32()); }

// "float32", "bfloat16", "int64", "bool", ...
inline std::string dtype_name(DLDataType t) {
  std::string base;
  switch (t.code) {
    case kDLInt: base = "int"; break;
    case kDLUInt: base = "uint"; break;
    case kDLFloat: base = "float"; break;
    case kDLBfloat: base = "bfloat"; break;
    case kDLComplex: base = "complex"; break;
    case KILN_DL_BOOL: return t.lanes == 1 ? "bool" : "bool x" + std::to_string(t.lanes);
    default: base = "code" + std::to_string(t.code) + "_"; break;
  }
  std::string s = base + std::to_string(t.bits);
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}

namespace detail {

// Preallocated so that running out of memory can still be reported; never freed.
inline KilnError* out_of_memory_error() {
  static KilnError oom{KILN_ERROR_OUT_OF_MEMORY, "out of memory"};
  return &oom;
}

inline KilnError* make_error(KilnErrorCode code, const std::string& message) noexcept {
  try {
    return new KilnError{code, message};
  } catch (...) {
    return out_of_memory_error();
  }
}

inline KilnErrorCode error_code(const KilnError* e) { return e ? e->code : KILN_ERROR_INTERNAL; }
inline const char* error_message(const KilnError* e) { return e ? e->message.c_str() : ""; }
inline void error_destroy(KilnError* e) {
  if (e != out_of_memory_error()) delete e;
}

// Runs `f`; any exception becomes a KilnError (owned by the receiver). Nothing escapes.
template <class F>
KilnError* guard(F&& f) noexcept {
  try {
    f();
    return nullptr;
  } catch (const Error& e) {
    return make_error(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return out_of_memory_error();
  } catch (const std::exception& e) {
    return make_error(KILN_ERROR_INTERNAL, e.what());
  } catch (...) {
    return make_error(KILN_ERROR_INTERNAL, "unknown exception");
  }
}

[[noreturn]] inline void invalid(const std::string& message) { throw Error(KILN_ERROR_INVALID_ARGUMENT, message); }

}  // namespace detail

// ---- Tensors ------------------------------------------------------------------------------------

// A non-owning view of a DLTensor (an execute input or output).
class Tensor {
 public:
  explicit Tensor(const DLTensor* t) : t_(t) {
    if (!t_) detail::invalid("null DLTensor");
  }
  const DLTensor* raw() const { return t_; }
  int ndim() const { return t_->ndim; }
  DLDataType dtype() const { return t_->dtype; }
  DLDevice device() const { return t_->device; }
  int64_t size(int d) const { return t_->shape[d]; }
  std::vector<int64_t> shape() const { return std::vector<int64_t>(t_->shape, t_->shape + t_->ndim); }
  // Strides in elements; DLPack's NULL strides mean contiguous row-major.
  std::vector<int64_t> strides() const {
    if (t_->strides) return std::vector<int64_t>(t_->strides, t_->strides + t_->ndim);
    std::vector<int64_t> s(static_cast<size_t>(t_->ndim));
    int64_t acc = 1;
    for (int d = t_->ndim - 1; d >= 0; --d) {
      s[static_cast<size_t>(d)] = acc;
      acc *= t_->shape[d];
    }
    return s;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < t_->ndim; ++d) n *= t_->shape[d];
    return n;
  }
  bool is_contiguous() const {
    if (!t_->strides) return true;
    int64_t acc = 1;
    for (int d = t_->ndim - 1; d >= 0; --d) {
      if (t_->shape[d] != 1 && t_->strides[d] != acc) return false;
      acc *= t_->shape[d];
    }
    return true;
  }
  // The first element (byte_offset applied).
  template <class T>
  T* data() const {
    return reinterpret_cast<T*>(static_cast<char*>(t_->data) + t_->byte_offset);
  }

 private:
  const DLTensor* t_;
};

// The current values of a step's run-time scalars, borrowed for one execute.
class Scalars {
 public:
  Scalars() = default;
  Scalars(const KilnArg* const* s, size_t n) : s_(s), n_(n) {}
  size_t size() const { return n_; }
  // Scalar k as a number (BOOL and INT converted).
  double number(int32_t k) const {
    if (k < 0 || static_cast<size_t>(k) >= n_ || !s_ || !s_[k])
      detail::invalid("run-time scalar " + std::to_string(k) + " not passed (" + std::to_string(n_) + " given)");
    return s_[k]->tag == KILN_ARG_DOUBLE ? s_[k]->d : static_cast<double>(s_[k]->i);
  }

 private:
  const KilnArg* const* s_ = nullptr;
  size_t n_ = 0;
};

// ---- Graph view ---------------------------------------------------------------------------------

class Value {
 public:
  Value(const KilnValue* v, int64_t index) : v_(v), index_(index) {}
  const KilnValue* raw() const { return v_; }
  int64_t index() const { return index_; }
  int64_t id() const { return v_->id; }
  DLDataType dtype() const { return v_->dtype; }
  DLDevice device() const { return v_->device; }
  int ndim() const { return v_->ndim; }
  std::vector<int64_t> shape() const {
    return v_->shape ? std::vector<int64_t>(v_->shape, v_->shape + v_->ndim) : std::vector<int64_t>();
  }
  std::vector<int64_t> strides() const {
    if (v_->strides) return std::vector<int64_t>(v_->strides, v_->strides + v_->ndim);
    std::vector<int64_t> s(static_cast<size_t>(v_->ndim));
    int64_t acc = 1;
    for (int d = v_->ndim - 1; d >= 0; --d) {
      s[static_cast<size_t>(d)] = acc;
      acc *= v_->shape[d];
    }
    return s;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < v_->ndim; ++d) n *= v_->shape[d];
    return n;
  }
  bool is_contiguous() const {
    if (!v_->strides) return true;
    int64_t acc = 1;
    for (int d = v_->ndim - 1; d >= 0; --d) {
      if (v_->shape[d] != 1 && v_->strides[d] != acc) return false;
      acc *= v_->shape[d];
    }
    return true;
  }

 private:
  const KilnValue* v_;
  int64_t index_;
};

class Arg {
 public:
  explicit Arg(const KilnArg* a) : a_(a) {}
  const KilnArg* raw() const { return a_; }
  KilnArgTag tag() const { return a_->tag; }
  std::string name() const { return a_->name ? a_->name : ""; }
  bool is_none() const { return a_->tag == KILN_ARG_NONE; }
  bool is_tensor() const { return a_->tag == KILN_ARG_TENSOR; }
  int64_t tensor_index() const { return expect(KILN_ARG_TENSOR, "a tensor"), a_->i; }
  bool as_bool() const { return expect(KILN_ARG_BOOL, "a bool"), a_->i != 0; }
  int64_t as_int() const { return expect(KILN_ARG_INT, "an int"), a_->i; }
  // A number: INT or DOUBLE (a Scalar is either).
  double as_double() const {
    if (a_->tag == KILN_ARG_INT) return static_cast<double>(a_->i);
    return expect(KILN_ARG_DOUBLE, "a number"), a_->d;
  }
  std::string as_string() const { return expect(KILN_ARG_STRING, "a string"), std::string(a_->s ? a_->s : ""); }
  DLDataType as_dtype() const { return expect(KILN_ARG_SCALAR_TYPE, "a dtype"), a_->dtype; }
  DLDevice as_device() const { return expect(KILN_ARG_DEVICE, "a device"), a_->device; }
  std::vector<int64_t> as_ints() const {
    if (a_->tag != KILN_ARG_INT_LIST && a_->tag != KILN_ARG_BOOL_LIST && a_->tag != KILN_ARG_TENSOR_LIST)
      mismatch("an int list");
    return a_->ints ? std::vector<int64_t>(a_->ints, a_->ints + a_->len) : std::vector<int64_t>();
  }
  std::vector<double> as_doubles() const {
    expect(KILN_ARG_DOUBLE_LIST, "a double list");
    return a_->doubles ? std::vector<double>(a_->doubles, a_->doubles + a_->len) : std::vector<double>();
  }
  // The run-time scalar this BOOL/INT/DOUBLE stands for, or -1 for a plain constant. Its current
  // value arrives with each execute (Scalars). Read only within the writer's struct_size: a struct
  // that ends before the field is a constant.
  int32_t runtime_scalar() const { return KILN_HAS_FIELD(a_, KilnArg, runtime_scalar) ? a_->runtime_scalar : -1; }

 private:
  void expect(KilnArgTag tag, const char* what) const {
    if (a_->tag != tag) mismatch(what);
  }
  [[noreturn]] void mismatch(const char* what) const {
    detail::invalid("argument '" + name() + "' is not " + what + " (tag " + std::to_string(a_->tag) + ")");
  }
  const KilnArg* a_;
};

class Node {
 public:
  Node(const KilnNode* n, int64_t index) : n_(n), index_(index) {}
  const KilnNode* raw() const { return n_; }
  int64_t index() const { return index_; }
  int64_t id() const { return n_->id; }
  std::string op() const { return n_->op ? n_->op : ""; }        // "aten::add.Tensor"
  std::string name() const { return n_->name ? n_->name : ""; }  // "aten::add"
  std::string overload() const { return n_->overload ? n_->overload : ""; }
  size_t num_args() const { return n_->num_args; }
  Arg arg(size_t i) const {
    if (i >= n_->num_args)
      detail::invalid(op() + " has " + std::to_string(n_->num_args) + " arguments, no argument " + std::to_string(i));
    return Arg(n_->args[i]);
  }
  std::optional<Arg> find_arg(const std::string& name) const {
    for (size_t i = 0; i < n_->num_args; ++i)
      if (n_->args[i]->name && name == n_->args[i]->name) return Arg(n_->args[i]);
    return std::nullopt;
  }
  std::vector<int64_t> inputs() const { return std::vector<int64_t>(n_->inputs, n_->inputs + n_->num_inputs); }
  std::vector<int64_t> outputs() const { return std::vector<int64_t>(n_->outputs, n_->outputs + n_->num_outputs); }

 private:
  const KilnNode* n_;
  int64_t index_;
};

class Graph {
 public:
  explicit Graph(const KilnGraphView* g) : g_(g) {
    if (!g_) detail::invalid("null graph view");
  }
  const KilnGraphView* raw() const { return g_; }
  size_t num_values() const { return g_->num_values; }
  size_t num_nodes() const { return g_->num_nodes; }
  Value value(int64_t index) const {
    if (index < 0 || static_cast<size_t>(index) >= g_->num_values)
      detail::invalid("value index " + std::to_string(index) + " out of range (graph has " +
                      std::to_string(g_->num_values) + " values)");
    return Value(g_->values[index], index);
  }
  Node node(int64_t index) const {
    if (index < 0 || static_cast<size_t>(index) >= g_->num_nodes)
      detail::invalid("node index " + std::to_string(index) + " out of range (graph has " +
                      std::to_string(g_->num_nodes) + " nodes)");
    return Node(g_->nodes[index], index);
  }
  std::vector<int64_t> inputs() const { return std::vector<int64_t>(g_->inputs, g_->inputs + g_->num_inputs); }
  std::vector<int64_t> outputs() const { return std::vector<int64_t>(g_->outputs, g_->outputs + g_->num_outputs); }
  // ABI 2.4 (Descriptor::symbolic_shapes): the size symbols of a view handed to compile, and the
  // numbers that follow them. Empty for a view with none, or from a host older than 2.4.
  std::vector<KilnSizeSymbol> symbols() const {
    if (!KILN_HAS_FIELD(g_, KilnGraphView, size_sites) || !g_->symbols) return {};
    return std::vector<KilnSizeSymbol>(g_->symbols, g_->symbols + g_->num_symbols);
  }
  std::vector<KilnSizeSite> size_sites() const {
    if (!KILN_HAS_FIELD(g_, KilnGraphView, size_sites) || !g_->size_sites) return {};
    return std::vector<KilnSizeSite>(g_->size_sites, g_->size_sites + g_->num_size_sites);
  }
  bool symbolic() const { return KILN_HAS_FIELD(g_, KilnGraphView, size_sites) && g_->num_symbols > 0; }
  // The symbols' values at the view's own sizes (read off its inputs).
  std::vector<int64_t> symbol_hints() const {
    std::vector<int64_t> v;
    for (const KilnSizeSymbol& s : symbols()) {
      if (s.input < 0 || static_cast<size_t>(s.input) >= g_->num_inputs)
        detail::invalid("size symbol on input " + std::to_string(s.input) + " of " + std::to_string(g_->num_inputs));
      const Value in = value(g_->inputs[s.input]);
      if (s.dim < 0 || s.dim >= in.ndim())
        detail::invalid("size symbol on dimension " + std::to_string(s.dim) + " of a " + std::to_string(in.ndim()) +
                        "-d input");
      v.push_back(in.shape()[static_cast<size_t>(s.dim)]);
    }
    return v;
  }

 private:
  const KilnGraphView* g_;
};

// The number a size site stands for at the symbols' values `sizes` (ABI 2.4). Throws when a
// factor is out of range or the expression is not an integer there.
inline int64_t size_site_integer(const KilnSizeSite& s, const std::vector<int64_t>& sizes) {
  if (s.num_factors < 0 || s.num_factors > 2 || s.den <= 0)
    detail::invalid("size site with " + std::to_string(s.num_factors) + " factors and denominator " +
                    std::to_string(s.den));
  int64_t p = s.num;
  for (int32_t k = 0; k < s.num_factors; ++k) {
    const int32_t f = s.factors[k];
    if (f < 0 || static_cast<size_t>(f) >= sizes.size())
      detail::invalid("size site names symbol " + std::to_string(f) + " of " + std::to_string(sizes.size()));
    p *= sizes[static_cast<size_t>(f)];
  }
  if (p % s.den != 0)
    detail::invalid(std::to_string(s.num) + "/" + std::to_string(s.den) +
                    " of the factors is not an integer at these sizes");
  return p / s.den + s.constant;
}

// An owned copy of a graph view, with every size site of a symbolic view evaluated at `sizes` (one
// value per symbol, each >= 2): the concrete graph the symbolic one stands for at those sizes. It
// has no symbols itself. Without sizes it is a plain copy (of a concrete view, or of a symbolic
// one at its own sizes, symbols dropped). The strings, arrays and structs are its own, so it
// outlives the call whose view it copied.
class ConcreteGraph {
 public:
  explicit ConcreteGraph(const Graph& g, const std::vector<int64_t>* sizes = nullptr) {
    const KilnGraphView* v = g.raw();
    values_.resize(v->num_values);
    shapes_.resize(v->num_values);
    strides_.resize(v->num_values);
    for (size_t i = 0; i < v->num_values; ++i) {
      const Value val = g.value(static_cast<int64_t>(i));
      values_[i] = *val.raw();
      values_[i].struct_size = KILN_VALUE_STRUCT_SIZE;
      shapes_[i] = val.shape();
      strides_[i] = val.strides();
      implicit_strides_.push_back(val.raw()->strides == nullptr);
      if (!KILN_HAS_FIELD(val.raw(), KilnValue, storage_offset)) values_[i].storage_offset = 0;
    }
    nodes_.resize(v->num_nodes);
    args_.resize(v->num_nodes);
    for (size_t n = 0; n < v->num_nodes; ++n) {
      const Node node = g.node(static_cast<int64_t>(n));
      nodes_[n].node = *node.raw();
      nodes_[n].op = node.op(), nodes_[n].name = node.name(), nodes_[n].overload = node.overload();
      nodes_[n].inputs = node.inputs();
      nodes_[n].outputs = node.outputs();
      auto& as = args_[n];
      as.resize(node.num_args());
      for (size_t k = 0; k < node.num_args(); ++k) {
        const KilnArg* a = node.raw()->args[k];
        OwnedArg& o = as[k];
        std::memset(&o.arg, 0, sizeof o.arg);
        std::memcpy(&o.arg, a, std::min(a->struct_size, sizeof o.arg));
        o.arg.struct_size = KILN_ARG_STRUCT_SIZE;
        if (!KILN_HAS_FIELD(a, KilnArg, runtime_scalar)) o.arg.runtime_scalar = -1;
        o.name = a->name ? a->name : "";
        o.s = a->s ? a->s : "";
        if (a->ints) o.ints.assign(a->ints, a->ints + a->len);
        if (a->doubles) o.doubles.assign(a->doubles, a->doubles + a->len);
        o.arg.tensor = nullptr;
        o.arg.tensors = nullptr;
      }
    }
    inputs_ = g.inputs();
    outputs_ = g.outputs();
    if (sizes) {
      const auto syms = g.symbols();
      if (sizes->size() != syms.size())
        detail::invalid(std::to_string(sizes->size()) + " sizes for " + std::to_string(syms.size()) + " size symbols");
      for (size_t k = 0; k < sizes->size(); ++k)
        if ((*sizes)[k] < 2)
          detail::invalid("size symbol " + std::to_string(k) + " = " + std::to_string((*sizes)[k]) +
                          ": symbols are >= 2 (sizes 0 and 1 get graphs of their own)");
      for (const KilnSizeSite& s : g.size_sites()) apply(s, *sizes);
      // A value the view gave without strides is contiguous at every size.
      for (size_t i = 0; i < values_.size(); ++i) {
        if (!implicit_strides_[i]) continue;
        int64_t acc = 1;
        for (size_t d = shapes_[i].size(); d-- > 0;) strides_[i][d] = acc, acc *= shapes_[i][d];
      }
    }
    link();
  }
  ConcreteGraph(const ConcreteGraph&) = delete;
  ConcreteGraph& operator=(const ConcreteGraph&) = delete;
  Graph graph() const { return Graph(&view_); }

 private:
  struct OwnedNode {
    KilnNode node;
    std::string op, name, overload;
    std::vector<int64_t> inputs, outputs;
    std::vector<const KilnArg*> arg_ptrs;
  };
  struct OwnedArg {
    KilnArg arg;
    std::string name, s;
    std::vector<int64_t> ints;
    std::vector<double> doubles;
  };

  void apply(const KilnSizeSite& s, const std::vector<int64_t>& sizes) {
    const int64_t x = size_site_integer(s, sizes);
    auto in_range = [&](size_t i, size_t n, const char* what) {
      if (i >= n) detail::invalid(std::string("size site: ") + what + " " + std::to_string(i) + " out of range");
    };
    const auto at = static_cast<size_t>(s.at), elem = static_cast<size_t>(s.elem), arg = static_cast<size_t>(s.arg);
    switch (s.kind) {
      case KILN_SIZE_SITE_SHAPE:
        in_range(at, values_.size(), "value"), in_range(elem, shapes_[at].size(), "dimension");
        shapes_[at][elem] = x;
        break;
      case KILN_SIZE_SITE_STRIDE:
        in_range(at, values_.size(), "value"), in_range(elem, strides_[at].size(), "dimension");
        strides_[at][elem] = x;
        break;
      case KILN_SIZE_SITE_OFFSET:
        in_range(at, values_.size(), "value");
        values_[at].storage_offset = x;
        break;
      case KILN_SIZE_SITE_INT:
      case KILN_SIZE_SITE_INTS:
      case KILN_SIZE_SITE_DOUBLE: {
        in_range(at, args_.size(), "node"), in_range(arg, args_[at].size(), "argument");
        OwnedArg& o = args_[at][arg];
        if (s.kind == KILN_SIZE_SITE_INT) {
          o.arg.i = x;
        } else if (s.kind == KILN_SIZE_SITE_INTS) {
          in_range(elem, o.ints.size(), "list element");
          o.ints[elem] = x;
        } else {
          o.arg.d = s.reciprocal ? 1.0 / static_cast<double>(x) : static_cast<double>(x);
        }
        break;
      }
      default: detail::invalid("size site of kind " + std::to_string(s.kind));
    }
  }

  void link() {
    for (size_t i = 0; i < values_.size(); ++i) {
      values_[i].shape = shapes_[i].empty() ? nullptr : shapes_[i].data();
      values_[i].strides = strides_[i].empty() ? nullptr : strides_[i].data();
      value_ptrs_.push_back(&values_[i]);
    }
    for (size_t n = 0; n < nodes_.size(); ++n) {
      OwnedNode& o = nodes_[n];
      for (auto& a : args_[n]) {
        a.arg.name = a.name.c_str();
        a.arg.s = a.arg.tag == KILN_ARG_STRING ? a.s.c_str() : nullptr;
        a.arg.ints = a.ints.empty() ? nullptr : a.ints.data();
        a.arg.doubles = a.doubles.empty() ? nullptr : a.doubles.data();
        o.arg_ptrs.push_back(&a.arg);
      }
      o.node.struct_size = KILN_NODE_STRUCT_SIZE;
      o.node.op = o.op.c_str(), o.node.name = o.name.c_str(), o.node.overload = o.overload.c_str();
      o.node.args = o.arg_ptrs.data();
      o.node.num_args = o.arg_ptrs.size();
      o.node.inputs = o.inputs.data(), o.node.num_inputs = o.inputs.size();
      o.node.outputs = o.outputs.data(), o.node.num_outputs = o.outputs.size();
      node_ptrs_.push_back(&o.node);
    }
    std::memset(&view_, 0, sizeof view_);
    view_.struct_size = KILN_GRAPH_VIEW_STRUCT_SIZE;
    view_.num_values = value_ptrs_.size();
    view_.values = value_ptrs_.data();
    view_.num_nodes = node_ptrs_.size();
    view_.nodes = node_ptrs_.data();
    view_.num_inputs = inputs_.size();
    view_.inputs = inputs_.data();
    view_.num_outputs = outputs_.size();
    view_.outputs = outputs_.data();
  }

  std::vector<KilnValue> values_;
  std::vector<std::vector<int64_t>> shapes_, strides_;
  std::vector<bool> implicit_strides_;
  std::vector<OwnedNode> nodes_;
  std::vector<std::vector<OwnedArg>> args_;
  std::vector<const KilnValue*> value_ptrs_;
  std::vector<const KilnNode*> node_ptrs_;
  std::vector<int64_t> inputs_, outputs_;
  KilnGraphView view_;
};

// ---- Devices ------------------------------------------------------------------------------------

class Devices {
 public:
  Devices(const KilnDeviceInfo* const* devices, size_t n) : d_(devices), n_(n) {}
  size_t size() const { return n_; }
  const KilnDeviceInfo& operator[](size_t i) const { return *d_[i]; }
  // The first device of `kind`, or nullptr.
  const KilnDeviceInfo* first(KilnDeviceKind kind) const {
    for (size_t i = 0; i < n_; ++i)
      if (d_[i] && d_[i]->kind == kind) return d_[i];
    return nullptr;
  }
  size_t count(KilnDeviceKind kind) const {
    size_t c = 0;
    for (size_t i = 0; i < n_; ++i) c += (d_[i] && d_[i]->kind == kind) ? 1 : 0;
    return c;
  }

 private:
  const KilnDeviceInfo* const* d_;
  size_t n_;
};

// ---- Host services ------------------------------------------------------------------------------

class Host {
 public:
  Host(const KilnHostApi* api, std::string plugin_name) : api_(api), plugin_(std::move(plugin_name)) {}
  const KilnHostApi* raw() const { return api_; }

  void log(KilnLogLevel level, const std::string& message) const {
    if (!api_ || !api_->log) return;
    KilnHostLogArgs a;
    std::memset(&a, 0, sizeof a);
    a.struct_size = KILN_HOST_LOG_ARGS_STRUCT_SIZE;
    a.host_ctx = api_->host_ctx;
    a.level = level;
    a.plugin = plugin_.c_str();
    a.message = message.c_str();
    api_->log(&a);
  }
  void debug(const std::string& m) const { log(KILN_LOG_DEBUG, m); }
  void info(const std::string& m) const { log(KILN_LOG_INFO, m); }
  void warn(const std::string& m) const { log(KILN_LOG_WARN, m); }
  void error(const std::string& m) const { log(KILN_LOG_ERROR, m); }

  std::string cache_dir() const {
    if (!api_ || !api_->cache_dir) return "";
    KilnHostCacheDirArgs a;
    std::memset(&a, 0, sizeof a);
    a.struct_size = KILN_HOST_CACHE_DIR_ARGS_STRUCT_SIZE;
    a.host_ctx = api_->host_ctx;
    api_->cache_dir(&a);
    return a.cache_dir ? a.cache_dir : "";
  }
  std::optional<std::string> option(const std::string& key) const {
    if (!api_ || !api_->get_option) return std::nullopt;
    KilnHostGetOptionArgs a;
    std::memset(&a, 0, sizeof a);
    a.struct_size = KILN_HOST_GET_OPTION_ARGS_STRUCT_SIZE;
    a.host_ctx = api_->host_ctx;
    a.plugin = plugin_.c_str();
    a.key = key.c_str();
    api_->get_option(&a);
    if (!a.value) return std::nullopt;
    return std::string(a.value);
  }

  bool has_device_memory() const { return api_ && api_->device_alloc && api_->device_free; }
  void* alloc(DLDevice device, size_t nbytes, void* stream = nullptr) const {
    if (!has_device_memory()) throw Error(KILN_ERROR_UNIMPLEMENTED, "the host offers no device memory");
    KilnHostDeviceAllocArgs a;
    std::memset(&a, 0, sizeof a);
    a.struct_size = KILN_HOST_DEVICE_ALLOC_ARGS_STRUCT_SIZE;
    a.host_ctx = api_->host_ctx;
    a.device = device;
    a.nbytes = nbytes;
    a.stream = stream;
    check(api_->device_alloc(&a));
    return a.ptr;
  }
  void free(DLDevice device, void* ptr) const {
    if (!has_device_memory() || !ptr) return;
    KilnHostDeviceFreeArgs a;
    std::memset(&a, 0, sizeof a);
    a.struct_size = KILN_HOST_DEVICE_FREE_ARGS_STRUCT_SIZE;
    a.host_ctx = api_->host_ctx;
    a.device = device;
    a.ptr = ptr;
    api_->device_free(&a);
  }

  bool has_call_eager() const { return api_ && api_->call_eager; }
  // Runs an ATen op eagerly; args hold every schema argument, tensors with `tensor(s)` set.
  void call_eager(const std::string& op, const std::vector<KilnArg>& args, DLTensor* outputs,
                  size_t num_outputs) const {
    if (!has_call_eager()) throw Error(KILN_ERROR_UNIMPLEMENTED, "the host offers no call_eager");
    std::vector<const KilnArg*> ptrs;
    ptrs.reserve(args.size());
    for (const auto& a : args) ptrs.push_back(&a);
    call_eager(op, ptrs.data(), ptrs.size(), outputs, num_outputs);
  }
  // Same, with the arguments already as the array of pointers the ABI takes.
  void call_eager(const std::string& op, const KilnArg* const* args, size_t num_args, DLTensor* outputs,
                  size_t num_outputs) const {
    if (!has_call_eager()) throw Error(KILN_ERROR_UNIMPLEMENTED, "the host offers no call_eager");
    KilnHostCallEagerArgs a;
    std::memset(&a, 0, sizeof a);
    a.struct_size = KILN_HOST_CALL_EAGER_ARGS_STRUCT_SIZE;
    a.host_ctx = api_->host_ctx;
    a.op = op.c_str();
    a.args = args;
    a.num_args = num_args;
    a.outputs = outputs;
    a.num_outputs = num_outputs;
    check(api_->call_eager(&a));
  }

  // Turns a host error into an exception, freeing it through the host's table.
  void check(KilnError* e) const {
    if (!e) return;
    KilnErrorCode code = api_->error_code(e);
    std::string msg = api_->error_message(e);
    api_->error_destroy(e);
    throw Error(code, msg);
  }

 private:
  const KilnHostApi* api_;
  std::string plugin_;
};

// Host memory owned RAII-style.
class DeviceBuffer {
 public:
  DeviceBuffer(const Host& host, DLDevice device, size_t nbytes, void* stream = nullptr)
      : host_(&host), device_(device), ptr_(host.alloc(device, nbytes, stream)) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { host_->free(device_, ptr_); }
  void* get() const { return ptr_; }

 private:
  const Host* host_;
  DLDevice device_;
  void* ptr_;
};

// Building call_eager arguments.
inline KilnArg make_arg(KilnArgTag tag, const char* name) {
  KilnArg a;
  std::memset(&a, 0, sizeof a);
  a.struct_size = KILN_ARG_STRUCT_SIZE;
  a.tag = tag;
  a.name = name;
  a.runtime_scalar = -1;
  return a;
}
inline KilnArg tensor_arg(const char* name, const DLTensor* t) {
  KilnArg a = make_arg(KILN_ARG_TENSOR, name);
  a.tensor = t;
  return a;
}
inline KilnArg int_arg(const char* name, int64_t v) {
  KilnArg a = make_arg(KILN_ARG_INT, name);
  a.i = v;
  return a;
}
inline KilnArg double_arg(const char* name, double v) {
  KilnArg a = make_arg(KILN_ARG_DOUBLE, name);
  a.d = v;
  return a;
}
inline KilnArg bool_arg(const char* name, bool v) {
  KilnArg a = make_arg(KILN_ARG_BOOL, name);
  a.i = v ? 1 : 0;
  return a;
}
inline KilnArg none_arg(const char* name) { return make_arg(KILN_ARG_NONE, name); }

// ---- What a plugin implements -------------------------------------------------------------------

struct Descriptor {
  std::string name;
  std::string version;
  std::string vendor;
  std::string description;
  uint32_t device_kinds = 0;                          // KILN_DEVICE_MASK_*
  uint32_t modes = KILN_MODE_BIT(KILN_MODE_DEFAULT);  // KILN_MODE_BIT(...)
  // Each flag is one KILN_CAPABILITY_* bit of the C descriptor.
  // KILN_CAPABILITY_CONCURRENT_EXECUTE: Executable::execute may run from several threads at once.
  bool concurrent_execution_safe = false;
  // KILN_CAPABILITY_RUNTIME_SCALARS: the plugin reads run-time scalars (Arg::runtime_scalar) from
  // Scalars on every call; the host then hands it nodes that have them.
  bool runtime_scalars = false;
  // KILN_CAPABILITY_DEVICE_GRAPHS: the plugin records and replays device graphs
  // (Plugin::graph_capture_begin/end); the C table then gets the four graph functions.
  bool device_graphs = false;
  // KILN_CAPABILITY_WHOLE_STEP_GRAPH: choosing this backend asks for the whole step to be recorded
  // as one device graph in every mode.
  bool whole_step_graph = false;
  // KILN_CAPABILITY_CONCURRENT_COMPILE (ABI 2.1): Plugin::compile may run from several threads at
  // once, on distinct subgraphs; kiln then compiles the groups of a step in parallel.
  bool concurrent_compile_safe = false;
  // KILN_CAPABILITY_GRAPH_COPIES (ABI 2.3), with device_graphs: the plugin implements
  // Plugin::graph_capture_end_with_copies and GraphExec::launch_with_copies, re-pointing the copies
  // the host recorded at each launch.
  bool graph_copies = false;
  // KILN_CAPABILITY_SYMBOLIC_SHAPES (ABI 2.4): compile may be handed a view with size symbols
  // (Graph::symbolic); an executable that sets Executable::serves_all_sizes is then run at every
  // size with each call's symbol values (Executable::execute_sized).
  bool symbolic_shapes = false;
  // The availability score for "auto" when the plugin does not override Plugin::available.
  int32_t default_score = 0;

  uint64_t capabilities() const {
    return (concurrent_execution_safe ? KILN_CAPABILITY_CONCURRENT_EXECUTE : 0) |
           (runtime_scalars ? KILN_CAPABILITY_RUNTIME_SCALARS : 0) |
           (device_graphs ? KILN_CAPABILITY_DEVICE_GRAPHS : 0) |
           (whole_step_graph ? KILN_CAPABILITY_WHOLE_STEP_GRAPH : 0) |
           (concurrent_compile_safe ? KILN_CAPABILITY_CONCURRENT_COMPILE : 0) |
           (graph_copies ? KILN_CAPABILITY_GRAPH_COPIES : 0) | (symbolic_shapes ? KILN_CAPABILITY_SYMBOLIC_SHAPES : 0);
  }
};

// score: how strongly "auto" should pick this plugin here; the available plugin with the highest
// positive score is chosen, 0 means "only when named" (docs/writing-a-backend.md has the scale).
struct Availability {
  bool available = false;
  std::string reason;
  int32_t score = 0;
  static Availability yes(std::string reason, int32_t score = 0) { return {true, std::move(reason), score}; }
  static Availability no(std::string reason) { return {false, std::move(reason), 0}; }
};

struct CompileOptions {
  KilnMode mode = KILN_MODE_DEFAULT;
  std::map<std::string, std::string> options;  // the [plugin.<name>] table
  std::string cache_dir;
  // In-place outputs (ABI 2.2): empty, or one entry per output of the subgraph: -1, or the input
  // whose memory the host would like to pass as this output too (KilnPluginCompileArgs says when).
  // The plugin accepts a pair by setting Executable::inplace_outputs.
  std::vector<int64_t> inplace_inputs;
};

class Executable {
 public:
  virtual ~Executable() = default;
  // In-place outputs the executable computes correctly (ABI 2.2): empty, or one entry per output,
  // -1 or CompileOptions::inplace_inputs[k] for an output that may share memory with that input.
  std::vector<int64_t> inplace_outputs;
  // ABI 2.5: an execute that throws has written into none of the inputs of inplace_outputs (it
  // throws before its first such write, or not at all); the host then keeps no undo copy for it.
  bool inplace_atomic = false;
  // outputs are preallocated by the host; write into them.
  virtual void execute(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
                       void* stream) = 0;
  // What the host calls: execute with the current values of the step's run-time scalars (none unless
  // the Descriptor sets runtime_scalars). The default ignores them (right for subgraphs without any).
  virtual void execute_with_scalars(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
                                    const Scalars& scalars, void* stream) {
    (void)scalars;
    execute(inputs, num_inputs, outputs, num_outputs, stream);
  }
  // ABI 2.4: set by compile, given a symbolic view (Graph::symbolic), when this executable computes
  // the subgraph at every size (KilnPluginCompileArgs.symbolic_accepted); ignored otherwise.
  bool serves_all_sizes = false;
  // What the host calls for an executable that serves all sizes: `sizes` holds this call's symbol
  // values (the inputs and outputs have the shapes the size sites give there). The default ignores
  // them, which is right only for an executable that reads every size from its tensors.
  virtual void execute_sized(const DLTensor* inputs, size_t num_inputs, DLTensor* outputs, size_t num_outputs,
                             const Scalars& scalars, const std::vector<int64_t>& sizes, void* stream) {
    (void)sizes;
    execute_with_scalars(inputs, num_inputs, outputs, num_outputs, scalars, stream);
  }
};

// An owned copy of a symbolic view that keeps its size symbols and sites (ConcreteGraph drops
// them): for an executable that makes the concrete graph of each size it meets later.
class SymbolicGraphCopy {
 public:
  explicit SymbolicGraphCopy(const Graph& g) : copy_(g), symbols_(g.symbols()), sites_(g.size_sites()) {
    view_ = *copy_.graph().raw();
    view_.num_symbols = symbols_.size();
    view_.symbols = symbols_.data();
    view_.num_size_sites = sites_.size();
    view_.size_sites = sites_.data();
  }
  SymbolicGraphCopy(const SymbolicGraphCopy&) = delete;
  SymbolicGraphCopy& operator=(const SymbolicGraphCopy&) = delete;
  Graph graph() const { return Graph(&view_); }
  const std::vector<KilnSizeSymbol>& symbols() const { return symbols_; }

 private:
  ConcreteGraph copy_;
  std::vector<KilnSizeSymbol> symbols_;
  std::vector<KilnSizeSite> sites_;
  KilnGraphView view_;
};

// A range of sizes that one compile serves, for a plugin that compiles a symbolic view once per
// range ("bucket") rather than once per size: each symbol's value lies in [low, high]. The policy
// is what its user names in the plugin's options: "pow2" (each value in (2^(k-1), 2^k]), a
// positive integer N (in (N(k-1), Nk]) or "exact" (the value alone); never below 2, a symbol's
// least value. `option` names the option in the error a policy gets that is none of these.
struct SizeBucket {
  std::vector<int64_t> low, high;
};
inline void check_size_bucket_policy(const std::string& policy, const std::string& option) {
  if (policy == "pow2" || policy == "exact") return;
  char* end = nullptr;
  const long long n = std::strtoll(policy.c_str(), &end, 10);
  if (policy.empty() || *end != '\0' || n < 1 || n > (1ll << 30))
    throw Error(KILN_ERROR_INVALID_ARGUMENT,
                option + " = '" + policy +
                    "': expected \"pow2\" (sizes rounded up to a power of two), a positive integer N (rounded up "
                    "to a multiple of N) or \"exact\" (one compile per size)");
}
inline SizeBucket size_bucket(const std::string& policy, const std::vector<int64_t>& sizes, const std::string& option) {
  check_size_bucket_policy(policy, option);
  SizeBucket b{sizes, sizes};
  if (policy == "exact") return b;
  const int64_t n = policy == "pow2" ? 0 : std::stoll(policy);
  for (size_t i = 0; i < sizes.size(); ++i) {
    int64_t hi = 1;
    if (n) {
      hi = (sizes[i] + n - 1) / n * n;
      b.low[i] = std::max<int64_t>(2, hi - n + 1);
    } else {
      while (hi < sizes[i]) hi *= 2;
      b.low[i] = std::max<int64_t>(2, hi / 2 + 1);
    }
    b.high[i] = hi;
  }
  return b;
}

// An executable that serves every size of a symbolic view by compiling the concrete graph of each
// size it meets (ConcreteGraph) with `compile` and keeping the last `keep` of them: for a plugin
// whose compile of a size it has seen the kernels of is cheap (it keeps its kernels by something
// other than the sizes). Thread-safe: executes of sizes already met run at once; a new size
// compiles under a lock.
class ExecutableForEverySize : public Executable {
 public:
  using CompileFn = std::function<std::unique_ptr<Executable>(const Graph&)>;
  // `first`: the executable compiled for the view's own sizes (kept as that size's).
  ExecutableForEverySize(const Graph& symbolic, std::unique_ptr<Executable> first, CompileFn compile, size_t keep = 64)
      : graph_(std::make_shared<SymbolicGraphCopy>(symbolic)), compile_(std::move(compile)), keep_(keep) {
    serves_all_sizes = true;
    inplace_outputs = first->inplace_outputs;
    entries_.push_back({symbolic.symbol_hints(), std::shared_ptr<Executable>(std::move(first))});
  }
  void execute(const DLTensor* in, size_t n_in, DLTensor* out, size_t n_out, void* stream) override {
    at(hints())->execute(in, n_in, out, n_out, stream);
  }
  void execute_with_scalars(const DLTensor* in, size_t n_in, DLTensor* out, size_t n_out, const Scalars& scalars,
                            void* stream) override {
    at(hints())->execute_with_scalars(in, n_in, out, n_out, scalars, stream);
  }
  void execute_sized(const DLTensor* in, size_t n_in, DLTensor* out, size_t n_out, const Scalars& scalars,
                     const std::vector<int64_t>& sizes, void* stream) override {
    at(sizes)->execute_with_scalars(in, n_in, out, n_out, scalars, stream);
  }

 private:
  std::vector<int64_t> hints() const { return graph_->graph().symbol_hints(); }
  std::shared_ptr<Executable> at(const std::vector<int64_t>& sizes) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].first != sizes) continue;
      if (i > 0)
        std::rotate(entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(i),
                    entries_.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      return entries_.front().second;
    }
    ConcreteGraph concrete(graph_->graph(), &sizes);
    std::shared_ptr<Executable> exe = compile_(concrete.graph());
    if (!exe) throw Error(KILN_ERROR_INTERNAL, "compile returned no executable");
    // The host passes one tensor for an in-place pair the first size accepted: every size must.
    for (size_t k = 0; k < inplace_outputs.size(); ++k)
      if (inplace_outputs[k] >= 0 &&
          (k >= exe->inplace_outputs.size() || exe->inplace_outputs[k] != inplace_outputs[k]))
        throw Error(KILN_ERROR_INTERNAL, "output " + std::to_string(k) + " is computed over input " +
                                             std::to_string(inplace_outputs[k]) +
                                             "'s memory at the first size, but not at this one");
    entries_.insert(entries_.begin(), {sizes, exe});
    if (entries_.size() > keep_) entries_.pop_back();  // one running keeps its own reference
    return exe;
  }
  std::shared_ptr<const SymbolicGraphCopy> graph_;
  CompileFn compile_;
  size_t keep_;
  std::mutex mu_;
  std::vector<std::pair<std::vector<int64_t>, std::shared_ptr<Executable>>> entries_;  // most recent first
};

// An instantiated device graph (Descriptor::device_graphs).
class GraphExec {
 public:
  virtual ~GraphExec() = default;
  // Enqueues one replay on `stream` (cudaStream_t on CUDA).
  virtual void launch(void* stream) = 0;
  // Descriptor::graph_copies (ABI 2.3): re-point the recorded copies whose addresses changed, then
  // launch (KilnGraphLaunchArgs says what the host passes). The layer has checked that `n` is 0 or
  // the number recorded; without copies it calls launch().
  virtual void launch_with_copies(void* stream, const KilnGraphCopy* copies, size_t n) {
    (void)copies;
    if (n) throw Error(KILN_ERROR_INVALID_ARGUMENT, "graph_launch: this plugin re-points no copies");
    launch(stream);
  }
  // The number of copies recorded with the graph (set by the layer from graph_capture_end's args).
  size_t num_copies = 0;
};

class Plugin {
 public:
  explicit Plugin(Host host) : host_(std::move(host)) {}
  virtual ~Plugin() = default;
  const Host& host() const { return host_; }
  // Set by the layer from Descriptor::default_score before any call.
  void set_default_score(int32_t score) { default_score_ = score; }

  // Default: available, with the Descriptor's default_score (the host only offers devices of the
  // kinds the descriptor lists).
  virtual Availability available(const Devices&) { return Availability::yes("", default_score_); }
  // Indices of the nodes this plugin takes.
  virtual std::vector<int64_t> claim(const Graph& graph) = 0;
  // Throw Unimplemented to have the host run the subgraph eagerly.
  virtual std::unique_ptr<Executable> compile(const Graph& subgraph, const CompileOptions& options) = 0;
  // For plugins whose Descriptor sets device_graphs: start recording the work enqueued on
  // `stream`; stop, instantiate and return it (also called to end a capture whose work failed:
  // then discard it and throw). Errors: throw kiln::plugin::Error.
  virtual void graph_capture_begin(DLDevice device, void* stream) {
    (void)device, (void)stream;
    throw Unimplemented("this plugin does not record device graphs");
  }
  virtual std::unique_ptr<GraphExec> graph_capture_end(DLDevice device, void* stream) {
    (void)device, (void)stream;
    throw Unimplemented("this plugin does not record device graphs");
  }
  // Descriptor::graph_copies (ABI 2.3): the same, given the copies the host enqueued during the
  // capture (KilnGraphCaptureEndArgs says what to do with them). Called instead of the above only
  // when there are copies.
  virtual std::unique_ptr<GraphExec> graph_capture_end_with_copies(DLDevice device, void* stream,
                                                                   const std::vector<KilnGraphCopy>& copies) {
    (void)copies;
    // A plugin without the capability is never handed copies; end the capture all the same.
    (void)graph_capture_end(device, stream);
    throw Error(KILN_ERROR_INTERNAL, "graph_capture_end: this plugin re-points no copies");
  }

 private:
  Host host_;
  int32_t default_score_ = 0;
};

}  // namespace kiln::plugin

// The executable handle of plugins built on this layer.
struct KilnExecutable {
  std::unique_ptr<kiln::plugin::Executable> impl;
};

// The device graph handle of plugins built on this layer.
struct KilnGraphExec {
  std::unique_ptr<kiln::plugin::GraphExec> impl;
};

namespace kiln::plugin::detail {

// The table returned when init fails before a context exists: only the frozen header, so that the
// host can read the message and free the error.
inline const KilnPluginApi* error_only_table() {
  static const KilnPluginApi table = [] {
    KilnPluginApi t;
    std::memset(&t, 0, sizeof t);
    t.struct_size = KILN_PLUGIN_API_HEADER_SIZE;
    t.abi_major = KILN_ABI_VERSION_MAJOR;
    t.abi_minor = KILN_ABI_VERSION_MINOR;
    t.error_code = &detail::error_code;
    t.error_message = &detail::error_message;
    t.error_destroy = &detail::error_destroy;
    return t;
  }();
  return &table;
}

template <class P>
struct PluginState {
  KilnPluginApi api;
  Descriptor desc;
  KilnPluginDescriptor c_desc;
  std::unique_ptr<P> plugin;
};

template <class P>
KilnError* init(const KilnHostApi* host, uint32_t host_major, uint32_t host_minor, const KilnPluginApi** out) noexcept {
  if (!out) return make_error(KILN_ERROR_INVALID_ARGUMENT, "kiln_plugin_init: out is NULL");
  *out = error_only_table();
  if (host_major != KILN_ABI_VERSION_MAJOR) {
    return make_error(KILN_ERROR_ABI_MISMATCH, "plugin built for kiln plugin ABI " +
                                                   std::to_string(KILN_ABI_VERSION_MAJOR) + "." +
                                                   std::to_string(KILN_ABI_VERSION_MINOR) + ", host speaks " +
                                                   std::to_string(host_major) + "." + std::to_string(host_minor));
  }
  if (!host || host->struct_size < KILN_HOST_API_STRUCT_SIZE || !host->error_code || !host->error_message ||
      !host->error_destroy) {
    return make_error(KILN_ERROR_INVALID_ARGUMENT, "kiln_plugin_init: host table missing or too small");
  }
  PluginState<P>* state = nullptr;
  KilnError* err = guard([&] {
    auto s = std::make_unique<PluginState<P>>();
    s->desc = P::describe();
    s->plugin = std::make_unique<P>(Host(host, s->desc.name));
    std::memset(&s->c_desc, 0, sizeof s->c_desc);
    s->c_desc.struct_size = KILN_PLUGIN_DESCRIPTOR_STRUCT_SIZE;
    s->c_desc.name = s->desc.name.c_str();
    s->c_desc.version = s->desc.version.c_str();
    s->c_desc.vendor = s->desc.vendor.c_str();
    s->c_desc.description = s->desc.description.c_str();
    s->c_desc.device_kinds = s->desc.device_kinds;
    s->c_desc.modes = s->desc.modes;
    s->c_desc.capabilities = s->desc.capabilities();
    s->c_desc.default_score = s->desc.default_score;
    s->plugin->set_default_score(s->desc.default_score);

    KilnPluginApi& t = s->api;
    std::memset(&t, 0, sizeof t);
    t.struct_size = KILN_PLUGIN_API_STRUCT_SIZE;
    t.abi_major = KILN_ABI_VERSION_MAJOR;
    t.abi_minor = KILN_ABI_VERSION_MINOR;
    t.error_code = &detail::error_code;
    t.error_message = &detail::error_message;
    t.error_destroy = &detail::error_destroy;
    t.plugin_ctx = s.get();
    t.descriptor = &s->c_desc;
    t.available = [](KilnPluginAvailableArgs* args) -> KilnError* {
      return guard([&] {
        if (!args) invalid("available: args is NULL");
        auto* st = static_cast<PluginState<P>*>(args->plugin_ctx);
        Availability a = st->plugin->available(Devices(args->devices, args->num_devices));
        args->available = a.available ? 1 : 0;
        args->score = a.score;
        if (args->reason && args->reason_capacity > 0)
          std::snprintf(args->reason, args->reason_capacity, "%s", a.reason.c_str());
      });
    };
    t.claim = [](KilnPluginClaimArgs* args) -> KilnError* {
      return guard([&] {
        if (!args) invalid("claim: args is NULL");
        args->num_claimed = 0;
        if (!args->claimed_nodes && args->graph && args->graph->num_nodes > 0) invalid("claim: claimed_nodes is NULL");
        auto* st = static_cast<PluginState<P>*>(args->plugin_ctx);
        Graph g(args->graph);
        std::vector<int64_t> nodes = st->plugin->claim(g);
        if (nodes.size() > g.num_nodes()) throw Error(KILN_ERROR_INTERNAL, "claim: more claims than nodes");
        for (size_t i = 0; i < nodes.size(); ++i) args->claimed_nodes[i] = nodes[i];
        args->num_claimed = nodes.size();
      });
    };
    t.compile = [](KilnPluginCompileArgs* args) -> KilnError* {
      return guard([&] {
        if (!args) invalid("compile: args is NULL");
        args->executable = nullptr;
        auto* st = static_cast<PluginState<P>*>(args->plugin_ctx);
        CompileOptions o;
        o.mode = args->mode;
        for (size_t i = 0; i < args->num_options; ++i) {
          const KilnOption* kv = args->options ? args->options[i] : nullptr;
          if (kv && kv->key) o.options[kv->key] = kv->value ? kv->value : "";
        }
        if (args->cache_dir) o.cache_dir = args->cache_dir;
        const bool inplace = KILN_HAS_FIELD(args, KilnPluginCompileArgs, inplace_accepted) && args->inplace_inputs &&
                             args->inplace_accepted && args->subgraph;
        if (inplace) o.inplace_inputs.assign(args->inplace_inputs, args->inplace_inputs + args->subgraph->num_outputs);
        std::unique_ptr<Executable> exe = st->plugin->compile(Graph(args->subgraph), o);
        if (!exe) throw Error(KILN_ERROR_INTERNAL, "compile returned no executable");
        if (KILN_HAS_FIELD(args, KilnPluginCompileArgs, symbolic_accepted))
          args->symbolic_accepted =
              st->desc.symbolic_shapes && exe->serves_all_sizes && Graph(args->subgraph).symbolic();
        if (inplace) {
          bool any = false;
          for (size_t k = 0; k < exe->inplace_outputs.size() && k < o.inplace_inputs.size(); ++k)
            if (exe->inplace_outputs[k] >= 0 && exe->inplace_outputs[k] == o.inplace_inputs[k]) {
              args->inplace_accepted[k] = exe->inplace_outputs[k];
              any = true;
            }
          if (any && KILN_HAS_FIELD(args, KilnPluginCompileArgs, inplace_atomic))
            args->inplace_atomic = exe->inplace_atomic ? 1 : 0;
        }
        auto box = std::make_unique<KilnExecutable>();
        box->impl = std::move(exe);
        args->executable = box.release();
      });
    };
    t.shutdown = [](KilnPluginShutdownArgs* args) {
      if (args) delete static_cast<PluginState<P>*>(args->plugin_ctx);
    };
    t.execute = [](KilnExecutableExecuteArgs* args) -> KilnError* {
      return guard([&] {
        if (!args || !args->executable || !args->executable->impl) invalid("execute: null executable");
        Executable& exe = *args->executable->impl;
        if (KILN_HAS_FIELD(args, KilnExecutableExecuteArgs, num_symbol_values) && args->num_symbol_values > 0) {
          if (!args->symbol_values) invalid("execute: symbol_values is NULL");
          const std::vector<int64_t> sizes(args->symbol_values, args->symbol_values + args->num_symbol_values);
          return exe.execute_sized(args->inputs, args->num_inputs, args->outputs, args->num_outputs,
                                   Scalars(args->scalars, args->num_scalars), sizes, args->stream);
        }
        exe.execute_with_scalars(args->inputs, args->num_inputs, args->outputs, args->num_outputs,
                                 Scalars(args->scalars, args->num_scalars), args->stream);
      });
    };
    t.executable_destroy = [](KilnExecutableDestroyArgs* args) {
      if (args) delete args->executable;
    };
    if (s->desc.device_graphs) {
      t.graph_capture_begin = [](KilnGraphCaptureBeginArgs* args) -> KilnError* {
        return guard([&] {
          if (!args) invalid("graph_capture_begin: args is NULL");
          static_cast<PluginState<P>*>(args->plugin_ctx)->plugin->graph_capture_begin(args->device, args->stream);
        });
      };
      t.graph_capture_end = [](KilnGraphCaptureEndArgs* args) -> KilnError* {
        if (args) args->graph = nullptr;
        return guard([&] {
          if (!args) invalid("graph_capture_end: args is NULL");
          auto* plugin = static_cast<PluginState<P>*>(args->plugin_ctx)->plugin.get();
          std::vector<KilnGraphCopy> copies;
          if (KILN_HAS_FIELD(args, KilnGraphCaptureEndArgs, num_copies) && args->num_copies) {
            if (!args->copies) {
              (void)plugin->graph_capture_end(args->device, args->stream);  // ends the capture
              invalid("graph_capture_end: copies is NULL with num_copies " + std::to_string(args->num_copies));
            }
            copies.assign(args->copies, args->copies + args->num_copies);
          }
          auto g = copies.empty() ? plugin->graph_capture_end(args->device, args->stream)
                                  : plugin->graph_capture_end_with_copies(args->device, args->stream, copies);
          if (!g) throw Error(KILN_ERROR_INTERNAL, "graph_capture_end returned no graph");
          g->num_copies = copies.size();
          auto box = std::make_unique<KilnGraphExec>();
          box->impl = std::move(g);
          args->graph = box.release();
        });
      };
      t.graph_launch = [](KilnGraphLaunchArgs* args) -> KilnError* {
        return guard([&] {
          if (!args || !args->graph || !args->graph->impl) invalid("graph_launch: null graph");
          auto& g = *args->graph->impl;
          const size_t n = KILN_HAS_FIELD(args, KilnGraphLaunchArgs, num_copies) ? args->num_copies : 0;
          if (n == 0) return g.launch(args->stream);
          if (!args->copies || n != g.num_copies)
            invalid("graph_launch: " + std::to_string(n) + " copies given, the graph recorded " +
                    std::to_string(g.num_copies));
          g.launch_with_copies(args->stream, args->copies, n);
        });
      };
      t.graph_destroy = [](KilnGraphDestroyArgs* args) {
        if (args) delete args->graph;
      };
    }
    state = s.release();
  });
  if (err) return err;
  *out = &state->api;
  return nullptr;
}

}  // namespace kiln::plugin::detail

// Defines the plugin's one exported symbol for a kiln::plugin::Plugin subclass that has
// `static kiln::plugin::Descriptor describe();` and a constructor taking kiln::plugin::Host.
#define KILN_DEFINE_PLUGIN(PluginClass)                                                                           \
  extern "C" KILN_PLUGIN_EXPORT KilnError* kiln_plugin_init(const KilnHostApi* host, uint32_t host_abi_major,     \
                                                            uint32_t host_abi_minor, const KilnPluginApi** out) { \
    return ::kiln::plugin::detail::init<PluginClass>(host, host_abi_major, host_abi_minor, out);                  \
  }
