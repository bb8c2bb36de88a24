#include "padding.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <set>

#include "boundary.h"
#include "stablehlo_emit.h"

namespace kiln::neuron {

using kiln::plugin::Graph;
using kiln::plugin::Node;

SizeExpr SizeExpr::fixed(int64_t n) {
  SizeExpr e;
  e.constant = n;
  return e;
}

SizeExpr SizeExpr::of(const KilnSizeSite& s) {
  SizeExpr e;
  for (int32_t k = 0; k < s.num_factors && k < 2; ++k) e.factors.push_back(s.factors[k]);
  std::sort(e.factors.begin(), e.factors.end());
  e.num = s.num, e.den = s.den > 0 ? s.den : 1, e.constant = s.constant;
  if (e.factors.empty() || e.num == 0) {  // a constant after all
    e.constant += e.num / e.den;
    e.num = 0, e.den = 1, e.factors.clear();
  }
  return e;
}

int64_t SizeExpr::at(const std::vector<int64_t>& sizes) const {
  int64_t p = num;
  for (int32_t f : factors) {
    if (f < 0 || static_cast<size_t>(f) >= sizes.size())
      throw kiln::plugin::Error(KILN_ERROR_INTERNAL, "neuron: a size expression names symbol " + std::to_string(f) +
                                                         " of " + std::to_string(sizes.size()));
    p *= sizes[static_cast<size_t>(f)];
  }
  return (factors.empty() ? 0 : p / den) + constant;
}

std::string SizeExpr::text() const {
  if (!symbolic()) return std::to_string(constant);
  std::string t = num == 1 ? "" : std::to_string(num) + "*";
  for (size_t k = 0; k < factors.size(); ++k) t += (k ? "*s" : "s") + std::to_string(factors[k]);
  if (den != 1) t += "/" + std::to_string(den);
  if (constant) t += (constant > 0 ? "+" : "") + std::to_string(constant);
  return t;
}

namespace {
// Adjacent factors that follow no size are one factor ([6 x 64] is [384]); factors of 1 go.
PaddedDim canonical(const PaddedDim& d) {
  PaddedDim c;
  for (const SubDim& s : d) {
    if (!s.real.symbolic() && s.bucket == 1) continue;
    if (!s.real.symbolic() && !c.empty() && !c.back().real.symbolic()) {
      c.back().bucket *= s.bucket;
      c.back().real = SizeExpr::fixed(c.back().bucket);
    } else {
      c.push_back(s);
    }
  }
  return c;
}
}  // namespace

bool same_padding(const PaddedDim& pa, const PaddedDim& pb) {
  const PaddedDim a = canonical(pa), b = canonical(pb);
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k)
    if (a[k].bucket != b[k].bucket || !(a[k].real == b[k].real)) return false;
  return true;
}

std::string padding_text(const PaddedDim& d) {
  std::string t;
  for (size_t k = 0; k < d.size(); ++k)
    t += (k ? " x " : "") + (d[k].real.symbolic() ? d[k].real.text() + " of " : "") + std::to_string(d[k].bucket);
  return "[" + t + "]";
}

bool is_padded(const PaddedDim& d) {
  return std::any_of(d.begin(), d.end(), [](const SubDim& s) { return s.real.symbolic(); });
}

void check_bucket_policy(const std::string& policy) {
  kiln::plugin::check_size_bucket_policy(policy, "[plugin.neuron] buckets");
}

std::vector<int64_t> bucket_sizes(const std::string& policy, const std::vector<int64_t>& sizes) {
  return kiln::plugin::size_bucket(policy, sizes, "[plugin.neuron] buckets").high;
}

namespace {

class Planner {
 public:
  Planner(const Graph& sym, const Graph& bkt) : sym_(sym), bkt_(bkt) {
    for (const KilnSizeSite& s : sym.size_sites()) {
      if (s.kind == KILN_SIZE_SITE_SHAPE) shape_[{s.at, s.elem}] = SizeExpr::of(s);
      if (s.kind == KILN_SIZE_SITE_INT || s.kind == KILN_SIZE_SITE_INTS || s.kind == KILN_SIZE_SITE_DOUBLE)
        node_sites_[s.at].push_back(s);
    }
    hints_ = sym.symbol_hints();
    // The bucket's own sizes: each symbol is an input dim.
    for (const KilnSizeSymbol& s : sym.symbols())
      bucket_.push_back(bkt.value(bkt.inputs()[static_cast<size_t>(s.input)]).shape()[static_cast<size_t>(s.dim)]);
  }

