// Claim cases: the plugin's claims name real nodes, do not change between identical calls, and
// every group the host forms from them compiles (or is declined with KILN_ERROR_UNIMPLEMENTED).
#include <gtest/gtest.h>

#include <set>

#include "harness.h"
#include "op_catalogue.h"

namespace kiln::conformance {
namespace {

// The graphs the claim cases look at: the sample chains and one graph per catalogue variant of
// a few families (one node each), on the case device when usable.
std::vector<SampleGraph> claim_graphs(bool one_per_op = false) {
  auto out = sample_graphs();
  std::set<std::string> ops;
  const c10::Device dev = reason_to_skip_execution().empty() ? case_device() : c10::Device(c10::kCPU);
  for (const char* fam : {"UnaryPointwise", "BinaryPointwise", "Reductions", "Softmax", "Matmul", "Layout"})
    for (const auto& v : op_catalogue(fam))
      if (!one_per_op || ops.insert(v.op).second) out.push_back({v.label(), build_graph(v, make_inputs(v, dev)), {}});
  return out;
}

TEST(Claim, ClaimsReferToRealNodes) {
  RawLibrary lib(settings().plugin_path);
  RawContext ctx(lib, {});
  ASSERT_TRUE(ctx.ok()) << ctx.error();
  size_t graphs = 0, claimed = 0, nodes = 0;
  for (const auto& s : claim_graphs()) {
    GraphView view(s.graph);
    std::vector<int64_t> buf(view.view().num_nodes + 1, -7);
    progress("claim " + s.label);
    KilnPluginClaimArgs a{};
    a.struct_size = KILN_PLUGIN_CLAIM_ARGS_STRUCT_SIZE;
    a.plugin_ctx = ctx.api()->plugin_ctx;
    a.graph = &view.view();
    a.claimed_nodes = buf.data();
    auto st = ctx.status_of(ctx.api()->claim(&a));
    const size_t n = a.num_claimed;
    if (!st.ok) {
      EXPECT_FALSE(st.message.empty()) << s.label << ": claim failed without a message";
      continue;
    }
    ++graphs;
    nodes += view.view().num_nodes;
    ASSERT_LE(n, view.view().num_nodes) << s.label << ": claimed " << n << " nodes of " << view.view().num_nodes;
    EXPECT_EQ(buf[view.view().num_nodes], -7)
        << s.label << ": wrote past the claimed_nodes buffer (capacity num_nodes)";
    std::set<int64_t> seen;
    for (size_t i = 0; i < n; ++i) {
      EXPECT_TRUE(buf[i] >= 0 && static_cast<size_t>(buf[i]) < view.view().num_nodes)
          << s.label << ": claimed node " << buf[i] << ", which does not exist";
      EXPECT_TRUE(seen.insert(buf[i]).second) << s.label << ": claimed node " << buf[i] << " twice";
    }
    claimed += n;
  }
  note("claims over " + std::to_string(graphs) + " graphs: " + std::to_string(claimed) + " of " +
       std::to_string(nodes) + " nodes, all in range and distinct");
}

TEST(Claim, ClaimsAreStableAcrossIdenticalCalls) {
  auto p = loaded_plugin();
  size_t graphs = 0;
  for (const auto& s : claim_graphs()) {
    std::vector<int64_t> a, b, c;
    try {
      GraphView v1(s.graph);
      a = p->claim(v1.view());
      b = p->claim(v1.view());
      GraphView v2(s.graph);  // a fresh, identical view: other addresses, same graph
      c = p->claim(v2.view());
    } catch (const PluginError& e) {
      EXPECT_FALSE(std::string(e.what()).empty()) << s.label;
      continue;
    }
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    std::sort(c.begin(), c.end());
    EXPECT_EQ(a, b) << s.label << ": the same view claimed twice gave different claims";
    EXPECT_EQ(a, c) << s.label << ": an identical view gave different claims";
    ++graphs;
  }
  note(std::to_string(graphs) + " graphs claimed three times each: identical");
}

TEST(Claim, PartitionsFormedFromClaimsCompile) {
  if (!availability().available) GTEST_SKIP() << "the plugin is unavailable here: " << availability().reason;
  auto p = loaded_plugin();
  size_t groups = 0, compiled = 0, declined = 0;
  // One graph per op (the numeric cases compile every shape): compiling is what costs here.
  const auto graphs = claim_graphs(true);
  for (const auto& s : graphs) {
    std::vector<int64_t> claims;
    {
      GraphView v(s.graph);
      claims = p->claim(v.view());
    }
    for (const auto& pg : groups_of(s.graph, claims)) {
      ++groups;
      GraphView sub(s.graph, pg.nodes, pg.inputs, pg.outputs);
      progress("compile a group of " + std::to_string(pg.nodes.size()) + " nodes of " + s.label);
      try {
        auto exe = p->compile(sub.view(), KILN_MODE_DEFAULT);
        EXPECT_NE(exe, nullptr);
        ++compiled;
      } catch (const PluginError& e) {
        if (e.code() == KILN_ERROR_UNIMPLEMENTED) {
          ++declined;
          continue;
        }
        ADD_FAILURE() << s.label << ": a group of " << pg.nodes.size() << " claimed nodes failed to compile ("
                      << error_code_name(e.code()) << "): " << e.what()
                      << " — claim only what compiles, or decline with KILN_ERROR_UNIMPLEMENTED";
      }
    }
  }
  if (groups == 0) GTEST_SKIP() << "the plugin claims no node of the " << graphs.size() << " claim graphs";
  note(std::to_string(groups) + " groups: " + std::to_string(compiled) + " compiled, " + std::to_string(declined) +
       " declined as unimplemented");
}

}  // namespace
}  // namespace kiln::conformance
