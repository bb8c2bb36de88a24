// The inductor's CUDA kernels.
//  - Without a GPU (CI): every graph of the corpus (cuda_corpus.h), in float32 and bfloat16, is
//    claimed for CUDA node by node, lowered, scheduled and generated as CUDA, and NVRTC compiles it
//    for sm_90 into a cubin that defines every kernel the launches name; the compile cache gives
//    the cubin back without NVRTC. Skips, saying so, where no libnvrtc loads.
//  - Without a GPU (CI): the same kernels, with their launch grids, on a device emulated on the
//    host (cuda_emulation.h: threads as fibers, barriers and warp shuffles as they behave on a GPU,
//    threads run in the order that exposes a missing barrier) against float64 eager on the CPU.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include "cubin_symbols.h"
#include "cuda_corpus.h"
#include "kiln/compile.h"
#include "kiln/config.h"
#include "kiln/internal/executor.h"
#include "kiln/internal/host_services.h"
#include "kiln/internal/ir_text.h"
#include "kiln/internal/partition.h"
#include "kiln/internal/partitioned_executor.h"
#include "kiln/internal/plugin_registry.h"
#include "kiln/workloads.h"

// The plugin's own code (kiln_inductor_impl), for the generation steps.
#include "codegen_cuda.h"
#include "cuda_nvrtc.h"
#include "lowering.h"
#include "schedule.h"
#include "toolchain.h"

using namespace kiln;
namespace fs = std::filesystem;
using kiln::test::CorpusGraph;

namespace {

std::string fresh_dir(const std::string& tag) {
  static std::mt19937_64 rng(std::random_device{}());
  fs::path p = fs::temp_directory_path() /
               ("kiln_inductor_cuda_" + tag + "_" + std::to_string(getpid()) + "_" + std::to_string(rng() % 1000000));
  fs::create_directories(p);
  return p.string();
}

std::shared_ptr<inductor::Nvrtc> nvrtc_or_skip_reason(std::string* why) {
  try {
    return inductor::Nvrtc::load("");
  } catch (const plugin::Error& e) {
    *why = e.what();
    return nullptr;
  }
}

struct Case {
  const CorpusGraph* graph;
  std::string dtype;  // "f32" or "bf16"
};

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const auto& g : kiln::test::cuda_corpus())
    for (const char* dt : {"f32", "bf16"}) cases.push_back({&g, dt});
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.graph->name + "_" + info.param.dtype;
}

// Random inputs with the graph's shapes, strides and dtypes on its device (see cuda_corpus.h).
std::vector<at::Tensor> make_inputs(const ir::Graph& g) {
  std::vector<at::Tensor> ins;
  for (const auto& in : g.inputs) {
    const auto& m = g.value(in.value).meta;
    at::Tensor t = at::empty_strided(m.shape, m.strides, at::TensorOptions(m.dtype).device(m.device));
    if (m.dtype == at::kLong) {
      t.copy_(at::randint(0, 5, m.shape, at::kLong));
      if (in.name == "target_ignore" && t.numel() > 1) t.view(-1)[1] = -100;
    } else if (m.dtype == at::kBool) {
      t.copy_(at::rand(m.shape) > 0.5);
    } else {
      at::Tensor r = at::randn(m.shape);
      if (in.name.rfind("pos", 0) == 0) r.abs_().add_(0.1);
      t.copy_(r);
    }
    ins.push_back(t);
  }
  return ins;
}

// The run-time scalars of a graph: other values than the ones it was captured with, per trial.
std::vector<c10::IValue> make_scalars(const ir::Graph& g, int trial) {
  std::vector<c10::IValue> s;
  for (size_t k = 0; k < g.scalar_inputs.size(); ++k)
    s.emplace_back(0.37 + 0.11 * trial - 0.5 * static_cast<double>(k));
  return s;
}

