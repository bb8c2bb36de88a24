// `kiln bench --kernels`: the classification of kernel names, the per-step arithmetic over made-up
// profiles (no GPU needed), LibTorch's profiler around real CPU steps, and the command end to end.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <regex>
#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include "../cli_run.h"
#include "bench_kernels.h"

namespace {

using kiln::cli::classify_kernel;
using kiln::cli::KernelOrigin;
using kiln::cli::ProfileCapture;
using kiln::cli::ProfiledActivity;
using Json = nlohmann::json;
using kiln::json_text;

TEST(BenchKernels, GeneratedKernelsAreNamedKilnKAndANumber) {
  EXPECT_EQ(classify_kernel("kiln_k0"), KernelOrigin::Generated);
  EXPECT_EQ(classify_kernel("kiln_k12"), KernelOrigin::Generated);
  EXPECT_EQ(classify_kernel("kiln_k7_3"), KernelOrigin::Generated);  // one loop of a split kernel
  EXPECT_EQ(classify_kernel("kiln_h2"), KernelOrigin::Generated);    // small launches fused into one
  EXPECT_EQ(classify_kernel("kiln_hidden"), KernelOrigin::KilnRuntime);
  EXPECT_EQ(classify_kernel("kiln_set_scalars"), KernelOrigin::KilnRuntime);
  EXPECT_EQ(classify_kernel("kiln_strided_copy"), KernelOrigin::KilnRuntime);
  EXPECT_EQ(classify_kernel("kiln_kernel"), KernelOrigin::KilnRuntime);  // kiln_k, then no number
  EXPECT_EQ(classify_kernel("kiln_k"), KernelOrigin::KilnRuntime);
  EXPECT_EQ(classify_kernel("void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>(int)"),
            KernelOrigin::Library);
  EXPECT_EQ(classify_kernel("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32"), KernelOrigin::Library);
  EXPECT_EQ(classify_kernel("Memcpy DtoD (Device -> Device)"), KernelOrigin::Library);
  EXPECT_EQ(classify_kernel("my_kiln_k1"), KernelOrigin::Library);  // a prefix, not a substring
  EXPECT_EQ(classify_kernel(""), KernelOrigin::Library);
  EXPECT_STREQ(kiln::cli::origin_name(KernelOrigin::Generated), "generated");
  EXPECT_STREQ(kiln::cli::origin_name(KernelOrigin::KilnRuntime), "kiln_runtime");
  EXPECT_STREQ(kiln::cli::origin_name(KernelOrigin::Library), "library");
}

TEST(BenchKernels, LaunchCallsAreKernelOrGraphLaunches) {
  using kiln::cli::launch_kind;
  EXPECT_STREQ(launch_kind("cudaLaunchKernel"), "kernel");
  EXPECT_STREQ(launch_kind("cudaLaunchKernel_v7000"), "kernel");
  EXPECT_STREQ(launch_kind("cuLaunchKernel"), "kernel");  // kiln's NVRTC kernels, through the driver
  EXPECT_STREQ(launch_kind("cuLaunchKernelEx"), "kernel");
  EXPECT_STREQ(launch_kind("cudaLaunchKernelExC"), "kernel");
  EXPECT_STREQ(launch_kind("cudaGraphLaunch"), "graph");
  EXPECT_STREQ(launch_kind("cuGraphLaunch"), "graph");
  EXPECT_STREQ(launch_kind("cudaMemcpyAsync"), "");
  EXPECT_STREQ(launch_kind("cudaStreamSynchronize"), "");
  EXPECT_STREQ(launch_kind("cudaGraphInstantiate"), "");
}

ProfiledActivity act(const std::string& name, uint64_t start, uint64_t end, bool kernel = true, uint64_t thread = 0) {
  return ProfiledActivity{name, start, end, thread, kernel};
}

// Two profiled steps in [1000, 10000] after a lead-in step before it.
ProfileCapture two_steps() {
  ProfileCapture c;
  c.ok = true;
  c.steps = 2;
  c.total_steps = 3;
  c.window_start = 1000;
  c.window_end = 10000;
  c.device = {
      act("kiln_k0", 100, 300),  // the lead-in step, alike: outside the window
      act("ampere_sgemm", 300, 700),
      act("Memcpy DtoD (Device -> Device)", 700, 800, /*kernel=*/false),
      act("kiln_set_scalars", 800, 810),
      act("kiln_k0", 1100, 1300),       // step 1
      act("ampere_sgemm", 1200, 2000),  // overlaps kiln_k0 (another stream): busy counts it once
      act("Memcpy DtoD (Device -> Device)", 2000, 2100, /*kernel=*/false),
      act("kiln_set_scalars", 2100, 2110),
      act("kiln_k0", 5100, 5300),  // step 2
      act("ampere_sgemm", 5300, 6100),
      act("Memcpy DtoD (Device -> Device)", 6100, 6200, /*kernel=*/false),
      act("kiln_set_scalars", 6200, 6210),
  };
  c.launches = {act("cudaLaunchKernel", 150, 160, false), act("cudaGraphLaunch", 1010, 1050, false),
                act("cudaGraphLaunch", 5010, 5050, false), act("cuLaunchKernel", 5060, 5070, false),
                act("cudaMemcpyAsync", 5080, 5090, false)};
  return c;
}

TEST(BenchKernels, CudaSummaryCountsTheProfiledStepsOnly) {
  const auto s = kiln::cli::summarize_cuda(two_steps(), 8);
  ASSERT_TRUE(s.ok) << s.note;
  EXPECT_TRUE(s.windowed);
  EXPECT_TRUE(s.note.empty()) << s.note;
  EXPECT_EQ(s.steps, 2);
  EXPECT_DOUBLE_EQ(s.kernels_per_step, 3.0);  // kiln_k0, ampere_sgemm, kiln_set_scalars
  EXPECT_DOUBLE_EQ(s.copies_per_step, 1.0);
  EXPECT_DOUBLE_EQ(s.generated_per_step, 1.0);
  EXPECT_DOUBLE_EQ(s.kiln_runtime_per_step, 1.0);
  // Step 1 busy: [1100, 2110) = 1010 ns; step 2: [5100, 6210) = 1110 ns; per step 1.06 us.
  EXPECT_NEAR(s.busy_us_per_step, 1.06, 1e-9);
  // Kernel time per step: (200 + 800 + 10 + 200 + 800 + 10) / 2 ns = 1.01 us; generated 0.2 us.
  EXPECT_NEAR(s.kernel_us_per_step, 1.01, 1e-9);
  EXPECT_NEAR(s.generated_us_per_step, 0.2, 1e-9);
  EXPECT_NEAR(s.kiln_runtime_us_per_step, 0.01, 1e-9);
  EXPECT_NEAR(s.generated_share, 400.0 / 2020.0, 1e-12);
  EXPECT_DOUBLE_EQ(s.graph_launches_per_step, 1.0);
  EXPECT_DOUBLE_EQ(s.launch_calls_per_step, 0.5);  // one cuLaunchKernel in two steps; the lead-in's is out
  ASSERT_EQ(s.top.size(), 4u);
  EXPECT_EQ(s.top[0].name, "ampere_sgemm");
  EXPECT_NEAR(s.top[0].us_per_step, 0.8, 1e-9);
  EXPECT_DOUBLE_EQ(s.top[0].per_step, 1.0);
  EXPECT_EQ(s.top[1].name, "kiln_k0");
  EXPECT_EQ(s.top[1].origin, KernelOrigin::Generated);
  EXPECT_EQ(kiln::cli::summarize_cuda(two_steps(), 2).top.size(), 2u);
}

TEST(BenchKernels, IdleGapsAreSummedByThePairAroundThem) {
  auto c = two_steps();
  c.device.push_back(act("kiln_k1", 2150, 2200));  // step 1 only: 40 ns after kiln_set_scalars
  const auto s = kiln::cli::summarize_cuda(c, 8);
  ASSERT_TRUE(s.ok) << s.note;
  // In start order: step 1's activities touch (the overlapping sgemm ends last, at 2000), then 40 ns
  // to kiln_k1, then 2900 ns to step 2's kiln_k0; step 2's own activities touch.
  EXPECT_NEAR(s.idle_us_per_step, (40 + 2900) / 2e3, 1e-9);
  ASSERT_EQ(s.gaps.size(), 2u);
  EXPECT_EQ(s.gaps[0].before, "kiln_k1");
  EXPECT_EQ(s.gaps[0].after, "kiln_k0");
  EXPECT_NEAR(s.gaps[0].us_per_step, 1.45, 1e-9);
  EXPECT_DOUBLE_EQ(s.gaps[0].per_step, 0.5);
  EXPECT_EQ(s.gaps[1].before, "kiln_set_scalars");
  EXPECT_EQ(s.gaps[1].after, "kiln_k1");
  EXPECT_NEAR(s.gaps[1].us_per_step, 0.02, 1e-9);
  EXPECT_EQ(kiln::cli::summarize_cuda(c, 1).gaps.size(), 1u);
}

TEST(BenchKernels, WithoutARangeTheWholeSessionIsCountedAndSaidSo) {
  ProfileCapture c = two_steps();
  c.window_start = c.window_end = 0;
  const auto s = kiln::cli::summarize_cuda(c, 8);
  ASSERT_TRUE(s.ok);
  EXPECT_FALSE(s.windowed);
  EXPECT_EQ(s.steps, 3);
  EXPECT_DOUBLE_EQ(s.kernels_per_step, 3.0);
  EXPECT_NEAR(s.kernel_us_per_step, (610.0 + 2020.0) / 3 / 1e3, 1e-9);
  EXPECT_NE(s.note.find("whole profile"), std::string::npos) << s.note;

  // A range that holds nothing while the profile does (clocks apart): the same, with another note.
  c.window_start = 100000, c.window_end = 200000;
  const auto t = kiln::cli::summarize_cuda(c, 8);
  EXPECT_FALSE(t.windowed);
  EXPECT_DOUBLE_EQ(t.kernels_per_step, 3.0);
  EXPECT_NE(t.note.find("clocks"), std::string::npos) << t.note;
}

TEST(BenchKernels, ARangeThatHoldsLessThanItsShareIsNoted) {
  ProfileCapture c = two_steps();
  c.window_end = 5000;  // step 2's records fall outside: 4 of 12 inside, where 8 were due
  const auto s = kiln::cli::summarize_cuda(c, 8);
  EXPECT_TRUE(s.windowed);
  EXPECT_DOUBLE_EQ(s.kernels_per_step, 1.5);
  EXPECT_NE(s.note.find("4 of the profile's 12 records"), std::string::npos) << s.note;
}

TEST(BenchKernels, NoKernelOrNoProfilerIsNotANumber) {
  ProfileCapture c = two_steps();
  c.device.clear();
  const auto s = kiln::cli::summarize_cuda(c, 8);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.note.find("CUPTI"), std::string::npos) << s.note;

