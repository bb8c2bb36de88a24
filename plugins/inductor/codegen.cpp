#include "codegen.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "kernel_prelude_text.h"

namespace kiln::inductor {

std::string Variant::name() const { return "simd" + std::to_string(simdlen) + "/tile" + std::to_string(column_tile); }

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

// The C type an expression of type `t` is computed in: bfloat16 in float (its buffers hold uint16_t).
const char* reg_type(Ty t) { return t == Ty::bf16 ? "float" : c_type(t); }

std::string fmt_const(double c, Ty ty) {
  if (ty == Ty::bf16) ty = Ty::f32;
  char buf[64];
  switch (ty) {
    case Ty::b8: return c != 0 ? "true" : "false";
    case Ty::i64:
    case Ty::i32: {
      std::snprintf(buf, sizeof buf, "((%s)%lldLL)", c_type(ty), static_cast<long long>(c));
      return buf;
    }
    case Ty::bf16:  // as float (above)
    case Ty::f32:
    case Ty::f64: {
      const char* suffix = ty == Ty::f32 ? "f" : "";
      if (std::isnan(c)) return ty == Ty::f32 ? "__builtin_nanf(\"\")" : "__builtin_nan(\"\")";
      if (std::isinf(c))
        return std::string(c < 0 ? "-" : "") + (ty == Ty::f32 ? "__builtin_inff()" : "__builtin_inf()");
      std::snprintf(buf, sizeof buf, "%a%s", ty == Ty::f32 ? static_cast<double>(static_cast<float>(c)) : c, suffix);
      return std::string("(") + buf + ")";
    }
  }
  return "0";
}

class KernelEmitter {
 public:
  KernelEmitter(const LoweredGraph& L, const KernelPlan& K, const Variant& var, std::ostringstream& os,
                const std::set<int>& may_alias)
      : L_(L), K_(K), var_(var), os_(os), may_alias_(may_alias) {}

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
      os_ << "  " << t << (may_alias_.count(b) ? "* b" : "* __restrict b") << b << " = (" << t << "*)B[" << b << "];\n";
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
    const char* T = reg_type(x.ty);
    auto a = [&](size_t i) { return name(x.args[i]); };
    switch (x.k) {
      case Expr::K::Const: return fmt_const(x.c, x.ty);
      case Expr::K::Param: return std::string("((") + T + ")P[" + std::to_string(x.param) + "])";
      case Expr::K::IndexVal: return "((int64_t)" + index_str(x.idx) + ")";
      case Expr::K::Load: {
        auto r = regs_.find(x.value);
        if (r != regs_.end() && x.logical_known && in_kernel_.count(x.value)) return r->second;
        use_buf(x.buf, x.ty);
        const std::string ref = "b" + std::to_string(x.buf) + "[" + index_str(x.idx) + "]";
        return x.ty == Ty::bf16 ? "k_bf2f(" + ref + ")" : ref;
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
    if (op == "cast" && x.ty == Ty::bf16) return "k_round_bf16((float)" + a(0) + ")";
    if (op == "cast") return "((" + std::string(T) + ")" + a(0) + ")";
    if (op == "and") return "(" + a(0) + " && " + a(1) + ")";
    static const std::map<std::string, std::string> cmp = {{"eq", "=="}, {"ne", "!="}, {"lt", "<"},
                                                           {"le", "<="}, {"gt", ">"},  {"ge", ">="}};
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
          body_ << ind(depth) << "const " << reg_type(x.ty) << " " << nm << " = " << text(e) << ";\n";
        }
        names_[e] = nm;
        it = pending.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::string simdlen() const { return var_.simdlen > 0 ? " simdlen(" + std::to_string(var_.simdlen) + ")" : ""; }
  std::string simd_pragma(const std::string& extra = "") const { return "#pragma omp simd" + simdlen() + extra; }

  std::string acc_type(const ValueInfo& v) const {
    if (v.red.combine == "sum") return is_float(v.ty) ? "double" : "int64_t";
    return reg_type(v.ty);
  }
  std::string acc_init(const ValueInfo& v) const {
    if (v.red.combine == "sum") return "0";
    if (v.red.combine == "max") return is_float(v.ty) ? "-__builtin_inf()" : "INT64_MIN";
    return is_float(v.ty) ? "__builtin_inf()" : "INT64_MAX";
  }
  std::string combine(const ValueInfo& v, const std::string& acc, const std::string& e) const {
    if (v.red.combine == "sum") return acc + " += (" + acc_type(v) + ")" + e + ";";
    if (v.red.combine == "max")
      return acc + " = (" + e + " != " + e + " || " + e + " > " + acc + ") ? " + e + " : " + acc + ";";
    return acc + " = (" + e + " != " + e + " || " + e + " < " + acc + ") ? " + e + " : " + acc + ";";
  }
  std::string finish(const ValueInfo& v, const std::string& acc) const {
    std::string r = acc;
    if (v.red.scale != 1.0) r = "(" + acc + " * " + fmt_const(v.red.scale, Ty::f64) + ")";
    // A bfloat16 result is rounded: a later stage reading the register sees what the buffer holds.
    if (v.ty == Ty::bf16) return "k_round_bf16((float)" + r + ")";
    return "(" + std::string(c_type(v.ty)) + ")" + r;
  }

  // What a buffer of `v`'s type holds of the float (or other) value `e`.
  static std::string stored(const ValueInfo& v, const std::string& e) {
    return v.ty == Ty::bf16 ? "k_f2bf(" + e + ")" : e;
  }
  // Whether the expression is already a value rounded to bfloat16 (a cast to it).
  bool rounded_bf16(int e) const {
    const Expr& x = pool_.at(e);
    return x.k == Expr::K::Op && x.op == "cast" && x.ty == Ty::bf16;
  }

  // Row kernels: parallel over the flattened outer space, stages inside.
  void emit_rows() {
    const int64_t n_outer = prod(K_.outer);
    int depth = 0;
    std::vector<int> ovars;
    for (size_t d = 0; d < K_.outer.size(); ++d) {
      int v = pool_.new_var();
      ovars.push_back(v);
      var_level_[v] = 1;
    }
    if (!K_.outer.empty()) {
      base_ = 1;
      // Threads when the work is large enough, decided at run time, so that the text is the same on
      // either side of the threshold (kernels whose numbers are arguments serve both).
      body_ << (K_.flat ? "#pragma omp parallel for simd" + simdlen() : std::string("#pragma omp parallel for"))
            << parallel_if(K_.work) << "\n";
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
    for (int v : K_.stages) emit_stage(v, ovars, depth, K_.outer.empty() ? stage_work(v) : -1);
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

  // " num_threads(nt) schedule(static) if(parallel: ...)": threads when there are several and the
  // kernel's work reaches kParallelThreshold.
  static std::string parallel_if(int64_t work) {
    return " num_threads(nt) schedule(static) if(parallel: nt > 1 && " + std::to_string(work) +
           "LL >= " + std::to_string(kParallelThreshold) + "LL)";
  }

  // parallel_work >= 0: the stage's outer loop may run on threads (a kernel without outer loops).
  void emit_stage(int v, const std::vector<int>& ovars, int depth, int64_t parallel_work) {
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
      if (i == 0 && parallel_work >= 0 && i < n_kept) {
        pragma = (innermost ? "#pragma omp parallel for simd" + simdlen() : std::string("#pragma omp parallel for")) +
                 parallel_if(parallel_work);
      } else if (innermost) {
        if (!red) pragma = simd_pragma();
        else if (info.red.combine == "sum") pragma = simd_pragma(" reduction(+:" + acc + ")");
      }
      if (red && i == n_kept) body_ << ind(d) << acc_type(info) << " " << acc << " = " << acc_init(info) << ";\n";
      open_loop(loops[i], sizes[i], d, pragma);
      ++d;
      flush(pending, var_level_.at(loops[i]), d);
    }
    if (red && loops.size() == n_kept)
      body_ << ind(d) << acc_type(info) << " " << acc << " = " << acc_init(info) << ";\n";
    const std::string b = "b" + std::to_string(info.buffer);
    if (!red) {
      std::string reg = name(root);
      if (info.ty == Ty::bf16) {
        // Later stages of this element read what the buffer holds: the value rounded.
        if (!rounded_bf16(root)) {
          reg = "rv" + std::to_string(v);
          body_ << ind(d) << "const float " << reg << " = k_round_bf16(" << name(root) << ");\n";
        }
        body_ << ind(d) << b << "[" << index_str(store_off) << "] = k_f2bf(" << reg << ");\n";
      } else {
        body_ << ind(d) << b << "[" << index_str(store_off) << "] = " << reg << ";\n";
      }
      for (size_t i = 0; i < loops.size(); ++i) body_ << ind(--d) << "}\n";
      if (K_.flat) regs_[v] = reg;  // later stages of this element read the register
      return;
    }
    body_ << ind(d) << combine(info, acc, name(root)) << "\n";
    for (size_t i = n_kept; i < loops.size(); ++i) body_ << ind(--d) << "}\n";
    const std::string res = "r" + std::to_string(v);
    body_ << ind(d) << "const " << reg_type(info.ty) << " " << res << " = " << finish(info, acc) << ";\n";
    body_ << ind(d) << b << "[" << index_str(store_off) << "] = " << stored(info, res) << ";\n";
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
    body_ << "#pragma omp parallel for" << parallel_if(K_.work) << "\n";
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
    body_ << simd_pragma() << "\n"
          << ind(d) << "for (int64_t " << vname(tv) << " = 0; " << vname(tv) << " < tn; ++" << vname(tv) << ") {\n";
    ++d;
    flush(pending, lvl, d);
    body_ << ind(d) << combine(info, "acc[" + vname(tv) + "]", name(root)) << "\n";
    body_ << ind(--d) << "}\n";
    for (size_t i = 0; i < rvars.size(); ++i) body_ << ind(--d) << "}\n";
    use_buf(info.buffer, info.ty);
    body_ << "    for (int64_t " << vname(tv) << " = 0; " << vname(tv) << " < tn; ++" << vname(tv) << ")\n";
    body_ << "      b" << info.buffer << "[" << index_str(LoweredGraph::offset(info, idx))
          << "] = " << stored(info, finish(info, "acc[" + vname(tv) + "]")) << ";\n";
    body_ << "  }\n";
  }

  const LoweredGraph& L_;
  const KernelPlan& K_;
  Variant var_;
  std::ostringstream& os_;
  const std::set<int>& may_alias_;
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

std::string generate_source(const LoweredGraph& L, const Program& P, const std::vector<std::vector<Variant>>& variants,
                            const std::set<int>& may_alias) {
  std::ostringstream os;
  os << kernel_prelude() << "\n";
  for (size_t k = 0; k < P.kernels.size(); ++k)
    for (size_t v = 0; v < variants[k].size(); ++v)
      KernelEmitter(L, P.kernels[k], variants[k][v], os, may_alias)
          .emit("kiln_k" + std::to_string(k) + "_v" + std::to_string(v));
  return os.str();
}

namespace {

bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; }
bool hex_digit(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }

}  // namespace

HoistedSource hoist_literals(const std::string& source, size_t first_slot) {
  static const std::string kFn = "extern \"C\" __attribute__((visibility(\"default\"))) void kiln_k";
  static const std::string kEntry = "(void)P; (void)nt;\n";
  HoistedSource h;
  const size_t start = source.find(kFn);
  if (start == std::string::npos) {
    h.text = source;
    return h;
  }
  h.text = source.substr(0, start);  // the prelude, untouched
  // One slot per occurrence, in the order of the text: numbers that happen to be equal at one shape
  // (a length equal to a width) and not at another still give the same text.
  auto slot = [&](double v) {
    h.values.push_back(v);
    return h.values.size() - 1;
  };
  size_t pos = start;
  while (pos < source.size()) {
    size_t next = source.find(kFn, pos + 1);
    if (next == std::string::npos) next = source.size();
    const std::string fn = source.substr(pos, next - pos);
    std::string body;
    std::map<size_t, char> used;  // slot -> 'L' int64, 'D' double, 'F' float
    for (size_t i = 0; i < fn.size();) {
      const char c = fn[i];
      const bool starts = std::isdigit(static_cast<unsigned char>(c)) && (i == 0 || !ident_char(fn[i - 1]));
      if (!starts) {
        body += c;
        ++i;
        continue;
      }
      size_t j = i;
      if (c == '0' && j + 1 < fn.size() && (fn[j + 1] == 'x' || fn[j + 1] == 'X')) {
        // A hexadecimal floating-point constant: 0x1.5555555555555p-9, with 'f' for a float.
        j += 2;
        while (j < fn.size() && (hex_digit(fn[j]) || fn[j] == '.')) ++j;
        if (j < fn.size() && (fn[j] == 'p' || fn[j] == 'P')) {
          ++j;
          if (j < fn.size() && (fn[j] == '+' || fn[j] == '-')) ++j;
          while (j < fn.size() && std::isdigit(static_cast<unsigned char>(fn[j]))) ++j;
          const bool is_float = j < fn.size() && fn[j] == 'f';
          const double v = std::strtod(fn.substr(i, j - i).c_str(), nullptr);
          const size_t end = j + (is_float ? 1 : 0);
          if (v == 0 || v == 1 || (end < fn.size() && ident_char(fn[end]))) {
            body += fn.substr(i, end - i);
          } else {
            const char kind = is_float ? 'F' : 'D';
            const size_t k = slot(v);
            used[k] = kind;
            body += std::string("K") + kind + std::to_string(k);
          }
          i = end;
          continue;
        }
        body += fn.substr(i, j - i);
        i = j;
        continue;
      }
      while (j < fn.size() && std::isdigit(static_cast<unsigned char>(fn[j]))) ++j;
      const bool ll = fn.compare(j, 2, "LL") == 0 && (j + 2 >= fn.size() || !ident_char(fn[j + 2]));
      const std::string digits = fn.substr(i, j - i);
      if (!ll || digits == "0" || digits == "1" || digits.size() > 15) {
        body += fn.substr(i, (ll ? j + 2 : j) - i);
        i = ll ? j + 2 : j;
        continue;
      }
      const size_t k = slot(static_cast<double>(std::stoll(digits)));
      used[k] = 'L';
      body += "KL" + std::to_string(k);
      i = j + 2;
    }
    // The numbers this kernel reads, declared at its entry.
    std::string decls;
    for (const auto& [k, kind] : used) {
      const std::string from = "P[" + std::to_string(first_slot + k) + "]";
      if (kind == 'L') decls += "  const int64_t KL" + std::to_string(k) + " = (int64_t)" + from + ";\n";
      if (kind == 'D') decls += "  const double KD" + std::to_string(k) + " = " + from + ";\n";
      if (kind == 'F') decls += "  const float KF" + std::to_string(k) + " = (float)" + from + ";\n";
    }
    const size_t entry = body.find(kEntry);
    if (entry == std::string::npos) throw std::logic_error("hoist_literals: a kernel without its entry line");
    body.insert(entry + kEntry.size(), decls);
    h.text += body;
    pos = next;
  }
  return h;
}

}  // namespace kiln::inductor
