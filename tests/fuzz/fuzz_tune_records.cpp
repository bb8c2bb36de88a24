// The inductor's max-autotune records (<key>.tune for CPU kernels, <key>.cutune for CUDA ones, one
// parser, read_tune): bytes from a cache folder a user, a crash or another kiln version may have
// left. Each input is a file; its first byte is the number of kernels the reader expects. The
// reader must return false or winners that make sense (one per kernel, variant >= 0, threads >= 1),
// and what it accepts must write and read back the same.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_temp_dir.h"
#include "toolchain.h"

namespace {

std::string temp_path(const char* what) { return kiln::fuzz::temp_path("tune", what); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t kernels = data[0] % 64;
  const std::string path = temp_path("in.tune");
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
  }
  std::vector<std::pair<int, int>> winners{{7, 7}};
  const bool ok = kiln::inductor::read_tune(path, &winners, kernels);
  if (!ok) {
    // A refused record leaves the caller's winners alone.
    if (winners.size() != 1 || winners[0] != std::make_pair(7, 7)) std::abort();
    return 0;
  }
  if (winners.size() != kernels) std::abort();
  for (const auto& [variant, threads] : winners)
    if (variant < 0 || threads < 1) std::abort();
  const std::string again = temp_path("again.tune");
  kiln::inductor::write_tune(again, winners);
  std::vector<std::pair<int, int>> back;
  if (!kiln::inductor::read_tune(again, &back, kernels) || back != winners) std::abort();
  return 0;
}