  ProfileCapture failed;
  failed.error = "LibTorch's profiler could not start: no Kineto";
  const auto f = kiln::cli::summarize_cuda(failed, 8);
  EXPECT_FALSE(f.ok);
  EXPECT_EQ(f.note, failed.error);
  EXPECT_FALSE(kiln::cli::summarize_cpu(failed, 8).ok);
}

TEST(BenchKernels, OutermostCallsPerThread) {
  const auto out = kiln::cli::outermost({
      act("aten::linear", 100, 500, true, 1), act("aten::t", 110, 120, true, 1),  // inside linear
      act("aten::addmm", 130, 490, true, 1),                                      // inside linear
      act("aten::relu", 500, 600, true, 1),                                       // starts as linear ends
      act("aten::clamp_min", 510, 590, true, 1),
      act("aten::mm", 150, 400, true, 2),     // another thread: its own outermost call
      act("aten::empty", 100, 100, true, 1),  // zero length, at linear's start
  });
  std::vector<std::string> names;
  for (const auto& a : out) names.push_back(a.name);
  EXPECT_EQ(names, (std::vector<std::string>{"aten::linear", "aten::relu", "aten::mm"}));
}

TEST(BenchKernels, SummaryJsonHasTheDocumentedFields) {
  const auto s = kiln::cli::summarize_cuda(two_steps(), 8);
  Json j = Json::parse(json_text(kiln::cli::summary_json(s, /*cuda=*/true)));
  for (const char* f :
       {"kernels_per_step", "copies_per_step", "generated_kernels_per_step", "kiln_runtime_kernels_per_step",
        "gpu_busy_us_per_step", "kernel_us_per_step", "generated_us_per_step", "kiln_runtime_us_per_step",
        "generated_share", "launch_calls_per_step", "graph_launches_per_step", "idle_us_per_step"})
    EXPECT_TRUE(j[f].is_number()) << f;
  // two_steps: 2990 ns from step 1's kiln_set_scalars to step 2's kiln_k0, 1.495 us a step.
  ASSERT_EQ(j["idle_gaps"].size(), 1u);
  EXPECT_EQ(j["idle_gaps"][0]["before"].get<std::string>(), "kiln_set_scalars");
  EXPECT_EQ(j["idle_gaps"][0]["after"].get<std::string>(), "kiln_k0");
  EXPECT_NEAR(j["idle_gaps"][0]["us_per_step"].get<double>(), 1.495, 1e-9);
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_TRUE(j["windowed"].get<bool>());
  EXPECT_EQ(j["steps"].get<double>(), 2);
  EXPECT_EQ(j["kernels_per_step"].get<double>(), 3);
  EXPECT_NEAR(j["generated_share"].get<double>(), 0.198, 1e-4);
  ASSERT_EQ(j["top"].size(), 4u);
  EXPECT_EQ(j["top"][1]["name"].get<std::string>(), "kiln_k0");
  EXPECT_EQ(j["top"][1]["origin"].get<std::string>(), "generated");

  ProfileCapture c = two_steps();
  c.cpu_ops = {act("aten::add\"quoted\"", 1100, 1200)};
  Json k = Json::parse(json_text(kiln::cli::summary_json(kiln::cli::summarize_cpu(c, 8), /*cuda=*/false)));
  EXPECT_EQ(k["op_calls_per_step"].get<double>(), 0.5);
  EXPECT_EQ(k["top"][0]["name"].get<std::string>(), "aten::add\"quoted\"");
}

