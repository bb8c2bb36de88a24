#include "codegen.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

namespace kiln::inductor {

namespace {

constexpr int64_t kParallelThreshold = 32768;  // elements; below this a kernel runs on one thread

std::vector<int64_t> stripped(std::vector<int64_t> s) {
  while (!s.empty() && s.back() == 1) s.pop_back();
  return s;
}

int64_t prod(const std::vector<int64_t>& s) {
  int64_t p = 1;
  for (auto x : s) p *= x;
  return p;
}

std::vector<int64_t> lcp(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::vector<int64_t> r;
  for (size_t i = 0; i < a.size() && i < b.size() && a[i] == b[i]; ++i) r.push_back(a[i]);
  return r;
}

// The shape a stage iterates as outer + inner: a reduction's kept dims, a pointwise value's shape.
std::vector<int64_t> stage_shape(const ValueInfo& v) {
  return v.kind == ValueInfo::Kind::Reduction ? stripped(v.shape) : v.shape;
}

// Evaluates a stage's body over fresh variables, `outer` of them being the kernel's outer ones.
struct Trial {
  ExprPool pool;
  std::vector<int> outer_vars;
  int root = -1;
};

Trial trial_eval(const LoweredGraph& L, int v, size_t outer_rank) {
  Trial t;
  const ValueInfo& info = L.values[static_cast<size_t>(v)];
  Idx idx;
  for (size_t d = 0; d < info.shape.size(); ++d) {
    int var = t.pool.new_var();
    if (d < outer_rank) t.outer_vars.push_back(var);
    idx.push_back(Index::var(var));
  }
  if (info.kind == ValueInfo::Kind::Reduction) {
    Idx red;
    for (size_t d = 0; d < info.red.red_shape.size(); ++d) red.push_back(Index::var(t.pool.new_var()));
    t.root = info.red.body(t.pool, idx, red);
  } else {
    t.root = L.compute(t.pool, v, idx);
  }
  return t;
}

// Whether stage `v` may run inside a kernel whose outer space has `rank` dims and that already
// computes `in_kernel`: it may only read those values at its own outer index.
bool legal(const LoweredGraph& L, int v, size_t rank, const std::set<int>& in_kernel) {
  Trial t = trial_eval(L, v, rank);
  for (size_t e = 0; e < t.pool.size(); ++e) {
    const Expr& x = t.pool.at(static_cast<int>(e));
    if (x.k != Expr::K::Load || !in_kernel.count(x.value)) continue;
    if (!x.logical_known || x.logical.size() < rank) return false;
    for (size_t d = 0; d < rank; ++d)
      if (!x.logical[d].is_var(t.outer_vars[d])) return false;
  }
  return true;
}

// A reduction whose loads walk memory along the last kept dim: vectorize across kept elements.
bool is_column(const LoweredGraph& L, int v) {
  const ValueInfo& info = L.values[static_cast<size_t>(v)];
  const auto s = stripped(info.shape);
  if (s.empty() || s.back() < 4 || info.red.red_shape.empty()) return false;
  Trial t = trial_eval(L, v, s.size());
  const int last = t.outer_vars.back();
  const int inner_red = t.pool.new_var() - 1;  // the last variable made: the innermost reduced dim
  bool along_kept = false;
  for (size_t e = 0; e < t.pool.size(); ++e) {
    const Expr& x = t.pool.at(static_cast<int>(e));
    if (x.k != Expr::K::Load) continue;
    if (x.idx.coef(inner_red) == 1) return false;  // rows are contiguous: a row reduction is better
    if (x.idx.coef(last) == 1) along_kept = true;
  }
  return along_kept;
}

bool pointwise_kind(const ValueInfo& v) {
  return v.kind == ValueInfo::Kind::Pointwise || v.kind == ValueInfo::Kind::View || v.kind == ValueInfo::Kind::Reshape;
}

// The dims of `shape` that the stages' every access (loads, stores, index values) walks as one
// contiguous run: neighbouring live dims d, e merge when each index has coef(d) == coef(e) *
// shape[e]; then i_d * coef(d) + i_e * coef(e) is (i_d * shape[e] + i_e) * coef(e), one variable.
// Dims of extent 1 are left out (always index 0).
std::vector<std::vector<int>> merged_dims(const LoweredGraph& L, const std::vector<int>& stages,
                                          const std::vector<int64_t>& shape) {
  ExprPool pool;
  std::vector<int> vars;
  Idx idx;
  for (size_t d = 0; d < shape.size(); ++d) {
    vars.push_back(pool.new_var());
    idx.push_back(Index::var(vars.back()));
  }
  std::vector<Index> accesses;
  for (int v : stages) {
    L.compute(pool, v, idx);
    accesses.push_back(LoweredGraph::offset(L.values[static_cast<size_t>(v)], idx));
  }
  for (size_t e = 0; e < pool.size(); ++e) {
    const Expr& x = pool.at(static_cast<int>(e));
    if (x.k == Expr::K::Load || x.k == Expr::K::IndexVal) accesses.push_back(x.idx);
  }
  std::vector<std::vector<int>> groups;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !groups.empty();
    if (merge) {
      const int prev = groups.back().back();
      for (const Index& ix : accesses)
        if (ix.coef(vars[static_cast<size_t>(prev)]) != ix.coef(vars[d]) * shape[d]) {
          merge = false;
          break;
        }
    }
    if (merge) groups.back().push_back(static_cast<int>(d));
    else groups.push_back({static_cast<int>(d)});
  }
  return groups;
}

int64_t group_size(const std::vector<int64_t>& shape, const std::vector<int>& group) {
  int64_t n = 1;
  for (int d : group) n *= shape[static_cast<size_t>(d)];
  return n;
}

// Loops over merged dims for a kernel whose stages are all pointwise of one shape, when the stages
// stay legal under them: a single stage always; several only when each reads the earlier ones at
// its own outer index (its whole index when everything merged into one loop).
void merge_loops(const LoweredGraph& L, KernelPlan& K) {
  if (K.column || K.stages.empty()) return;
  const std::vector<int64_t> shape = L.values[static_cast<size_t>(K.stages[0])].shape;
  for (int v : K.stages) {
    const ValueInfo& info = L.values[static_cast<size_t>(v)];
    if (!pointwise_kind(info) || info.shape != shape) return;
  }
  auto groups = merged_dims(L, K.stages, shape);
  if (groups.empty()) return;
  // Nothing merged and nothing of extent 1: the plain loops are the same.
  if (groups.size() == shape.size()) return;
  std::vector<int64_t> outer;
  for (size_t g = 0; g + 1 < groups.size(); ++g) outer.push_back(group_size(shape, groups[g]));
  if (K.stages.size() > 1) {
    const bool flat = groups.size() == 1;
    const size_t rank = flat ? shape.size() : static_cast<size_t>(groups.back().front());
    std::set<int> in_kernel;
    for (int v : K.stages) {
      if (!legal(L, v, rank, in_kernel)) return;
      in_kernel.insert(v);
    }
    if (flat) {
      outer = {group_size(shape, groups[0])};
      K.flat = true;
    }
  }
  K.outer = outer;
  K.groups = std::move(groups);
}

}  // namespace

