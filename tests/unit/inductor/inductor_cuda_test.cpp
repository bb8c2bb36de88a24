// The inductor's CUDA kernels.
//  - Without a GPU (CI): every graph of the corpus (cuda_corpus.h), in float32 and bfloat16, is
//    claimed for CUDA node by node, lowered, scheduled and generated as CUDA, and NVRTC compiles it
//    for sm_90 into a cubin that defines every kernel the launches name; the compile cache gives
//    the cubin back without NVRTC. Skips, saying so, where no libnvrtc loads.
//  - Without a GPU (CI): the same kernels, with their launch grids, on a device emulated on the
//    host (cuda_emulation.h: threads as fibers, barriers and warp shuffles as they behave on a GPU,
//    threads run in the order that exposes a missing barrier) against float64 eager on the CPU.
//  - On a GPU (suites ending in Cuda; skipped with the reason elsewhere): each corpus graph through
//    the plugin on CUDA tensors against the eager executor (float32 within 1e-5, bfloat16 within
//    1e-2), run-time scalars, inputs with other strides than compiled; and whole training steps
//    (mlp, gpt with bf16 autocast) with their groups compiled on CUDA, against LibTorch eager.
#include <gtest/gtest.h>

#include <functional>

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <string>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include "cubin_symbols.h"
#include "cuda_driver.h"
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
#include "log_capture.h"

// The plugin's own code (kiln_inductor_impl), for the generation steps.
#include "codegen_cuda.h"
#include "cuda_nvrtc.h"
#include "gemm_fold.h"
#include "lowering.h"
#include "ops.h"
#include "schedule.h"
#include "toolchain.h"

using namespace kiln;
namespace fs = std::filesystem;
using kiln::test::CorpusGraph;

namespace {

const char* kNoCuda = "no CUDA device: run on the GPU machine (scripts/device-check inductor)";

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
  inductor::join_sibling_columns(*out.lowered, out.program);  // as the plugin schedules for CUDA
  out.cuda = inductor::generate_cuda(*out.lowered, out.program, options);
  return out;
}

// In-place proposals for a corpus graph: by output, an input of the same dtype, shape and strides.
// By name: the input the output is the new value of (output "w" over input "w", "exp_avg_sq" over
// "pos_exp_avg_sq"), as the host proposes write-backs. Otherwise the first such input, whatever it
// means: the analysis must still only accept what runs right.
std::vector<int64_t> inplace_wanted(const ir::Graph& g, bool by_name) {
  std::vector<int64_t> wanted;
  for (const auto& o : g.outputs) {
    int64_t j = -1;
    for (size_t i = 0; i < g.inputs.size() && j < 0; ++i) {
      const auto& name = g.inputs[i].name;
      const bool named = name == o.name || name == "pos_" + o.name;
      if (g.value(g.inputs[i].value).meta == g.value(o.value).meta && (named || !by_name) &&
          std::find(wanted.begin(), wanted.end(), static_cast<int64_t>(i)) == wanted.end())
        j = static_cast<int64_t>(i);
    }
    wanted.push_back(j);
  }
  return wanted;
}

// Every max-autotune variant of a graph: program t (t >= 1) generated with variant t of each
// kernel plan (its last variant where it has fewer), its kernels renamed kiln_v<t>_k... so that all
// of them fit in one source (after the prelude). No programs when no plan has a second variant.
struct VariantPrograms {
  std::vector<Generated> gens;
  std::vector<std::string> labels;  // "variant 2: [block 512] [defaults] ..."
  std::string source;
};

VariantPrograms variant_programs(const ir::Graph& g, const inductor::CudaOptions& options) {
  const Generated base = generate(g, options);
  size_t most = 1;
  std::vector<std::vector<inductor::CudaChoice>> variants;
  for (size_t k = 0; k < base.program.kernels.size(); ++k) {
    variants.push_back(inductor::cuda_variants(*base.lowered, base.program, k, options));
    most = std::max(most, variants.back().size());
    EXPECT_EQ(variants.back()[0], inductor::CudaChoice{}) << "the defaults come first";
  }
  VariantPrograms out;
  out.source = std::string(inductor::cuda_prelude());
  for (size_t t = 1; t < most; ++t) {
    inductor::CudaOptions o = options;
    std::string label = "variant " + std::to_string(t) + ":";
    for (const auto& v : variants) {
      o.choice.push_back(v[std::min(t, v.size() - 1)]);
      label += " [" + inductor::describe(o.choice.back()) + "]";
    }
    out.gens.push_back(generate(g, o));
    out.labels.push_back(label);
    const std::string tag = "kiln_v" + std::to_string(t) + "_k";
    for (auto& l : out.gens.back().cuda.launches) {
      for (size_t at = l.text.find("kiln_k"); at != std::string::npos; at = l.text.find("kiln_k", at + tag.size()))
        l.text.replace(at, 6, tag);
      l.name = tag + l.name.substr(6);
      out.source += l.text;
    }
  }
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
  // The kernels of a source compiled by NVRTC for sm_90; none (and a failure) when it does not compile.
  auto compiled_kernels = [&](const std::string& source, const std::string& name) {
    try {
      return kiln::test::cubin_functions(nvrtc->compile(source, 90, name));
    } catch (const plugin::Error& e) {
      ADD_FAILURE() << e.what() << "\n---- source ----\n" << source;
      return std::set<std::string>{};
    }
  };
  const auto fns = compiled_kernels(cuda.source, c.graph->name + "_" + c.dtype + ".cu");
  if (HasFailure()) return;
  for (const auto& l : cuda.launches) {
    EXPECT_EQ(fns.count(l.name), 1u) << l.name << " (" << l.what << ")";
    EXPECT_GT(l.grid, 0u) << l.name;
    EXPECT_GT(l.block, 0u) << l.name;
    EXPECT_LE(l.block, 1024u) << l.name;
    EXPECT_EQ(l.block % 32, 0u) << l.name;
  }
  for (const char* prelude_kernel : {"kiln_set_scalars", "kiln_strided_copy"})
    EXPECT_EQ(fns.count(prelude_kernel), 1u) << prelude_kernel;
  // With small launches fused horizontally (as on a GPU of 2 multiprocessors, where most are small).
  inductor::CudaProgram fused = cuda;
  inductor::FuseLimits limits;
  limits.multiprocessors = 2;
  if (inductor::fuse_small_launches(fused, {}, {}, limits) > 0) {
    const auto fused_fns = compiled_kernels(fused.source, c.graph->name + "_" + c.dtype + "_fused.cu");
    for (const auto& l : fused.launches) EXPECT_EQ(fused_fns.count(l.name), 1u) << l.name << " (" << l.what << ")";
  }
  // Every step is a launch or an extern kernel, in the scheduler's order.
  size_t externs = 0;
  for (const auto& st : cuda.steps) externs += st.extern_node >= 0;
  size_t scheduled_externs = 0;
  for (const auto& st : gen.program.steps) scheduled_externs += st.extern_node >= 0;
  EXPECT_EQ(externs, scheduled_externs);
  EXPECT_EQ(cuda.steps.size(), cuda.launches.size() + externs);
  // Run-time scalars are read from the table; constants are literals.
  EXPECT_EQ(cuda.scalar_table, static_cast<int>(g.scalar_inputs.size())) << cuda.source;
  if (c.dtype == "bf16" && c.graph->text.find("{T}") != std::string::npos) {  // a graph of fixed dtypes has none
    EXPECT_NE(cuda.source.find("kiln_bf16* __restrict__"), std::string::npos);
    EXPECT_NE(cuda.source.find("k_f2bf("), std::string::npos);
  }
}

// A buffer that one kernel both stores to and loads from must not be __restrict__: nvcc may then
// load it through the non-coherent read-only cache and miss what another thread of the block
// stored before a barrier (a long layer-norm row read back a stale rstd on the H200). Checked on
// the text of each generated kernel: parameters, then stores ("bN[...] =") and loads of each.
TEST_P(InductorCudaCodegen, NoRestrictBufferIsBothStoredAndLoadedInOneKernel) {
  const Case& c = GetParam();
  const Generated gen = generate(ir::parse(kiln::test::instantiate(c.graph->text, c.dtype)));
  const std::string& src = gen.cuda.source;
  size_t checked = 0;
  // Each kernel's head, KILN_KERNEL(threads) or KILN_CLUSTER_KERNEL(threads, blocks), then its parameters.
  for (size_t at = src.find("_KERNEL("); at != std::string::npos; at = src.find("_KERNEL(", at + 1)) {
    const size_t open = src.find('(', src.find(')', at) + 1), close = src.find(')', open);
    const size_t end = src.find("\n}\n", close);
    ASSERT_NE(end, std::string::npos);
    const std::string params = src.substr(open + 1, close - open - 1), body = src.substr(close, end - close);
    const std::regex restrict_param(R"(__restrict__ (b[0-9]+))");
    for (std::sregex_iterator m(params.begin(), params.end(), restrict_param), e; m != e; ++m) {
      const std::string b = (*m)[1].str();
      const std::regex store("(^|[^0-9A-Za-z_])" + b + R"(\[[^\]]*\] = )"), any("(^|[^0-9A-Za-z_])" + b + R"(\[)");
      const auto stores = std::distance(std::sregex_iterator(body.begin(), body.end(), store), {});
      const auto uses = std::distance(std::sregex_iterator(body.begin(), body.end(), any), {});
      EXPECT_FALSE(stores > 0 && uses > stores)
          << b << " is __restrict__ but stored " << stores << " and loaded " << (uses - stores) << " times in\n"
          << src.substr(at, end - at);
      ++checked;
    }
  }
  EXPECT_GT(checked, 0u) << "no __restrict__ parameter found: the check looks at nothing";
}

INSTANTIATE_TEST_SUITE_P(Corpus, InductorCudaCodegen, ::testing::ValuesIn(all_cases()), case_name);

TEST(InductorCudaCodegen, RowPatternsShareOneKernelAndBiasGradientsAreColumnKernels) {
  // Layer norm's forward (mean, variance, rstd, y) and its backward's dx are one row kernel: they
  // share the rows. The bias gradient and the weight gradient are column kernels: the weight
  // gradient's body also reads mean and rstd, one value per reduced row that every column shares,
  // which does not make it a row reduction (reading x and dy down a column per block was 80 us
  // where a column kernel reads them coalesced).
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
  // The two gradients reduce the same rows and read nothing of each other: one column kernel of
  // two reductions reads dy once.
  EXPECT_EQ(kinds(ln.cuda), "rows column ") << ln.cuda.source;
  ASSERT_EQ(ln.cuda.launches.size(), 2u);
  EXPECT_NE(ln.cuda.launches[1].what.find("2 reductions"), std::string::npos) << ln.cuda.launches[1].what;
  // A batch norm backward's two sums over NHWC rows, likewise; and its forward's statistics, as
  // float64 sums of the deviations from a shift and of their squares (not the mean, then the
  // variance that reads it): x is read once, by the first kernel.
  const Generated bn = generate(ir::parse(kiln::test::instantiate(find("batch_norm_channels_last").text, "f32")));
  std::vector<std::string> joined;
  for (const auto& l : bn.cuda.launches)
    if (l.what.rfind("column", 0) == 0 && l.what.find(" over ") != std::string::npos) joined.push_back(l.what);
  ASSERT_EQ(joined.size(), 2u) << bn.cuda.source;
  EXPECT_EQ(joined[0].rfind("column f64[12] over [8,12,12], 2 reductions", 0), 0u) << joined[0];
  EXPECT_EQ(joined[1].rfind("column f32[12] over [8,12,12], 2 reductions", 0), 0u) << joined[1];
  const Generated sgd = generate(ir::parse(kiln::test::instantiate(find("sgd_momentum").text, "bf16")));
  ASSERT_EQ(sgd.cuda.launches.size(), 1u);
  EXPECT_EQ(sgd.cuda.launches[0].buffers.size(), 5u);  // w, g, buf in; buf, w out
  // The weight reads the new momentum from a register, rounded to bfloat16 as the buffer holds it.
  EXPECT_NE(sgd.cuda.source.find("= k_round_bf16("), std::string::npos) << sgd.cuda.source;
}

