// The inductor's compile cache under threads, without LibTorch (so that the sanitizer builds of
// scripts/test run it): threads that compile the same kernel source into one cache at once, from a
// cold cache, each get a library that works, under one key, and leave one whole entry and no
// temporary file; a second round loads that entry without compiling.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/plugin_api.hpp"
#include "run_together.h"
#include "toolchain.h"

namespace fs = std::filesystem;
using namespace kiln::inductor;

namespace {

std::string fresh_dir() {
  std::string t = (fs::temp_directory_path() / "kiln-cache-threads-XXXXXX").string();
  if (!mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
  return t;
}

}  // namespace

TEST(InductorCacheThreads, ThreadsCompilingOneSourceAtOnceShareOneWholeEntry) {
  const std::string dir = fresh_dir();
  const kiln::plugin::Host host(nullptr, "inductor");
  const Toolchain tc = make_toolchain("c++", {});
  const std::string source = "extern \"C\" int kiln_answer(int x) { return 6 * x; }\n";
  constexpr int kThreads = 6;
  for (int round = 0; round < 2; ++round) {
    std::vector<std::string> keys(kThreads), errors(kThreads);
    std::vector<int> hits(kThreads, -1);
    kiln::test::run_together(kThreads, [&](int t) {
      try {
        const std::string root = usable_cache_root(inductor_cache_dir(dir), host);
        CacheStats stats;
        auto lib = compile_cached(source, tc, root, host, &keys[static_cast<size_t>(t)], &stats);
        auto fn = reinterpret_cast<int (*)(int)>(lib->symbol("kiln_answer"));
        if (!fn || fn(7) != 42) errors[static_cast<size_t>(t)] = "the library computes the wrong value";
        hits[static_cast<size_t>(t)] = stats.hit ? 1 : 0;
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(t)] = e.what();
      }
    });
    for (int t = 0; t < kThreads; ++t) {
      EXPECT_EQ(errors[static_cast<size_t>(t)], "") << "round " << round << " thread " << t;
      EXPECT_EQ(keys[static_cast<size_t>(t)], keys[0]) << "round " << round << " thread " << t;
      if (round == 1) {
        EXPECT_EQ(hits[static_cast<size_t>(t)], 1) << "thread " << t << " compiled a cached kernel";
      }
    }
    // One whole entry: the source, the library and its manifest, nothing half-written.
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(inductor_cache_dir(dir))) files.push_back(e.path().filename().string());
    std::sort(files.begin(), files.end());
    ASSERT_FALSE(keys[0].empty());
    EXPECT_EQ(files, (std::vector<std::string>{keys[0] + ".cpp", keys[0] + ".ok", keys[0] + ".so"}))
        << "round " << round;
  }
  fs::remove_all(dir);
}
