// Graphs of real training steps for the inductor's CUDA kernels, in kiln's IR text, on cuda:0:
// pointwise chains, broadcasting, GELU and its backward, layer norm forward and backward,
// softmax/log-softmax and cross-entropy (nll) forward and backward, bias gradients (column
// reductions), reductions, SGD with momentum, AdamW with run-time scalars, comparisons and fills,
// views, casts, int64 and bool values, and a matmul with its epilogue (an extern kernel). "{T}" is
// the float dtype (f32 or bf16) and "{D}" the device; the statistics layer norm returns are float32
// on CUDA for either. Input names pick the random data (inductor_cuda_test.cpp): "pos*" positive,
// "target*" class indices (one of them -100 in "target_ignore").
#pragma once

#include <string>
#include <vector>

namespace kiln::test {

struct CorpusGraph {
  std::string name;
  std::string text;  // with {T} and {D}
  // The compiled kernels (launches) of the whole graph as one group; -1: not checked.
  int launches = -1;
};

// The graph for `dtype` on `device` ("cuda:0"; "" for the CPU, where eager computes references).
inline std::string instantiate(std::string text, const std::string& dtype, const std::string& device = "cuda:0") {
  auto replace_all = [&](const std::string& from, const std::string& to) {
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
      text.replace(at, from.size(), to);
  };
  replace_all("{T}", dtype);
  replace_all(" {D}", device.empty() ? "" : " on " + device);
  replace_all("device(\"cuda:0\")", device.empty() ? "None" : "device(\"" + device + "\")");
  return text;
}

// Shared with the tests of the matmul folds (inductor_cuda_test.cpp).
inline const char* mlp_block_tanh_text() {
  return R"(graph {
  input %0 : {T}[2,8,16]{128,16,1} {D} input "x"
  input %1 : {T}[64,16]{16,1} {D} input "w1"
  input %2 : {T}[64]{1} {D} input "b1"
  input %3 : {T}[16,64]{64,1} {D} input "w2"
  input %4 : {T}[16]{1} {D} input "b2"
  input %5 : {T}[2,8,16]{128,16,1} {D} input "gy"
  %6 : {T}[16,16]{16,1} {D} = aten::view(%0, i[16, 16])
  %7 : {T}[16,64]{1,16} {D} = aten::t(%1)
  %8 : {T}[16,64]{64,1} {D} = aten::addmm(%2, %6, %7, scalar(1), scalar(1))
  %9 : {T}[2,8,64]{512,64,1} {D} = aten::view(%8, i[2, 8, 64])
  %10 : {T}[2,8,64]{512,64,1} {D} = aten::gelu(%9, "tanh")
  %11 : {T}[16,64]{64,1} {D} = aten::view(%10, i[16, 64])
  %12 : {T}[64,16]{1,64} {D} = aten::t(%3)
  %13 : {T}[16,16]{16,1} {D} = aten::addmm(%4, %11, %12, scalar(1), scalar(1))
  %14 : {T}[2,8,16]{128,16,1} {D} = aten::view(%13, i[2, 8, 16])
  %15 : {T}[2,8,16]{128,16,1} {D} = aten::add.Tensor(%0, %14, scalar(1))
  %16 : {T}[16,16]{16,1} {D} = aten::view(%5, i[16, 16])
  %17 : {T}[16,64]{64,1} {D} = aten::mm(%16, %3)
  %18 : {T}[2,8,64]{512,64,1} {D} = aten::view(%17, i[2, 8, 64])
  %19 : {T}[2,8,64]{512,64,1} {D} = aten::gelu_backward(%18, %9, "tanh")
  %20 : {T}[64,16]{1,64} {D} = aten::t(%11)
  %21 : {T}[64,16]{16,1} {D} = aten::mm(%20, %16)
  %22 : {T}[16,64]{1,16} {D} = aten::t(%21)
  %23 : {T}[1,16]{16,1} {D} = aten::sum.dim_IntList(%16, i[0], true, None)
  %24 : {T}[16,64]{64,1} {D} = aten::view(%19, i[16, 64])
  %25 : {T}[1,64]{64,1} {D} = aten::sum.dim_IntList(%24, i[0], true, None)
  %26 : {T}[64,16]{1,64} {D} = aten::t(%24)
  %27 : {T}[64,16]{16,1} {D} = aten::mm(%26, %6)
  %28 : {T}[16,16]{16,1} {D} = aten::mm(%24, %1)
  output %15 result "y"
  output %22 result "dw2"
  output %23 result "db2"
  output %25 result "db1"
  output %27 result "dw1"
  output %28 result "dx"
}
)";
}

