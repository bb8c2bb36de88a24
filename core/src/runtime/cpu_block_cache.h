// A caching allocator for the CPU memory kiln's executors allocate every step (group outputs, blocks
// plugins ask the host for). Training steps allocate the same sizes every step; through the system
// allocator, blocks of a few hundred KiB and up are mmapped and unmapped each time (glibc returns
// them to the OS), and every page of them faults again on first touch: on the 2-core CI machine that
// was 845 faults per mlp step and made inductor's fused SGD update 1.9 ms instead of 0.11 ms.
//
// Freed blocks are kept by size and reused for requests of the same size up to twice as large.
// At most [runtime] cpu_block_cache_max_mb (default 2048) MiB of free blocks are kept; beyond
// that, freed blocks go back to the system. Thread-safe. LibTorch's own eager ops keep LibTorch's allocator.
#pragma once

#include <cstddef>

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

namespace kiln {

class CpuBlockCache final : public c10::Allocator {
 public:
  static CpuBlockCache& get();

  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  size_t cached_bytes() const;              // free blocks held
  size_t hits() const;                      // allocations served from the cache
  void release();                           // frees every cached block
  void set_limit(size_t max_cached_bytes);  // the most free memory kept for reuse

  CpuBlockCache(const CpuBlockCache&) = delete;
  CpuBlockCache& operator=(const CpuBlockCache&) = delete;

 private:
  CpuBlockCache();
  ~CpuBlockCache() override;
  struct Impl;
  Impl* impl_;
  static void free_block(void* ctx);
};

// While alive, LibTorch's CPU allocator is CpuBlockCache (when the CPU allocator in place is
// LibTorch's own at priority 0; a user's higher-priority allocator is left alone), so that ATen
// ops run inside kiln's compiled step (eager nodes, extern calls) reuse blocks too. Process-wide:
// other threads allocating meanwhile get cached blocks, which is harmless (each block goes back to
// the cache, or to the system beyond the cap, when its tensor dies). The compiled step makes one
// unless [runtime] cpu_block_cache is off (then empty_strided_step uses LibTorch's allocator too).
class ScopedCpuBlockCache {
 public:
  explicit ScopedCpuBlockCache(size_t max_cached_bytes = size_t{2048} << 20);
  ~ScopedCpuBlockCache();
  ScopedCpuBlockCache(const ScopedCpuBlockCache&) = delete;
  ScopedCpuBlockCache& operator=(const ScopedCpuBlockCache&) = delete;

 private:
  c10::Allocator* prev_ = nullptr;
};

// Whether a ScopedCpuBlockCache is alive on this thread.
bool cpu_block_cache_enabled();

// at::empty_strided for kiln's step values: CPU tensors come from CpuBlockCache, others from
// LibTorch's allocator for their device.
at::Tensor empty_strided_step(c10::IntArrayRef sizes, c10::IntArrayRef strides, const at::TensorOptions& options);

}  // namespace kiln