  std::optional<PaddingPlan> run(std::string* why) {
    plan_.num_symbols = hints_.size();
    plan_.values.assign(bkt_.num_values(), {});
    // Padded inputs and results are dense host buffers, so the boundary must be host memory in
    // row-major order (a transposed weight is a parameter in its storage order otherwise).
    for (int64_t v : bkt_.inputs()) {
      if (auto w = boundary(v, "an input"); !w.empty()) return fail(why, w);
      auto& dims = plan_.values[static_cast<size_t>(v)];
      const auto shape = bkt_.value(v).shape();
      for (size_t d = 0; d < shape.size(); ++d) dims.push_back({SubDim{shape[d], expr(v, d)}});
    }
    for (int64_t v : bkt_.outputs())
      if (auto w = boundary(v, "an output"); !w.empty()) return fail(why, w);
    for (size_t i = 0; i < bkt_.num_nodes(); ++i) {
      const Node n = bkt_.node(static_cast<int64_t>(i));
      std::string w = node(n);
      for (int64_t v : n.outputs())
        if (w.empty() && v >= 0) w = consistent(v);
      if (!w.empty()) return fail(why, "node " + std::to_string(i) + " (" + n.op() + "): " + w);
    }
    return plan_;
  }

 private:
  static std::optional<PaddingPlan> fail(std::string* why, const std::string& w) {
    if (why) *why = w;
    return std::nullopt;
  }

  std::string boundary(int64_t v, const char* what) const {
    const auto val = bkt_.value(v);
    if (val.device().device_type != kDLCPU) return std::string(what) + " outside host memory";
    const auto order = storage_order(val.shape(), val.strides());
    if (!order || !is_row_major(*order))
      return std::string(what) + " of strides " + ints_text(val.strides()) + " (padding takes row-major ones)";
    return "";
  }

  SizeExpr expr(int64_t v, size_t d) const {
    auto it = shape_.find({v, static_cast<int64_t>(d)});
    return it != shape_.end() ? it->second : SizeExpr::fixed(sym_.value(v).shape()[d]);
  }
  PaddedDim fixed(int64_t n) const { return {SubDim{n, SizeExpr::fixed(n)}}; }
  // A dim of its own, as an op that makes it (an expand, a slice of a table) lays it out.
  PaddedDim own(int64_t v, size_t d) const { return {SubDim{bkt_.value(v).shape()[d], expr(v, d)}}; }
  const std::vector<PaddedDim>& of(int64_t v) const { return plan_.values.at(static_cast<size_t>(v)); }
  std::vector<PaddedDim>& set(int64_t v) { return plan_.values.at(static_cast<size_t>(v)); }
  bool any_padded(int64_t v) const {
    const auto& dims = of(v);
    return std::any_of(dims.begin(), dims.end(), is_padded);
  }
  static int64_t dim_arg(int64_t d, size_t rank) { return d < 0 ? d + static_cast<int64_t>(rank) : d; }

  // Each dim a result's plan gives it must be what the graph says it is: at the view's own sizes
  // its real size, at the bucket's its size in the module; a dim of one factor has the very
  // expression its value's shape follows.
  std::string consistent(int64_t v) const {
    const auto& dims = of(v);
    const auto at_hints = sym_.value(v).shape(), at_bucket = bkt_.value(v).shape();
    if (dims.size() != at_bucket.size()) return "its result's plan has " + std::to_string(dims.size()) + " dims";
    for (size_t d = 0; d < dims.size(); ++d) {
      int64_t real = 1, bucket = 1, real_at_bucket = 1;
      for (const SubDim& s : dims[d]) {
        real *= s.real.at(hints_), bucket *= s.bucket, real_at_bucket *= s.real.at(bucket_);
        if (s.real.at(bucket_) != s.bucket)
          return "a factor of " + s.real.text() + " padded to " + std::to_string(s.bucket);
      }
      if (real != at_hints[d] || bucket != at_bucket[d] || real_at_bucket != at_bucket[d])
        return "dim " + std::to_string(d) + " of its result is " + std::to_string(at_hints[d]) + " (" +
               std::to_string(at_bucket[d]) + " padded), and its factors give " + std::to_string(real) + " (" +
               std::to_string(bucket) + ")";
      if (dims[d].size() == 1 && !(dims[d][0].real == expr(v, d)))
        return "dim " + std::to_string(d) + " follows " + expr(v, d).text() + ", not " + dims[d][0].real.text();
    }
    return "";
  }