Program schedule(const LoweredGraph& L) {
  Program P;
  KernelPlan cur;
  std::set<int> in_kernel;
  bool open = false;
  std::set<int> extern_done;
  auto close = [&] {
    if (open) {
      merge_loops(L, cur);
      P.kernels.push_back(cur), P.steps.push_back(Step{static_cast<int>(P.kernels.size() - 1), -1});
    }
    open = false;
    cur = KernelPlan{};
    in_kernel.clear();
  };
  for (int v : L.order) {
    const ValueInfo& info = L.values[static_cast<size_t>(v)];
    if (info.kind == ValueInfo::Kind::Extern) {
      if (extern_done.insert(info.ext.node).second) {
        close();
        P.steps.push_back(Step{-1, info.ext.node});
      }
      continue;
    }
    const bool red = info.kind == ValueInfo::Kind::Reduction;
    const auto shape = stage_shape(info);
    const int64_t work = std::max<int64_t>(info.numel(), 1) * (red ? std::max<int64_t>(prod(info.red.red_shape), 1) : 1);
    if (red && is_column(L, v)) {
      close();
      cur.outer = shape;
      cur.stages = {v};
      cur.column = true;
      cur.work = work;
      open = true;
      close();
      continue;
    }
    if (open && !cur.column) {
      const auto p = lcp(cur.outer, shape);
      bool ok = !red || p.size() == shape.size();
      ok = ok && (!p.empty() || cur.outer.empty());
      ok = ok && (p == cur.outer || prod(p) >= 8);
      // A kernel without an outer loop runs each stage as its own loop nest; a large stage of
      // another shape is better off in a kernel of its own, whose loops can then be fused.
      if (ok && cur.outer.empty() && shape != stage_shape(L.values[static_cast<size_t>(cur.stages[0])]) &&
          (work >= kParallelThreshold || cur.work >= kParallelThreshold))
        ok = false;
      if (ok && !legal(L, v, p.size(), in_kernel)) ok = false;
      if (ok) {
        cur.outer = p;
        cur.stages.push_back(v);
        cur.work += work;
        in_kernel.insert(v);
        continue;
      }
    }
    close();
    cur.outer = red ? shape : (shape.size() >= 2 ? std::vector<int64_t>(shape.begin(), shape.end() - 1)
                                                  : std::vector<int64_t>{});
    cur.stages = {v};
    cur.work = work;
    in_kernel.insert(v);
    open = true;
  }
  close();
  return P;
}

