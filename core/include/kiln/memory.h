// CPU memory accounting, for kiln bench and the Trainer's peak_memory_mb; CUDA's counterparts
// (cuda_allocated_bytes, ...) are in kiln/compile.h.
#pragma once

#include <cstdint>

namespace c10 {
struct Allocator;
}

namespace kiln {

// CPU memory accounting. The CPU has no caching allocator with statistics, as CUDA has, so kiln
// counts what goes through its own allocators: the compiled step's CPU block cache and, while
// a ScopedCpuMemoryMeter is alive, a counting allocator in place of LibTorch's default one, through
// which every other CPU tensor is allocated (eager ops, the model, the optimizer's state). A
// tensor counts from its allocation to its release, by the bytes it asked for; free blocks the block
// cache keeps do not count (CUDA's "allocated", not "reserved"). Storage allocated before any
// meter was in place, or by a user's own allocator, is not seen.
int64_t cpu_allocated_bytes();
int64_t cpu_peak_allocated_bytes();  // the most allocated at once since the last reset
void cpu_reset_peak_allocated();     // the peak becomes what is allocated now

// While alive (and while LibTorch's own CPU allocator is the one in place), CPU tensors come from a
// counting allocator: LibTorch's aligned allocation, with each block's size kept so that its release
// is counted too. kiln's own block cache still takes over inside a compiled step. Process-wide; meant for a
// whole run (kiln bench, Trainer::train), not for one step.
class ScopedCpuMemoryMeter {
 public:
  ScopedCpuMemoryMeter();
  ~ScopedCpuMemoryMeter();
  ScopedCpuMemoryMeter(const ScopedCpuMemoryMeter&) = delete;
  ScopedCpuMemoryMeter& operator=(const ScopedCpuMemoryMeter&) = delete;
  bool active() const { return prev_ != nullptr; }  // false where a user's allocator was in place

 private:
  c10::Allocator* prev_ = nullptr;
};

}  // namespace kiln
