// kiln IR: the text form round-trips (golden files), parse errors say where, verify() catches
// malformed graphs.
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <gtest/gtest.h>

#include "kiln/ir.h"
#include "kiln/internal/ir_text.h"

namespace fs = std::filesystem;
using namespace kiln::ir;

namespace {
std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string parse_error(const std::string& text) {
  try {
    parse(text);
  } catch (const ParseError& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

TEST(IrText, GoldenFilesRoundTripExactly) {
  int files = 0;
  for (const auto& entry : fs::directory_iterator(KILN_IR_GOLDEN_DIR)) {
    if (entry.path().extension() != ".kir") continue;
    ++files;
    const std::string text = read(entry.path());
    Graph g = parse(text);
    EXPECT_EQ(print(g), text) << entry.path();
  }
  EXPECT_GE(files, 2);
}

TEST(IrText, ParsedGoldenHasTheRightStructure) {
  Graph g = parse(read(fs::path(KILN_IR_GOLDEN_DIR) / "mlp_fragment.kir"));
  ASSERT_EQ(g.inputs.size(), 5u);
  EXPECT_EQ(g.inputs[0].role, InputRole::Parameter);
  EXPECT_EQ(g.inputs[4].role, InputRole::OptimizerState);
  ASSERT_EQ(g.nodes.size(), 8u);
  const Node& addmm = g.nodes[1];
  EXPECT_EQ(addmm.op, "aten::addmm");
  ASSERT_EQ(addmm.args.size(), 5u);
  EXPECT_EQ(addmm.args[0].kind, Arg::Kind::Tensor);
  EXPECT_EQ(addmm.args[0].value, 1);
  EXPECT_TRUE(addmm.args[3].is_scalar);
  EXPECT_EQ(addmm.args[3].kind, Arg::Kind::Int);
  EXPECT_EQ(g.nodes[4].outputs, (std::vector<ValueId>{9, 10}));
  EXPECT_EQ(g.value(10).producer, 4);
  EXPECT_EQ(g.value(10).producer_output, 1);
  EXPECT_EQ(g.value(5).meta.strides, (std::vector<int64_t>{1, 784}));
  EXPECT_FALSE(g.value(5).meta.is_contiguous());
  EXPECT_DOUBLE_EQ(g.nodes[6].args[1].d, 0.9);
  EXPECT_EQ(g.outputs[1].role, OutputRole::WriteBack);
  EXPECT_EQ(g.outputs[1].target, 0);
  EXPECT_EQ(g.nodes[5].phase, Phase::Backward);
}

TEST(IrText, EveryArgumentKindSurvives) {
  Graph g = parse(read(fs::path(KILN_IR_GOLDEN_DIR) / "every_argument_kind.kir"));
  const auto& m = g.value(0).meta;
  EXPECT_EQ(m.dtype, c10::ScalarType::BFloat16);
  EXPECT_EQ(m.storage_offset, 5);
  EXPECT_EQ(m.device, c10::Device("cuda:0"));
  EXPECT_TRUE(g.nodes[0].returns_list);
  const Node& fake = g.nodes[3];
  EXPECT_EQ(fake.args[0].values, (std::vector<ValueId>{2, kNoValue, 3}));
  EXPECT_TRUE(std::isnan(fake.args[1].doubles[5]));
  EXPECT_EQ(fake.args[3].s, "a \"quoted\" \\ string\n");
  EXPECT_EQ(fake.args[7].kind, Arg::Kind::Double);
  EXPECT_EQ(fake.args[6].kind, Arg::Kind::Int);
  EXPECT_TRUE(g.nodes[4].outputs.empty());
}

// A randomly built graph prints, parses and prints the same again, and the parsed graph equals
// the original field by field.
TEST(IrText, RandomGraphsRoundTrip) {
  std::mt19937_64 rng(std::random_device{}());
  auto rnd = [&](int n) { return static_cast<int>(rng() % n); };
  const c10::ScalarType types[] = {c10::ScalarType::Float, c10::ScalarType::BFloat16, c10::ScalarType::Long,
                                   c10::ScalarType::Bool};
  for (int trial = 0; trial < 50; ++trial) {
    Graph g;
    auto meta = [&] {
      TensorMeta m;
      m.dtype = types[rnd(4)];
      int rank = rnd(4);
      int64_t stride = 1;
      m.shape.resize(rank);
      m.strides.resize(rank);
      for (int d = rank - 1; d >= 0; --d)
        m.shape[d] = rnd(5), m.strides[d] = stride, stride *= std::max<int64_t>(1, m.shape[d]);
      m.storage_offset = rnd(3) == 0 ? rnd(100) : 0;
      if (rnd(3) == 0) m.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(rnd(2)));
      return m;
    };
    for (int i = 0; i < 1 + rnd(4); ++i) g.add_input(meta(), static_cast<InputRole>(rnd(6)), "in" + std::to_string(i));
    for (int i = 0; i < 1 + rnd(8); ++i) {
      Node n;
      n.op = "aten::op" + std::to_string(rnd(3)) + (rnd(2) ? ".Tensor" : "");
      for (int a = 0; a < rnd(5); ++a) {
        switch (rnd(6)) {
          case 0: n.args.push_back(Arg::tensor(rnd(static_cast<int>(g.values.size())))); break;
          case 1: n.args.push_back(Arg::integer(static_cast<int64_t>(rng()) >> rnd(60))); break;
          case 2: {
            Arg r = Arg::real(std::ldexp(static_cast<double>(rng() % 1000000) - 500000, rnd(40) - 20));
            r.is_scalar = rnd(2);
            n.args.push_back(r);
            break;
          }
          case 3: n.args.push_back(Arg::int_list({rnd(9), -rnd(9)})); break;
          case 4: n.args.push_back(Arg::boolean(rnd(2))); break;
          default: n.args.push_back(Arg::none());
        }
      }
      for (int o = 0; o < rnd(3); ++o) n.outputs.push_back(g.add_value(meta()));
      n.phase = rnd(2) ? Phase::Optimizer : Phase::Unknown;
      g.add_node(std::move(n));
    }
    g.outputs.push_back({static_cast<ValueId>(g.values.size() - 1), OutputRole::Result, -1, "out"});
    const std::string text = print(g);
    Graph back = parse(text);
    ASSERT_EQ(print(back), text);
    ASSERT_EQ(back.nodes.size(), g.nodes.size());
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      ASSERT_EQ(back.nodes[i].args.size(), g.nodes[i].args.size()) << text;
      for (size_t a = 0; a < g.nodes[i].args.size(); ++a) EXPECT_EQ(back.nodes[i].args[a], g.nodes[i].args[a]) << text;
    }
    for (size_t v = 0; v < g.values.size(); ++v) EXPECT_EQ(back.value(v).meta, g.value(v).meta) << text;
  }
}

TEST(IrText, ParseErrorsSayLineAndColumn) {
  EXPECT_EQ(parse_error("graph {\n  %0 : f33[2]{1} = aten::zeros(i[2])\n}\n"), "2:8: unknown dtype 'f33'");
  EXPECT_EQ(parse_error("graph {\n  %1 : f32[2]{1} = aten::relu(%0)\n}\n"),
            "4:1: kiln IR verify: node 0 (aten::relu) reads %0 before it is defined");
  EXPECT_EQ(parse_error("graph {\n  input %0 : f32[2]{1} param \"w\"\n  %0 : f32[2]{1} = aten::relu(%0)\n"),
            "3:3: value %0 is defined twice");
  EXPECT_EQ(parse_error("graph {\n  %0 : f32[2,3]{1} = aten::zeros(i[2])\n}"),
            "2:19: strides and shape have different ranks");
  EXPECT_EQ(parse_error("graph {\n  input %0 : f32[2]{1} weight \"w\"\n}"), "2:24: unknown input role 'weight'");
  EXPECT_EQ(parse_error("graph {\n  %0 : f32[]{} = relu()\n}"),
            "2:18: expected an operator name such as aten::add.Tensor");
  EXPECT_EQ(parse_error("graph {\n"), "2:1: unexpected end of text; expected '}'");
  // Found by the ir_text fuzzer: c10 keeps a device index in 8 bits, so "cuda:198" became cuda:-58,
  // which printed as text that did not parse back. A device must print as it is written.
  EXPECT_EQ(parse_error("graph {\n  input %0 : f32[2]{1} on cuda:198 input \"x\"\n}"), "2:35: bad device 'cuda:198'");
  EXPECT_EQ(parse_error("graph {\n  input %0 : f32[2]{1} on cuda:-58 input \"x\"\n}"), "2:35: bad device 'cuda:-58'");
  EXPECT_EQ(parse_error("graph {\n  input %0 : f32[2]{1} on cuda:01 input \"x\"\n}"), "2:34: bad device 'cuda:01'");
  // Also the fuzzer's: values are stored by id, so "%10000000" allocated a gigabyte. Ids stop at
  // a million.
  EXPECT_EQ(parse_error("graph {\n  input %10000000 : f32[2]{1} input \"x\"\n}"),
            "2:18: value id out of range (0 to 1048575)");
  EXPECT_EQ(print(parse("graph {\n  input %0 : f32[2]{1} on cuda:127 input \"x\"\n  output %0 result \"y\"\n}\n")),
            "graph {\n  input %0 : f32[2]{1} on cuda:127 input \"x\"\n  output %0 result \"y\"\n}\n");
}

TEST(IrVerify, RejectsUseBeforeDefinitionAndBadWriteBack) {
  Graph g;
  TensorMeta m;
  m.shape = {2};
  m.strides = {1};
  ValueId x = g.add_input(m, InputRole::Parameter, "w");
  ValueId y = g.add_value(m);
  Node n;
  n.op = "aten::neg";
  n.args = {Arg::tensor(y)};
  n.outputs = {g.add_value(m)};
  g.add_node(n);
  EXPECT_THROW(g.verify(), std::logic_error);
  g.nodes[0].args[0] = Arg::tensor(x);
  EXPECT_NO_THROW(g.verify());
  g.outputs.push_back({g.nodes[0].outputs[0], OutputRole::WriteBack, 3, "w"});
  try {
    g.verify();
    FAIL();
  } catch (const std::logic_error& e) {
    EXPECT_STREQ(e.what(), "kiln IR verify: write-back output 'w' targets input 3 out of range");
  }
}
