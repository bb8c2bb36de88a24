// CUDA generation: the kernels of a scheduled program (schedule.h) as one CUDA C++ source for
// NVRTC, after the CUDA prelude (cuda_prelude.h), with how to launch each.
//
// Each kernel plan of the scheduler becomes one or more launches:
//  - pointwise plans: "flat" kernels, one thread per element in a grid-stride loop over the flat
//    index (the loop IR's index math per dim, dims that every access walks as one run merged into
//    one variable); stages of one shape that read each other only at their own index share one
//    loop and pass values in registers (SGD's buffer and weight, Adam's moments and weight);
//  - row plans (a reduction with its prologue and epilogue stages): one block, or one warp when
//    rows are short, per outer index; the stages run in order inside it, reductions accumulate in
//    float (double for float64) per thread and combine with warp shuffles (and shared memory across
//    warps), every thread gets the result in a register, and a stage that reads what another thread
//    of the row wrote waits at a barrier first. So a layer norm, softmax or log-softmax row is one
//    kernel; a plan without outer dims (a full reduction) is one block. With few long rows (batch
//    norm's channels) on sm_90 and later, each row is shared by the blocks of a thread-block
//    cluster, which combine their partial results through distributed shared memory in a fixed
//    order (every block gets the same bits);
//  - column plans (bias gradients): 32 kept elements per block across the lanes of a warp
//    (coalesced), the reduced range split over the block's warps, combined in shared memory; with
//    few columns also split across blocks into partial results that a second kernel combines in
//    a fixed order;
//  - scatter plans (an embedding's gradient, Reduction::scatter): the tokens in parts, each block
//    adding its part into a table of rows x its columns in shared memory (a thread a column, in
//    token order, no atomics), the parts' tables combined in part order by a second kernel.
// bfloat16 is loaded into float, computed in float and rounded to nearest even on store. Index
// math is 32-bit unless a buffer or a loop reaches 2^30 elements. Run-time scalars are read from a
// device table (P[k] is run-time scalar k); constant scalars are literals.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "loop_ir.h"
#include "schedule.h"

