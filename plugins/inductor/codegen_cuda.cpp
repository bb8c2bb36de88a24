#include "codegen_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

namespace kiln::inductor {

namespace {

// Index math is 32-bit below this many elements (and 64-bit from it on).
constexpr int64_t kWideIndex = int64_t{1} << 30;
constexpr int kFlatThreads = 256;

// The type an expression of `t` computes in: bfloat16 computes in float.
const char* reg_type(Ty t) {
  switch (t) {
    case Ty::f32:
    case Ty::bf16: return "float";
    case Ty::f64: return "double";
    case Ty::i64: return "long long";
    case Ty::i32: return "int";
    case Ty::b8: return "bool";
  }
  return "?";
}

// A buffer's element type.
const char* mem_type(Ty t) { return t == Ty::bf16 ? "kiln_bf16" : reg_type(t); }

// Size markers (CudaOptions::size_markers): a number the text may later read from kiln_sz instead,
// between these two bytes, which no C++ text holds.
constexpr char kMarkOpen = '\x01', kMarkClose = '\x02';
std::string marked(const std::string& literal) { return kMarkOpen + literal + kMarkClose; }

// A constant of the computation, marked: the 1/n of a mean and the numbers a step derives from
// sizes are constants here, and so are the ones no size changes (those stay literals).
std::string cu_const(double c, Ty ty) {
  char buf[64];
  switch (ty) {
    case Ty::b8: return c != 0 ? "true" : "false";
    case Ty::i64: {
      if (c <= -9223372036854775807.0) return "(-9223372036854775807LL - 1)";
      std::snprintf(buf, sizeof buf, "(%lldLL)", static_cast<long long>(c));
      return marked(buf);
    }
    case Ty::i32: {
      std::snprintf(buf, sizeof buf, "((int)%lld)", static_cast<long long>(c));
      return marked(buf);
    }
    case Ty::f32:
    case Ty::bf16: {
      if (std::isnan(c)) return "__int_as_float(0x7fc00000)";
      if (std::isinf(c)) return c < 0 ? "(-__int_as_float(0x7f800000))" : "__int_as_float(0x7f800000)";
      std::snprintf(buf, sizeof buf, "(%af)", static_cast<double>(static_cast<float>(c)));
      return marked(buf);
    }
    case Ty::f64: {
      if (std::isnan(c)) return "__longlong_as_double(0x7ff8000000000000LL)";
      if (std::isinf(c))
        return c < 0 ? "(-__longlong_as_double(0x7ff0000000000000LL))" : "__longlong_as_double(0x7ff0000000000000LL)";
      std::snprintf(buf, sizeof buf, "(%a)", c);
      return marked(buf);
    }
  }
  return "0";
}

bool pointwise_kind(const ValueInfo& v) {
  return v.kind == ValueInfo::Kind::Pointwise || v.kind == ValueInfo::Kind::View || v.kind == ValueInfo::Kind::Reshape;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

const char* ty_name(Ty t) {
  switch (t) {
    case Ty::f32: return "f32";
    case Ty::bf16: return "bf16";
    case Ty::f64: return "f64";
    case Ty::i64: return "i64";
    case Ty::i32: return "i32";
    case Ty::b8: return "bool";
  }
  return "?";
}

int64_t pow2_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

int64_t pow2_at_most(int64_t n) {
  int64_t p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

// One kernel: its text and how to launch it.
class Emitter {
 public:
  Emitter(const LoweredGraph& L, const CudaOptions& o, bool wide) : L_(L), o_(o), wide_(wide) {}

  bool empty() const { return empty_; }
  int max_scalar() const { return max_scalar_; }

  // Pointwise stages of one shape, each reading the others only at its own index: one thread per
  // element (grid-stride), later stages reading earlier ones from registers.
  CudaLaunch flat(const std::string& kernel, const std::vector<int>& stages, const CudaChoice& choice = {}) {
    const std::vector<int64_t> shape = val(stages[0]).shape;
    const int64_t n = prod(shape);
    CudaLaunch launch;
    launch.name = kernel;
    launch.what = "flat " + std::string(ty_name(val(stages[0]).ty)) + shape_str(shape) + ", " +
                  std::to_string(stages.size()) + (stages.size() == 1 ? " stage" : " stages");
    if (n == 0) {
      empty_ = true;
      return launch;
    }
    for (int v : stages) in_kernel_.insert(v);
    base_ = 1;
    // One variable per group of dims that every access walks as one run (merged_dims), outermost
    // first; dims of extent 1 index 0.
    auto groups = merged_dims(L_, stages, shape);
    // Consecutive threads walk the first stage's output in memory order: the group with the
    // smallest stride innermost (a transposed weight cast to bfloat16 stores and loads coalesced,
    // not 384 elements apart).
    const auto& out_strides = val(stages[0]).strides;
    std::stable_sort(groups.begin(), groups.end(), [&](const std::vector<int>& a, const std::vector<int>& b) {
      return out_strides[static_cast<size_t>(a.back())] > out_strides[static_cast<size_t>(b.back())];
    });
    Idx idx(shape.size(), Index::constant(0));
    std::vector<int> vars;
    std::vector<int64_t> sizes;
    for (const auto& g : groups) {
      const int var = new_var(1);
      vars.push_back(var);
      sizes.push_back(group_size(shape, g));
      idx[static_cast<size_t>(g.back())] = Index::var(var);
    }
    std::vector<int> roots;
    std::vector<Index> stores;
    std::set<int> top;
    for (int v : stages) {
      roots.push_back(L_.compute(pool_, v, idx));
      stores.push_back(LoweredGraph::offset(val(v), idx));
      collect(roots.back(), top);
      collect_index(stores.back(), top);
    }
    flush(top, 0, 0);
    // Each thread takes `width` consecutive elements of the innermost variable at a time (16-byte
    // loads and stores instead of one element each) when every store and the loads that walk
    // memory with it can move whole words, and the buffers are aligned for it at run time; the
    // plain loop otherwise.
    const Vectorized vz = vectorize(vars, sizes, roots, stores, stages, n);
    if (vz.width > 1) {
      body_ << "  if ((" << vz.aligned << ") == 0) {\n";
      const auto names = names_;
      const auto regs = regs_;
      emit_flat_vector(vz, vars, sizes, stages, roots, stores, n);
      names_ = names;
      regs_ = regs;
      body_ << "  } else {\n";
      accesses_.emplace_back();  // the plain loop: a second alternative
    }
    body_ << "  for (kidx i = (kidx)blockIdx.x * blockDim.x + threadIdx.x; i < " << lit(n)
          << "; i += (kidx)gridDim.x * blockDim.x) {\n";
    decompose("i", vars, sizes, 1);
    for (size_t s = 0; s < stages.size(); ++s) {
      const int v = stages[s];
      std::set<int> pending;
      collect(roots[s], pending);
      collect_index(stores[s], pending);
      flush(pending, 1, 1);
      store(v, stores[s], stage_register(v, roots[s], 1), 1);
    }
    body_ << "  }\n";
    if (vz.width > 1) body_ << "  }\n";
    launch.flat = true;
    launch.accesses = accesses_;
    const int threads = choice.threads > 0 ? choice.threads : kFlatThreads;
    const int64_t per_sm = choice.blocks_per_sm != 0 ? choice.blocks_per_sm : 16;
    // A thread per element (or per vector of them, when a variant asks for no cap); the defaults
    // count elements.
    const int64_t per_thread = vz.width > 1 && choice.blocks_per_sm != 0 ? vz.width : 1;
    int64_t grid = (n / per_thread + threads - 1) / threads;
    if (per_sm > 0) grid = std::min<int64_t>(grid, per_sm * std::max(o_.multiprocessors, 1));
    if (grid > 0x7fffffff) grid = 0x7fffffff;  // grid-stride: any grid covers every element
    launch.block = static_cast<unsigned>(threads);
    launch.grid = static_cast<unsigned>(std::max<int64_t>(grid, 1));
    finish_launch(launch);
    return launch;
  }

  // A flat kernel's vector accesses: `width` consecutive elements of the innermost variable per
  // thread and iteration (the innermost variable's extent is a multiple of it, so the elements of
  // one iteration share every outer variable). Loads that walk memory with that variable are read
  // as whole 16-byte (or 8-byte) words into register arrays (`arrays`, by buffer and index);
  // loads it does not move are read once per element like the others (the compiler keeps one),
  // and loads it moves any other way (a transposed read) element by element. Every store walks
  // with it and is written as whole words. `aligned` is the run-time test (0 when every vector
  // access is aligned).
  struct Vectorized {
    int width = 0;
    std::map<std::pair<int, std::string>, std::pair<std::string, Ty>> arrays;  // (buffer, index) -> array
    std::map<std::pair<int, std::string>, std::string> index_at;               // each array's index at ib
    std::string aligned;
  };

  Vectorized vectorize(const std::vector<int>& vars, const std::vector<int64_t>& sizes, const std::vector<int>& roots,
                       const std::vector<Index>& stores, const std::vector<int>& stages, int64_t n) {
    Vectorized none;
    if (vars.empty() || n < 64) return none;
    const int var = vars.back();
    const int64_t inner = sizes.back();
    auto walks = [&](const Index& ix) { return ix.exprs.empty() && ix.coef(var) == 1; };
    std::vector<std::pair<const Index*, std::pair<int, Ty>>> loads, writes;  // index, (buffer, type)
    std::set<int> exprs;
    for (int r : roots) collect_all(r, exprs);
    for (int e : exprs) {
      const Expr& x = pool_.at(e);
      if (x.k != Expr::K::Load) continue;
      if (in_kernel_.count(x.value) && x.logical_known) continue;  // an earlier stage's register
      if (walks(x.idx)) loads.push_back({&x.idx, {x.buf, x.ty}});
    }
    for (size_t s = 0; s < stages.size(); ++s) {
      if (!walks(stores[s])) return none;
      writes.push_back({&stores[s], {val(stages[s]).buffer, val(stages[s]).ty}});
    }
    bool narrow = false;
    for (const auto& a : loads) narrow = narrow || a.second.second == Ty::bf16;
    for (const auto& a : writes) narrow = narrow || a.second.second == Ty::bf16;
    const int width = narrow ? 8 : 4;
    if (inner % width != 0) return none;
    Vectorized vz;
    std::set<std::string> tests;
    // A word access is aligned when the buffer is (tested at run time) and the element offset of
    // the iteration's first element is a multiple of the width whatever the outer variables are.
    auto add = [&](const Index& ix, int buf, Ty ty) {
      const int64_t bytes = width * static_cast<int64_t>(ty_size(ty));
      if (bytes % 8 != 0 || ix.c % width != 0) return false;
      for (const auto& [v, k] : ix.vars)
        if (v != var && k % width != 0) return false;
      tests.insert("((unsigned long long)b" + std::to_string(buf) + " & " +
                   std::to_string(std::min<int64_t>(bytes, 16) - 1) + ")");
      return true;
    };
    for (const auto& [ix, bt] : loads) {
      if (!add(*ix, bt.first, bt.second)) return none;
      const auto key = std::make_pair(bt.first, index_str(*ix));
      if (vz.arrays.count(key)) continue;
      vz.arrays[key] = {"a" + std::to_string(vz.arrays.size()), bt.second};
      vz.index_at[key] = index_with(*ix, var, "ib");
    }
    for (const auto& [ix, bt] : writes)
      if (!add(*ix, bt.first, bt.second)) return none;
    for (const auto& t : tests) vz.aligned += (vz.aligned.empty() ? "" : " | ") + t;
    vz.width = width;
    return vz;
  }

  // `ix` with the variable `var` replaced by the expression `with`.
  std::string index_with(const Index& ix, int var, const std::string& with) {
    std::string s = lit(ix.c);
    for (const auto& [v, k] : ix.vars) s += " + " + lit(k) + " * " + (v == var ? "(" + with + ")" : vname(v));
    for (const auto& [e, k] : ix.exprs) s += " + " + lit(k) + " * (kidx)" + name(e);
    return "(" + s + ")";
  }

  void collect_all(int e, std::set<int>& out) const {
    if (!out.insert(e).second) return;
    const Expr& x = pool_.at(e);
    for (int c : x.args) collect_all(c, out);
    for (const auto& [ee, k] : x.idx.exprs) collect_all(ee, out);
  }

  // The vector loop of a flat kernel: per iteration, the outer variables and the innermost one's
  // first value (ib), the vector loads into register arrays, the stages element by element over
  // the arrays (unrolled, the innermost variable ib + u), then the vector stores.
  void emit_flat_vector(const Vectorized& vz, const std::vector<int>& vars, const std::vector<int64_t>& sizes,
                        const std::vector<int>& stages, const std::vector<int>& roots, const std::vector<Index>& stores,
                        int64_t n) {
    const std::string W = std::to_string(vz.width);
    const int var = vars.back();
    body_ << "  for (kidx q = (kidx)blockIdx.x * blockDim.x + threadIdx.x; q < " << lit(n / vz.width)
          << "; q += (kidx)gridDim.x * blockDim.x) {\n";
    body_ << "    const kidx i0 = q * " << lit(vz.width) << ";\n";
    decompose("i0", std::vector<int>(vars.begin(), vars.end() - 1),
              std::vector<int64_t>(sizes.begin(), sizes.end() - 1), 1, sizes.back());
    body_ << "    const kidx ib = " << (vars.size() > 1 ? "i0 % " + lit(sizes.back()) : std::string("i0")) << ";\n";
    for (const auto& [key, arr] : vz.arrays) {
      const auto& [name, ty] = arr;
      use_buf(key.first, ty);
      read_.insert(key.first);
      access(false, key.first, key.second);
      body_ << "    alignas(16) " << mem_type(ty) << " " << name << "[" << W << "];\n";
      body_ << "    k_vld<" << W << ">(" << name << ", b" << key.first << " + " << vz.index_at.at(key) << ");\n";
    }
    std::vector<std::string> outs;
    for (size_t s = 0; s < stages.size(); ++s) {
      const ValueInfo& info = val(stages[s]);
      outs.push_back("o" + std::to_string(s));
      body_ << "    alignas(16) " << mem_type(info.ty) << " " << outs.back() << "[" << W << "];\n";
    }
    body_ << "#pragma unroll\n    for (int u = 0; u < " << W << "; ++u) {\n";
    body_ << "      const kidx " << vname(var) << " = ib + u;\n";
    vec_ = &vz;
    for (size_t s = 0; s < stages.size(); ++s) {
      const int v = stages[s];
      std::set<int> pending;
      collect(roots[s], pending);
      flush(pending, 1, 2);
      const std::string reg = stage_register(v, roots[s], 2);
      if (val(v).ty == Ty::bf16) {
        body_ << "      " << outs[s] << "[u] = k_f2bf(" << reg << ");\n";
      } else {
        body_ << "      " << outs[s] << "[u] = (" << mem_type(val(v).ty) << ")(" << reg << ");\n";
      }
    }
    vec_ = nullptr;
    body_ << "    }\n";
    for (size_t s = 0; s < stages.size(); ++s) {
      const ValueInfo& info = val(stages[s]);
      use_buf(info.buffer, info.ty);
      written_.insert(info.buffer);
      access(true, info.buffer, index_str(stores[s]));
      body_ << "    k_vst<" << W << ">(b" << info.buffer << " + " << index_with(stores[s], var, "ib") << ", " << outs[s]
            << ");\n";
    }
    body_ << "  }\n";
  }

  // The register that holds stage v's value as its buffer will (a bfloat16 result rounded, unless
  // it already is), which later stages of the same element read instead of memory.
  std::string stage_register(int v, int root, int depth) {
    std::string reg = name(root);
    if (val(v).ty == Ty::bf16 && !rounded_bf16(root)) {
      reg = "rv" + std::to_string(v);
      body_ << ind(depth) << "const float " << reg << " = k_round_bf16(" << name(root) << ");\n";
    }
    regs_[v] = reg;
    return reg;
  }

  // Whether the expression is already a value rounded to bfloat16 (a cast to it): rounding it
  // again changes nothing.
  bool rounded_bf16(int e) const {
    const Expr& x = pool_.at(e);
    return x.k == Expr::K::Op && x.op == "cast" && x.ty == Ty::bf16;
  }

  // A row plan: one block (or warp) per outer index, the stages in order inside it.
  CudaLaunch rows(const std::string& kernel, const KernelPlan& K, const CudaChoice& choice = {}) {
    const size_t k = K.outer.size();
    const int64_t n_rows = prod(K.outer);
    CudaLaunch launch;
    launch.name = kernel;
    launch.what = "rows " + shape_str(K.outer) + ", " + std::to_string(K.stages.size()) + " stages, first " +
                  ty_name(val(K.stages[0]).ty) + shape_str(val(K.stages[0]).shape);
    if (n_rows == 0) {
      empty_ = true;
      return launch;
    }
    for (int v : K.stages) in_kernel_.insert(v);
    base_ = 1;
    // The outer variables, then each stage's own loops (vars made now: the pool's keys name them).
    std::vector<int> ovars;
    std::vector<int64_t> osizes;
    Idx oidx;
    for (size_t d = 0; d < k; ++d) {
      if (K.outer[d] == 1) {
        oidx.push_back(Index::constant(0));
        continue;
      }
      const int var = new_var(1);
      ovars.push_back(var);
      osizes.push_back(K.outer[d]);
      oidx.push_back(Index::var(var));
    }
    std::vector<Stage> stages;
    int64_t row_work = 1;
    std::set<int> top;
    for (int v : K.stages) {
      stages.push_back(plan_stage(v, oidx, k));
      const Stage& st = stages.back();
      row_work = std::max(row_work, st.red ? st.kept_n * st.red_n : st.inner_n);
      collect(st.root, top);
      collect_index(st.store, top);
    }
    flush(top, 0, 0);
    // Short rows: a warp each, 8 per block. Long rows: a block each. No outer dims: one block.
    bool warp = k > 0 && row_work <= 1024;
    if (k > 0 && choice.rows_per_block > 0) warp = choice.rows_per_block > 1;
    int threads = 256;
    if (k == 0) threads = static_cast<int>(std::min<int64_t>(1024, std::max<int64_t>(32, pow2_at_least(row_work))));
    else if (!warp) threads = row_work >= 16384 ? 1024 : row_work >= 4096 ? 512 : 256;
    if (!warp && choice.threads > 0) threads = choice.threads;
    const int warps_per_block = warp && choice.rows_per_block > 1 ? choice.rows_per_block : 8;
    const int cluster = warp || k == 0 ? 1 : row_cluster(stages, n_rows, row_work, threads, choice);
    if (warp) {
      body_ << "  const kidx x = (kidx)blockIdx.x * " << warps_per_block << " + (kidx)(threadIdx.x >> 5);\n"
            << "  if (x >= " << lit(n_rows) << ") return;\n"
            << "  const int tid = threadIdx.x & 31;\n"
            << "  const int nt = 32;\n";
    } else if (cluster > 1) {
      // The row's elements are dealt out over the cluster's threads (ct of cnt); every block keeps
      // going to the end, as each cluster barrier needs all of them.
      body_ << "  const kidx x = (kidx)blockIdx.x / " << cluster << ";\n"
            << "  const int tid = threadIdx.x;\n"
            << "  const int nt = " << threads << ";\n"
            << "  const int ct = (int)k_cluster_rank() * nt + tid;\n"
            << "  const int cnt = " << cluster << " * nt;\n";
      first_ = "ct", stride_ = "cnt", cluster_ = cluster;
    } else {
      body_ << "  const kidx x = (kidx)blockIdx.x;\n"
            << "  const int tid = threadIdx.x;\n"
            << "  const int nt = " << threads << ";\n";
    }
    row_threads_ = (warp ? 32 : threads) * cluster;
    decompose("x", ovars, osizes, 0);
    const char* barrier = warp ? "__syncwarp();" : cluster > 1 ? "k_cluster_sync();" : "__syncthreads();";
    const char* reduce = warp ? "k_warp_reduce" : "k_block_reduce";
    for (size_t s = 0; s < stages.size(); ++s) {
      const Stage& st = stages[s];
      std::set<int> pending;
      collect(st.root, pending);
      collect_index(st.store, pending);
      // What another thread of the row stored, read from memory: wait for it.
      if (s > 0 && reads_kernel_memory(pending)) body_ << "  " << barrier << "\n";
      flush(pending, 1, 0);
      if (st.red) emit_reduction(st, pending, reduce);
      else emit_pointwise(st, pending);
    }
    launch.block = static_cast<unsigned>(warp ? 32 * warps_per_block : threads);
    launch.cluster = static_cast<unsigned>(cluster);
    if (cluster > 1) launch.what += ", a cluster of " + std::to_string(cluster) + " blocks a row";
    const int64_t grid = warp ? (n_rows + warps_per_block - 1) / warps_per_block : n_rows * cluster;
    if (grid > 0x7fffffff) throw std::logic_error("row kernel " + kernel + " needs more than 2^31 blocks");
    launch.grid = static_cast<unsigned>(grid);
    finish_launch(launch);
    return launch;
  }

  // A column reduction: 32 kept elements per block across a warp's lanes, the reduced range split
  // over the block's warps, combined through shared memory. With few columns (a bias gradient of
  // 384 features is 12 blocks on a GPU of 132 multiprocessors) the reduced range is also split
  // across `splits` blocks per column strip, each storing its partial result into a scratch
  // buffer (`partial_slot`, splits x columns of the accumulator's type) that column_finish()
  // combines in a fixed order: the result does not depend on which block ran first.
  // Sibling reductions (KernelPlan::stages, several column reductions of one shape over the same
  // rows that do not read each other: a batch norm backward's two sums) share the kernel's loads
  // and loops, each with its accumulators, its shared-memory table and, when split, its partial
  // results (`partial_slots`, one per stage).
  CudaLaunch column(const std::string& kernel, const KernelPlan& K, int width = 1, int64_t splits = 1,
                    const std::vector<int>& partial_slots = {}) {
    const int v = K.stages.at(0);
    const ValueInfo& info = val(v);
    const std::vector<int64_t> kept = stripped(info.shape);
    const int64_t n_kept = prod(kept), n_red = prod(info.red.red_shape);
    const size_t ns = K.stages.size();
    CudaLaunch launch;
    launch.name = kernel;
    launch.what =
        "column " + std::string(ty_name(info.ty)) + shape_str(kept) + " over " + shape_str(info.red.red_shape);
    if (ns > 1) launch.what += ", " + std::to_string(ns) + " reductions";
    if (width > 1) launch.what += ", " + std::to_string(width) + " columns a thread";
    if (splits > 1) launch.what += " in " + std::to_string(splits) + " parts";
    if (n_kept == 0) {
      empty_ = true;
      return launch;
    }
    if (splits > 1 && partial_slots.size() != ns) throw std::logic_error("column kernel: one partial slot a stage");
    for (int s : K.stages) in_kernel_.insert(s);
    base_ = 1;
    const int64_t per_strip = 32 * static_cast<int64_t>(width);
    const int64_t strips = (n_kept + per_strip - 1) / per_strip, blocks = strips * splits;
    const int64_t chunk = (n_red + splits - 1) / splits;
    const int64_t warps = std::min<int64_t>(pow2_at_most(std::max<int64_t>(chunk, 1)), blocks >= o_.multiprocessors ? 8
                                                                                       : width > 1                  ? 16
                                                                                                   : 32);
    // Fewer columns than a warp's lanes take (a batch norm's 32 channels, 4 a thread: 8 lanes): a
    // warp takes several rows at once, `lanes` threads each, so that no lane idles. Below, `tx`
    // is a thread's lane within its row and `ty` its row slot ("virtual warp"), `rows` of them.
    const int64_t lanes = strips == 1 ? std::min<int64_t>(32, pow2_at_least((n_kept + width - 1) / width)) : 32;
    const int64_t rows = warps * (32 / lanes), pad = lanes + 1;
    Idx idx = kept_index(info, kept);
    // With several columns a thread, the innermost kept variable moves with them (ib + u): its
    // expressions are computed inside the per-column loop, under the reduced loop.
    const int inner = width > 1 ? kvars_.back() : -1;
    if (width > 1) var_level_[inner] = 3;
    std::vector<int> rvars;
    std::vector<int64_t> rsizes;
    const Idx red_idx = loop_index(info.red.red_shape, 2, &rvars, &rsizes);
    std::vector<int> roots;
    std::vector<Index> outs;
    std::set<int> pending;
    for (int s : K.stages) {
      roots.push_back(val(s).red.body(pool_, idx, red_idx));
      outs.push_back(LoweredGraph::offset(val(s), idx));
      if (!outs.back().exprs.empty()) throw std::logic_error("column reduction stored at a data-dependent index");
      collect(roots.back(), pending);
    }
    flush(pending, 0, 0);
    const std::string W = std::to_string(width), per = lit(per_strip);
    std::vector<std::string> acc_t(ns), acc(ns), tab(ns);
    for (size_t k = 0; k < ns; ++k) {
      const ValueInfo& sk = val(K.stages[k]);
      acc_t[k] = acc_type(sk);
      acc[k] = "acc" + std::to_string(K.stages[k]);
      tab[k] = ns == 1 ? std::string("kiln_col") : "kiln_col" + std::to_string(k);
      shared(acc_t[k], rows * width * pad);
      body_ << "  __shared__ " << acc_t[k] << " " << tab[k] << "[" << rows * width * pad << "];\n";
    }
    if (lanes == 32) body_ << "  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;\n";
    else body_ << "  const int tx = threadIdx.x % " << lanes << ", ty = threadIdx.x / " << lanes << ";\n";
    if (splits > 1)
      body_ << "  const kidx strip = (kidx)blockIdx.x % " << lit(strips) << ", part = (kidx)blockIdx.x / "
            << lit(strips) << ";\n";
    else body_ << "  const kidx strip = (kidx)blockIdx.x;\n";
    body_ << "  const kidx col = strip * " << per << " + tx" << (width > 1 ? " * " + lit(width) : "") << ";\n"
          << "  const bool active = col < " << lit(n_kept) << ";\n"
          << "  // Threads past the end compute the last column" << (width > 1 ? "s" : "")
          << " again (in range) and store nothing.\n"
          << "  const kidx x = active ? col : " << lit(n_kept - width) << ";\n";
    Vectorized vz;
    if (width > 1) {
      decompose("x", std::vector<int>(kvars_.begin(), kvars_.end() - 1),
                std::vector<int64_t>(ksizes_.begin(), ksizes_.end() - 1), 0, ksizes_.back());
      body_ << "  const kidx ib = " << (kvars_.size() > 1 ? "x % " + lit(ksizes_.back()) : std::string("x")) << ";\n";
      vz = column_vectors(roots, inner, width);
      body_ << "  const bool aligned = (" << vz.aligned << ") == 0;\n";
    } else {
      decompose("x", kvars_, ksizes_, 0);
    }
    flush(pending, 1, 0);
    for (size_t k = 0; k < ns; ++k) {
      const ValueInfo& sk = val(K.stages[k]);
      if (width > 1)
        body_ << "  " << acc_t[k] << " " << acc[k] << "[" << W << "];\n"
              << "#pragma unroll\n  for (int u = 0; u < " << W << "; ++u) " << acc[k] << "[u] = " << acc_init(sk)
              << ";\n";
      else body_ << "  " << acc_t[k] << " " << acc[k] << " = " << acc_init(sk) << ";\n";
    }
    const auto accu = [&](size_t k) { return width > 1 ? acc[k] + "[u]" : acc[k]; };
    if (n_red > 0) {
      // Several columns a thread: four rows' words in flight at once.
      if (splits > 1) {
        body_ << "  const kidx r_end = part * " << lit(chunk) << " + " << lit(chunk) << " < " << lit(n_red)
              << " ? part * " << lit(chunk) << " + " << lit(chunk) << " : " << lit(n_red) << ";\n";
        if (width > 1) body_ << "#pragma unroll 4\n";
        body_ << "  for (kidx r = part * " << lit(chunk) << " + ty; r < r_end; r += " << rows << ") {\n";
      } else {
        if (width > 1) body_ << "#pragma unroll 4\n";
        body_ << "  for (kidx r = ty; r < " << lit(n_red) << "; r += " << rows << ") {\n";
      }
      decompose("r", rvars, rsizes, 1);
      flush(pending, 2, 1);
      if (width > 1) {
        // The row's columns as whole words when aligned (one test for the whole kernel), else
        // one element at a time; then each column's terms.
        for (const auto& [key, arr] : vz.arrays) {
          const auto& [name, ty] = arr;
          use_buf(key.first, ty);
          read_.insert(key.first);
          const std::string at = "b" + std::to_string(key.first) + " + " + vz.index_at.at(key);
          body_ << "    alignas(16) " << mem_type(ty) << " " << name << "[" << W << "];\n"
                << "    if (aligned) k_vld<" << W << ">(" << name << ", " << at << ");\n"
                << "    else {\n#pragma unroll\n      for (int u = 0; u < " << W << "; ++u) " << name << "[u] = (" << at
                << ")[u];\n    }\n";
        }
        body_ << "#pragma unroll\n    for (int u = 0; u < " << W << "; ++u) {\n"
              << "      const kidx " << vname(inner) << " = ib + u;\n";
        vec_ = &vz;
        flush(pending, 3, 3);
        vec_ = nullptr;
        for (size_t k = 0; k < ns; ++k) body_ << "      " << combine(val(K.stages[k]), accu(k), name(roots[k])) << "\n";
        body_ << "    }\n  }\n";
      } else {
        for (size_t k = 0; k < ns; ++k) body_ << "    " << combine(val(K.stages[k]), acc[k], name(roots[k])) << "\n";
        body_ << "  }\n";
      }
    }
    // Each warp's accumulators into shared memory, then the first warp combines them in order and
    // stores (every column of the thread, ib + u, with several a thread).
    const bool many = width > 1;
    const std::string P = std::to_string(pad);
    const std::string cell = many ? "(ty * " + W + " + u) * " + P + " + tx" : "ty * " + P + " + tx";
    const std::string other = many ? "(w * " + W + " + u) * " + P + " + tx" : "w * " + P + " + tx";
    const int d = many ? 2 : 1;  // depth of the combining code
    for (size_t k = 0; k < ns; ++k) {
      if (many)
        body_ << "#pragma unroll\n  for (int u = 0; u < " << W << "; ++u) " << tab[k] << "[" << cell
              << "] = " << accu(k) << ";\n";
      else body_ << "  " << tab[k] << "[" << cell << "] = " << accu(k) << ";\n";
    }
    body_ << "  __syncthreads();\n"
          << "  if (ty == 0 && active) {\n";
    if (many) body_ << "#pragma unroll\n    for (int u = 0; u < " << W << "; ++u) {\n";
    if (many && splits == 1) body_ << ind(d) << "const kidx " << vname(inner) << " = ib + u;\n";
    for (size_t k = 0; k < ns; ++k) {
      const int s = K.stages[k];
      const ValueInfo& sk = val(s);
      body_ << ind(d) << "for (int w = 1; w < " << rows << "; ++w) " << accu(k) << " = " << op_struct(sk) << "()("
            << accu(k) << ", " << tab[k] << "[" << other << "]);\n";
      if (splits > 1) {
        const int slot = partial_slots[k];
        use_buf(slot, acc_ty(sk));
        written_.insert(slot);
        body_ << ind(d) << "b" << slot << "[part * " << lit(n_kept) << " + col" << (many ? " + u" : "")
              << "] = " << accu(k) << ";\n";
      } else {
        const std::string res = "rv" + std::to_string(s);
        body_ << ind(d) << "const " << reg_type(sk.ty) << " " << res << " = " << finish(sk, accu(k)) << ";\n";
        store(s, outs[k], res, d);
      }
    }
    if (many) body_ << "    }\n";
    body_ << "  }\n";
    launch.block = static_cast<unsigned>(32 * warps);
    if (blocks > 0x7fffffff) throw std::logic_error("column kernel " + kernel + " needs more than 2^31 blocks");
    launch.grid = static_cast<unsigned>(blocks);
    finish_launch(launch);
    return launch;
  }

  // A column kernel's loads that walk memory with its innermost kept variable `inner` (coefficient
  // 1, every other coefficient a multiple of `width`): one register array each, read as whole
  // words; `index_at` is the load's index at the thread's first column (ib).
  Vectorized column_vectors(const std::vector<int>& roots, int inner, int width) {
    Vectorized vz;
    vz.width = width;
    std::set<int> exprs;
    for (int root : roots) collect_all(root, exprs);
    std::set<std::string> tests;
    for (int e : exprs) {
      const Expr& x = pool_.at(e);
      if (x.k != Expr::K::Load || !x.idx.exprs.empty() || x.idx.coef(inner) != 1) continue;
      const auto key = std::make_pair(x.buf, index_str(x.idx));
      if (vz.arrays.count(key)) continue;
      vz.arrays[key] = {"a" + std::to_string(vz.arrays.size()), x.ty};
      vz.index_at[key] = index_with(x.idx, inner, "ib");
      const int64_t bytes = std::min<int64_t>(16, width * static_cast<int64_t>(ty_size(x.ty)));
      tests.insert("((unsigned long long)b" + std::to_string(x.buf) + " & " + std::to_string(bytes - 1) + ")");
    }
    for (const auto& t : tests) vz.aligned += (vz.aligned.empty() ? "" : " | ") + t;
    if (vz.aligned.empty()) vz.aligned = "0";
    return vz;
  }

  // How many consecutive columns each thread of a column reduction takes (1, 4 or 8): more than
  // one when the innermost kept dim's extent is a multiple of it and every load that walks memory
  // with that dim does so contiguously, with every other coefficient a multiple of it (so each
  // row's columns of a thread are whole 16-byte words, or 8-byte ones, at an aligned buffer) and
  // elements of 2 bytes or more. 8 when a bfloat16 is among those loads, else 4.
  static int column_width(const ValueInfo& info) {
    const std::vector<int64_t> kept = stripped(info.shape);
    ExprPool pool;
    Idx idx;
    int inner = -1;
    int64_t inner_size = 0;
    for (int64_t s : kept) {
      if (s == 1) {
        idx.push_back(Index::constant(0));
        continue;
      }
      inner = pool.new_var();
      inner_size = s;
      idx.push_back(Index::var(inner));
    }
    if (inner < 0) return 1;
    while (idx.size() < info.shape.size()) idx.push_back(Index::constant(0));
    std::vector<int> rv;
    Idx red_idx;
    for (int64_t s : info.red.red_shape) {
      if (s == 1) {
        red_idx.push_back(Index::constant(0));
        continue;
      }
      rv.push_back(pool.new_var());
      red_idx.push_back(Index::var(rv.back()));
    }
    const int root = info.red.body(pool, idx, red_idx);
    std::vector<int> stack = {root};
    std::set<int> seen;
    std::vector<const Expr*> walking;
    bool narrow = false;
    while (!stack.empty()) {
      const int e = stack.back();
      stack.pop_back();
      if (!seen.insert(e).second) continue;
      const Expr& x = pool.at(e);
      for (int c : x.args) stack.push_back(c);
      for (const auto& [ee, k] : x.idx.exprs) stack.push_back(ee);
      if (x.k != Expr::K::Load || !x.idx.exprs.empty() || x.idx.coef(inner) != 1) continue;
      if (ty_size(x.ty) < 2) return 1;
      walking.push_back(&x);
      narrow = narrow || x.ty == Ty::bf16;
    }
    if (walking.empty()) return 1;
    // The widest that fits, preferring one whose strips of 32 threads cover the columns exactly
    // (384 bfloat16 columns: 4 a thread, three full strips, not 8 and a half-idle second strip).
    const int64_t n_kept = prod(kept);
    int fits = 1;
    for (int width : narrow ? std::vector<int>{8, 4} : std::vector<int>{4}) {
      bool ok = inner_size % width == 0;
      for (const Expr* x : walking) {
        ok = ok && x->idx.c % width == 0;
        for (const auto& [var, k] : x->idx.vars) ok = ok && (var == inner || k % width == 0);
      }
      if (!ok) continue;
      if (n_kept % (32 * width) == 0) return width;
      fits = width;
    }
    return fits;
  }

  // The second half of a split column reduction: one thread per column combines the `splits`
  // partial results in order, finishes (scale, rounding) and stores.
  // `epilogue`: pointwise stages of the reduction's shape that read it (and each other) only at
  // their own element, computed by the thread that combined it (a bias's optimizer update after its
  // gradient): one launch instead of two.
  CudaLaunch column_finish(const std::string& kernel, const KernelPlan& K, int64_t splits, int partial_slot,
                           const std::vector<int>& epilogue = {}) {
    return column_finish(kernel, K, splits, std::vector<int>{partial_slot}, epilogue);
  }
  // With sibling reductions: one partial slot per stage, each combined in the same fixed order.
  CudaLaunch column_finish(const std::string& kernel, const KernelPlan& K, int64_t splits,
                           const std::vector<int>& partial_slots, const std::vector<int>& epilogue = {}) {
    const int v = K.stages.at(0);
    const ValueInfo& info = val(v);
    const std::vector<int64_t> kept = stripped(info.shape);
    const int64_t n_kept = prod(kept);
    const size_t ns = K.stages.size();
    if (partial_slots.size() != ns) throw std::logic_error("column_finish: one partial slot a stage");
    CudaLaunch launch;
    launch.name = kernel;
    launch.what =
        "column " + std::string(ty_name(info.ty)) + shape_str(kept) + ", " + std::to_string(splits) + " parts combined";
    if (ns > 1) launch.what += " for " + std::to_string(ns) + " reductions";
    if (!epilogue.empty())
      launch.what += ", then " + std::to_string(epilogue.size()) + (epilogue.size() == 1 ? " stage" : " stages");
    if (n_kept == 0) {
      empty_ = true;
      return launch;
    }
    for (int s : K.stages) in_kernel_.insert(s);
    base_ = 1;
    Idx idx = kept_index(info, kept);
    // 32 columns a block, one a lane; the parts split over the block's warps (warp w takes parts
    // w, w + warps, ... in order: a few independent loads each, not `splits` in a row), then the
    // first warp combines the warps' sums in order. The order is fixed: the result does not
    // depend on scheduling.
    // Always 16 warps (those without a part add the identity): a count that followed `splits`
    // made another kernel text, so another compile, whenever a length moved the parts across a
    // power of two.
    const int64_t warps = 16;
    body_ << "  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;\n"
          << "  const kidx col = (kidx)blockIdx.x * 32 + tx;\n"
          << "  const kidx xs = col < " << lit(n_kept) << " ? col : " << lit(n_kept - 1) << ";\n";
    std::vector<std::string> tab(ns);
    for (size_t k = 0; k < ns; ++k) {
      const ValueInfo& sk = val(K.stages[k]);
      const std::string acc_t = acc_type(sk), part = "part_acc" + (ns == 1 ? std::string() : std::to_string(k));
      tab[k] = ns == 1 ? std::string("kiln_col") : "kiln_col" + std::to_string(k);
      use_buf(partial_slots[k], acc_ty(sk));
      read_.insert(partial_slots[k]);
      const std::string P = "b" + std::to_string(partial_slots[k]);
      shared(acc_t, warps * 33);
      body_ << "  __shared__ " << acc_t << " " << tab[k] << "[" << warps * 33 << "];\n"
            << "  " << acc_t << " " << part << " = " << acc_init(sk) << ";\n"
            << "#pragma unroll 4\n"
            << "  for (int p = ty; p < " << lit(splits) << "; p += " << warps << ") " << part << " = " << op_struct(sk)
            << "()(" << part << ", " << P << "[(kidx)p * " << lit(n_kept) << " + xs]);\n"
            << "  " << tab[k] << "[ty * 33 + tx] = " << part << ";\n";
    }
    body_ << "  __syncthreads();\n"
          << "  if (ty != 0 || col >= " << lit(n_kept) << ") return;\n"
          << "  const kidx x = col;\n";
    decompose("x", kvars_, ksizes_, 0);
    for (size_t k = 0; k < ns; ++k) {
      const int s = K.stages[k];
      const ValueInfo& sk = val(s);
      const std::string acc = "acc" + std::to_string(s), res = "rv" + std::to_string(s);
      body_ << "  " << acc_type(sk) << " " << acc << " = " << tab[k] << "[tx];\n"
            << "  for (int w = 1; w < " << warps << "; ++w) " << acc << " = " << op_struct(sk) << "()(" << acc << ", "
            << tab[k] << "[w * 33 + tx]);\n"
            << "  const " << reg_type(sk.ty) << " " << res << " = " << finish(sk, acc) << ";\n";
      store(s, LoweredGraph::offset(sk, idx), res, 0);
      regs_[s] = res;
    }
    for (int e : epilogue) in_kernel_.insert(e);
    for (int e : epilogue) {
      const int root = L_.compute(pool_, e, idx);
      const Index off = LoweredGraph::offset(val(e), idx);
      std::set<int> pending;
      collect(root, pending);
      collect_index(off, pending);
      flush(pending, 1, 0);
      store(e, off, stage_register(e, root, 0), 0);
    }
    // One thread per kept element, every access of the epilogue at it (the partial results it
    // combines are scratch): in-place outputs are judged as in a flat kernel.
    launch.flat = true;
    launch.accesses = accesses_;
    launch.block = static_cast<unsigned>(32 * warps);
    launch.grid = static_cast<unsigned>((n_kept + 31) / 32);
    finish_launch(launch);
    return launch;
  }

  // A scatter-add (Reduction::scatter, an embedding's gradient), first half: the reduced range
  // (the tokens) in `parts` consecutive parts, the output's columns in strips of 32. A block takes
  // one part of one strip with `lanes` warps; each warp keeps its own table of rows x 32 columns
  // in shared memory, each thread one column of it, and adds every lanes-th token of the part (its
  // key's row), in token order, with no atomics (no other thread touches its column). The first
  // warp then adds the other warps' tables to its own in warp order and stores the block's table
  // as part `part` of the partial results (`partial_slot`: parts x rows x columns), which
  // column_finish() combines in part order: every run gives the same bits.
  CudaLaunch scatter(const std::string& kernel, const KernelPlan& K, int64_t parts, int partial_slot) {
    const int v = K.stages.at(0);
    const ValueInfo& info = val(v);
    const Scatter& sc = *info.red.scatter;
    const int64_t rows = info.shape.at(0);
    const std::vector<int64_t> cols(info.shape.begin() + 1, info.shape.end());
    const int64_t n_cols = prod(cols), n_red = prod(info.red.red_shape), n_kept = rows * n_cols;
    const int lanes = scatter_lanes(info);
    const int64_t strips = (n_cols + 31) / 32, chunk = (n_red + parts - 1) / parts;
    CudaLaunch launch;
    launch.name = kernel;
    launch.what = "scatter-add " + std::string(ty_name(info.ty)) + shape_str(info.shape) + " from " +
                  shape_str(info.red.red_shape) + " in " + std::to_string(parts) + " parts, " + std::to_string(lanes) +
                  (lanes == 1 ? " table" : " tables") + " a block";
    if (n_kept == 0) {
      empty_ = true;
      return launch;
    }
    in_kernel_.insert(v);
    base_ = 1;
    kvars_.clear();
    ksizes_.clear();
    Idx idx{Index::constant(0)};  // the row is the key's, not an index of the loops
    const Idx col_idx = loop_index(cols, 1, &kvars_, &ksizes_);
    idx.insert(idx.end(), col_idx.begin(), col_idx.end());
    std::vector<int> rvars;
    std::vector<int64_t> rsizes;
    const Idx red_idx = loop_index(info.red.red_shape, 2, &rvars, &rsizes);
    const int key = sc.key(pool_, red_idx), term = sc.term(pool_, idx, red_idx);
    std::set<int> pending;
    collect(key, pending);
    collect(term, pending);
    flush(pending, 0, 0);
    const std::string acc_t = acc_type(info), R = std::to_string(rows);
    shared(acc_t, lanes * rows * 32);
    body_ << "  __shared__ " << acc_t << " kiln_tab[" << lanes * rows * 32 << "];\n"
          << "  const int tx = threadIdx.x & 31, lane = threadIdx.x >> 5;\n"
          << "  " << acc_t << "* const tab = kiln_tab + lane * " << rows * 32 << ";\n"
          << "  const kidx strip = (kidx)blockIdx.x % " << lit(strips) << ", part = (kidx)blockIdx.x / " << lit(strips)
          << ";\n"
          << "  const kidx col = strip * 32 + tx;\n"
          << "  const bool active = col < " << lit(n_cols) << ";\n"
          << "  // Threads past the end add into the last column (in range) and store nothing.\n"
          << "  const kidx x = active ? col : " << lit(n_cols - 1) << ";\n";
    decompose("x", kvars_, ksizes_, 0);
    flush(pending, 1, 0);
    body_ << "  for (int k = 0; k < " << R << "; ++k) tab[k * 32 + tx] = " << acc_init(info) << ";\n"
          << "  const kidx r_end = part * " << lit(chunk) << " + " << lit(chunk) << " < " << lit(n_red) << " ? part * "
          << lit(chunk) << " + " << lit(chunk) << " : " << lit(n_red) << ";\n"
          << "  // Eight tokens' loads in flight; the table adds them in token order.\n"
          << "#pragma unroll 8\n"
          << "  for (kidx r = part * " << lit(chunk) << " + lane; r < r_end; r += " << lanes << ") {\n";
    decompose("r", rvars, rsizes, 1);
    flush(pending, 2, 1);
    body_ << "    const long long key = (long long)" << name(key) << ";\n"
          << "    if (key >= 0 && key < " << R << "LL) tab[key * 32 + tx] += (" << acc_t << ")" << name(term) << ";\n"
          << "  }\n";
    if (lanes > 1) body_ << "  __syncthreads();\n  if (lane != 0) return;\n";
    use_buf(partial_slot, acc_ty(info));
    written_.insert(partial_slot);
    body_ << "  if (!active) return;\n"
          << "  for (int k = 0; k < " << R << "; ++k) {\n"
          << "    " << acc_t << " sum = tab[k * 32 + tx];\n";
    if (lanes > 1)
      body_ << "    for (int w = 1; w < " << lanes << "; ++w) sum += kiln_tab[(w * " << R << " + k) * 32 + tx];\n";
    body_ << "    b" << partial_slot << "[part * " << lit(n_kept) << " + k * " << lit(n_cols) << " + col] = sum;\n"
          << "  }\n";
    launch.block = static_cast<unsigned>(32 * lanes);
    if (strips * parts > 0x7fffffff)
      throw std::logic_error("scatter kernel " + kernel + " needs more than 2^31 blocks");
    launch.grid = static_cast<unsigned>(strips * parts);
    finish_launch(launch);
    return launch;
  }

  // A scatter-add's warps a block (each with its table of rows x 32 columns): as many as fit a
  // block's shared memory, at most 8.
  static int scatter_lanes(const ValueInfo& info) {
    const int64_t table = info.shape.at(0) * 32 * (info.ty == Ty::f64 ? 8 : 4);
    int lanes = 1;
    while (lanes < 8 && 2 * lanes * table <= kScatterTableBytes) lanes *= 2;
    return lanes;
  }
  // How many parts a scatter-add's tokens are split into: blocks enough to fill every
  // multiprocessor's shared memory (at most 8 blocks each), each warp still with 16 tokens or
  // more; the combining kernel then reads parts x rows x columns of partial results.
  static int64_t scatter_parts(const ValueInfo& info, int multiprocessors) {
    const int lanes = scatter_lanes(info);
    const int64_t table = lanes * info.shape.at(0) * 32 * (info.ty == Ty::f64 ? 8 : 4);
    const int64_t per_sm = std::clamp<int64_t>(200 * 1024 / table, 1, 8);
    const int64_t n_cols = prod(std::vector<int64_t>(info.shape.begin() + 1, info.shape.end()));
    const int64_t strips = (n_cols + 31) / 32, n_red = prod(info.red.red_shape);
    const int64_t want = (per_sm * multiprocessors + strips - 1) / strips;
    return std::max<int64_t>(1, std::min<int64_t>({want, n_red / (16 * lanes), 256}));
  }

  // How many blocks to split a column reduction's reduced range over, and whether to: only when
  // its column strips alone leave most multiprocessors idle and each part still has rows enough.
  // Four blocks a multiprocessor: with about one (at most 64 parts of 512 rows), a [16384, 384]
  // layer-norm weight gradient ran at 1.4 TB/s.
  static constexpr int64_t kMostColumnParts = 512;
  static int64_t column_splits(const ValueInfo& info, int multiprocessors, int width = 1) {
    const int64_t per_strip = 32 * static_cast<int64_t>(width);
    const int64_t strips = (prod(stripped(info.shape)) + per_strip - 1) / per_strip, n_red = prod(info.red.red_shape);
    // Below a thousand rows a second launch costs more than the single kernel's idle time.
    if (strips == 0 || strips * 2 > multiprocessors || n_red < 1024) return 1;
    const int64_t want = (4 * multiprocessors + strips - 1) / strips;
    // Parts of at least 128 rows, and at most 512 of them (the second kernel's 16 warps add 32
    // each). A batch norm's per-channel sums over NHWC activations ([32] over 131072 rows) ran
    // at 1.0-1.6 TB/s as 128 parts (one block of 512 threads a multiprocessor: too few loads in
    // flight).
    return std::max<int64_t>(1, std::min<int64_t>({want, n_red / 128, kMostColumnParts}));
  }
  static Ty acc_ty(const ValueInfo& v) {
    if (v.red.combine == "sum") return v.ty == Ty::f64 ? Ty::f64 : is_float(v.ty) ? Ty::f32 : Ty::i64;
    return v.ty == Ty::bf16 ? Ty::f32 : v.ty;
  }

  std::string text() const { return text_; }

 private:
  // A stage of a row kernel: its loops and its expression.
  struct Stage {
    int v = -1;
    bool red = false;
    std::vector<int> inner_vars, kept_vars, red_vars;  // pointwise: inner; reduction: kept-inner, reduced
    std::vector<int64_t> inner_sizes, kept_sizes, red_sizes;
    int64_t inner_n = 1, kept_n = 1, red_n = 1;
    int root = -1;
    Index store;
  };

  const ValueInfo& val(int v) const { return L_.values[static_cast<size_t>(v)]; }

  // A column kernel's index over the kept dims (one variable each, extent-1 dims index 0, into
  // kvars_ / ksizes_), padded with zeros for the reduced dims.
  Idx kept_index(const ValueInfo& info, const std::vector<int64_t>& kept) {
    kvars_.clear();
    ksizes_.clear();
    Idx idx = loop_index(kept, 1, &kvars_, &ksizes_);
    while (idx.size() < info.shape.size()) idx.push_back(Index::constant(0));
    return idx;
  }

  // An index over `sizes`: a new variable of loop level `level` for each extent other than 1
  // (appended to vars, its extent to used), index 0 for extent 1.
  Idx loop_index(const std::vector<int64_t>& sizes, int level, std::vector<int>* vars, std::vector<int64_t>* used) {
    Idx idx;
    for (int64_t s : sizes) {
      if (s == 1) {
        idx.push_back(Index::constant(0));
        continue;
      }
      vars->push_back(new_var(level));
      used->push_back(s);
      idx.push_back(Index::var(vars->back()));
    }
    return idx;
  }

  int new_var(int level) {
    const int v = pool_.new_var();
    var_level_[v] = level;
    return v;
  }

  // An integer literal of index math (marked: it may become an argument).
  std::string lit(int64_t x) const { return marked(std::to_string(x) + (wide_ ? "LL" : "")); }

  std::string vname(int v) const { return "v" + std::to_string(v); }

  std::string ind(int depth) const { return std::string(static_cast<size_t>(2 * depth + 2), ' '); }

  // `flat` (a flattened index over `sizes`, row-major) into one variable per size.
  // `below` is the extent of what varies faster than the last of them (not decomposed here).
  void decompose(const std::string& flat, const std::vector<int>& vars, const std::vector<int64_t>& sizes, int depth,
                 int64_t below = 1) {
    int64_t stride = prod(sizes) * below;
    for (size_t d = 0; d < vars.size(); ++d) {
      stride /= sizes[d];
      std::string e = flat;
      if (stride != 1) e = "(" + e + " / " + lit(stride) + ")";
      if (d > 0) e = "(" + e + " % " + lit(sizes[d]) + ")";
      body_ << ind(depth) << "const kidx " << vname(vars[d]) << " = " << e << ";\n";
    }
  }

  Stage plan_stage(int v, const Idx& oidx, size_t k) {
    const ValueInfo& info = val(v);
    Stage st;
    st.v = v;
    st.red = info.kind == ValueInfo::Kind::Reduction;
    Idx idx = oidx;
    if (!st.red) {
      for (size_t d = k; d < info.shape.size(); ++d) {
        if (info.shape[d] == 1) {
          idx.push_back(Index::constant(0));
          continue;
        }
        const int var = new_var(2);
        st.inner_vars.push_back(var);
        st.inner_sizes.push_back(info.shape[d]);
        idx.push_back(Index::var(var));
      }
      st.inner_n = prod(st.inner_sizes);
      st.root = L_.compute(pool_, v, idx);
      st.store = LoweredGraph::offset(info, idx);
      return st;
    }
    const auto kept = stripped(info.shape);
    if (kept.size() < k) throw std::logic_error("reduction stage with fewer kept dims than its kernel's outer ones");
    for (size_t d = k; d < kept.size(); ++d) {
      if (kept[d] == 1) {
        idx.push_back(Index::constant(0));
        continue;
      }
      const int var = new_var(2);
      st.kept_vars.push_back(var);
      st.kept_sizes.push_back(kept[d]);
      idx.push_back(Index::var(var));
    }
    while (idx.size() < info.shape.size()) idx.push_back(Index::constant(0));
    st.kept_n = prod(st.kept_sizes);
    const int red_level = st.kept_vars.empty() ? 2 : 3;
    Idx red_idx;
    for (int64_t s : info.red.red_shape) {
      if (s == 1) {
        red_idx.push_back(Index::constant(0));
        continue;
      }
      const int var = new_var(red_level);
      st.red_vars.push_back(var);
      st.red_sizes.push_back(s);
      red_idx.push_back(Index::var(var));
    }
    st.red_n = prod(info.red.red_shape);
    st.root = info.red.body(pool_, idx, red_idx);
    st.store = LoweredGraph::offset(info, idx);
    return st;
  }

  void emit_pointwise(const Stage& st, std::set<int>& pending) {
    if (st.inner_n == 0) return;
    unroll(0);
    body_ << "  for (kidx j = " << first_ << "; j < " << lit(st.inner_n) << "; j += " << stride_ << ") {\n";
    decompose("j", st.inner_vars, st.inner_sizes, 1);
    flush(pending, 2, 1);
    store(st.v, st.store, name(st.root), 1);
    body_ << "  }\n";
  }

  void emit_reduction(const Stage& st, std::set<int>& pending, const char* reduce) {
    const ValueInfo& info = val(st.v);
    int d = 0;
    if (!st.kept_vars.empty()) {
      if (st.kept_n == 0) return;
      body_ << "  for (kidx kk = 0; kk < " << lit(st.kept_n) << "; ++kk) {\n";
      d = 1;
      decompose("kk", st.kept_vars, st.kept_sizes, d);
      flush(pending, 2, d);
    }
    const std::string acc = "acc" + std::to_string(st.v), res = "rv" + std::to_string(st.v);
    body_ << ind(d) << acc_type(info) << " " << acc << " = " << acc_init(info) << ";\n";
    if (st.red_n > 0) {
      const int lvl = st.kept_vars.empty() ? 2 : 3;
      unroll(d);
      body_ << ind(d) << "for (kidx r = " << first_ << "; r < " << lit(st.red_n) << "; r += " << stride_ << ") {\n";
      decompose("r", st.red_vars, st.red_sizes, d + 1);
      flush(pending, lvl, d + 1);
      body_ << ind(d + 1) << combine(info, acc, name(st.root)) << "\n" << ind(d) << "}\n";
    }
    body_ << ind(d) << acc << " = " << reduce << "<" << op_struct(info) << ">(" << acc << ");\n";
    if (cluster_ > 1)
      body_ << ind(d) << acc << " = k_cluster_reduce<" << op_struct(info) << ", " << cluster_ << ">(" << acc << ");\n";
    body_ << ind(d) << "const " << reg_type(info.ty) << " " << res << " = " << finish(info, acc) << ";\n";
    body_ << ind(d) << "if (" << first_ << " == 0) {\n";
    store(st.v, st.store, res, d + 1);
    body_ << ind(d) << "}\n";
    if (!st.kept_vars.empty()) {
      body_ << "  }\n";
    } else {
      regs_[st.v] = res;  // every thread of the row has it: later stages read the register
    }
  }

  // A row loop of several elements a thread is unrolled 4 times: its loads do not wait for each
  // other (a reduction's accumulator still adds them in order), so each thread keeps 4 in flight
  // where one at a time left a 131,072-element batch-norm row at a third of the memory's speed.
  // Short rows get it too (the compiler's remainder loop costs them next to nothing): whether a
  // row is long must not make another kernel text for each length a dynamic step meets.
  void unroll(int depth) { body_ << ind(depth) << "#pragma unroll 4\n"; }

  void store(int v, const Index& off, const std::string& value, int depth) {
    const ValueInfo& info = val(v);
    use_buf(info.buffer, info.ty);
    written_.insert(info.buffer);
    access(true, info.buffer, index_str(off));
    const std::string b = "b" + std::to_string(info.buffer) + "[" + index_str(off) + "]";
    if (info.ty == Ty::bf16) body_ << ind(depth) << b << " = k_f2bf(" << value << ");\n";
    else body_ << ind(depth) << b << " = (" << mem_type(info.ty) << ")(" << value << ");\n";
  }

  void finish_launch(CudaLaunch& launch) {
    std::ostringstream os;
    if (launch.cluster > 1) os << "KILN_CLUSTER_KERNEL(" << launch.block << ", " << launch.cluster << ") ";
    else os << "KILN_KERNEL(" << launch.block << ") ";
    os << launch.name << "(";
    bool first = true;
    for (const auto& [b, ty] : bufs_) {
      // A buffer the kernel both writes and reads (a row's statistic that other threads of the row
      // read back after a barrier) is not __restrict__: with it, nvcc may read through the
      // non-coherent read-only cache (LDG.CONSTANT) and see the value from before the barrier.
      // Nor is one that may share memory with another parameter (an in-place output and its input).
      const bool restrict = !(written_.count(b) && read_.count(b)) && !o_.may_alias.count(b);
      const std::string decl = std::string(mem_type(ty)) + (restrict ? "* __restrict__ b" : "* b") + std::to_string(b);
      os << (first ? "" : ", ") << decl;
      launch.buffers.push_back(b);
      launch.params.push_back(decl);
      first = false;
    }
    if (max_scalar_ >= 0) {
      os << (first ? "" : ", ") << "const double* __restrict__ P";
      launch.scalars = true;
    }
    os << ") {\n  typedef " << (wide_ ? "long long" : "int") << " kidx;\n" << body_.str() << "}\n\n";
    launch.reads = read_;
    launch.shared_bytes = shared_bytes_;
    launch.writes = written_;
    text_ = os.str();
  }

  void access(bool is_store, int buf, std::string index) {
    accesses_.back().push_back(CudaAccess{is_store, buf, std::move(index)});
  }

  // ---- Expressions ----

  std::string index_str(const Index& ix) {
    std::string s = lit(ix.c);
    for (const auto& [v, k] : ix.vars) s += " + " + lit(k) + " * " + vname(v);
    for (const auto& [e, k] : ix.exprs) s += " + " + lit(k) + " * (kidx)" + name(e);
    return "(" + s + ")";
  }

  std::string name(int e) const {
    auto it = names_.find(e);
    if (it == names_.end()) throw std::logic_error("expression used before it was emitted");
    return it->second;
  }

  void use_buf(int b, Ty ty) {
    if (b < 0) throw std::logic_error("a value without a buffer is read or written");
    auto [it, fresh] = bufs_.emplace(b, ty);
    if (!fresh && it->second != ty) throw std::logic_error("buffer " + std::to_string(b) + " read as two types");
  }

  std::string text(int e) {
    const Expr& x = pool_.at(e);
    const std::string T = reg_type(x.ty);
    auto a = [&](size_t i) { return name(x.args[i]); };
    switch (x.k) {
      case Expr::K::Const: return cu_const(x.c, x.ty);
      case Expr::K::Param: {
        const ScalarParam& p = L_.params.at(static_cast<size_t>(x.param));
        if (p.runtime_scalar < 0) return cu_const(p.value, x.ty);
        max_scalar_ = std::max(max_scalar_, p.runtime_scalar);
        return "((" + T + ")P[" + std::to_string(p.runtime_scalar) + "])";
      }
      case Expr::K::IndexVal: return "((long long)" + index_str(x.idx) + ")";
      case Expr::K::Load: {
        auto r = regs_.find(x.value);
        if (r != regs_.end() && x.logical_known && in_kernel_.count(x.value)) return r->second;
        use_buf(x.buf, x.ty);
        read_.insert(x.buf);
        if (vec_ && x.idx.exprs.empty()) {
          // Inside a flat kernel's vector loop: this element of its register array, if it has one.
          auto arr = vec_->arrays.find({x.buf, index_str(x.idx)});
          if (arr != vec_->arrays.end()) {
            const std::string ref = arr->second.first + "[u]";
            return x.ty == Ty::bf16 ? "k_bf2f(" + ref + ")" : ref;
          }
        }
        access(false, x.buf, index_str(x.idx));
        const std::string ref = "b" + std::to_string(x.buf) + "[" + index_str(x.idx) + "]";
        return x.ty == Ty::bf16 ? "k_bf2f(" + ref + ")" : ref;
      }
      case Expr::K::Op: break;
    }
    const std::string& op = x.op;
    if (op == "add") return "(" + a(0) + " + " + a(1) + ")";
    if (op == "sub") return "(" + a(0) + " - " + a(1) + ")";
    if (op == "mul") return "(" + a(0) + " * " + a(1) + ")";
    if (op == "div") return "(" + a(0) + " / " + a(1) + ")";
    if (op == "neg") return "(-" + a(0) + ")";
    if (op == "relu") return "(" + a(0) + " < (" + T + ")0 ? (" + T + ")0 : " + a(0) + ")";
    if (op == "sigmoid") return "((" + T + ")1 / ((" + T + ")1 + k_exp(-" + a(0) + ")))";
    if (op == "exp" || op == "log" || op == "tanh" || op == "erf" || op == "ndtr" || op == "sqrt" || op == "abs" ||
        op == "rsqrt")
      return "k_" + op + "((" + T + ")" + a(0) + ")";
    if (op == "reciprocal") return "((" + T + ")1 / " + a(0) + ")";
    if (op == "pow") return "k_pow((" + T + ")" + a(0) + ", (" + T + ")" + a(1) + ")";
    if (op == "maximum") return "k_max<" + T + ">(" + a(0) + ", " + a(1) + ")";
    if (op == "minimum") return "k_min<" + T + ">(" + a(0) + ", " + a(1) + ")";
    if (op == "where") return "(" + a(0) + " ? (" + T + ")" + a(1) + " : (" + T + ")" + a(2) + ")";
    if (op == "cast") {
      // A cast to bfloat16 rounds (the value is then kept in float); from it, float widens.
      if (x.ty == Ty::bf16) return "k_round_bf16((float)" + a(0) + ")";
      return "((" + T + ")" + a(0) + ")";
    }
    if (op == "and") return "(" + a(0) + " && " + a(1) + ")";
    static const std::map<std::string, std::string> cmp = {{"eq", "=="}, {"ne", "!="}, {"lt", "<"},
                                                           {"le", "<="}, {"gt", ">"},  {"ge", ">="}};
    if (auto it = cmp.find(op); it != cmp.end()) return "(" + a(0) + " " + it->second + " " + a(1) + ")";
    throw std::logic_error("no CUDA for op '" + op + "'");
  }

  // The loop depth at which e can be computed: the deepest variable it reads; loads of values this
  // kernel computes wait for the stage (base_).
  int level(int e) {
    auto it = level_.find(e);
    if (it != level_.end()) return it->second;
    const Expr& x = pool_.at(e);
    int l = 0;
    for (const auto& [v, k] : x.idx.vars) l = std::max(l, var_level_.at(v));
    for (const auto& [ee, k] : x.idx.exprs) l = std::max(l, level(ee));
    for (int c : x.args) l = std::max(l, level(c));
    if (x.k == Expr::K::Load && in_kernel_.count(x.value)) l = std::max(l, base_);
    level_[e] = l;
    return l;
  }

  void collect(int e, std::set<int>& out) {
    if (names_.count(e) || !out.insert(e).second) return;
    const Expr& x = pool_.at(e);
    for (int c : x.args) collect(c, out);
    for (const auto& [ee, k] : x.idx.exprs) collect(ee, out);
  }
  void collect_index(const Index& ix, std::set<int>& out) {
    for (const auto& [ee, k] : ix.exprs) collect(ee, out);
  }

  // Whether a pending expression reads a value of this kernel from memory (not a register).
  bool reads_kernel_memory(const std::set<int>& pending) const {
    for (int e : pending) {
      const Expr& x = pool_.at(e);
      if (x.k != Expr::K::Load || !in_kernel_.count(x.value)) continue;
      if (!(regs_.count(x.value) && x.logical_known)) return true;
    }
    return false;
  }

  // Emits, in order, every pending expression whose level is at most `lvl`.
  void flush(std::set<int>& pending, int lvl, int depth) {
    for (auto it = pending.begin(); it != pending.end();) {
      if (level(*it) > lvl) {
        ++it;
        continue;
      }
      const int e = *it;
      const Expr& x = pool_.at(e);
      std::string nm = "t" + std::to_string(e);
      if (x.k == Expr::K::Const || x.k == Expr::K::Param) {
        nm = text(e);  // literals and table reads inline
      } else {
        body_ << ind(depth) << "const " << reg_type(x.ty) << " " << nm << " = " << text(e) << ";\n";
      }
      names_[e] = nm;
      it = pending.erase(it);
    }
  }

  // ---- Reductions ----

  std::string acc_type(const ValueInfo& v) const {
    if (v.red.combine == "sum") {
      if (v.ty == Ty::f64) return "double";
      return is_float(v.ty) ? "float" : "long long";
    }
    return reg_type(v.ty);
  }
  std::string acc_init(const ValueInfo& v) const {
    const std::string t = acc_type(v);
    if (v.red.combine == "sum") return "(" + t + ")0";
    const bool fl = is_float(v.ty);
    const Ty at = v.ty == Ty::f64 ? Ty::f64 : fl ? Ty::f32 : Ty::i64;
    if (v.red.combine == "max")
      return fl ? cu_const(-INFINITY, at) : v.ty == Ty::i32 ? "(-2147483647 - 1)" : "(-9223372036854775807LL - 1)";
    return fl ? cu_const(INFINITY, at) : v.ty == Ty::i32 ? "2147483647" : "9223372036854775807LL";
  }
  std::string op_struct(const ValueInfo& v) const {
    return v.red.combine == "sum" ? "KSum" : v.red.combine == "max" ? "KMax" : "KMin";
  }
  std::string combine(const ValueInfo& v, const std::string& acc, const std::string& e) const {
    const std::string t = acc_type(v);
    if (v.red.combine == "sum") return acc + " += (" + t + ")" + e + ";";
    return acc + " = " + op_struct(v) + "()(" + acc + ", (" + t + ")" + e + ");";
  }
  std::string finish(const ValueInfo& v, const std::string& acc) const {
    const std::string t = acc_type(v);
    std::string r = acc;
    if (v.red.scale != 1.0) r = "(" + acc + " * " + cu_const(v.red.scale, t == "float" ? Ty::f32 : Ty::f64) + ")";
    // A bfloat16 result is rounded: a later stage reading the register sees what the buffer holds.
    if (v.ty == Ty::bf16) return "k_round_bf16((float)" + r + ")";
    return "(" + std::string(reg_type(v.ty)) + ")" + r;
  }

  // How many blocks of a cluster share each row (1: a block or warp alone), given that the plan is
  // a block a row: a choice's number, else enough to give every multiprocessor about two blocks'
  // worth of threads while each block keeps at least 4 elements a thread of each pass (at most 8,
  // the portable cluster size). Only where every reduction is a whole row's (one value a row, in
  // every thread's register) and the GPU has clusters (sm_90 on).
  int row_cluster(const std::vector<Stage>& stages, int64_t n_rows, int64_t row_work, int threads,
                  const CudaChoice& choice) const {
    if (o_.compute_capability < 90 || choice.cluster == 1) return 1;
    for (const Stage& st : stages)
      if (st.red && !st.kept_vars.empty()) return 1;
    if (choice.cluster > 1) return std::min(choice.cluster, 8);
    const int64_t slots = static_cast<int64_t>(2048 / threads) * std::max(o_.multiprocessors, 1);
    int c = 1;
    while (c < 8 && n_rows * c * 2 <= slots && row_work / (c * 2) >= 4 * static_cast<int64_t>(threads)) c *= 2;
    return c;
  }

  const LoweredGraph& L_;
  const CudaOptions& o_;
  const bool wide_;
  bool empty_ = false;
  // A row kernel's loop start and step over a row's elements, and the blocks that share a row.
  std::string first_ = "tid", stride_ = "nt";
  int cluster_ = 1;
  int row_threads_ = 1 << 30;  // threads that share a row (nt, times the cluster's blocks)
  ExprPool pool_;
  std::set<int> in_kernel_;
  std::map<int, int> var_level_, level_;
  std::map<int, std::string> names_, regs_;
  const Vectorized* vec_ = nullptr;  // set while a flat kernel's vector loop is emitted
  std::map<int, Ty> bufs_;
  std::set<int> read_, written_;                      // buffers the kernel loads from / stores to
  std::vector<std::vector<CudaAccess>> accesses_{1};  // memory accesses in source order, by alternative loop
  std::vector<int> kvars_;                            // a column kernel's kept-dim variables
  std::vector<int64_t> ksizes_;
  int base_ = 1;
  int max_scalar_ = -1;
  int64_t shared_bytes_ = 0;  // the kernel's own __shared__ arrays
  void shared(const std::string& type, int64_t elements) {
    shared_bytes_ += elements * (type == "double" || type == "long long" || type == "int64_t" ? 8 : 4);
  }
  std::ostringstream body_;
  std::string text_;
};

}  // namespace

namespace {

// The stages of the step after `si` that join a combining kernel (column_finish) of `info`: all of
// that kernel plan when it is pointwise stages of the reduction's shape that read it, and each
// other, only at their own element; else none.
// Columns a thread of a column kernel: what every one of its reductions allows (4 where one
// allows 8 and another 4; 1 when any allows only 1).
int column_width_of(const LoweredGraph& L, const KernelPlan& K) {
  int width = 8;
  for (int v : K.stages) width = std::min(width, Emitter::column_width(L.values[static_cast<size_t>(v)]));
  return width;
}

std::vector<int> absorbed_epilogue(const LoweredGraph& L, const Program& P, size_t si, const ValueInfo& info) {
  if (si + 1 >= P.steps.size() || P.steps[si + 1].kernel < 0) return {};
  const KernelPlan& C = P.kernels.at(static_cast<size_t>(P.steps[si].kernel));
  const KernelPlan& N = P.kernels.at(static_cast<size_t>(P.steps[si + 1].kernel));
  std::set<int> joined(C.stages.begin(), C.stages.end());
  bool joins = !N.column && !N.stages.empty();
  for (int v : N.stages) {
    const ValueInfo& sv = L.values[static_cast<size_t>(v)];
    joins = joins && pointwise_kind(sv) && sv.shape == info.shape && legal_in_kernel(L, v, sv.shape.size(), joined);
    joined.insert(v);
  }
  return joins ? N.stages : std::vector<int>{};
}

}  // namespace

CudaProgram generate_cuda(const LoweredGraph& L, const Program& P, const CudaOptions& options) {
  CudaProgram out;
  std::ostringstream os;
  os << cuda_prelude() << "\n";
  // 64-bit index math when any tensor of the group reaches 2^30 elements.
  bool wide = false;
  for (const auto& v : L.values) wide = wide || v.numel() >= kWideIndex || v.extent() >= kWideIndex;
  int max_scalar = -1;
  int plan_ = -1;
  auto add = [&](Emitter& e, CudaLaunch launch) {
    if (e.empty()) return;
    launch.plan = plan_;
    // What each kernel is, for a reader of the source and of a profile (ncu names the kernel).
    launch.text = "// " + launch.name + ": " + launch.what + "; grid " + std::to_string(launch.grid) + ", block " +
                  std::to_string(launch.block) + "\n" + e.text();
    os << launch.text;
    max_scalar = std::max(max_scalar, e.max_scalar());
    out.steps.push_back(CudaStep{static_cast<int>(out.launches.size()), -1});
    out.launches.push_back(std::move(launch));
  };
  for (size_t si = 0; si < P.steps.size(); ++si) {
    const Step& step = P.steps[si];
    if (step.extern_node >= 0) {
      out.steps.push_back(CudaStep{-1, step.extern_node});
      continue;
    }
    const size_t plan = static_cast<size_t>(step.kernel);
    if (!options.only.empty() && (plan >= options.only.size() || !options.only[plan])) continue;
    const KernelPlan& K = P.kernels.at(plan);
    const CudaChoice choice = plan < options.choice.size() ? options.choice[plan] : CudaChoice{};
    const std::string base = "kiln_k" + std::to_string(step.kernel);
    plan_ = step.kernel;
    bool all_pointwise = !K.column;
    for (int v : K.stages) all_pointwise = all_pointwise && pointwise_kind(L.values[static_cast<size_t>(v)]);
    if (K.column && L.values[static_cast<size_t>(K.stages.at(0))].red.scatter) {
      // A scatter-add: the parts' tables, then their combination in order (which, as a split
      // column reduction's, also runs the pointwise plan after it when that reads it elementwise).
      const ValueInfo& info = L.values[static_cast<size_t>(K.stages.at(0))];
      const int64_t parts = choice.splits >= 1 ? choice.splits : Emitter::scatter_parts(info, options.multiprocessors);
      const int slot =
          static_cast<int>(L.num_inputs + L.num_outputs + L.scratch_bytes.size() + out.extra_scratch_bytes.size());
      out.extra_scratch_bytes.push_back(parts * info.numel() * static_cast<int64_t>(ty_size(Emitter::acc_ty(info))));
      Emitter e(L, options, wide);
      CudaLaunch launch = e.scatter(base + "_0", K, parts, slot);
      add(e, std::move(launch));
      std::vector<int> epilogue;
      if (options.absorb_epilogues) epilogue = absorbed_epilogue(L, P, si, info);
      if (!epilogue.empty()) ++si;
      Emitter f(L, options, wide);
      CudaLaunch finish = f.column_finish(base + "_1", K, parts, slot, epilogue);
      add(f, std::move(finish));
    } else if (K.column) {
      const ValueInfo& info = L.values[static_cast<size_t>(K.stages.at(0))];
      const int width = column_width_of(L, K);
      const int64_t splits =
          choice.splits >= 1 ? choice.splits : Emitter::column_splits(info, options.multiprocessors, width);
      if (splits > 1) {
        // The partial results: a scratch slot of this program's own per stage, after the lowering's.
        std::vector<int> slot;
        for (int v : K.stages) {
          slot.push_back(
              static_cast<int>(L.num_inputs + L.num_outputs + L.scratch_bytes.size() + out.extra_scratch_bytes.size()));
          out.extra_scratch_bytes.push_back(
              splits * prod(stripped(info.shape)) *
              static_cast<int64_t>(ty_size(Emitter::acc_ty(L.values[static_cast<size_t>(v)]))));
        }
        Emitter e(L, options, wide);
        CudaLaunch launch = e.column(base + "_0", K, width, splits, slot);
        add(e, std::move(launch));
        // The next kernel joins the combining one when all of it is pointwise stages of the
        // reduction's shape that read it, and each other, only at their own element.
        std::vector<int> epilogue;
        if (options.absorb_epilogues) epilogue = absorbed_epilogue(L, P, si, info);
        if (!epilogue.empty()) ++si;
        Emitter f(L, options, wide);
        CudaLaunch finish = f.column_finish(base + "_1", K, splits, slot, epilogue);
        add(f, std::move(finish));
      } else {
        Emitter e(L, options, wide);
        CudaLaunch launch = e.column(base, K, width);
        add(e, std::move(launch));
      }
    } else if (!all_pointwise) {
      Emitter e(L, options, wide);
      CudaLaunch launch = e.rows(base, K, choice);
      add(e, std::move(launch));
    } else {
      // Runs of stages of one shape that read each other only at their own index share a loop.
      std::vector<std::vector<int>> runs;
      std::set<int> in_run;
      for (int v : K.stages) {
        const auto& shape = L.values[static_cast<size_t>(v)].shape;
        const bool joins = !runs.empty() && L.values[static_cast<size_t>(runs.back()[0])].shape == shape &&
                           legal_in_kernel(L, v, shape.size(), in_run);
        if (!joins) {
          runs.emplace_back();
          in_run.clear();
        }
        runs.back().push_back(v);
        in_run.insert(v);
      }
      for (size_t r = 0; r < runs.size(); ++r) {
        Emitter e(L, options, wide);
        CudaLaunch launch = e.flat(runs.size() == 1 ? base : base + "_" + std::to_string(r), runs[r], choice);
        add(e, std::move(launch));
      }
    }
  }
  out.scalar_table = max_scalar + 1;
  out.source = os.str();
  out.marked = true;
  if (!options.size_markers) resolve_sizes(out, {});
  return out;
}

namespace {

// `text` with each marked number replaced by what `f` makes of it.
template <class F>
std::string replace_marks(const std::string& text, F&& f) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const size_t open = text.find(kMarkOpen, i);
    if (open == std::string::npos) {
      out.append(text, i, std::string::npos);
      break;
    }
    const size_t close = text.find(kMarkClose, open);
    if (close == std::string::npos) throw std::logic_error("a size marker without its end");
    out.append(text, i, open - i);
    out += f(text.substr(open + 1, close - open - 1));
    i = close + 1;
  }
  return out;
}

std::string without_comment_lines(const std::string& t) {
  std::string out;
  out.reserve(t.size());
  for (size_t i = 0; i < t.size();) {
    size_t end = t.find('\n', i);
    end = end == std::string::npos ? t.size() : end + 1;
    const size_t first = t.find_first_not_of(' ', i);
    if (!(first < end && t.compare(first, 2, "//") == 0)) out.append(t, i, end - i);
    i = end;
  }
  return out;
}

// The C type of a marked number, by how the emitter writes it: 'i' int ("37", "((int)-2)"), 'l'
// long long ("37LL", "(5LL)"), 'u' unsigned ("37u"), 'f' float ("(0x1p-3f)"), 'd' double ("(0x1p-3)").
char literal_type(const std::string& c) {
  if (!c.empty() && c.back() == 'u') return 'u';
  if (c.find("0x") != std::string::npos) return c.size() >= 2 && c.compare(c.size() - 2, 2, "f)") == 0 ? 'f' : 'd';
  if (c.find("LL") != std::string::npos) return 'l';
  return 'i';
}

// The 64 bits kiln_sz holds for a marked number, and the expression that reads slot k as it.
uint64_t literal_bits(const std::string& c, char type) {
  const size_t at = c.find_first_of("-0123456789");
  if (at == std::string::npos) throw std::logic_error("a size marker without a number: " + c);
  const char* p = c.c_str() + at;
  if (type == 'f') {
    const float f = static_cast<float>(std::strtod(p, nullptr));
    uint32_t bits = 0;
    std::memcpy(&bits, &f, sizeof bits);
    return bits;
  }
  if (type == 'd') {
    const double d = std::strtod(p, nullptr);
    uint64_t bits = 0;
    std::memcpy(&bits, &d, sizeof bits);
    return bits;
  }
  return static_cast<uint64_t>(std::strtoll(p, nullptr, 10));
}

std::string table_read(size_t k, char type) {
  const std::string slot = "kiln_sz[" + std::to_string(k) + "]";
  switch (type) {
    case 'u': return "((unsigned)" + slot + ")";
    case 'l': return "((long long)" + slot + ")";
    case 'f': return "__int_as_float((int)" + slot + ")";
    case 'd': return "__longlong_as_double((long long)" + slot + ")";
    default: return "((int)" + slot + ")";
  }
}

}  // namespace

std::string size_skeleton(const CudaProgram& prog) {
  std::string out;
  for (const CudaLaunch& l : prog.launches) {
    out += without_comment_lines(replace_marks(
        l.text, [](const std::string& c) { return std::string(1, kMarkOpen) + literal_type(c) + kMarkClose; }));
    out += "\n";
  }
  return out;
}

std::vector<std::string> size_literals(const CudaProgram& prog) {
  std::vector<std::string> out;
  for (const CudaLaunch& l : prog.launches)
    replace_marks(l.text, [&](const std::string& c) {
      out.push_back(c);
      return std::string();
    });
  return out;
}

size_t resolve_sizes(CudaProgram& prog, const std::vector<bool>& hoist) {
  if (!prog.marked) return 0;
  size_t k = 0;
  std::vector<uint64_t> table;
  for (CudaLaunch& l : prog.launches) {
    l.text = replace_marks(l.text, [&](const std::string& c) {
      const bool h = k < hoist.size() && hoist[k];
      ++k;
      if (!h) return c;
      const char type = literal_type(c);
      table.push_back(literal_bits(c, type));
      return table_read(table.size() - 1, type);
    });
    for (auto& alternative : l.accesses)
      for (CudaAccess& a : alternative) a.index = replace_marks(a.index, [](const std::string& c) { return c; });
  }
  if (!table.empty())
    for (CudaLaunch& l : prog.launches)
      l.text = "// " + l.name + ": sizes from kiln_sz\n" + without_comment_lines(l.text);
  prog.globals =
      table.empty() ? "" : "__constant__ unsigned long long kiln_sz[" + std::to_string(table.size()) + "];\n\n";
  prog.size_table = std::move(table);
  prog.source = std::string(cuda_prelude()) + "\n" + prog.globals;
  for (const CudaLaunch& l : prog.launches) prog.source += l.text;
  prog.marked = false;
  return prog.size_table.size();
}

std::string describe(const CudaChoice& c) {
  std::string r;
  auto add = [&](const std::string& part) { r += (r.empty() ? "" : ", ") + part; };
  if (c.rows_per_block > 1) add("a warp a row, " + std::to_string(c.rows_per_block) + " rows a block");
  if (c.rows_per_block == 1) add("a block a row");
  if (c.threads > 0) add("block " + std::to_string(c.threads));
  if (c.blocks_per_sm > 0) add(std::to_string(c.blocks_per_sm) + " blocks a multiprocessor");
  if (c.blocks_per_sm < 0) add("a thread per element");
  if (c.splits == 1) add("not split");
  if (c.splits > 1) add("in " + std::to_string(c.splits) + " parts");
  if (c.cluster == 1) add("no cluster");
  if (c.cluster > 1) add("a cluster of " + std::to_string(c.cluster) + " blocks a row");
  return r.empty() ? "defaults" : r;
}

std::vector<CudaChoice> cuda_variants(const LoweredGraph& L, const Program& P, size_t kernel,
                                      const CudaOptions& options) {
  const KernelPlan& K = P.kernels.at(kernel);
  std::vector<CudaChoice> out{CudaChoice{}};
  auto add = [&](const CudaChoice& c) {
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  };
  bool all_pointwise = !K.column;
  for (int v : K.stages) all_pointwise = all_pointwise && pointwise_kind(L.values[static_cast<size_t>(v)]);
  if (K.column && L.values[static_cast<size_t>(K.stages.at(0))].red.scatter) {
    // A scatter-add's parts: fewer, longer ones write fewer partial tables; more, shorter ones
    // keep more loads in flight.
    const ValueInfo& info = L.values[static_cast<size_t>(K.stages.at(0))];
    const int64_t p0 = Emitter::scatter_parts(info, options.multiprocessors);
    const int64_t most = std::min<int64_t>(256, std::max<int64_t>(1, prod(info.red.red_shape) / 16));
    for (int64_t parts : {p0 / 2, p0 / 4, std::min(p0 * 2, most)})
      if (parts >= 1 && parts <= most && parts != p0) {
        CudaChoice c;
        c.splits = parts;
        add(c);
      }
  } else if (K.column) {
    const ValueInfo& info = L.values[static_cast<size_t>(K.stages.at(0))];
    const int width = column_width_of(L, K);
    const int64_t s0 = Emitter::column_splits(info, options.multiprocessors, width);
    const int64_t n_red = prod(info.red.red_shape);
    // Parts of at least 32 rows, at most as many as column_splits takes.
    const int64_t most = std::min<int64_t>(Emitter::kMostColumnParts, std::max<int64_t>(1, n_red / 32));
    for (int64_t splits : {int64_t{1}, s0 / 2, s0 * 2, s0 * 4, int64_t{16}})
      if (splits >= 1 && splits <= most && splits != s0) {
        CudaChoice c;
        c.splits = splits;
        add(c);
      }
  } else if (all_pointwise) {
    for (auto [threads, per_sm] : {std::pair{128, 16}, {512, 8}, {1024, 4}, {256, -1}}) {
      CudaChoice c;
      c.threads = threads;
      c.blocks_per_sm = per_sm;
      add(c);
    }
  } else if (K.outer.empty() || prod(K.outer) == 1) {
    for (int threads : {256, 512, 1024}) {
      CudaChoice c;
      c.rows_per_block = K.outer.empty() ? 0 : 1;  // one row: a block of these threads
      c.threads = threads;
      add(c);
    }
  } else {
    for (int rows : {4, 16}) {
      CudaChoice c;
      c.rows_per_block = rows;
      add(c);
    }
    for (int threads : {128, 256, 512, 1024}) {
      CudaChoice c;
      c.rows_per_block = 1;
      c.threads = threads;
      add(c);
    }
    // Long rows shared by the blocks of a cluster (sm_90 on; the generator falls back to a block a
    // row where the plan cannot be split): a few sizes at the default block.
    int64_t row_work = 0;
    for (int v : K.stages) {
      const ValueInfo& info = L.values[static_cast<size_t>(v)];
      const int64_t n = info.numel() * (info.kind == ValueInfo::Kind::Reduction ? prod(info.red.red_shape) : 1);
      row_work = std::max(row_work, n / std::max<int64_t>(prod(K.outer), 1));
    }
    if (options.compute_capability >= 90 && row_work >= 4096)
      for (int cluster : {1, 2, 4, 8}) {
        CudaChoice c;
        c.rows_per_block = 1;
        c.cluster = cluster;
        add(c);
      }
  }
  return out;
}

std::vector<CudaPart> split_program(const CudaProgram& prog, size_t max_bytes) {
  size_t total = 0;
  for (const CudaLaunch& l : prog.launches) total += l.text.size();
  if (total <= max_bytes || prog.launches.size() < 2) {
    CudaPart whole{prog.source, {}};
    for (size_t i = 0; i < prog.launches.size(); ++i) whole.launches.push_back(static_cast<int>(i));
    return {whole};
  }
  // Parts of about equal size, in launch order.
  const size_t parts = (total + max_bytes - 1) / max_bytes, each = (total + parts - 1) / parts;
  std::vector<CudaPart> out;
  size_t in_part = 0;
  for (size_t i = 0; i < prog.launches.size(); ++i) {
    if (out.empty() || (in_part >= each && out.size() < parts)) {
      out.push_back(CudaPart{std::string(cuda_prelude()) + "\n" + prog.globals, {}});
      in_part = 0;
    }
    out.back().source += prog.launches[i].text;
    out.back().launches.push_back(static_cast<int>(i));
    in_part += prog.launches[i].text.size();
  }
  return out;
}

namespace {

// Whether `l`'s text is a plain KILN_KERNEL of its block size and name (what as_body rewrites).
bool has_plain_head(const CudaLaunch& l) {
  const size_t at = l.text.find("KILN_KERNEL(" + std::to_string(l.block) + ") " + l.name + "(");
  return at != std::string::npos && l.text.find(") {\n", at) != std::string::npos;
}

// Kernel `l`'s text as a __device__ function `<name>_body` that takes its block index and grid
// size after its parameters; "" when it is not a plain KILN_KERNEL.
std::string as_body(const CudaLaunch& l) {
  const std::string head = "KILN_KERNEL(" + std::to_string(l.block) + ") " + l.name + "(";
  std::string t = l.text;
  const size_t at = t.find(head);
  if (at == std::string::npos) return "";
  t.replace(at, head.size(), "__device__ __forceinline__ void " + l.name + "_body(");
  const size_t close = t.find(") {\n", at);
  if (close == std::string::npos) return "";
  t.insert(close, ", const unsigned kiln_bx, const unsigned kiln_gx");
  for (const auto& [from, to] :
       {std::pair<std::string, std::string>{"blockIdx.x", "kiln_bx"}, {"gridDim.x", "kiln_gx"}})
    for (size_t p = t.find(from, close); p != std::string::npos; p = t.find(from, p + to.size()))
      t.replace(p, from.size(), to);
  return t;
}

bool meets(const std::set<int>& a, const std::set<int>& b) {
  const std::set<int>& small = a.size() <= b.size() ? a : b;
  const std::set<int>& large = a.size() <= b.size() ? b : a;
  for (int x : small)
    if (large.count(x)) return true;
  return false;
}

// One fused launch: the members (launch indices, latest in the step first) and what the steps
// between its place and the step being looked at (its members included) read and write.
struct FuseGroup {
  std::vector<int> members;
  std::set<int> reads, writes;
  std::set<int> slots;
  bool scalars = false;
  int64_t shared = 0;
  unsigned block = 0;
};

CudaLaunch fused_launch(const CudaProgram& prog, const std::vector<int>& members, int number) {
  CudaLaunch m;
  m.name = "kiln_h" + std::to_string(number);
  m.block = prog.launches[static_cast<size_t>(members[0])].block;
  std::string bodies, names, dispatch;
  std::map<int, std::string> decl;
  unsigned grid = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    const CudaLaunch& l = prog.launches[static_cast<size_t>(members[i])];
    if (m.plan < 0) m.plan = l.plan;
    bodies += as_body(l);
    names += (i ? ", " : "") + l.name.substr(5);
    std::string args;
    for (size_t p = 0; p < l.buffers.size(); ++p) {
      const int b = l.buffers[p];
      if (!decl.count(b)) {
        // Without __restrict__ here: the bodies keep their own qualifiers.
        std::string d = l.params.at(p);
        if (const size_t r = d.find(" __restrict__"); r != std::string::npos) d.erase(r, 13);
        decl[b] = d;
        m.buffers.push_back(b);
        m.params.push_back(d);
      }
      args += "b" + std::to_string(b) + ", ";
    }
    if (l.scalars) args += "P, ";
    m.scalars = m.scalars || l.scalars;
    m.reads.insert(l.reads.begin(), l.reads.end());
    m.writes.insert(l.writes.begin(), l.writes.end());
    m.shared_bytes += l.shared_bytes;
    const bool last = i + 1 == members.size();
    // A member's grid follows its sizes: marked as they are.
    const std::string g = prog.marked ? marked(std::to_string(l.grid) + "u") : std::to_string(l.grid) + "u";
    dispatch += "  if (" + std::string(last ? "true" : "kiln_b < " + g) + ") {\n    " + l.name + "_body(" + args +
                "kiln_b, " + g + ");\n    return;\n  }\n";
    if (!last) dispatch += "  kiln_b -= " + g + ";\n";
    grid += l.grid;
  }
  m.grid = grid;
  m.what = "fused " + std::to_string(members.size()) + " launches (" + names + ")";
  std::string sig;
  for (const std::string& d : m.params) sig += (sig.empty() ? "" : ", ") + d;
  if (m.scalars) sig += (sig.empty() ? "" : ", ") + std::string("const double* __restrict__ P");
  m.text = "// " + m.name + ": " + m.what + "; grid " + std::to_string(m.grid) + ", block " + std::to_string(m.block) +
           "\n" + bodies + "KILN_KERNEL(" + std::to_string(m.block) + ") " + m.name + "(" + sig +
           ") {\n  unsigned kiln_b = blockIdx.x;\n" + dispatch + "}\n\n";
  return m;
}

}  // namespace