  void mask(const Node& n, int64_t v, std::vector<int64_t> dims, double fill) {
    std::vector<int64_t> padded;
    for (int64_t d : dims)
      if (is_padded(of(v).at(static_cast<size_t>(d)))) padded.push_back(d);
    if (padded.empty()) return;
    PaddingPlan::Mask m;
    m.value = v, m.dims = padded, m.fill = fill;
    plan_.masks[n.index()].push_back(m);
  }
  void mask_targets(const Node& n, int64_t v, int64_t ignore_index) {
    if (!is_padded(of(v).at(0))) return;
    PaddingPlan::Mask m;
    m.value = v, m.dims = {0}, m.integer = true, m.int_fill = ignore_index;
    plan_.masks[n.index()].push_back(m);
  }

  // The dims of an element-wise result: each from the operands that have it at full size, which
  // must agree.
  std::string pointwise(const Node& n, const std::vector<int64_t>& operands) {
    for (int64_t out : n.outputs()) {
      if (out < 0) continue;
      const auto shape = bkt_.value(out).shape();
      std::vector<PaddedDim> dims(shape.size());
      for (size_t d = 0; d < shape.size(); ++d) {
        const PaddedDim* s = nullptr;
        for (int64_t v : operands) {
          const auto vs = bkt_.value(v).shape();
          if (vs.size() > shape.size() || d < shape.size() - vs.size()) continue;
          const size_t k = d - (shape.size() - vs.size());
          if (vs[k] == 1 && shape[d] != 1) continue;
          const PaddedDim& pd = of(v)[k];
          if (s && !same_padding(*s, pd))
            return "operands padded differently along dim " + std::to_string(d) + ": " + padding_text(*s) + " and " +
                   padding_text(pd);
          s = &pd;
        }
        dims[d] = s ? *s : fixed(shape[d]);
      }
      set(out) = dims;
    }
    return "";
  }

  // What a node's arguments that follow the sizes are: a view's or an expand's sizes, a slice's
  // bounds (looked at by its rule), a binary op's Scalar (computed from the real sizes); anything
  // else is not padded.
  std::string sites(const Node& n, bool* slice_bound) {
    *slice_bound = false;
    auto it = node_sites_.find(n.index());
    if (it == node_sites_.end()) return "";
    const std::string o = n.op();
    for (const KilnSizeSite& s : it->second) {
      if ((o == "aten::view" || o == "aten::_unsafe_view" || o == "aten::reshape" || o == "aten::expand") && s.arg == 1)
        continue;
      if (o == "aten::slice.Tensor" && (s.arg == 2 || s.arg == 3)) {
        *slice_bound = true;
        continue;
      }
      if (is_elementwise(o) && s.arg == 1 && s.kind != KILN_SIZE_SITE_INTS) {
        plan_.scalar_sites[{n.index(), 1}] = s;
        continue;
      }
      return "its argument " + std::to_string(s.arg) + " follows the sizes";
    }
    return "";
  }

  std::string matmul(const Node& n) {
    const std::string o = n.op();
    const size_t first = o == "aten::addmm" ? 1 : 0;
    const int64_t a = n.arg(first).tensor_index(), b = n.arg(first + 1).tensor_index();
    const int64_t out = n.outputs()[0];
    const bool batched = o == "aten::bmm";
    const size_t ka = batched ? 2 : 1, kb = batched ? 1 : 0;
    if (!same_padding(of(a)[ka], of(b)[kb]))
      return "operands padded differently along the contraction: " + padding_text(of(a)[ka]) + " and " +
             padding_text(of(b)[kb]);
    mask(n, a, {static_cast<int64_t>(ka)}, 0.0);
    mask(n, b, {static_cast<int64_t>(kb)}, 0.0);
    if (batched) {
      if (!same_padding(of(a)[0], of(b)[0])) return "operands padded differently along the batch";
      set(out) = {of(a)[0], of(a)[1], of(b)[2]};
    } else {
      set(out) = {of(a)[0], of(b)[1]};
    }
    if (o == "aten::addmm") {  // the bias broadcast to the product's dims must lie as they do
      const int64_t bias = n.arg(0).tensor_index();
      const auto bs = bkt_.value(bias).shape();
      const auto os = bkt_.value(out).shape();
      for (size_t k = 0; k < bs.size(); ++k) {
        const size_t d = k + os.size() - bs.size();
        if (bs[k] != 1 && !same_padding(of(bias)[k], of(out)[d])) return "a bias padded otherwise";
      }
    }
    return "";
  }

