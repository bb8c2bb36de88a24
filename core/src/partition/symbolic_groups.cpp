// Compiled groups that serve every size (symbolic_groups.h).
#include "kiln/internal/symbolic_groups.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>
#include <unordered_map>

#include "kiln/internal/ir_text.h"
#include "kiln/internal/plugin_registry.h"
#include "kiln/log.h"

namespace kiln {

namespace {

constexpr size_t kEntriesPerKey = 8;
constexpr size_t kPartitionsKept = 4;  // groups whose texts differ only in numbers but do not unify

// The text of a graph with every run of digits blanked but a run-time scalar's number (`$12`,
// which tells one parameter's update from another's): groups that may be one group at two sizes
// share it (and the unification decides).
std::string without_numbers(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  auto digit = [&](size_t i) { return i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); };
  for (size_t i = 0; i < text.size(); ++i) {
    if (!digit(i)) {
      out += text[i];
      continue;
    }
    const bool scalar = i > 0 && text[i - 1] == '$';
    out += scalar ? text[i] : '#';
    for (; digit(i + 1); ++i)
      if (scalar) out += text[i + 1];
  }
  return out;
}

KilnSizeSiteKind abi_kind(ir::SizeSite::Kind k) {
  switch (k) {
    case ir::SizeSite::Kind::Shape: return KILN_SIZE_SITE_SHAPE;
    case ir::SizeSite::Kind::Stride: return KILN_SIZE_SITE_STRIDE;
    case ir::SizeSite::Kind::Offset: return KILN_SIZE_SITE_OFFSET;
    case ir::SizeSite::Kind::Int: return KILN_SIZE_SITE_INT;
    case ir::SizeSite::Kind::Ints: return KILN_SIZE_SITE_INTS;
    case ir::SizeSite::Kind::Double: return KILN_SIZE_SITE_DOUBLE;
  }
  return KILN_SIZE_SITE_SHAPE;
}

// "in.3" -> 3
int32_t input_number(const std::string& name) {
  if (name.rfind("in.", 0) != 0) throw std::logic_error("group graph input named " + name);
  return static_cast<int32_t>(std::stol(name.substr(3)));
}

// The graph with the capture values of its run-time scalars blanked: they are passed at every
// execute, and differ between plans made at different steps (a bias correction, a scheduled rate).
ir::Graph without_scalar_values(ir::Graph g) {
  for (auto& n : g.nodes)
    for (auto& a : n.args)
      if (a.scalar_input >= 0) a.i = 0, a.d = 0;
  return g;
}

}  // namespace

ir::Graph group_graph(const ir::Graph& g, const PartitionGroup& pg) {
  ir::Graph out;
  std::unordered_map<ir::ValueId, ir::ValueId> to;
  for (size_t k = 0; k < pg.inputs.size(); ++k) {
    const ir::ValueId v = pg.inputs[k];
    if (to.count(v)) continue;
    to[v] = out.add_input(g.value(v).meta, ir::InputRole::UserInput, "in." + std::to_string(k));
  }
  for (auto ni : pg.nodes)
    for (auto v : g.nodes[static_cast<size_t>(ni)].outputs)
      if (v != ir::kNoValue && !to.count(v)) to[v] = out.add_value(g.value(v).meta);
  auto map = [&](ir::ValueId v) { return v == ir::kNoValue ? ir::kNoValue : to.at(v); };
  for (auto ni : pg.nodes) {
    ir::Node n = g.nodes[static_cast<size_t>(ni)];
    for (auto& a : n.args) {
      if (a.kind == ir::Arg::Kind::Tensor) a.value = map(a.value);
      if (a.kind == ir::Arg::Kind::TensorList)
        for (auto& v : a.values) v = map(v);
    }
    for (auto& v : n.outputs) v = map(v);
    out.add_node(std::move(n));
  }
  out.scalar_inputs = g.scalar_inputs;  // the nodes' scalar_input numbers stay valid
  for (size_t k = 0; k < pg.outputs.size(); ++k)
    out.outputs.push_back(
        {map(pg.outputs[k]), ir::OutputRole::Result, static_cast<int32_t>(k), "out." + std::to_string(k)});
  return out;
}

std::vector<KilnSizeSymbol> abi_symbols(const ir::SymbolicStep& sym) {
  std::vector<KilnSizeSymbol> out;
  for (const auto& s : sym.symbols) out.push_back({input_number(s.input), s.dim});
  return out;
}