TEST(BenchKernels, ProfilesRealCpuStepsInsideTheirRange) {
  const at::Tensor a = at::ones({64, 64});
  int calls = 0;
  const auto capture = kiln::cli::profile_steps(
      [&] {
        ++calls;
        (void)at::mm(at::relu(a), a);
      },
      /*cuda=*/false, /*lead_in=*/1, /*steps=*/3);
  ASSERT_TRUE(capture.ok) << capture.error;
  EXPECT_EQ(calls, 4);
  EXPECT_GT(capture.window_end, capture.window_start);
  const auto s = kiln::cli::summarize_cpu(capture, 8);
  ASSERT_TRUE(s.ok) << s.note;
  EXPECT_TRUE(s.windowed) << s.note;
  EXPECT_EQ(s.steps, 3);
  EXPECT_DOUBLE_EQ(s.kernels_per_step, 2.0);  // relu and mm (mm's own calls inside it are not outermost)
  std::vector<std::string> names;
  for (const auto& t : s.top) names.push_back(t.name);
  EXPECT_NE(std::find(names.begin(), names.end(), "aten::mm"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "aten::relu"), names.end());
}

// ---- The command ----

using kiln::test::CliRun;

CliRun kiln_cli(const std::string& args) {
  return kiln::test::run_command("env -u KILN_BACKEND " + std::string(KILN_CLI) + " " + args, "kiln_bench");
}

