// A CUDA device emulated on the host, for testing the inductor's generated CUDA sources where there
// is no GPU: included before a whole generated source (the real CUDA prelude and the kernels),
// compiled by the host compiler into a shared library, which exports
//   extern "C" const char* kiln_emu_launch(void* kernel, int nargs, void** args, unsigned grid, unsigned block,
//                                          unsigned cluster);
// (the kernel's parameters are all pointers; NULL on success, else what went wrong).
//
// Blocks (clusters of blocks) run one after another; the threads of a block are fibers (ucontext)
// on one OS thread, switched only at barriers (__syncthreads, __syncwarp, the two halves of a warp
// shuffle, the cluster barrier). Between barriers the threads run in reverse order, the last thread
// first: code that reads what another thread (thread 0, say) writes before a barrier that is
// missing reads stale memory and gives wrong results. A barrier that not every live thread of its
// block (or warp, or cluster) reaches is a deadlock, reported as an error instead of a hang.
// Shared memory is the `static` storage of the kernel's (and the prelude's) __shared__ variables,
// valid because blocks never overlap: the blocks of a cluster take turns, each running until all
// its threads wait at the cluster barrier, so a block's shared memory is its own between cluster
// barriers; what crosses them (k_cluster_reduce's values) is kept per block by the emulator.
//
// What it does not model: memory races between blocks, warp-synchronous code without barriers
// (the generated code has none), timing, and the GPU's math library (libm stands in, within ulps).
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <ucontext.h>

#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static
// A module's __constant__ table (kiln_sz) is a global of the emulated library: the test writes it
// through dlsym, as the plugin does through cuModuleGetGlobal.
#define __constant__
#define __cluster_dims__(x, y, z)
#define KILN_EMULATED_CLUSTERS 1

namespace kiln_emu {

struct Dim3 {
  unsigned x, y, z;
};

struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  int state = 0;  // 0 runnable, 1 at __syncthreads, 2 at a warp barrier, 3 done, 4 at the cluster barrier
};

struct Device {
  std::vector<Fiber> fibers;  // the cluster's threads, block by block
  ucontext_t scheduler;
  unsigned current = 0, block = 0, block_dim = 0, grid_dim = 0, cluster = 1;  // block: the cluster's first
  std::vector<unsigned long long> exchange;                                   // a lane's shuffle value, by thread
  std::vector<unsigned long long> slot;  // a block's k_cluster_reduce value, by rank
  void* kernel = nullptr;
  int nargs = 0;
  void** args = nullptr;
  const char* error = nullptr;
};

inline Device& dev() {
  static Device d;
  return d;
}

inline void wait(int kind) {
  Device& d = dev();
  Fiber& f = d.fibers[d.current];
  f.state = kind;
  swapcontext(&f.ctx, &d.scheduler);
}

template <size_t... I>
void call_with(void* fn, void** a, std::index_sequence<I...>) {
  using F = void (*)(decltype((void)I, static_cast<void*>(nullptr))...);
  reinterpret_cast<F>(fn)(a[I]...);
}

template <size_t N>
void call_n(void* fn, void** a) {
  call_with(fn, a, std::make_index_sequence<N>{});
}

template <size_t... N>
bool call_any(void* fn, int n, void** a, std::index_sequence<N...>) {
  bool done = false;
  ((n == static_cast<int>(N) ? (call_n<N>(fn, a), done = true) : false), ...);
  return done;
}

inline void fiber_main() {
  Device& d = dev();
  if (!call_any(d.kernel, d.nargs, d.args, std::make_index_sequence<48>{})) d.error = "more than 47 kernel arguments";
  d.fibers[d.current].state = 3;
  swapcontext(&d.fibers[d.current].ctx, &d.scheduler);
}

inline Dim3 thread_idx() { return Dim3{dev().current % dev().block_dim, 0, 0}; }
inline Dim3 block_idx() { return Dim3{dev().block + dev().current / dev().block_dim, 0, 0}; }
inline Dim3 block_dim() { return Dim3{dev().block_dim, 1, 1}; }
inline Dim3 grid_dim() { return Dim3{dev().grid_dim, 1, 1}; }

}  // namespace kiln_emu

#define threadIdx (kiln_emu::thread_idx())
#define blockIdx (kiln_emu::block_idx())
#define blockDim (kiln_emu::block_dim())
#define gridDim (kiln_emu::grid_dim())

inline void __syncthreads() { kiln_emu::wait(1); }
inline void __syncwarp(unsigned = 0xffffffffu) { kiln_emu::wait(2); }

inline unsigned k_cluster_rank() { return kiln_emu::dev().current / kiln_emu::dev().block_dim; }
inline void k_cluster_sync() { kiln_emu::wait(4); }
template <class Op, int C, class T>
T k_cluster_reduce(T v) {
  static_assert(sizeof(T) <= 8, "a cluster reduction of a wide type");
  kiln_emu::Device& d = kiln_emu::dev();
  if (static_cast<unsigned>(C) != d.cluster) d.error = "k_cluster_reduce's cluster size is not the launch's";
  if (threadIdx.x == 0) memcpy(&d.slot[k_cluster_rank()], &v, sizeof(T));
  kiln_emu::wait(4);
  T r, q;
  memcpy(&r, &d.slot[0], sizeof(T));
  for (unsigned k = 1; k < d.cluster; ++k) {
    memcpy(&q, &d.slot[k], sizeof(T));
    r = Op()(r, q);
  }
  kiln_emu::wait(4);
  return r;
}