std::vector<at::Tensor> outputs_of(const ir::Graph& g, const std::vector<at::Tensor>& env) {
  std::vector<at::Tensor> outs;
  for (const auto& o : g.outputs) outs.push_back(env[o.value]);
  return outs;
}

std::vector<at::Tensor> run_eager(const ir::Graph& g, const std::vector<at::Tensor>& inputs,
                                  const std::vector<c10::IValue>& scalars, bool check_meta = true) {
  std::vector<at::Tensor> env(g.values.size());
  for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs[i].value] = inputs[i];
  EagerExecutor(g, {}, {}, check_meta).run(env, &scalars);
  return outputs_of(g, env);
}

double rel_error(const at::Tensor& out, const at::Tensor& ref) {
  at::Tensor o = out.to(at::kDouble).cpu(), r = ref.to(at::kDouble).cpu();
  const double denom = std::max(r.norm().item<double>(), 1e-30);
  const double num = (o - r).norm().item<double>();
  return std::isnan(num) ? INFINITY : num / denom;
}

// The whole graph as one group, lowered and generated for CUDA.
struct Generated {
  std::unique_ptr<inductor::LoweredGraph> lowered;
  inductor::Program program;
  inductor::CudaProgram cuda;
};

Generated generate(const ir::Graph& g, const inductor::CudaOptions& options = {}) {
  std::vector<int32_t> nodes;
  for (size_t i = 0; i < g.nodes.size(); ++i) nodes.push_back(static_cast<int32_t>(i));
  std::vector<ir::ValueId> ins, outs;
  for (const auto& in : g.inputs) ins.push_back(in.value);
  for (const auto& o : g.outputs) outs.push_back(o.value);
  GraphView view(g, nodes, ins, outs);
  plugin::Graph pg(&view.view());
  inductor::LoweringOptions opts;
  opts.target = inductor::Target::Cuda;
  opts.runtime_scalars = true;
  for (size_t i = 0; i < pg.num_nodes(); ++i) {
    const plugin::Node n = pg.node(static_cast<int64_t>(i));
    EXPECT_EQ(inductor::why_not_claimed(pg, n, opts), "") << "node " << i << " " << n.op();
  }
  Generated out;
  out.lowered = inductor::lower(pg, opts);
  out.program = inductor::schedule(*out.lowered);
  out.cuda = inductor::generate_cuda(*out.lowered, out.program, options);
  return out;
}

}  // namespace

// ---- Without a GPU: generation and NVRTC -------------------------------------------------------

class InductorCudaCodegen : public ::testing::TestWithParam<Case> {};

TEST_P(InductorCudaCodegen, CompilesWithNvrtcForSm90IntoACubinWithEveryKernel) {
  std::string why;
  auto nvrtc = nvrtc_or_skip_reason(&why);
  if (!nvrtc) GTEST_SKIP() << "no NVRTC on this machine: " << why;
  ASSERT_TRUE(nvrtc->supports(90)) << "NVRTC " << nvrtc->version() << " cannot compile for sm_90";
  const Case& c = GetParam();
  const ir::Graph g = ir::parse(kiln::test::instantiate(c.graph->text, c.dtype));
  const Generated gen = generate(g);
  const auto& cuda = gen.cuda;
  ASSERT_FALSE(cuda.launches.empty());
  if (c.graph->launches >= 0) {
    EXPECT_EQ(cuda.launches.size(), static_cast<size_t>(c.graph->launches)) << cuda.source;
  }
  std::string cubin;
  try {
    cubin = nvrtc->compile(cuda.source, 90, c.graph->name + "_" + c.dtype + ".cu");
  } catch (const plugin::Error& e) {
    FAIL() << e.what() << "\n---- source ----\n" << cuda.source;
  }
  const auto fns = kiln::test::cubin_functions(cubin);
  for (const auto& l : cuda.launches) {
    EXPECT_EQ(fns.count(l.name), 1u) << l.name << " (" << l.what << ")";
    EXPECT_GT(l.grid, 0u) << l.name;
    EXPECT_GT(l.block, 0u) << l.name;
    EXPECT_LE(l.block, 1024u) << l.name;
    EXPECT_EQ(l.block % 32, 0u) << l.name;
  }
  for (const char* prelude_kernel : {"kiln_set_scalars", "kiln_strided_copy"})
    EXPECT_EQ(fns.count(prelude_kernel), 1u) << prelude_kernel;
  // Every step is a launch or an extern kernel, in the scheduler's order.
  size_t externs = 0;
  for (const auto& st : cuda.steps) externs += st.extern_node >= 0;
  size_t scheduled_externs = 0;
  for (const auto& st : gen.program.steps) scheduled_externs += st.extern_node >= 0;
  EXPECT_EQ(externs, scheduled_externs);
  EXPECT_EQ(cuda.steps.size(), cuda.launches.size() + externs);
  // Run-time scalars are read from the table; constants are literals.
  EXPECT_EQ(cuda.scalar_table, static_cast<int>(g.scalar_inputs.size())) << cuda.source;
  if (c.dtype == "bf16") {
    EXPECT_NE(cuda.source.find("kiln_bf16* __restrict__"), std::string::npos);
    EXPECT_NE(cuda.source.find("k_f2bf("), std::string::npos);
  }
}

