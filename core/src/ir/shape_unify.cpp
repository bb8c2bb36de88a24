// Two captures of one step at different sizes, lined up into one shape-generic graph
// (shape_unify.h).
#include "kiln/internal/shape_unify.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <numeric>
#include <stdexcept>
#include <utility>

#include "kiln/internal/ir_text.h"

namespace kiln::ir {

namespace {

constexpr int64_t kLargestDenominator = 16;  // c = 1/2 (a half of a dimension), never 1/384

int64_t product(const std::vector<int32_t>& monomial, const std::vector<int64_t>& sizes) {
  int64_t p = 1;
  for (int32_t s : monomial) p *= sizes[static_cast<size_t>(s)];
  return p;
}

std::string symbol_name(int32_t s) { return "s" + std::to_string(s); }

// The monomials tried, lowest degree first: each symbol, then each product of two.
std::vector<std::vector<int32_t>> monomials(size_t num_symbols, int degree) {
  std::vector<std::vector<int32_t>> out;
  for (int32_t i = 0; i < static_cast<int32_t>(num_symbols); ++i) {
    if (degree == 1) out.push_back({i});
    else
      for (int32_t j = i; j < static_cast<int32_t>(num_symbols); ++j) out.push_back({i, j});
  }
  return out;
}

// x_a at sizes a and x_b at sizes b as one expression, or why not.
struct Fit {
  std::optional<SizeExpr> expr;
  std::string failure;
};

Fit fit_integer(int64_t xa, int64_t xb, const std::vector<int64_t>& va, const std::vector<int64_t>& vb) {
  // Classes in order of preference: proportional to a symbol, to a product of two; then with a
  // constant added.
  for (const bool with_constant : {false, true}) {
    for (const int degree : {1, 2}) {
      std::vector<SizeExpr> found;
      for (const auto& m : monomials(va.size(), degree)) {
        const int64_t ma = product(m, va), mb = product(m, vb);
        if (ma == mb) continue;
        int64_t num = xb - xa, den = mb - ma;
        if (den < 0) num = -num, den = -den;
        const int64_t g = std::gcd(num < 0 ? -num : num, den);
        if (g > 1) num /= g, den /= g;
        if (den > kLargestDenominator) continue;
        const int64_t k_times_den = xa * den - num * ma;
        if (k_times_den % den != 0) continue;
        const int64_t k = k_times_den / den;
        if (!with_constant && k != 0) continue;
        SizeExpr e;
        e.monomial = m;
        e.num = num;
        e.den = den;
        e.constant = k;
        found.push_back(std::move(e));
      }
      if (found.empty()) continue;
      // The simplest fit wins (T - 1 over 127 - 8*B when both changed); a tie is ambiguous.
      auto score = [](const SizeExpr& e) { return std::abs(e.num) + e.den + std::abs(e.constant); };
      std::sort(found.begin(), found.end(), [&](const SizeExpr& x, const SizeExpr& y) { return score(x) < score(y); });
      if (found.size() == 1 || score(found[0]) < score(found[1])) return {found.front(), ""};
      std::string list;
      for (const auto& e : found) list += (list.empty() ? "" : ", ") + e.str();
      return {std::nullopt, "ambiguous: " + std::to_string(xa) + " and " + std::to_string(xb) + " fit " + list};
    }
  }
  return {std::nullopt,
          std::to_string(xa) + " and " + std::to_string(xb) + " are no function of the sizes that changed"};
}

std::optional<int64_t> as_integer(double x) {
  if (!std::isfinite(x) || std::abs(x) > 9.0e15) return std::nullopt;
  const double r = std::round(x);
  if (std::abs(x - r) > 1e-9 * std::max(1.0, std::abs(x))) return std::nullopt;
  return static_cast<int64_t>(r);
}

Fit fit_double(double xa, double xb, const std::vector<int64_t>& va, const std::vector<int64_t>& vb) {
  const auto ia = as_integer(xa), ib = as_integer(xb);
  if (ia && ib) {
    Fit f = fit_integer(*ia, *ib, va, vb);
    if (f.expr) return f;
  }
  const auto ra = as_integer(1.0 / xa), rb = as_integer(1.0 / xb);
  if (ra && rb) {
    Fit f = fit_integer(*ra, *rb, va, vb);
    if (f.expr) f.expr->reciprocal = true;
    return f;
  }
  return {std::nullopt,
          std::to_string(xa) + " and " + std::to_string(xb) + " are no function of the sizes that changed"};
}

std::string node_name(const Graph& g, size_t n) { return "node " + std::to_string(n) + " (" + g.nodes[n].op + ")"; }

// Lines up a and b, recording a site for each number that differs; the first difference that is
// not a number, or a number that fits no expression, is the failure.
class Unifier {
 public:
  Unifier(const Graph& a, const Graph& b, SymbolicStep& out) : a_(a), b_(b), out_(out) {}

