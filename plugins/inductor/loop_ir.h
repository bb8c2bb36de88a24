// The inductor's loop-level IR: what a claimed subgraph becomes before C++ is generated.
//
// Every value of the subgraph is described as a function from an index (one affine index
// expression per dimension) to a scalar expression, as in PyTorch Inductor's "loaders". Pointwise
// ops compose those functions, views remap the index, and only some values get a buffer
// ("materialized"): subgraph inputs and outputs, reductions, extern-kernel results, and pointwise
// values that are read often and cost much to recompute. Scalar expressions are hash-consed in an
// ExprPool, so reading a value twice at the same index is one computation (CSE for free).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <kiln/plugin_api.h>

namespace kiln::inductor {

// Element types of buffers and expressions. bf16 is stored as bfloat16 and computed in float, by
// the CUDA and the C++ emitters alike.
enum class Ty : uint8_t { f32, f64, i64, i32, b8, bf16 };
const char* c_type(Ty t);
size_t ty_size(Ty t);
std::optional<Ty> ty_of(DLDataType t);
bool is_float(Ty t);

// c + sum(coef * loop variable) + sum(coef * (int64) expression): every address the generated code
// forms. Expression terms are data-dependent indices (nll_loss's gather by target).
struct Index {
  int64_t c = 0;
  std::vector<std::pair<int, int64_t>> vars;   // (variable id, coefficient), sorted, no zeros
  std::vector<std::pair<int, int64_t>> exprs;  // (expression id, coefficient), sorted, no zeros

  static Index constant(int64_t c);
  static Index var(int v);
  static Index expr(int e);
  Index operator+(const Index& o) const;
  Index scaled(int64_t k) const;
  bool is_constant() const { return vars.empty() && exprs.empty(); }
  bool is_var(int v) const {
    return c == 0 && exprs.empty() && vars.size() == 1 && vars[0].first == v && vars[0].second == 1;
  }
  int64_t coef(int v) const;
  std::string key() const;
};

struct Expr {
  enum class K : uint8_t { Const, Param, IndexVal, Load, Op };
  K k = K::Const;
  Ty ty = Ty::f32;
  std::string op;         // Op: "add", "exp", "where", "cast", ...
  double c = 0;           // Const
  int param = -1;         // Param: index into the executable's scalar table
  int buf = -1;           // Load: buffer slot
  Index idx;              // Load: element offset; IndexVal: the index as a value
  std::vector<int> args;  // Op operands
  // Load of a materialized value of the subgraph: which value and at which logical index (empty
  // when the load goes through a reshape, whose logical index is not tracked).
  int value = -1;
  std::vector<Index> logical;
  bool logical_known = false;
};

class ExprPool {
 public:
  int add(Expr e);
  const Expr& at(int id) const { return exprs_[static_cast<size_t>(id)]; }
  size_t size() const { return exprs_.size(); }
  int new_var() { return next_var_++; }

  int constant(double c, Ty ty);
  int param(int k, Ty ty);
  int op(const std::string& name, Ty ty, std::vector<int> args);
  int cast(int a, Ty ty);

 private:
  std::vector<Expr> exprs_;
  std::unordered_map<std::string, int> memo_;
  int next_var_ = 0;
};

using Idx = std::vector<Index>;

// The shared memory a block of the CUDA scatter-add keeps its table in (rows x at least 32
// columns of the accumulator's type): the static limit of a block.
inline constexpr int64_t kScatterTableBytes = 48 * 1024;

// A scatter-add into the rows of a table (an embedding's gradient): out[k, c...] = sum over r,
// in order, of term(c..., r) for the r whose key(r) is k (a key outside [0, rows) adds nowhere).
// The reduction's body says the same as a plain reduction (the term where the key equals the
// output's row), which every emitter can run; the CUDA emitter runs it as a scatter instead.
struct Scatter {
  std::function<int(ExprPool&, const Idx& red_idx)> key;  // an i64 value
  // The term at the output's columns (out_idx[0], the row, is not read) and a reduced index.
  std::function<int(ExprPool&, const Idx& out_idx, const Idx& red_idx)> term;
};

// A reduction: out[o] = scale * combine over r of body(o, r).
struct Reduction {
  std::string combine;  // "sum", "max", "min"
  double scale = 1.0;
  std::vector<int64_t> red_shape;  // sizes of the reduced loops
  std::function<int(ExprPool&, const Idx& out_idx, const Idx& red_idx)> body;
  std::optional<Scatter> scatter;  // a sum that is a scatter-add over the output's first dim
};

// An op left to ATen through the host's call_eager.
struct Extern {
  int node = -1;  // node index in the subgraph view
};

struct ValueInfo {
  enum class Kind : uint8_t { Input, Pointwise, View, Reshape, Reduction, Extern };
  Kind kind = Kind::Pointwise;
  Ty ty = Ty::f32;
  std::vector<int64_t> shape, strides;
  int64_t storage_offset = 0;
  bool materialized = false;
  int buffer = -1;    // slot, once materialized
  int src = -1;       // View/Reshape: the viewed value
  int alias_of = -1;  // an output whose buffer the extern or computed result `alias_of` is
                      // written into directly (the views between are the same memory): no stage
  int users = 0;
  bool dead = false;  // nothing reads it any more (a matmul's result whose reader folded into it)
  int order = 0;      // topological position of the producing node
  std::function<int(ExprPool&, const Idx&)> body;  // Pointwise, View: the value at an index
  Reduction red;
  Extern ext;
  int64_t numel() const;
  int64_t extent() const;  // elements a buffer with these strides spans
};

// A scalar the generated code reads from the executable's table: a constant of the graph, or
// a run-time scalar of the step (KILN_CAPABILITY_RUNTIME_SCALARS) whose current value replaces it on every call.
struct ScalarParam {
  double value = 0;
  int32_t runtime_scalar = -1;
};

struct LoweredGraph {
  std::vector<ValueInfo> values;  // by value index of the subgraph view
  std::vector<int> order;         // materialized non-input values, in the order to compute them
  std::vector<ScalarParam> params;
  size_t num_inputs = 0, num_outputs = 0;
  std::vector<int64_t> scratch_bytes;  // per scratch slot (slots after inputs and outputs)
  // The values an extern node reads, where it reads more than its own arguments (a matmul with
  // neighbours folded into its epilogue: gemm_fold.h).
  std::map<int, std::vector<int64_t>> extern_inputs;
  // Loads `v` at `idx`: from its buffer when materialized, else recomputed.
  int load(ExprPool& pool, int v, const Idx& idx) const;
  // Computes `v` at `idx` from its definition (never from its own buffer).
  int compute(ExprPool& pool, int v, const Idx& idx) const;
  // The element offset of `idx` in v's buffer layout.
  static Index offset(const ValueInfo& v, const Idx& idx);
};

}  // namespace kiln::inductor
