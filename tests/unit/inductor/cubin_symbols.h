// The kernels a cubin defines: the names of its global function symbols, read from the ELF symbol
// table (a cubin is an ELF64 little-endian image). Empty when the image is not one. And its
// variables (a __constant__ table) alike.
#pragma once

#include <cstdint>
#include <cstring>
#include <set>
#include <string>

namespace kiln::test {

// `type`: the ELF symbol type, 2 (STT_FUNC) for functions, 1 (STT_OBJECT) for variables.
inline std::set<std::string> cubin_symbols(const std::string& image, uint64_t type) {
  std::set<std::string> names;
  auto rd = [&](size_t off, size_t n) -> uint64_t {
    if (off + n > image.size()) return 0;
    uint64_t v = 0;
    std::memcpy(&v, image.data() + off, n);  // little endian, as the host
    return v;
  };
  if (image.size() < 64 ||
      image.compare(0, 4,
                    "\x7f"
                    "ELF") != 0 ||
      image[4] != 2 || image[5] != 1)
    return names;
  const uint64_t shoff = rd(0x28, 8), shentsize = rd(0x3a, 2), shnum = rd(0x3c, 2);
  if (shentsize < 64) return names;
  auto sh = [&](uint64_t i, size_t field, size_t n) { return rd(shoff + i * shentsize + field, n); };
  for (uint64_t i = 0; i < shnum; ++i) {
    if (sh(i, 4, 4) != 2) continue;  // SHT_SYMTAB
    const uint64_t off = sh(i, 0x18, 8), size = sh(i, 0x20, 8), link = sh(i, 0x28, 4), entsize = sh(i, 0x38, 8);
    const uint64_t stroff = sh(link, 0x18, 8), strsize = sh(link, 0x20, 8);
    if (entsize < 24 || off + size > image.size() || stroff + strsize > image.size()) continue;
    for (uint64_t s = off; s + 24 <= off + size; s += entsize) {
      const uint64_t name = rd(s, 4), info = rd(s + 4, 1);
      // A kernel entry point is STB_GLOBAL; a module's variables are local in a whole-program
      // cubin, and the driver finds them by name all the same (cuModuleGetGlobal).
      if ((info & 0xf) != type || (type == 2 && (info >> 4) != 1) || name >= strsize) continue;
      const char* p = image.data() + stroff + name;
      names.insert(std::string(p, strnlen(p, static_cast<size_t>(strsize - name))));
    }
  }
  return names;
}

inline std::set<std::string> cubin_functions(const std::string& image) { return cubin_symbols(image, 2); }
inline std::set<std::string> cubin_objects(const std::string& image) { return cubin_symbols(image, 1); }

}  // namespace kiln::test
