// Partitioning: claims are checked, groups are convex and connected, the run order is valid, and
// the C graph view says what the IR says.
#include <random>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "kiln/internal/ir_text.h"
#include "kiln/internal/partition.h"

using namespace kiln;

namespace {

// All nodes reachable from node `from` (not including it).
std::vector<char> descendants(const ir::Graph& g, int32_t from) {
  std::vector<char> reach(g.nodes.size(), 0);
  std::vector<char> live(g.values.size(), 0);
  for (auto v : g.nodes[from].outputs) live[v] = 1;
  for (size_t i = from + 1; i < g.nodes.size(); ++i)
    for (auto v : ir::Graph::node_inputs(g.nodes[i]))
      if (live[v]) {
        reach[i] = 1;
        for (auto o : g.nodes[i].outputs) live[o] = 1;
        break;
      }
  return reach;
}

void check_partition(const ir::Graph& g, const Partition& p, const std::vector<int64_t>& claimed) {
  std::set<int64_t> claimed_set(claimed.begin(), claimed.end());
  // Every claimed node is in exactly one group; no unclaimed node is.
  for (size_t i = 0; i < g.nodes.size(); ++i) EXPECT_EQ(p.group_of[i] >= 0, claimed_set.count(i) > 0) << i;
  // Convex: no node outside a group is both downstream and upstream of it.
  std::vector<std::vector<char>> desc(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) desc[i] = descendants(g, static_cast<int32_t>(i));
  for (size_t gi = 0; gi < p.groups.size(); ++gi) {
    const auto& nodes = p.groups[gi].nodes;
    for (size_t x = 0; x < g.nodes.size(); ++x) {
      if (p.group_of[x] == static_cast<int32_t>(gi)) continue;
      bool below = false, above = false;
      for (auto n : nodes) below = below || desc[n][x], above = above || desc[x][n];
      EXPECT_FALSE(below && above) << "node " << x << " is inside a path that leaves group " << gi;
    }
  }
  // The order runs every unit once, after everything it reads.
  std::vector<char> done(g.values.size(), 0);
  for (const auto& in : g.inputs) done[in.value] = 1;
  size_t eager_seen = 0;
  std::set<int32_t> groups_seen;
  for (auto u : p.order) {
    std::vector<int32_t> nodes;
    if (u >= 0) nodes = {u}, ++eager_seen;
    else nodes = p.groups[-u - 1].nodes, groups_seen.insert(-u - 1);
    for (auto n : nodes)
      for (auto v : ir::Graph::node_inputs(g.nodes[n])) {
        const int32_t prod = g.value(v).producer;
        const bool inside = u < 0 && prod >= 0 && p.group_of[prod] == -u - 1;
        EXPECT_TRUE(done[v] || inside) << "unit " << u << " reads %" << v << " before it is computed";
      }
    for (auto n : nodes)
      for (auto v : g.nodes[n].outputs) done[v] = 1;
  }
  EXPECT_EQ(eager_seen + claimed.size(), g.nodes.size());
  EXPECT_EQ(groups_seen.size(), p.groups.size());
}

// A random DAG of 2 to 31 adds over `inputs` graph inputs (each node reads two earlier values),
// its last value the output; `claim(i)` is called for each node i as it is added.
template <class Claim>
ir::Graph random_graph(std::mt19937& rng, int inputs, Claim&& claim) {
  ir::Graph g;
  ir::TensorMeta m;
  m.shape = {2};
  m.strides = {1};
  std::vector<ir::ValueId> avail;
  for (int k = 0; k < inputs; ++k)
    avail.push_back(g.add_input(m, k == 0 ? ir::InputRole::UserInput : ir::InputRole::Parameter, k == 0 ? "x" : "w"));
  const int n = 2 + static_cast<int>(rng() % 30);
  for (int i = 0; i < n; ++i) {
    ir::Node node;
    node.op = "aten::add.Tensor";
    node.args = {ir::Arg::tensor(avail[rng() % avail.size()]), ir::Arg::tensor(avail[rng() % avail.size()]),
                 ir::Arg::integer(1)};
    node.outputs = {g.add_value(m)};
    avail.push_back(node.outputs[0]);
    g.add_node(node);
    claim(i);
  }
  g.outputs.push_back({avail.back(), ir::OutputRole::Result, -1, "y"});
  return g;
}

ir::Graph chain_with_escape() {
  // n0 claimed -> n1 eager -> n2 claimed, and n2 also reads n0 directly: merging n2 into n0's group
  // would need n1 in the middle of the group.
  return ir::parse(R"(graph {
  input %0 : f32[4]{1} input "x"
  %1 : f32[4]{1} = aten::relu(%0)
  %2 : f32[4]{1} = aten::sin(%1)
  %3 : f32[4]{1} = aten::add.Tensor(%1, %2, scalar(1))
  %4 : f32[4]{1} = aten::neg(%3)
  output %4 result "y"
}
)");
}

}  // namespace

