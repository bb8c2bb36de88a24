// A CUDA device emulated on the host, for testing the inductor's generated CUDA sources where there
// is no GPU: included before a whole generated source (the real CUDA prelude and the kernels),
// compiled by the host compiler into a shared library, which exports
//   extern "C" const char* kiln_emu_launch(void* kernel, int nargs, void** args, unsigned grid, unsigned block);
// (the kernel's parameters are all pointers; NULL on success, else what went wrong).
//
// Blocks run one after another; the threads of a block are fibers (ucontext) on one OS thread,
// switched only at barriers (__syncthreads, __syncwarp, the two halves of a warp shuffle). Between
// barriers the threads run in reverse order, the last thread first: code that reads what another
// thread (thread 0, say) writes before a barrier that is missing reads stale memory and gives
// wrong results. A barrier that not every live thread of its block (or warp) reaches is a deadlock,
// reported as an error instead of a hang. Shared memory is the `static` storage of the kernel's
// (and the prelude's) __shared__ variables, valid because blocks never overlap.
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

namespace kiln_emu {

struct Dim3 {
  unsigned x, y, z;
};

struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  int state = 0;  // 0 runnable, 1 at __syncthreads, 2 at a warp barrier, 3 done
};

struct Device {
  std::vector<Fiber> fibers;
  ucontext_t scheduler;
  unsigned current = 0, block = 0, block_dim = 0, grid_dim = 0;
  std::vector<unsigned long long> exchange;  // a lane's shuffle value, by thread
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

inline Dim3 thread_idx() { return Dim3{dev().current, 0, 0}; }
inline Dim3 block_idx() { return Dim3{dev().block, 0, 0}; }
inline Dim3 block_dim() { return Dim3{dev().block_dim, 1, 1}; }
inline Dim3 grid_dim() { return Dim3{dev().grid_dim, 1, 1}; }

}  // namespace kiln_emu

#define threadIdx (kiln_emu::thread_idx())
#define blockIdx (kiln_emu::block_idx())
#define blockDim (kiln_emu::block_dim())
#define gridDim (kiln_emu::grid_dim())

inline void __syncthreads() { kiln_emu::wait(1); }
inline void __syncwarp(unsigned = 0xffffffffu) { kiln_emu::wait(2); }

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

extern "C" __attribute__((visibility("default"))) const char* kiln_emu_launch(void* kernel, int nargs, void** args,
                                                                              unsigned grid, unsigned block) {
  kiln_emu::Device& d = kiln_emu::dev();
  if (block == 0 || block > 1024 || block % 32 != 0) return "block size not a multiple of 32 in [32, 1024]";
  if (grid == 0) return "an empty grid";
  d.kernel = kernel, d.nargs = nargs, d.args = args, d.error = nullptr;
  d.block_dim = block, d.grid_dim = grid;
  d.fibers.resize(block);
  d.exchange.assign(block, 0);
  for (auto& f : d.fibers)
    if (f.stack.size() != 64 * 1024) f.stack.assign(64 * 1024, 0);
  for (unsigned b = 0; b < grid; ++b) {
    d.block = b;
    for (unsigned t = 0; t < block; ++t) {
      kiln_emu::Fiber& f = d.fibers[t];
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack.data();
      f.ctx.uc_stack.ss_size = f.stack.size();
      f.ctx.uc_link = nullptr;
      makecontext(&f.ctx, kiln_emu::fiber_main, 0);
      f.state = 0;
    }
    for (;;) {
      for (unsigned t = block; t-- > 0;) {  // the last thread first
        if (d.fibers[t].state != 0) continue;
        d.current = t;
        swapcontext(&d.scheduler, &d.fibers[t].ctx);
        if (d.error) return d.error;
      }
      // Every live thread is at a barrier. Release each warp whose live lanes all wait at a warp
      // barrier, or the whole block when every live thread waits at __syncthreads.
      bool live = false, released = false, all_block = true;
      for (unsigned t = 0; t < block; ++t) {
        const int s = d.fibers[t].state;
        live = live || s != 3;
        all_block = all_block && (s == 1 || s == 3);
      }
      if (!live) break;
      if (all_block) {
        for (auto& f : d.fibers)
          if (f.state == 1) f.state = 0;
        continue;
      }
      for (unsigned w = 0; w < block / 32; ++w) {
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
  return nullptr;
}
