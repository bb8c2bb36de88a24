// Functionalization: the captured graph, with its in-place ops, out= ops and views, becomes a
// pure graph plus write-back outputs.
//
// Rules (docs/architecture.md, "Functionalization"):
//  - Values that share a storage (Value::storage) are tracked per storage: the storage's current
//    content is one "base" value, and every other value of that storage is a view of it, defined
//    by the chain of view ops that made it.
//  - A node that writes an argument becomes its functional variant: `foo_.ov` -> `foo.ov`,
//    `foo.out`/`foo.x_out` -> `foo`/`foo.x`, `foo` -> `foo_functional`, and native_batch_norm ->
//    _native_batch_norm_legit_functional. The variant returns the op's other results followed
//    by the new value of each written argument; arguments are matched by name.
//  - Writing the base makes the new value the base. Writing a view scatters the new value into
//    the base (as_strided_scatter with the view's sizes, strides and offset).
//  - Reading a value whose storage was written after it was computed replays its view chain on
//    the current base.
//  - Every graph input whose storage was written gets a WriteBack output of its final value.
// Anything else (writes through a Tensor[] argument, ops with no functional variant) throws: the
// compile fails and the step runs eagerly with a warning naming the op.
#include <algorithm>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "kiln/internal/executor.h"
#include "kiln/internal/op_info.h"
#include "kiln/internal/passes.h"

namespace kiln {
namespace {

// The order of `view`'s dims that gives `base` (base dim i is view dim perm[i]) when both start at
// the storage's beginning and address the same elements in another order of their dims; empty when
// they do not.
std::vector<int64_t> permutation_onto(const ir::TensorMeta& view, const ir::TensorMeta& base) {
  const size_t n = base.shape.size();
  if (view.shape.size() != n || view.storage_offset != 0 || base.storage_offset != 0) return {};
  std::vector<int64_t> perm(n, -1);
  std::vector<bool> used(n, false);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n && perm[i] < 0; ++j) {
      if (used[j] || view.shape[j] != base.shape[i]) continue;
      if (base.shape[i] != 1 && view.strides[j] != base.strides[i]) continue;
      perm[i] = static_cast<int64_t>(j);
      used[j] = true;
    }
    if (perm[i] < 0) return {};
  }
  // Both dense over the same elements: the larger strides cover every element exactly once.
  std::vector<std::pair<int64_t, int64_t>> dims;
  for (size_t i = 0; i < n; ++i)
    if (base.shape[i] != 1) dims.emplace_back(base.strides[i], base.shape[i]);
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return {};
    expected *= size;
  }
  return perm;
}

std::pair<std::string, std::string> split_op(const std::string& op) {
  const auto colons = op.find("::");
  const auto dot = op.find('.', colons == std::string::npos ? 0 : colons + 2);
  if (dot == std::string::npos) return {op, ""};
  return {op.substr(0, dot), op.substr(dot + 1)};
}

std::string join_op(const std::string& name, const std::string& overload) {
  return overload.empty() ? name : name + "." + overload;
}

const c10::FunctionSchema* find_schema(const std::string& op) {
  auto [name, overload] = split_op(op);
  auto h = c10::Dispatcher::singleton().findOp({name, overload});
  return h ? &h->schema() : nullptr;
}

bool writes_any(const c10::FunctionSchema& s) {
  for (const auto& a : s.arguments())
    if (a.alias_info() && a.alias_info()->isWrite()) return true;
  return false;
}

// Ops whose schema does not say that they write arguments, but whose kernels do: the batch
// norms update running_mean and running_var (arguments 3 and 4) when `training` (argument 5).
std::vector<size_t> hidden_writes(const ir::Node& n) {
  static const char* ops[] = {"aten::native_batch_norm", "aten::cudnn_batch_norm", "aten::miopen_batch_norm"};
  for (const char* op : ops) {
    if (n.op != op || n.args.size() < 6 || n.args[5].kind != ir::Arg::Kind::Bool || !n.args[5].i) continue;
    std::vector<size_t> w;
    for (size_t i : {3, 4})
      if (n.args[i].kind == ir::Arg::Kind::Tensor) w.push_back(i);
    return w;
  }
  return {};
}

