// See cpu_block_cache.h.
#include "cpu_block_cache.h"

#include "kiln/memory.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

namespace kiln {

namespace {
constexpr size_t kAlign = 64;  // as LibTorch's CPU allocator (MKL, oneDNN and vector code want it)

size_t round_up(size_t n) {
  if (n == 0) n = 1;
  if (n < (size_t{1} << 20)) return (n + kAlign - 1) / kAlign * kAlign;
  return (n + 4095) / 4096 * 4096;  // whole pages from 1 MiB up
}

// How many ScopedCpuBlockCache are alive on this thread: kiln's step values come from the cache
// only inside a compiled step that turned it on.
thread_local int active_scopes = 0;

// What kiln's CPU allocators have handed out and not yet taken back (bytes asked for), and its peak.
std::atomic<int64_t> g_allocated{0};
std::atomic<int64_t> g_peak{0};

void count_allocation(size_t n) {
  const int64_t now =
      g_allocated.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed) + static_cast<int64_t>(n);
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
void count_release(size_t n) { g_allocated.fetch_sub(static_cast<int64_t>(n), std::memory_order_relaxed); }

// LibTorch's CPU allocation (c10::alloc_cpu: aligned, as its default allocator), counted. The
// context of each DataPtr is the memory itself, as Allocator::raw_allocate requires; the size is kept
// beside it so that the release is counted. Never destroyed, for the same reason as CpuBlockCache.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  static CountingCpuAllocator& get() {
    static auto* a = new CountingCpuAllocator();
    return *a;
  }
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = c10::alloc_cpu(nbytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      sizes_[p] = nbytes;
    }
    count_allocation(nbytes);
    return c10::DataPtr(p, p, &CountingCpuAllocator::release, c10::Device(c10::kCPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &CountingCpuAllocator::release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

 private:
  static void release(void* p) {
    if (!p) return;
    auto& self = get();
    size_t n = 0;
    {
      std::lock_guard<std::mutex> lock(self.mu_);
      auto it = self.sizes_.find(p);
      if (it != self.sizes_.end()) {
        n = it->second;
        self.sizes_.erase(it);
      }
    }
    count_release(n);
    c10::free_cpu(p);
  }
  std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
};
}  // namespace

struct CpuBlockCache::Impl {
  mutable std::mutex mu;
  std::multimap<size_t, void*> free_by_size;  // free blocks
  struct Live {
    size_t block;  // the block's size
    size_t asked;  // what the allocation asked for (what the accounting counts)
  };
  std::unordered_map<void*, Live> live;  // blocks handed out
  size_t cached = 0;
  size_t limit = size_t{2048} << 20;
  size_t hits = 0;
};

CpuBlockCache& CpuBlockCache::get() {
  // Never destroyed: tensors holding blocks may die after static destructors have run.
  static CpuBlockCache* cache = new CpuBlockCache();
  return *cache;
}

CpuBlockCache::CpuBlockCache() : impl_(new Impl) {}
CpuBlockCache::~CpuBlockCache() {
  release();
  delete impl_;
}

// The context of each DataPtr is the block itself (Allocator::raw_allocate, which some ATen kernels
// use, requires it), so the deleter finds the block's size in `live`.
c10::DataPtr CpuBlockCache::allocate(size_t nbytes) {
  const size_t size = round_up(nbytes);
  void* p = nullptr;
  size_t got = size;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->free_by_size.lower_bound(size);
    if (it != impl_->free_by_size.end() && it->first <= 2 * size) {
      p = it->second;
      got = it->first;
      impl_->cached -= got;
      impl_->free_by_size.erase(it);
      ++impl_->hits;
      impl_->live.emplace(p, Impl::Live{got, nbytes});
    }
  }
  if (!p) {
    p = std::aligned_alloc(kAlign, size);
    if (!p) throw std::bad_alloc();
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->live.emplace(p, Impl::Live{got, nbytes});
  }
  count_allocation(nbytes);
  return c10::DataPtr(p, p, &CpuBlockCache::free_block, c10::Device(c10::kCPU));
}

c10::DeleterFnPtr CpuBlockCache::raw_deleter() const { return &CpuBlockCache::free_block; }

void CpuBlockCache::free_block(void* ptr) {
  if (!ptr) return;
  Impl& impl = *get().impl_;
  {
    std::lock_guard<std::mutex> lock(impl.mu);
    auto it = impl.live.find(ptr);
    if (it == impl.live.end()) return;  // not ours (cannot happen: only our DataPtrs name this deleter)
    const size_t size = it->second.block;
    count_release(it->second.asked);
    impl.live.erase(it);
    if (impl.cached + size <= impl.limit) {
      impl.free_by_size.emplace(size, ptr);
      impl.cached += size;
      return;
    }
  }
  std::free(ptr);
}

void CpuBlockCache::copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }

size_t CpuBlockCache::cached_bytes() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->cached;
}

size_t CpuBlockCache::hits() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->hits;
}

void CpuBlockCache::release() {
  std::multimap<size_t, void*> blocks;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    blocks.swap(impl_->free_by_size);
    impl_->cached = 0;
  }
  for (auto& [size, p] : blocks) std::free(p);
}

bool cpu_block_cache_enabled() { return active_scopes > 0; }

void CpuBlockCache::set_limit(size_t max_cached_bytes) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->limit = max_cached_bytes;
}

ScopedCpuBlockCache::ScopedCpuBlockCache(size_t max_cached_bytes) {
  ++active_scopes;
  CpuBlockCache::get().set_limit(max_cached_bytes);
  c10::Allocator* current = c10::GetCPUAllocator();
  // A user's allocator, or already ours, stays; LibTorch's own (counted or not) gives way.
  if (current != c10::GetDefaultCPUAllocator() && current != &CountingCpuAllocator::get()) return;
  c10::SetCPUAllocator(&CpuBlockCache::get(), /*priority=*/0);
  if (c10::GetCPUAllocator() == &CpuBlockCache::get()) prev_ = current;
}

ScopedCpuBlockCache::~ScopedCpuBlockCache() {
  --active_scopes;
  if (prev_) c10::SetCPUAllocator(prev_, /*priority=*/0);
}

int64_t cpu_allocated_bytes() { return g_allocated.load(std::memory_order_relaxed); }
int64_t cpu_peak_allocated_bytes() { return g_peak.load(std::memory_order_relaxed); }
void cpu_reset_peak_allocated() {
  g_peak.store(g_allocated.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

ScopedCpuMemoryMeter::ScopedCpuMemoryMeter() {
  c10::Allocator* current = c10::GetCPUAllocator();
  if (current != c10::GetDefaultCPUAllocator()) return;  // a user's allocator, or a meter already
  c10::SetCPUAllocator(&CountingCpuAllocator::get(), /*priority=*/0);
  if (c10::GetCPUAllocator() == &CountingCpuAllocator::get()) prev_ = current;
}

ScopedCpuMemoryMeter::~ScopedCpuMemoryMeter() {
  if (prev_) c10::SetCPUAllocator(prev_, /*priority=*/0);
}

at::Tensor empty_strided_step(c10::IntArrayRef sizes, c10::IntArrayRef strides, const at::TensorOptions& options) {
  if (options.device().is_cpu() && !options.pinned_memory() && cpu_block_cache_enabled())
    return at::detail::empty_strided_generic(sizes, strides, &CpuBlockCache::get(),
                                             c10::DispatchKeySet(c10::DispatchKey::CPU),
                                             c10::typeMetaToScalarType(options.dtype()));
  return at::empty_strided(sizes, strides, options);
}

}  // namespace kiln