namespace kiln::inductor {

// How to launch one kernel plan other than by the defaults (max-autotune). Zero (or -1 for
// `splits`) leaves a choice to the defaults' heuristics.
struct CudaChoice {
  int threads = 0;         // flat kernels and row blocks: threads a block
  int blocks_per_sm = 0;   // flat kernels: the grid-stride loop's blocks a multiprocessor (-1: no cap)
  int rows_per_block = 0;  // row plans: 1 = a block per row, n > 1 = a warp per row, n a block
  int64_t splits = -1;     // column and scatter plans: parts the reduced range is split into (1: not split)
  int cluster = 0;         // row plans of a block a row: blocks of a cluster that share a row (1: one block)
  bool operator==(const CudaChoice& o) const {
    return threads == o.threads && blocks_per_sm == o.blocks_per_sm && rows_per_block == o.rows_per_block &&
           splits == o.splits && cluster == o.cluster;
  }
};
std::string describe(const CudaChoice& c);  // "block 512", "a warp a row, 4 rows a block", "defaults"

struct CudaOptions {
  int multiprocessors = 132;  // grid-stride kernels get at most 16 blocks per multiprocessor
  // major * 10 + minor of the GPU: from 90 on, a row plan with few rows may split each row across
  // a thread-block cluster.
  int compute_capability = 90;
  // Buffer slots that may share memory with another slot at run time (in-place outputs and the
  // inputs they replace): their kernel parameters are not __restrict__.
  std::set<int> may_alias;
  // By kernel plan (Program::kernels): how to generate it (missing entries: the defaults), and,
  // when not empty, which plans to generate at all (max-autotune's trial programs hold only the
  // plans that have the trial's variant).
  std::vector<CudaChoice> choice;
  std::vector<bool> only;
  // Whether a split column reduction's combining kernel also runs the pointwise plan after it.
  // Trial programs time each plan alone, so they generate without it.
  bool absorb_epilogues = true;
  // Keep the numbers the kernels derive from sizes marked in the texts (resolve_sizes), so that
  // the caller can make them arguments; otherwise they are written as literals.
  bool size_markers = false;
};

// One memory access of a flat kernel, in the order the source makes them.
struct CudaAccess {
  bool store = false;
  int buffer = -1;
  std::string index;  // the element offset, as the loop IR's index (the same text for the same element)
};

struct CudaLaunch {
  std::string name;  // extern "C" kernel symbol: kiln_k<plan>_<part>
  int plan = -1;     // the kernel plan it is (or is part) of
  std::string what;  // "flat f32[64,300], 2 stages", for messages and the profile
  unsigned grid = 1, block = 1;
  unsigned cluster = 1;             // blocks a cluster (set in the kernel's source: __cluster_dims__)
  std::vector<int> buffers;         // buffer slots, in parameter order
  std::vector<std::string> params;  // their declarations ("float* __restrict__ b3")
  int64_t shared_bytes = 0;         // its own __shared__ arrays (the prelude's helpers' not counted)
  bool scalars = false;             // takes the run-time scalar table (const double*) after them
  std::string text;                 // the kernel's source (after the prelude), its comment line first
  std::set<int> reads, writes;      // buffer slots the kernel loads from and stores to
  // Flat kernels (one thread per element, every stage at the thread's element): their memory
  // accesses in source order, one list per alternative loop (the vector loop, the plain one).
  bool flat = false;
  std::vector<std::vector<CudaAccess>> accesses;
};

struct CudaStep {
  int launch = -1;       // a generated kernel, or
  int extern_node = -1;  // a node run through call_eager
};

struct CudaProgram {
  std::string source;
  std::vector<CudaLaunch> launches;
  std::vector<CudaStep> steps;
  int scalar_table = 0;  // entries of the run-time scalar table (highest index read + 1); 0: none
  // Scratch the kernels need beyond the lowering's (LoweredGraph::scratch_bytes), in bytes per
  // slot, numbered after those: the partial results of split column reductions.
  std::vector<int64_t> extra_scratch_bytes;
  // Whether the launches' texts still hold size markers (CudaOptions::size_markers; resolve_sizes
  // removes them).
  bool marked = false;
  // What every part's source declares after the prelude: the table of the numbers that are
  // arguments (kiln_sz), when resolve_sizes made any.
  std::string globals;
  // The values of kiln_sz[k], as the 64 bits the kernel reads (an int's or a float's in the low
  // 32): the loader writes them into each module's kiln_sz before any launch.
  std::vector<uint64_t> size_table;
};

// Sizes as arguments. Generated with CudaOptions::size_markers, every number a kernel derives from
// the sizes of its tensors is marked in the text: loop bounds, index coefficients and offsets, the
// 1/n of a mean, the grids of fused launches, and every other constant of the computation. Two
// shapes whose programs have the same `size_skeleton` differ only in those numbers (the same
// kernels, launch for launch, with the same block sizes, vector widths, unrolling and shared
// arrays). `size_literals` are the marked numbers, in the order of the texts.
std::string size_skeleton(const CudaProgram& prog);
std::vector<std::string> size_literals(const CudaProgram& prog);
// Writes the marked numbers: those with `hoist[k]` set (by the order of size_literals) as reads
// of the module's table kiln_sz (a __constant__ array the loader fills, values in size_table), the
// others as literals. With anything hoisted, the comment lines (which name shapes) are dropped, so
// that every shape with this skeleton and the same other numbers gives the same source, compiled
// once. Rebuilds `source`; returns the number of table entries.
size_t resolve_sizes(CudaProgram& prog, const std::vector<bool>& hoist);

// Throws std::logic_error for what it cannot generate (a bug: lowering claims only what it can).
CudaProgram generate_cuda(const LoweredGraph& L, const Program& P, const CudaOptions& options);

// The ways max-autotune tries to generate kernel plan `kernel`, the defaults first: block sizes
// and grid caps of flat kernels, a warp or a block per row (of 128 to 1024 threads) for row
// plans, the number of parts a column reduction's rows are split into. Every variant computes the
// same values (in another order of summation for reductions).
std::vector<CudaChoice> cuda_variants(const LoweredGraph& L, const Program& P, size_t kernel,
                                      const CudaOptions& options);

// A program's kernels in parts of about `max_bytes` of kernel source each (one part when the
// program is smaller), each part a whole source with the prelude: NVRTC's time grows with the
// source, and parts compile at once, in threads (the largest group of gpt was 2 s in one piece).
struct CudaPart {
  std::string source;
  std::vector<int> launches;  // indices into CudaProgram::launches
};
std::vector<CudaPart> split_program(const CudaProgram& prog, size_t max_bytes);
inline constexpr size_t kCudaPartBytes = 32 * 1024;

// In-place outputs: by output k, -1 or wanted[k] (an input slot) when the program computes output k
// correctly with its buffer and that input's sharing memory. That holds when one flat kernel
// writes the output, reads the input only at the element it writes and before writing it (in
// each of its loops), and nothing after that kernel reads the input. `extern_reads[s]`: the buffer
// slots extern step s reads (-1 among them: some it cannot name); an extern step without an entry
// counts as reading every buffer. The program must have been generated with both slots in
// CudaOptions::may_alias.
std::vector<int64_t> inplace_outputs(const CudaProgram& prog, size_t num_inputs, const std::vector<int64_t>& wanted,
                                     const std::vector<std::set<int>>& extern_reads = {});

// Horizontal fusion. Inside a CUDA graph each launch costs a slot of about a microsecond whatever
// it does, and a step has dozens of small kernels that leave most of the GPU idle (the combining
// kernels of bias and layer-norm gradients with their parameter's update, small parameters'
// updates). Launches of at most `multiprocessors` * 1024 threads, without clusters, of one block
// size, move later in the step (never earlier) past what they do not touch and join into one
// launch whose blocks each run one of them (its own body, with its own block index and grid
// size). A launch moves past a step only when neither writes what the other reads or writes:
// `extern_touches[s]` are the buffer slots extern step s reads or writes (-1 among them: some it
// cannot name, and nothing moves past it); `same_memory` maps a slot to the slot it may share
// memory with at run time (an in-place output to its input), which count as one. At most
// `max_params` parameters and `max_shared` bytes of __shared__ arrays a fused launch. Returns the
// number of launches saved; `prog.source` is rewritten.
struct FuseLimits {
  int multiprocessors = 132;
  size_t max_params = 240;         // the driver takes 4 KB of parameters; 8 bytes each
  int64_t max_shared = 32 * 1024;  // of the 48 KB a block may declare statically
};
int fuse_small_launches(CudaProgram& prog, const std::vector<std::set<int>>& extern_touches,
                        const std::map<int, int>& same_memory, const FuseLimits& limits);

// The CUDA prelude's text (cuda_prelude.h), which every generated CUDA source begins with.
std::string_view cuda_prelude();

}  // namespace kiln::inductor