struct FunctionalVariant {
  std::string op;
  const c10::FunctionSchema* schema = nullptr;
};

// The pure op that computes what `schema` computes, returning the written arguments' new values.
FunctionalVariant functional_variant(const std::string& op, const c10::FunctionSchema& schema, size_t written,
                                     size_t kept_returns) {
  auto [name, overload] = split_op(op);
  std::vector<std::string> candidates;
  if (!name.empty() && name.back() == '_') candidates.push_back(join_op(name.substr(0, name.size() - 1), overload));
  if (overload == "out") candidates.push_back(name);
  if (overload.size() > 4 && overload.compare(overload.size() - 4, 4, "_out") == 0)
    candidates.push_back(join_op(name, overload.substr(0, overload.size() - 4)));
  candidates.push_back(join_op(name + "_functional", overload));
  if (!name.empty() && name.back() == '_')  // normal_ -> normal_functional
    candidates.push_back(join_op(name.substr(0, name.size() - 1) + "_functional", overload));
  // Random ops: the functional form draws from the same generator as the in-place one, the same
  // numbers for the same generator state (ATen computes it as empty_like(self).bernoulli_(p)).
  if (op == "aten::bernoulli_.float") candidates.push_back("aten::bernoulli.p");
  if (name == "aten::native_batch_norm") candidates.push_back("aten::_native_batch_norm_legit_functional");
  for (const auto& c : candidates) {
    const auto* fs = find_schema(c);
    if (!fs || writes_any(*fs)) continue;
    if (fs->returns().size() != kept_returns + written) continue;
    bool names_ok = true;
    for (const auto& fa : fs->arguments()) {
      bool found = false;
      for (const auto& a : schema.arguments()) found = found || a.name() == fa.name();
      names_ok = names_ok && (found || fa.default_value().has_value());
    }
    if (names_ok) return {c, fs};
  }
  return {};
}

// Random ops draw their numbers in memory order: bernoulli_ on a transposed tensor gives element
// (i, j) the draw that the same op on a contiguous tensor gives element (j, i). Their functional
// forms return contiguous results, so a write into a non-contiguous (but dense) tensor becomes the
// functional op on the tensor permuted into memory order, permuted back. Returns the permutation
// (empty when the tensor is contiguous); throws when no permutation makes it contiguous.
std::vector<int64_t> memory_order(const ir::TensorMeta& m, const std::string& op) {
  if (m.is_contiguous()) return {};
  std::vector<int64_t> perm(m.shape.size());
  for (size_t d = 0; d < perm.size(); ++d) perm[d] = static_cast<int64_t>(d);
  std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) { return m.strides[a] > m.strides[b]; });
  int64_t expect = 1;
  for (size_t k = perm.size(); k-- > 0;) {
    const auto d = static_cast<size_t>(perm[k]);
    if (m.shape[d] != 1 && m.strides[d] != expect)
      throw std::runtime_error(op +
                               " writes a tensor that is not dense in memory; kiln cannot draw its random numbers "
                               "in the order the in-place op draws them");
    expect *= m.shape[d];
  }
  return perm;
}

ir::TensorMeta permuted(const ir::TensorMeta& m, const std::vector<int64_t>& perm) {
  ir::TensorMeta p = m;
  for (size_t k = 0; k < perm.size(); ++k) {
    p.shape[k] = m.shape[static_cast<size_t>(perm[k])];
    p.strides[k] = m.strides[static_cast<size_t>(perm[k])];
  }
  return p;
}

struct Functionalizer {
  const ir::Graph& g;
  ir::Graph out;