// A bad plugin option fails every group's compile the same way: the warning comes once, then a
// count, not once per group; every group still runs eagerly and says why.
TEST(BenchCli, OneCompileErrorOfManyGroupsIsSaidOnceThenCounted) {
  const CliRun r = kiln::test::run_command("env -u KILN_BACKEND KILN_PLUGIN_OPTIONS=inductor.no_such_key=1 " +
                                               std::string(KILN_CLI) + " bench gpt --backend inductor --steps 4",
                                           "kiln_bench");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string all = r.out + r.err;
  size_t said = 0;
  for (size_t at = all.find("failed to compile a group"); at != std::string::npos;
       at = all.find("failed to compile a group", at + 1))
    ++said;
  EXPECT_EQ(said, 1u) << all;
  EXPECT_NE(all.find("unknown option 'no_such_key'"), std::string::npos) << all;
  EXPECT_TRUE(std::regex_search(all, std::regex("failed to compile [0-9]+ more groups with the same error"))) << all;
  EXPECT_NE(all.find("runs on: eager"), std::string::npos) << all;
}

TEST(BenchCli, HelpNamesKernelsAndATypoIsAUsageError) {
  const CliRun h = kiln_cli("bench --help");
  EXPECT_EQ(h.status, 0);
  EXPECT_NE(h.out.find("--kernels"), std::string::npos);
  EXPECT_NE(h.out.find("kiln_k<N>"), std::string::npos);
  const CliRun t = kiln_cli("bench mlp --kernel");
  EXPECT_EQ(t.status, 2);
  EXPECT_NE(t.err.find("unknown option '--kernel'"), std::string::npos) << t.err;
}

