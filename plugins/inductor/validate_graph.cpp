#include "validate_graph.h"

#include <string>

namespace kiln::inductor {

void validate_graph(const plugin::Graph& g) {
  const KilnGraphView* raw = g.raw();
  const size_t nv = raw->num_values;
  auto bad = [](const std::string& what) {
    throw plugin::Error(KILN_ERROR_INVALID_ARGUMENT, "malformed graph: " + what);
  };
  auto in_range = [nv](int64_t v) { return v >= 0 && static_cast<uint64_t>(v) < nv; };
  if (nv && !raw->values) bad("values is NULL");
  if (raw->num_nodes && !raw->nodes) bad("nodes is NULL");
  if (raw->num_inputs && !raw->inputs) bad("inputs is NULL");
  if (raw->num_outputs && !raw->outputs) bad("outputs is NULL");
  for (size_t v = 0; v < nv; ++v) {
    const KilnValue* val = raw->values[v];
    if (!val) bad("value " + std::to_string(v) + " is NULL");
    if (val->ndim < 0 || val->ndim > 64) bad("value " + std::to_string(v) + " has rank " + std::to_string(val->ndim));
    if (val->ndim > 0 && !val->shape)
      bad("value " + std::to_string(v) + " of rank " + std::to_string(val->ndim) + " has no shape");
    for (int32_t d = 0; d < val->ndim; ++d)
      if (val->shape[d] < 0)
        bad("value " + std::to_string(v) + " has extent " + std::to_string(val->shape[d]) + " in dim " +
            std::to_string(d));
  }
  for (size_t i = 0; i < raw->num_inputs; ++i)
    if (!in_range(raw->inputs[i]))
      bad("graph input " + std::to_string(i) + " names value index " + std::to_string(raw->inputs[i]) + " (graph has " +
          std::to_string(nv) + " values)");
  for (size_t i = 0; i < raw->num_outputs; ++i)
    if (!in_range(raw->outputs[i]))
      bad("graph output " + std::to_string(i) + " names value index " + std::to_string(raw->outputs[i]) +
          " (graph has " + std::to_string(nv) + " values)");
  for (size_t ni = 0; ni < raw->num_nodes; ++ni) {
    const KilnNode* n = raw->nodes[ni];
    if (!n) bad("node " + std::to_string(ni) + " is NULL");
    const std::string where = "node " + std::to_string(ni) + " (" + (n->op ? n->op : "?") + ")";
    if (!n->op) bad(where + " has no op name");
    if (n->num_args && !n->args) bad(where + ": args is NULL");
    if (n->num_inputs && !n->inputs) bad(where + ": inputs is NULL");
    if (n->num_outputs && !n->outputs) bad(where + ": outputs is NULL");
    for (size_t a = 0; a < n->num_args; ++a) {
      const KilnArg* arg = n->args[a];
      if (!arg) bad(where + ": argument " + std::to_string(a) + " is NULL");
      const std::string an = where + ": argument " + std::to_string(a) + " '" + (arg->name ? arg->name : "") + "'";
      if (arg->tag == KILN_ARG_TENSOR && !in_range(arg->i))
        bad(an + " names value index " + std::to_string(arg->i) + " (graph has " + std::to_string(nv) + " values)");
      if (arg->tag == KILN_ARG_TENSOR_LIST || arg->tag == KILN_ARG_INT_LIST || arg->tag == KILN_ARG_BOOL_LIST) {
        if (arg->len && !arg->ints) bad(an + ": list of " + std::to_string(arg->len) + " without elements");
        if (arg->tag == KILN_ARG_TENSOR_LIST)
          for (size_t k = 0; k < arg->len; ++k)
            if (arg->ints[k] != -1 && !in_range(arg->ints[k]))
              bad(an + ": element " + std::to_string(k) + " names value index " + std::to_string(arg->ints[k]) +
                  " (graph has " + std::to_string(nv) + " values)");
      }
      if (arg->tag == KILN_ARG_DOUBLE_LIST && arg->len && !arg->doubles)
        bad(an + ": list of " + std::to_string(arg->len) + " without elements");
    }
    for (size_t k = 0; k < n->num_inputs; ++k)
      if (!in_range(n->inputs[k]))
        bad(where + ": input " + std::to_string(k) + " names value index " + std::to_string(n->inputs[k]) +
            " (graph has " + std::to_string(nv) + " values)");
    for (size_t k = 0; k < n->num_outputs; ++k)  // -1: a result nobody uses
      if (n->outputs[k] != -1 && !in_range(n->outputs[k]))
        bad(where + ": result " + std::to_string(k) + " names value index " + std::to_string(n->outputs[k]) +
            " (graph has " + std::to_string(nv) + " values)");
  }
}

}  // namespace kiln::inductor