TEST(Partition, DoesNotMergeAcrossAnEagerNode) {
  ir::Graph g = chain_with_escape();
  Partition p = partition_graph(g, {0, 2, 3});
  ASSERT_EQ(p.groups.size(), 2u);
  EXPECT_EQ(p.groups[0].nodes, (std::vector<int32_t>{0}));
  EXPECT_EQ(p.groups[1].nodes, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(p.groups[0].inputs, (std::vector<ir::ValueId>{0}));
  EXPECT_EQ(p.groups[0].outputs, (std::vector<ir::ValueId>{1}));
  EXPECT_EQ(p.groups[1].inputs, (std::vector<ir::ValueId>{1, 2}));
  EXPECT_EQ(p.groups[1].outputs, (std::vector<ir::ValueId>{4}));
  EXPECT_EQ(p.order, (std::vector<int32_t>{-1, 1, -2}));
  check_partition(g, p, {0, 2, 3});
}

TEST(Partition, ChainOfClaimedNodesIsOneGroup) {
  ir::Graph g = chain_with_escape();
  Partition p = partition_graph(g, {0, 1, 2, 3});
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_EQ(p.groups[0].nodes, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(p.groups[0].inputs, (std::vector<ir::ValueId>{0}));
  EXPECT_EQ(p.groups[0].outputs, (std::vector<ir::ValueId>{4}));
  EXPECT_EQ(p.order, (std::vector<int32_t>{-1}));
}

TEST(Partition, NothingClaimedRunsEverythingEagerly) {
  ir::Graph g = chain_with_escape();
  Partition p = partition_graph(g, {});
  EXPECT_TRUE(p.groups.empty());
  EXPECT_EQ(p.order, (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(Partition, ValidateClaimsNamesThePluginAndTheNode) {
  ir::Graph g = chain_with_escape();
  try {
    validate_claims(g, {0, 7}, "custom");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "plugin 'custom' claimed node 7, but the graph has 4 nodes");
  }
  try {
    validate_claims(g, {1, 1}, "custom");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "plugin 'custom' claimed node 1 twice");
  }
  EXPECT_NO_THROW(validate_claims(g, {3, 0}, "custom"));
}

// A view whose result leaves its group runs eagerly, as metadata over the group's output of its
// base, instead of being a group output the backend copies into memory of its own; chains of such
// views go out one after the other, and a group of nothing but views is no group. A view read
// inside its group stays, and so does a slice (its base may be far larger than it).
TEST(Partition, ViewsAtAGroupsEndRunEagerly) {
  const ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[4,6]{6,1} input "x"
  %1 : f32[4,6]{6,1} = aten::relu(%0)
  %2 : f32[24]{1} = aten::view(%1, i[24])
  %3 : f32[6,4]{1,6} = aten::permute(%1, i[1, 0])
  %4 : f32[6,4]{1,6} = aten::neg(%3)
  %5 : f32[4,6]{1,4} = aten::t(%4)
  %6 : f32[2,6]{6,1} = aten::slice.Tensor(%1, 0, 0, 2, 1)
  %7 : f32[6,4]{1,6} = aten::permute(%0, i[1, 0])
  %8 : f32[24]{1} = aten::view(%7, i[24])
  %9 : f32[24]{1} = aten::sin(%2)
  output %5 result "a"
  output %6 result "b"
  output %8 result "c"
  output %9 result "d"
}
)");
  // Claimed: every node but the sin, which reads the view %2 from outside.
  const Partition p = partition_graph(g, {0, 1, 2, 3, 4, 5, 6, 7});
  ASSERT_EQ(p.groups.size(), 1u) << print_partition(g, p);
  // relu, the permute its neg reads, the neg and the slice; not the view (read by the sin, outside),
  // the t (an output), nor the permute-then-view of the input (all views).
  EXPECT_EQ(p.groups[0].nodes, (std::vector<int32_t>{0, 2, 3, 5}));
  EXPECT_EQ(p.groups[0].outputs, (std::vector<ir::ValueId>{1, 4, 6}));
  for (int32_t eager : {1, 4, 6, 7}) EXPECT_EQ(p.group_of[static_cast<size_t>(eager)], -1) << eager;
  EXPECT_EQ(p.views_left_eager, 4u);
  // The conformance suite keeps them with the plugin, to check its own views.
  const Partition all = partition_graph(g, {0, 1, 2, 3, 4, 5, 6, 7}, {}, false);
  size_t in_groups = 0;
  for (const auto& grp : all.groups) in_groups += grp.nodes.size();
  EXPECT_EQ(in_groups, 8u);
  EXPECT_EQ(all.views_left_eager, 0u);
}

// Random DAGs with random claims: groups are always convex and the order always valid.
TEST(Partition, RandomGraphsGiveConvexGroupsAndAValidOrder) {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> claimed;
    const ir::Graph g = random_graph(rng, 2, [&](int i) {
      if (rng() % 3) claimed.push_back(i);
    });
    Partition p = partition_graph(g, claimed);
    check_partition(g, p, claimed);
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << ir::print(g) << print_partition(g, p);
      return;
    }
  }
}