TEST(BenchCli, AttentionNamesAKernelFamilyOrIsAUsageError) {
  const CliRun h = kiln_cli("bench --help");
  EXPECT_NE(h.out.find("--attention A"), std::string::npos);
  const CliRun t = kiln_cli("bench gpt --attention cudnnn");
  EXPECT_EQ(t.status, 2);
  EXPECT_NE(t.err.find("--attention 'cudnnn': use math, flash, efficient, cudnn or all"), std::string::npos) << t.err;
  // On the CPU the flag changes nothing: a checked run still passes.
  const CliRun c = kiln_cli("bench mlp --backend eager --steps 4 --batch 8 --attention flash --check");
  EXPECT_EQ(c.status, 0) << c.out << c.err;
}

TEST(BenchCli, KernelsOnTheCpuCountOperatorCallsInTheJson) {
  const CliRun r = kiln_cli("bench mlp --backend eager --steps 4 --batch 8 --kernels --json");
  ASSERT_EQ(r.status, 0) << r.err;
  Json j = Json::parse(r.out);
  Json& k = j["kernels"];
  EXPECT_TRUE(k["ok"].get<bool>()) << k["reason"].get<std::string>();
  EXPECT_EQ(k["unit"].get<std::string>(), "aten_ops");
  EXPECT_EQ(k["profiled_steps"].get<double>(), 5);
  EXPECT_EQ(k["kiln_eager_steps"].get<double>(), 0);
  for (const char* side : {"eager", "kiln"}) {
    EXPECT_TRUE(k[side]["ok"].get<bool>()) << side << ": " << k[side]["note"].get<std::string>();
    EXPECT_TRUE(k[side]["windowed"].get<bool>()) << side;
    EXPECT_EQ(k[side]["steps"].get<double>(), 5) << side;
    EXPECT_GT(k[side]["op_calls_per_step"].get<double>(), 5) << side;  // mlp: three linears, two relus, the loss, SGD
    EXPECT_GT(k[side]["op_us_per_step"].get<double>(), 0) << side;
    EXPECT_FALSE(k[side]["top"].empty()) << side;
  }
  // The timed numbers are still there, and without --kernels there is no "kernels" field.
  EXPECT_GT(j["kiln_ms"].get<double>(), 0);
  const CliRun plain = kiln_cli("bench mlp --backend eager --steps 4 --batch 8 --json");
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_FALSE(Json::parse(plain.out).contains("kernels"));
}