// A bias gradient of 384 features over 16384 rows is 12 column strips: on 132 multiprocessors its
// rows are split over blocks into partial sums, combined by a second kernel in a fixed order.
TEST(InductorCudaCodegen, FewColumnsSplitTheirRowsAcrossBlocks) {
  const Generated g = generate(ir::parse(R"(graph {
  input %0 : bf16[16384,384]{384,1} on cuda:0 input "dy"
  %1 : bf16[384]{1} on cuda:0 = aten::sum.dim_IntList(%0, i[0], false, None)
  output %1 result "db"
}
)"));
  ASSERT_EQ(g.cuda.launches.size(), 2u) << g.cuda.source;
  // 4 columns a thread (three full strips of 128 columns; 8 would leave half a strip idle), and
  // 128 parts of 128 rows (four blocks a multiprocessor would be 176 parts).
  EXPECT_EQ(g.cuda.launches[0].what, "column bf16[384] over [16384], 4 columns a thread in 128 parts");
  EXPECT_EQ(g.cuda.launches[0].grid, 3u * 128u);
  EXPECT_EQ(g.cuda.launches[1].what, "column bf16[384], 128 parts combined");
  ASSERT_EQ(g.cuda.extra_scratch_bytes, (std::vector<int64_t>{128 * 384 * 4}));  // float partial sums
  // A row's 4 columns are one 8-byte word when the buffer is aligned, 4 loads otherwise.
  EXPECT_NE(g.cuda.source.find("if (aligned) k_vld<4>(a0, b0 + "), std::string::npos) << g.cuda.source;
  // The bias's optimizer update after its gradient runs in the combining kernel, over the old bias.
  const ir::Graph update = ir::parse(R"(graph {
  input %0 : bf16[16384,384]{384,1} on cuda:0 input "dy"
  input %1 : f32[384]{1} on cuda:0 param "b"
  %2 : bf16[384]{1} on cuda:0 = aten::sum.dim_IntList(%0, i[0], false, None)
  %3 : f32[384]{1} on cuda:0 = aten::_to_copy(%2, dtype(f32), None, None, None, false, None)
  %4 : f32[384]{1} on cuda:0 = aten::add.Tensor(%1, %3, scalar(-0.01))
  output %4 result "b"
}
)");
  inductor::CudaOptions over_b;
  over_b.may_alias = {1, 2};
  const Generated u = generate(update, over_b);
  ASSERT_EQ(u.cuda.launches.size(), 2u) << u.cuda.source;
  EXPECT_EQ(u.cuda.launches[1].what, "column bf16[384], 128 parts combined, then 1 stage") << u.cuda.source;
  EXPECT_EQ(inductor::inplace_outputs(u.cuda, 2, {1}), (std::vector<int64_t>{1}));
  // A batch norm's per-channel sum over channels-last activations: 32 columns over 131072 rows,
  // one strip, split into 512 parts (about four blocks a multiprocessor) of 256 rows.
  const Generated nhwc = generate(ir::parse(R"(graph {
  input %0 : f32[128,32,32,32]{32768,1,1024,32} on cuda:0 input "x"
  %1 : f32[32]{1} on cuda:0 = aten::sum.dim_IntList(%0, i[0, 2, 3], false, None)
  output %1 result "s"
}
)"));
  ASSERT_EQ(nhwc.cuda.launches.size(), 2u) << nhwc.cuda.source;
  EXPECT_EQ(nhwc.cuda.launches[0].what, "column f32[32] over [128,32,32], 4 columns a thread in 512 parts");
  EXPECT_EQ(nhwc.cuda.launches[0].grid, 512u);
  EXPECT_EQ(nhwc.cuda.launches[1].what, "column f32[32], 512 parts combined");
  // A row is 8 threads of 4 columns: each warp takes 4 rows at once, no lane idle.
  EXPECT_NE(nhwc.cuda.source.find("const int tx = threadIdx.x % 8, ty = threadIdx.x / 8;"), std::string::npos)
      << nhwc.cuda.source;
  // Enough strips to fill the GPU: one kernel, as before.
  const Generated wide = generate(ir::parse(R"(graph {
  input %0 : f32[512,32768]{32768,1} on cuda:0 input "dy"
  %1 : f32[32768]{1} on cuda:0 = aten::sum.dim_IntList(%0, i[0], false, None)
  output %1 result "db"
}
)"));
  ASSERT_EQ(wide.cuda.launches.size(), 1u) << wide.cuda.source;
  EXPECT_TRUE(wide.cuda.extra_scratch_bytes.empty());
}

// Batch norm over [128, 32, 32, 32] has 32 rows (channels) of 131,072 elements: a block a row
// would keep 32 of 132 multiprocessors busy, so on sm_90 each row is shared by a cluster of 8
// blocks, which combine their sums through distributed shared memory (the kernel's source sets the
// cluster size, so a plain launch makes the clusters). Not before sm_90, and never for the many
// short rows of a layer norm.
// A language model's token-embedding gradient ([64, 256] tokens of 384 features into 65 rows): on
// CUDA a scatter-add of generated code (parts of the tokens into tables in shared memory, combined
// in order by a second kernel, which also runs the weight's update), not ATen's sort; on the CPU,
// and on CUDA for a table too large for a block's shared memory, ATen's kernel as before.
TEST(InductorCudaCodegen, TheEmbeddingsGradientIsAScatterAddIntoTablesCombinedInOrder) {
  auto graph = [](int64_t rows, const std::string& device) {
    const std::string r = std::to_string(rows), d = device.empty() ? "" : " on " + device;
    return ir::parse(R"(graph {
  input %0 : f32[64,256,384]{98304,384,1})" +
                     d + R"( input "go"
  input %1 : i64[64,256]{256,1})" +
                     d + R"( input "idx"
  input %2 : f32[)" + r +
                     R"(,384]{384,1})" + d + R"( input "w"
  %3 : f32[)" + r + R"(,384]{384,1})" +
                     d + R"( = aten::embedding_dense_backward(%0, %1, )" + r + R"(, -1, false)
  %4 : f32[)" + r + R"(,384]{384,1})" +
                     d + R"( = aten::add.Tensor(%2, %3, scalar(-0.001))
  output %3 result "dw"
  output %4 result "w"
}
)");
  };
  const Generated g = generate(graph(65, "cuda:0"));
  for (const auto& st : g.cuda.steps) EXPECT_LT(st.extern_node, 0) << "no extern kernel";
  ASSERT_EQ(g.cuda.launches.size(), 2u) << g.cuda.source;
  const auto& tables = g.cuda.launches[0];
  const auto& combine = g.cuda.launches[1];
  // 384 columns in 12 strips of 32; four warps a block, each with a table of 65 x 32 floats, and
  // six blocks a multiprocessor: 66 parts (792 blocks), 62 tokens a warp.
  EXPECT_EQ(tables.what, "scatter-add f32[65,384] from [64,256] in 66 parts, 4 tables a block") << tables.text;
  EXPECT_EQ(tables.block, 128u);
  EXPECT_EQ(tables.grid, 12u * 66u);
  EXPECT_NE(tables.text.find("__shared__ float kiln_tab[8320];"), std::string::npos) << tables.text;
  EXPECT_EQ(tables.text.find("atomic"), std::string::npos) << tables.text;
  EXPECT_EQ(combine.what, "column f32[65,384], 66 parts combined, then 1 stage") << combine.text;
  ASSERT_EQ(g.cuda.extra_scratch_bytes.size(), 1u);
  EXPECT_EQ(g.cuda.extra_scratch_bytes[0], 66 * 65 * 384 * 4);
  // max-autotune tries other numbers of parts.
  const auto variants = inductor::cuda_variants(*g.lowered, g.program, 0, {});
  ASSERT_EQ(variants.size(), 4u);
  EXPECT_EQ(variants[1].splits, 33);
  EXPECT_EQ(variants[3].splits, 132);

  // 1000 rows do not fit a block's shared memory: ATen's kernel, and the reason says why.
  const ir::Graph big = graph(1000, "cuda:0");
  std::vector<int32_t> nodes{0, 1};
  std::vector<ir::ValueId> ins, outs;
  for (const auto& in : big.inputs) ins.push_back(in.value);
  for (const auto& o : big.outputs) outs.push_back(o.value);
  GraphView view(big, nodes, ins, outs);
  plugin::Graph pg(&view.view());
  inductor::LoweringOptions cuda;
  cuda.target = inductor::Target::Cuda;
  EXPECT_TRUE(inductor::is_extern_node(pg, pg.node(0), inductor::Target::Cuda));
  EXPECT_EQ(inductor::why_not_claimed(pg, pg.node(0), cuda), "");
  EXPECT_NE(inductor::claim_embedding_backward_cuda(pg, pg.node(0)).find("table of 1000 rows"), std::string::npos);
  const auto lowered = inductor::lower(pg, cuda);
  EXPECT_EQ(lowered->values[static_cast<size_t>(pg.node(0).outputs()[0])].kind, inductor::ValueInfo::Kind::Extern);

  // On the CPU: ATen's kernel.
  const ir::Graph cpu = graph(65, "");
  GraphView cview(cpu, nodes, ins, outs);
  plugin::Graph cg(&cview.view());
  EXPECT_TRUE(inductor::is_extern_node(cg, cg.node(0), inductor::Target::Cpu));
  EXPECT_EQ(inductor::lower(cg, {})->values[static_cast<size_t>(cg.node(0).outputs()[0])].kind,
            inductor::ValueInfo::Kind::Extern);
}

TEST(InductorCudaCodegen, FewLongRowsAreSharedByTheBlocksOfACluster) {
  const std::string bn = R"(graph {
  input %0 : f32[128,32,32,32]{32768,1024,32,1} on cuda:0 input "x"
  input %1 : f32[32]{1} on cuda:0 input "w"
  input %2 : f32[32]{1} on cuda:0 input "b"
  input %3 : f32[32]{1} on cuda:0 input "running_mean"
  input %4 : f32[32]{1} on cuda:0 input "running_var"
  %5 : f32[128,32,32,32]{32768,1024,32,1} on cuda:0, %6 : f32[32]{1} on cuda:0, %7 : f32[32]{1} on cuda:0, %8 : f32[32]{1} on cuda:0, %9 : f32[32]{1} on cuda:0 = aten::_native_batch_norm_legit_functional(%0, %1, %2, %3, %4, true, 0.1, 1e-05)
  output %5 result "y"
  output %6 result "save_mean"
  output %7 result "save_invstd"
  output %8 result "running_mean"
  output %9 result "running_var"
}
)";
  const Generated g = generate(ir::parse(bn));
  ASSERT_FALSE(g.cuda.launches.empty());
  const auto& stats = g.cuda.launches[0];
  // Four stages: the two float64 sums of the statistics, the mean, the inverse deviation.
  EXPECT_EQ(stats.what, "rows [32], 4 stages, first f64[32], a cluster of 8 blocks a row") << g.cuda.source;
  EXPECT_EQ(stats.cluster, 8u);
  EXPECT_EQ(stats.grid, 32u * 8u);
  EXPECT_EQ(stats.block, 1024u);
  EXPECT_NE(stats.text.find("KILN_CLUSTER_KERNEL(1024, 8) kiln_k0("), std::string::npos) << stats.text;
  EXPECT_NE(stats.text.find("k_cluster_reduce<KSum, 8>("), std::string::npos) << stats.text;
  // Only the first thread of the cluster stores a row's statistic.
  EXPECT_NE(stats.text.find("if (ct == 0) {"), std::string::npos) << stats.text;
  // 16 elements a thread: the loop is unrolled, so that several loads are in flight.
  EXPECT_NE(stats.text.find("#pragma unroll 4\n  for (kidx r = ct; r < 131072; r += cnt) {"), std::string::npos)
      << stats.text;
  inductor::CudaOptions ampere;
  ampere.compute_capability = 80;
  const Generated a = generate(ir::parse(bn), ampere);
  EXPECT_EQ(a.cuda.launches[0].cluster, 1u);
  EXPECT_EQ(a.cuda.launches[0].grid, 32u);
  EXPECT_EQ(a.cuda.launches[0].text.find("cluster"), std::string::npos) << a.cuda.launches[0].text;
  // A choice of 1 (max-autotune's "no cluster") is a block a row again.
  inductor::CudaOptions none;
  none.choice.assign(g.program.kernels.size(), inductor::CudaChoice{});
  none.choice[0].cluster = 1;
  EXPECT_EQ(generate(ir::parse(bn), none).cuda.launches[0].cluster, 1u);
  const Generated ln = generate(ir::parse(R"(graph {
  input %0 : f32[16384,384]{384,1} on cuda:0 input "x"
  input %1 : f32[384]{1} on cuda:0 input "w"
  input %2 : f32[384]{1} on cuda:0 input "b"
  %3 : f32[16384,384]{384,1} on cuda:0, %4 : f32[16384,1]{1,1} on cuda:0, %5 : f32[16384,1]{1,1} on cuda:0 = aten::native_layer_norm(%0, i[384], %1, %2, 1e-05)
  output %3 result "y"
}
)"));
  for (const auto& l : ln.cuda.launches) EXPECT_EQ(l.cluster, 1u) << l.what;
}