int fuse_small_launches(CudaProgram& prog, const std::vector<std::set<int>>& extern_touches,
                        const std::map<int, int>& same_memory, const FuseLimits& limits) {
  auto canon = [&](const std::set<int>& s) {
    std::set<int> out;
    for (int b : s) {
      const auto it = same_memory.find(b);
      out.insert(it == same_memory.end() ? b : it->second);
    }
    return out;
  };
  auto small = [&](const CudaLaunch& l) {
    return l.cluster <= 1 && static_cast<int64_t>(l.grid) * l.block <= int64_t{1024} * limits.multiprocessors &&
           l.params.size() == l.buffers.size() && has_plain_head(l);
  };
  // From the last step to the first: a small launch joins the latest group (in step order) it can
  // move down to, or opens one where it stands.
  std::vector<FuseGroup> groups;
  std::vector<int> open;  // groups a launch may still join, the latest in the step first
  struct Placed {
    CudaStep step;
    int group = -1;  // the step is group `group`'s place
  };
  std::vector<Placed> placed;  // in reverse step order
  for (size_t k = prog.steps.size(); k-- > 0;) {
    const CudaStep& st = prog.steps[k];
    if (st.launch < 0) {
      if (k >= extern_touches.size() || extern_touches[k].count(-1)) {
        open.clear();
      } else {
        const std::set<int> t = canon(extern_touches[k]);
        for (int g : open) {
          groups[static_cast<size_t>(g)].reads.insert(t.begin(), t.end());
          groups[static_cast<size_t>(g)].writes.insert(t.begin(), t.end());
        }
      }
      placed.push_back({st, -1});
      continue;
    }
    const CudaLaunch& l = prog.launches[static_cast<size_t>(st.launch)];
    const std::set<int> R = canon(l.reads), W = canon(l.writes);
    const bool candidate = small(l);
    size_t joined = open.size();
    for (size_t o = 0; candidate && o < open.size(); ++o) {
      const FuseGroup& g = groups[static_cast<size_t>(open[o])];
      if (g.block != l.block || g.shared + l.shared_bytes > limits.max_shared) continue;
      size_t params = g.slots.size() + ((g.scalars || l.scalars) ? 1 : 0);
      for (int b : l.buffers) params += g.slots.count(b) ? 0 : 1;
      if (params > limits.max_params) continue;
      if (meets(R, g.writes) || meets(W, g.reads) || meets(W, g.writes)) continue;
      joined = o;
      break;
    }
    // What now stands after the groups it passes (or, not moving, after every open group).
    const size_t passes = joined < open.size() ? joined + 1 : open.size();
    for (size_t o = 0; o < passes; ++o) {
      FuseGroup& g = groups[static_cast<size_t>(open[o])];
      g.reads.insert(R.begin(), R.end());
      g.writes.insert(W.begin(), W.end());
    }
    if (joined < open.size()) {
      FuseGroup& g = groups[static_cast<size_t>(open[joined])];
      g.members.push_back(st.launch);
      g.slots.insert(l.buffers.begin(), l.buffers.end());
      g.scalars = g.scalars || l.scalars;
      g.shared += l.shared_bytes;
      continue;
    }
    placed.push_back({st, -1});
    if (candidate) {
      FuseGroup g;
      g.members = {st.launch};
      g.reads = R;
      g.writes = W;
      g.slots.insert(l.buffers.begin(), l.buffers.end());
      g.scalars = l.scalars;
      g.shared = l.shared_bytes;
      g.block = l.block;
      placed.back().group = static_cast<int>(groups.size());
      open.push_back(static_cast<int>(groups.size()));
      groups.push_back(std::move(g));
    }
  }
  CudaProgram out;
  out.scalar_table = prog.scalar_table;
  out.extra_scratch_bytes = prog.extra_scratch_bytes;
  out.marked = prog.marked;
  out.globals = prog.globals;
  out.size_table = prog.size_table;
  out.source = std::string(cuda_prelude()) + "\n" + prog.globals;
  int fused = 0, saved = 0;
  for (auto it = placed.rbegin(); it != placed.rend(); ++it) {
    CudaStep st = it->step;
    if (st.launch >= 0) {
      const bool several = it->group >= 0 && groups[static_cast<size_t>(it->group)].members.size() > 1;
      if (several) {
        std::vector<int> members = groups[static_cast<size_t>(it->group)].members;
        std::reverse(members.begin(), members.end());  // in step order
        out.launches.push_back(fused_launch(prog, members, fused++));
        saved += static_cast<int>(members.size()) - 1;
      } else {
        out.launches.push_back(prog.launches[static_cast<size_t>(st.launch)]);
      }
      out.source += out.launches.back().text;
      st.launch = static_cast<int>(out.launches.size()) - 1;
    }
    out.steps.push_back(st);
  }
  prog = std::move(out);
  return saved;
}

