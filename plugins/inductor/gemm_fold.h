// Which matmuls of a CUDA group run through cuBLASLt, and which of their neighbours fold into the
// GEMM's epilogue instead of a generated kernel (cublaslt.h has the epilogues). Decided from the
// graph alone, then checked with cuBLASLt's heuristics through `supported`:
//   - addmm's bias (a vector over the columns) is the BIAS epilogue, a full matrix is C;
//   - a ReLU, or a GELU with the tanh approximation, read from the result (through reshapes that
//     keep the memory) becomes the activation epilogue; when anything else reads the GELU's input
//     (the backward does) the GEMM writes it as the epilogue's aux matrix;
//   - a residual add of a matrix of the result's shape and dtype becomes C (beta = 1);
//   - GELU's backward (tanh approximation) whose gradient is the result becomes DGELU, its input
//     read as aux;
//   - a bias gradient (a sum over every dim but the last) of GELU's backward's result, of the
//     matmul's right operand (the rows of the output gradient) or of its left operand seen
//     transposed becomes DGELU_BGRAD, BGRADA or BGRADB.
// A GELU with the exact erf is never folded (cuBLASLt's is the tanh approximation): kiln does not
// change what the step computes. GELU and its backward fold only in bfloat16, where the epilogue's
// own rounding is far below the result's; in float32 they stay generated kernels. Nor is an add whose operands differ
// in dtype (autocast's float32 residual stream plus a bfloat16 matmul): eager rounds the matmul to bfloat16 first.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <kiln/plugin_api.hpp>

#include "cublaslt.h"

namespace kiln::inductor {

struct GemmFold {
  int64_t node = -1;  // the mm / addmm
  GemmSpec spec;
  int64_t x = -1, y = -1;       // operand values (the node's own arguments)
  int64_t bias = -1, c = -1;    // read
  int64_t aux_in = -1;          // read: GELU's input for its backward
  int64_t d = -1;               // written: the GEMM's result, or the folded node's
  int64_t aux_out = -1;         // written: the GEMM's own result as the GELU's input
  int64_t bias_grad = -1;       // written: a folded sum's result
  std::vector<int64_t> folded;  // nodes whose results the GEMM computes
  std::vector<int64_t> inputs() const;
  std::vector<int64_t> outputs() const;
};

struct GemmPlan {
  std::map<int64_t, GemmFold> gemms;       // by the matmul's node
  std::map<int64_t, int64_t> folded_into;  // folded node -> its matmul's node
  std::set<int64_t> dead;                  // values nothing needs any more (a folded node's input)
  bool empty() const { return gemms.empty(); }
};

// `supported(spec)`: why cuBLASLt cannot run `spec` here ("" when it can). `epilogues` false runs
// each matmul alone (its result written as it is) with nothing folded.
GemmPlan plan_gemms(const plugin::Graph& g, bool epilogues,
                    const std::function<std::string(const GemmSpec&)>& supported);

}  // namespace kiln::inductor