INSTANTIATE_TEST_SUITE_P(Corpus, InductorCudaCodegen, ::testing::ValuesIn(all_cases()), case_name);

TEST(InductorCudaCodegen, RowPatternsShareOneKernelAndBiasGradientsAreColumnKernels) {
  // Layer norm's forward (mean, variance, rstd, y) and its backward's dx are one row kernel: they
  // share the rows. The bias gradient is a column kernel; the weight gradient, whose body also
  // reads mean and rstd contiguously along the reduced rows, a row kernel per column (the
  // scheduler's choice, as on the CPU).
  const auto& corpus = kiln::test::cuda_corpus();
  auto find = [&](const std::string& name) -> const CorpusGraph& {
    for (const auto& g : corpus)
      if (g.name == name) return g;
    throw std::runtime_error(name);
  };
  auto kinds = [](const inductor::CudaProgram& p) {
    std::string k;
    for (const auto& l : p.launches) k += l.what.substr(0, l.what.find(' ')) + " ";
    return k;
  };
  const Generated ln = generate(ir::parse(kiln::test::instantiate(find("layer_norm_fwd_bwd").text, "f32")));
  EXPECT_EQ(kinds(ln.cuda), "rows rows column ") << ln.cuda.source;
  const Generated sgd = generate(ir::parse(kiln::test::instantiate(find("sgd_momentum").text, "bf16")));
  ASSERT_EQ(sgd.cuda.launches.size(), 1u);
  EXPECT_EQ(sgd.cuda.launches[0].buffers.size(), 5u);  // w, g, buf in; buf, w out
  // The weight reads the new momentum from a register, rounded to bfloat16 as the buffer holds it.
  EXPECT_NE(sgd.cuda.source.find("= k_round_bf16("), std::string::npos) << sgd.cuda.source;
}

TEST(InductorCudaCodegen, BfloatSixteenIsLeftToAtenOnTheCpu) {
  const ir::Graph g = ir::parse(R"(graph {
  input %0 : bf16[4,8]{8,1} input "x"
  %1 : bf16[4,8]{8,1} = aten::relu(%0)
  output %1 result "y"
}
)");
  GraphView view(g);
  plugin::Graph pg(&view.view());
  inductor::LoweringOptions opts;
  EXPECT_EQ(inductor::why_not_claimed(pg, pg.node(0), opts), "dtype bfloat16");
  EXPECT_EQ(inductor::target_of(pg, pg.node(0)), inductor::Target::Cpu);
  opts.target = inductor::Target::Cuda;
  EXPECT_EQ(inductor::why_not_claimed(pg, pg.node(0), opts), "not on a CUDA device");
}

