#include "cublaslt.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>

#include <kiln/plugin_api.hpp>

namespace kiln::inductor {

using plugin::Error;

namespace {

// cuBLASLt's C API as cublasLt.h declares it: statuses, enums and attribute numbers are ints whose
// values are part of its ABI.
using Status = int;
constexpr Status kSuccess = 0;
constexpr int kComputeF32 = 68;                  // CUBLAS_COMPUTE_32F (no TF32)
constexpr int kR32F = 0, kR16BF = 14;            // cudaDataType: CUDA_R_32F, CUDA_R_16BF
constexpr int kOpN = 0, kOpT = 1;                // cublasOperation_t
constexpr int kDescTransA = 3, kDescTransB = 4;  // cublasLtMatmulDescAttributes_t
constexpr int kDescEpilogue = 7, kDescBiasPointer = 8, kDescAuxPointer = 11, kDescAuxLd = 12;
constexpr int kDescBiasDataType = 26;
constexpr int kPrefMaxWorkspace = 1;  // cublasLtMatmulPreferenceAttributes_t
constexpr int kPrefAlignA = 5, kPrefAlignB = 6, kPrefAlignC = 7, kPrefAlignD = 8;
// cublasLtEpilogue_t
constexpr int32_t kEpiDefault = 1, kEpiRelu = 2, kEpiBias = 4, kEpiGelu = 32, kEpiAux = 128, kEpiDGelu = 64 | 128,
                  kEpiBgrad = 16, kEpiBgradA = 256, kEpiBgradB = 512;

// The most workspace an algorithm may ask for (what LibTorch gives cuBLASLt on Hopper).
constexpr uint64_t kMaxWorkspace = uint64_t{32} << 20;

struct HeuristicResult {  // cublasLtMatmulHeuristicResult_t
  uint64_t algo[8];
  size_t workspace;
  Status state;
  float waves;
  int reserved[4];
};

int32_t epilogue_of(const GemmSpec& s) {
  int32_t e = 0;
  if (s.act == GemmAct::DGelu) {
    e = kEpiDGelu;
    if (s.bias_grad == GemmBiasGrad::OfD) e |= kEpiBgrad;
    return e;
  }
  if (s.bias_grad == GemmBiasGrad::OfY) return kEpiBgradA;
  if (s.bias_grad == GemmBiasGrad::OfX) return kEpiBgradB;
  if (s.bias) e |= kEpiBias;
  if (s.act == GemmAct::Relu) e |= kEpiRelu;
  if (s.act == GemmAct::Gelu) e |= kEpiGelu | (s.aux ? kEpiAux : 0);
  return e ? e : kEpiDefault;
}

std::string epilogue_name(const GemmSpec& s) {
  switch (epilogue_of(s)) {
    case kEpiDefault: return "DEFAULT";
    case kEpiBias: return "BIAS";
    case kEpiRelu: return "RELU";
    case kEpiRelu | kEpiBias: return "RELU_BIAS";
    case kEpiGelu: return "GELU";
    case kEpiGelu | kEpiBias: return "GELU_BIAS";
    case kEpiGelu | kEpiAux: return "GELU_AUX";
    case kEpiGelu | kEpiAux | kEpiBias: return "GELU_AUX_BIAS";
    case kEpiDGelu: return "DGELU";
    case kEpiDGelu | kEpiBgrad: return "DGELU_BGRAD";
    case kEpiBgradA: return "BGRADA";
    case kEpiBgradB: return "BGRADB";
  }
  return "epilogue " + std::to_string(epilogue_of(s));
}

// A row-major [rows, cols] matrix with strides (rs, cs) as cuBLASLt's column-major operand of the
// transposed shape: op N when the columns are unit-stride (then ld = rs), op T when the rows are.
struct ColMajor {
  bool ok = false;
  int op = kOpN;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
};

ColMajor col_major(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  ColMajor r;
  if (cols == 1) cs = 1;
  if (rows == 1) rs = std::max<int64_t>(cols, 1);
  if (cs == 1 && rs >= std::max<int64_t>(cols, 1)) {
    r = {true, kOpN, static_cast<uint64_t>(cols), static_cast<uint64_t>(rows), rs};
  } else if (rs == 1 && cs >= std::max<int64_t>(rows, 1)) {
    r = {true, kOpT, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), cs};
  }
  return r;
}

// The directory entries of the cuBLASLt this process has loaded (LibTorch's, from the nvidia wheel).
std::vector<std::string> loaded_cublaslt() {
  std::vector<std::string> names;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        const std::string n = info->dlpi_name ? info->dlpi_name : "";
        const std::string base = n.substr(n.rfind('/') + 1);
        if (base.rfind("libcublasLt.so", 0) == 0) static_cast<std::vector<std::string>*>(data)->push_back(n);
        return 0;
      },
      &names);
  return names;
}

}  // namespace