  std::string run() {
    if (std::string why = symbols(); !why.empty()) return why;
    if (a_.values.size() != b_.values.size())
      return "the captures have " + std::to_string(a_.values.size()) + " and " + std::to_string(b_.values.size()) +
             " values";
    if (a_.nodes.size() != b_.nodes.size())
      return "the captures have " + std::to_string(a_.nodes.size()) + " and " + std::to_string(b_.nodes.size()) +
             " nodes";
    if (std::string why = inputs_and_outputs(); !why.empty()) return why;
    for (size_t v = 0; v < a_.values.size(); ++v)
      if (std::string why = value(v); !why.empty()) return why;
    for (size_t n = 0; n < a_.nodes.size(); ++n)
      if (std::string why = node(n); !why.empty()) return why;
    return "";
  }

 private:
  // Every dimension of a user input that differs is a symbol; dimensions with the same pair of
  // sizes share one (PyTorch's duck sizing: equal sizes are taken to be the same size).
  std::string symbols() {
    std::map<std::pair<int64_t, int64_t>, int32_t> by_sizes;
    for (size_t i = 0; i < a_.inputs.size() && i < b_.inputs.size(); ++i) {
      const Input& ia = a_.inputs[i];
      if (ia.role != InputRole::UserInput) continue;
      const auto& sa = a_.value(ia.value).meta.shape;
      const auto& sb = b_.value(b_.inputs[i].value).meta.shape;
      if (sa.size() != sb.size())
        return ia.name + " has " + std::to_string(sa.size()) + " and " + std::to_string(sb.size()) + " dims";
      for (size_t d = 0; d < sa.size(); ++d) {
        if (sa[d] == sb[d]) continue;
        if (sa[d] < 2 || sb[d] < 2)
          return ia.name + " dim " + std::to_string(d) + " is " + std::to_string(std::min(sa[d], sb[d])) +
                 " in one capture: sizes 0 and 1 stay specialised";
        auto [it, fresh] = by_sizes.emplace(std::make_pair(sa[d], sb[d]), static_cast<int32_t>(va_.size()));
        if (fresh) {
          out_.symbols.push_back({ia.name, static_cast<int32_t>(d)});
          va_.push_back(sa[d]);
          vb_.push_back(sb[d]);
        }
      }
    }
    if (va_.empty()) return "the user inputs have the same sizes in both captures";
    out_.first_sizes = va_;
    return "";
  }

  std::string inputs_and_outputs() const {
    if (a_.inputs.size() != b_.inputs.size() || a_.outputs.size() != b_.outputs.size() ||
        a_.scalar_inputs.size() != b_.scalar_inputs.size())
      return "the captures have other inputs or outputs";
    for (size_t i = 0; i < a_.inputs.size(); ++i) {
      const Input &x = a_.inputs[i], &y = b_.inputs[i];
      if (x.value != y.value || x.role != y.role || x.name != y.name)
        return "input " + std::to_string(i) + " is " + x.name + " in one capture and " + y.name + " in the other";
      // Everything but the batch is bound to one tensor (a parameter, a constant captured by
      // value): one whose size follows the batch's cannot be bound at another size.
      if (x.role != InputRole::UserInput && a_.value(x.value).meta != b_.value(y.value).meta)
        return x.name + " (" + to_string(x.role) + ") is " + print_type(a_.value(x.value).meta) +
               " in one capture and " + print_type(b_.value(y.value).meta) +
               " in the other: only the step's inputs may change size";
    }
    for (size_t i = 0; i < a_.outputs.size(); ++i) {
      const Output &x = a_.outputs[i], &y = b_.outputs[i];
      if (x.value != y.value || x.role != y.role || x.target != y.target || x.name != y.name)
        return "output " + std::to_string(i) + " differs between the captures";
    }
    return "";
  }