inline const std::vector<CorpusGraph>& cuda_corpus() {
  static const std::vector<CorpusGraph> graphs = {
      {"unary_ops", R"(graph {
  input %0 : {T}[5,33]{33,1} {D} input "x"
  input %1 : {T}[5,33]{33,1} {D} input "pos_p"
  %2 : {T}[5,33]{33,1} {D} = aten::neg(%0)
  %3 : {T}[5,33]{33,1} {D} = aten::relu(%0)
  %4 : {T}[5,33]{33,1} {D} = aten::sigmoid(%0)
  %5 : {T}[5,33]{33,1} {D} = aten::tanh(%0)
  %6 : {T}[5,33]{33,1} {D} = aten::exp(%0)
  %7 : {T}[5,33]{33,1} {D} = aten::log(%1)
  %8 : {T}[5,33]{33,1} {D} = aten::sqrt(%1)
  %9 : {T}[5,33]{33,1} {D} = aten::rsqrt(%1)
  %10 : {T}[5,33]{33,1} {D} = aten::abs(%0)
  %11 : {T}[5,33]{33,1} {D} = aten::reciprocal(%1)
  %12 : {T}[5,33]{33,1} {D} = aten::erf(%0)
  %13 : {T}[5,33]{33,1} {D} = aten::silu(%0)
  %14 : {T}[5,33]{33,1} {D} = aten::pow.Tensor_Scalar(%0, scalar(2))
  %15 : {T}[5,33]{33,1} {D} = aten::pow.Tensor_Scalar(%1, scalar(1.7))
  %16 : {T}[5,33]{33,1} {D} = aten::clamp(%0, scalar(-0.5), scalar(0.75))
  %17 : {T}[5,33]{33,1} {D} = aten::clamp_min(%0, scalar(0.1))
  %18 : {T}[5,33]{33,1} {D} = aten::clone(%0, None)
  output %2 result "neg"
  output %3 result "relu"
  output %4 result "sigmoid"
  output %5 result "tanh"
  output %6 result "exp"
  output %7 result "log"
  output %8 result "sqrt"
  output %9 result "rsqrt"
  output %10 result "abs"
  output %11 result "reciprocal"
  output %12 result "erf"
  output %13 result "silu"
  output %14 result "pow2"
  output %15 result "pow17"
  output %16 result "clamp"
  output %17 result "clamp_min"
  output %18 result "clone"
}
)",
       1},
      // One chain, every intermediate inlined: one kernel, one store.
      {"pointwise_chain", R"(graph {
  input %0 : {T}[64,300]{300,1} {D} input "x"
  input %1 : {T}[64,300]{300,1} {D} input "y"
  %2 : {T}[64,300]{300,1} {D} = aten::mul.Tensor(%0, %1)
  %3 : {T}[64,300]{300,1} {D} = aten::tanh(%2)
  %4 : {T}[64,300]{300,1} {D} = aten::add.Scalar(%3, scalar(1.5), scalar(1))
  %5 : {T}[64,300]{300,1} {D} = aten::exp(%4)
  %6 : {T}[64,300]{300,1} {D} = aten::sigmoid(%5)
  %7 : {T}[64,300]{300,1} {D} = aten::sub.Tensor(%6, %0, scalar(0.5))
  output %7 result "y"
}
)",
       1},
      {"broadcast_binary", R"(graph {
  input %0 : {T}[7,13]{13,1} {D} input "x"
  input %1 : {T}[13]{1} {D} input "row"
  input %2 : {T}[7,1]{1,1} {D} input "col"
  input %3 : {T}[7,13]{13,1} {D} input "pos_y"
  %4 : {T}[7,13]{13,1} {D} = aten::add.Tensor(%0, %1, scalar(0.5))
  %5 : {T}[7,13]{13,1} {D} = aten::sub.Tensor(%4, %2, scalar(2))
  %6 : {T}[7,13]{13,1} {D} = aten::mul.Tensor(%5, %2)
  %7 : {T}[7,13]{13,1} {D} = aten::div.Tensor(%6, %3)
  %8 : {T}[7,13]{13,1} {D} = aten::add.Scalar(%7, scalar(1.5), scalar(1))
  %9 : {T}[7,13]{13,1} {D} = aten::sub.Scalar(%8, scalar(0.25), scalar(2))
  %10 : {T}[7,13]{13,1} {D} = aten::mul.Scalar(%9, scalar(-3))
  %11 : {T}[7,13]{13,1} {D} = aten::div.Scalar(%10, scalar(7.0))
  %12 : {T}[7,13]{13,1} {D} = aten::rsub.Scalar(%11, scalar(1.0), scalar(1))
  %13 : {T}[7,13]{13,1} {D} = aten::maximum(%12, %1)
  %14 : {T}[7,13]{13,1} {D} = aten::minimum(%13, %2)
  %15 : {T}[7,13]{13,1} {D} = aten::rsub.Tensor(%14, %0, scalar(1))
  output %15 result "y"
  output %8 result "mid"
}
)",
       -1},
      {"gelu_fwd_bwd", R"(graph {
  input %0 : {T}[9,311]{311,1} {D} input "x"
  input %1 : {T}[9,311]{311,1} {D} input "g"
  %2 : {T}[9,311]{311,1} {D} = aten::gelu(%0, "none")
  %3 : {T}[9,311]{311,1} {D} = aten::gelu(%0, "tanh")
  %4 : {T}[9,311]{311,1} {D} = aten::gelu_backward(%1, %0, "none")
  %5 : {T}[9,311]{311,1} {D} = aten::gelu_backward(%1, %0, "tanh")
  %6 : {T}[9,311]{311,1} {D} = aten::threshold_backward(%1, %0, scalar(0))
  %7 : {T}[9,311]{311,1} {D} = aten::sigmoid(%0)
  %8 : {T}[9,311]{311,1} {D} = aten::sigmoid_backward(%1, %7)
  %9 : {T}[9,311]{311,1} {D} = aten::tanh(%0)
  %10 : {T}[9,311]{311,1} {D} = aten::tanh_backward(%1, %9)
  output %2 result "gelu"
  output %3 result "gelu_tanh"
  output %4 result "gelu_bwd"
  output %5 result "gelu_tanh_bwd"
  output %6 result "threshold_bwd"
  output %8 result "sigmoid_bwd"
  output %10 result "tanh_bwd"
}
)",
       -1},
      // Short rows (a warp each): mean, variance, rstd and y in one kernel; the backward's dx in
      // one, its weight and bias gradients in column kernels.
      {"layer_norm_fwd_bwd", R"(graph {
  input %0 : {T}[4,7,96]{672,96,1} {D} input "x"
  input %1 : {T}[96]{1} {D} input "w"
  input %2 : {T}[96]{1} {D} input "b"
  input %3 : {T}[4,7,96]{672,96,1} {D} input "go"
  %4 : {T}[4,7,96]{672,96,1} {D}, %5 : f32[4,7,1]{7,1,1} {D}, %6 : f32[4,7,1]{7,1,1} {D} = aten::native_layer_norm(%0, i[96], %1, %2, 1e-05)
  %7 : {T}[4,7,96]{672,96,1} {D}, %8 : {T}[96]{1} {D}, %9 : {T}[96]{1} {D} = aten::native_layer_norm_backward(%3, %0, i[96], %5, %6, %1, %2, b[true, true, true])
  output %4 result "y"
  output %5 result "mean"
  output %6 result "rstd"
  output %7 result "dx"
  output %8 result "dw"
  output %9 result "db"
}
)",
       -1},
      // A language model's first kernel: token and position embeddings (gathers at int64 indices)
      // read inside the row kernel of their sum's layer norm, which also stores the sum.
      {"embeddings_layer_norm", R"(graph {
  input %0 : {T}[7,96]{96,1} {D} input "tok_w"
  input %1 : {T}[16,96]{96,1} {D} input "pos_w"
  input %2 : i64[2,16]{16,1} {D} input "idx"
  input %3 : i64[16]{1} {D} input "pos_idx"
  input %4 : {T}[96]{1} {D} input "w"
  input %5 : {T}[96]{1} {D} input "b"
  %6 : {T}[2,16,96]{1536,96,1} {D} = aten::embedding(%0, %2, -1, false, false)
  %7 : {T}[16,96]{96,1} {D} = aten::embedding(%1, %3, -1, false, false)
  %8 : {T}[2,16,96]{1536,96,1} {D} = aten::add.Tensor(%6, %7, scalar(1))
  %9 : {T}[2,16,96]{1536,96,1} {D}, %10 : f32[2,16,1]{16,1,1} {D}, %11 : f32[2,16,1]{16,1,1} {D} = aten::native_layer_norm(%8, i[96], %4, %5, 1e-05)
  output %8 result "x"
  output %9 result "y"
  output %11 result "rstd"
}
)",
       1},
      // A language model's embedding gradients: scatter-adds of the tokens' gradients into the
      // table's rows (the token table's SGD update after it, in the combining kernel), and the
      // position table's, summed over the batch first, with a padding row that gets nothing.
      {"embedding_backward", R"(graph {
  input %0 : {T}[8,64,96]{6144,96,1} {D} input "go"
  input %1 : i64[8,64]{64,1} {D} input "idx"
  input %2 : {T}[7,96]{96,1} {D} input "w"
  input %3 : i64[64]{1} {D} input "pos_idx"
  %4 : {T}[7,96]{96,1} {D} = aten::embedding_dense_backward(%0, %1, 7, -1, false)
  %5 : {T}[7,96]{96,1} {D} = aten::add.Tensor(%2, %4, scalar(-0.1))
  %6 : {T}[64,96]{96,1} {D} = aten::sum.dim_IntList(%0, i[0], false, None)
  %7 : {T}[6,96]{96,1} {D} = aten::embedding_dense_backward(%6, %3, 6, 2, false)
  output %4 result "dw"
  output %5 result "w"
  output %7 result "dpos"
}
)",
       -1},
      // Long rows (a block each).
      {"layer_norm_long_rows", R"(graph {
  input %0 : {T}[16,4100]{4100,1} {D} input "x"
  input %1 : {T}[4100]{1} {D} input "w"
  input %2 : {T}[4100]{1} {D} input "b"
  %3 : {T}[16,4100]{4100,1} {D}, %4 : f32[16,1]{1,1} {D}, %5 : f32[16,1]{1,1} {D} = aten::native_layer_norm(%0, i[4100], %1, %2, 1e-05)
  output %3 result "y"
  output %5 result "rstd"
}
)",
       1},
      {"softmax_fwd_bwd", R"(graph {
  input %0 : {T}[13,37]{37,1} {D} input "x"
  input %1 : {T}[13,37]{37,1} {D} input "g"
  input %2 : {T}[3,5,4]{20,4,1} {D} input "z"
  input %3 : {T}[6,5000]{5000,1} {D} input "long"
  %4 : {T}[13,37]{37,1} {D} = aten::_log_softmax(%0, 1, false)
  %5 : {T}[13,37]{37,1} {D} = aten::_softmax(%0, -1, false)
  %6 : {T}[13,37]{37,1} {D} = aten::_log_softmax_backward_data(%1, %4, 1, dtype({T}))
  %7 : {T}[13,37]{37,1} {D} = aten::_softmax_backward_data(%1, %5, 1, dtype({T}))
  %8 : {T}[3,5,4]{20,4,1} {D} = aten::_softmax(%2, 1, false)
  %9 : {T}[6,5000]{5000,1} {D} = aten::_softmax(%3, 1, false)
  output %4 result "log_softmax"
  output %5 result "softmax"
  output %6 result "log_softmax_bwd"
  output %7 result "softmax_bwd"
  output %8 result "softmax_middle_dim"
  output %9 result "softmax_long_rows"
}
)",
       -1},
      // Cross-entropy as the step captures it: log-softmax, nll loss (mean, an ignored target),
      // and their backward.
      {"cross_entropy_fwd_bwd", R"(graph {
  input %0 : {T}[11,5]{5,1} {D} input "x"
  input %1 : i64[11]{1} {D} input "target_ignore"
  %2 : {T}[11,5]{5,1} {D} = aten::_log_softmax(%0, 1, false)
  %3 : {T}[]{} {D}, %4 : {T}[]{} {D} = aten::nll_loss_forward(%2, %1, None, 1, -100)
  %5 : {T}[]{} {D} = aten::ones_like(%3, None, None, None, None, None)
  %6 : {T}[11,5]{5,1} {D} = aten::nll_loss_backward(%5, %2, %1, None, 1, -100, %4)
  %7 : {T}[11,5]{5,1} {D} = aten::_log_softmax_backward_data(%6, %2, 1, dtype({T}))
  %8 : {T}[]{} {D}, %9 : {T}[]{} {D} = aten::nll_loss_forward(%2, %1, None, 2, -100)
  output %3 result "loss"
  output %4 result "total_weight"
  output %7 result "dx"
  output %8 result "loss_sum"
}
)",
       -1},
      // Bias gradients: sums over the leading dims with the kept dim contiguous.
      {"bias_grad", R"(graph {
  input %0 : {T}[512,96]{96,1} {D} input "g"
  input %1 : {T}[8,64,96]{6144,96,1} {D} input "g3"
  %2 : {T}[96]{1} {D} = aten::sum.dim_IntList(%0, i[0], false, None)
  %3 : {T}[96]{1} {D} = aten::sum.dim_IntList(%1, i[0, 1], false, None)
  %4 : {T}[1,96]{96,1} {D} = aten::mean.dim(%0, i[0], true, None)
  output %2 result "db"
  output %3 result "db3"
  output %4 result "mean0"
}
)",
       3},
      // Few columns over many rows (a layer norm's weight and bias gradients: each row's
      // statistic shared by every column): the rows are split across blocks into partial sums
      // that a second kernel combines (on the 2-multiprocessor emulated device too).
      {"column_split", R"(graph {
  input %0 : {T}[64,40,24]{960,24,1} {D} input "dy"
  input %1 : {T}[64,40,24]{960,24,1} {D} input "x"
  input %2 : {T}[64,40,1]{40,1,1} {D} input "rstd"
  %3 : {T}[64,40,24]{960,24,1} {D} = aten::mul.Tensor(%1, %2)
  %4 : {T}[64,40,24]{960,24,1} {D} = aten::mul.Tensor(%0, %3)
  %5 : {T}[24]{1} {D} = aten::sum.dim_IntList(%4, i[0, 1], false, None)
  %6 : {T}[24]{1} {D} = aten::sum.dim_IntList(%0, i[0, 1], false, None)
  output %5 result "dw"
  output %6 result "db"
}
)",
       -1},
      // A bias gradient split across blocks, then the bias's momentum SGD update: the update runs in
      // the kernel that combines the parts, and writes the bias and its buffer over the old ones.
      {"column_split_then_update", R"(graph {
  input %0 : {T}[64,40,24]{960,24,1} {D} input "dy"
  input %1 : {T}[24]{1} {D} param "b"
  input %2 : {T}[24]{1} {D} state "buf"
  %3 : {T}[24]{1} {D} = aten::sum.dim_IntList(%0, i[0, 1], false, None)
  %4 : {T}[24]{1} {D} = aten::mul.Scalar(%2, scalar(0.9))
  %5 : {T}[24]{1} {D} = aten::add.Tensor(%4, %3, scalar(1))
  %6 : {T}[24]{1} {D} = aten::add.Tensor(%1, %5, scalar(-0.01))
  output %3 result "db"
  output %5 result "buf"
  output %6 result "b"
}
)",
       -1},
      // Batch norm in training mode (BatchNorm2d's forward with its running stats, and its
      // backward): per-channel reductions over the batch and spatial dims. float32 only (the
      // inductor leaves other dtypes to ATen), so both instantiations are the same graph.
      {"batch_norm", R"(graph {
  input %0 : f32[6,5,7,9]{315,63,9,1} {D} input "x"
  input %1 : f32[5]{1} {D} input "w"
  input %2 : f32[5]{1} {D} input "b"
  input %3 : f32[5]{1} {D} input "running_mean"
  input %4 : f32[5]{1} {D} input "pos_running_var"
  input %5 : f32[6,5,7,9]{315,63,9,1} {D} input "go"
  %6 : f32[6,5,7,9]{315,63,9,1} {D}, %7 : f32[5]{1} {D}, %8 : f32[5]{1} {D}, %9 : f32[5]{1} {D}, %10 : f32[5]{1} {D} = aten::_native_batch_norm_legit_functional(%0, %1, %2, %3, %4, true, 0.1, 1e-05)
  %11 : f32[6,5,7,9]{315,63,9,1} {D}, %12 : f32[5]{1} {D}, %13 : f32[5]{1} {D} = aten::native_batch_norm_backward(%5, %0, %1, %9, %10, %7, %8, true, 1e-05, b[true, true, true])
  output %6 result "y"
  output %7 result "save_mean"
  output %8 result "save_invstd"
  output %9 result "running_mean"
  output %10 result "running_var"
  output %11 result "dx"
  output %12 result "dw"
  output %13 result "db"
}
)",
       -1},
      // The same with few long rows (3 channels of 12,288 elements), as a small convolutional
      // net's batch norms have: on a GPU with clusters each row is shared by a cluster's blocks.
      {"batch_norm_long_rows", R"(graph {
  input %0 : f32[4,3,48,64]{9216,3072,64,1} {D} input "x"
  input %1 : f32[3]{1} {D} input "w"
  input %2 : f32[3]{1} {D} input "b"
  input %3 : f32[3]{1} {D} input "running_mean"
  input %4 : f32[3]{1} {D} input "pos_running_var"
  input %5 : f32[4,3,48,64]{9216,3072,64,1} {D} input "go"
  %6 : f32[4,3,48,64]{9216,3072,64,1} {D}, %7 : f32[3]{1} {D}, %8 : f32[3]{1} {D}, %9 : f32[3]{1} {D}, %10 : f32[3]{1} {D} = aten::_native_batch_norm_legit_functional(%0, %1, %2, %3, %4, true, 0.1, 1e-05)
  %11 : f32[4,3,48,64]{9216,3072,64,1} {D} = aten::relu(%6)
  %12 : f32[4,3,48,64]{9216,3072,64,1} {D} = aten::threshold_backward(%5, %11, 0)
  %13 : f32[4,3,48,64]{9216,3072,64,1} {D}, %14 : f32[3]{1} {D}, %15 : f32[3]{1} {D} = aten::native_batch_norm_backward(%12, %0, %1, %9, %10, %7, %8, true, 1e-05, b[true, true, true])
  output %11 result "y"
  output %7 result "save_mean"
  output %8 result "save_invstd"
  output %9 result "running_mean"
  output %10 result "running_var"
  output %13 result "dx"
  output %14 result "dw"
  output %15 result "db"
}
)",
       -1},
      // The same on channels-last activations (what kiln's channels_last pass gives a CUDA step
      // with convolutions): the per-channel sums are column reductions over the NHWC rows, with
      // few channels (12: three lanes a row of four columns each, so a warp takes several rows).
      {"batch_norm_channels_last", R"(graph {
  input %0 : f32[8,12,12,12]{1728,1,144,12} {D} input "x"
  input %1 : f32[12]{1} {D} input "w"
  input %2 : f32[12]{1} {D} input "b"
  input %3 : f32[12]{1} {D} input "running_mean"
  input %4 : f32[12]{1} {D} input "pos_running_var"
  input %5 : f32[8,12,12,12]{1728,1,144,12} {D} input "go"
  %6 : f32[8,12,12,12]{1728,1,144,12} {D}, %7 : f32[12]{1} {D}, %8 : f32[12]{1} {D}, %9 : f32[12]{1} {D}, %10 : f32[12]{1} {D} = aten::_native_batch_norm_legit_functional(%0, %1, %2, %3, %4, true, 0.1, 1e-05)
  %11 : f32[8,12,12,12]{1728,1,144,12} {D} = aten::relu(%6)
  %12 : f32[8,12,12,12]{1728,1,144,12} {D} = aten::threshold_backward(%5, %11, 0)
  %13 : f32[8,12,12,12]{1728,1,144,12} {D}, %14 : f32[12]{1} {D}, %15 : f32[12]{1} {D} = aten::native_batch_norm_backward(%12, %0, %1, %9, %10, %7, %8, true, 1e-05, b[true, true, true])
  output %11 result "y"
  output %7 result "save_mean"
  output %8 result "save_invstd"
  output %9 result "running_mean"
  output %10 result "running_var"
  output %13 result "dx"
  output %14 result "dw"
  output %15 result "db"
}
)",
       -1},
      {"reductions", R"(graph {
  input %0 : {T}[37,53]{53,1} {D} input "x"
  input %1 : {T}[3,11,7]{77,7,1} {D} input "z"
  %2 : {T}[37,1]{1,1} {D} = aten::sum.dim_IntList(%0, i[1], true, None)
  %3 : {T}[53]{1} {D} = aten::sum.dim_IntList(%0, i[0], false, None)
  %4 : {T}[11]{1} {D} = aten::mean.dim(%1, i[0, 2], false, None)
  %5 : {T}[37]{1} {D} = aten::amax(%0, i[-1], false)
  %6 : {T}[3,7]{7,1} {D} = aten::amin(%1, i[1], false)
  %7 : {T}[]{} {D} = aten::sum(%0, None)
  %8 : {T}[]{} {D} = aten::mean(%1, None)
  %9 : {T}[37,53]{53,1} {D} = aten::mul.Tensor(%0, %0)
  %10 : {T}[53]{1} {D} = aten::sum.dim_IntList(%9, i[0], false, None)
  output %2 result "row_sum"
  output %3 result "col_sum"
  output %4 result "mean_02"
  output %5 result "amax"
  output %6 result "amin"
  output %7 result "sum_all"
  output %8 result "mean_all"
  output %10 result "col_sum_of_square"
}
)",
       -1},
      // SGD with momentum: the new buffer and the new weight in one pass.
      {"sgd_momentum", R"(graph {
  input %0 : {T}[64,300]{300,1} {D} param "w"
  input %1 : {T}[64,300]{300,1} {D} grad "g"
  input %2 : {T}[64,300]{300,1} {D} state "buf"
  %3 : {T}[64,300]{300,1} {D} = aten::mul.Scalar(%2, scalar(0.9))
  %4 : {T}[64,300]{300,1} {D} = aten::add.Tensor(%3, %1, scalar(1))
  %5 : {T}[64,300]{300,1} {D} = aten::add.Tensor(%0, %4, scalar(-0.01))
  output %4 result "buf"
  output %5 result "w"
}
)",
       1},
      // AdamW, its bias corrections as run-time scalars (read from the device table).
      {"adamw_runtime_scalars", R"(graph {
  scalar $0 float "bias_correction2_sqrt"
  scalar $1 float "neg_step_size"
  input %0 : {T}[33,17]{17,1} {D} param "w"
  input %1 : {T}[33,17]{17,1} {D} grad "g"
  input %2 : {T}[33,17]{17,1} {D} state "exp_avg"
  input %3 : {T}[33,17]{17,1} {D} state "pos_exp_avg_sq"
  %4 : {T}[33,17]{17,1} {D} = aten::mul.Scalar(%0, scalar(0.999))
  %5 : {T}[33,17]{17,1} {D} = aten::lerp.Scalar(%2, %1, scalar(0.1))
  %6 : {T}[33,17]{17,1} {D} = aten::mul.Scalar(%3, scalar(0.999))
  %7 : {T}[33,17]{17,1} {D} = aten::addcmul(%6, %1, %1, scalar(0.001))
  %8 : {T}[33,17]{17,1} {D} = aten::sqrt(%7)
  %9 : {T}[33,17]{17,1} {D} = aten::div.Scalar(%8, $0:scalar(0.3))
  %10 : {T}[33,17]{17,1} {D} = aten::add.Scalar(%9, scalar(1e-08), scalar(1))
  %11 : {T}[33,17]{17,1} {D} = aten::addcdiv(%4, %5, %10, $1:scalar(-0.002))
  output %11 result "w"
  output %5 result "exp_avg"
  output %7 result "exp_avg_sq"
}
)",
       -1},
      {"where_compare_fill", R"(graph {
  input %0 : {T}[6,10]{10,1} {D} input "x"
  input %1 : {T}[6,10]{10,1} {D} input "y"
  input %2 : bool[6,10]{10,1} {D} input "mask"
  %3 : bool[6,10]{10,1} {D} = aten::gt.Tensor(%0, %1)
  %4 : {T}[6,10]{10,1} {D} = aten::where.self(%3, %0, %1)
  %5 : {T}[6,10]{10,1} {D} = aten::where.self(%2, %4, %1)
  %6 : bool[6,10]{10,1} {D} = aten::le.Scalar(%0, scalar(0.25))
  %7 : {T}[6,10]{10,1} {D} = aten::zeros_like(%0, None, None, None, None, None)
  %8 : {T}[6,10]{10,1} {D} = aten::full(i[6, 10], scalar(2.5), dtype({T}), None, device("cuda:0"), None)
  %9 : {T}[6,10]{10,1} {D} = aten::where.self(%6, %8, %7)
  %10 : {T}[6,10]{10,1} {D} = aten::add.Tensor(%9, %5, scalar(1))
  output %10 result "y"
  output %6 result "cmp"
}
)",
       -1},
      {"views", R"(graph {
  input %0 : {T}[4,6]{6,1} {D} input "x"
  input %1 : {T}[6]{1} {D} input "v"
  input %2 : {T}[2,3,5]{15,5,1} {D} input "z"
  %3 : {T}[6,4]{1,6} {D} = aten::t(%0)
  %4 : {T}[6,4]{4,1} {D} = aten::mul.Scalar(%3, scalar(2))
  %5 : {T}[5,2,3]{1,15,5} {D} = aten::permute(%2, i[2, 0, 1])
  %6 : {T}[5,2,3]{6,3,1} {D} = aten::neg(%5)
  %7 : {T}[6,1]{1,1} {D} = aten::unsqueeze(%1, 1)
  %8 : {T}[6,4]{1,0} {D} = aten::expand(%7, i[6, 4], false)
  %9 : {T}[6,4]{4,1} {D} = aten::add.Tensor(%4, %8, scalar(1))
  %10 : {T}[4,3]{6,2}+1 {D} = aten::slice.Tensor(%0, 1, 1, 6, 2)
  %11 : {T}[4,3]{3,1} {D} = aten::exp(%10)
  %12 : {T}[6]{1} {D} = aten::select.int(%0, 0, 2)
  %13 : {T}[6]{1} {D} = aten::mul.Tensor(%12, %1)
  %14 : {T}[24]{1} {D} = aten::view(%0, i[24])
  %15 : {T}[24]{1} {D} = aten::sigmoid(%14)
  %16 : {T}[2,3]{3,1} {D} = aten::view(%13, i[2, 3])
  %17 : {T}[2,3]{3,1} {D} = aten::relu(%16)
  output %9 result "bcast"
  output %6 result "permuted"
  output %11 result "sliced"
  output %13 result "selected"
  output %15 result "viewed"
  output %17 result "reshaped_intermediate"
}
)",
       -1},
      // Results the step keeps only through views (a GELU's output seen as [rows, features] for
      // the next matmul's backward, a row sum flattened): computed straight into the output's
      // memory. The permuted view is the same memory too, but the value already went to the
      // first output: it is copied.
      {"results_through_views", R"(graph {
  input %0 : {T}[4,6,8]{48,8,1} {D} input "x"
  %1 : {T}[4,6,8]{48,8,1} {D} = aten::gelu(%0, "none")
  %2 : {T}[24,8]{8,1} {D} = aten::view(%1, i[24, 8])
  %3 : {T}[8,6,4]{1,8,48} {D} = aten::permute(%1, i[2, 1, 0])
  %4 : {T}[4,6]{6,1} {D} = aten::sum.dim_IntList(%0, i[2], false, None)
  %5 : {T}[24]{1} {D} = aten::view(%4, i[24])
  %6 : {T}[24,8]{8,1} {D} = aten::neg(%2)
  %7 : {T}[8,6,4]{24,4,1} {D} = aten::exp(%3)
  %8 : {T}[24]{1} {D} = aten::mul.Scalar(%5, scalar(2))
  output %2 result "rows"
  output %3 result "permuted"
  output %5 result "sums"
  output %6 result "neg_rows"
  output %7 result "exp_permuted"
  output %8 result "twice_sums"
}
)",
       -1},
      // A square weight's gradient, cast to float32 through a transpose straight into its output
      // (an mm's result transposed back, as autograd gives it), and read again in the same pass by
      // an update of the parameter's layout: the update must read what another thread wrote only
      // once it is written, not in the kernel that writes it.
      {"transposed_result_read_back", R"(graph {
  input %0 : {T}[40,40]{40,1} {D} input "g"
  input %1 : f32[40,40]{40,1} {D} input "m"
  %2 : {T}[40,40]{1,40} {D} = aten::permute(%0, i[1, 0])
  %3 : f32[40,40]{1,40} {D} = aten::_to_copy(%2, dtype(f32), None, None, None, false, None)
  %4 : f32[40,40]{40,1} {D} = aten::permute(%3, i[1, 0])
  %5 : f32[40,40]{40,1} {D} = aten::detach(%4)
  %6 : f32[40,40]{40,1} {D} = aten::mul.Scalar(%1, scalar(0.9))
  %7 : f32[40,40]{40,1} {D} = aten::add.Tensor(%6, %5, scalar(0.1))
  %8 : f32[40,40]{40,1} {D} = aten::addcmul(%1, %5, %5, scalar(0.001))
  output %5 result "grad"
  output %7 result "exp_avg"
  output %8 result "exp_avg_sq"
}
)",
       -1},
      // Long element-wise chains whose every access walks memory with one index (GELU and its
      // backward, a residual add, a cast): each thread moves 16-byte words of them when the
      // buffers are aligned, and one element at a time otherwise (an input that starts one
      // element into its storage).
      {"vector_accesses", R"(graph {
  input %0 : {T}[64,48]{48,1} {D} input "x"
  input %1 : {T}[64,48]{48,1} {D} input "g"
  input %2 : {T}[3073]{1} {D} input "flat"
  %3 : {T}[64,48]{48,1} {D} = aten::gelu(%0, "tanh")
  %4 : {T}[64,48]{48,1} {D} = aten::gelu_backward(%1, %0, "none")
  %5 : {T}[64,48]{48,1} {D} = aten::add.Tensor(%3, %4, scalar(1))
  %6 : f32[64,48]{48,1} {D} = aten::_to_copy(%5, dtype(f32), None, None, None, false, None)
  %7 : {T}[3072]{1}+1 {D} = aten::slice.Tensor(%2, 0, 1, 3073, 1)
  %8 : {T}[3072]{1} {D} = aten::mul.Scalar(%7, scalar(3))
  output %3 result "gelu"
  output %5 result "sum"
  output %6 result "as_float"
  output %8 result "from_an_offset"
}
)",
       -1},
      // Casts to and from bfloat16 (autocast's), rounding where eager rounds.
      {"casts", R"(graph {
  input %0 : {T}[8,40]{40,1} {D} input "x"
  input %1 : f32[8,40]{40,1} {D} input "f"
  %2 : bf16[8,40]{40,1} {D} = aten::_to_copy(%1, dtype(bf16), None, None, None, false, None)
  %3 : f32[8,40]{40,1} {D} = aten::_to_copy(%0, dtype(f32), None, None, None, false, None)
  %4 : f32[8,40]{40,1} {D} = aten::_to_copy(%2, dtype(f32), None, None, None, false, None)
  %5 : f32[8,40]{40,1} {D} = aten::mul.Tensor(%4, %3)
  output %2 result "to_bf16"
  output %5 result "product"
}
)",
       -1},
      // int64 and bool through copies, selects, comparisons and fills (integer arithmetic stays
      // with ATen, as on the CPU).
      {"int64_and_bool", R"(graph {
  input %0 : i64[6,10]{10,1} {D} input "target"
  input %1 : bool[6,10]{10,1} {D} input "mask"
  input %2 : {T}[6,10]{10,1} {D} input "x"
  %3 : i64[6,10]{10,1} {D} = aten::full(i[6, 10], scalar(7), dtype(i64), None, device("cuda:0"), None)
  %4 : i64[6,10]{10,1} {D} = aten::where.self(%1, %0, %3)
  %5 : bool[6,10]{10,1} {D} = aten::eq.Scalar(%0, scalar(3))
  %6 : {T}[6,10]{10,1} {D} = aten::_to_copy(%0, dtype({T}), None, None, None, false, None)
  %7 : {T}[6,10]{10,1} {D} = aten::mul.Tensor(%6, %2)
  %8 : i64[6,10]{10,1} {D} = aten::clone(%4, None)
  output %8 result "picked"
  output %5 result "is3"
  output %7 result "scaled"
}
)",
       1},
      // A matmul (an extern kernel, ATen's) with its epilogue generated.
      {"addmm_epilogue", R"(graph {
  input %0 : {T}[16,24]{24,1} {D} input "x"
  input %1 : {T}[32,24]{24,1} {D} input "w"
  input %2 : {T}[32]{1} {D} input "b"
  %3 : {T}[24,32]{1,24} {D} = aten::t(%1)
  %4 : {T}[16,32]{32,1} {D} = aten::addmm(%2, %0, %3, scalar(1), scalar(1))
  %5 : {T}[16,32]{32,1} {D} = aten::relu(%4)
  %6 : {T}[16,32]{32,1} {D} = aten::mul.Tensor(%5, %5)
  output %6 result "y"
}
)",
       1},
      // A GPT-2 MLP block (tanh GELU) with its residual, forward and backward: on CUDA the
      // matmuls run through cuBLASLt with the GELU, its backward, the residual add and the bias
      // gradients folded into their epilogues (gemm_fold.h); the generated kernels elsewhere.
      {"mlp_block_tanh", mlp_block_tanh_text(), -1},
  };
  return graphs;
}

}  // namespace kiln::test