// max-autotune's variants: the defaults first, then other launch shapes, each generated as asked.
TEST(InductorCudaCodegen, MaxAutotuneVariantsLaunchAsChosen) {
  // A flat kernel: other blocks and grid caps.
  const ir::Graph flat = ir::parse(R"(graph {
  input %0 : f32[1024,1024]{1024,1} on cuda:0 input "x"
  %1 : f32[1024,1024]{1024,1} on cuda:0 = aten::exp(%0)
  output %1 result "y"
}
)");
  inductor::CudaOptions o;
  const Generated f = generate(flat, o);
  const auto fv = inductor::cuda_variants(*f.lowered, f.program, 0, o);
  ASSERT_EQ(fv.size(), 5u);
  EXPECT_EQ(inductor::describe(fv[0]), "defaults");
  EXPECT_EQ(f.cuda.launches[0].block, 256u);
  EXPECT_EQ(f.cuda.launches[0].grid, 16u * 132u);
  for (const auto& v : fv) {
    o.choice = {v};
    const Generated g = generate(flat, o);
    ASSERT_EQ(g.cuda.launches.size(), 1u);
    const auto& l = g.cuda.launches[0];
    EXPECT_EQ(l.plan, 0);
    if (v.threads) {
      EXPECT_EQ(l.block, static_cast<unsigned>(v.threads)) << inductor::describe(v);
    }
    // Four floats a thread: a thread per element is 2^20 / 4 / block blocks.
    if (v.blocks_per_sm < 0) {
      EXPECT_EQ(l.grid, (1u << 20) / 4 / l.block) << inductor::describe(v);
    }
    if (v.blocks_per_sm > 0) {
      EXPECT_LE(l.grid, static_cast<unsigned>(v.blocks_per_sm * 132)) << inductor::describe(v);
    }
  }
  // A row plan (a softmax of 64 rows of 300): a warp a row by default; a block a row or 4 rows a
  // block when asked.
  const ir::Graph rows = ir::parse(R"(graph {
  input %0 : f32[64,300]{300,1} on cuda:0 input "x"
  %1 : f32[64,300]{300,1} on cuda:0 = aten::_softmax(%0, 1, false)
  output %1 result "y"
}
)");
  o = {};
  const Generated r = generate(rows, o);
  ASSERT_EQ(r.cuda.launches.size(), 1u);
  EXPECT_EQ(r.cuda.launches[0].block, 256u);  // 8 warps, a row each
  EXPECT_EQ(r.cuda.launches[0].grid, 8u);
  const auto rv = inductor::cuda_variants(*r.lowered, r.program, 0, o);
  EXPECT_EQ(rv.size(), 7u);
  inductor::CudaChoice block_rows;
  block_rows.rows_per_block = 1;
  block_rows.threads = 512;
  inductor::CudaChoice four;
  four.rows_per_block = 4;
  ASSERT_NE(std::find(rv.begin(), rv.end(), block_rows), rv.end());
  ASSERT_NE(std::find(rv.begin(), rv.end(), four), rv.end());
  o.choice = {block_rows};
  const Generated rb = generate(rows, o);
  EXPECT_EQ(rb.cuda.launches[0].block, 512u);
  EXPECT_EQ(rb.cuda.launches[0].grid, 64u);
  EXPECT_NE(rb.cuda.source.find("k_block_reduce"), std::string::npos);
  o.choice = {four};
  const Generated r4 = generate(rows, o);
  EXPECT_EQ(r4.cuda.launches[0].block, 128u);
  EXPECT_EQ(r4.cuda.launches[0].grid, 16u);
  // A column reduction: split into other numbers of parts, or not at all.
  const ir::Graph col = ir::parse(R"(graph {
  input %0 : f32[16384,384]{384,1} on cuda:0 input "dy"
  %1 : f32[384]{1} on cuda:0 = aten::sum.dim_IntList(%0, i[0], false, None)
  output %1 result "db"
}
)");
  o = {};
  const Generated c = generate(col, o);
  ASSERT_EQ(c.cuda.launches.size(), 2u);
  const auto cv = inductor::cuda_variants(*c.lowered, c.program, 0, o);
  ASSERT_GE(cv.size(), 3u);
  for (const auto& v : cv) {
    if (v.splits < 1) continue;
    EXPECT_LE(v.splits, 512);  // the combining kernel's 16 warps add 32 parts each
    o.choice = {v};
    const Generated g = generate(col, o);
    ASSERT_EQ(g.cuda.launches.size(), v.splits == 1 ? 1u : 2u) << inductor::describe(v);
    if (v.splits > 1) {
      EXPECT_EQ(g.cuda.launches[1].what, "column f32[384], " + std::to_string(v.splits) + " parts combined");
    }
  }
  // Trial programs hold only the plans asked for.
  o = {};
  o.only = {false};
  EXPECT_TRUE(generate(col, o).cuda.launches.empty());
}

// Every max-autotune variant of every corpus graph compiles under NVRTC for sm_90: one program per
// graph holding each variant's kernels under names of their own.
TEST_P(InductorCudaCodegen, EveryMaxAutotuneVariantCompilesWithNvrtc) {
  std::string why;
  auto nvrtc = nvrtc_or_skip_reason(&why);
  if (!nvrtc) GTEST_SKIP() << "no NVRTC on this machine: " << why;
  const Case& c = GetParam();
  const ir::Graph g = ir::parse(kiln::test::instantiate(c.graph->text, c.dtype));
  const VariantPrograms programs = variant_programs(g, {});
  const std::string& source = programs.source;
  std::vector<std::string> names;
  for (const auto& gen : programs.gens)
    for (const auto& l : gen.cuda.launches) names.push_back(l.name);
  if (names.empty()) GTEST_SKIP() << "no kernel of this graph has another variant";
  std::string cubin;
  try {
    cubin = nvrtc->compile(source, 90, c.graph->name + "_" + c.dtype + "_variants.cu");
  } catch (const plugin::Error& e) {
    FAIL() << e.what() << "\n---- source ----\n" << source;
  }
  const auto fns = kiln::test::cubin_functions(cubin);
  for (const auto& n : names) EXPECT_EQ(fns.count(n), 1u) << n;
}

// A flat kernel's consecutive threads walk the output in memory order: for a transposed weight
// cast to bfloat16, the innermost variable (the flat index modulo the row length) is the one with
// stride 1, in the store and in the load.
TEST(InductorCudaCodegen, FlatKernelsWalkTheOutputInMemoryOrder) {
  const Generated g = generate(ir::parse(R"(graph {
  input %0 : f32[1536,384]{384,1} on cuda:0 input "w"
  %1 : f32[384,1536]{1,384} on cuda:0 = aten::permute(%0, i[1, 0])
  %2 : bf16[384,1536]{1,384} on cuda:0 = aten::_to_copy(%1, dtype(bf16), None, None, None, false, None)
  output %2 result "w_bf16"
}
)"));
  ASSERT_EQ(g.cuda.launches.size(), 1u) << g.cuda.source;
  std::smatch inner;
  ASSERT_TRUE(std::regex_search(g.cuda.source, inner, std::regex(R"(const kidx (v[0-9]+) = \(i % 384\);)")))
      << g.cuda.source;
  const std::string v = inner[1].str();
  // The store and the load address the stride-1 dim with that variable (terms in either order).
  const std::string unit = R"((\+ 1 \* )" + v + R"([ )]))";
  EXPECT_TRUE(std::regex_search(g.cuda.source, std::regex(R"(b1\[\(0 [^\]]*)" + unit + R"([^\]]*\] = )")))
      << g.cuda.source;
  EXPECT_TRUE(std::regex_search(g.cuda.source, std::regex(R"(= b0\[\(0 [^\]]*)" + unit))) << g.cuda.source;
}

// A flat kernel whose every access walks memory with its one index moves 16-byte words: 8
// bfloat16 or 4 float32 elements per thread and access, behind a run-time alignment test, with
// the one-element loop kept for unaligned buffers. A start one element into the storage, or a
// broadcast, keeps the plain loop only.
TEST(InductorCudaCodegen, FlatKernelsMoveSixteenByteWordsWhenAligned) {
  for (const char* ty : {"bf16", "f32"}) {
    SCOPED_TRACE(ty);
    const std::string T = ty;
    const Generated g = generate(ir::parse(R"(graph {
  input %0 : )" + T + R"([64,48]{48,1} on cuda:0 input "x"
  %1 : )" + T + R"([64,48]{48,1} on cuda:0 = aten::gelu(%0, "none")
  output %1 result "y"
}
)"));
    ASSERT_EQ(g.cuda.launches.size(), 1u) << g.cuda.source;
    const std::string w = T == "bf16" ? "8" : "4";
    EXPECT_NE(g.cuda.source.find("k_vld<" + w + ">(a0, b0 + (0 + 1 * (ib)));"), std::string::npos) << g.cuda.source;
    EXPECT_NE(g.cuda.source.find("k_vst<" + w + ">(b1 + (0 + 1 * (ib)), o0);"), std::string::npos) << g.cuda.source;
    EXPECT_NE(g.cuda.source.find("if ((((unsigned long long)b0 & 15) | ((unsigned long long)b1 & 15)) == 0) {"),
              std::string::npos)
        << g.cuda.source;
    EXPECT_NE(g.cuda.source.find("i < 3072;"), std::string::npos) << "no one-element loop:\n" << g.cuda.source;
  }
  for (const char* graph : {R"(graph {
  input %0 : f32[3073]{1} on cuda:0 input "x"
  %1 : f32[3072]{1}+1 on cuda:0 = aten::slice.Tensor(%0, 0, 1, 3073, 1)
  %2 : f32[3072]{1} on cuda:0 = aten::mul.Scalar(%1, scalar(3))
  output %2 result "y"
}
)",
                            R"(graph {
  input %0 : f32[64,50]{50,1} on cuda:0 input "x"
  input %1 : f32[50]{1} on cuda:0 input "b"
  %2 : f32[64,50]{50,1} on cuda:0 = aten::add.Tensor(%0, %1, scalar(1))
  output %2 result "y"
}
)"}) {
    const Generated g = generate(ir::parse(graph));
    EXPECT_EQ(g.cuda.source.find("k_vld<"), std::string::npos) << g.cuda.source;
    EXPECT_EQ(g.cuda.source.find("i0"), std::string::npos) << g.cuda.source;
  }
  // A bias added along rows whose length is a multiple of the width: the rows' words and the
  // bias's words both move whole (the 4 elements of an iteration share their row), the row and
  // column found once per 4 elements.
  const Generated bias = generate(ir::parse(R"(graph {
  input %0 : bf16[64,48]{48,1} on cuda:0 input "x"
  input %1 : f32[48]{1} on cuda:0 input "b"
  %2 : f32[64,48]{48,1} on cuda:0 = aten::add.Tensor(%0, %1, scalar(1))
  %3 : bf16[64,48]{48,1} on cuda:0 = aten::_to_copy(%2, dtype(bf16), None, None, None, false, None)
  output %3 result "y"
}
)"));
  ASSERT_EQ(bias.cuda.launches.size(), 1u) << bias.cuda.source;
  EXPECT_NE(bias.cuda.source.find("const kidx ib = i0 % 48;"), std::string::npos) << bias.cuda.source;
  EXPECT_TRUE(std::regex_search(bias.cuda.source, std::regex(R"(k_vld<8>\(a[01], b0 \+ )"))) << bias.cuda.source;
  EXPECT_TRUE(std::regex_search(bias.cuda.source, std::regex(R"(k_vld<8>\(a[01], b1 \+ \(0 \+ 1 \* \(ib\)\)\);)")))
      << bias.cuda.source;
  EXPECT_NE(bias.cuda.source.find("k_vst<8>("), std::string::npos) << bias.cuda.source;
}

// A value the group returns only through a view of the same memory is computed into the
// output's buffer: no scratch copy and no second kernel that copies it.
TEST(InductorCudaCodegen, ResultSeenThroughAViewIsComputedIntoTheOutput) {
  const Generated g = generate(ir::parse(R"(graph {
  input %0 : bf16[16,64,96]{6144,96,1} on cuda:0 input "x"
  %1 : bf16[16,64,96]{6144,96,1} on cuda:0 = aten::gelu(%0, "none")
  %2 : bf16[1024,96]{96,1} on cuda:0 = aten::view(%1, i[1024, 96])
  output %2 result "y"
}
)"));
  ASSERT_EQ(g.cuda.launches.size(), 1u) << g.cuda.source;
  EXPECT_EQ(g.cuda.launches[0].buffers, (std::vector<int>{0, 1})) << g.cuda.source;  // x in, y out
  // A view that is not the same memory (a slice) still gets a buffer of its own.
  const Generated s = generate(ir::parse(R"(graph {
  input %0 : f32[16,96]{96,1} on cuda:0 input "x"
  %1 : f32[16,96]{96,1} on cuda:0 = aten::exp(%0)
  %2 : f32[16,48]{96,1} on cuda:0 = aten::slice.Tensor(%1, 1, 0, 48, 1)
  output %2 result "y"
}
)"));
  ASSERT_EQ(s.cuda.launches.size(), 1u) << s.cuda.source;
  EXPECT_NE(s.cuda.launches[0].what.find("[16,48]"), std::string::npos) << s.cuda.launches[0].what;
  for (const auto& l : s.cuda.launches)
    for (int b : l.buffers) EXPECT_LE(b, 1) << "the slice's output is written, no scratch: " << s.cuda.source;
}

// An optimizer update writes the parameter and its state over the old ones: each is read once, by
// the thread that writes it. Reads at other elements, or after the write, or by a later kernel,
// keep an output out of its input's memory.
// A large program compiles as several NVRTC programs: every kernel in exactly one part, in order,
// each part a whole source (the prelude's kernels in every one) that compiles on its own.
TEST(InductorCudaCodegen, LargeProgramsCompileInPartsThatEachStandAlone) {
  std::string why;
  auto nvrtc = nvrtc_or_skip_reason(&why);
  if (!nvrtc) GTEST_SKIP() << "no NVRTC on this machine: " << why;
  for (const auto& c : kiln::test::cuda_corpus()) {
    if (c.name != "layer_norm_fwd_bwd" && c.name != "softmax_fwd_bwd") continue;
    const Generated gen = generate(ir::parse(kiln::test::instantiate(c.text, "bf16")));
    ASSERT_GE(gen.cuda.launches.size(), 2u);
    EXPECT_EQ(inductor::split_program(gen.cuda, 1 << 20).size(), 1u) << "a small program is one part";
    EXPECT_EQ(inductor::split_program(gen.cuda, 1 << 20)[0].source, gen.cuda.source);
    const auto parts = inductor::split_program(gen.cuda, 1);
    ASSERT_EQ(parts.size(), gen.cuda.launches.size()) << c.name;
    int next = 0;
    for (const auto& part : parts) {
      for (int l : part.launches) EXPECT_EQ(l, next++);
      const auto fns = kiln::test::cubin_functions(nvrtc->compile(part.source, 90, c.name + "_part.cu"));
      for (int l : part.launches) EXPECT_EQ(fns.count(gen.cuda.launches[static_cast<size_t>(l)].name), 1u);
      for (const char* prelude_kernel : {"kiln_set_scalars", "kiln_strided_copy"})
        EXPECT_EQ(fns.count(prelude_kernel), 1u) << prelude_kernel;
    }
  }
}