struct CublasLt::Fns {
  Status (*Create)(void**) = nullptr;
  Status (*Destroy)(void*) = nullptr;
  const char* (*StatusName)(Status) = nullptr;
  const char* (*StatusString)(Status) = nullptr;
  size_t (*GetVersion)() = nullptr;
  Status (*DescCreate)(void**, int, int) = nullptr;
  Status (*DescDestroy)(void*) = nullptr;
  Status (*DescSet)(void*, int, const void*, size_t) = nullptr;
  Status (*LayoutCreate)(void**, int, uint64_t, uint64_t, int64_t) = nullptr;
  Status (*LayoutDestroy)(void*) = nullptr;
  Status (*PrefCreate)(void**) = nullptr;
  Status (*PrefDestroy)(void*) = nullptr;
  Status (*PrefSet)(void*, int, const void*, size_t) = nullptr;
  Status (*Heuristic)(void*, void*, void*, void*, void*, void*, void*, int, HeuristicResult*, int*) = nullptr;
  Status (*Matmul)(void*, void*, const void*, const void*, void*, const void*, void*, const void*, const void*, void*,
                   void*, void*, const void*, void*, size_t, void*) = nullptr;
};

std::shared_ptr<CublasLt> CublasLt::load() {
  std::vector<std::string> tried = loaded_cublaslt();
  for (const char* so : {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"}) tried.push_back(so);
  void* lib = nullptr;
  std::string path, errors;
  for (const auto& p : tried) {
    lib = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      path = p;
      break;
    }
    const char* e = dlerror();
    errors += (errors.empty() ? "" : "; ") + std::string(e ? e : p);
  }
  if (!lib) throw Error(KILN_ERROR_UNAVAILABLE, "cannot load cuBLASLt: " + errors);
  std::shared_ptr<CublasLt> lt(new CublasLt());
  lt->lib_ = lib;
  lt->path_ = path;
  lt->f_ = std::make_unique<Fns>();
  Fns& f = *lt->f_;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (!fn) throw Error(KILN_ERROR_UNAVAILABLE, path + " has no " + name);
  };
  sym(f.Create, "cublasLtCreate");
  sym(f.Destroy, "cublasLtDestroy");
  sym(f.StatusName, "cublasLtGetStatusName");
  sym(f.StatusString, "cublasLtGetStatusString");
  sym(f.GetVersion, "cublasLtGetVersion");
  sym(f.DescCreate, "cublasLtMatmulDescCreate");
  sym(f.DescDestroy, "cublasLtMatmulDescDestroy");
  sym(f.DescSet, "cublasLtMatmulDescSetAttribute");
  sym(f.LayoutCreate, "cublasLtMatrixLayoutCreate");
  sym(f.LayoutDestroy, "cublasLtMatrixLayoutDestroy");
  sym(f.PrefCreate, "cublasLtMatmulPreferenceCreate");
  sym(f.PrefDestroy, "cublasLtMatmulPreferenceDestroy");
  sym(f.PrefSet, "cublasLtMatmulPreferenceSetAttribute");
  sym(f.Heuristic, "cublasLtMatmulAlgoGetHeuristic");
  sym(f.Matmul, "cublasLtMatmul");
  lt->check(f.Create(&lt->handle_), "cublasLtCreate", path);
  return lt;
}