  struct ViewSource {
    int32_t node = -1;  // raw node that made the value (a view op), -1: base-like
    int32_t output = 0;
    ir::ValueId parent = ir::kNoValue;
  };
  std::vector<ir::ValueId> val;  // raw value -> new value
  std::vector<int64_t> ver;      // storage version `val` was computed at
  std::vector<ViewSource> view_src;
  std::unordered_map<int32_t, ir::ValueId> cur_base;  // storage -> new value of its content
  std::unordered_map<int32_t, int64_t> storage_version;
  std::unordered_map<int32_t, ir::ValueId> base_raw;  // storage -> a raw base-like value

  explicit Functionalizer(const ir::Graph& graph) : g(graph) {
    val.assign(g.values.size(), ir::kNoValue);
    ver.assign(g.values.size(), 0);
    view_src.assign(g.values.size(), {});
  }

  int32_t storage(ir::ValueId v) const { return g.value(v).storage; }

  ir::ValueId new_value_like(ir::ValueId raw) { return out.add_value(g.value(raw).meta); }

  // The dtypes node `n` of `out` returns, from the op's meta kernel; empty when it has none.
  std::vector<c10::ScalarType> meta_result_dtypes(const ir::Node& n) {
    std::vector<at::Tensor> env(out.values.size());
    for (auto v : ir::Graph::node_inputs(n)) {
      const auto& m = out.value(v).meta;
      env[static_cast<size_t>(v)] =
          at::empty_strided(m.shape, m.strides, at::TensorOptions().dtype(m.dtype).device(c10::kMeta));
    }
    try {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      // Results land past the graph's values; run-time scalars take their captured values.
      ir::Node sink = n;
      for (auto& a : sink.args) a.scalar_input = -1;
      std::vector<at::Tensor> env2 = env;
      env2.resize(out.values.size() + n.outputs.size());
      for (size_t k = 0; k < sink.outputs.size(); ++k)
        sink.outputs[k] =
            sink.outputs[k] == ir::kNoValue ? ir::kNoValue : static_cast<ir::ValueId>(out.values.size() + k);
      EagerExecutor::run_node(sink, env2);
      std::vector<c10::ScalarType> dtypes;
      for (size_t k = 0; k < sink.outputs.size(); ++k) {
        const auto v = sink.outputs[k];
        dtypes.push_back(v == ir::kNoValue || !env2[static_cast<size_t>(v)].defined()
                             ? out.value(n.outputs[k]).meta.dtype
                             : env2[static_cast<size_t>(v)].scalar_type());
      }
      return dtypes;
    } catch (const std::exception&) {
      return {};  // no meta kernel: trust the argument's dtype
    }
  }

  void define_base(ir::ValueId raw, ir::ValueId nv) {
    const int32_t s = storage(raw);
    val[raw] = nv;
    if (s < 0) return;
    cur_base[s] = nv;
    base_raw[s] = raw;
    ver[raw] = storage_version[s];
  }

  // The new value holding raw value `v`'s content now.
  ir::ValueId get(ir::ValueId v) {
    const int32_t s = storage(v);
    if (s < 0 || ver[v] == storage_version[s]) return val[v];
    const auto& src = view_src[v];
    if (src.node < 0) {
      val[v] = cur_base.at(s);
    } else {
      const auto parent = get(src.parent);
      ir::Node n = g.nodes[static_cast<size_t>(src.node)];
      map_args(n, src.parent, parent);
      for (auto& o : n.outputs)
        if (o != ir::kNoValue) o = new_value_like(o);
      val[v] = n.outputs[static_cast<size_t>(src.output)];
      out.add_node(std::move(n));
    }
    ver[v] = storage_version[s];
    return val[v];
  }

  // Maps a raw node's tensor arguments to current new values (`fixed` pinned to `fixed_new`).
  void map_args(ir::Node& n, ir::ValueId fixed = ir::kNoValue, ir::ValueId fixed_new = ir::kNoValue) {
    for (auto& a : n.args) {
      if (a.kind == ir::Arg::Kind::Tensor) a.value = a.value == fixed ? fixed_new : get(a.value);
      else if (a.kind == ir::Arg::Kind::TensorList)
        for (auto& v : a.values)
          if (v != ir::kNoValue) v = v == fixed ? fixed_new : get(v);
    }
  }

