// Careful file-system reads for the probe: a sysfs tree may be fake, half-written or hostile
// (garbage, directories where files belong, FIFOs, symlink loops), and none of that may crash or
// hang the probe.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "probe_internal.h"

namespace kiln::hw::detail {

fs::path Tree::at(const std::string& rel) const {
  std::string r = rel;
  while (!r.empty() && r.front() == '/') r.erase(r.begin());
  return root / r;
}

std::string Tree::show(const fs::path& p) const {
  fs::path rel = p.lexically_relative(root);
  if (rel.empty() || rel.native().rfind("..", 0) == 0) return p.string();
  return "/" + rel.string();
}

void Tree::warn(std::string message) const {
  if (warnings) warnings->push_back(std::move(message));
}

std::optional<std::string> read_file(const fs::path& p, std::string* why, std::size_t max_bytes) {
  auto fail = [&](std::string reason) -> std::optional<std::string> {
    if (why) *why = std::move(reason);
    return std::nullopt;
  };
  // O_NONBLOCK: opening a FIFO for reading must not wait for a writer.
  int fd = ::open(p.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return fail("missing");
    return fail(std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return fail(std::strerror(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return fail("a directory, not a file");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail("not a regular file");
  }
  std::string out;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return fail(std::strerror(err));
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > max_bytes) {
      ::close(fd);
      return fail("larger than " + std::to_string(max_bytes) + " bytes");
    }
  }
  ::close(fd);
  return out;
}

std::optional<std::string> read_attr(const Tree& t, const fs::path& p) {
  std::string why;
  auto text = read_file(p, &why);
  if (!text && why != "missing") t.warn("cannot read " + t.show(p) + ": " + why);
  return text;
}

std::vector<std::string> list_dir(const fs::path& dir, std::string* why) {
  std::vector<std::string> names;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  if (ec) {
    if (why) *why = ec == std::errc::no_such_file_or_directory ? "missing" : ec.message();
    return names;
  }
  // A bound on entries keeps a pathological tree from taking forever.
  constexpr std::size_t kMaxEntries = 1u << 16;
  for (; it != end && names.size() < kMaxEntries; it.increment(ec)) {
    if (ec) break;
    names.push_back(it->path().filename().string());
  }
  if (ec && why) *why = ec.message();
  std::sort(names.begin(), names.end());
  return names;
}

bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec) && !ec;
}

std::optional<std::string> link_target_name(const fs::path& link) {
  std::error_code ec;
  fs::path target = fs::read_symlink(link, ec);
  if (ec || target.empty()) return std::nullopt;
  // "../../../bus/pci/drivers/habanalabs/" would give an empty filename; drop a trailing slash.
  std::string s = target.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  std::string name = fs::path(s).filename().string();
  if (name.empty() || name == "." || name == "..") return std::nullopt;
  return name;
}

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n\v\f";
  auto b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  auto e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

std::optional<uint32_t> parse_hex(const std::string& raw) {
  std::string s = trim(raw);
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s = s.substr(2);
  if (s.empty() || s.size() > 8) return std::nullopt;
  uint32_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return std::nullopt;
    v = v * 16 + static_cast<uint32_t>(d);
  }
  return v;
}

std::optional<int> parse_int(const std::string& raw) {
  std::string s = trim(raw);
  if (s.empty() || s.size() > 9) return std::nullopt;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::optional<uint64_t> parse_size(const std::string& raw) {
  std::string s = trim(raw);
  if (s.empty()) return std::nullopt;
  uint64_t mult = 1;
  char last = s.back();
  if (last == 'K' || last == 'k') mult = 1024ull;
  else if (last == 'M' || last == 'm') mult = 1024ull * 1024;
  else if (last == 'G' || last == 'g') mult = 1024ull * 1024 * 1024;
  if (mult != 1) s.pop_back();
  if (s.empty() || s.size() > 12) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v * mult;
}

std::string printable(const std::string& s, std::size_t max_chars) {
  std::string out;
  for (unsigned char c : s) {
    if (out.size() >= max_chars) {
      out += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f && c != '\'') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return "'" + out + "'";
}

std::string hex4(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%04x", v);
  return buf;
}

}  // namespace kiln::hw::detail