TEST(InductorCudaCodegen, AWarmCacheRunsNvrtcZeroTimesAndABrokenEntryIsRebuilt) {
  std::string why;
  auto nvrtc = nvrtc_or_skip_reason(&why);
  if (!nvrtc) GTEST_SKIP() << "no NVRTC on this machine: " << why;
  const Generated gen = generate(ir::parse(kiln::test::instantiate(kiln::test::cuda_corpus()[1].text, "f32")));
  const std::string root = inductor::inductor_cache_dir(fresh_dir("cache"));
  plugin::Host host(nullptr, "inductor");
  std::string key1, key2, key3;
  inductor::CacheStats s1, s2, s3;
  const uint64_t before = inductor::Nvrtc::compiles();
  const std::string cold = inductor::cubin_cached(gen.cuda.source, *nvrtc, 90, root, host, &key1, &s1);
  EXPECT_FALSE(s1.hit);
  EXPECT_EQ(inductor::Nvrtc::compiles(), before + 1);
  const std::string warm = inductor::cubin_cached(gen.cuda.source, *nvrtc, 90, root, host, &key2, &s2);
  EXPECT_TRUE(s2.hit);
  EXPECT_EQ(inductor::Nvrtc::compiles(), before + 1);  // no NVRTC
  EXPECT_EQ(key1, key2);
  EXPECT_EQ(warm, cold);
  for (const char* ext : {".cu", ".cubin", ".ok"}) EXPECT_TRUE(fs::exists(root + "/" + key1 + ext)) << ext;
  // Another architecture is another entry.
  if (nvrtc->supports(80)) {
    inductor::cubin_cached(gen.cuda.source, *nvrtc, 80, root, host, &key3, &s3);
    EXPECT_NE(key3, key1);
  }
  // A truncated cubin does not match its manifest: compiled again, never loaded.
  {
    std::ofstream f(root + "/" + key1 + ".cubin", std::ios::binary | std::ios::trunc);
    f << cold.substr(0, cold.size() / 2);
  }
  const uint64_t mid = inductor::Nvrtc::compiles();
  const std::string again = inductor::cubin_cached(gen.cuda.source, *nvrtc, 90, root, host, &key2, &s2);
  EXPECT_FALSE(s2.hit);
  EXPECT_EQ(inductor::Nvrtc::compiles(), mid + 1);
  EXPECT_EQ(again, cold);
}

// ---- Without a GPU: the generated kernels on an emulated device ------------------------------

namespace {

// A generated source compiled for the emulated device (cuda_emulation.h) by the host compiler.
class Emulated {
 public:
  explicit Emulated(const std::string& source) {
    const std::string dir = fresh_dir("emu");
    const std::string src = dir + "/kernels.cpp", so = dir + "/kernels.so";
    std::ofstream(src) << "#include \"" KILN_CUDA_EMULATION_HEADER "\"\n" << source;
    std::string out;
    const int rc = inductor::run_process({"c++", "-std=c++17", "-O1", "-shared", "-fPIC", "-w", src, "-o", so}, &out);
    if (rc != 0) throw std::runtime_error("the emulated source does not compile:\n" + out.substr(0, 6000));
    handle_ = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) throw std::runtime_error(std::string("dlopen: ") + dlerror());
    launch_ = reinterpret_cast<Launch>(dlsym(handle_, "kiln_emu_launch"));
  }
  ~Emulated() {
    if (handle_) dlclose(handle_);
  }
  // Runs a kernel; "" on success, else what went wrong.
  std::string launch(const std::string& kernel, std::vector<void*> args, unsigned grid, unsigned block) {
    void* fn = dlsym(handle_, kernel.c_str());
    if (!fn) return "no kernel " + kernel;
    const char* err = launch_(fn, static_cast<int>(args.size()), args.data(), grid, block);
    return err ? err : "";
  }

 private:
  using Launch = const char* (*)(void*, int, void**, unsigned, unsigned);
  void* handle_ = nullptr;
  Launch launch_ = nullptr;
};

