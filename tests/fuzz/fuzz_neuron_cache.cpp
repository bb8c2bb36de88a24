// The neuron backend's compile cache entries (<cache_dir>/neuron/<hash>.pjrt, read_cache_entry):
// bytes a user, a crash, a full disk or another kiln version may have left under the name. Each
// input is a file. The reader must return nothing, or the executable's bytes of an entry that is
// exactly what write_cache_entry writes for the module asked about; and it must never make a buffer
// larger than the file could fill (libFuzzer's malloc limit stops a run that does: a header's sizes
// are outside input too).
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "cache_entry.h"
#include "fuzz_temp_dir.h"

namespace {

// The module the seeds' entries were written for (make_neuron_cache_seeds.py).
const std::string kModule = "module @kiln_group {\n  func.func public @main() {\n    return\n  }\n}\n";

std::string temp_path(const char* what) { return kiln::fuzz::temp_path("neuron-cache", what); }

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>{});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = temp_path("in.pjrt");
  const std::string input(reinterpret_cast<const char*>(data), size);
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(input.data(), static_cast<std::streamsize>(input.size()));
  }
  std::string damaged;
  const auto bytes = kiln::neuron::read_cache_entry(path, kModule, &damaged);
  if (!bytes) return 0;  // refused (damaged says why) or another module's: either way nothing is used
  if (!damaged.empty()) std::abort();
  // Accepted: the file must be the one entry write_cache_entry makes of this module and these bytes.
  const std::string again = temp_path("again.pjrt");
  if (!kiln::neuron::write_cache_entry(again, kModule, *bytes)) std::abort();
  if (slurp(again) != input) std::abort();
  return 0;
}
