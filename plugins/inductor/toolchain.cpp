#include "toolchain.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

extern char** environ;

namespace kiln::inductor {

using plugin::Error;

std::string hash_hex(const std::string& data) {
  uint64_t a = 1469598103934665603ull, b = 0x84222325cbf29ce4ull ^ 0x9e3779b97f4a7c15ull;
  for (unsigned char c : data) {
    a = (a ^ c) * 1099511628211ull;
    b = (b ^ c) * 0x100000001b3ull;
    b ^= b >> 29;
  }
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b));
  return buf;
}

int run_process(const std::vector<std::string>& argv, std::string* output) {
  int fds[2];
  if (pipe(fds) != 0) throw Error(KILN_ERROR_INTERNAL, std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  posix_spawn_file_actions_addclose(&fa, fds[1]);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    if (output) *output = "cannot start '" + argv[0] + "': " + std::strerror(rc);
    return 127;
  }
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n > 0) out.append(buf, static_cast<size_t>(n));
    else if (n == 0 || errno != EINTR) break;
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (output) *output = out;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

namespace {

std::string compiler_version(const std::string& cxx) {
  static std::mutex mu;
  static std::map<std::string, std::string> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(cxx);
  if (it != cache.end()) return it->second;
  std::string out;
  const int rc = run_process({cxx, "--version"}, &out);
  std::string line = out.substr(0, out.find('\n'));
  if (rc != 0) line = "unknown (exit " + std::to_string(rc) + ")";
  cache[cxx] = line;
  return line;
}

std::string read_file(const std::string& path, bool* ok) {
  std::ifstream f(path, std::ios::binary);
  *ok = static_cast<bool>(f);
  if (!f) return "";
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string temp_name(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(counter++);
}

void mkdirs(const std::string& dir) {
  std::string cur;
  std::stringstream ss(dir);
  std::string part;
  if (!dir.empty() && dir[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
      throw Error(KILN_ERROR_UNAVAILABLE, "cannot create cache directory " + cur + ": " + std::strerror(errno));
  }
}

std::string manifest_of(const std::string& key, const std::string& bin) {
  return "kiln-inductor-cache 1\nkey " + key + "\nbytes " + std::to_string(bin.size()) + "\nhash " + hash_hex(bin) +
         "\n";
}

// Whether the entry's manifest matches its binary (base + ext: the .so, the .cubin); `why` says what
// is wrong. `bin` gets the binary's bytes.
bool entry_valid(const std::string& base, const std::string& ext, const std::string& key, std::string* why,
                 std::string* bin = nullptr) {
  bool ok = false;
  const std::string manifest = read_file(base + ".ok", &ok);
  if (!ok) {
    *why = "no manifest";
    return false;
  }
  bool bin_ok = false;
  const std::string so = read_file(base + ext, &bin_ok);
  if (!bin_ok) {
    *why = ext == ".so" ? "manifest without library" : "manifest without " + ext;
    return false;
  }
  if (manifest != manifest_of(key, so)) {
    *why = (ext == ".so" ? std::string("library") : ext) + " does not match its manifest (truncated or corrupt)";
    return false;
  }
  if (bin) *bin = so;
  return true;
}

}  // namespace

void write_atomic(const std::string& path, const std::string& data) {
  const std::string tmp = temp_name(path);
  {
    // POSIX calls, so that a full disk (ENOSPC, or EFBIG past a file size limit) is named; a
    // temporary file that could not be written whole is removed, never left behind.
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw Error(KILN_ERROR_UNAVAILABLE, "cannot write " + tmp + ": " + std::strerror(errno));
    size_t done = 0;
    int err = 0;
    while (done < data.size()) {
      const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        err = n < 0 ? errno : EIO;
        break;
      }
      done += static_cast<size_t>(n);
    }
    if (::close(fd) != 0 && err == 0) err = errno;
    if (err != 0) {
      std::remove(tmp.c_str());
      throw Error(KILN_ERROR_UNAVAILABLE, "cannot write " + tmp + ": " + std::strerror(err));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(KILN_ERROR_UNAVAILABLE, "cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
  }
}

std::string inductor_cache_dir(const std::string& cache_dir) {
  return (cache_dir.empty() ? std::string(".") : cache_dir) + "/inductor";
}

namespace {

// The temporary folders this process compiled into instead of an unwritable cache, removed when the
// plugin is unloaded (a static's destructor runs at dlclose and at exit; an atexit handler would
// outlive the library).
struct TemporaryRoots {
  std::mutex mu;
  std::map<std::string, std::string> by_root;  // the cache root asked for -> the folder used instead
  ~TemporaryRoots() {
    for (const auto& [root, tmp] : by_root) {
      std::error_code ec;
      std::filesystem::remove_all(tmp, ec);
    }
  }
};
TemporaryRoots& temporary_roots() {
  static TemporaryRoots t;
  return t;
}

}  // namespace

std::string usable_cache_root(const std::string& root, const plugin::Host& host) {
  auto& t = temporary_roots();
  std::lock_guard<std::mutex> lock(t.mu);
  if (auto it = t.by_root.find(root); it != t.by_root.end()) return it->second;
  std::string why;
  try {
    mkdirs(root);
    // Creating the folder is not enough: a read-only file system, a folder of another user or a
    // full disk refuse the files. A small file written and removed tells.
    const std::string probe = root + "/.kiln-writable";
    write_atomic(probe, "kiln\n");
    std::remove(probe.c_str());
    return root;
  } catch (const Error& e) {
    why = e.what();
  }
  const char* tmpdir = std::getenv("TMPDIR");
  std::string pattern = std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/kiln-inductor-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    host.warn("the compile cache directory " + root + " is not writable (" + why +
              ") and no temporary folder could be made either (" + std::strerror(errno) + ")");
    return root;  // compiling there fails with its own message, and the group runs eagerly
  }
  host.warn("the compile cache directory " + root + " is not writable (" + why + "): this process compiles into " +
            pattern +
            " and removes it at exit, so nothing is kept for the next run; point runtime.cache_dir "
            "(KILN_CACHE_DIR) at a writable folder to keep compiled kernels");
  t.by_root[root] = pattern;
  return pattern;
}

Toolchain make_toolchain(const std::string& cxx, const std::vector<std::string>& extra_flags) {
  Toolchain tc;
  if (!cxx.empty()) tc.cxx = cxx;
  tc.flags = {"-O2",
              "-std=c++17",
              "-shared",
              "-fPIC",
              "-fopenmp",
              "-fno-math-errno",
              "-fno-trapping-math",
              "-fno-semantic-interposition",
              "-w"};
  __builtin_cpu_init();
  std::string feats;
  auto add = [&](const char* f, std::initializer_list<const char*> flags) {
    feats += std::string(feats.empty() ? "" : ",") + f;
    for (auto fl : flags) tc.flags.push_back(fl);
  };
  if (__builtin_cpu_supports("avx2")) add("avx2", {"-mavx2"});
  if (__builtin_cpu_supports("fma")) add("fma", {"-mfma"});
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    add("avx512", {"-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mprefer-vector-width=512"});
  tc.cpu_features = feats.empty() ? "baseline" : feats;
  for (const auto& f : extra_flags) tc.flags.push_back(f);
  tc.version = compiler_version(tc.cxx);
  return tc;
}

namespace {

// The OpenMP runtime a generated library brought into the process stays for the process's life
// (RTLD_NODELETE on the copy already loaded): its thread pool and per-thread state belong to no one
// library, and unloading it with the last library would pull the code from under its parked
// worker threads and drop what it allocated (kernels call into it at every run, even on one thread).
void pin_openmp_runtime() {
  static std::atomic<bool> pinned{false};
  if (pinned.load(std::memory_order_acquire)) return;
  for (const char* rt : {"libgomp.so.1", "libomp.so.5", "libomp.so", "libiomp5.so"})
    if (dlopen(rt, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE)) pinned.store(true, std::memory_order_release);
}

}  // namespace

Library::~Library() {
  if (handle_) dlclose(handle_);
}

void* Library::symbol(const std::string& name) const {
  void* s = dlsym(handle_, name.c_str());
  if (!s) throw Error(KILN_ERROR_INTERNAL, "generated library has no symbol " + name);
  return s;
}

namespace {

// One build of a cache entry at a time in this process: groups compiling at once that generate the
// same source (a model's identical layers) wait for the first build and then find it in the cache.
// Between processes the temporary names and renames keep entries whole (write_atomic).
std::mutex& entry_mutex(const std::string& base) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<std::mutex>> per_entry;
  std::lock_guard<std::mutex> lock(mu);
  auto& m = per_entry[base];
  if (!m) m = std::make_unique<std::mutex>();
  return *m;
}

}  // namespace

namespace {
std::string cpu_key(const std::string& source, const Toolchain& tc) {
  std::string fingerprint = "kiln-inductor 1\n" + tc.cxx + "\n" + tc.version + "\n" + tc.cpu_features + "\n";
  for (const auto& f : tc.flags) fingerprint += f + " ";
  return hash_hex(fingerprint + "\n" + source);
}
}  // namespace

bool cache_has(const std::string& source, const Toolchain& tc, const std::string& cache_root) {
  const std::string key = cpu_key(source, tc);
  const std::string base = cache_root + "/" + key;
  std::lock_guard<std::mutex> building(entry_mutex(base));
  std::string why;
  return entry_valid(base, ".so", key, &why);
}

std::shared_ptr<Library> compile_cached(const std::string& source, const Toolchain& tc, const std::string& cache_root,
                                        const plugin::Host& host, std::string* key_out, CacheStats* stats) {
  const std::string key = cpu_key(source, tc);
  if (key_out) *key_out = key;
  mkdirs(cache_root);
  const std::string base = cache_root + "/" + key;
  std::unique_lock<std::mutex> building(entry_mutex(base));
  std::string why;
  bool valid = entry_valid(base, ".so", key, &why);
  struct stat st;
  if (!valid && (stat((base + ".so").c_str(), &st) == 0 || stat((base + ".ok").c_str(), &st) == 0))
    host.warn("compile cache entry " + base + ".so is not usable (" + why + "); rebuilding it");
  if (stats) stats->hit = valid;
  if (!valid) {
    const auto t0 = std::chrono::steady_clock::now();
    // The source under its final name, so two processes compiling it produce identical bytes.
    write_atomic(base + ".cpp", source);
    const std::string tmp_so = temp_name(base + ".so");
    std::vector<std::string> argv = {tc.cxx};
    for (const auto& f : tc.flags) argv.push_back(f);
    argv.push_back(base + ".cpp");
    argv.push_back("-o");
    argv.push_back(tmp_so);
    std::string out;
    const int rc = run_process(argv, &out);
    if (rc != 0) {
      std::remove(tmp_so.c_str());
      if (out.size() > 4000) out = out.substr(0, 4000) + "\n[... truncated]";
      throw Error(KILN_ERROR_INTERNAL,
                  "the C++ compiler failed (" + tc.cxx + ", exit status " + std::to_string(rc) +
                      ") on generated source " + base + ".cpp" +
                      (out.find_first_not_of(" \t\n") == std::string::npos ? " (it printed nothing)" : ":\n" + out));
    }
    bool ok = false;
    const std::string so = read_file(tmp_so, &ok);
    if (!ok) throw Error(KILN_ERROR_INTERNAL, "the compiler wrote no library at " + tmp_so);
    if (std::rename(tmp_so.c_str(), (base + ".so").c_str()) != 0) {
      std::remove(tmp_so.c_str());
      throw Error(KILN_ERROR_UNAVAILABLE, "cannot move " + tmp_so + " into the cache: " + std::strerror(errno));
    }
    write_atomic(base + ".ok", manifest_of(key, so));
    if (stats) stats->compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  building.unlock();
  void* h = dlopen((base + ".so").c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    throw Error(KILN_ERROR_INTERNAL, "cannot load " + base + ".so: " + (e ? e : "unknown dlopen error"));
  }
  pin_openmp_runtime();
  return std::make_shared<Library>(h);
}

std::string cubin_cached(const std::string& source, const Nvrtc& nvrtc, int arch, const std::string& cache_root,
                         const plugin::Host& host, std::string* key_out, CacheStats* stats) {
  std::string fingerprint = "kiln-inductor-cuda 1\nnvrtc " + nvrtc.version() + "\nsm_" + std::to_string(arch) + "\n";
  for (const auto& o : Nvrtc::base_options(arch)) fingerprint += o + " ";
  const std::string key = hash_hex(fingerprint + "\n" + source);
  if (key_out) *key_out = key;
  mkdirs(cache_root);
  const std::string base = cache_root + "/" + key;
  std::lock_guard<std::mutex> building(entry_mutex(base));
  std::string why, cubin;
  const bool valid = entry_valid(base, ".cubin", key, &why, &cubin);
  struct stat st;
  if (!valid && (stat((base + ".cubin").c_str(), &st) == 0 || stat((base + ".ok").c_str(), &st) == 0))
    host.warn("compile cache entry " + base + ".cubin is not usable (" + why + "); rebuilding it");
  if (stats) stats->hit = valid;
  if (valid) return cubin;
  const auto t0 = std::chrono::steady_clock::now();
  // The source under its final name first, for reading and for NVRTC's messages.
  write_atomic(base + ".cu", source);
  cubin = nvrtc.compile(source, arch, base + ".cu");
  write_atomic(base + ".cubin", cubin);
  write_atomic(base + ".ok", manifest_of(key, cubin));
  if (stats) stats->compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return cubin;
}

bool read_tune(const std::string& path, std::vector<std::pair<int, int>>* winners, size_t kernels) {
  bool ok = false;
  const std::string text = read_file(path, &ok);
  if (!ok) return false;
  std::istringstream ss(text);
  std::string magic;
  std::getline(ss, magic);
  if (magic != "kiln-inductor-tune 1") return false;
  std::vector<std::pair<int, int>> w(kernels, {0, 0});
  std::vector<char> seen(kernels, 0);
  int k, v, t;
  while (ss >> k >> v >> t) {
    if (k < 0 || static_cast<size_t>(k) >= kernels || v < 0 || t < 1) return false;
    w[static_cast<size_t>(k)] = {v, t};
    seen[static_cast<size_t>(k)] = 1;
  }
  for (char s : seen)
    if (!s) return false;
  *winners = std::move(w);
  return true;
}

void write_tune(const std::string& path, const std::vector<std::pair<int, int>>& winners) {
  std::string text = "kiln-inductor-tune 1\n";
  for (size_t k = 0; k < winners.size(); ++k)
    text += std::to_string(k) + " " + std::to_string(winners[k].first) + " " + std::to_string(winners[k].second) + "\n";
  write_atomic(path, text);
}

}  // namespace kiln::inductor