std::string Variant::name() const {
  return "simd" + std::to_string(simdlen) + "/tile" + std::to_string(column_tile);
}

std::vector<Variant> variants_for(const KernelPlan& k, bool autotune) {
  std::vector<Variant> v = {Variant{}};
  if (!autotune) return v;
  if (k.column) {
    for (int t : {8, 32, 64}) v.push_back(Variant{0, t});
  } else {
    for (int s : {8, 16}) v.push_back(Variant{s, 16});
  }
  return v;
}

namespace {

const char* kPrelude = R"(// Generated by kiln's inductor backend.
#include <stdint.h>
#include <string.h>
#include <math.h>

// Math that vectorizes: plain arithmetic and selects, no calls into libm.
static inline float k_bits2f(int32_t i) { float f; memcpy(&f, &i, 4); return f; }
static inline int32_t k_f2bits(float f) { int32_t i; memcpy(&i, &f, 4); return i; }
static inline float k_exp(float x) {
  x = x < -87.33654f ? -87.33654f : x;
  x = x > 88.37626f ? 88.37626f : x;
  float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  n = n > 127.0f ? 127.0f : n;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * (r * r) + r + 1.0f;
  return p * k_bits2f(((int32_t)n + 127) << 23);
}
static inline float k_log(float x) {
  const bool tiny = x < 1.17549435e-38f;
  float xs = tiny ? x * 8388608.0f : x;
  int32_t ix = k_f2bits(xs);
  int32_t e = ((ix >> 23) & 0xff) - 127 - (tiny ? 23 : 0);
  float m = k_bits2f((ix & 0x007fffff) | 0x3f800000);
  const bool big = m > 1.41421356f;
  m = big ? m * 0.5f : m;
  e = big ? e + 1 : e;
  float s = (m - 1.0f) / (m + 1.0f), s2 = s * s;
  float p = 0.222222222f;
  p = p * s2 + 0.285714286f;
  p = p * s2 + 0.4f;
  p = p * s2 + 0.666666667f;
  p = p * s2 + 2.0f;
  float r = s * p + (float)e * 0.693147180559945f;
  r = x == 0.0f ? -__builtin_inff() : r;
  r = (x < 0.0f || x != x) ? __builtin_nanf("") : r;
  r = x == __builtin_inff() ? x : r;
  return r;
}
static inline float k_tanh(float x) {
  float c = x > 7.90531110763549805f ? 7.90531110763549805f : x;
  c = c < -7.90531110763549805f ? -7.90531110763549805f : c;
  float x2 = c * c;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  p = p * c;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  float r = p / q;
  return x != x ? x : r;
}
// erfc(a) for a >= 0 as t*exp(-a*a + Q(t)), t = 1/(1 + a/2): Q is kiln's own least-squares fit
// (Chebyshev nodes, double precision, degree 10) of log(erfc(a)) + a*a - log(t) over a in [0, 9.5];
// its relative error is below 1e-8 in double and a few 1e-7 in float (up to 2e-6 near a = 6, from
// rounding a*a), so the tail of erfc (1 + erf(x) for negative x, which gelu needs) keeps its
// relative accuracy, where 1 - erf(a) loses it all by cancellation.
static inline float k_erfc_pos(float a) {
  float t = 1.0f / (1.0f + 0.5f * a);
  float q = -1.492886170e-01f;
  q = q * t + 1.016766408e+00f;
  q = q * t + -2.907409833e+00f;
  q = q * t + 4.423094861e+00f;
  q = q * t + -3.735888645e+00f;
  q = q * t + 1.789192161e+00f;
  q = q * t + -7.660246212e-01f;
  q = q * t + 2.415236474e-01f;
  q = q * t + 3.516406231e-01f;
  q = q * t + 1.001979212e+00f;
  q = q * t + -1.265585194e+00f;
  return t * k_exp(-a * a + q);
}
// erf below 0.9: its Taylor series to x^19 (the next term is below 2e-8 of erf there), accurate in
// relative terms down to 0, where gelu's backward needs it (and near its root, x = -0.75, where
// the sum Phi(x) + x*phi(x) cancels).
static inline float k_erf_series(float x) {
  const float x2 = x * x;
  float s = -1.63658447e-07f;
  s = s * x2 + 1.64621144e-06f;
  s = s * x2 + -1.49256504e-05f;
  s = s * x2 + 1.20553330e-04f;
  s = s * x2 + -0.000854832702f;
  s = s * x2 + 0.00522397762f;
  s = s * x2 + -0.0268661707f;
  s = s * x2 + 0.112837917f;
  s = s * x2 + -0.376126389f;
  s = s * x2 + 1.12837917f;
  return s * x;
}
static inline float k_erf(float x) {
  const float a = x < 0.0f ? -x : x;
  float y = 1.0f - k_erfc_pos(a);
  y = x < 0.0f ? -y : y;
  return a < 0.9f ? k_erf_series(x) : (x != x ? x : y);
}
// The standard normal CDF, Phi(x) = erfc(-x/sqrt(2))/2, from the tail form alone (accurate in
// relative terms on both sides, no series needed: Phi does not vanish at 0): gelu's x*Phi(x) and
// its backward without the cancellation of 1 + erf(x/sqrt(2)) for negative x.
static inline float k_ndtr(float x) {
  const float c = 0.5f * k_erfc_pos((x < 0.0f ? -x : x) * 0.707106781f);
  return x != x ? x : (x < 0.0f ? c : 1.0f - c);
}
static inline double k_exp(double x) { return exp(x); }
static inline double k_log(double x) { return log(x); }
static inline double k_tanh(double x) { return tanh(x); }
static inline double k_erf(double x) { return erf(x); }
static inline double k_ndtr(double x) { return 0.5 * erfc(-x * 0.70710678118654752); }
static inline float k_sqrt(float x) { return __builtin_sqrtf(x); }
static inline double k_sqrt(double x) { return __builtin_sqrt(x); }
static inline float k_abs(float x) { return __builtin_fabsf(x); }
static inline double k_abs(double x) { return __builtin_fabs(x); }
static inline float k_pow(float a, float b) { return powf(a, b); }
static inline double k_pow(double a, double b) { return pow(a, b); }
template <class T> static inline T k_max(T a, T b) { return (a != a || a > b) ? a : b; }
template <class T> static inline T k_min(T a, T b) { return (a != a || a < b) ? a : b; }
)";

