// What the ipex backend takes (claim) and how a claimed subgraph becomes oneDNN primitives
// (compile): matmul (mm, addmm, bmm) with bias and fused element-wise post-ops (relu, gelu, add),
// relu and gelu forward and backward (eltwise), softmax and log-softmax forward and backward, layer
// norm forward and backward, convolution forward and backward. float32 always, bfloat16 where the
// CPU has AVX-512-BF16 or AMX (computed with float32 accumulation). Primitives are made once per
// compiled group (its shapes are fixed) and reused by every execute.
#pragma once

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

// The compiled group; throws Unimplemented for what it does not lower and Error otherwise.
std::unique_ptr<kiln::plugin::Executable> compile_group(const kiln::plugin::Graph& g, const Support& support);

}  // namespace kiln::ipex
