// C++ generation: the kernels of a scheduled program (schedule.h) as one source file, after the
// kernel prelude (kernel_prelude.h), with OpenMP pragmas for threads and vectors.
#pragma once

#include <string>
#include <vector>

#include "loop_ir.h"
#include "schedule.h"

namespace kiln::inductor {

// One way to generate a kernel; max-autotune compiles several and keeps the fastest.
struct Variant {
  int simdlen = 0;       // 0: let the compiler pick
  int column_tile = 16;  // column reductions: kept elements per accumulator tile
  std::string name() const;
};

// The variants worth trying for a kernel (the first one is the default).
std::vector<Variant> variants_for(const KernelPlan& k, bool autotune);

// The whole source of a compile: every kernel, every listed variant, as
// extern "C" void kiln_k<K>_v<V>(void** B, const double* P, int nt).
std::string generate_source(const LoweredGraph& L, const Program& P, const std::vector<std::vector<Variant>>& variants);

}  // namespace kiln::inductor