TEST(BenchCli, KernelsOnTheCpuInText) {
  const CliRun r = kiln_cli("bench mlp --backend eager --steps 4 --batch 8 --kernels");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("ATen operator calls per step (outermost): eager "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("longest operators of kiln"), std::string::npos) << r.out;
}

// --profiler-range brackets one more kiln step for an external profiler (ncu --profile-from-start
// off); on the CPU it says why it did nothing and the run still succeeds.
TEST(BenchCli, ProfilerRangeNeedsCudaAndSaysSo) {
  const CliRun h = kiln_cli("bench --help");
  EXPECT_NE(h.out.find("--profiler-range"), std::string::npos);
  const CliRun r = kiln_cli("bench mlp --backend eager --steps 4 --batch 8 --profiler-range");
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("kiln bench: --profiler-range: needs --device cuda"), std::string::npos) << r.err;
}

// --dynamic MIN:MAX: gpt at a length drawn per step, every mode in one run and one table, the
// lengths those bench/reference.py draws. --batch 2 keeps it short; the cheapest backend (eager).
TEST(BenchCli, DynamicRunsEveryModeAtTheSameLengthsAndPrintsTheTable) {
  const CliRun r = kiln_cli("bench gpt --dynamic 8:24 --steps 12 --backend eager --batch 2");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("12 steps at sequence lengths 8:24, batch 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lengths: seed 1234, 9 distinct of 17 possible, mean 16.75 (the static plan runs every "
                       "step at 17); first: 16 24 20 23 16 8 17 24 13 12 11 17"),
            std::string::npos)
      << r.out;
  for (const char* row :
       {"\n  LibTorch eager ", "\n  kiln dynamic=auto ", "\n  kiln dynamic=false ", "\n  kiln static T=17 "})
    EXPECT_NE(r.out.find(row), std::string::npos) << row << "\n" << r.out;
  EXPECT_NE(r.out.find("steady tok/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("warm-up s (steps)"), std::string::npos) << r.out;
  // The dynamic step against static plans at the same lengths: MIN, the mean and MAX.
  EXPECT_NE(r.out.find("same length (8 rounds per length"), std::string::npos) << r.out;
  for (const char* row : {"\n    T=8    dynamic ", "\n    T=17   dynamic ", "\n    T=24   dynamic "})
    EXPECT_NE(r.out.find(row), std::string::npos) << row << "\n" << r.out;
  EXPECT_EQ(r.out.find("some timed steps did not run a compiled plan"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("together: the dynamic step at "), std::string::npos) << r.out;
}

TEST(BenchCli, DynamicJsonCountsEveryStepOnceAndChecksTheNumbers) {
  const CliRun r =
      kiln_cli("bench gpt --dynamic 8:24 --steps 12 --backend eager --batch 2 --check --json --same-length-rounds 3");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const Json j = Json::parse(r.out);
  const Json& d = j["dynamic"];
  EXPECT_EQ(d["min"].get<int>(), 8);
  EXPECT_EQ(d["max"].get<int>(), 24);
  EXPECT_EQ(d["seed"].get<int>(), 1234);
  EXPECT_EQ(d["distinct_lengths"].get<int>(), 9);
  EXPECT_EQ(d["static_length"].get<int>(), 17);
  EXPECT_EQ(d["block_size"].get<int>(), 64);
  const std::vector<int64_t> lengths = d["lengths"].get<std::vector<int64_t>>();
  ASSERT_EQ(lengths.size(), 12u);
  // PyTorch's side draws the same lengths.
  const CliRun py = kiln::test::run_command(
      std::string(KILN_PYTHON) + " " + KILN_REFERENCE_PY + " gpt --dynamic 8:24 --steps 12 --lengths", "reference");
  ASSERT_EQ(py.status, 0) << py.err;
  EXPECT_EQ(Json::parse(py.out)["lengths"].get<std::vector<int64_t>>(), lengths);
  int64_t sum = 0;
  for (const int64_t t : lengths) sum += t;
  ASSERT_EQ(j["modes"].size(), 4u);
  const std::vector<std::string> keys = {"eager", "kiln", "kiln_dynamic_false", "kiln_static"};
  for (size_t i = 0; i < keys.size(); ++i) {
    const Json& m = j["modes"][i];
    EXPECT_EQ(m["key"].get<std::string>(), keys[i]);
    EXPECT_EQ(m["warmup_steps"].get<int>() + m["steady_steps"].get<int>(), 12) << m.dump();
    EXPECT_GE(m["warmup_steps"].get<int>(), 1) << m.dump();  // the first step at least
    EXPECT_EQ(m["tokens"].get<int64_t>(), 2 * (keys[i] == "kiln_static" ? 17 * 12 : sum)) << m.dump();
    EXPECT_GT(m["tokens_per_s"].get<double>(), 0) << m.dump();
    EXPECT_EQ(m["compiled_steps"].get<int>() + m["eager_steps"].get<int>(), 12) << m.dump();
  }
  EXPECT_EQ(j["modes"][0]["compiled_steps"].get<int>(), 0);
  EXPECT_EQ(j["modes"][1]["dynamic"].get<std::string>(), "auto");
  EXPECT_EQ(j["modes"][2]["dynamic"].get<std::string>(), "false");
  // One shape: one capture, every step after it compiled.
  EXPECT_EQ(j["modes"][3]["compiles"].get<int>(), 1);
  EXPECT_EQ(j["modes"][3]["compiled_steps"].get<int>(), 10);
  // One plan per shape: a capture per new length up to recompile_limit (8), then eager.
  EXPECT_GE(j["modes"][2]["compiles"].get<int>(), 2);
  for (size_t i : {1, 2}) {
    const Json& c = j["modes"][i]["check"];
    EXPECT_TRUE(c["ok"].get<bool>()) << c.dump();
  }
  EXPECT_FALSE(j["modes"][3].contains("check"));
  // The same-length comparison: three lengths, three rounds of one step each side, all compiled.
  const Json& same = j["same_length"];
  ASSERT_EQ(same.size(), 3u) << j.dump();
  const std::vector<int64_t> at = {8, 17, 24};
  for (size_t i = 0; i < at.size(); ++i) {
    EXPECT_EQ(same[i]["length"].get<int64_t>(), at[i]) << same.dump();
    EXPECT_EQ(same[i]["rounds"].get<int>(), 3) << same.dump();
    EXPECT_TRUE(same[i]["dynamic_compiled"].get<bool>()) << same.dump();
    EXPECT_TRUE(same[i]["static_compiled"].get<bool>()) << same.dump();
    EXPECT_GT(same[i]["dynamic_tokens_per_s"].get<double>(), 0) << same.dump();
    EXPECT_GT(same[i]["static_tokens_per_s"].get<double>(), 0) << same.dump();
  }
  EXPECT_GT(j["same_length_ratio"].get<double>(), 0);
}

TEST(BenchCli, ABadDynamicRangeIsAUsageErrorNamingTheFlag) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"bench gpt --dynamic 24:8", "--dynamic '24:8': MIN (24) is above MAX (8)"},
      {"bench gpt --dynamic x", "--dynamic 'x': use MIN:MAX"},
      {"bench gpt --dynamic 0:8", "--dynamic '0:8': MIN must be at least 1"},
      {"bench gpt --dynamic 8:", "--dynamic '8:': use MIN:MAX"},
      {"bench gpt --dynamic 16:100", "--dynamic '16:100': MAX (100) is above gpt's block size on cpu (64)"},
      {"bench gpt-medium --dynamic 16:200",
       "--dynamic '16:200': MAX (200) is above gpt-medium's block size on cpu (128)"},
      {"bench mlp --dynamic 8:24", "--dynamic '8:24': mlp has no sequence length"},
      {"bench gpt --dynamic 8:24 --kernels", "--dynamic: not with --interleave, --kernels"},
      {"bench gpt --dynamic-seed 7", "--dynamic-seed needs --dynamic"},
      {"bench gpt --same-length-rounds 3", "--same-length-rounds needs --dynamic"},
  };
  for (const auto& [args, message] : cases) {
    const CliRun r = kiln_cli(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find("kiln bench: " + message), std::string::npos) << args << "\n" << r.err;
  }
  const CliRun h = kiln_cli("bench --help");
  EXPECT_NE(h.out.find("--dynamic MIN:MAX"), std::string::npos) << h.out;
}