CublasLt::~CublasLt() {
  if (f_ && handle_) f_->Destroy(handle_);
  // The library stays loaded: LibTorch holds it too, and unloading during exit gains nothing.
}

std::string CublasLt::version() const {
  const size_t v = f_->GetVersion();  // major * 10000 + minor * 100 + patch
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

void CublasLt::check(int status, const std::string& call, const std::string& what) const {
  if (status == kSuccess) return;
  const char* name = f_ && f_->StatusName ? f_->StatusName(status) : nullptr;
  const char* text = f_ && f_->StatusString ? f_->StatusString(status) : nullptr;
  throw Error(KILN_ERROR_UNKNOWN, what + ": " + call + " failed: " + (name ? name : std::to_string(status)) +
                                      (text ? std::string(" (") + text + ")" : ""));
}

std::string GemmSpec::describe() const {
  std::string s = "gemm [m=" + std::to_string(m) + ", n=" + std::to_string(n) + ", k=" + std::to_string(k) + "] " +
                  (bf16 ? "bf16" : "f32") + " " + epilogue_name(*this);
  if (c) s += " + C";
  return s;
}

std::string GemmSpec::why_not() const {
  if (m <= 0 || n <= 0 || k <= 0) return "an empty GEMM";
  if (!col_major(m, k, x_rs, x_cs).ok)
    return "X's strides (" + std::to_string(x_rs) + ", " + std::to_string(x_cs) + ")";
  if (!col_major(k, n, y_rs, y_cs).ok)
    return "Y's strides (" + std::to_string(y_rs) + ", " + std::to_string(y_cs) + ")";
  if (d_ld < n) return "D's row stride " + std::to_string(d_ld);
  if (c && c_ld < n) return "C's row stride " + std::to_string(c_ld);
  if (aux && (aux_ld < n || aux_ld % 8)) return "aux's row stride " + std::to_string(aux_ld) + " (a multiple of 8)";
  if (act == GemmAct::DGelu && !aux) return "GELU's backward without its input";
  if (bias_grad != GemmBiasGrad::None && (bias || c)) return "a bias gradient with a bias or C";
  if ((bias_grad == GemmBiasGrad::OfY || bias_grad == GemmBiasGrad::OfX) && act != GemmAct::None)
    return "a bias gradient of an operand with an activation";
  if (bias_grad == GemmBiasGrad::OfD && act != GemmAct::DGelu) return "a bias gradient of D without GELU's backward";
  return "";
}

CublasLt::Gemm::Gemm(std::shared_ptr<CublasLt> lt, const GemmSpec& spec)
    : lt_(std::move(lt)), spec_(spec), what_("cuBLASLt " + spec.describe()) {
  if (const std::string why = spec.why_not(); !why.empty())
    throw Error(KILN_ERROR_INVALID_ARGUMENT, what_ + ": " + why);
  const Fns& f = *lt_->f_;
  const std::string& ctx = what_;
  const int dt = spec.bf16 ? kR16BF : kR32F;
  lt_->check(f.DescCreate(&desc_, kComputeF32, kR32F), "cublasLtMatmulDescCreate", ctx);
  const ColMajor A = col_major(spec.k, spec.n, spec.y_rs, spec.y_cs);  // Y
  const ColMajor B = col_major(spec.m, spec.k, spec.x_rs, spec.x_cs);  // X
  const int32_t ta = A.op, tb = B.op, epi = epilogue_of(spec);
  lt_->check(f.DescSet(desc_, kDescTransA, &ta, sizeof ta), "cublasLtMatmulDescSetAttribute(TRANSA)", ctx);
  lt_->check(f.DescSet(desc_, kDescTransB, &tb, sizeof tb), "cublasLtMatmulDescSetAttribute(TRANSB)", ctx);
  lt_->check(f.DescSet(desc_, kDescEpilogue, &epi, sizeof epi), "cublasLtMatmulDescSetAttribute(EPILOGUE)", ctx);
  if (spec.bias || spec.bias_grad != GemmBiasGrad::None) {
    const int32_t bt = dt;
    lt_->check(f.DescSet(desc_, kDescBiasDataType, &bt, sizeof bt), "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)",
               ctx);
  }
  if (spec.aux) {
    const int64_t ld = spec.aux_ld;
    lt_->check(f.DescSet(desc_, kDescAuxLd, &ld, sizeof ld), "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_LD)", ctx);
  }
  // cuBLASLt's op(A) is n x k, op(B) is k x m, D is n x m (all column-major).
  const uint64_t m = static_cast<uint64_t>(spec.m), n = static_cast<uint64_t>(spec.n);
  lt_->check(f.LayoutCreate(&a_, dt, A.rows, A.cols, A.ld), "cublasLtMatrixLayoutCreate(A)", ctx);
  lt_->check(f.LayoutCreate(&b_, dt, B.rows, B.cols, B.ld), "cublasLtMatrixLayoutCreate(B)", ctx);
  lt_->check(f.LayoutCreate(&d_, dt, n, m, spec.d_ld), "cublasLtMatrixLayoutCreate(D)", ctx);
  lt_->check(f.LayoutCreate(&c_, dt, n, m, spec.c ? spec.c_ld : spec.d_ld), "cublasLtMatrixLayoutCreate(C)", ctx);
}

CublasLt::Gemm::~Gemm() {
  const Fns& f = *lt_->f_;
  for (void* l : {a_, b_, c_, d_})
    if (l) f.LayoutDestroy(l);
  if (desc_) f.DescDestroy(desc_);
}

uint32_t CublasLt::Gemm::alignment_of(const Ptrs& p) const {
  // The largest power of two up to 256 that divides every pointer the GEMM reads or writes.
  uintptr_t bits = 256;
  for (const void* q : {p.x, p.y, p.c, static_cast<const void*>(p.d), p.bias, static_cast<const void*>(p.aux),
                        static_cast<const void*>(p.bias_grad)})
    if (q) bits |= reinterpret_cast<uintptr_t>(q);
  return static_cast<uint32_t>(bits & (~bits + 1));
}

bool CublasLt::Gemm::heuristic(uint32_t alignment, int count, std::vector<Algo>* out, std::string* why) {
  const Fns& f = *lt_->f_;
  const std::string& ctx = what_;
  // The descriptors' pointers only tell the heuristics their alignment here.
  void* probe = reinterpret_cast<void*>(uintptr_t{alignment});
  if (spec_.bias || spec_.bias_grad != GemmBiasGrad::None)
    lt_->check(f.DescSet(desc_, kDescBiasPointer, &probe, sizeof probe), "cublasLtMatmulDescSetAttribute(BIAS)", ctx);
  if (spec_.aux)
    lt_->check(f.DescSet(desc_, kDescAuxPointer, &probe, sizeof probe), "cublasLtMatmulDescSetAttribute(AUX)", ctx);
  void* pref = nullptr;
  lt_->check(f.PrefCreate(&pref), "cublasLtMatmulPreferenceCreate", ctx);
  struct PrefGuard {
    const Fns& f;
    void* p;
    ~PrefGuard() { f.PrefDestroy(p); }
  } guard{f, pref};
  const uint64_t ws = kMaxWorkspace;
  lt_->check(f.PrefSet(pref, kPrefMaxWorkspace, &ws, sizeof ws), "cublasLtMatmulPreferenceSetAttribute", ctx);
  for (int attr : {kPrefAlignA, kPrefAlignB, kPrefAlignC, kPrefAlignD})
    lt_->check(f.PrefSet(pref, attr, &alignment, sizeof alignment), "cublasLtMatmulPreferenceSetAttribute", ctx);
  std::vector<HeuristicResult> r(static_cast<size_t>(std::max(count, 1)));
  int got = 0;
  std::unique_lock<std::mutex> one_call(lt_->calls_);
  const Status st = f.Heuristic(lt_->handle_, desc_, a_, b_, c_, d_, pref, static_cast<int>(r.size()), r.data(), &got);
  out->clear();
  for (int i = 0; st == kSuccess && i < got; ++i) {
    if (r[static_cast<size_t>(i)].state != kSuccess) continue;
    Algo a;
    std::copy(std::begin(r[static_cast<size_t>(i)].algo), std::end(r[static_cast<size_t>(i)].algo), a.data);
    a.workspace = r[static_cast<size_t>(i)].workspace;
    out->push_back(a);
  }
  if (out->empty()) {
    const Status s = st != kSuccess ? st : got > 0 ? r[0].state : kSuccess;
    const char* name = s != kSuccess ? f.StatusName(s) : nullptr;
    *why = "cuBLASLt's heuristics give no algorithm" + (name ? std::string(" (") + name + ")" : std::string()) +
           " at " + std::to_string(alignment) + "-byte alignment";
    return false;
  }
  return true;
}

std::string CublasLt::Gemm::why_unsupported() {
  std::lock_guard<std::mutex> lock(m_);
  std::vector<Algo> a;
  std::string why;
  if (!heuristic(256, 1, &a, &why)) return why;
  algos_.emplace(256, a[0]);
  return "";
}

CublasLt::Gemm::Algo CublasLt::Gemm::algo_for(uint32_t alignment) {
  std::lock_guard<std::mutex> lock(m_);
  auto it = algos_.find(alignment);
  if (it != algos_.end()) return it->second;
  std::vector<Algo> a;
  std::string why;
  if (!heuristic(alignment, 1, &a, &why)) throw Error(KILN_ERROR_UNKNOWN, what_ + ": " + why);
  return algos_.emplace(alignment, a[0]).first->second;
}

size_t CublasLt::Gemm::candidates(int count) {
  std::lock_guard<std::mutex> lock(m_);
  std::string why;
  if (!heuristic(256, count, &candidates_, &why)) candidates_.clear();
  return candidates_.size();
}

void CublasLt::Gemm::run_candidate(size_t i, const Ptrs& p, void* stream, void* workspace) {
  enqueue(candidates_.at(i), p, stream, workspace);
}

void CublasLt::Gemm::choose(size_t i) {
  std::lock_guard<std::mutex> lock(m_);
  algos_[256] = candidates_.at(i);
}

void CublasLt::Gemm::enqueue(const Algo& a, const Ptrs& p, void* stream, void* workspace) {
  const Fns& f = *lt_->f_;
  const std::string& ctx = what_;
  std::lock_guard<std::mutex> lock(m_);  // the descriptor's pointers are set per call
  if (spec_.bias || spec_.bias_grad != GemmBiasGrad::None) {
    const void* bias = spec_.bias ? p.bias : p.bias_grad;
    lt_->check(f.DescSet(desc_, kDescBiasPointer, &bias, sizeof bias), "cublasLtMatmulDescSetAttribute(BIAS)", ctx);
  }
  if (spec_.aux)
    lt_->check(f.DescSet(desc_, kDescAuxPointer, &p.aux, sizeof p.aux), "cublasLtMatmulDescSetAttribute(AUX)", ctx);
  const float one = 1.0f, zero = 0.0f;
  std::lock_guard<std::mutex> one_call(lt_->calls_);
  lt_->check(f.Matmul(lt_->handle_, desc_, &one, p.y, a_, p.x, b_, spec_.c ? &one : &zero, spec_.c ? p.c : p.d, c_, p.d,
                      d_, a.data, workspace, a.workspace, stream),
             "cublasLtMatmul", ctx);
}

std::shared_ptr<CublasLt> cublaslt(std::string* why) {
  static std::mutex m;
  static std::shared_ptr<CublasLt> lt;
  static std::string error;
  static bool tried = false;
  std::lock_guard<std::mutex> lock(m);
  if (!tried) {
    tried = true;
    try {
      lt = CublasLt::load();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!lt && why) *why = error;
  return lt;
}

}  // namespace kiln::inductor