TEST(InductorCudaCodegen, OutputsReplaceTheirInputsOnlyWhereEveryReadComesFirst) {
  auto accepted = [](const std::string& text, const std::vector<int64_t>& wanted) {
    const ir::Graph graph = ir::parse(text);
    inductor::CudaOptions o;
    for (size_t k = 0; k < wanted.size(); ++k)
      if (wanted[k] >= 0)
        o.may_alias.insert(static_cast<int>(wanted[k])), o.may_alias.insert(int(graph.inputs.size() + k));
    const Generated gen = generate(graph, o);
    for (int b : o.may_alias)
      EXPECT_EQ(gen.cuda.source.find("* __restrict__ b" + std::to_string(b) + ","), std::string::npos)
          << "buffer " << b << " may share memory, yet is __restrict__:\n"
          << gen.cuda.source;
    return inductor::inplace_outputs(gen.cuda, graph.inputs.size(), wanted);
  };
  for (const auto& c : kiln::test::cuda_corpus()) {
    if (c.name != "adamw_runtime_scalars" && c.name != "sgd_momentum") continue;
    for (const char* dt : {"f32", "bf16"}) {
      const ir::Graph graph = ir::parse(kiln::test::instantiate(c.text, dt));
      const auto wanted = inplace_wanted(graph, /*by_name=*/true);
      EXPECT_EQ(accepted(kiln::test::instantiate(c.text, dt), wanted), wanted) << c.name << " " << dt;
    }
  }
  // y = x + x^T reads x at the transposed element too.
  EXPECT_EQ(accepted(R"(graph {
  input %0 : f32[64,64]{64,1} on cuda:0 param "x"
  %1 : f32[64,64]{1,64} on cuda:0 = aten::t(%0)
  %2 : f32[64,64]{64,1} on cuda:0 = aten::add.Tensor(%0, %1, scalar(1))
  output %2 result "x"
}
)",
                     {0}),
            (std::vector<int64_t>{-1}));
  // x * 0.5 is an output, and a row sum reads it together with x: either the row kernel computes it
  // (not one thread per element) or a kernel after the one that writes it reads x.
  EXPECT_EQ(accepted(R"(graph {
  input %0 : f32[64,300]{300,1} on cuda:0 param "x"
  %1 : f32[64,300]{300,1} on cuda:0 = aten::mul.Scalar(%0, scalar(0.5))
  %2 : f32[64,300]{300,1} on cuda:0 = aten::mul.Tensor(%1, %0)
  %3 : f32[64]{1} on cuda:0 = aten::sum.dim_IntList(%2, i[1], false, None)
  output %1 result "x"
  output %3 result "s"
}
)",
                     {0, -1}),
            (std::vector<int64_t>{-1, -1}));
  // Extern calls after the writer (cuBLAS for another layer's weight gradient) keep the output in
  // place unless they read the input, or cannot say what they read.
  inductor::CudaProgram prog;
  inductor::CudaLaunch w;
  w.flat = true;
  w.reads = {0, 1};
  w.writes = {2};
  w.accesses = {{{false, 0, "(0 + 1 * v0)"}, {false, 1, "(0 + 1 * v0)"}, {true, 2, "(0 + 1 * v0)"}}};
  prog.launches = {w};
  prog.steps = {{0, -1}, {-1, 7}};
  EXPECT_EQ(inductor::inplace_outputs(prog, 2, {0}, {{}, {1, 3}}), (std::vector<int64_t>{0}));
  EXPECT_EQ(inductor::inplace_outputs(prog, 2, {0}, {{}, {0, 3}}), (std::vector<int64_t>{-1}));
  EXPECT_EQ(inductor::inplace_outputs(prog, 2, {0}, {{}, {-1}}), (std::vector<int64_t>{-1}));
  EXPECT_EQ(inductor::inplace_outputs(prog, 2, {0}), (std::vector<int64_t>{-1}));
  // Read at another element, or after the write: not in place.
  prog.launches[0].accesses = {{{false, 0, "(1 + 1 * v0)"}, {true, 2, "(0 + 1 * v0)"}}};
  EXPECT_EQ(inductor::inplace_outputs(prog, 2, {0}, {{}, {}}), (std::vector<int64_t>{-1}));
  prog.launches[0].accesses = {{{true, 2, "(0 + 1 * v0)"}, {false, 0, "(0 + 1 * v0)"}}};
  EXPECT_EQ(inductor::inplace_outputs(prog, 2, {0}, {{}, {}}), (std::vector<int64_t>{-1}));
  // Nothing offered, nothing accepted.
  EXPECT_EQ(accepted(R"(graph {
  input %0 : f32[64,300]{300,1} on cuda:0 param "x"
  %1 : f32[64,300]{300,1} on cuda:0 = aten::mul.Scalar(%0, scalar(0.5))
  output %1 result "x"
}
)",
                     {-1}),
            (std::vector<int64_t>{-1}));
}

// bfloat16 on the CPU: element-wise work is the C++ kernels' (stored as bfloat16, computed in float),
// a bf16 matmul stays with ATen there (eagerly it is faster than called from a group); a CPU value
// is never the CUDA target's.
TEST(InductorCudaCodegen, BfloatSixteenOnTheCpuIsGeneratedExceptItsExternOps) {
  const ir::Graph g = ir::parse(R"(graph {
  input %0 : bf16[4,8]{8,1} input "x"
  input %1 : bf16[8,3]{3,1} input "w"
  %2 : bf16[4,8]{8,1} = aten::relu(%0)
  %3 : bf16[4,3]{3,1} = aten::mm(%2, %1)
  output %3 result "y"
}
)");
  GraphView view(g);
  plugin::Graph pg(&view.view());
  inductor::LoweringOptions opts;
  EXPECT_EQ(inductor::why_not_claimed(pg, pg.node(0), opts), "");
  EXPECT_EQ(inductor::why_not_claimed(pg, pg.node(1), opts),
            "a bf16 extern op on the CPU (ATen's runs it faster eagerly)");
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

// Where CUDA kernels cannot be built (no driver or no NVRTC here, an nvrtc option naming nothing,
// cuda = false), the nodes on CUDA are not claimed and the debug log says why; the plugin's CPU
// nodes are still taken.
TEST(InductorCudaClaims, NodesOnCudaStayWithAtenWhenNoKernelsCanBeBuiltAndTheLogSaysWhy) {
  const ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[4,8]{8,1} on cuda:0 input "x"
  input %1 : f32[4,8]{8,1} input "y"
  %2 : f32[4,8]{8,1} on cuda:0 = aten::relu(%0)
  %3 : f32[4,8]{8,1} = aten::relu(%1)
  output %2 result "on_gpu"
  output %3 result "on_cpu"
}
)");
  bool driver = true;
  try {
    inductor::CudaDriver::load();
  } catch (const plugin::Error&) {
    driver = false;
  }
  const std::string bogus = "/nonexistent/kiln/libnvrtc.so.13";
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>> cases = {
      // CUDA kernels are the default: without the option, only a missing NVRTC or driver stops them.
      {{{"nvrtc", bogus}}, driver ? bogus : "libcuda.so.1"},
      {{{"cuda", "false"}}, "[plugin.inductor] cuda = false"},
      {{{"cuda", "true"}, {"nvrtc", bogus}}, driver ? bogus : "libcuda.so.1"},
  };
  for (const auto& [options, why] : cases) {
    TrainingArguments args;
    args.runtime.cache_dir = fresh_dir("claims");
    args.plugin_options["inductor"] = options;
    auto plugin = PluginRegistry::load_file(KILN_INDUCTOR_PLUGIN, torch_host_services(args));
    kiln::test::start_log_capture();
    GraphView view(g);
    EXPECT_EQ(plugin->claim(view.view()), std::vector<int64_t>{1}) << why;
    const std::string log = kiln::test::captured_log();
    EXPECT_NE(log.find("nodes on CUDA device 0 run on ATen: "), std::string::npos) << log;
    EXPECT_NE(log.find(why), std::string::npos) << log;
  }
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
  // Writes a program's size table (CudaProgram::size_table) into the library's kiln_sz, as the
  // plugin writes each module's.
  void set_sizes(const std::vector<uint64_t>& table) {
    if (table.empty()) return;
    void* at = dlsym(handle_, "kiln_sz");
    if (!at) throw std::runtime_error("the emulated library has no kiln_sz");
    std::memcpy(at, table.data(), table.size() * sizeof(uint64_t));
  }
  // Runs a kernel; "" on success, else what went wrong.
  std::string launch(const std::string& kernel, std::vector<void*> args, unsigned grid, unsigned block,
                     unsigned cluster) {
    void* fn = dlsym(handle_, kernel.c_str());
    if (!fn) return "no kernel " + kernel;
    const char* err = launch_(fn, static_cast<int>(args.size()), args.data(), grid, block, cluster);
    return err ? err : "";
  }

 private:
  using Launch = const char* (*)(void*, int, void**, unsigned, unsigned, unsigned);
  void* handle_ = nullptr;
  Launch launch_ = nullptr;
};

std::vector<Case> cases_without_externs() {
  std::vector<Case> cases;
  for (const auto& c : all_cases())
    if (c.graph->text.find("aten::addmm") == std::string::npos) cases.push_back(c);
  return cases;
}

// Runs a generated program's launches on the emulated device over fresh inputs (trial 1: every
// tensor one element into its storage, so unaligned) and checks each output against eager in
// float64 on the CPU: float32 within 1e-5, bfloat16 within 1e-2. `over`: by output, the input it is
// written over (in place), or -1.
void run_emulated(const Generated& gen, Emulated& device, const Case& c, int trial, const std::vector<int64_t>& over,
                  const std::string& label, const std::function<void(std::vector<at::Tensor>&)>& adjust = nullptr) {
  const ir::Graph g = ir::parse(kiln::test::instantiate(c.graph->text, c.dtype));
  const ir::Graph on_cpu = ir::parse(kiln::test::instantiate(c.graph->text, c.dtype, ""));
  const ir::Graph wide = ir::parse(kiln::test::instantiate(c.graph->text, "f64", ""));
  const double tol = c.dtype == "f32" ? 1e-5 : 1e-2;
  // The second trial moves every tensor one element into its storage: kernels that move 16-byte
  // words find their buffers unaligned and must take their one-element loop.
  auto shifted = [](const at::Tensor& t) {
    const int64_t elements = static_cast<int64_t>(t.storage().nbytes() / t.element_size());
    at::Tensor moved =
        at::empty({elements + 1}, t.options()).as_strided(t.sizes(), t.strides(), t.storage_offset() + 1);
    return moved.copy_(t);
  };
  auto inputs = make_inputs(on_cpu);
  if (adjust) adjust(inputs);
  if (trial == 1)
    for (auto& t : inputs) t = shifted(t);
  const auto scalars = make_scalars(g, trial);
  // The reference reads the inputs as they were: in-place outputs overwrite them.
  std::vector<at::Tensor> before;
  for (const auto& t : inputs) before.push_back(t.clone());
  std::vector<at::Tensor> outputs;
  for (size_t k = 0; k < on_cpu.outputs.size(); ++k) {
    const auto& m = on_cpu.value(on_cpu.outputs[k].value).meta;
    at::Tensor out = at::empty_strided(m.shape, m.strides, at::TensorOptions(m.dtype)).fill_(7);
    if (over[k] >= 0) out = inputs[static_cast<size_t>(over[k])];
    outputs.push_back(trial == 1 ? shifted(out) : out);
  }
  // The buffers by slot, as the plugin binds them: inputs, outputs, scratch.
  std::vector<void*> B;
  for (const auto& t : inputs) B.push_back(t.data_ptr());
  for (const auto& t : outputs) B.push_back(t.data_ptr());
  std::vector<std::vector<char>> scratch;
  for (int64_t bytes : gen.lowered->scratch_bytes) scratch.emplace_back(static_cast<size_t>(bytes) + 64, 0x7f);
  for (int64_t bytes : gen.cuda.extra_scratch_bytes) scratch.emplace_back(static_cast<size_t>(bytes) + 64, 0x7f);
  for (auto& s : scratch) B.push_back(s.data());
  std::vector<double> table(static_cast<size_t>(gen.cuda.scalar_table));
  for (size_t k = 0; k < table.size(); ++k) table[k] = scalars[k].toDouble();
  device.set_sizes(gen.cuda.size_table);
  for (const auto& st : gen.cuda.steps) {
    ASSERT_GE(st.launch, 0) << "an extern kernel";
    const auto& l = gen.cuda.launches[static_cast<size_t>(st.launch)];
    std::vector<void*> args;
    for (int b : l.buffers) args.push_back(B.at(static_cast<size_t>(b)));
    if (l.scalars) args.push_back(table.data());
    ASSERT_EQ(device.launch(l.name, args, l.grid, l.block, l.cluster), "") << l.name << " (" << l.what << ") " << label;
  }
  std::vector<at::Tensor> wide_inputs;
  for (const auto& t : before) wide_inputs.push_back(t.is_floating_point() ? t.to(at::kDouble) : t);
  const auto ref = run_eager(wide, wide_inputs, scalars, /*check_meta=*/false);
  // The graph's own types are right (what eager in its dtype makes), as on a GPU; but layer
  // norm's statistics are float32 for bfloat16 input on CUDA only.
  if (trial == 0 && c.graph->text.find("native_layer_norm") == std::string::npos)
    run_eager(on_cpu, before, scalars, /*check_meta=*/true);
  for (size_t k = 0; k < outputs.size(); ++k) {
    const std::string name = c.graph->name + " " + c.dtype + " output " + std::to_string(k) + " (" + g.outputs[k].name +
                             ") " + label + (over[k] >= 0 ? " written over input " + std::to_string(over[k]) : "");
    if (!ref[k].is_floating_point()) {
      EXPECT_TRUE(at::equal(outputs[k], ref[k])) << name << "\n" << outputs[k] << "\n" << ref[k];
      continue;
    }
    // Relative to the output's norm, or absolute where the output is a sum that cancels (a mean of
    // 231 values near zero; the corpus's inputs are of order 1), as rtol and atol.
    const double abs_err = (outputs[k].to(at::kDouble) - ref[k]).abs().max().item<double>();
    if (abs_err <= tol) continue;
    EXPECT_LE(rel_error(outputs[k], ref[k]), tol) << name << " (largest absolute error " << abs_err << ")\n"
                                                  << outputs[k] << "\n"
                                                  << ref[k];
  }
}

}  // namespace