  // A view's result dims from its operand's factors, in order: each dim takes factors until their
  // buckets make its size; a factor that follows no size may be split, one that does may not.
  std::string view(const Node& n) {
    const int64_t x = n.arg(0).tensor_index(), out = n.outputs()[0];
    std::vector<SubDim> flat;
    for (const PaddedDim& d : of(x))
      for (const SubDim& s : d)
        if (s.bucket != 1 || s.real.symbolic()) flat.push_back(s);
    std::vector<PaddedDim> dims;
    size_t next = 0;
    for (int64_t size : bkt_.value(out).shape()) {
      if (size == 1) {
        dims.push_back(fixed(1));
        continue;
      }
      PaddedDim d;
      int64_t acc = 1;
      while (acc < size) {
        if (next == flat.size()) return "a view that does not follow its operand's padding";
        SubDim s = flat[next];
        if (acc * s.bucket <= size && size % (acc * s.bucket) == 0) {
          d.push_back(s), acc *= s.bucket, ++next;
        } else if (!s.real.symbolic() && s.bucket % (size / acc) == 0 && size % acc == 0) {
          const int64_t outer = size / acc;  // a fixed factor split: its outer part here, the rest next
          d.push_back({outer, SizeExpr::fixed(outer)});
          flat[next] = {s.bucket / outer, SizeExpr::fixed(s.bucket / outer)};
          acc *= outer;
        } else {
          return "a view that splits a padded dim";
        }
      }
      dims.push_back(d);
    }
    if (next != flat.size()) return "a view that does not follow its operand's padding";
    set(out) = dims;
    return "";
  }

  std::string slice(const Node& n, bool bound_follows_sizes) {
    const int64_t x = n.arg(0).tensor_index(), out = n.outputs()[0];
    const auto in = bkt_.value(x).shape();
    const size_t d = static_cast<size_t>(dim_arg(n.arg(1).as_int(), in.size()));
    const bool start_zero = n.arg(2).is_none() || n.arg(2).as_int() == 0;
    const bool step_one = n.arg(4).as_int() == 1;
    std::vector<PaddedDim> dims = of(x);
    const int64_t out_size = bkt_.value(out).shape()[d];
    if (!is_padded(dims[d])) {
      // A fixed dim cut to a length that follows the sizes (a table's first T rows): the rows past
      // the real length are padding, so the cut must be where the bucket says.
      if (bound_follows_sizes) {
        for (const KilnSizeSite& s : node_sites_.at(n.index()))
          if (s.arg != 3) return "a slice whose start follows the sizes";
        if (!(start_zero && step_one)) return "a slice from a start that is not 0";
        if (out_size > in[d]) return "a slice longer than its dim at the bucket's sizes";
      }
      dims[d] = bound_follows_sizes ? own(out, d) : fixed(out_size);
    } else {
      // Along a padded dim only the whole of it: from 0, step 1, to an end past it (x[:, 0:]
      // records a large one) or to the very length the dim follows.
      bool whole = start_zero && step_one && out_size == in[d];
      if (bound_follows_sizes) {
        auto it = node_sites_.find(n.index());
        for (const KilnSizeSite& s : it->second)
          if (s.arg != 3 || dims[d].size() != 1 || !(SizeExpr::of(s) == dims[d][0].real)) whole = false;
      }
      if (!whole) return "a slice that cuts a padded dim";
    }
    set(out) = dims;
    return "";
  }