std::vector<KilnSizeSite> abi_sites(const ir::SymbolicStep& sym) {
  std::vector<KilnSizeSite> out;
  for (const auto& s : sym.sites) {
    if (s.expr.monomial.size() > 2) throw std::logic_error("a size expression of more than two factors");
    KilnSizeSite a{};
    a.kind = abi_kind(s.kind);
    a.at = s.at;
    a.arg = s.arg;
    a.elem = s.elem;
    a.num_factors = static_cast<int32_t>(s.expr.monomial.size());
    a.factors[0] = a.factors[1] = -1;
    for (size_t k = 0; k < s.expr.monomial.size(); ++k) a.factors[k] = s.expr.monomial[k];
    a.reciprocal = s.expr.reciprocal ? 1 : 0;
    a.num = s.expr.num;
    a.den = s.expr.den;
    a.constant = s.expr.constant;
    out.push_back(a);
  }
  return out;
}

SymbolicGroups::Decision SymbolicGroups::decide(const ir::Graph& graph, const PartitionGroup& group,
                                                const std::string& key_prefix) {
  Decision d;
  d.graph = group_graph(graph, group);
  // Compared and unified without the run-time scalars' capture values; the backend is handed the
  // graph with them, as any other compile.
  const ir::Graph plain = without_scalar_values(d.graph);
  const std::string text = ir::print(plain);
  d.key = key_prefix + "\n" + without_numbers(text);
  std::lock_guard<std::mutex> lock(mu_);
  auto& list = entries_[d.key];
  // A symbolic group that gives back this graph exactly serves it.
  for (auto& e : list) {
    if (!e.sym || !e.exe) continue;
    const auto sizes = e.sym->sizes_of(plain);
    if (!sizes) continue;
    try {
      if (ir::print(ir::specialise(*e.sym, *sizes)) != text) continue;
    } catch (const std::invalid_argument&) {
      continue;  // a symbol of 0 or 1, or a number not whole there
    }
    d.kind = Decision::Kind::reuse;
    d.exe = e.exe;
    d.symbols = abi_symbols(*e.sym);
    return d;
  }
  // The same group at another size than its first: unify, and offer the symbolic form.
  for (size_t i = 0; i < list.size(); ++i) {
    Entry& e = list[i];
    if (e.sym || e.per_shape || e.first_text == text) continue;
    // Only a group whose inputs changed size is this group at another size (groups of one
    // structure over other tensors, the updates of two parameters, share a key too).
    bool resized = e.first.inputs.size() == plain.inputs.size();
    bool differs = false;
    for (size_t k = 0; resized && k < plain.inputs.size(); ++k) {
      const auto& a = e.first.value(e.first.inputs[k].value).meta.shape;
      const auto& b = plain.value(plain.inputs[k].value).meta.shape;
      resized = a.size() == b.size();
      differs = differs || a != b;
    }
    if (!resized || !differs) continue;
    ir::UnifyResult u = ir::unify_captures(e.first, plain);
    if (!u.step) {
      log_debug("kiln: a compiled group at a new size is compiled for it alone (" + u.failure + ")");
      continue;
    }
    bool fits = u.step->symbols.size() <= 16;  // what an execute passes at most
    for (const auto& s : u.step->sites) fits = fits && s.expr.monomial.size() <= 2;
    if (!fits) continue;
    d.kind = Decision::Kind::compile_symbolic;
    d.sym = std::move(u.step);
    d.symbols = abi_symbols(*d.sym);
    d.entry = i;
    return d;
  }
  if (list.size() < kEntriesPerKey &&
      std::none_of(list.begin(), list.end(), [&](const Entry& e) { return e.first_text == text; })) {
    Entry e;
    e.first = plain;
    e.first_text = text;
    list.push_back(std::move(e));
  }
  return d;
}

void SymbolicGroups::record(Decision& d, std::shared_ptr<PluginExecutable> exe, bool accepted) {
  if (d.kind != Decision::Kind::compile_symbolic) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(d.key);
  if (it == entries_.end() || d.entry >= it->second.size()) return;
  Entry& e = it->second[d.entry];
  if (!exe) return;  // failed or declined: the next size may try again
  if (!accepted) {
    e.per_shape = true;
    return;
  }
  // The symbolic group keeps the graph at this size as its base: the view the backend was given.
  e.sym = std::move(d.sym);
  e.sym->graph = without_scalar_values(d.graph);
  e.sym->first_sizes = *e.sym->sizes_of(e.sym->graph);
  e.exe = std::move(exe);
}

std::shared_ptr<const Partition> SymbolicGroups::partition(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < partitions_.size(); ++i)
    if (partitions_[i].first == key) {
      std::rotate(partitions_.begin(), partitions_.begin() + static_cast<long>(i),
                  partitions_.begin() + static_cast<long>(i) + 1);
      return partitions_.front().second;
    }
  return nullptr;
}

void SymbolicGroups::keep_partition(std::string key, Partition partition) {
  std::lock_guard<std::mutex> lock(mu_);
  partitions_.insert(partitions_.begin(), {std::move(key), std::make_shared<const Partition>(std::move(partition))});
  if (partitions_.size() > kPartitionsKept) partitions_.pop_back();
}

}  // namespace kiln