class InductorCudaEmulated : public ::testing::TestWithParam<Case> {};

// ATen compares a bfloat16 tensor against a Scalar converted to bfloat16: 0.3 is 0.30078125 there,
// so x = 0.30078125 is <= 0.3 and > 0.3 is false for it. The generated kernel must say the same
// (comparing in float against 0.3 says the opposite), on the values around the rounded scalar.
TEST(InductorCudaEmulatedOps, ABfloat16TensorComparesWithTheScalarRoundedToBfloat16) {
  const Generated gen = generate(ir::parse(R"(graph {
  input %0 : bf16[4]{1} on cuda:0 input "x"
  %1 : bool[4]{1} on cuda:0 = aten::le.Scalar(%0, scalar(0.3))
  %2 : bool[4]{1} on cuda:0 = aten::gt.Scalar(%0, scalar(0.3))
  %3 : bool[4]{1} on cuda:0 = aten::eq.Scalar(%0, scalar(0.3))
  output %1 result "le"
  output %2 result "gt"
  output %3 result "eq"
}
)"));
  Emulated device(gen.cuda.source);
  const at::Tensor x = at::tensor({0.298828125, 0.30078125, 0.302734375, -0.3}).to(at::kBFloat16);
  std::vector<at::Tensor> outs;
  for (int k = 0; k < 3; ++k) outs.push_back(at::zeros({4}, at::kBool));
  std::vector<void*> B{x.data_ptr()};
  for (auto& t : outs) B.push_back(t.data_ptr());
  for (const auto& st : gen.cuda.steps) {
    ASSERT_GE(st.launch, 0);
    const auto& l = gen.cuda.launches[static_cast<size_t>(st.launch)];
    std::vector<void*> args;
    for (int b : l.buffers) args.push_back(B.at(static_cast<size_t>(b)));
    ASSERT_FALSE(l.scalars);
    ASSERT_EQ(device.launch(l.name, args, l.grid, l.block, l.cluster), "") << l.name;
  }
  // What LibTorch eager says in bfloat16, and the values written out.
  EXPECT_TRUE(at::equal(outs[0], x.le(0.3))) << outs[0];
  EXPECT_TRUE(at::equal(outs[1], x.gt(0.3))) << outs[1];
  EXPECT_TRUE(at::equal(outs[2], x.eq(0.3))) << outs[2];
  EXPECT_TRUE(at::equal(outs[0], at::tensor({1, 1, 0, 1}).to(at::kBool)));
  EXPECT_TRUE(at::equal(outs[2], at::tensor({0, 1, 0, 0}).to(at::kBool)));
}

// Horizontal fusion on a hand-made program (grid-stride kernels that copy a buffer into another,
// plus one), checked step by step: a launch moves later past what it does not touch, never past a
// reader of what it writes, a writer of what it reads or writes, an extern kernel that touches
// either, an extern kernel that touches what no one can name, or an input that shares memory with
// what it writes; the fused launch runs each member's blocks with its own block index and grid.
TEST(InductorCudaEmulatedOps, SmallLaunchesFuseOnlyWhereNothingBetweenDependsOnThem) {
  auto kernel = [](const std::string& tag, int in, int out, unsigned grid) {
    inductor::CudaLaunch l;
    l.name = "kiln_k" + tag;
    l.grid = grid;
    l.block = 64;
    l.buffers = {in, out};
    const std::string a = "float* __restrict__ b" + std::to_string(in),
                      b = "float* __restrict__ b" + std::to_string(out);
    l.params = {a, b};
    l.reads = {in};
    l.writes = {out};
    l.text = "// " + l.name + "\nKILN_KERNEL(64) " + l.name + "(" + a + ", " + b +
             ") {\n  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < 1000; i += gridDim.x * blockDim.x)\n"
             "    b" +
             std::to_string(out) + "[i] = b" + std::to_string(in) + "[i] + 1.0f;\n}\n\n";
    return l;
  };
  // Buffers: 0-1 inputs, 10-15 results; extern steps stand for what a GEMM would read and write.
  inductor::CudaProgram p;
  auto add = [&](inductor::CudaLaunch l) {
    p.steps.push_back({static_cast<int>(p.launches.size()), -1});
    p.launches.push_back(std::move(l));
  };
  add(kernel("A", 0, 10, 3));   // 0
  p.steps.push_back({-1, 7});   // 1: reads 10, writes 11
  add(kernel("B", 11, 12, 2));  // 2: needs the extern's 11
  add(kernel("C", 1, 13, 5));   // 3
  add(kernel("D", 13, 14, 4));  // 4: needs C's 13
  add(kernel("F", 1, 15, 1));   // 5: may share memory with input 0, which G reads
  add(kernel("G", 0, 16, 1));   // 6
  std::vector<std::set<int>> touches(p.steps.size());
  touches[1] = {10, 11};
  std::string bodies;
  for (const auto& l : p.launches) bodies += l.text;
  p.source = std::string(inductor::cuda_prelude()) + "\n" + bodies;
  inductor::FuseLimits limits;
  limits.multiprocessors = 2;
  inductor::CudaProgram fused = p;
  EXPECT_EQ(inductor::fuse_small_launches(fused, touches, {{15, 0}}, limits), 3);
  auto order = [](const inductor::CudaProgram& q) {
    std::string s;
    for (const auto& st : q.steps) {
      const inductor::CudaLaunch* l = st.launch < 0 ? nullptr : &q.launches[static_cast<size_t>(st.launch)];
      s += (s.empty() ? "" : "; ") + (!l ? std::string("extern") : l->what.empty() ? l->name.substr(6) : l->what);
    }
    return s;
  };
  // A stays before the extern kernel that reads its 10. B and D sink to G's place (D after C,
  // which it reads); C joins F (it cannot pass D); F cannot pass G (G reads input 0, which F's 15
  // may overwrite).
  EXPECT_EQ(order(fused), "A; extern; fused 2 launches (kC, kF); fused 3 launches (kB, kD, kG)") << fused.source;
  // Nothing moves past an extern kernel that touches what no one can name.
  inductor::CudaProgram barrier = p;
  std::vector<std::set<int>> unknown = touches;
  unknown[1] = {11, -1};
  EXPECT_EQ(inductor::fuse_small_launches(barrier, unknown, {{15, 0}}, limits), 3);
  EXPECT_EQ(order(barrier), order(fused));
  inductor::CudaProgram across = p;
  across.steps = {p.steps[3], p.steps[1], p.steps[5]};  // C, the extern kernel, F: both read 1
  EXPECT_EQ(order(across), "C; extern; F");
  inductor::CudaProgram joined = across;
  EXPECT_EQ(inductor::fuse_small_launches(joined, {{}, {10, 11}, {}}, {}, limits), 1);
  EXPECT_EQ(order(joined), "extern; fused 2 launches (kC, kF)");
  EXPECT_EQ(inductor::fuse_small_launches(across, {{}, {-1}, {}}, {}, limits), 0);
  EXPECT_EQ(order(across), "C; extern; F");
  auto run = [](const inductor::CudaProgram& q) {
    Emulated device(q.source);
    std::vector<std::vector<float>> mem(17, std::vector<float>(1000, 0.0f));
    for (int i = 0; i < 1000; ++i)
      mem[0][static_cast<size_t>(i)] = static_cast<float>(i), mem[1][static_cast<size_t>(i)] = -i;
    for (const auto& st : q.steps) {
      if (st.launch < 0) {  // the extern kernel: 11 = 2 * 10
        for (int i = 0; i < 1000; ++i) mem[11][static_cast<size_t>(i)] = 2 * mem[10][static_cast<size_t>(i)];
        continue;
      }
      const auto& l = q.launches[static_cast<size_t>(st.launch)];
      std::vector<void*> args;
      for (int b : l.buffers) args.push_back(mem[static_cast<size_t>(b)].data());
      EXPECT_EQ(device.launch(l.name, args, l.grid, l.block, l.cluster), "") << l.name;
    }
    return mem;
  };
  EXPECT_EQ(run(fused), run(p));
}

// The launches of each corpus graph, with their grids and blocks, on the emulated device (2
// multiprocessors: grid-stride loops go round), against eager in float64 on the CPU: float32
// within 1e-5, bfloat16 within 1e-2.
TEST_P(InductorCudaEmulated, GeneratedKernelsMatchFloat64Eager) {
  const Case& c = GetParam();
  const ir::Graph g = ir::parse(kiln::test::instantiate(c.graph->text, c.dtype));
  inductor::CudaOptions options;
  options.multiprocessors = 2;
  const Generated gen0 = generate(g, options);
  Emulated device0(gen0.cuda.source);
  // Trials 2 and 3 write each output the analysis accepts in place over its input (proposed by
  // name, then by layout alone), in a program generated for that (no __restrict__ on those).
  std::vector<Generated> inplace_gen;
  std::vector<std::vector<int64_t>> inplace_ok;
  for (bool by_name : {true, false}) {
    const auto wanted = inplace_wanted(g, by_name);
    inductor::CudaOptions o = options;
    for (size_t k = 0; k < wanted.size(); ++k)
      if (wanted[k] >= 0) o.may_alias.insert(static_cast<int>(wanted[k])), o.may_alias.insert(int(g.inputs.size() + k));
    inplace_gen.push_back(generate(g, o));
    inplace_ok.push_back(inductor::inplace_outputs(inplace_gen.back().cuda, g.inputs.size(), wanted));
  }
  for (int trial = 0; trial < 4; ++trial) {
    const Generated& gen = trial < 2 ? gen0 : inplace_gen[static_cast<size_t>(trial - 2)];
    const std::vector<int64_t> none(g.outputs.size(), -1);
    const std::vector<int64_t>& over = trial < 2 ? none : inplace_ok[static_cast<size_t>(trial - 2)];
    if (trial >= 2 && std::all_of(over.begin(), over.end(), [](int64_t j) { return j < 0; })) continue;
    std::unique_ptr<Emulated> own;
    if (trial >= 2) own = std::make_unique<Emulated>(gen.cuda.source);
    run_emulated(gen, own ? *own : device0, c, trial, over, "trial " + std::to_string(trial));
  }
  // Trial 4: small launches fused horizontally (fuse_small_launches; at most 40 parameters a
  // launch, what the emulator calls), with the outputs trial 2 writes in place.
  const auto wanted = inplace_wanted(g, true);
  inductor::CudaOptions o = options;
  std::map<int, int> same_memory;
  for (size_t k = 0; k < wanted.size(); ++k)
    if (wanted[k] >= 0) {
      o.may_alias.insert(static_cast<int>(wanted[k]));
      o.may_alias.insert(static_cast<int>(g.inputs.size() + k));
      same_memory[static_cast<int>(g.inputs.size() + k)] = static_cast<int>(wanted[k]);
    }
  Generated fused = generate(g, o);
  const auto over = inductor::inplace_outputs(fused.cuda, g.inputs.size(), wanted);
  inductor::FuseLimits limits;
  limits.multiprocessors = 2;
  limits.max_params = 40;
  if (inductor::fuse_small_launches(fused.cuda, {}, same_memory, limits) > 0) {
    Emulated device(fused.cuda.source);
    run_emulated(fused, device, c, 4, over, "trial 4 (fused launches)");
  }
}

// Batch norm's statistics on CUDA are one pass of float64 sums of the deviations from each
// channel's first element. Far from zero (a mean of 100) and with that first element an outlier
// (40 standard deviations off), the squares are 1,600 times the variance: float32 sums would lose
// three digits to the cancellation and miss 1e-5; the float64 ones match float64 eager.
TEST(InductorCudaEmulatedOps, BatchNormStatisticsHoldFarFromZeroAndWithAnOutlierFirst) {
  for (const char* name : {"batch_norm", "batch_norm_channels_last"}) {
    const CorpusGraph* graph = nullptr;
    for (const auto& g : kiln::test::cuda_corpus())
      if (g.name == name) graph = &g;
    ASSERT_NE(graph, nullptr) << name;
    const Case c{graph, "f32"};
    const Generated gen = generate(ir::parse(kiln::test::instantiate(graph->text, "f32")));
    Emulated device(gen.cuda.source);
    run_emulated(gen, device, c, 0, std::vector<int64_t>(gen.lowered->num_outputs, -1), "far from zero",
                 [](std::vector<at::Tensor>& in) {
                   at::Tensor& x = in[0];  // the batch norm's input: [N, C, ...]
                   x.add_(100.0);
                   for (int64_t ch = 0; ch < x.size(1); ++ch) {
                     at::Tensor first = x.select(1, ch);
                     while (first.dim() > 0) first = first.select(0, 0);
                     first.add_(ch % 2 ? 40.0 : -40.0);
                   }
                 });
  }
}

