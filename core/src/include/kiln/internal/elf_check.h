// What the loader checks of a file before it lets dlopen map it: a library cut short (an
// interrupted copy) makes dlopen map segments past the end of the file, and the first touch of
// such a page kills the process with SIGBUS. No LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln {

// "" when `path` is a regular, readable ELF shared object for this host (class, byte order and
// machine), whose program headers and every loadable segment lie inside the file; otherwise why
// not, in words ("truncated: loadable segment 2 ends at byte 20480, the file has 3000 bytes").
// Follows symbolic links (a loop is reported), and never opens a FIFO, a device or a directory.
std::string elf_precheck(const std::string& path);

// The same checks on bytes already read: `data` holds the file's first `size` bytes and the file
// has `file_size` bytes in all (size may be smaller: then only what it holds is checked and the
// segments are checked against file_size).
std::string elf_precheck_bytes(const unsigned char* data, size_t size, uint64_t file_size);

}  // namespace kiln