std::vector<int64_t> inplace_outputs(const CudaProgram& prog, size_t num_inputs, const std::vector<int64_t>& wanted,
                                     const std::vector<std::set<int>>& extern_reads) {
  std::vector<int64_t> ok(wanted.size(), -1);
  for (size_t k = 0; k < wanted.size(); ++k) {
    if (wanted[k] < 0) continue;
    const int in = static_cast<int>(wanted[k]), out = static_cast<int>(num_inputs + k);
    // The one launch that writes the output, by step.
    int writer = -1;
    bool single = true;
    for (size_t s = 0; s < prog.steps.size(); ++s) {
      const int l = prog.steps[s].launch;
      if (l < 0 || !prog.launches[static_cast<size_t>(l)].writes.count(out)) continue;
      single = single && writer < 0;
      writer = static_cast<int>(s);
    }
    if (writer < 0 || !single) continue;
    const CudaLaunch& w = prog.launches[static_cast<size_t>(prog.steps[static_cast<size_t>(writer)].launch)];
    if (!w.flat || w.writes.count(in)) continue;
    bool safe = true;
    for (size_t s = static_cast<size_t>(writer) + 1; s < prog.steps.size() && safe; ++s) {
      const int l = prog.steps[s].launch;
      if (l < 0) {
        safe = s < extern_reads.size() && !extern_reads[s].count(in) && !extern_reads[s].count(-1);
        continue;
      }
      safe = !prog.launches[static_cast<size_t>(l)].reads.count(in) &&
             !prog.launches[static_cast<size_t>(l)].writes.count(in);
    }
    // In each loop of the writer: one store of the output, and every load of the input before it,
    // at the same element.
    for (const auto& loop : w.accesses) {
      if (!safe) break;
      const std::string* at = nullptr;
      for (const CudaAccess& a : loop)
        if (a.store && a.buffer == out) {
          safe = safe && !at;
          at = &a.index;
        }
      bool stored = false;
      for (const CudaAccess& a : loop) {
        if (a.store && a.buffer == out) stored = true;
        if (!a.store && a.buffer == in) safe = safe && !stored && at && a.index == *at;
      }
    }
    if (safe) ok[k] = wanted[k];
  }
  return ok;
}

}  // namespace kiln::inductor
