// C++ generation: the kernels of a scheduled program (schedule.h) as one source file, after the
// kernel prelude (kernel_prelude.h), with OpenMP pragmas for threads and vectors.
#pragma once

#include <set>
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
// extern "C" void kiln_k<K>_v<V>(void** B, const double* P, int nt). Buffer pointers are
// __restrict but for the buffers in `may_alias` (an output computed over an input's memory).
std::string generate_source(const LoweredGraph& L, const Program& P, const std::vector<std::vector<Variant>>& variants,
                            const std::set<int>& may_alias = {});

// A generated source whose numbers are read at run time: every integer constant of the kernels
// (written "<digits>LL": loop bounds, strides, index coefficients) other than 0 and 1, and every
// floating-point constant (a mean's 1/n), becomes a local read from P[first_slot + k] at the
// kernel's entry, with values[k] its value. Two shapes whose generated kernels differ only in those
// numbers give the same `text`, so one compiled library serves both: the kernels are exactly the
// ones generated for each shape, with their numbers handed in. Constants in other places (array
// sizes, pragmas, the prelude) stay as they are, so a source where they differ gives another text.
struct HoistedSource {
  std::string text;
  std::vector<double> values;
};
HoistedSource hoist_literals(const std::string& source, size_t first_slot);

}  // namespace kiln::inductor
