// Planned scratch memory: a group's intermediate buffers (scratch slots: every materialized value
// that is neither an input nor an output) share one arena, placed from their lifetimes over the
// group's steps. Two slots share bytes only when no step touches both between the first step that
// touches one and the last step that touches the other, so the arena needs about the most scratch
// alive at once instead of every slot's sum.
//
// A slot lives from the first step that touches it (reads or writes) to the last, both included:
// within one step a slot read for the last time and a slot written for the first time are both
// alive. Steps run one after the other, each finished (CPU) or ordered on one stream (CUDA) before
// the next, so the step order is the order of every access.
#pragma once

#include <cstdint>
#include <set>
#include <vector>

#include "loop_ir.h"
#include "schedule.h"

namespace kiln::inductor {

struct ScratchPlan {
  std::vector<int64_t> offset;  // per slot, in bytes from the arena's start (a multiple of `align`)
  int64_t bytes = 0;            // the arena
  int64_t unplanned = 0;        // what one place per slot would take (the sum of the rounded sizes)
  // Per step, the slots whose last step it is (for [plugin.inductor] poison_scratch).
  std::vector<std::vector<int>> last_use;
  bool planned = false;  // false: each slot has its own bytes (some step touches an unknown buffer)
};

// `slot_bytes[s]` is scratch slot s's size; its buffer number is `first_slot + s`. `touches[t]` are
// the buffers step t reads or writes; a -1 among them (a buffer that could not be named) makes
// every slot live over every step: each gets its own place. Each slot's place is `slack` bytes
// larger than its size (generated CPU code may read a vector past the end), rounded up to
// `align`. Greedy by size: the largest slot first, each at the lowest offset where it overlaps no
// placed slot alive at the same time.
ScratchPlan plan_scratch(const std::vector<int64_t>& slot_bytes, size_t first_slot,
                         const std::vector<std::set<int>>& touches, int64_t align, int64_t slack);

// The buffers each step of a CPU program reads or writes: a kernel its stages' buffers and every
// buffer their definitions load; an extern step its arguments' and results' buffers (`reads` of
// node n: the values it reads, its arguments or more where neighbours fold into it).
std::vector<std::set<int>> cpu_step_touches(const LoweredGraph& L, const Program& P,
                                            const std::vector<std::vector<int64_t>>& extern_reads,
                                            const std::vector<std::vector<int64_t>>& extern_writes);

// Which outputs a CPU program computes correctly over the memory of the input the host offers
// (CompileOptions::inplace_inputs: `wanted[k]` is the input for output k, or -1): output k's
// writer (the first step to touch it) is a kernel that is not a column reduction, in which every
// stage that loads the input is element-wise, of the output's shape, loads it at the element the
// output's stage stores and runs no later than that stage; no stage stores into the input, and no
// later step touches it or is an extern step (so that an execute, which only extern steps and the
// allocations before the kernels can fail, fails before its first write into an input: the
// executable is then failure-atomic, ABI 2.5's inplace_atomic). `touches` as cpu_step_touches gives.
// The kernels must then be generated without __restrict on those buffers (generate_source's
// `may_alias`).
std::vector<int64_t> cpu_inplace_outputs(const LoweredGraph& L, const Program& P, const std::vector<int64_t>& wanted,
                                         const std::vector<std::set<int>>& touches);

// The buffer holding value `v` (through the views it is of); -1 where none does.
int buffer_of(const LoweredGraph& L, int64_t v);

}  // namespace kiln::inductor