TEST(BenchCliCuda, ProfilerRangeProfilesOneCompiledStep) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const CliRun r = kiln_cli("bench mlp --device cuda --steps 4 --profiler-range");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("kiln bench: --profiler-range: one compiled step profiled"), std::string::npos) << r.err;
}

TEST(BenchCliCuda, KernelsCountsCudaKernels) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const CliRun r = kiln_cli("bench mlp --device cuda --mode reduce-overhead --steps 6 --kernels --json");
  ASSERT_EQ(r.status, 0) << r.err;
  Json k = Json::parse(r.out)["kernels"];
  EXPECT_EQ(k["unit"].get<std::string>(), "cuda_kernels");
  ASSERT_TRUE(k["ok"].get<bool>()) << k["reason"].get<std::string>();
  EXPECT_GT(k["eager"]["kernels_per_step"].get<double>(), 10);  // forward, backward and SGD's updates
  EXPECT_GT(k["kiln"]["kernels_per_step"].get<double>(), 10);   // the same kernels, inside one graph
  EXPECT_GT(k["kiln"]["graph_launches_per_step"].get<double>(), 0.9);
  EXPECT_GT(k["eager"]["gpu_busy_us_per_step"].get<double>(), 0);
}

}  // namespace

// --nproc: the workload trained data-parallel through kiln::Trainer on N ranks (Gloo over
// loopback here) next to one process; every rank's steps after the warm-up and the capture run
// compiled with the all_reduces inside, and the report has the numbers it names.
TEST(BenchCli, NprocTrainsOnRanksAndReportsCommunication) {
  const CliRun r = kiln_cli("bench mlp --backend eager --steps 6 --batch 16 --nproc 2 --json");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const Json j = Json::parse(r.out);
  EXPECT_EQ(j["nproc"].get<int>(), 2);
  EXPECT_EQ(j["ddp_backend"].get<std::string>(), "gloo");
  EXPECT_EQ(j["batch_per_rank"].get<int>(), 16);
  EXPECT_GE(j["all_reduce_nodes"].get<int>(),
            1);  // mlp's 2.6 MB of gradients: c10d's 1 MiB first bucket, then one more
  ASSERT_EQ(j["ranks"].size(), 2u);
  for (const auto& rank : j["ranks"]) {
    EXPECT_EQ(rank["kiln"]["compiled_steps"].get<int>(), 4) << rank.dump();
    EXPECT_EQ(rank["eager"]["compiled_steps"].get<int>(), 0) << rank.dump();
    EXPECT_GT(rank["kiln"]["ms"].get<double>(), 0);
  }
  // The one-process run has no group: nothing to all-reduce.
  EXPECT_EQ(j["one_process"]["kiln"]["all_reduce_nodes"].get<int>(), 0);
  EXPECT_GT(j["kiln_ms_ranks"].get<double>(), 0);
  EXPECT_GT(j["eager_ms_one"].get<double>(), 0);
  // Time only: with a flag that checks or profiles it is a usage error that says so.
  const CliRun c = kiln_cli("bench mlp --nproc 2 --check");
  EXPECT_EQ(c.status, 2);
  EXPECT_NE(c.err.find("--nproc measures time only"), std::string::npos) << c.err;
  const CliRun b = kiln_cli("bench mlp --nproc 2 --ddp-backend mpi");
  EXPECT_EQ(b.status, 2);
  EXPECT_NE(b.err.find("--ddp-backend 'mpi': use gloo or nccl"), std::string::npos) << b.err;
}
