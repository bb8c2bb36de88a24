#include "cache_entry.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <system_error>

namespace kiln::neuron {

namespace {

// "knppjr02": the format of the file (a 64-bit word, this machine's byte order), then the module's
// size and text, then the executable's size and hash, then its bytes.
constexpr uint64_t kCacheFormat = 0x3230726a70706e6bull;

// FNV-1a over the executable's bytes: the entry's check sum.
uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

}  // namespace

std::optional<std::string> read_cache_entry(const std::string& file, const std::string& module, std::string* damaged) {
  std::ifstream in(file, std::ios::binary | std::ios::ate);
  if (!in) return std::nullopt;  // no entry: a miss
  // The size of the file opened (a writer renames a new entry over the name: this one stays whole).
  const std::streamoff end = in.tellg();
  if (end < 0 || !in.seekg(0)) return *damaged = "not a readable file", std::nullopt;
  uint64_t format = 0, n = 0, size = 0, hash = 0;
  uint64_t left = static_cast<uint64_t>(end);  // bytes not read yet
  auto u64 = [&](uint64_t* v) {
    if (left < sizeof *v || !in.read(reinterpret_cast<char*>(v), sizeof *v)) return false;
    left -= sizeof *v;
    return true;
  };
  if (!u64(&format) || format != kCacheFormat)
    return *damaged = "not a kiln neuron cache entry of this version", std::nullopt;
  // A size larger than what is left of the file is a cut (or a changed header): refused before a
  // buffer of that size is made.
  if (!u64(&n) || n > left) return *damaged = "cut short", std::nullopt;
  std::string text(static_cast<size_t>(n), '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(n))) return *damaged = "cut short", std::nullopt;
  left -= n;
  if (text != module) return std::nullopt;  // another module with the same key: a miss
  if (!u64(&size) || !u64(&hash)) return *damaged = "cut short", std::nullopt;
  if (size != left) return *damaged = size > left ? "cut short" : "longer than its header says", std::nullopt;
  std::string bytes(static_cast<size_t>(size), '\0');
  if (!in.read(bytes.data(), static_cast<std::streamsize>(size))) return *damaged = "cut short", std::nullopt;
  if (fnv1a64(bytes) != hash) return *damaged = "its bytes changed", std::nullopt;
  return bytes;
}

bool write_cache_entry(const std::string& file, const std::string& module, const std::string& bytes) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(file).parent_path(), ec);
  // A name of its own for each write, in this process and across processes: two writers of the same
  // entry (two contexts, two threads) must not write into one temporary file.
  static std::atomic<uint64_t> writes{0};
  const std::string tmp = file + ".tmp" + std::to_string(::getpid()) + "." + std::to_string(writes++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    const uint64_t header[2] = {kCacheFormat, module.size()}, tail[2] = {bytes.size(), fnv1a64(bytes)};
    out.write(reinterpret_cast<const char*>(header), sizeof header);
    out.write(module.data(), static_cast<std::streamsize>(module.size()));
    out.write(reinterpret_cast<const char*>(tail), sizeof tail);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) return std::filesystem::remove(tmp, ec), false;
  }
  std::filesystem::rename(tmp, file, ec);
  if (ec) std::filesystem::remove(tmp, ec);
  return !ec;
}

}  // namespace kiln::neuron