std::string fmt_const(double c, Ty ty) {
  char buf[64];
  switch (ty) {
    case Ty::b8: return c != 0 ? "true" : "false";
    case Ty::i64: case Ty::i32: {
      std::snprintf(buf, sizeof buf, "((%s)%lldLL)", c_type(ty), static_cast<long long>(c));
      return buf;
    }
    case Ty::f32: case Ty::f64: {
      const char* suffix = ty == Ty::f32 ? "f" : "";
      if (std::isnan(c)) return ty == Ty::f32 ? "__builtin_nanf(\"\")" : "__builtin_nan(\"\")";
      if (std::isinf(c)) return std::string(c < 0 ? "-" : "") + (ty == Ty::f32 ? "__builtin_inff()" : "__builtin_inf()");
      std::snprintf(buf, sizeof buf, "%a%s", ty == Ty::f32 ? static_cast<double>(static_cast<float>(c)) : c, suffix);
      return std::string("(") + buf + ")";
    }
  }
  return "0";
}

class KernelEmitter {
 public:
  KernelEmitter(const LoweredGraph& L, const KernelPlan& K, const Variant& var, std::ostringstream& os)
      : L_(L), K_(K), var_(var), os_(os) {}

  void emit(const std::string& fname) {
    for (int v : K_.stages) in_kernel_.insert(v);
    os_ << "extern \"C\" __attribute__((visibility(\"default\"))) void " << fname
        << "(void** B, const double* P, int nt) {\n  (void)P; (void)nt;\n";
    body_ << "";
    if (prod(K_.outer) == 0) {
      // An empty outer space (a dim of extent 0: every stage of this kernel writes an empty
      // result): nothing to compute, and no index math that would divide by the zero extent.
      // Reductions over an empty dim into a non-empty result have a non-empty outer space and run
      // their accumulator's initial value through (0 for sum, NaN for mean).
      os_ << "}\n\n";
      return;
    }
    if (K_.column) emit_column();
    else emit_rows();
    // Buffer pointers used by the body, declared first.
    for (int b : bufs_) {
      const char* t = c_type(buf_ty_.at(b));
      os_ << "  " << t << "* __restrict b" << b << " = (" << t << "*)B[" << b << "];\n";
    }
    os_ << body_.str() << "}\n\n";
  }

 private:
  std::string ind(int depth) const { return std::string(static_cast<size_t>(2 * depth + 2), ' '); }

  std::string vname(int v) const { return "v" + std::to_string(v); }