  std::string node(const Node& n) {
    const std::string o = n.op();
    bool bound = false;
    if (auto w = sites(n, &bound); !w.empty()) return w;
    std::vector<int64_t> tensors;
    for (int64_t v : n.inputs()) tensors.push_back(v);
    const bool padded_in = std::any_of(tensors.begin(), tensors.end(), [&](int64_t v) { return any_padded(v); });
    const bool has_sites = node_sites_.count(n.index()) > 0;
    if (o == "aten::expand") {
      const int64_t x = n.arg(0).tensor_index(), out = n.outputs()[0];
      const auto in = bkt_.value(x).shape(), os = bkt_.value(out).shape();
      std::vector<PaddedDim> dims(os.size());
      for (size_t d = 0; d < os.size(); ++d) {
        const size_t lead = os.size() - in.size();
        dims[d] = d < lead || (in[d - lead] == 1 && os[d] != 1) ? own(out, d) : of(x)[d - lead];
      }
      set(out) = dims;
      return "";
    }
    if (o == "aten::view" || o == "aten::_unsafe_view" || o == "aten::reshape") return view(n);
    if (o == "aten::slice.Tensor") return slice(n, bound);
    if (!padded_in && !has_sites) {  // nothing padded comes in: the results are whole
      for (int64_t out : n.outputs()) {
        if (out < 0) continue;
        std::vector<PaddedDim> dims;
        for (int64_t s : bkt_.value(out).shape()) dims.push_back(fixed(s));
        set(out) = dims;
      }
      return "";
    }
    if (is_elementwise(o)) return pointwise(n, tensors);
    if (o == "aten::t" || o == "aten::permute" || o == "aten::transpose.int") {
      const int64_t x = n.arg(0).tensor_index();
      const size_t rank = of(x).size();
      std::vector<int64_t> perm(rank);
      for (size_t d = 0; d < rank; ++d) perm[d] = static_cast<int64_t>(d);
      if (o == "aten::permute") {
        perm = n.arg(1).as_ints();
        for (auto& d : perm) d = dim_arg(d, rank);
      } else if (o == "aten::transpose.int") {
        std::swap(perm[static_cast<size_t>(dim_arg(n.arg(1).as_int(), rank))],
                  perm[static_cast<size_t>(dim_arg(n.arg(2).as_int(), rank))]);
      } else if (rank == 2) {
        std::swap(perm[0], perm[1]);
      }
      std::vector<PaddedDim> dims;
      for (int64_t p : perm) dims.push_back(of(x).at(static_cast<size_t>(p)));
      set(n.outputs()[0]) = dims;
      return "";
    }
    if (o == "aten::mm" || o == "aten::bmm" || o == "aten::addmm") return matmul(n);
    if (o == "aten::sum" || o == "aten::sum.dim_IntList" || o == "aten::mean.dim") {
      const int64_t x = n.arg(0).tensor_index();
      const size_t rank = of(x).size();
      std::vector<int64_t> dims;
      if (o != "aten::sum" && !n.arg(1).is_none())
        for (int64_t d : n.arg(1).as_ints()) dims.push_back(dim_arg(d, rank));
      if (dims.empty())
        for (size_t d = 0; d < rank; ++d) dims.push_back(static_cast<int64_t>(d));
      const bool keep = o != "aten::sum" && n.num_args() > 2 && n.arg(2).tag() == KILN_ARG_BOOL && n.arg(2).as_bool();
      mask(n, x, dims, 0.0);
      std::vector<PaddedDim> out;
      for (size_t d = 0; d < rank; ++d) {
        if (std::find(dims.begin(), dims.end(), static_cast<int64_t>(d)) == dims.end()) out.push_back(of(x)[d]);
        else if (keep) out.push_back(fixed(1));
      }
      set(n.outputs()[0]) = out;
      return "";
    }
    if (o == "aten::split.Tensor" || o == "aten::cat") {
      const bool cat = o == "aten::cat";
      const std::vector<int64_t> parts = cat ? n.arg(0).as_ints() : std::vector<int64_t>{n.arg(0).tensor_index()};
      const size_t rank = of(parts[0]).size();
      const size_t d = static_cast<size_t>(dim_arg(n.arg(cat ? 1 : 2).as_int(), rank));
      for (int64_t p : parts) {
        if (is_padded(of(p)[d])) return "a padded dim cut or joined";
        for (size_t k = 0; k < rank; ++k)
          if (k != d && !same_padding(of(p)[k], of(parts[0])[k])) return "parts padded differently";
      }
      for (int64_t out : n.outputs()) {
        std::vector<PaddedDim> dims = of(parts[0]);
        dims[d] = fixed(bkt_.value(out).shape()[d]);
        set(out) = dims;
      }
      return "";
    }
    if (o == "aten::_softmax" || o == "aten::_log_softmax") {
      const int64_t x = n.arg(0).tensor_index();
      mask(n, x, {dim_arg(n.arg(1).as_int(), of(x).size())}, -std::numeric_limits<double>::infinity());
      set(n.outputs()[0]) = of(x);
      return "";
    }
    if (o == "aten::_softmax_backward_data" || o == "aten::_log_softmax_backward_data") {
      const int64_t g = n.arg(0).tensor_index(), y = n.arg(1).tensor_index();
      for (size_t d = 0; d < of(g).size(); ++d)
        if (!same_padding(of(g)[d], of(y)[d])) return "a gradient padded unlike the output";
      const int64_t d = dim_arg(n.arg(2).as_int(), of(g).size());
      mask(n, g, {d}, 0.0);
      mask(n, y, {d}, 0.0);
      set(n.outputs()[0]) = of(g);
      return "";
    }
    if (o == "aten::nll_loss_forward" || o == "aten::nll_loss_backward") {
      const bool bwd = o == "aten::nll_loss_backward";
      const size_t first = bwd ? 1 : 0;
      const int64_t x = n.arg(first).tensor_index(), t = n.arg(first + 1).tensor_index();
      if (is_padded(of(x)[1])) return "a loss over padded classes";
      if (!same_padding(of(x)[0], of(t)[0])) return "targets padded unlike the rows";
      const int64_t reduction = n.arg(first + 3).as_int(), ignore = n.arg(first + 4).as_int();
      mask_targets(n, t, ignore);  // a padded row is an ignored one: no loss, no weight, no gradient
      mask(n, x, {0}, 0.0);
      if (bwd) {
        if (reduction == 0) mask(n, n.arg(0).tensor_index(), {0}, 0.0);
        set(n.outputs()[0]) = of(x);
      } else {
        set(n.outputs()[0]) = reduction == 0 ? std::vector<PaddedDim>{of(x)[0]} : std::vector<PaddedDim>{};
        set(n.outputs()[1]) = {};
      }
      return "";
    }
    if (o == "aten::native_layer_norm" || o == "aten::native_layer_norm_backward") {
      const bool bwd = o == "aten::native_layer_norm_backward";
      const int64_t x = n.arg(bwd ? 1 : 0).tensor_index();
      const size_t k = n.arg(bwd ? 2 : 1).as_ints().size(), rank = of(x).size();
      std::vector<int64_t> batch;
      for (size_t d = 0; d < rank; ++d) {
        if (d + k < rank) batch.push_back(static_cast<int64_t>(d));
        else if (is_padded(of(x)[d])) return "a norm over a padded dim";
      }
      std::vector<PaddedDim> stats;
      for (size_t d = 0; d < rank; ++d) stats.push_back(d + k < rank ? of(x)[d] : fixed(1));
      if (!bwd) {
        set(n.outputs()[0]) = of(x);
        set(n.outputs()[1]) = stats;
        set(n.outputs()[2]) = stats;
        return "";
      }
      const int64_t dy = n.arg(0).tensor_index();
      for (size_t d = 0; d < rank; ++d)
        if (!same_padding(of(dy)[d], of(x)[d])) return "a gradient padded unlike the input";
      // The weight's and bias's gradients sum over the rows: padded rows give 0 (dy = 0, and x,
      // mean 0 and rstd 1 keep x-hat finite).
      mask(n, dy, batch, 0.0);
      mask(n, x, batch, 0.0);
      mask(n, n.arg(3).tensor_index(), batch, 0.0);
      mask(n, n.arg(4).tensor_index(), batch, 1.0);
      const auto outs = n.outputs();
      set(outs[0]) = of(x);
      for (size_t i = 1; i < outs.size(); ++i)
        if (outs[i] >= 0) {
          std::vector<PaddedDim> dims;
          for (int64_t s : bkt_.value(outs[i]).shape()) dims.push_back(fixed(s));
          set(outs[i]) = dims;
        }
      return "";
    }
    if (o == "aten::embedding") {
      const int64_t w = n.arg(0).tensor_index(), idx = n.arg(1).tensor_index();
      if (any_padded(w)) return "a padded table";
      std::vector<PaddedDim> dims = of(idx);
      dims.push_back(fixed(bkt_.value(w).shape()[1]));
      set(n.outputs()[0]) = dims;
      return "";
    }
    if (o == "aten::embedding_dense_backward") {
      const int64_t g = n.arg(0).tensor_index(), idx = n.arg(1).tensor_index();
      const size_t r = of(idx).size();
      if (of(g).size() != r + 1 || is_padded(of(g)[r])) return "a gradient of another shape";
      std::vector<int64_t> dims;
      for (size_t d = 0; d < r; ++d) {
        if (!same_padding(of(g)[d], of(idx)[d])) return "a gradient padded unlike the indices";
        dims.push_back(static_cast<int64_t>(d));
      }
      mask(n, g, dims, 0.0);  // padded rows add nothing
      std::vector<PaddedDim> out;
      for (int64_t s : bkt_.value(n.outputs()[0]).shape()) out.push_back(fixed(s));
      set(n.outputs()[0]) = out;
      return "";
    }
    if (o == "aten::_scaled_dot_product_flash_attention_for_cpu" ||
        o == "aten::_scaled_dot_product_flash_attention_for_cpu_backward") {
      const bool bwd = o != "aten::_scaled_dot_product_flash_attention_for_cpu";
      const size_t first = bwd ? 1 : 0;
      const int64_t q = n.arg(first).tensor_index(), k = n.arg(first + 1).tensor_index(),
                    v = n.arg(first + 2).tensor_index();
      const bool causal = n.arg(bwd ? 7 : 4).as_bool();
      for (size_t d : {size_t{0}, size_t{1}})
        if (!same_padding(of(q)[d], of(k)[d]) || !same_padding(of(q)[d], of(v)[d]))
          return "heads or batches padded differently";
      if (is_padded(of(q)[3]) || is_padded(of(k)[3]) || is_padded(of(v)[3])) return "a padded head dim";
      if (!same_padding(of(k)[2], of(v)[2])) return "keys and values padded differently";
      // Padded keys are hidden from every real query by the causal mask itself when the keys are
      // the queries' positions; without it they would need a mask of their own.
      const bool padded_keys = is_padded(of(k)[2]);
      if (padded_keys && !(causal && same_padding(of(k)[2], of(q)[2])))
        return "padded keys without the causal mask over the same positions";
      if (padded_keys) {
        mask(n, k, {2}, 0.0);
        mask(n, v, {2}, 0.0);
      }
      if (!bwd) {
        const int64_t out = n.outputs()[0], lse = n.outputs()[1];
        set(out) = {of(q)[0], of(q)[1], of(q)[2], fixed(bkt_.value(out).shape()[3])};
        set(lse) = {of(q)[0], of(q)[1], of(q)[2]};
        return "";
      }
      const int64_t go = n.arg(0).tensor_index(), y = n.arg(4).tensor_index(), lse = n.arg(5).tensor_index();
      for (int64_t t : {go, y})
        for (size_t d = 0; d < 3; ++d)
          if (!same_padding(of(t)[d], of(q)[d])) return "a gradient padded unlike the queries";
      // Padded queries add nothing to the keys' and values' gradients: with dO, O, q and the
      // logsumexp 0 there, their probabilities are finite and their dS 0.
      mask(n, go, {2}, 0.0);
      mask(n, y, {2}, 0.0);
      mask(n, q, {2}, 0.0);
      mask(n, lse, {2}, 0.0);
      const auto outs = n.outputs();
      set(outs[0]) = of(q);
      set(outs[1]) = of(k);
      set(outs[2]) = of(v);
      return "";
    }
    return "not padded (its results would mix padded elements into real ones)";
  }

  const Graph& sym_;
  const Graph& bkt_;
  std::map<std::pair<int64_t, int64_t>, SizeExpr> shape_;
  std::map<int64_t, std::vector<KilnSizeSite>> node_sites_;
  std::vector<int64_t> hints_, bucket_;
  PaddingPlan plan_;
};

}  // namespace

std::optional<PaddingPlan> plan_padding(const Graph& symbolic, const Graph& bucketed, std::string* why) {
  if (!symbolic.symbolic()) {
    if (why) *why = "the group has no size symbols";
    return std::nullopt;
  }
  auto plan = Planner(symbolic, bucketed).run(why);
  if (!plan) return plan;
  // One node must not read one operand masked two ways.
  for (const auto& [node, masks] : plan->masks)
    for (size_t i = 0; i < masks.size(); ++i)
      for (size_t j = i + 1; j < masks.size(); ++j)
        if (masks[i].value == masks[j].value) {
          if (why) *why = "node " + std::to_string(node) + " reads one operand masked twice";
          return std::nullopt;
        }
  return plan;
}

}  // namespace kiln::neuron
