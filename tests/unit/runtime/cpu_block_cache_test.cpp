// CPU memory accounting: every tensor allocated under a ScopedCpuMemoryMeter, or from the block
// cache, counts by its size from allocation to release; the peak holds the most at once.
// CpuBlockCache: blocks come back for the same sizes, the cap holds, raw_allocate works (ATen
// kernels use it), the scoped swap routes ATen's CPU allocations through the cache and restores
// LibTorch's allocator, and many threads allocating and freeing at once leave it consistent.
#include <cstring>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include "cpu_block_cache.h"
#include "kiln/memory.h"

namespace {

using kiln::CpuBlockCache;

TEST(CpuBlockCache, StepValuesComeFromTheCacheOnlyInsideAScope) {
  auto& cache = CpuBlockCache::get();
  at::Tensor outside = kiln::empty_strided_step({1000}, {1}, at::TensorOptions(at::kFloat));
  EXPECT_NE(outside.storage().allocator(), &cache) << "a step that turned the cache off allocates through LibTorch";
  kiln::ScopedCpuBlockCache scope;
  EXPECT_TRUE(kiln::cpu_block_cache_enabled());
  at::Tensor inside = kiln::empty_strided_step({1000}, {1}, at::TensorOptions(at::kFloat));
  EXPECT_EQ(inside.storage().allocator(), &cache);
}

TEST(CpuBlockCache, AFreedBlockServesTheNextRequestOfItsSize) {
  kiln::ScopedCpuBlockCache scope;
  auto& cache = CpuBlockCache::get();
  cache.release();
  void* first = nullptr;
  {
    at::Tensor t = kiln::empty_strided_step({1000, 1000}, {1000, 1}, at::TensorOptions(at::kFloat));
    first = t.data_ptr();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u) << "blocks are 64-byte aligned";
  }
  EXPECT_GE(cache.cached_bytes(), 4000000u);
  const size_t hits = cache.hits();
  at::Tensor again = kiln::empty_strided_step({1000, 1000}, {1000, 1}, at::TensorOptions(at::kFloat));
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_EQ(cache.hits(), hits + 1);
  EXPECT_EQ(cache.cached_bytes(), 0u);
  // Writable, and the values are the tensor's.
  again.fill_(3.5f);
  EXPECT_EQ(again.sum().item<double>(), 3.5e6);
}

TEST(CpuBlockCache, ABlockMoreThanTwiceTheRequestIsNotHandedOut) {
  kiln::ScopedCpuBlockCache scope;
  auto& cache = CpuBlockCache::get();
  cache.release();
  void* big = nullptr;
  {
    at::Tensor t = kiln::empty_strided_step({1 << 22}, {1}, at::TensorOptions(at::kByte));
    big = t.data_ptr();
  }
  at::Tensor small = kiln::empty_strided_step({1 << 20}, {1}, at::TensorOptions(at::kByte));
  EXPECT_NE(small.data_ptr(), big);
  at::Tensor half = kiln::empty_strided_step({(1 << 21) + 4096}, {1}, at::TensorOptions(at::kByte));
  EXPECT_EQ(half.data_ptr(), big);
}

TEST(CpuBlockCache, RawAllocateHandsOutTheBlockAsItsOwnContext) {
  auto& cache = CpuBlockCache::get();
  void* p = cache.raw_allocate(12345);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, 12345);
  cache.raw_deallocate(p);
  EXPECT_GE(cache.cached_bytes(), 12345u);
}

TEST(CpuBlockCache, TheScopeRoutesAtenAllocationsAndRestoresLibTorchsAllocator) {
  c10::Allocator* before = c10::GetCPUAllocator();
  ASSERT_EQ(before, c10::GetDefaultCPUAllocator());
  auto& cache = CpuBlockCache::get();
  cache.release();
  {
    kiln::ScopedCpuBlockCache scope;
    EXPECT_EQ(c10::GetCPUAllocator(), &cache);
    at::Tensor a = at::randn({256, 256});
    at::Tensor b = at::mm(a, a);  // allocated by ATen inside the scope
    EXPECT_EQ(b.storage().allocator(), &cache);
  }
  EXPECT_EQ(c10::GetCPUAllocator(), before);
  EXPECT_GT(cache.cached_bytes(), 0u) << "tensors made in the scope went back to the cache";
  at::Tensor outside = at::empty({256, 256});
  EXPECT_NE(outside.storage().allocator(), &cache);
}

TEST(CpuBlockCache, ATensorFromTheCacheCanGrow) {
  kiln::ScopedCpuBlockCache scope;
  at::Tensor t = at::empty({10});
  t.resize_({1 << 20});
  t.fill_(1);
  EXPECT_EQ(t.sum().item<double>(), static_cast<double>(1 << 20));
}