template <class T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  static_assert(sizeof(T) <= 8, "shuffle of a wide type");
  kiln_emu::Device& d = kiln_emu::dev();
  const unsigned me = d.current, partner = (me & ~31u) | ((me & 31u) ^ static_cast<unsigned>(lane_mask));
  unsigned long long bits = 0;
  memcpy(&bits, &v, sizeof(T));
  d.exchange[me] = bits;
  kiln_emu::wait(2);
  T r;
  bits = d.exchange[partner];
  memcpy(&r, &bits, sizeof(T));
  kiln_emu::wait(2);
  return r;
}

inline float __int_as_float(int i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}
inline float __uint_as_float(unsigned i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned i;
  memcpy(&i, &f, 4);
  return i;
}
inline double __longlong_as_double(long long i) {
  double f;
  memcpy(&f, &i, 8);
  return f;
}
inline float normcdff(float x) { return 0.5f * erfcf(-x * 0.70710678118654752f); }
inline double normcdf(double x) { return 0.5 * erfc(-x * 0.70710678118654752); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }

namespace kiln_emu {

// Runs block `b` of the cluster until each of its threads is done or waits at the cluster barrier.
inline const char* run_block(unsigned b) {
  Device& d = dev();
  const unsigned first = b * d.block_dim, end = first + d.block_dim;
  for (;;) {
    for (unsigned t = end; t-- > first;) {  // the last thread first
      if (d.fibers[t].state != 0) continue;
      d.current = t;
      swapcontext(&d.scheduler, &d.fibers[t].ctx);
      if (d.error) return d.error;
    }
    // Every live thread is at a barrier. Release each warp whose live lanes all wait at a warp
    // barrier, or the whole block when every live thread waits at __syncthreads.
    bool live = false, released = false, all_block = true, all_cluster = true;
    for (unsigned t = first; t < end; ++t) {
      const int s = d.fibers[t].state;
      live = live || s != 3;
      all_block = all_block && (s == 1 || s == 3);
      all_cluster = all_cluster && (s == 4 || s == 3);
    }
    if (!live || all_cluster) return nullptr;
    if (all_block) {
      for (unsigned t = first; t < end; ++t)
        if (d.fibers[t].state == 1) d.fibers[t].state = 0;
      continue;
    }
    for (unsigned w = first / 32; w < end / 32; ++w) {
      bool all_warp = true, any = false;
      for (unsigned l = 0; l < 32; ++l) {
        const int s = d.fibers[w * 32 + l].state;
        all_warp = all_warp && (s == 2 || s == 3);
        any = any || s == 2;
      }
      if (all_warp && any) {
        for (unsigned l = 0; l < 32; ++l)
          if (d.fibers[w * 32 + l].state == 2) d.fibers[w * 32 + l].state = 0;
        released = true;
      }
    }
    if (!released) return "deadlock: threads of a block wait at different barriers (a divergent barrier)";
  }
}

}  // namespace kiln_emu

extern "C" __attribute__((visibility("default"))) const char* kiln_emu_launch(void* kernel, int nargs, void** args,
                                                                              unsigned grid, unsigned block,
                                                                              unsigned cluster) {
  kiln_emu::Device& d = kiln_emu::dev();
  if (block == 0 || block > 1024 || block % 32 != 0) return "block size not a multiple of 32 in [32, 1024]";
  if (grid == 0) return "an empty grid";
  if (cluster == 0 || cluster > 8 || grid % cluster != 0) return "a cluster size over 8 or not dividing the grid";
  d.kernel = kernel, d.nargs = nargs, d.args = args, d.error = nullptr;
  d.block_dim = block, d.grid_dim = grid, d.cluster = cluster;
  const unsigned threads = block * cluster;
  d.fibers.resize(threads);
  d.exchange.assign(threads, 0);
  d.slot.assign(cluster, 0);
  for (auto& f : d.fibers)
    if (f.stack.size() != 64 * 1024) f.stack.assign(64 * 1024, 0);
  for (unsigned c = 0; c < grid; c += cluster) {
    d.block = c;
    for (unsigned t = 0; t < threads; ++t) {
      kiln_emu::Fiber& f = d.fibers[t];
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack.data();
      f.ctx.uc_stack.ss_size = f.stack.size();
      f.ctx.uc_link = nullptr;
      makecontext(&f.ctx, kiln_emu::fiber_main, 0);
      f.state = 0;
    }
    for (;;) {
      for (unsigned b = 0; b < cluster; ++b)
        if (const char* e = kiln_emu::run_block(b)) return e;
      // Every block is done or waits at the cluster barrier: release it when all live threads do.
      bool live = false;
      for (auto& f : d.fibers) live = live || f.state != 3;
      if (!live) break;
      for (auto& f : d.fibers)
        if (f.state == 4) f.state = 0;
    }
  }
  return nullptr;
}
