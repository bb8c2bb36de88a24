// NVRTC and the CUDA driver as the inductor loads them (dlopen, no CUDA library linked), without
// LibTorch: NVRTC is found, compiles a kernel to a cubin that defines it, and reports a failing
// compile with its log and the source's name; a bad `nvrtc` option and a missing driver are errors
// that say what was tried; the CUDA prelude compiles on its own and is embedded byte for byte.
// Skips (saying so) where no libnvrtc can be loaded.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include <kiln/plugin_api.hpp>

#include "codegen_cuda.h"
#include "cubin_symbols.h"
#include "cuda_driver.h"
#include "cuda_nvrtc.h"

using kiln::inductor::CudaDriver;
using kiln::inductor::Nvrtc;

namespace {

// The process's NVRTC, or nullptr with the reason.
std::shared_ptr<Nvrtc> nvrtc(std::string* why) {
  try {
    return Nvrtc::load("");
  } catch (const kiln::plugin::Error& e) {
    *why = e.what();
    return nullptr;
  }
}

const char* kKernel = R"(extern "C" __global__ void kiln_probe(float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = expf(x[i]);
}
)";

}  // namespace

TEST(InductorNvrtc, LoadsAndCompilesAKernelToACubinThatDefinesIt) {
  std::string why;
  auto n = nvrtc(&why);
  if (!n) GTEST_SKIP() << "no NVRTC on this machine: " << why;
  EXPECT_FALSE(n->library_path().empty());
  EXPECT_GE(n->version_major(), 11) << n->version();
  ASSERT_TRUE(n->supports(90)) << "NVRTC " << n->version() << " at " << n->library_path() << " lacks sm_90";
  const uint64_t before = Nvrtc::compiles();
  const std::string cubin = n->compile(kKernel, 90, "probe.cu");
  EXPECT_EQ(Nvrtc::compiles(), before + 1);
  ASSERT_GT(cubin.size(), 64u);
  EXPECT_EQ(cubin.compare(0, 4,
                          "\x7f"
                          "ELF"),
            0);
  const auto fns = kiln::test::cubin_functions(cubin);
  EXPECT_EQ(fns.count("kiln_probe"), 1u) << fns.size() << " functions";
}

TEST(InductorNvrtc, ACompileErrorCarriesTheSourceNameAndNvrtcsLog) {
  std::string why;
  auto n = nvrtc(&why);
  if (!n) GTEST_SKIP() << "no NVRTC on this machine: " << why;
  try {
    n->compile("extern \"C\" __global__ void k(float* x) { x[0] = not_declared_anywhere; }\n", 90, "kiln_bad.cu");
    FAIL() << "compiled";
  } catch (const kiln::plugin::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), KILN_ERROR_INTERNAL);
    EXPECT_NE(msg.find("kiln_bad.cu"), std::string::npos) << msg;
    EXPECT_NE(msg.find("sm_90"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not_declared_anywhere"), std::string::npos) << msg;  // from the log
  }
  // An architecture NVRTC does not know is refused before it compiles anything.
  try {
    n->compile(kKernel, 1, "probe.cu");
    FAIL() << "compiled for sm_1";
  } catch (const kiln::plugin::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sm_1"), std::string::npos) << e.what();
  }
}

TEST(InductorNvrtc, TheOptionNamesTheLibraryOrItsDirectory) {
  try {
    Nvrtc::load("/nonexistent/dir/libnvrtc.so.13");
    FAIL() << "loaded a library that does not exist";
  } catch (const kiln::plugin::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), KILN_ERROR_UNAVAILABLE);
    EXPECT_NE(msg.find("/nonexistent/dir/libnvrtc.so.13"), std::string::npos) << msg;
    EXPECT_NE(msg.find("nvrtc option"), std::string::npos) << msg;
  }
  // A library that is not NVRTC at all.
  try {
    Nvrtc::load("libm.so.6");
    FAIL() << "took libm for NVRTC";
  } catch (const kiln::plugin::Error& e) {
    EXPECT_NE(std::string(e.what()).find("nvrtcCompileProgram"), std::string::npos) << e.what();
  }
  std::string why;
  auto found = nvrtc(&why);
  if (!found) GTEST_SKIP() << "no NVRTC on this machine: " << why;
  const std::string& path = found->library_path();
  auto by_dir = Nvrtc::load(path.substr(0, path.rfind('/')));
  EXPECT_EQ(by_dir->version(), found->version());
}

TEST(InductorCudaDriver, LoadsOrSaysWhyNot) {
  try {
    auto d = CudaDriver::load();
    EXPECT_GE(d->version(), 11000);
    EXPECT_GE(d->device_count(), 0);
  } catch (const kiln::plugin::Error& e) {
    // No driver library, or one that cannot start: either way an error that says which.
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), KILN_ERROR_UNAVAILABLE);
    EXPECT_TRUE(msg.find("libcuda.so.1") != std::string::npos || msg.find("cuInit") != std::string::npos) << msg;
  }
}

TEST(InductorCudaPrelude, CompilesOnItsOwnAndIsEmbeddedByteForByte) {
  std::ifstream f(KILN_CUDA_PRELUDE_HEADER, std::ios::binary);
  ASSERT_TRUE(f) << KILN_CUDA_PRELUDE_HEADER;
  const std::string header((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(std::string(kiln::inductor::cuda_prelude()), header);
  std::string why;
  auto n = nvrtc(&why);
  if (!n) GTEST_SKIP() << "no NVRTC on this machine: " << why;
  const auto fns = kiln::test::cubin_functions(n->compile(header, 90, "cuda_prelude.h"));
  EXPECT_EQ(fns.count("kiln_set_scalars"), 1u);
  EXPECT_EQ(fns.count("kiln_strided_copy"), 1u);
}
