// The plan stage as a user sees it: [debug] dump_dir gets every pass of plan_step in the order it
// ran, the partition and the plan; gradients are outputs that carry their parameter's index; an
// AdamW step is planned once (its bias corrections are run-time scalars of the first plan).
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include "kiln/compile.h"

namespace nn = torch::nn;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/kiln_plan_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    if (DIR* d = opendir(path.c_str())) {
      while (dirent* e = readdir(d))
        if (e->d_name[0] != '.') out.emplace_back(e->d_name);
      closedir(d);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  std::string read(const std::string& name) const {
    std::ifstream in(path + "/" + name);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
};

struct AdamWLoop {
  nn::Sequential model{nn::Linear(6, 5), nn::ReLU(), nn::Linear(5, 3)};
  torch::optim::AdamW opt{model->parameters(), torch::optim::AdamWOptions(1e-2)};
  kiln::CompiledStep step;
  explicit AdamWLoop(kiln::TrainingArguments args)
      : step(kiln::compile_step(
            [this](const std::vector<at::Tensor>& in) {
              opt.zero_grad();
              auto loss = nn::functional::cross_entropy(model->forward(in[0]), in[1]);
              loss.backward();
              opt.step();
              return std::vector<at::Tensor>{loss.detach()};
            },
            {{model.ptr()}, {&opt}}, std::move(args))) {}
  void run(int steps) {
    for (int i = 0; i < steps; ++i) step({at::randn({4, 6}), at::randint(0, 3, {4})});
  }
};

kiln::TrainingArguments eager_backend(const std::string& dump_dir) {
  kiln::TrainingArguments a;
  a.torch_compile = true;
  a.torch_compile_backend = "eager";
  a.debug.dump_dir = dump_dir;
  return a;
}

}  // namespace

TEST(PlanStages, DumpsEveryPassInTheOrderPlanStepRunsThem) {
  TempDir dir;
  auto args = eager_backend(dir.path);
  args.debug.lift_runtime_scalars = true;
  args.experimental.batch_optimizer = true;
  AdamWLoop loop(args);
  loop.run(4);
  ASSERT_EQ(loop.step.stats().compiled_steps, 2);
  EXPECT_EQ(dir.files(), (std::vector<std::string>{
                             "00-captured.kir", "01-functionalize.kir", "02-decompose.kir", "03-dce.kir", "04-cse.kir",
                             "05-constant_fold.kir", "06-dce_final.kir", "07-lift_runtime_scalars.kir",
                             "08-batch_optimizer.kir", "09-writebacks_in_place.kir", "10-plan.txt"}));
  // Lifting made the bias corrections graph inputs; batching made multi-tensor nodes; the planned
  // graph computes write-backs in place with out= variants.
  EXPECT_NE(dir.read("07-lift_runtime_scalars.kir").find(" scalar \"scalar.0."), std::string::npos);
  EXPECT_NE(dir.read("08-batch_optimizer.kir").find("aten::_foreach_"), std::string::npos);
  EXPECT_EQ(dir.read("06-dce_final.kir").find(".out("), std::string::npos);
  EXPECT_NE(dir.read("09-writebacks_in_place.kir").find(".out("), std::string::npos);
  const std::string plan = dir.read("10-plan.txt");
  EXPECT_NE(plan.find("backend none: every node on the eager executor"), std::string::npos) << plan;
  for (int p = 0; p < 4; ++p) EXPECT_NE(plan.find(" grad " + std::to_string(p) + "\n"), std::string::npos) << plan;
}

TEST(PlanStages, GradientsAreOutputsCarryingTheirParameterIndex) {
  AdamWLoop loop(eager_backend(""));
  loop.run(3);
  const kiln::ir::Graph* g = loop.step.compiled_graph();
  ASSERT_NE(g, nullptr);
  const auto params = loop.model->named_parameters(true);
  std::vector<int> seen(params.size(), 0);
  for (const auto& o : g->outputs) {
    if (o.role != kiln::ir::OutputRole::Gradient) continue;
    ASSERT_GE(o.target, 0);
    ASSERT_LT(static_cast<size_t>(o.target), params.size());
    ++seen[static_cast<size_t>(o.target)];
    EXPECT_EQ(o.name, "grad." + params[static_cast<size_t>(o.target)].key());
  }
  EXPECT_EQ(seen, std::vector<int>(params.size(), 1));
  // The gradients the compiled step left are the parameters' own, of the parameters' shapes.
  for (const auto& p : params) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_EQ(p.value().grad().sizes(), p.value().sizes()) << p.key();
  }
}

TEST(PlanStages, AnAdamWStepIsPlannedOnce) {
  AdamWLoop loop(eager_backend(""));
  loop.run(8);
  const auto& st = loop.step.stats();
  EXPECT_EQ(st.compiled_steps, 6);
  EXPECT_EQ(st.compiles, 1);
  EXPECT_EQ(st.rebuilds, 0) << "AdamW's bias corrections are found by the look-ahead right after the capture";
  const kiln::ir::Graph* g = loop.step.compiled_graph();
  ASSERT_NE(g, nullptr);
  EXPECT_GE(g->scalar_inputs.size(), 2u) << "the bias corrections are run-time scalars";
}
