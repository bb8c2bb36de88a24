// Error cases: malformed graphs, unknown ops, bad options and wrong tensors at execute all come
// back as errors with a code and a message; never a crash, never a silent success.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "harness.h"
#include "op_catalogue.h"

namespace kiln::conformance {
namespace {

bool coded(const RawContext::Status& s) {
  return !s.ok && s.code >= KILN_ERROR_UNKNOWN && s.code <= KILN_ERROR_ABI_MISMATCH && !s.message.empty();
}

// The first group of `s` that the plugin claims, as a view; the whole graph when it claims none.
struct Target {
  std::unique_ptr<GraphView> view;
  PartitionGroup group;
  bool claimed = false;
};

Target target_of(const RawContext& ctx, const SampleGraph& s) {
  Target t;
  GraphView full(s.graph);
  std::vector<int64_t> claims;
  if (ctx.claim(&full.view(), &claims).ok) {
    auto groups = groups_of(s.graph, claims);
    if (!groups.empty()) {
      t.group = groups.front();
      t.claimed = true;
    }
  }
  if (!t.claimed) {
    for (size_t i = 0; i < s.graph.nodes.size(); ++i) t.group.nodes.push_back(static_cast<int32_t>(i));
    for (const auto& in : s.graph.inputs) t.group.inputs.push_back(in.value);
    for (const auto& o : s.graph.outputs) t.group.outputs.push_back(o.value);
  }
  t.view = std::make_unique<GraphView>(s.graph, t.group.nodes, t.group.inputs, t.group.outputs);
  return t;
}

TEST(Error, MalformedGraphsGiveErrors) {
  RawLibrary lib(settings().plugin_path);
  RawContext ctx(lib, {});
  ASSERT_TRUE(ctx.ok()) << ctx.error();
  struct Defect {
    const char* what;
    void (*apply)(KilnGraphView*);
  };
  const Defect defects[] = {
      {"a graph output value index past the last value",
       [](KilnGraphView* g) { const_cast<int64_t*>(g->outputs)[0] = static_cast<int64_t>(g->num_values) + 5; }},
      {"a graph input value index of -1",
       [](KilnGraphView* g) {
         if (g->num_inputs) const_cast<int64_t*>(g->inputs)[0] = -1;
       }},
      {"a tensor argument naming a value that does not exist",
       [](KilnGraphView* g) {
         for (size_t n = 0; n < g->num_nodes; ++n)
           for (size_t a = 0; a < g->nodes[n]->num_args; ++a)
             if (g->nodes[n]->args[a]->tag == KILN_ARG_TENSOR) {
               const_cast<KilnArg*>(g->nodes[n]->args[a])->i = static_cast<int64_t>(g->num_values) + 3;
               return;
             }
       }},
      {"a node result naming a value that does not exist",
       [](KilnGraphView* g) {
         const_cast<int64_t*>(g->nodes[g->num_nodes - 1]->outputs)[0] = static_cast<int64_t>(g->num_values) + 9;
       }},
  };
  size_t refused = 0;
  for (const auto& s : sample_graphs()) {
    Target t = target_of(ctx, s);
    for (const auto& d : defects) {
      Arena arena;
      auto* g = const_cast<KilnGraphView*>(copy_view(t.view->view(), arena, StructLayout::Exact));
      d.apply(g);
      progress(std::string("claim and compile ") + s.label + " with " + d.what);
      std::vector<int64_t> claims;
      auto cl = ctx.claim(g, &claims);
      if (!cl.ok) {
        EXPECT_TRUE(coded(cl)) << s.label << " with " << d.what << ": claim error without code or message";
      }
      for (auto c : claims) EXPECT_LT(static_cast<size_t>(c), g->num_nodes) << s.label << " with " << d.what;
      KilnExecutable* exe = nullptr;
      auto st = ctx.compile(g, KILN_MODE_DEFAULT, {}, &exe);
      EXPECT_FALSE(st.ok) << s.label << " with " << d.what << ": compiled without an error";
      if (st.ok) {
        ctx.destroy(exe);
        continue;
      }
      EXPECT_TRUE(coded(st)) << s.label << " with " << d.what << ": " << st.message;
      ++refused;
    }
  }
  note(std::to_string(refused) + " malformed graphs refused with coded errors");
}

TEST(Error, UnknownOpsAreNotClaimedAndDoNotCompile) {
  RawLibrary lib(settings().plugin_path);
  RawContext ctx(lib, {});
  ASSERT_TRUE(ctx.ok()) << ctx.error();
  // relu over a plain float32 tensor: what any pointwise backend takes, renamed.
  OpVariant v;
  for (const auto& c : op_catalogue("UnaryPointwise"))
    if (c.op == "aten::relu" && c.inputs[0].shape == std::vector<int64_t>{4, 5} &&
        c.inputs[0].dtype == c10::ScalarType::Float && c.inputs[0].layout == InputSpec::Layout::Contiguous) {
      v = c;
      break;
    }
  ASSERT_FALSE(v.op.empty());
  const c10::Device dev = reason_to_skip_execution().empty() ? case_device() : c10::Device(c10::kCPU);
  const ir::Graph graph = build_graph(v, make_inputs(v, dev));
  GraphView view(graph);
  const std::pair<const char*, std::pair<const char*, const char*>> unknown[] = {
      {"kiln_conformance::no_such_op", {"kiln_conformance::no_such_op", ""}},
      {"aten::relu.no_such_overload", {"aten::relu", "no_such_overload"}},
      {"aten::kiln_conformance_no_such_op", {"aten::kiln_conformance_no_such_op", ""}},
  };
  for (const auto& [op, parts] : unknown) {
    Arena arena;
    auto* g = const_cast<KilnGraphView*>(copy_view(view.view(), arena, StructLayout::Exact));
    auto* n = const_cast<KilnNode*>(g->nodes[0]);
    n->op = op;
    n->name = parts.first;
    n->overload = parts.second;
    progress(std::string("claim and compile ") + op);
    std::vector<int64_t> claims;
    auto cl = ctx.claim(g, &claims);
    if (!cl.ok) {
      EXPECT_TRUE(coded(cl)) << op << ": claim error without code or message";
    }
    EXPECT_TRUE(claims.empty()) << "claimed " << op << ", an op it cannot know";
    KilnExecutable* exe = nullptr;
    auto st = ctx.compile(g, KILN_MODE_DEFAULT, {}, &exe);
    EXPECT_FALSE(st.ok) << "compiled " << op;
    if (st.ok) {
      ctx.destroy(exe);
    } else {
      EXPECT_TRUE(coded(st)) << op << ": " << st.message;
    }
  }
  note("unknown ops and overloads: not claimed, compile refused");
}

TEST(Error, BadOptionsGiveErrors) {
  RawLibrary lib(settings().plugin_path);
  RawContext ctx(lib, {});
  ASSERT_TRUE(ctx.ok()) << ctx.error();
  const uint32_t modes = ctx.api()->descriptor->modes;
  size_t refused = 0;
  std::string codes, lenient;
  for (const auto& s : sample_graphs()) {
    Target t = target_of(ctx, s);
    // `required`: the header asks for an error; otherwise (modes the host never passes, as the
    // loader checks them against the descriptor) an acceptance is only noted.
    auto expect_refused = [&](const std::string& what, KilnMode mode, const std::map<std::string, std::string>& opts,
                              bool required) {
      KilnExecutable* exe = nullptr;
      progress("compile " + s.label + " with " + what);
      auto st = ctx.compile(&t.view->view(), mode, opts, &exe);
      if (required) {
        EXPECT_FALSE(st.ok) << s.label << ": compile accepted " << what;
      }
      if (st.ok) {
        if (!required && lenient.find(what) == std::string::npos) lenient += " " + what + ";";
        ctx.destroy(exe);
        return;
      }
      EXPECT_TRUE(coded(st)) << s.label << " with " << what << ": " << st.message;
      if (st.code != KILN_ERROR_INVALID_ARGUMENT && st.code != KILN_ERROR_UNIMPLEMENTED &&
          codes.find(what) == std::string::npos)
        codes += " " + what + " gave " + error_code_name(st.code) + " (expected invalid argument);";
      ++refused;
    };
    expect_refused("an unknown option", KILN_MODE_DEFAULT, {{"kiln_conformance_no_such_option", "1"}}, true);
    expect_refused("an unknown option with an empty value", KILN_MODE_DEFAULT,
                   {{"kiln_conformance_no_such_option", ""}}, true);
    expect_refused("mode 99", static_cast<KilnMode>(99), {}, false);
    for (KilnMode m : {KILN_MODE_REDUCE_OVERHEAD, KILN_MODE_MAX_AUTOTUNE, KILN_MODE_MAX_AUTOTUNE_NO_CUDAGRAPHS})
      if (!(modes & KILN_MODE_BIT(m)))
        expect_refused(std::string("mode ") + std::to_string(m) + " (not in its descriptor)", m, {}, false);
  }
  note(std::to_string(refused) + " compiles with bad options refused;" +
       (codes.empty() ? std::string(" all as invalid argument or unimplemented;") : codes) +
       (lenient.empty() ? std::string() : " accepted, as kiln's loader never passes them:" + lenient));
}

TEST(Error, WrongTensorsAtExecuteGiveErrors) {
  const std::string skip = reason_to_skip_execution();
  if (!skip.empty()) GTEST_SKIP() << skip;
  RawLibrary lib(settings().plugin_path);
  RawContext ctx(lib, {});
  ASSERT_TRUE(ctx.ok()) << ctx.error();
  // The first group of a sample graph (or of a simple catalogue op) that compiles.
  std::vector<SampleGraph> candidates = sample_graphs();
  for (const auto& v : op_catalogue("BinaryPointwise")) {
    if (candidates.size() > 8) break;
    candidates.push_back({v.label(), build_graph(v, make_inputs(v, case_device())), make_inputs(v, case_device())});
  }
  for (const auto& v : op_catalogue("UnaryPointwise")) {
    if (candidates.size() > 16) break;
    candidates.push_back({v.label(), build_graph(v, make_inputs(v, case_device())), make_inputs(v, case_device())});
  }
  for (const auto& s : candidates) {
    Target t = target_of(ctx, s);
    if (!t.claimed || t.group.inputs.empty() || t.group.outputs.empty()) continue;
    KilnExecutable* exe = nullptr;
    if (!ctx.compile(&t.view->view(), KILN_MODE_DEFAULT, {}, &exe).ok || !exe) continue;
    const auto env = eager_env(s.graph, s.inputs);
    std::vector<at::Tensor> ins, outs;
    for (auto v : t.group.inputs) ins.push_back(env[v].contiguous());
    for (auto v : t.group.outputs) outs.push_back(poisoned(s.graph.value(v).meta));
    auto dl = [](const std::vector<at::Tensor>& ts) {
      std::vector<DLTensor> d;
      for (const auto& x : ts) d.push_back(to_dl_tensor(x));
      return d;
    };
    size_t refused = 0;
    auto expect_refused = [&](const std::string& what, std::vector<DLTensor> in, std::vector<DLTensor> out) {
      progress("execute " + s.label + " with " + what);
      auto st = ctx.execute(exe, in, out);
      EXPECT_FALSE(st.ok) << s.label << ": execute accepted " << what;
      if (!st.ok) {
        EXPECT_TRUE(coded(st)) << s.label << " with " << what << ": " << st.message;
        ++refused;
      }
    };
    {
      auto in = dl(ins);
      in.pop_back();
      expect_refused("one input too few", in, dl(outs));
    }
    {
      auto out = dl(outs);
      out.pop_back();
      expect_refused("one output too few", dl(ins), out);
    }
    {
      auto in = dl(ins);
      in.push_back(in.front());
      expect_refused("one input too many", in, dl(outs));
    }
    {
      auto big = ins;
      std::vector<int64_t> shape = big[0].sizes().vec();
      shape.push_back(3);  // a larger tensor of another rank: reading it as the old shape stays in bounds
      big[0] = at::zeros(shape, big[0].options());
      expect_refused("an input of another shape", dl(big), dl(outs));
    }
    {
      auto other = ins;
      other[0] = ins[0].to(ins[0].scalar_type() == at::kDouble ? at::kFloat : at::kDouble);
      expect_refused("an input of another dtype", dl(other), dl(outs));
    }
    {
      auto big = outs;
      std::vector<int64_t> shape = big[0].sizes().vec();
      shape.push_back(3);
      big[0] = at::empty(shape, big[0].options());
      expect_refused("an output of another shape", dl(ins), dl(big));
    }
    ctx.destroy(exe);
    note(std::to_string(refused) + " wrong calls to a compiled " + s.label + " refused with coded errors");
    return;
  }
  GTEST_SKIP() << "the plugin compiled none of the " << candidates.size() << " candidate graphs";
}

}  // namespace
}  // namespace kiln::conformance
