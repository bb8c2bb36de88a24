// libFuzzer target: the loader's ELF pre-check (core/src/loader/elf_check.cpp) on arbitrary bytes.
// The first 8 bytes, when there are 8, give the size of the whole file the bytes begin (so that
// segment bounds past what was read are exercised); the rest are the file's first bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kiln/internal/elf_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint64_t file_size = size;
  if (size >= 8) {
    std::memcpy(&file_size, data, 8);
    data += 8;
    size -= 8;
    file_size %= uint64_t{1} << 24;
    if (file_size < size) file_size = size;
  }
  (void)kiln::elf_precheck_bytes(data, size, file_size);
  return 0;
}