  void pure_node(int32_t index) {
    const ir::Node& raw = g.nodes[static_cast<size_t>(index)];
    ir::Node n = raw;
    map_args(n);
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const auto o = raw.outputs[k];
      if (o == ir::kNoValue) continue;
      n.outputs[k] = new_value_like(o);
    }
    const auto outs = n.outputs;
    out.add_node(std::move(n));
    for (size_t k = 0; k < outs.size(); ++k) {
      const auto o = raw.outputs[k];
      if (o == ir::kNoValue) continue;
      // A result in the storage of an argument is a view of that argument.
      ir::ValueId parent = ir::kNoValue;
      for (auto a : ir::Graph::node_inputs(raw))
        if (storage(a) >= 0 && storage(a) == storage(o)) {
          parent = a;
          break;
        }
      if (parent == ir::kNoValue) {
        define_base(o, outs[k]);
      } else {
        val[o] = outs[k];
        ver[o] = storage_version[storage(o)];
        view_src[o] = {index, static_cast<int32_t>(k), parent};
      }
    }
  }

  void mutating_node(int32_t index, const c10::FunctionSchema& schema) {
    const ir::Node& raw = g.nodes[static_cast<size_t>(index)];
    const auto& sargs = schema.arguments();
    const auto& srets = schema.returns();
    std::vector<size_t> written;  // argument indices
    for (size_t i = 0; i < sargs.size(); ++i) {
      const auto* ai = sargs[i].alias_info();
      if (!ai || !ai->isWrite()) continue;
      if (raw.args[i].kind == ir::Arg::Kind::TensorList)
        throw std::runtime_error(raw.op + " writes a Tensor[] argument; kiln cannot functionalize it yet");
      if (raw.args[i].kind == ir::Arg::Kind::Tensor) written.push_back(i);
    }
    // Which results alias a written argument, and which are new.
    std::vector<int> ret_alias(srets.size(), -1);
    size_t kept = 0;
    for (size_t r = 0; r < srets.size(); ++r) {
      const auto* ai = srets[r].alias_info();
      if (ai && ai->isWrite())
        for (size_t i = 0; i < sargs.size(); ++i)
          if (sargs[i].alias_info() && sargs[i].alias_info()->beforeSets() == ai->beforeSets())
            ret_alias[r] = static_cast<int>(i);
      if (ret_alias[r] < 0) ++kept;
    }
    if (raw.returns_list)
      throw std::runtime_error(raw.op + " returns Tensor[] and writes its arguments; kiln cannot functionalize it yet");
    const auto fv = functional_variant(raw.op, schema, written.size(), kept);
    if (!fv.schema) throw std::runtime_error("no functional variant of " + raw.op + " (it writes its arguments)");

    ir::Node n;
    n.op = fv.op;
    n.phase = raw.phase;
    for (const auto& fa : fv.schema->arguments()) {
      size_t i = 0;
      while (i < sargs.size() && sargs[i].name() != fa.name()) ++i;
      if (i == sargs.size()) {
        n.args.push_back(ir::Arg::none());  // a defaulted argument the mutable op lacks
        continue;
      }
      n.args.push_back(raw.args[i]);
    }
    map_args(n);
    // A random op writing a non-contiguous tensor: draw on it permuted into memory order.
    std::vector<int64_t> perm;
    if (op_info(raw.op).nondeterministic && written.size() == 1 && kept == 0)
      perm = memory_order(g.value(raw.args[written[0]].value).meta, raw.op);
    if (!perm.empty()) {
      const auto& fargs = fv.schema->arguments();
      size_t self = 0;
      while (self < fargs.size() && fargs[self].name() != sargs[written[0]].name()) ++self;
      for (size_t k = 0; k < n.args.size(); ++k)
        if (n.args[k].kind == ir::Arg::Kind::Tensor && k != self)
          throw std::runtime_error(raw.op +
                                   " with a tensor argument writes a non-contiguous tensor; kiln cannot draw "
                                   "its random numbers in the order the in-place op draws them");
      if (self == fargs.size())
        throw std::logic_error("the functional form of " + raw.op + " has no '" + sargs[written[0]].name() + "'");
      ir::Node pn;
      pn.op = "aten::permute";
      pn.phase = raw.phase;
      const auto in = n.args[self].value;
      pn.args = {ir::Arg::tensor(in), ir::Arg::int_list(perm)};
      pn.outputs = {out.add_value(permuted(out.value(in).meta, perm))};
      n.args[self] = ir::Arg::tensor(pn.outputs[0]);
      out.add_node(std::move(pn));
    }
    std::vector<ir::ValueId> kept_new;
    for (size_t r = 0; r < srets.size(); ++r)
      if (ret_alias[r] < 0) {
        const auto o = raw.outputs[r];
        const auto nv = o == ir::kNoValue ? ir::kNoValue : new_value_like(o);
        n.outputs.push_back(nv);
        kept_new.push_back(nv);
      }
    std::vector<ir::ValueId> written_new;
    for (auto i : written) {
      const auto nv = new_value_like(raw.args[i].value);
      n.outputs.push_back(nv);
      written_new.push_back(nv);
    }
    // An in-place op keeps its argument's dtype (bf16 += f32 stays bf16); its functional variant
    // follows type promotion (bf16 + f32 is f32). Ask the meta kernels what the variant returns,
    // and cast back where the two differ.
    std::vector<std::pair<size_t, c10::ScalarType>> promoted;  // output index, dtype the op makes
    const size_t first_written_out = n.outputs.size() - written.size();
    if (auto dtypes = meta_result_dtypes(n); dtypes.size() == n.outputs.size())
      for (size_t w = 0; w < written.size(); ++w) {
        const size_t k = first_written_out + w;
        if (n.outputs[k] != ir::kNoValue && dtypes[k] != out.value(n.outputs[k]).meta.dtype) {
          auto m = out.value(n.outputs[k]).meta;
          m.dtype = dtypes[k];
          n.outputs[k] = out.add_value(m);
          promoted.emplace_back(k, dtypes[k]);
        }
      }
    std::vector<ir::ValueId> promoted_values;
    for (auto [k, dt] : promoted) promoted_values.push_back(n.outputs[k]);
    const ir::Phase phase = n.phase;
    if (!perm.empty()) {
      // The variant's result is the permuted, contiguous tensor; permuting it back gives the
      // written tensor's own layout.
      std::vector<int64_t> inverse(perm.size());
      for (size_t k = 0; k < perm.size(); ++k) inverse[static_cast<size_t>(perm[k])] = static_cast<int64_t>(k);
      auto cm = permuted(out.value(written_new[0]).meta, perm);
      int64_t stride = 1;
      for (size_t k = cm.shape.size(); k-- > 0;) {
        cm.strides[k] = stride;
        stride *= cm.shape[k];
      }
      const auto drawn = out.add_value(cm);
      n.outputs.back() = drawn;
      out.add_node(std::move(n));
      ir::Node back;
      back.op = "aten::permute";
      back.phase = phase;
      back.args = {ir::Arg::tensor(drawn), ir::Arg::int_list(inverse)};
      back.outputs = {written_new[0]};
      out.add_node(std::move(back));
    } else {
      out.add_node(std::move(n));
    }
    for (size_t p = 0; p < promoted.size(); ++p) {
      const size_t w = promoted[p].first - first_written_out;
      ir::Node cast;
      cast.op = "aten::_to_copy";
      cast.phase = phase;
      cast.args = {ir::Arg::tensor(promoted_values[p]),
                   ir::Arg::scalar_type(out.value(written_new[w]).meta.dtype),
                   ir::Arg::none(),
                   ir::Arg::none(),
                   ir::Arg::none(),
                   ir::Arg::boolean(false),
                   ir::Arg::none()};
      cast.outputs = {written_new[w]};
      out.add_node(std::move(cast));
    }

    // The new results define new storages.
    size_t kk = 0;
    for (size_t r = 0; r < srets.size(); ++r)
      if (ret_alias[r] < 0) {
        if (raw.outputs[r] != ir::kNoValue) define_base(raw.outputs[r], kept_new[kk]);
        ++kk;
      }
    // Each write updates its storage.
    for (size_t w = 0; w < written.size(); ++w) {
      const auto m = raw.args[written[w]].value;
      write(m, written_new[w]);
      for (size_t r = 0; r < srets.size(); ++r)
        if (ret_alias[r] == static_cast<int>(written[w]) && raw.outputs[r] != ir::kNoValue) {
          const auto o = raw.outputs[r];
          val[o] = written_new[w];
          ver[o] = storage_version[storage(o)];
          view_src[o] = view_src[m];
        }
    }
  }

  // An op that writes arguments its schema does not mark. native_batch_norm has a functional
  // variant; the others run on fresh copies of what they write, which become the new values.
  void hidden_write_node(int32_t index, const std::vector<size_t>& written) {
    const ir::Node& raw = g.nodes[static_cast<size_t>(index)];
    if (raw.op == "aten::native_batch_norm" && written.size() == 2) {
      ir::Node n = raw;
      n.op = "aten::_native_batch_norm_legit_functional";
      map_args(n);
      for (auto& o : n.outputs) o = o == ir::kNoValue ? o : new_value_like(o);
      const auto kept = n.outputs;
      std::vector<ir::ValueId> fresh;
      for (auto i : written) fresh.push_back(new_value_like(raw.args[i].value));
      for (auto v : fresh) n.outputs.push_back(v);
      out.add_node(std::move(n));
      for (size_t k = 0; k < kept.size(); ++k)
        if (raw.outputs[k] != ir::kNoValue) define_base(raw.outputs[k], kept[k]);
      for (size_t w = 0; w < written.size(); ++w) write(raw.args[written[w]].value, fresh[w]);
      return;
    }
    ir::Node n = raw;
    map_args(n);
    std::vector<ir::ValueId> copies;
    for (auto i : written) {
      ir::Node c;
      c.op = "aten::clone";
      c.phase = raw.phase;
      c.args = {ir::Arg::tensor(n.args[i].value), ir::Arg::none()};
      const auto cv = new_value_like(raw.args[i].value);
      c.outputs = {cv};
      out.add_node(std::move(c));
      n.args[i].value = cv;
      copies.push_back(cv);
    }
    for (auto& o : n.outputs) o = o == ir::kNoValue ? o : new_value_like(o);
    const auto kept = n.outputs;
    out.add_node(std::move(n));
    for (size_t k = 0; k < kept.size(); ++k)
      if (raw.outputs[k] != ir::kNoValue) define_base(raw.outputs[k], kept[k]);
    for (size_t w = 0; w < written.size(); ++w) write(raw.args[written[w]].value, copies[w]);
  }

  // Raw value `m` now holds new value `y`.
  void write(ir::ValueId m, ir::ValueId y) {
    const int32_t s = storage(m);
    if (view_src[m].node < 0) {
      cur_base[s] = y;
    } else {
      const auto base = cur_base.at(s);
      const auto& braw = g.value(base_raw.at(s)).meta;
      const auto& vm = g.value(m).meta;
      // The base's new value: the written view scattered into it, or, where the base is not
      // contiguous from its start, the written value permuted back when the view is the whole base
      // with its dims in another order (a transposed gradient written in place, as clipping under
      // autocast does).
      ir::Node n;
      n.phase = ir::Phase::Unknown;  // a write through a view, in no phase of its own
      if (braw.storage_offset == 0 && braw.is_contiguous()) {
        n.op = "aten::as_strided_scatter";
        n.args = {ir::Arg::tensor(base), ir::Arg::tensor(y), ir::Arg::int_list(vm.shape), ir::Arg::int_list(vm.strides),
                  ir::Arg::integer(vm.storage_offset)};
      } else if (const auto perm = permutation_onto(vm, braw); !perm.empty()) {
        n.op = "aten::permute";
        n.args = {ir::Arg::tensor(y), ir::Arg::int_list(perm)};
      } else {
        throw std::runtime_error(c10::str(
            "a write through a view (sizes ", vm.shape, ", strides ", vm.strides, ", offset ", vm.storage_offset,
            ") of a tensor that is not contiguous from its start (sizes ", braw.shape, ", strides ", braw.strides,
            ", offset ", braw.storage_offset, "); kiln cannot functionalize it yet"));
      }
      const auto nb = out.add_value(out.value(base).meta);
      n.outputs = {nb};
      out.add_node(std::move(n));
      cur_base[s] = nb;
    }
    ++storage_version[s];
    val[m] = y;
    ver[m] = storage_version[s];
  }

  ir::Graph run() {
    out.scalar_inputs = g.scalar_inputs;
    // Inputs may share memory (a batch and its targets as two shifted views of one token tensor)
    // when the step writes none of it: each is then read as it is.
    std::unordered_set<int32_t> written_storages;
    for (const auto& raw : g.nodes) {
      const auto* schema = find_schema(raw.op);
      if (!schema) continue;
      const auto& sargs = schema->arguments();
      for (size_t i = 0; i < sargs.size() && i < raw.args.size(); ++i)
        if (sargs[i].alias_info() && sargs[i].alias_info()->isWrite() && raw.args[i].kind == ir::Arg::Kind::Tensor &&
            raw.args[i].value != ir::kNoValue)
          written_storages.insert(storage(raw.args[i].value));
      for (size_t i : hidden_writes(raw))
        if (raw.args[i].value != ir::kNoValue) written_storages.insert(storage(raw.args[i].value));
    }
    for (const auto& in : g.inputs) {
      const auto nv = out.add_input(g.value(in.value).meta, in.role, in.name);
      const int32_t s = storage(in.value);
      if (s >= 0 && cur_base.count(s)) {
        if (written_storages.count(s))
          throw std::runtime_error("graph inputs '" + in.name +
                                   "' and another share memory that the step writes; kiln cannot functionalize that "
                                   "yet");
        val[in.value] = nv;
        ver[in.value] = storage_version[s];
        continue;
      }
      define_base(in.value, nv);
    }
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const auto& raw = g.nodes[i];
      const auto* schema = find_schema(raw.op);
      if (!schema) throw std::runtime_error("unknown op " + raw.op);
      if (writes_any(*schema)) mutating_node(static_cast<int32_t>(i), *schema);
      else if (auto hidden = hidden_writes(raw); !hidden.empty()) hidden_write_node(static_cast<int32_t>(i), hidden);
      else pure_node(static_cast<int32_t>(i));
    }
    for (const auto& o : g.outputs) {
      if (o.role == ir::OutputRole::WriteBack) continue;  // made again below, from what the step wrote
      out.outputs.push_back({get(o.value), o.role, o.target, o.name});
    }
    for (size_t i = 0; i < g.inputs.size(); ++i) {
      const auto v = g.inputs[i].value;
      const int32_t s = storage(v);
      if (s < 0 || storage_version[s] == 0) continue;
      out.outputs.push_back({get(v), ir::OutputRole::WriteBack, static_cast<int32_t>(i), g.inputs[i].name});
    }
    for (auto& v : out.values) v.storage = -1;
    out.verify();
    return std::move(out);
  }
};

}  // namespace

void functionalize(ir::Graph& graph) {
  // Already functional (no storage information): nothing to do.
  bool has_storage = false;
  for (const auto& v : graph.values) has_storage = has_storage || v.storage >= 0;
  if (!has_storage) return;
  Functionalizer f(graph);
  graph = f.run();
}

}  // namespace kiln