// Pieces of a transformer's step over a batch of B sequences of L tokens (width 96): layer norm
// forward and backward, GELU, attention scores' softmax and its backward over rows of L, a bias
// gradient over the B*L rows, a mean over everything, cross-entropy over B*L tokens.
namespace {
std::string shaped_steps(int64_t B, int64_t L) {
  std::string text = R"(graph {
  input %0 : {T}[{B},{L},96]{{L96},96,1} {D} input "x"
  input %1 : {T}[96]{1} {D} input "w"
  input %2 : {T}[96]{1} {D} input "b"
  input %3 : {T}[{B},{L},96]{{L96},96,1} {D} input "go"
  input %4 : {T}[{B},{L},{L}]{{LL},{L},1} {D} input "s"
  input %5 : {T}[{B},{L},{L}]{{LL},{L},1} {D} input "gs"
  input %6 : {T}[{BL},5]{5,1} {D} input "logits"
  input %7 : i64[{BL}]{1} {D} input "target_ignore"
  %8 : {T}[{B},{L},96]{{L96},96,1} {D}, %9 : f32[{B},{L},1]{{L},1,1} {D}, %10 : f32[{B},{L},1]{{L},1,1} {D} = aten::native_layer_norm(%0, i[96], %1, %2, 1e-05)
  %11 : {T}[{B},{L},96]{{L96},96,1} {D}, %12 : {T}[96]{1} {D}, %13 : {T}[96]{1} {D} = aten::native_layer_norm_backward(%3, %0, i[96], %9, %10, %1, %2, b[true, true, true])
  %14 : {T}[{B},{L},96]{{L96},96,1} {D} = aten::gelu(%8, "tanh")
  %15 : {T}[{B},{L},{L}]{{LL},{L},1} {D} = aten::_softmax(%4, -1, false)
  %16 : {T}[{B},{L},{L}]{{LL},{L},1} {D} = aten::_softmax_backward_data(%5, %15, -1, dtype({T}))
  %17 : {T}[96]{1} {D} = aten::sum.dim_IntList(%14, i[0, 1], false, None)
  %18 : {T}[]{} {D} = aten::mean(%3, None)
  %19 : {T}[{BL},5]{5,1} {D} = aten::_log_softmax(%6, 1, false)
  %20 : {T}[]{} {D}, %21 : {T}[]{} {D} = aten::nll_loss_forward(%19, %7, None, 1, -100)
  output %8 result "y"
  output %11 result "dx"
  output %12 result "dw"
  output %13 result "db"
  output %14 result "gelu"
  output %16 result "softmax_bwd"
  output %17 result "bias_grad"
  output %18 result "mean"
  output %20 result "loss"
}
)";
  auto replace_all = [&](const std::string& from, const std::string& to) {
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
      text.replace(at, from.size(), to);
  };
  replace_all("{L96}", std::to_string(L * 96));
  replace_all("{LL}", std::to_string(L * L));
  replace_all("{BL}", std::to_string(B * L));
  replace_all("{B}", std::to_string(B));
  replace_all("{L}", std::to_string(L));
  return text;
}
}  // namespace

// Sizes as arguments (resolve_sizes). The program of a first shape and of a second differ only in
// their marked numbers; the numbers that differ become reads of kiln_sz, and with the same choice
// a third and a fourth shape, which neither program was generated for, give the second's source
// to the letter: one library, compiled once, runs all three with each shape's table and grids, and
// matches float64 eager. The numbers no shape changes (the width 96) stay in the text. Also with
// small launches fused (their grids are among the numbers).
TEST(InductorCudaEmulatedOps, KernelsWithSizesAsArgumentsServeShapesTheyWereNotGeneratedFor) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{2, 17}, {3, 19}, {4, 13}, {5, 11}};
  for (const char* dtype : {"f32", "bf16"})
    for (bool fuse : {false, true}) {
      const std::string label = std::string(dtype) + (fuse ? ", fused launches" : "");
      std::vector<CorpusGraph> graphs;
      std::vector<Generated> gens;
      for (const auto& [B, L] : shapes) {
        graphs.push_back(
            CorpusGraph{"shaped_steps_" + std::to_string(B) + "x" + std::to_string(L), shaped_steps(B, L), -1});
        inductor::CudaOptions o;
        o.multiprocessors = 2;
        o.size_markers = true;
        gens.push_back(generate(ir::parse(kiln::test::instantiate(graphs.back().text, dtype)), o));
        ASSERT_TRUE(gens.back().cuda.marked);
        if (fuse) {
          inductor::FuseLimits limits;
          limits.multiprocessors = 2;
          limits.max_params = 40;
          inductor::fuse_small_launches(gens.back().cuda, {}, {}, limits);
        }
      }
      const std::string skeleton = inductor::size_skeleton(gens[0].cuda);
      for (size_t i = 1; i < gens.size(); ++i)
        ASSERT_EQ(inductor::size_skeleton(gens[i].cuda), skeleton) << label << ": shape " << i;
      const auto first = inductor::size_literals(gens[0].cuda), second = inductor::size_literals(gens[1].cuda);
      ASSERT_EQ(first.size(), second.size());
      std::vector<bool> hoist(first.size());
      size_t differ = 0;
      for (size_t k = 0; k < first.size(); ++k) differ += (hoist[k] = first[k] != second[k]) ? 1 : 0;
      ASSERT_GT(differ, 0u) << label;
      ASSERT_LT(differ, first.size()) << label << ": every number changed, the width too";
      for (size_t i = 1; i < gens.size(); ++i) {
        EXPECT_EQ(inductor::resolve_sizes(gens[i].cuda, hoist), differ) << label;
        EXPECT_FALSE(gens[i].cuda.marked);
      }
      // The first shape, with nothing hoisted: literals only, its comments kept.
      EXPECT_EQ(inductor::resolve_sizes(gens[0].cuda, {}), 0u);
      EXPECT_EQ(gens[0].cuda.source.find("kiln_sz"), std::string::npos);
      EXPECT_EQ(gens[0].cuda.source.find('\x01'), std::string::npos);
      EXPECT_NE(gens[1].cuda.source.find("kiln_sz"), std::string::npos);
      EXPECT_NE(gens[1].cuda.source.find("96"), std::string::npos) << "the width is a constant";
      for (size_t i = 2; i < gens.size(); ++i)
        ASSERT_EQ(gens[i].cuda.source, gens[1].cuda.source) << label << ": shape " << i << " gave another source";
      // NVRTC takes the table and its reads, and the cubin gives the host the table by name.
      std::string why;
      if (auto nvrtc = nvrtc_or_skip_reason(&why)) {
        const std::string cubin = nvrtc->compile(gens[1].cuda.source, 90, "sizes_as_arguments.cu");
        const auto fns = kiln::test::cubin_functions(cubin);
        for (const auto& l : gens[1].cuda.launches) EXPECT_TRUE(fns.count(l.name)) << l.name << " " << label;
        EXPECT_TRUE(kiln::test::cubin_objects(cubin).count("kiln_sz")) << label;
      }
      Emulated once(gens[1].cuda.source);
      for (size_t i = 1; i < gens.size(); ++i) {
        const Case c{&graphs[i], dtype};
        const std::vector<int64_t> none(gens[i].lowered->num_outputs, -1);
        run_emulated(gens[i], once, c, 0, none, label + ", " + graphs[i].name);
        run_emulated(gens[i], once, c, 1, none, label + ", " + graphs[i].name + " unaligned");
      }
      Emulated own(gens[0].cuda.source);
      run_emulated(gens[0], own, Case{&graphs[0], dtype}, 0, std::vector<int64_t>(gens[0].lowered->num_outputs, -1),
                   label + ", the first shape with its sizes as constants");
    }
}

// What a dynamic step meets: the same kernels at every sequence length from 16 to 64 (batch 64,
// bfloat16, an H100's 132 multiprocessors, small launches fused), so that after the second length
// no length compiles again. Choices that once followed the length made other kernel texts: the
// warps combining a split column reduction's parts, and unrolling a row loop only when the row
// was long.
TEST(InductorCudaCodegenShapes, EveryLengthOfADynamicStepHasTheSameKernels) {
  std::string first;
  for (int64_t T = 16; T <= 64; ++T) {
    inductor::CudaOptions o;
    o.multiprocessors = 132;
    o.size_markers = true;
    Generated g = generate(ir::parse(kiln::test::instantiate(shaped_steps(64, T), "bf16")), o);
    inductor::FuseLimits limits;
    limits.multiprocessors = 132;
    inductor::fuse_small_launches(g.cuda, {}, {}, limits);
    const std::string skeleton = inductor::size_skeleton(g.cuda);
    if (first.empty()) first = skeleton;
    ASSERT_EQ(skeleton, first) << "length " << T << " has other kernels than length 16";
  }
}

// max-autotune's variants (cuda_variants: other blocks, grids, rows a block, column splits) of
// every kernel of every corpus graph compute what the defaults compute.
TEST_P(InductorCudaEmulated, EveryMaxAutotuneVariantMatchesFloat64Eager) {
  const Case& c = GetParam();
  const ir::Graph g = ir::parse(kiln::test::instantiate(c.graph->text, c.dtype));
  inductor::CudaOptions options;
  options.multiprocessors = 2;
  // One emulated library holds every variant.
  const VariantPrograms programs = variant_programs(g, options);
  const auto& gens = programs.gens;
  const auto& labels = programs.labels;
  if (gens.empty()) GTEST_SKIP() << "no kernel of this graph has another variant";
  Emulated device(programs.source);
  for (size_t i = 0; i < gens.size(); ++i)
    run_emulated(gens[i], device, c, 0, std::vector<int64_t>(g.outputs.size(), -1), labels[i]);
}

INSTANTIATE_TEST_SUITE_P(Corpus, InductorCudaEmulated, ::testing::ValuesIn(cases_without_externs()), case_name);

// ---- On a GPU: the plugin against eager ----------------------------------------------------------

namespace {

std::shared_ptr<LoadedPlugin> load_plugin(const std::string& cache_dir) {
  TrainingArguments args;
  args.runtime.cache_dir = cache_dir;
  args.plugin_options["inductor"]["cuda"] = "true";
  return PluginRegistry::load_file(KILN_INDUCTOR_PLUGIN, torch_host_services(args));
}

// Each output of `got` against eager's: integers and bools exactly, floats within `tol` (or, for a
// result that cancels, within `tol` of the float64 result, which LibTorch's own float result is
// not; and for a sum that cancels to near zero, a rare draw of fresh inputs, within `tol` of the
// float64 result relative to the same graph's result on the inputs' magnitudes, the bound a float
// sum in any order keeps). Returns the worst error.
double expect_close(const ir::Graph& g, const std::vector<at::Tensor>& inputs, const std::vector<c10::IValue>& scalars,
                    const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& ref, double tol,
                    const std::string& what) {
  double worst = 0;
  for (size_t k = 0; k < g.outputs.size(); ++k) {
    const std::string name = what + " output " + std::to_string(k) + " (" + g.outputs[k].name + ")";
    if (!got[k].defined()) {
      ADD_FAILURE() << name << " undefined";
      continue;
    }
    EXPECT_EQ(got[k].device(), ref[k].device()) << name;
    EXPECT_EQ(got[k].scalar_type(), ref[k].scalar_type()) << name;
    EXPECT_EQ(got[k].sizes(), ref[k].sizes()) << name;
    if (!ref[k].is_floating_point()) {
      EXPECT_TRUE(at::equal(got[k].cpu(), ref[k].cpu())) << name;
      continue;
    }
    double rel = rel_error(got[k], ref[k]);
    if (rel > tol) {
      std::vector<at::Tensor> wide;
      for (const auto& t : inputs) wide.push_back(t.is_floating_point() ? t.to(at::kDouble) : t);
      try {
        const auto exact = run_eager(g, wide, scalars);
        rel = std::min(rel, rel_error(got[k], exact[k]));
        if (rel > tol) {
          std::vector<at::Tensor> magnitudes;
          for (const auto& t : wide) magnitudes.push_back(t.is_floating_point() ? t.abs() : t);
          const auto scale = run_eager(g, magnitudes, scalars);
          const double bound = scale[k].to(at::kDouble).abs().norm().item<double>();
          const double err = (got[k].to(at::kDouble).cpu() - exact[k].to(at::kDouble).cpu()).norm().item<double>();
          if (bound > 0 && std::isfinite(err)) rel = std::min(rel, err / bound);
        }
      } catch (const std::exception&) {
        // a graph that does not run in float64 (a dtype argument): the first answer stands
      }
    }
    EXPECT_LE(rel, tol) << name;
    worst = std::max(worst, rel);
  }
  return worst;
}

}  // namespace

class InductorNumericsCuda : public ::testing::TestWithParam<Case> {};

TEST_P(InductorNumericsCuda, MatchesEagerOnCudaTensors) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  const Case& c = GetParam();
  const ir::Graph g = ir::parse(kiln::test::instantiate(c.graph->text, c.dtype));
  auto plugin = load_plugin(fresh_dir("num"));
  PartitionedExecutor exec(g, plugin, KILN_MODE_DEFAULT);
  const PartitionStats& st = exec.stats();
  ASSERT_TRUE(st.compile_errors.empty()) << st.compile_errors[0];
  // Every node but a view or matmul that would only add a copy (the plugin's claim rules).
  EXPECT_GE(st.claimed + 1, st.nodes);
  // What the host hands out (a view at a group's end runs eagerly instead) all compiles.
  EXPECT_EQ(st.nodes_compiled, st.claimed - st.claims_dropped);
  EXPECT_GE(st.groups_compiled, 1u);
  const double tol = c.dtype == "f32" ? 1e-5 : 1e-2;
  double worst = 0;
  for (int trial = 0; trial < 2; ++trial) {
    const auto inputs = make_inputs(g);
    const auto scalars = make_scalars(g, trial);
    const auto ref = run_eager(g, inputs, scalars);
    std::vector<at::Tensor> env(g.values.size());
    for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs[i].value] = inputs[i];
    exec.run(env, &scalars);
    worst = std::max(worst, expect_close(g, inputs, scalars, outputs_of(g, env), ref, tol,
                                         c.graph->name + " " + c.dtype + " trial " + std::to_string(trial)));
  }
  std::printf("%s %s: %zu of %zu nodes compiled in %zu groups, worst rel err %.2e\n", c.graph->name.c_str(),
              c.dtype.c_str(), st.nodes_compiled, st.nodes, st.groups_compiled, worst);
}

INSTANTIATE_TEST_SUITE_P(Corpus, InductorNumericsCuda, ::testing::ValuesIn(all_cases()), case_name);