// With two claiming backends, groups are still convex, the order valid, and no group mixes the
// nodes of two backends.
TEST(Partition, GroupsOfTwoBackendsStayApartConvexAndOrdered) {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> claimed;
    std::vector<int32_t> by;
    const ir::Graph g = random_graph(rng, 1, [&](int i) {
      if (rng() % 4) {
        claimed.push_back(i);
        by.push_back(static_cast<int32_t>(rng() % 2));
      }
    });
    Partition p = partition_graph(g, claimed, by);
    check_partition(g, p, claimed);
    for (size_t k = 0; k < claimed.size(); ++k) {
      const int32_t grp = p.group_of[static_cast<size_t>(claimed[k])];
      ASSERT_GE(grp, 0);
      EXPECT_EQ(p.groups[static_cast<size_t>(grp)].backend, by[k]) << "node " << claimed[k];
    }
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << ir::print(g) << print_partition(g, p);
      return;
    }
  }
  // A chain a -> b -> a: the two nodes of backend 0 cannot share a group around backend 1's.
  const ir::Graph chain = ir::parse(R"(graph {
  input %0 : f32[4]{1} input "x"
  %1 : f32[4]{1} = aten::relu(%0)
  %2 : f32[4]{1} = aten::sin(%1)
  %3 : f32[4]{1} = aten::neg(%2)
  output %3 result "y"
}
)");
  const Partition p = partition_graph(chain, {0, 1, 2}, {0, 1, 0});
  ASSERT_EQ(p.groups.size(), 3u);
  EXPECT_EQ(p.order, (std::vector<int32_t>{-1, -2, -3}));
}