std::vector<Case> cases_without_externs() {
  std::vector<Case> cases;
  for (const auto& c : all_cases())
    if (c.graph->text.find("aten::addmm") == std::string::npos) cases.push_back(c);
  return cases;
}

}  // namespace

class InductorCudaEmulated : public ::testing::TestWithParam<Case> {};

// The launches of each corpus graph, with their grids and blocks, on the emulated device (2
// multiprocessors: grid-stride loops go round), against eager in float64 on the CPU: float32
// within 1e-5, bfloat16 within 1e-2.
TEST_P(InductorCudaEmulated, GeneratedKernelsMatchFloat64Eager) {
  const Case& c = GetParam();
  const ir::Graph g = ir::parse(kiln::test::instantiate(c.graph->text, c.dtype));
  inductor::CudaOptions options;
  options.multiprocessors = 2;
  const Generated gen = generate(g, options);
  Emulated device(gen.cuda.source);
  const ir::Graph on_cpu = ir::parse(kiln::test::instantiate(c.graph->text, c.dtype, ""));
  const ir::Graph wide = ir::parse(kiln::test::instantiate(c.graph->text, "f64", ""));
  const double tol = c.dtype == "f32" ? 1e-5 : 1e-2;
  for (int trial = 0; trial < 2; ++trial) {
    const auto inputs = make_inputs(on_cpu);
    const auto scalars = make_scalars(g, trial);
    std::vector<at::Tensor> outputs;
    for (const auto& o : on_cpu.outputs) {
      const auto& m = on_cpu.value(o.value).meta;
      outputs.push_back(at::empty_strided(m.shape, m.strides, at::TensorOptions(m.dtype)).fill_(7));
    }
    // The buffers by slot, as the plugin binds them: inputs, outputs, scratch.
    std::vector<void*> B;
    for (const auto& t : inputs) B.push_back(t.data_ptr());
    for (const auto& t : outputs) B.push_back(t.data_ptr());
    std::vector<std::vector<char>> scratch;
    for (int64_t bytes : gen.lowered->scratch_bytes) scratch.emplace_back(static_cast<size_t>(bytes) + 64, 0x7f);
    for (auto& s : scratch) B.push_back(s.data());
    std::vector<double> table(static_cast<size_t>(gen.cuda.scalar_table));
    for (size_t k = 0; k < table.size(); ++k) table[k] = scalars[k].toDouble();
    for (const auto& st : gen.cuda.steps) {
      ASSERT_GE(st.launch, 0) << "an extern kernel";
      const auto& l = gen.cuda.launches[static_cast<size_t>(st.launch)];
      std::vector<void*> args;
      for (int b : l.buffers) args.push_back(B.at(static_cast<size_t>(b)));
      if (l.scalars) args.push_back(table.data());
      ASSERT_EQ(device.launch(l.name, args, l.grid, l.block), "") << l.name << " (" << l.what << ")";
    }
    std::vector<at::Tensor> wide_inputs;
    for (const auto& t : inputs) wide_inputs.push_back(t.is_floating_point() ? t.to(at::kDouble) : t);
    const auto ref = run_eager(wide, wide_inputs, scalars, /*check_meta=*/false);
    for (size_t k = 0; k < outputs.size(); ++k) {
      const std::string name = c.graph->name + " " + c.dtype + " output " + std::to_string(k) + " (" +
                               g.outputs[k].name + ") trial " + std::to_string(trial);
      if (!ref[k].is_floating_point()) {
        EXPECT_TRUE(at::equal(outputs[k], ref[k])) << name << "\n" << outputs[k] << "\n" << ref[k];
        continue;
      }
      EXPECT_LE(rel_error(outputs[k], ref[k]), tol) << name << "\n" << outputs[k] << "\n" << ref[k];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Corpus, InductorCudaEmulated, ::testing::ValuesIn(cases_without_externs()), case_name);