// Inputs and outputs with other strides than the group was compiled for (a transposed input, a
// column slice with an offset, a transposed output) are copied into and out of the compiled
// layout on the device; a tensor on the CPU is refused, naming it.
TEST(InductorLayoutCuda, OtherStridesAreCopiedOnTheDeviceAndOtherDevicesRefused) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  const ir::Graph g = ir::parse(R"(graph {
  input %0 : f32[7,5]{5,1} on cuda:0 input "x"
  input %1 : f32[7,5]{5,1} on cuda:0 input "y"
  %2 : f32[7,5]{5,1} on cuda:0 = aten::mul.Tensor(%0, %1)
  %3 : f32[7,5]{5,1} on cuda:0 = aten::exp(%2)
  output %3 result "y"
}
)");
  auto plugin = load_plugin(fresh_dir("strides"));
  GraphView view(g);
  ASSERT_EQ(plugin->claim(view.view()).size(), 2u);
  auto exe = plugin->compile(view.view(), KILN_MODE_DEFAULT, {{"cuda", "true"}}, fresh_dir("strides"));
  const auto opts = at::TensorOptions().device(at::kCUDA);
  at::Tensor x = at::randn({5, 7}, opts).t();
  at::Tensor y = at::randn({7, 9}, opts).slice(1, 2, 7);
  at::Tensor out = at::empty({5, 7}, opts).t();  // a transposed output
  std::vector<DLTensor> in = {to_dl_tensor(x), to_dl_tensor(y)};
  DLTensor o = to_dl_tensor(out);
  exe->execute(in.data(), in.size(), &o, 1);
  EXPECT_LE(rel_error(out, at::exp(x * y)), 1e-6);
  at::Tensor cpu_x = x.cpu().contiguous();
  in[0] = to_dl_tensor(cpu_x);
  try {
    exe->execute(in.data(), in.size(), &o, 1);
    ADD_FAILURE() << "a CPU tensor was taken";
  } catch (const PluginError& e) {
    EXPECT_NE(std::string(e.what()).find("input 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not CUDA device 0"), std::string::npos) << e.what();
  }
}

// A second compile of the same group (another process, or the next run) loads the cubin from the
// cache: NVRTC runs once.
TEST(InductorCacheCuda, ASecondCompileOfTheSameGroupIsACacheHit) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  const ir::Graph g = ir::parse(kiln::test::instantiate(kiln::test::cuda_corpus()[1].text, "f32"));
  const std::string dir = fresh_dir("cache_gpu");
  size_t cubins = 0;
  for (int run = 0; run < 2; ++run) {
    auto plugin = load_plugin(dir);
    kiln::test::start_log_capture();
    PartitionedExecutor exec(g, plugin, KILN_MODE_DEFAULT);
    EXPECT_EQ(exec.stats().groups_compiled, 1u);
    const std::string log = kiln::test::captured_log();
    EXPECT_NE(log.find(run == 0 ? "compiled " : "cache hit "), std::string::npos) << log;
  }
  for (const auto& e : fs::directory_iterator(fs::path(dir) / "inductor")) cubins += e.path().extension() == ".cubin";
  EXPECT_EQ(cubins, 1u);
}

// Sizes as arguments on the device: a graph compiled at four sequence lengths runs NVRTC for two
// of them — the first shape with its sizes as constants, the
// second with the sizes that changed read from the module's table — and the third and fourth
// shapes load the second's cubins with their own table. Every shape matches eager.
TEST(InductorCacheCuda, ANewShapeOfTheSameKernelsCompilesNothing) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  const std::string dir = fresh_dir("sizes_gpu");
  auto plugin = load_plugin(dir);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{4, 17}, {4, 19}, {4, 21}, {4, 23}};
  for (const char* dtype : {"f32", "bf16"})
    for (size_t i = 0; i < shapes.size(); ++i) {
      const std::string what =
          std::string(dtype) + " shape " + std::to_string(shapes[i].first) + "x" + std::to_string(shapes[i].second);
      const ir::Graph g = ir::parse(kiln::test::instantiate(shaped_steps(shapes[i].first, shapes[i].second), dtype));
      kiln::test::start_log_capture();
      PartitionedExecutor exec(g, plugin, KILN_MODE_DEFAULT);
      const std::string log = kiln::test::captured_log();
      ASSERT_TRUE(exec.stats().compile_errors.empty()) << exec.stats().compile_errors[0];
      EXPECT_GE(exec.stats().groups_compiled, 1u) << what;
      if (i == 0) {
        EXPECT_NE(log.find("compiled "), std::string::npos) << what << "\n" << log;
        EXPECT_EQ(log.find("sizes as arguments"), std::string::npos) << what << "\n" << log;
      } else {
        EXPECT_NE(log.find("sizes as arguments"), std::string::npos) << what << "\n" << log;
        EXPECT_EQ(log.find(i == 1 ? "cache hit " : "compiled "), std::string::npos) << what << "\n" << log;
      }
      const auto inputs = make_inputs(g);
      const auto ref = run_eager(g, inputs, {});
      std::vector<at::Tensor> env(g.values.size());
      for (size_t k = 0; k < inputs.size(); ++k) env[g.inputs[k].value] = inputs[k];
      exec.run(env, nullptr);
      expect_close(g, inputs, {}, outputs_of(g, env), ref, std::string(dtype) == "f32" ? 1e-5 : 1e-2, what);
    }
}

// max-autotune on CUDA times every variant of every kernel on the first compile (a progress line
// per kernel), keeps the winners in the cache, so that the next compile times nothing, and the
// tuned group computes what eager computes: rows, a split column with its epilogue, and AdamW's
// run-time scalars.
TEST(InductorTuneCuda, MaxAutotuneTimesTheVariantsOnceAndKeepsTheWinners) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  for (const std::string name : {"layer_norm_fwd_bwd", "column_split_then_update", "adamw_runtime_scalars"}) {
    const auto& corpus = kiln::test::cuda_corpus();
    const auto it = std::find_if(corpus.begin(), corpus.end(), [&](const auto& c) { return c.name == name; });
    ASSERT_NE(it, corpus.end()) << name;
    const ir::Graph g = ir::parse(kiln::test::instantiate(it->text, "f32"));
    const std::string dir = fresh_dir("tune");
    for (int run = 0; run < 2; ++run) {
      auto plugin = load_plugin(dir);
      kiln::test::start_log_capture();
      PartitionedExecutor exec(g, plugin, KILN_MODE_MAX_AUTOTUNE_NO_CUDAGRAPHS);
      const std::string log = kiln::test::captured_log();
      ASSERT_TRUE(exec.stats().compile_errors.empty()) << exec.stats().compile_errors[0];
      EXPECT_GE(exec.stats().groups_compiled, 1u);
      EXPECT_EQ(log.find("cannot time"), std::string::npos) << log;
      if (run == 0) {
        EXPECT_NE(log.find("max-autotune: CUDA kernel 1/"), std::string::npos) << log;
      } else {
        EXPECT_NE(log.find("max-autotune: using the tuned CUDA kernels"), std::string::npos) << log;
        EXPECT_EQ(log.find("max-autotune: CUDA kernel"), std::string::npos) << log;
      }
      const auto inputs = make_inputs(g);
      const auto scalars = make_scalars(g, run);
      const auto ref = run_eager(g, inputs, scalars);
      std::vector<at::Tensor> env(g.values.size());
      for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs[i].value] = inputs[i];
      exec.run(env, &scalars);
      expect_close(g, inputs, scalars, outputs_of(g, env), ref, 1e-5, name + " run " + std::to_string(run));
    }
    size_t tunes = 0;
    for (const auto& e : fs::directory_iterator(fs::path(dir) / "inductor")) tunes += e.path().extension() == ".cutune";
    EXPECT_EQ(tunes, 1u) << name;
  }
}

// ---- On a GPU: whole training steps --------------------------------------------------------------

namespace {

// Deterministic kernels, as `kiln bench --check` on CUDA: LibTorch eager then matches itself, and
// what differs between kiln and eager is kiln's own arithmetic.
struct Deterministic {
  Deterministic() {
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    auto& c = at::globalContext();
    c.setDeterministicCuDNN(true);
    c.setDeterministicAlgorithms(true, /*warn_only=*/true);
    c.setSDPUseFlash(false), c.setSDPUseMemEfficient(false), c.setSDPUseCuDNN(false), c.setSDPUseMath(true);
  }
  ~Deterministic() {
    auto& c = at::globalContext();
    c.setDeterministicAlgorithms(false, false);
    c.setSDPUseFlash(true), c.setSDPUseMemEfficient(true), c.setSDPUseCuDNN(true);
  }
};

// `steps` steps of a workload compiled with inductor on CUDA against LibTorch eager from the same
// weights and batch: losses and final parameters within `tol`, or, where the trajectory is
// ill-conditioned, within ten times the noise floor (LibTorch eager again from weights one ulp
// away, as `kiln bench --check` and the conformance suite judge); groups compiled on CUDA, none
// failed. `dtype`: "" for the workload's own (gpt: bf16 autocast), "f32" without autocast.
void expect_step_parity(const std::string& name, const std::string& mode, double tol, const std::string& dtype = "",
                        int steps = 20) {
  Deterministic deterministic;
  const uint64_t seed = 97531;
  const WorkloadOptions opts{"cuda", seed, 0, "", dtype};
  auto ref = make_workload(name, opts), w = make_workload(name, opts), noisy = make_workload(name, opts);
  {
    at::NoGradGuard no_grad;
    for (auto& p : noisy.model->parameters()) p.mul_(1 + std::ldexp(1.0, -23) * (2 * at::rand_like(p) - 1));
  }
  auto ref_step = workload_step(ref), noisy_step = workload_step(noisy);
  TrainingArguments args;
  args.torch_compile = true;
  args.torch_compile_backend = "inductor";
  args.torch_compile_mode = mode;
  args.runtime.plugin_dirs = {KILN_INTREE_PLUGIN_DIR};
  args.runtime.cache_dir = fresh_dir("step_" + name);
  args.plugin_options["inductor"]["cuda"] = "true";
  auto step = compile_step(workload_step(w), {{w.model}, {w.optimizer.get()}}, args);
  double worst_loss = 0, worst_loss_floor = 0;
  for (int s = 0; s < steps; ++s) {
    auto want = ref_step({ref.input, ref.target})[0];
    auto floor_loss = noisy_step({noisy.input, noisy.target})[0];
    auto got = step({w.input, w.target})[0];
    ASSERT_TRUE(got.defined()) << "step " << s;
    const double e = rel_error(got, want), floor = rel_error(floor_loss, want);
    if (e > worst_loss) worst_loss = e, worst_loss_floor = floor;
    EXPECT_LE(e, std::max(tol, 10 * floor)) << name << " loss at step " << s << ": " << got.item<float>() << " vs "
                                            << want.item<float>() << " (eager one ulp away: " << floor << ")";
  }
  const StepStats& st = step.stats();
  EXPECT_GE(st.compiled_steps, steps - 2) << st.last_fallback;
  size_t compiled = 0, nodes = 0;
  for (const auto& o : st.groups) {
    EXPECT_TRUE(o.compiled || o.declined) << o.first_op << ": " << o.reason;
    if (o.compiled) compiled++, nodes += o.nodes;
    if (o.declined) std::printf("  declined: %zu nodes from %s: %s\n", o.nodes, o.first_op.c_str(), o.reason.c_str());
  }
  EXPECT_GT(compiled, 0u) << "no group ran inductor's CUDA kernels";
  double worst = 0, worst_floor = 0;
  std::string at_name;
  auto pr = ref.model->named_parameters(), pw = w.model->named_parameters(), pn = noisy.model->named_parameters();
  ASSERT_EQ(pr.size(), pw.size());
  for (size_t i = 0; i < pr.size(); ++i) {
    const double e = rel_error(pw[i].value(), pr[i].value()), floor = rel_error(pn[i].value(), pr[i].value());
    if (e > worst) worst = e, worst_floor = floor, at_name = pr[i].key();
    EXPECT_LE(e, std::max(tol, 10 * floor))
        << name << " parameter " << pr[i].key() << " (eager one ulp away: " << floor << ")";
  }
  std::printf(
      "%s%s inductor/%s on CUDA: %zu groups compiled (%zu nodes), %d compiled steps, worst loss rel err %.2e (floor "
      "%.2e), worst parameter rel err %.2e at %s (floor %.2e)\n",
      name.c_str(), dtype.empty() ? "" : (" " + dtype).c_str(), mode.c_str(), compiled, nodes, st.compiled_steps,
      worst_loss, worst_loss_floor, worst, at_name.c_str(), worst_floor);
}

}  // namespace

// Generated kernels reorder float sums: 1e-4 over 20 steps, as on the CPU (kiln bench --check).
TEST(InductorStepCuda, Mlp20StepsMatchEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  expect_step_parity("mlp", "default", 1e-4);
}

// bf16 autocast: 1e-2, as every bf16 comparison in kiln.
TEST(InductorStepCuda, GptBf16Autocast20StepsMatchEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  expect_step_parity("gpt", "default", 1e-2);
}

// The generated kernels recorded into the whole-step CUDA graph (run-time scalars lifted into
// device tensors first, so that nothing the graph bakes changes between steps).
TEST(InductorStepCuda, MlpReduceOverheadGraphsTheGeneratedKernels) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  expect_step_parity("mlp", "reduce-overhead", 1e-4);
}

// Without autocast every generated kernel is float32: 1e-4 over 20 steps, in both modes (the
// graphed step reads AdamW's lifted bias corrections from device tensors).
TEST(InductorStepCuda, GptFloat32MatchesEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  expect_step_parity("gpt", "default", 1e-4, "f32");
}
TEST(InductorStepCuda, GptFloat32ReduceOverheadMatchesEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  expect_step_parity("gpt", "reduce-overhead", 1e-4, "f32");
}
TEST(InductorStepCuda, GptBf16AutocastReduceOverheadMatchesEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  expect_step_parity("gpt", "reduce-overhead", 1e-2, "", 30);
}
TEST(InductorStepCuda, Cnn20StepsMatchEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  expect_step_parity("cnn", "default", 1e-4);
}