  std::string number(SizeSite::Kind kind, int32_t at, int32_t arg, int32_t elem, int64_t xa, int64_t xb,
                     const std::string& where) {
    if (xa == xb) return "";
    Fit f = fit_integer(xa, xb, va_, vb_);
    if (!f.expr) return where + ": " + f.failure;
    out_.sites.push_back({kind, at, arg, elem, *f.expr});
    return "";
  }

  std::string value(size_t v) {
    const TensorMeta &x = a_.values[v].meta, &y = b_.values[v].meta;
    const Value &va = a_.values[v], &vb = b_.values[v];
    const std::string where = "value %" + std::to_string(v);
    if (va.producer != vb.producer || va.producer_output != vb.producer_output || va.storage != vb.storage)
      return where + " is made by other nodes in the two captures";
    if (x.dtype != y.dtype || x.device != y.device || x.shape.size() != y.shape.size() ||
        x.strides.size() != y.strides.size())
      return where + " has another type in the two captures: " + print_type(x) + " and " + print_type(y);
    const auto at = static_cast<int32_t>(v);
    for (size_t d = 0; d < x.shape.size(); ++d)
      if (auto why = number(SizeSite::Kind::Shape, at, -1, static_cast<int32_t>(d), x.shape[d], y.shape[d],
                            where + " dim " + std::to_string(d));
          !why.empty())
        return why;
    for (size_t d = 0; d < x.strides.size(); ++d)
      if (auto why = number(SizeSite::Kind::Stride, at, -1, static_cast<int32_t>(d), x.strides[d], y.strides[d],
                            where + " stride " + std::to_string(d));
          !why.empty())
        return why;
    return number(SizeSite::Kind::Offset, at, -1, -1, x.storage_offset, y.storage_offset, where + " storage offset");
  }

  std::string node(size_t n) {
    const Node &x = a_.nodes[n], &y = b_.nodes[n];
    const std::string where = node_name(a_, n);
    if (x.op != y.op) return where + " is " + y.op + " in the other capture";
    if (x.phase != y.phase || x.returns_list != y.returns_list || x.outputs != y.outputs ||
        x.args.size() != y.args.size())
      return where + " has other outputs or arguments in the other capture";
    const auto at = static_cast<int32_t>(n);
    for (size_t k = 0; k < x.args.size(); ++k) {
      const Arg &p = x.args[k], &q = y.args[k];
      const std::string arg = where + " argument " + std::to_string(k);
      if (p.kind != q.kind || p.value != q.value || p.values != q.values || p.s != q.s || p.is_scalar != q.is_scalar ||
          p.scalar_input != q.scalar_input || p.doubles != q.doubles || p.ints.size() != q.ints.size())
        return arg + " differs between the captures: " + print_arg(p) + " and " + print_arg(q);
      const auto ak = static_cast<int32_t>(k);
      switch (p.kind) {
        case Arg::Kind::Int:
          if (auto why = number(SizeSite::Kind::Int, at, ak, -1, p.i, q.i, arg); !why.empty()) return why;
          break;
        case Arg::Kind::IntList:
          for (size_t e = 0; e < p.ints.size(); ++e)
            if (auto why = number(SizeSite::Kind::Ints, at, ak, static_cast<int32_t>(e), p.ints[e], q.ints[e],
                                  arg + " element " + std::to_string(e));
                !why.empty())
              return why;
          break;
        case Arg::Kind::Double:
          if (p.d != q.d) {
            Fit f = fit_double(p.d, q.d, va_, vb_);
            if (!f.expr) return arg + ": " + f.failure;
            out_.sites.push_back({SizeSite::Kind::Double, at, ak, -1, *f.expr});
          }
          break;
        default:
          if (p.i != q.i || p.ints != q.ints)
            return arg + " differs between the captures: " + print_arg(p) + " and " + print_arg(q);
      }
    }
    return "";
  }

