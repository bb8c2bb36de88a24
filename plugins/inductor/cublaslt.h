// cuBLASLt, loaded with dlopen when first needed (as NVRTC and the driver are: the plugin links no
// CUDA library), and the GEMMs the CUDA groups run through it with their epilogues folded in.
//
// A GEMM is described in the row-major terms of the graph: D[m, n] = X[m, k] @ Y[k, n], each
// operand a strided matrix (one of its two strides 1). cuBLASLt is column-major, so it computes
// D^T = Y^T @ X^T: its "A" is Y and its "B" is X, and a row-major matrix with unit column stride is
// a column-major one of the transposed shape. In those terms the epilogues are:
//   kBias        D = X@Y + bias[n]                    (addmm's bias, broadcast over rows)
//   kRelu/kGelu  D = act(X@Y (+ bias[n]))             (GELU: the tanh approximation)
//   kGeluAux     the same, and aux[m, n] = the GELU's input (for the backward)
//   kDGelu       D = (X@Y) * gelu'(aux[m, n])         (GELU's backward, tanh approximation)
//   bias_grad    with kDGelu: bgrad[n] = column sums of D; alone: kBgradY (column sums of Y,
//                cuBLASLt's BGRADA) or kBgradX (row sums of X, BGRADB)
// and C[m, n] (beta = 1) adds a matrix of D's shape, a residual. Every GEMM accumulates in float32;
// operands and results are all float32 or all bfloat16 (TF32 is never used).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kiln::inductor {

enum class GemmAct : uint8_t { None, Relu, Gelu, DGelu };
enum class GemmBiasGrad : uint8_t { None, OfD, OfY, OfX };

struct GemmSpec {
  int64_t m = 0, n = 0, k = 0;
  bool bf16 = false;  // operands, result, bias, C and aux: bfloat16 (else float32)
  // Strides of the row-major operands, in elements: X[m, k], Y[k, n]; D and C are [m, n] with unit
  // column stride and row strides d_ld, c_ld.
  int64_t x_rs = 0, x_cs = 1, y_rs = 0, y_cs = 1, d_ld = 0, c_ld = 0;
  bool bias = false;  // + bias[n]
  bool c = false;     // + C (beta = 1)
  GemmAct act = GemmAct::None;
  bool aux = false;  // kGelu: write the GELU's input to aux; kDGelu: read it (always)
  int64_t aux_ld = 0;
  GemmBiasGrad bias_grad = GemmBiasGrad::None;

  // "gemm [m=16384, n=1536, k=384] bf16 GELU_AUX_BIAS, C": for messages.
  std::string describe() const;
  // Why cuBLASLt cannot take this combination at all (empty when it may): a layout no transpose
  // gives, leading dimensions that break the epilogues' rules... The heuristics still decide.
  std::string why_not() const;
};

class CublasLt {
 public:
  // Loads libcublasLt (the copy this process has loaded already, as LibTorch loads it, else
  // libcublasLt.so.13 / .12) and creates a handle. Throws plugin::Error (KILN_ERROR_UNAVAILABLE)
  // saying why not.
  static std::shared_ptr<CublasLt> load();
  ~CublasLt();
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;

  const std::string& library_path() const { return path_; }
  std::string version() const;  // "13.0.2"

  // One GEMM's descriptors (made once) and the algorithm cuBLASLt's heuristics give for each
  // alignment of its pointers it met (a view into the middle of a buffer may be less aligned than
  // a whole one).
  class Gemm {
   public:
    // Errors name it "cuBLASLt <spec.describe()>".
    Gemm(std::shared_ptr<CublasLt> lt, const GemmSpec& spec);
    ~Gemm();
    Gemm(const Gemm&) = delete;
    Gemm& operator=(const Gemm&) = delete;
    const GemmSpec& spec() const { return spec_; }
    const std::string& what() const { return what_; }  // "cuBLASLt gemm [m=..., n=..., k=...] bf16 BIAS"
    // Whether the heuristics have an algorithm for this GEMM at 256-byte aligned pointers, and if
    // not, cuBLASLt's reason ("no algorithm", a status name).
    std::string why_unsupported();
    // Enqueues the GEMM on `stream` (a cudaStream_t). `workspace(bytes)` gives device memory for
    // the algorithm's workspace, ordered on the stream. Unused pointers are null.
    struct Ptrs {
      const void *x = nullptr, *y = nullptr, *bias = nullptr, *c = nullptr;
      void *d = nullptr, *aux = nullptr, *bias_grad = nullptr;
    };
    template <typename Workspace>
    void run(const Ptrs& p, void* stream, Workspace&& workspace) {
      const Algo a = algo_for(alignment_of(p));
      void* ws = a.workspace ? workspace(a.workspace) : nullptr;
      enqueue(a, p, stream, ws);
    }

    // max-autotune: the heuristics' first `count` algorithms at 256-byte alignment (fewer where
    // they have fewer); `run_candidate` enqueues one of them (pointers 256-byte aligned, workspace
    // of `candidate_workspace(i)` bytes); `choose` makes one the algorithm for 256-byte aligned
    // pointers from then on.
    size_t candidates(int count);
    size_t candidate_workspace(size_t i) const { return candidates_.at(i).workspace; }
    void run_candidate(size_t i, const Ptrs& p, void* stream, void* workspace);
    void choose(size_t i);

   private:
    struct Algo {
      uint64_t data[8] = {};
      size_t workspace = 0;
    };
    uint32_t alignment_of(const Ptrs& p) const;
    Algo algo_for(uint32_t alignment);
    bool heuristic(uint32_t alignment, int count, std::vector<Algo>* out, std::string* why);
    void enqueue(const Algo& a, const Ptrs& p, void* stream, void* workspace);

    std::shared_ptr<CublasLt> lt_;
    GemmSpec spec_;
    std::string what_;
    void* desc_ = nullptr;
    void *a_ = nullptr, *b_ = nullptr, *c_ = nullptr, *d_ = nullptr;
    std::mutex m_;
    std::map<uint32_t, Algo> algos_;
    std::vector<Algo> candidates_;
  };

 private:
  struct Fns;
  CublasLt() = default;
  void check(int status, const std::string& call, const std::string& what) const;

  void* lib_ = nullptr;
  void* handle_ = nullptr;
  // One handle serves every group; its calls are made one at a time (groups may compile on
  // several threads). A GEMM's enqueue takes microseconds.
  std::mutex calls_;
  std::string path_;
  std::unique_ptr<Fns> f_;
};

// The process's cuBLASLt, loaded once (nullptr and `why` when it cannot be).
std::shared_ptr<CublasLt> cublaslt(std::string* why);

}  // namespace kiln::inductor