// ---- Matmuls through cuBLASLt, their neighbours folded into the epilogues (gemm_fold.h) ----

namespace {

// The node whose (first) result is value `id` of a whole-graph view.
int64_t node_making(const plugin::Graph& g, int64_t id) {
  for (size_t i = 0; i < g.num_nodes(); ++i)
    if (g.node(static_cast<int64_t>(i)).outputs()[0] == id) return static_cast<int64_t>(i);
  ADD_FAILURE() << "no node makes %" << id;
  return -1;
}

std::string fold_text(const inductor::GemmPlan& plan) {
  std::string s;
  for (const auto& [node, f] : plan.gemms) {
    s += "node " + std::to_string(node) + ": " + f.spec.describe() + " folds";
    for (int64_t u : f.folded) s += " " + std::to_string(u);
    s += "\n";
  }
  return s;
}

// A parsed graph and its whole-graph view as the plugin sees it (neither moves: the view points
// into the graph).
struct ViewedGraph {
  explicit ViewedGraph(const std::string& text) : g(ir::parse(text)), view(g), pg(&view.view()) {}
  ir::Graph g;
  GraphView view;
  plugin::Graph pg;
};

// One run of `exec` on fresh inputs (no run-time scalars) against eager; the worst error.
double run_against_eager(const ir::Graph& g, PartitionedExecutor& exec, double tol, const std::string& what) {
  const auto inputs = make_inputs(g);
  const std::vector<c10::IValue> scalars;
  const auto ref = run_eager(g, inputs, scalars);
  std::vector<at::Tensor> env(g.values.size());
  for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs[i].value] = inputs[i];
  exec.run(env, &scalars);
  return expect_close(g, inputs, scalars, outputs_of(g, env), ref, tol, what);
}

inductor::GemmPlan plan_of(const plugin::Graph& pg, bool epilogues = true,
                           std::function<std::string(const inductor::GemmSpec&)> supported = nullptr) {
  if (!supported) supported = [](const inductor::GemmSpec&) { return std::string(); };
  return inductor::plan_gemms(pg, epilogues, supported);
}

}  // namespace

// A GPT-2 MLP block, forward and backward, in bfloat16: every matmul is a cuBLASLt GEMM, and the
// tanh GELU (whose input the backward reads: written as aux), the residual add, GELU's backward
// and both bias gradients are computed by GEMMs instead of generated kernels.
TEST(InductorGemmPlan, AnMlpBlockFoldsItsGeluResidualAndBiasGradientsIntoTheGemms) {
  const ViewedGraph vg(kiln::test::instantiate(kiln::test::mlp_block_tanh_text(), "bf16"));
  const plugin::Graph& pg = vg.pg;
  const inductor::GemmPlan plan = plan_of(pg);
  const std::string text = fold_text(plan);
  ASSERT_EQ(plan.gemms.size(), 6u) << text;
  auto fold = [&](int64_t id) -> const inductor::GemmFold& { return plan.gemms.at(node_making(pg, id)); };
  EXPECT_NE(fold(8).spec.describe().find("GELU_AUX_BIAS"), std::string::npos) << text;
  EXPECT_EQ(fold(8).d, 10);
  EXPECT_EQ(fold(8).aux_out, 8);  // the backward reads the GELU's input through %9
  EXPECT_NE(fold(13).spec.describe().find("BIAS + C"), std::string::npos) << text;
  EXPECT_EQ(fold(13).c, 0);  // the residual: the block's input
  EXPECT_EQ(fold(13).d, 15);
  EXPECT_NE(fold(17).spec.describe().find("DGELU_BGRAD"), std::string::npos) << text;
  EXPECT_EQ(fold(17).aux_in, 9);
  EXPECT_EQ(fold(17).bias_grad, 25);
  EXPECT_NE(fold(21).spec.describe().find("BGRADA"), std::string::npos) << text;
  EXPECT_EQ(fold(21).bias_grad, 23);
  EXPECT_NE(fold(27).spec.describe().find("DEFAULT"), std::string::npos) << text;
  EXPECT_NE(fold(28).spec.describe().find("DEFAULT"), std::string::npos) << text;
  EXPECT_EQ(plan.folded_into.size(), 5u) << text;
  // The second matmul's result and its view feed only the folded add: nothing keeps them.
  EXPECT_TRUE(plan.dead.count(13) && plan.dead.count(14));
  EXPECT_FALSE(plan.dead.count(8)) << "the GELU's input is read by the backward";

  // Lowered with the plan: the folded nodes' results are the GEMMs' extern results, the dead
  // values get no buffer, and no generated kernel computes what a GEMM does.
  inductor::LoweringOptions opts;
  opts.target = inductor::Target::Cuda;
  opts.runtime_scalars = true;
  opts.gemms = &plan;
  auto L = inductor::lower(pg, opts);
  const inductor::Program P = inductor::schedule(*L);
  for (int64_t id : {10, 15, 19, 23, 25}) {
    EXPECT_EQ(L->values[static_cast<size_t>(id)].kind, inductor::ValueInfo::Kind::Extern) << "%" << id;
    EXPECT_EQ(L->values[static_cast<size_t>(id)].ext.node, plan.folded_into.at(node_making(pg, id))) << "%" << id;
    EXPECT_GE(L->values[static_cast<size_t>(id)].buffer, 0) << "%" << id;
  }
  EXPECT_LT(L->values[13].buffer, 0) << "a dead matmul result got a buffer";
  size_t extern_steps = 0;
  for (const auto& st : P.steps) extern_steps += st.extern_node >= 0;
  EXPECT_EQ(extern_steps, 6u);
  EXPECT_TRUE(P.kernels.empty()) << P.kernels.size() << " kernels for a block the GEMMs compute whole";
  // The GELU's input (the first GEMM's aux) is computed before the GEMM that reads it.
  std::vector<int> step_of_node(pg.num_nodes(), -1);
  for (size_t k = 0; k < P.steps.size(); ++k)
    if (P.steps[k].extern_node >= 0) step_of_node[static_cast<size_t>(P.steps[k].extern_node)] = static_cast<int>(k);
  EXPECT_LT(step_of_node[static_cast<size_t>(node_making(pg, 8))],
            step_of_node[static_cast<size_t>(node_making(pg, 17))]);
  // Generated for CUDA all the same (the kernels that remain: none here).
  const inductor::CudaProgram prog = inductor::generate_cuda(*L, P, {});
  EXPECT_TRUE(prog.launches.empty());
}

// In float32 the GELU and its backward stay generated (cuBLASLt's GELU is not ATen's to float32
// precision); the bias gradient of GELU's backward then folds as the row sums of the transposed
// gradient that the weight's GEMM reads (BGRADB). An erf GELU, an add of two dtypes and anything
// the heuristics refuse are never folded.
TEST(InductorGemmPlan, WhatIsNotTheSameComputationIsNotFolded) {
  {
    const ViewedGraph vg(kiln::test::instantiate(kiln::test::mlp_block_tanh_text(), "f32"));
    const plugin::Graph& pg = vg.pg;
    const inductor::GemmPlan plan = plan_of(pg);
    const std::string text = fold_text(plan);
    ASSERT_EQ(plan.gemms.size(), 6u) << text;
    EXPECT_EQ(plan.gemms.at(node_making(pg, 8)).spec.describe().find("GELU"), std::string::npos) << text;
    EXPECT_EQ(plan.gemms.at(node_making(pg, 17)).spec.describe().find("GELU"), std::string::npos) << text;
    EXPECT_NE(plan.gemms.at(node_making(pg, 13)).spec.describe().find("BIAS + C"), std::string::npos) << text;
    EXPECT_NE(plan.gemms.at(node_making(pg, 27)).spec.describe().find("BGRADB"), std::string::npos) << text;
    EXPECT_EQ(plan.gemms.at(node_making(pg, 27)).bias_grad, 25) << text;
  }
  {
    std::string erf = kiln::test::instantiate(kiln::test::mlp_block_tanh_text(), "bf16");
    for (size_t at = erf.find("\"tanh\""); at != std::string::npos; at = erf.find("\"tanh\"", at))
      erf.replace(at, 6, "\"none\"");
    const ViewedGraph vg(erf);
    const inductor::GemmPlan plan = plan_of(vg.pg);
    for (const auto& [node, f] : plan.gemms)
      EXPECT_EQ(f.spec.describe().find("GELU"), std::string::npos) << fold_text(plan);
  }
  {
    const ViewedGraph vg(R"(graph {
  input %0 : f32[16,16]{16,1} on cuda:0 input "r"
  input %1 : bf16[16,16]{16,1} on cuda:0 input "a"
  input %2 : bf16[16,16]{16,1} on cuda:0 input "b"
  %3 : bf16[16,16]{16,1} on cuda:0 = aten::mm(%1, %2)
  %4 : f32[16,16]{16,1} on cuda:0 = aten::add.Tensor(%0, %3, scalar(1))
  output %4 result "y"
}
)");
    const inductor::GemmPlan plan = plan_of(vg.pg);
    EXPECT_EQ(plan.gemms.size(), 1u);
    EXPECT_TRUE(plan.folded_into.empty()) << fold_text(plan);
  }
  {
    // The heuristics refuse every epilogue but the plain one: the matmuls run alone, addmm's with
    // a bias stays ATen's, and nothing folds.
    const ViewedGraph vg(kiln::test::instantiate(kiln::test::mlp_block_tanh_text(), "bf16"));
    const plugin::Graph& pg = vg.pg;
    const inductor::GemmPlan plan = plan_of(pg, true, [](const inductor::GemmSpec& s) {
      return s.describe().find("DEFAULT") == std::string::npos ? std::string("no algorithm") : std::string();
    });
    EXPECT_EQ(plan.gemms.size(), 4u) << fold_text(plan);
    EXPECT_TRUE(plan.folded_into.empty()) << fold_text(plan);
    const inductor::GemmPlan alone = plan_of(pg, false);
    EXPECT_EQ(alone.gemms.size(), 6u);
    EXPECT_TRUE(alone.folded_into.empty()) << fold_text(alone);
  }
}

// The same block on a GPU: cuBLASLt's GEMMs with the folds against eager (bfloat16 within 1e-2,
// float32 within 1e-5), and the log counts the folds; `gemm = "aten"` gives the same results
// through ATen's matmuls.
TEST(InductorGemmCuda, FoldedEpiloguesMatchEager) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  for (const char* dtype : {"bf16", "f32"}) {
    for (const char* gemm : {"epilogues", "aten"}) {
      const ir::Graph g = ir::parse(kiln::test::instantiate(kiln::test::mlp_block_tanh_text(), dtype));
      TrainingArguments args;
      args.runtime.cache_dir = fresh_dir("gemm");
      args.plugin_options["inductor"]["cuda"] = "true";
      args.plugin_options["inductor"]["gemm"] = gemm;
      auto plugin = PluginRegistry::load_file(KILN_INDUCTOR_PLUGIN, torch_host_services(args));
      kiln::test::start_log_capture();
      PartitionedExecutor exec(g, plugin, KILN_MODE_DEFAULT);
      ASSERT_TRUE(exec.stats().compile_errors.empty()) << exec.stats().compile_errors[0];
      const std::string log = kiln::test::captured_log();
      const std::string what = std::string(dtype) + " gemm=" + gemm;
      if (std::string(gemm) == "epilogues") {
        const std::string want = std::string(dtype) == "bf16" ? "5 nodes folded" : "3 nodes folded";
        EXPECT_NE(log.find(want), std::string::npos) << what << ": " << log;
      } else {
        EXPECT_EQ(log.find("cuBLASLt"), std::string::npos) << what << ": " << log;
      }
      double worst = 0;
      for (int trial = 0; trial < 2; ++trial)
        worst = std::max(worst, run_against_eager(g, exec, std::string(dtype) == "f32" ? 1e-5 : 1e-2, what));
      std::printf("mlp_block_tanh %s: worst rel err %.2e\n", what.c_str(), worst);
    }
  }
}

// max-autotune times the heuristics' first algorithms of every GEMM once, saying so line by line,
// and keeps the winners in the compile cache: a second compile reads them and times nothing.
TEST(InductorGemmCuda, MaxAutotuneTimesEachGemmOnceAndKeepsTheWinners) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << kNoCuda;
  const ir::Graph g = ir::parse(kiln::test::instantiate(kiln::test::mlp_block_tanh_text(), "bf16"));
  const std::string cache = fresh_dir("gemm_tune");
  TrainingArguments args;
  args.runtime.cache_dir = cache;
  args.plugin_options["inductor"]["cuda"] = "true";
  args.plugin_options["inductor"]["gemm"] = "epilogues";
  auto plugin = PluginRegistry::load_file(KILN_INDUCTOR_PLUGIN, torch_host_services(args));
  for (int round = 0; round < 2; ++round) {
    kiln::test::start_log_capture();
    PartitionedExecutor exec(g, plugin, KILN_MODE_MAX_AUTOTUNE_NO_CUDAGRAPHS);
    ASSERT_TRUE(exec.stats().compile_errors.empty()) << exec.stats().compile_errors[0];
    const std::string log = kiln::test::captured_log();
    if (round == 0) {
      EXPECT_NE(log.find("max-autotune: gemm 1/"), std::string::npos) << log;
      EXPECT_EQ(log.find("algorithms from the cache"), std::string::npos) << log;
    } else {
      EXPECT_EQ(log.find("max-autotune: gemm 1/"), std::string::npos) << "timed again: " << log;
      EXPECT_NE(log.find("algorithms from the cache"), std::string::npos) << log;
    }
    run_against_eager(g, exec, 1e-2, "max-autotune round " + std::to_string(round));
  }
}