TEST(CpuBlockCache, ThreadsAllocatingAndFreeingAtOnceKeepItConsistent) {
  auto& cache = CpuBlockCache::get();
  cache.release();
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([t] {
      kiln::ScopedCpuBlockCache scope;  // per thread: the step's thread is the one that uses the cache
      for (int i = 0; i < 2000; ++i) {
        const int64_t n = 1024 * (1 + (i * 7 + t) % 64);
        at::Tensor x = kiln::empty_strided_step({n}, {1}, at::TensorOptions(at::kFloat));
        x.data_ptr<float>()[0] = static_cast<float>(i);
        x.data_ptr<float>()[n - 1] = static_cast<float>(t);
        ASSERT_EQ(x.data_ptr<float>()[0], static_cast<float>(i));
      }
    });
  for (auto& th : threads) th.join();
  // Every block is back; a release frees them all.
  EXPECT_GT(cache.cached_bytes(), 0u);
  cache.release();
  EXPECT_EQ(cache.cached_bytes(), 0u);
}

TEST(CpuMemoryMeter, CountsEveryTensorFromItsAllocationToItsRelease) {
  ASSERT_EQ(c10::GetCPUAllocator(), c10::GetDefaultCPUAllocator());
  at::Tensor kept;
  int64_t before = 0;
  {
    kiln::ScopedCpuMemoryMeter meter;
    ASSERT_TRUE(meter.active());
    EXPECT_NE(c10::GetCPUAllocator(), c10::GetDefaultCPUAllocator());
    before = kiln::cpu_allocated_bytes();
    kiln::cpu_reset_peak_allocated();
    EXPECT_EQ(kiln::cpu_peak_allocated_bytes(), before);
    {
      at::Tensor a = at::empty({1 << 20}, at::kFloat);  // 4 MiB
      EXPECT_EQ(kiln::cpu_allocated_bytes() - before, 4 << 20);
      at::Tensor b = at::empty({1000}, at::kDouble);
      EXPECT_EQ(kiln::cpu_allocated_bytes() - before, (4 << 20) + 8000);
      a.fill_(1);
      EXPECT_EQ(a.sum().item<double>(), static_cast<double>(1 << 20));
    }
    EXPECT_EQ(kiln::cpu_allocated_bytes(), before) << "both released";
    EXPECT_GE(kiln::cpu_peak_allocated_bytes() - before, (4 << 20) + 8000) << "the peak holds the most at once";
    kiln::cpu_reset_peak_allocated();
    EXPECT_EQ(kiln::cpu_peak_allocated_bytes(), before);
    // raw_allocate (some ATen kernels use it) needs the memory to be its own context.
    void* p = c10::GetCPUAllocator()->raw_allocate(12345);
    EXPECT_EQ(kiln::cpu_allocated_bytes() - before, 12345);
    c10::GetCPUAllocator()->raw_deallocate(p);
    EXPECT_EQ(kiln::cpu_allocated_bytes(), before);
    kept = at::empty({1000}, at::kFloat);
  }
  EXPECT_EQ(c10::GetCPUAllocator(), c10::GetDefaultCPUAllocator()) << "LibTorch's allocator is back";
  EXPECT_EQ(kiln::cpu_allocated_bytes() - before, 4000);
  kept = at::Tensor();
  EXPECT_EQ(kiln::cpu_allocated_bytes(), before) << "a tensor outliving the meter is still counted out";
}

TEST(CpuMemoryMeter, TheBlockCacheTakesOverInsideAStepAndIsCountedAlike) {
  kiln::ScopedCpuMemoryMeter meter;
  ASSERT_TRUE(meter.active());
  c10::Allocator* counting = c10::GetCPUAllocator();
  const int64_t before = kiln::cpu_allocated_bytes();
  {
    kiln::ScopedCpuBlockCache scope;
    EXPECT_EQ(c10::GetCPUAllocator(), &CpuBlockCache::get()) << "the step's own allocator, not the meter";
    at::Tensor a = at::empty({3000}, at::kFloat);
    at::Tensor b = kiln::empty_strided_step({500}, {1}, at::TensorOptions(at::kFloat));
    EXPECT_EQ(kiln::cpu_allocated_bytes() - before, 12000 + 2000);
  }
  EXPECT_EQ(c10::GetCPUAllocator(), counting) << "the meter is back after the step";
  EXPECT_EQ(kiln::cpu_allocated_bytes(), before) << "free blocks the cache keeps are not allocated memory";
  EXPECT_GE(kiln::cpu_peak_allocated_bytes() - before, 14000);
}

}  // namespace
