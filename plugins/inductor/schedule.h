// Scheduling: which materialized values share a loop nest, and in what order kernels and extern
// calls run.
//
// A kernel is one loop nest with an outer iteration space O, run in parallel over O; inside each
// outer iteration its stages run in order: a reduction whose result is indexed by O (kept in a
// register for the stages after it), or a pointwise loop over the rest of its shape. So a row of
// log-softmax (max, sum of exp, output) or of layer norm is one pass of one kernel, and pointwise
// producers are inlined into the loops that read them. A reduction over leading dims (a bias
// gradient) gets a "column" kernel that vectorizes across the kept dim instead.
#pragma once

#include <cstdint>
#include <set>
#include <vector>

#include "loop_ir.h"

namespace kiln::inductor {

// Elements of work below which a kernel runs on one thread: the scheduler keeps large stages of
// other shapes out of kernels without an outer loop by it, and the emitter parallelizes by it.
inline constexpr int64_t kParallelThreshold = 32768;

struct KernelPlan {
  std::vector<int64_t> outer;
  std::vector<int> stages;  // materialized values, in order
  bool column = false;
  int64_t work = 0;  // elements touched, for the parallel threshold
  // Pointwise stages of one shape whose every access walks some neighbouring dims as one run of
  // memory: the loops are over these groups of dims (outermost first; dims of extent 1 belong to
  // none), `outer` over the leading groups. Empty: one loop per dim.
  std::vector<std::vector<int>> groups;
  // With groups: one loop over every element, each stage computed and stored in turn, later stages
  // reading earlier ones from registers (they read them only at their own index).
  bool flat = false;
};

struct Step {
  int kernel = -1;       // a generated kernel, or
  int extern_node = -1;  // a node run through call_eager
};

struct Program {
  std::vector<KernelPlan> kernels;
  std::vector<Step> steps;
};

Program schedule(const LoweredGraph& L);

// The C++ kernels' loop order: a kernel of one pointwise stage walks its result in memory order
// (its largest stride outermost), as ATen's TensorIterator does, so that a cast of a transposed
// weight reads and writes runs of memory instead of striding through both. Its elements are
// independent, so any order computes the same.
void walk_stores_in_memory_order(const LoweredGraph& L, Program& P);

// The CUDA kernels' sibling reductions: consecutive column kernels of one shape over the same
// reduced range (a batch norm backward's sum of the gradient and sum of the gradient times the
// normalized input, over the same NHWC rows), none reading another's result, become one kernel
// of up to `most` stages that reads the rows once. The CPU emitter keeps one stage a column kernel.
void join_sibling_columns(const LoweredGraph& L, Program& P, size_t most = 4);

// Whether stage `v` may run in a kernel whose outer space has `rank` dims and that already computes
// `in_kernel`: it reads those values only at its own outer index (and through no reshape).
bool legal_in_kernel(const LoweredGraph& L, int v, size_t rank, const std::set<int>& in_kernel);

// The dims of `shape` that every access of the stages (loads, stores, index values) walks as one
// contiguous run, as groups of neighbouring dims (outermost first; dims of extent 1 belong to
// none): a loop over a group's elements with the group's last dim as its variable addresses them
// all (codegen's merged loops).
std::vector<std::vector<int>> merged_dims(const LoweredGraph& L, const std::vector<int>& stages,
                                          const std::vector<int64_t>& shape);

// Shape arithmetic the emitter shares with the scheduler, so both see the same loops.
std::vector<int64_t> stripped(std::vector<int64_t> s);  // without trailing dims of extent 1
int64_t prod(const std::vector<int64_t>& s);
int64_t group_size(const std::vector<int64_t>& shape, const std::vector<int>& group);  // a merged loop's extent

}  // namespace kiln::inductor
