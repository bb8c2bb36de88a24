// CPU instruction sets with the OS-support check. A CPU that has AVX-512 is of no use when the
// OS does not save the ZMM registers on a context switch (XCR0), and AMX tiles additionally need
// the per-process permission Linux asks for; reporting such a feature leads to SIGILL or
// corrupted registers, the very failure ggml's CPU score had.
#include <cstring>

#include "probe_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define KILN_X86 1
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace kiln::hw {

namespace {

constexpr uint32_t bit(int n) { return 1u << n; }

// CPUID bits (Intel SDM vol. 2A, CPUID; AMD APM vol. 3).
constexpr uint32_t kLeaf1EcxFma = bit(12);
constexpr uint32_t kLeaf1EcxOsxsave = bit(27);
constexpr uint32_t kLeaf1EcxAvx = bit(28);
constexpr uint32_t kLeaf7EbxAvx2 = bit(5);
constexpr uint32_t kLeaf7EbxAvx512f = bit(16);
constexpr uint32_t kLeaf7EcxAvx512Vnni = bit(11);
constexpr uint32_t kLeaf7EdxAmxBf16 = bit(22);
constexpr uint32_t kLeaf7EdxAmxTile = bit(24);
constexpr uint32_t kLeaf7EdxAmxInt8 = bit(25);
constexpr uint32_t kLeaf7_1EaxAvx512Bf16 = bit(5);

// XCR0 state components.
constexpr uint64_t kXcr0Ymm = (1ull << 1) | (1ull << 2);                // SSE + AVX
constexpr uint64_t kXcr0Zmm = (1ull << 5) | (1ull << 6) | (1ull << 7);  // opmask, ZMM_Hi256, Hi16_ZMM
constexpr uint64_t kXcr0Tile = (1ull << 17) | (1ull << 18);             // XTILECFG, XTILEDATA

#if defined(__linux__)
constexpr int kArchReqXcompPerm = 0x1023;  // ARCH_REQ_XCOMP_PERM, Linux 5.16+
constexpr int kXfeatureXtiledata = 18;
#endif

}  // namespace

CpuidLeaves read_cpuid() {
  CpuidLeaves l;
#if defined(KILN_X86)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return l;
  l.valid = true;
  l.max_leaf = a;
  char vendor[13];
  std::memcpy(vendor + 0, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  vendor[12] = '\0';
  l.vendor = vendor;
  if (l.max_leaf >= 1 && __get_cpuid(1, &a, &b, &c, &d)) l.leaf1_ecx = c;
  if (l.max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    l.leaf7_ebx = b;
    l.leaf7_ecx = c;
    l.leaf7_edx = d;
    const unsigned max_subleaf = a;
    if (max_subleaf >= 1) {
      __cpuid_count(7, 1, a, b, c, d);
      l.leaf7_1_eax = a;
    }
  }
  if (l.leaf1_ecx & kLeaf1EcxOsxsave) {
    // xgetbv is legal only when the OS set CR4.OSXSAVE, which OSXSAVE mirrors.
    uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    l.xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  }
#if defined(__linux__)
  if ((l.leaf7_edx & kLeaf7EdxAmxTile) && (l.xcr0 & kXcr0Tile) == kXcr0Tile) {
    // Linux keeps XTILEDATA disabled per process until asked; asking is what any AMX user must
    // do before the first tile instruction, so doing it here has no cost beyond the syscall.
    l.amx_permission = ::syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }
#endif
#endif
  return l;
}

IsaFeatures decode_isa(const CpuidLeaves& l) {
  IsaFeatures f;
  if (!l.valid) return f;
  const bool osxsave = (l.leaf1_ecx & kLeaf1EcxOsxsave) != 0;
  const uint64_t xcr0 = osxsave ? l.xcr0 : 0;
  const bool ymm_on = (xcr0 & kXcr0Ymm) == kXcr0Ymm;
  const bool zmm_on = ymm_on && (xcr0 & kXcr0Zmm) == kXcr0Zmm;
  const bool tile_on = (xcr0 & kXcr0Tile) == kXcr0Tile;
  const bool has7 = l.max_leaf >= 7;

  const bool cpu_avx = (l.leaf1_ecx & kLeaf1EcxAvx) != 0;
  const bool cpu_fma = cpu_avx && (l.leaf1_ecx & kLeaf1EcxFma);
  const bool cpu_avx2 = has7 && cpu_avx && (l.leaf7_ebx & kLeaf7EbxAvx2);
  const bool cpu_avx512f = has7 && (l.leaf7_ebx & kLeaf7EbxAvx512f);
  const bool cpu_avx512_bf16 = cpu_avx512f && (l.leaf7_1_eax & kLeaf7_1EaxAvx512Bf16);
  const bool cpu_avx512_vnni = cpu_avx512f && (l.leaf7_ecx & kLeaf7EcxAvx512Vnni);
  const bool cpu_tile = has7 && (l.leaf7_edx & kLeaf7EdxAmxTile);
  const bool cpu_amx_bf16 = cpu_tile && (l.leaf7_edx & kLeaf7EdxAmxBf16);
  const bool cpu_amx_int8 = cpu_tile && (l.leaf7_edx & kLeaf7EdxAmxInt8);

  const std::string no_ymm = osxsave ? "XCR0 does not enable the SSE/AVX state (bits 1-2)"
                                     : "the OS has not enabled XSAVE (CPUID.1:ECX.OSXSAVE = 0)";
  const std::string no_zmm = !ymm_on ? no_ymm : "XCR0 does not enable the opmask/ZMM state (bits 5-7)";
  auto gate = [&](bool cpu, bool os, const char* name, const std::string& why, bool& out) {
    out = cpu && os;
    if (cpu && !os) f.disabled_by_os.push_back(std::string(name) + ": CPUID reports it but " + why);
  };
  gate(cpu_fma, ymm_on, "fma", no_ymm, f.fma);
  gate(cpu_avx2, ymm_on, "avx2", no_ymm, f.avx2);
  gate(cpu_avx512f, zmm_on, "avx512f", no_zmm, f.avx512f);
  gate(cpu_avx512_bf16, zmm_on, "avx512_bf16", no_zmm, f.avx512_bf16);
  gate(cpu_avx512_vnni, zmm_on, "avx512_vnni", no_zmm, f.avx512_vnni);

  std::string no_amx;
  if (!tile_on) no_amx = "XCR0 does not enable the tile state (bits 17-18)";
  else if (!l.amx_permission) no_amx = "Linux refused the AMX permission (arch_prctl ARCH_REQ_XCOMP_PERM)";
  const bool amx_on = tile_on && l.amx_permission;
  gate(cpu_tile, amx_on, "amx_tile", no_amx, f.amx_tile);
  gate(cpu_amx_bf16, amx_on, "amx_bf16", no_amx, f.amx_bf16);
  gate(cpu_amx_int8, amx_on, "amx_int8", no_amx, f.amx_int8);
  return f;
}

}  // namespace kiln::hw
