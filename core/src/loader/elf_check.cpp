#include "kiln/internal/elf_check.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace kiln {

namespace {

#if defined(__x86_64__)
constexpr uint16_t kHostMachine = EM_X86_64;
constexpr const char* kHostMachineName = "x86-64";
#elif defined(__aarch64__)
constexpr uint16_t kHostMachine = EM_AARCH64;
constexpr const char* kHostMachineName = "AArch64";
#else
#error "kiln's plugin loader knows the ELF machine of x86-64 and AArch64 hosts only"
#endif

std::string machine_name(uint16_t m) {
  switch (m) {
    case EM_X86_64: return "x86-64";
    case EM_AARCH64: return "AArch64";
    case EM_386: return "i386";
    case EM_ARM: return "ARM";
    case EM_PPC64: return "PowerPC64";
    case EM_RISCV: return "RISC-V";
    case EM_S390: return "s390";
    default: return "machine " + std::to_string(m);
  }
}

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Reads up to buf.size() bytes from the start of `fd`; how many it read.
size_t read_start(int fd, std::vector<unsigned char>& buf) {
  size_t got = 0;
  while (got < buf.size()) {
    const ssize_t n = ::pread(fd, buf.data() + got, buf.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  return got;
}

}  // namespace

std::string elf_precheck_bytes(const unsigned char* data, size_t size, uint64_t file_size) {
  if (file_size < sizeof(Elf64_Ehdr) || size < sizeof(Elf64_Ehdr))
    return "file too short for an ELF header (" + std::to_string(file_size) + " bytes, at least " +
           std::to_string(sizeof(Elf64_Ehdr)) + " needed)";
  if (std::memcmp(data, ELFMAG, SELFMAG) != 0) return "not an ELF file (no \\x7fELF magic at its start)";
  if (data[EI_CLASS] != ELFCLASS64)
    return data[EI_CLASS] == ELFCLASS32 ? "a 32-bit ELF file; this host loads 64-bit libraries"
                                        : "an ELF file of unknown class " + std::to_string(data[EI_CLASS]);
  if (data[EI_DATA] != ELFDATA2LSB) return "a big-endian ELF file; this host is little-endian";
  Elf64_Ehdr eh;
  std::memcpy(&eh, data, sizeof eh);
  if (eh.e_type != ET_DYN)
    return eh.e_type == ET_EXEC  ? "an executable, not a shared library"
           : eh.e_type == ET_REL ? "an object file (.o), not a shared library"
                                 : "not a shared library (ELF type " + std::to_string(eh.e_type) + ")";
  if (eh.e_machine != kHostMachine)
    return "built for " + machine_name(eh.e_machine) + "; this host is " + kHostMachineName;
  if (eh.e_phnum == 0) return "no program headers: nothing to load";
  if (eh.e_phentsize != sizeof(Elf64_Phdr))
    return "program header entries of " + std::to_string(eh.e_phentsize) + " bytes (64-bit ELF has " +
           std::to_string(sizeof(Elf64_Phdr)) + ")";
  const uint64_t ph_end = eh.e_phoff + uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr);
  if (eh.e_phoff > file_size || ph_end > file_size)
    return "truncated: the program headers end at byte " + std::to_string(ph_end) + ", the file has " +
           std::to_string(file_size) + " bytes";
  if (ph_end > size) return "";  // the caller read too little to check the segments
  int loads = 0;
  for (uint16_t i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    std::memcpy(&ph, data + eh.e_phoff + uint64_t{i} * sizeof(Elf64_Phdr), sizeof ph);
    if (ph.p_type != PT_LOAD && ph.p_type != PT_DYNAMIC) continue;
    const char* what = ph.p_type == PT_LOAD ? "loadable segment " : "dynamic segment ";
    if (ph.p_type == PT_LOAD) ++loads;
    if (ph.p_filesz > ph.p_memsz && ph.p_type == PT_LOAD)
      return std::string(what) + std::to_string(i) + " holds more bytes in the file (" + std::to_string(ph.p_filesz) +
             ") than in memory (" + std::to_string(ph.p_memsz) + ")";
    const uint64_t end = ph.p_offset + ph.p_filesz;
    if (end < ph.p_offset || end > file_size)
      return "truncated: " + std::string(what) + std::to_string(i) + " ends at byte " + std::to_string(end) +
             ", the file has " + std::to_string(file_size) + " bytes (an interrupted copy?)";
  }
  if (loads == 0) return "no loadable segment";
  return "";
}

std::string elf_precheck(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ELOOP) return "a loop of symbolic links";
    return std::string("cannot be read: ") + std::strerror(e);
  }
  if (!S_ISREG(st.st_mode)) return kind_of(st.st_mode);
  // O_NONBLOCK: should the file have become a FIFO since, open does not wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return std::string("cannot be opened: ") + std::strerror(errno);
  struct stat fst {};
  if (::fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode)) {
    ::close(fd);
    return "not a regular file";
  }
  const uint64_t file_size = static_cast<uint64_t>(fst.st_size);
  // The ELF header, then as much as the program headers need (they sit near the start).
  std::vector<unsigned char> buf(static_cast<size_t>(std::min<uint64_t>(file_size, 64 * 1024)));
  const size_t got = read_start(fd, buf);
  std::string why = elf_precheck_bytes(buf.data(), got, file_size);
  if (why.empty() && got >= sizeof(Elf64_Ehdr)) {
    Elf64_Ehdr eh;
    std::memcpy(&eh, buf.data(), sizeof eh);
    const uint64_t ph_end = eh.e_phoff + uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr);
    if (ph_end > got) {  // program headers far into the file: read them where they are
      std::vector<unsigned char> all(static_cast<size_t>(ph_end));
      const size_t n_all = read_start(fd, all);
      why = n_all < all.size() ? "cannot be read to its program headers"
                               : elf_precheck_bytes(all.data(), n_all, file_size);
    }
  }
  ::close(fd);
  return why;
}

}  // namespace kiln