  std::string index_str(const Index& ix) {
    std::string s = std::to_string(ix.c) + "LL";
    for (const auto& [v, k] : ix.vars) s += " + " + std::to_string(k) + "LL*" + vname(v);
    for (const auto& [e, k] : ix.exprs) s += " + " + std::to_string(k) + "LL*(int64_t)" + name(e);
    return "(" + s + ")";
  }

  std::string name(int e) const {
    auto it = names_.find(e);
    if (it == names_.end()) throw std::logic_error("expression used before it was emitted");
    return it->second;
  }

  void use_buf(int b, Ty ty) {
    bufs_.insert(b);
    buf_ty_[b] = ty;
  }

  // The C expression text of e (its operands already named).
  std::string text(int e) {
    const Expr& x = pool_.at(e);
    const char* T = c_type(x.ty);
    auto a = [&](size_t i) { return name(x.args[i]); };
    switch (x.k) {
      case Expr::K::Const: return fmt_const(x.c, x.ty);
      case Expr::K::Param: return std::string("((") + T + ")P[" + std::to_string(x.param) + "])";
      case Expr::K::IndexVal: return "((int64_t)" + index_str(x.idx) + ")";
      case Expr::K::Load: {
        auto r = regs_.find(x.value);
        if (r != regs_.end() && x.logical_known && in_kernel_.count(x.value)) return r->second;
        use_buf(x.buf, x.ty);
        return "b" + std::to_string(x.buf) + "[" + index_str(x.idx) + "]";
      }
      case Expr::K::Op: break;
    }
    const std::string& op = x.op;
    if (op == "add") return "(" + a(0) + " + " + a(1) + ")";
    if (op == "sub") return "(" + a(0) + " - " + a(1) + ")";
    if (op == "mul") return "(" + a(0) + " * " + a(1) + ")";
    if (op == "div") return "(" + a(0) + " / " + a(1) + ")";
    if (op == "neg") return "(-" + a(0) + ")";
    if (op == "relu") return "(" + a(0) + " < (" + T + ")0 ? (" + T + ")0 : " + a(0) + ")";
    if (op == "sigmoid") return "((" + std::string(T) + ")1 / ((" + T + ")1 + k_exp(-" + a(0) + ")))";
    if (op == "exp" || op == "log" || op == "tanh" || op == "erf" || op == "ndtr" || op == "sqrt" || op == "abs")
      return "k_" + op + "(" + a(0) + ")";
    if (op == "rsqrt") return "((" + std::string(T) + ")1 / k_sqrt(" + a(0) + "))";
    if (op == "reciprocal") return "((" + std::string(T) + ")1 / " + a(0) + ")";
    if (op == "pow") return "k_pow(" + a(0) + ", " + a(1) + ")";
    if (op == "maximum") return "k_max<" + std::string(T) + ">(" + a(0) + ", " + a(1) + ")";
    if (op == "minimum") return "k_min<" + std::string(T) + ">(" + a(0) + ", " + a(1) + ")";
    if (op == "where") return "(" + a(0) + " ? " + a(1) + " : " + a(2) + ")";
    if (op == "cast") return "((" + std::string(T) + ")" + a(0) + ")";
    if (op == "and") return "(" + a(0) + " && " + a(1) + ")";
    static const std::map<std::string, std::string> cmp = {{"eq", "=="}, {"ne", "!="}, {"lt", "<"},
                                                           {"le", "<="}, {"gt", ">"}, {"ge", ">="}};
    if (auto it = cmp.find(op); it != cmp.end()) return "(" + a(0) + " " + it->second + " " + a(1) + ")";
    throw std::logic_error("no C++ for op '" + op + "'");
  }

  // Loop depth at which e can be computed: the deepest variable it reads; loads of values this
  // kernel computes wait for the stage start.
  int level(int e) {
    auto it = level_.find(e);
    if (it != level_.end()) return it->second;
    const Expr& x = pool_.at(e);
    int l = 0;
    auto of_index = [&](const Index& ix) {
      for (const auto& [v, k] : ix.vars) l = std::max(l, var_level_.at(v));
      for (const auto& [ee, k] : ix.exprs) l = std::max(l, level(ee));
    };
    of_index(x.idx);
    for (int c : x.args) l = std::max(l, level(c));
    if (x.k == Expr::K::Load && in_kernel_.count(x.value)) l = std::max(l, base_);
    level_[e] = l;
    return l;
  }

  void collect(int e, std::set<int>& out) {
    if (names_.count(e) || !out.insert(e).second) return;
    const Expr& x = pool_.at(e);
    for (int c : x.args) collect(c, out);
    for (const auto& [ee, k] : x.idx.exprs) collect(ee, out);
  }
  void collect_index(const Index& ix, std::set<int>& out) {
    for (const auto& [ee, k] : ix.exprs) collect(ee, out);
  }

