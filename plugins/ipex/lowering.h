// What the ipex backend takes (claim) and how a claimed subgraph becomes oneDNN primitives
// (compile): matmul (mm, addmm, bmm) with bias and fused element-wise post-ops (relu, gelu, add),
// relu and gelu forward and backward (eltwise), softmax and log-softmax forward and backward, layer
// norm forward and backward, convolution forward and backward. float32 always, bfloat16 where the
// CPU has AVX-512-BF16 or AMX (computed with float32 accumulation). Primitives are made once per
// compiled group (its shapes are fixed) and reused by every execute.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <kiln/plugin_api.hpp>

namespace kiln::ipex {

struct Support {
  bool bf16 = false;  // bf16 tensors are claimed
};

// Whether oneDNN dispatches bf16 kernels on this CPU (AVX-512-BF16 or AMX); false when oneDNN
// is not loaded.
bool cpu_has_bf16();

// Why node `i` is not taken, or "" when it is.
std::string why_not(const kiln::plugin::Graph& g, int64_t i, const Support& support);

// max-autotune-no-cudagraphs: every implementation oneDNN offers for a matmul (the same layouts and
// post-ops) is timed once on scratch data and the fastest kept when it beats oneDNN's own first
// choice by 3% or more; the winner goes into `dir` (<dir>/<key>.tune, one per matmul shape and
// post-ops, oneDNN version and CPU ISA) and later compiles read it instead of timing again.
// Convolutions keep oneDNN's first choice (docs/backends/ipex.md says why).
struct Tuning {
  bool enabled = false;
  std::string dir;                               // "" : winners are not kept
  std::function<void(const std::string&)> info;  // one line per tuned matmul
  std::function<void(const std::string&)> warn;  // a cache file that could not be used
};

// The compiled group; throws Unimplemented for what it does not lower and Error otherwise.
// `profile` ([plugin.ipex] profile = true): every primitive, reorder and host loop of the group is
// timed on each execute, and where the time went is printed to stderr when the process exits.
std::unique_ptr<kiln::plugin::Executable> compile_group(const kiln::plugin::Graph& g, const Support& support,
                                                        const Tuning& tuning = {}, bool profile = false);

}  // namespace kiln::ipex