TEST(GraphView, DescribesValuesNodesAndArguments) {
  ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[2,3]{3,1} input "x"
  input %1 : bf16[3]{1} on cuda:0 param "b"
  %2 : f32[2,3]{3,1} = aten::add.Tensor(%0, %0, scalar(2.5))
  %3 : f32[3,2]{1,3} = aten::permute(%2, i[1, 0])
  output %3 result "y"
}
)");
  GraphView gv(g);
  const KilnGraphView& v = gv.view();
  EXPECT_EQ(v.struct_size, KILN_GRAPH_VIEW_STRUCT_SIZE);
  ASSERT_EQ(v.num_values, 4u);
  EXPECT_EQ(v.values[1]->dtype.code, kDLBfloat);
  EXPECT_EQ(v.values[1]->device.device_type, kDLCUDA);
  EXPECT_EQ(v.values[3]->strides[0], 1);
  EXPECT_EQ(v.values[3]->strides[1], 3);
  ASSERT_EQ(v.num_nodes, 2u);
  const KilnNode* add = v.nodes[0];
  EXPECT_STREQ(add->op, "aten::add.Tensor");
  EXPECT_STREQ(add->name, "aten::add");
  EXPECT_STREQ(add->overload, "Tensor");
  ASSERT_EQ(add->num_args, 3u);
  EXPECT_STREQ(add->args[0]->name, "self");
  EXPECT_STREQ(add->args[2]->name, "alpha");
  EXPECT_EQ(add->args[2]->tag, KILN_ARG_DOUBLE);
  EXPECT_DOUBLE_EQ(add->args[2]->d, 2.5);
  ASSERT_EQ(add->num_inputs, 2u);
  EXPECT_EQ(add->inputs[0], 0);
  EXPECT_EQ(add->outputs[0], 2);
  EXPECT_STREQ(v.nodes[1]->overload, "");
  EXPECT_EQ(v.nodes[1]->args[1]->tag, KILN_ARG_INT_LIST);
  EXPECT_EQ(v.nodes[1]->args[1]->len, 2u);
  ASSERT_EQ(v.num_outputs, 1u);
  EXPECT_EQ(v.outputs[0], 3);

  // A subgraph view has dense indices: inputs first, then results.
  GraphView sub(g, {1}, {2}, {3});
  EXPECT_EQ(sub.view().num_values, 2u);
  EXPECT_EQ(sub.view().values[0]->id, 2);
  EXPECT_EQ(sub.view().nodes[0]->inputs[0], 0);
  EXPECT_EQ(sub.view().nodes[0]->outputs[0], 1);
  EXPECT_EQ(sub.view().inputs[0], 0);
  EXPECT_EQ(sub.view().outputs[0], 1);
}

// An optimizer-style chain starts at graph inputs, so the first phase gives it its own group;
// the merge phase joins it to the group it meets when nothing else lies between them.
TEST(Partition, ChainsStartingAtInputsMergeWithTheGroupTheyMeet) {
  ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[4]{1} input "x"
  input %1 : f32[4]{1} state "m"
  %2 : f32[4]{1} = aten::relu(%0)
  %3 : f32[4]{1} = aten::mul.Tensor(%1, %1)
  %4 : f32[4]{1} = aten::add.Tensor(%3, %2, scalar(1))
  %5 : f32[4]{1} = aten::neg(%4)
  output %5 result "y"
}
)");
  Partition p = partition_graph(g, {0, 1, 2, 3});
  ASSERT_EQ(p.groups.size(), 1u) << print_partition(g, p);
  EXPECT_EQ(p.groups[0].nodes, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(p.groups[0].inputs, (std::vector<ir::ValueId>{0, 1}));
  check_partition(g, p, {0, 1, 2, 3});
  // With the add eager, nothing connects the groups directly: relu, mul and neg stay apart.
  Partition q = partition_graph(g, {0, 1, 3});
  EXPECT_EQ(q.groups.size(), 3u) << print_partition(g, q);
  check_partition(g, q, {0, 1, 3});
}