  // Emits every pending expression whose level is `lvl` (and anything shallower still pending).
  void flush(std::set<int>& pending, int lvl, int depth) {
    for (auto it = pending.begin(); it != pending.end();) {
      if (level(*it) <= lvl) {
        const int e = *it;
        const Expr& x = pool_.at(e);
        std::string nm = "t" + std::to_string(e);
        if (x.k == Expr::K::Const || x.k == Expr::K::Param) {
          nm = text(e);  // inline literals and parameters
        } else {
          body_ << ind(depth) << "const " << c_type(x.ty) << " " << nm << " = " << text(e) << ";\n";
        }
        names_[e] = nm;
        it = pending.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::string simd_pragma(const std::string& extra = "") const {
    std::string s = "#pragma omp simd";
    if (var_.simdlen > 0) s += " simdlen(" + std::to_string(var_.simdlen) + ")";
    return s + extra;
  }

  std::string acc_type(const ValueInfo& v) const {
    if (v.red.combine == "sum") return is_float(v.ty) ? "double" : "int64_t";
    return c_type(v.ty);
  }
  std::string acc_init(const ValueInfo& v) const {
    if (v.red.combine == "sum") return "0";
    if (v.red.combine == "max") return is_float(v.ty) ? "-__builtin_inf()" : "INT64_MIN";
    return is_float(v.ty) ? "__builtin_inf()" : "INT64_MAX";
  }
  std::string combine(const ValueInfo& v, const std::string& acc, const std::string& e) const {
    if (v.red.combine == "sum") return acc + " += (" + acc_type(v) + ")" + e + ";";
    if (v.red.combine == "max") return acc + " = (" + e + " != " + e + " || " + e + " > " + acc + ") ? " + e + " : " + acc + ";";
    return acc + " = (" + e + " != " + e + " || " + e + " < " + acc + ") ? " + e + " : " + acc + ";";
  }
  std::string finish(const ValueInfo& v, const std::string& acc) const {
    std::string r = acc;
    if (v.red.scale != 1.0) r = "(" + acc + " * " + fmt_const(v.red.scale, Ty::f64) + ")";
    return "(" + std::string(c_type(v.ty)) + ")" + r;
  }

  // Row kernels: parallel over the flattened outer space, stages inside.
  void emit_rows() {
    const int64_t n_outer = prod(K_.outer);
    const bool par = K_.work >= kParallelThreshold;
    int depth = 0;
    std::vector<int> ovars;
    for (size_t d = 0; d < K_.outer.size(); ++d) {
      int v = pool_.new_var();
      ovars.push_back(v);
      var_level_[v] = 1;
    }
    if (!K_.outer.empty()) {
      base_ = 1;
      if (K_.flat) body_ << (par ? "#pragma omp parallel for simd num_threads(nt) schedule(static) if(parallel: nt > 1)" : simd_pragma()) << "\n";
      else if (par) body_ << "#pragma omp parallel for num_threads(nt) schedule(static) if(parallel: nt > 1)\n";
      body_ << "  for (int64_t x = 0; x < " << n_outer << "LL; ++x) {\n";
      depth = 1;
      int64_t stride = n_outer;
      for (size_t d = 0; d < K_.outer.size(); ++d) {
        stride /= K_.outer[d];
        if (K_.outer.size() == 1) {
          body_ << ind(depth) << "const int64_t " << vname(ovars[d]) << " = x;\n";
          continue;
        }
        body_ << ind(depth) << "const int64_t " << vname(ovars[d]) << " = (x / " << stride << "LL) % " << K_.outer[d]
              << "LL;\n";
      }
    } else {
      base_ = 0;
    }
    // Without an outer loop each stage is a loop nest of its own, parallel when it is large.
    for (int v : K_.stages) emit_stage(v, ovars, depth, K_.outer.empty() && stage_work(v) >= kParallelThreshold);
    if (!K_.outer.empty()) body_ << "  }\n";
  }

  int64_t stage_work(int v) const {
    const ValueInfo& info = L_.values[static_cast<size_t>(v)];
    const bool red = info.kind == ValueInfo::Kind::Reduction;
    return std::max<int64_t>(info.numel(), 1) * (red ? std::max<int64_t>(prod(info.red.red_shape), 1) : 1);
  }

  void open_loop(int var, int64_t n, int depth, const std::string& pragma) {
    if (!pragma.empty()) body_ << pragma << "\n";
    body_ << ind(depth) << "for (int64_t " << vname(var) << " = 0; " << vname(var) << " < " << n << "LL; ++"
          << vname(var) << ") {\n";
  }

  void emit_stage(int v, const std::vector<int>& ovars, int depth, bool parallel_inner) {
    const ValueInfo& info = L_.values[static_cast<size_t>(v)];
    const bool red = info.kind == ValueInfo::Kind::Reduction;
    const size_t k = ovars.size();
    Idx idx;
    for (int ov : ovars) idx.push_back(Index::var(ov));
    // Inner loops: the rest of the value's shape (a reduction: its kept dims past the outer ones).
    std::vector<int> loops;
    std::vector<int64_t> sizes;
    const auto shape = red ? stripped(info.shape) : info.shape;
    int lvl = base_;
    if (!K_.groups.empty()) {
      // Merged dims (merge_loops): the last dim of each group carries the group's variable.
      idx.assign(info.shape.size(), Index::constant(0));
      for (size_t g = 0; g < K_.groups.size(); ++g) {
        int var = -1;
        if (g < k) {
          var = ovars[g];
        } else {
          var = pool_.new_var();
          var_level_[var] = ++lvl;
          loops.push_back(var);
          sizes.push_back(group_size(info.shape, K_.groups[g]));
        }
        idx[static_cast<size_t>(K_.groups[g].back())] = Index::var(var);
      }
    } else {
      for (size_t d = k; d < shape.size(); ++d) {
        int var = pool_.new_var();
        var_level_[var] = ++lvl;
        loops.push_back(var);
        sizes.push_back(shape[d]);
        idx.push_back(Index::var(var));
      }
    }
    while (idx.size() < info.shape.size()) idx.push_back(Index::constant(0));
    const size_t n_kept = loops.size();
    std::vector<int> red_vars;
    Idx red_idx;
    if (red) {
      for (auto s : info.red.red_shape) {
        int var = pool_.new_var();
        var_level_[var] = ++lvl;
        loops.push_back(var);
        sizes.push_back(s);
        red_vars.push_back(var);
        red_idx.push_back(Index::var(var));
      }
    }
    const int root = red ? info.red.body(pool_, idx, red_idx) : L_.compute(pool_, v, idx);
    const Index store_off = LoweredGraph::offset(info, idx);
    std::set<int> pending;
    collect(root, pending);
    collect_index(store_off, pending);
    use_buf(info.buffer, info.ty);
    const std::string acc = "acc" + std::to_string(v);
    flush(pending, base_, depth);
    int d = depth;
    for (size_t i = 0; i < loops.size(); ++i) {
      const bool innermost = i + 1 == loops.size();
      std::string pragma;
      if (i == 0 && parallel_inner && i < n_kept) {
        pragma = innermost ? "#pragma omp parallel for simd num_threads(nt) schedule(static) if(parallel: nt > 1)"
                           : "#pragma omp parallel for num_threads(nt) schedule(static) if(parallel: nt > 1)";
      } else if (innermost) {
        if (!red) pragma = simd_pragma();
        else if (info.red.combine == "sum") pragma = simd_pragma(" reduction(+:" + acc + ")");
      }
      if (red && i == n_kept) body_ << ind(d) << acc_type(info) << " " << acc << " = " << acc_init(info) << ";\n";
      open_loop(loops[i], sizes[i], d, pragma);
      ++d;
      flush(pending, var_level_.at(loops[i]), d);
    }
    if (red && loops.size() == n_kept) body_ << ind(d) << acc_type(info) << " " << acc << " = " << acc_init(info) << ";\n";
    const std::string b = "b" + std::to_string(info.buffer);
    if (!red) {
      body_ << ind(d) << b << "[" << index_str(store_off) << "] = " << name(root) << ";\n";
      for (size_t i = 0; i < loops.size(); ++i) body_ << ind(--d) << "}\n";
      if (K_.flat) regs_[v] = name(root);  // later stages of this element read the register
      return;
    }
    body_ << ind(d) << combine(info, acc, name(root)) << "\n";
    for (size_t i = n_kept; i < loops.size(); ++i) body_ << ind(--d) << "}\n";
    const std::string res = "r" + std::to_string(v);
    body_ << ind(d) << "const " << c_type(info.ty) << " " << res << " = " << finish(info, acc) << ";\n";
    body_ << ind(d) << b << "[" << index_str(store_off) << "] = " << res << ";\n";
    for (size_t i = 0; i < n_kept; ++i) body_ << ind(--d) << "}\n";
    if (n_kept == 0) regs_[v] = res;  // later stages of this row read the register
  }

  // Column reduction: parallel over tiles of the last kept dim, one accumulator per kept element.
  void emit_column() {
    const int v = K_.stages.at(0);
    const ValueInfo& info = L_.values[static_cast<size_t>(v)];
    const auto shape = stripped(info.shape);
    const int64_t last = shape.back();
    const int64_t T = var_.column_tile;
    const int64_t tiles = (last + T - 1) / T;
    std::vector<int64_t> lead(shape.begin(), shape.end() - 1);
    const int64_t n_outer = prod(lead) * tiles;
    base_ = 1;
    std::vector<int> ovars;
    for (size_t d = 0; d < lead.size(); ++d) {
      int var = pool_.new_var();
      var_level_[var] = 1;
      ovars.push_back(var);
    }
    const int tb = pool_.new_var();
    var_level_[tb] = 1;
    if (K_.work >= kParallelThreshold) body_ << "#pragma omp parallel for num_threads(nt) schedule(static) if(parallel: nt > 1)\n";
    body_ << "  for (int64_t x = 0; x < " << n_outer << "LL; ++x) {\n";
    int64_t stride = n_outer;
    for (size_t d = 0; d < lead.size(); ++d) {
      stride /= lead[d];
      body_ << "    const int64_t " << vname(ovars[d]) << " = (x / " << stride << "LL) % " << lead[d] << "LL;\n";
    }
    body_ << "    const int64_t " << vname(tb) << " = (x % " << tiles << "LL) * " << T << "LL;\n";
    body_ << "    const int64_t tn = " << last << "LL - " << vname(tb) << " < " << T << "LL ? " << last << "LL - "
          << vname(tb) << " : " << T << "LL;\n";
    body_ << "    " << acc_type(info) << " acc[" << T << "];\n";
    body_ << "    for (int64_t t = 0; t < " << T << "; ++t) acc[t] = " << acc_init(info) << ";\n";
    int lvl = 1;
    std::vector<int> rvars;
    Idx red_idx;
    for (size_t i = 0; i < info.red.red_shape.size(); ++i) {
      int var = pool_.new_var();
      var_level_[var] = ++lvl;
      rvars.push_back(var);
      red_idx.push_back(Index::var(var));
    }
    const int tv = pool_.new_var();
    var_level_[tv] = ++lvl;
    Idx idx;
    for (int ov : ovars) idx.push_back(Index::var(ov));
    idx.push_back(Index::var(tb) + Index::var(tv));
    while (idx.size() < info.shape.size()) idx.push_back(Index::constant(0));
    const int root = info.red.body(pool_, idx, red_idx);
    std::set<int> pending;
    collect(root, pending);
    flush(pending, 1, 1);
    int d = 1;
    for (size_t i = 0; i < rvars.size(); ++i) {
      open_loop(rvars[i], info.red.red_shape[i], d, "");
      ++d;
      flush(pending, var_level_.at(rvars[i]), d);
    }
    body_ << simd_pragma() << "\n" << ind(d) << "for (int64_t " << vname(tv) << " = 0; " << vname(tv) << " < tn; ++"
          << vname(tv) << ") {\n";
    ++d;
    flush(pending, lvl, d);
    body_ << ind(d) << combine(info, "acc[" + vname(tv) + "]", name(root)) << "\n";
    body_ << ind(--d) << "}\n";
    for (size_t i = 0; i < rvars.size(); ++i) body_ << ind(--d) << "}\n";
    use_buf(info.buffer, info.ty);
    body_ << "    for (int64_t " << vname(tv) << " = 0; " << vname(tv) << " < tn; ++" << vname(tv) << ")\n";
    body_ << "      b" << info.buffer << "[" << index_str(LoweredGraph::offset(info, idx)) << "] = "
          << finish(info, "acc[" + vname(tv) + "]") << ";\n";
    body_ << "  }\n";
  }

  const LoweredGraph& L_;
  const KernelPlan& K_;
  Variant var_;
  std::ostringstream& os_;
  std::ostringstream body_;
  ExprPool pool_;
  std::set<int> in_kernel_;
  std::map<int, int> var_level_;
  std::map<int, int> level_;
  std::map<int, std::string> names_;
  std::map<int, std::string> regs_;
  std::set<int> bufs_;
  std::map<int, Ty> buf_ty_;
  int base_ = 0;
};

}  // namespace

std::string generate_source(const LoweredGraph& L, const Program& P, const std::vector<std::vector<Variant>>& variants) {
  std::ostringstream os;
  os << kPrelude << "\n";
  for (size_t k = 0; k < P.kernels.size(); ++k)
    for (size_t v = 0; v < variants[k].size(); ++v)
      KernelEmitter(L, P.kernels[k], variants[k][v], os).emit("kiln_k" + std::to_string(k) + "_v" + std::to_string(v));
  return os.str();
}

}  // namespace kiln::inductor