  const Graph &a_, &b_;
  SymbolicStep& out_;
  std::vector<int64_t> va_, vb_;  // the symbols' sizes in a and in b
};

}  // namespace

std::optional<int64_t> SizeExpr::eval(const std::vector<int64_t>& sizes) const {
  const int64_t scaled = num * product(monomial, sizes);
  if (scaled % den != 0) return std::nullopt;
  return scaled / den + constant;
}

std::string SizeExpr::str() const {
  std::string m;
  for (int32_t s : monomial) m += (m.empty() ? "" : "*") + symbol_name(s);
  std::string t;
  if (num != 0 && !m.empty()) {
    if (num == -1 && den == 1) t = "-";
    else if (!(num == 1 && den == 1)) t = std::to_string(num) + (den != 1 ? "/" + std::to_string(den) : "") + "*";
    t += m;
  }
  if (constant != 0 || t.empty())
    t += t.empty() ? std::to_string(constant)
                   : (constant < 0 ? " - " + std::to_string(-constant) : " + " + std::to_string(constant));
  return reciprocal ? "1/(" + t + ")" : t;
}

std::optional<std::vector<int64_t>> SymbolicStep::sizes_of(const Graph& g) const {
  std::vector<int64_t> sizes;
  for (const auto& s : symbols) {
    const Input* found = nullptr;
    for (const auto& in : g.inputs)
      if (in.name == s.input) found = &in;
    if (!found) return std::nullopt;
    const auto& shape = g.value(found->value).meta.shape;
    if (s.dim < 0 || static_cast<size_t>(s.dim) >= shape.size()) return std::nullopt;
    sizes.push_back(shape[static_cast<size_t>(s.dim)]);
  }
  return sizes;
}

std::string SymbolicStep::symbols_text() const {
  std::string t;
  for (size_t s = 0; s < symbols.size(); ++s)
    t += (t.empty() ? "" : ", ") + symbol_name(static_cast<int32_t>(s)) + " = " + symbols[s].input + " dim " +
         std::to_string(symbols[s].dim);
  return t;
}

UnifyResult unify_captures(const Graph& a, const Graph& b) {
  UnifyResult r;
  SymbolicStep step;
  step.graph = a;
  if (std::string why = Unifier(a, b, step).run(); !why.empty()) {
    r.failure = why;
    return r;
  }
  // What was fitted must give back the second capture exactly: a fit that only looks right is
  // caught here, not at a later shape.
  const Graph again = specialise(step, *step.sizes_of(b));
  if (print(again) != print(b)) {
    r.failure = "the fitted expressions do not give back the second capture";
    return r;
  }
  r.step = std::move(step);
  return r;
}

Graph specialise(const SymbolicStep& step, const std::vector<int64_t>& sizes) {
  if (sizes.size() != step.symbols.size())
    throw std::invalid_argument("specialise: " + std::to_string(sizes.size()) + " sizes for " +
                                std::to_string(step.symbols.size()) + " symbols (" + step.symbols_text() + ")");
  for (size_t s = 0; s < sizes.size(); ++s)
    if (sizes[s] < 2)
      throw std::invalid_argument("specialise: " + symbol_name(static_cast<int32_t>(s)) + " (" + step.symbols[s].input +
                                  " dim " + std::to_string(step.symbols[s].dim) + ") = " + std::to_string(sizes[s]) +
                                  ": sizes 0 and 1 stay specialised; capture the step at this size");
  Graph g = step.graph;
  for (const auto& site : step.sites) {
    const auto v = site.expr.eval(sizes);
    if (!v)
      throw std::invalid_argument("specialise: " + site.expr.str() + " is not an integer at these sizes (site of " +
                                  (site.kind == SizeSite::Kind::Shape || site.kind == SizeSite::Kind::Stride ||
                                           site.kind == SizeSite::Kind::Offset
                                       ? "value %" + std::to_string(site.at)
                                       : node_name(g, static_cast<size_t>(site.at))) +
                                  ")");
    const auto at = static_cast<size_t>(site.at);
    const auto elem = static_cast<size_t>(site.elem);
    switch (site.kind) {
      case SizeSite::Kind::Shape: g.values[at].meta.shape[elem] = *v; break;
      case SizeSite::Kind::Stride: g.values[at].meta.strides[elem] = *v; break;
      case SizeSite::Kind::Offset: g.values[at].meta.storage_offset = *v; break;
      case SizeSite::Kind::Int: g.nodes[at].args[static_cast<size_t>(site.arg)].i = *v; break;
      case SizeSite::Kind::Ints: g.nodes[at].args[static_cast<size_t>(site.arg)].ints[elem] = *v; break;
      case SizeSite::Kind::Double:
        g.nodes[at].args[static_cast<size_t>(site.arg)].d =
            site.expr.reciprocal ? 1.0 / static_cast<double>(*v) : static_cast<double>(*v);
        break;
    }
  }
  return g;
}

}  // namespace kiln::ir