// Data parallelism: an all_reduce placed right after its bucket's gradients (overlap_collectives)
// runs as soon as the group making them has run. The group takes no later node, even one that
// could join it (convexity alone would let the whole backward be one group, and the all_reduce
// would wait for all of it); the two groups do not merge either; the wait runs last.
TEST(Partition, AnAllReduceSealsTheGroupsItReadsSoItOverlapsTheRest) {
  ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[4]{1} input "x"
  input %1 : f32[4]{1} param "w"
  %2 : f32[4]{1} = aten::mul.Tensor(%0, %1) backward
  %3 : f32[4]{1} = aten::div.Scalar(%2, scalar(2))
  %4 : f32[4]{1} = _c10d_functional::all_reduce(%3, "sum", "kiln.0")
  %5 : f32[4]{1} = aten::mul.Tensor(%2, %0) backward
  %6 : f32[4]{1} = aten::relu(%5) backward
  %7 : f32[4]{1} = _c10d_functional::wait_tensor(%4)
  output %7 result "g"
  output %6 result "dx"
}
)");
  Partition p = partition_graph(g, {0, 1, 3, 4});
  ASSERT_EQ(p.groups.size(), 2u);
  EXPECT_EQ(p.groups[0].nodes, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(p.groups[1].nodes, (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(p.order, (std::vector<int32_t>{-1, 2, -2, 5}));
  check_partition(g, p, {0, 1, 3, 4});
  // Without the collective the same claims make one group.
  ir::Graph plain = ir::parse(R"(graph {
  input %0 : f32[4]{1} input "x"
  input %1 : f32[4]{1} param "w"
  %2 : f32[4]{1} = aten::mul.Tensor(%0, %1) backward
  %3 : f32[4]{1} = aten::div.Scalar(%2, scalar(2))
  %4 : f32[4]{1} = aten::neg(%3)
  %5 : f32[4]{1} = aten::mul.Tensor(%2, %0) backward
  %6 : f32[4]{1} = aten::relu(%5) backward
  output %4 result "g"
  output %6 result "dx"
}
)");
  EXPECT_EQ(partition_graph(plain, {0, 1, 3, 4}).groups.size(), 1u);
}

// A step at another size partitions as it did (its numbers alone differ), so the plans of a
// dynamic step look their partition up by partition_key; anything the partition depends on
// changes the key.
TEST(Partition, TheKeyFollowsWhatThePartitionDependsOn) {
  auto graph_at = [](int rows, int slice_end) {
    const std::string r = std::to_string(rows), n = std::to_string(rows * 6), s = std::to_string(slice_end);
    return ir::parse("graph {\n  input %0 : f32[" + r + ",6]{6,1} input \"x\"\n  %1 : f32[" + r +
                     ",6]{6,1} = aten::relu(%0)\n  %2 : f32[" + n + "]{1} = aten::view(%1, i[" + n + "])\n  %3 : f32[" +
                     s + ",6]{6,1} = aten::slice.Tensor(%1, 0, 0, " + s + ", 1)\n  %4 : f32[" + n +
                     "]{1} = aten::sin(%2)\n  output %3 result \"a\"\n  output %4 result \"b\"\n}\n");
  };
  const std::vector<int64_t> claimed = {0, 1, 2};
  const ir::Graph a = graph_at(4, 2), b = graph_at(9, 2);
  ASSERT_EQ(partition_key(a, claimed), partition_key(b, claimed));
  const Partition pa = partition_graph(a, claimed), pb = partition_graph(b, claimed);
  ASSERT_EQ(pa.groups.size(), pb.groups.size());
  for (size_t k = 0; k < pa.groups.size(); ++k) {
    EXPECT_EQ(pa.groups[k].nodes, pb.groups[k].nodes);
    EXPECT_EQ(pa.groups[k].inputs, pb.groups[k].inputs);
    EXPECT_EQ(pa.groups[k].outputs, pb.groups[k].outputs);
  }
  EXPECT_EQ(pa.order, pb.order);
  EXPECT_EQ(pa.group_of, pb.group_of);
  // The slice now sees all of its base (2 rows of 2): a view the partition treats apart.
  const ir::Graph whole = graph_at(2, 2);
  EXPECT_NE(partition_key(whole, claimed), partition_key(a, claimed));
  EXPECT_NE(partition_graph(whole, claimed).views_left_eager, pa.views_left_eager);
  // Other claims, another backend, another setting, another output.
  EXPECT_NE(partition_key(a, {0, 1}), partition_key(a, claimed));
  EXPECT_NE(partition_key(a, claimed, {0, 1, 1}), partition_key(a, claimed, {0, 0, 0}));
  EXPECT_NE(partition_key(a, claimed, {}, false), partition_key(a, claimed));
  ir::Graph other = a;
  other.outputs.pop_back();
  EXPECT_NE(partition_key(other, claimed), partition_key(a, claimed));
}
