// The fatal-signal handler that names the plugin a crash came from (plugin_crash.h). Everything the
// handler does is async-signal safe: thread-local reads, formatting into a stack buffer, write(2),
// sigaction and raise.
#include "kiln/internal/plugin_crash.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>

namespace kiln {

namespace {

thread_local const PluginCallSite* t_site = nullptr;  // innermost call on this thread
thread_local int64_t t_group = -1;
thread_local int64_t t_step = 0;

// The latest plugin call entered on any thread, for a signal on a thread that is in none, and how
// many calls are running. The strings outlive the calls (see PluginCallSite).
std::atomic<const char*> g_plugin{""}, g_path{""}, g_call{""};
std::atomic<int64_t> g_group{-1}, g_step{0};
std::atomic<int> g_active{0};

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
struct sigaction g_previous[NSIG];  // what was installed before kiln's handler, by signal
std::once_flag g_installed;

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV (Segmentation fault)";
    case SIGBUS: return "SIGBUS (Bus error)";
    case SIGILL: return "SIGILL (Illegal instruction)";
    case SIGFPE: return "SIGFPE (Floating-point exception)";
    case SIGABRT: return "SIGABRT (Aborted)";
    default: return "a fatal signal";
  }
}

// Appends to a fixed buffer, cutting what does not fit.
struct Line {
  char* at;
  char* end;
  void add(const char* s) {
    while (*s && at < end) *at++ = *s++;
  }
  void add(int64_t v) {
    char digits[24];
    int n = 0;
    uint64_t u = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
    do digits[n++] = static_cast<char>('0' + u % 10), u /= 10;
    while (u && n < 24);
    if (v < 0) add("-");
    while (n && at < end) *at++ = digits[--n];
  }
};

// Hands the signal to whoever had it before kiln: a handler of the program's (or a sanitizer's) is
// called as it would have been; otherwise the previous action is put back and the signal comes
// again with it - at once for a signal that was sent (kill, raise, abort), or when the faulting
// instruction runs again after this handler returns.
void hand_on(int sig, siginfo_t* info, void* context) {
  const struct sigaction& prev = g_previous[sig];
  if (prev.sa_flags & SA_SIGINFO) {
    if (prev.sa_sigaction) {
      prev.sa_sigaction(sig, info, context);
      return;
    }
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
    return;
  }
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  if (!info || info->si_code <= 0 || sig == SIGABRT) raise(sig);
}

void on_fatal_signal(int sig, siginfo_t* info, void* context) {
  char buffer[1024];
  size_t n = 0;
  if (const PluginCallSite* site = t_site) {
    n = format_plugin_crash(buffer, sizeof buffer - 1, sig, *site);
  } else if (g_active.load(std::memory_order_relaxed) > 0) {
    PluginCallSite elsewhere;
    elsewhere.plugin = g_plugin.load(std::memory_order_relaxed);
    elsewhere.path = g_path.load(std::memory_order_relaxed);
    elsewhere.call = g_call.load(std::memory_order_relaxed);
    elsewhere.group = g_group.load(std::memory_order_relaxed);
    elsewhere.step = g_step.load(std::memory_order_relaxed);
    n = format_plugin_crash(buffer, sizeof buffer - 1, sig, elsewhere, false);
  }
  if (n) {
    buffer[n] = '\n';
    ssize_t w = write(STDERR_FILENO, buffer, n + 1);
    (void)w;
  }
  hand_on(sig, info, context);
}

}  // namespace

size_t format_plugin_crash(char* buffer, size_t capacity, int signal, const PluginCallSite& site, bool own_thread) {
  if (capacity == 0) return 0;
  Line l{buffer, buffer + capacity - 1};
  l.add("kiln: fatal signal ");
  l.add(signal_name(signal));
  l.add(own_thread ? " in plugin " : " on a thread kiln did not call the plugin from, while plugin ");
  if (*site.plugin) {  // not yet named while its init runs: the file names it
    l.add("'");
    l.add(site.plugin);
    l.add("' (");
    l.add(site.path);
    l.add(")");
  } else {
    l.add(site.path);
  }
  l.add(own_thread ? " during " : " ran ");
  l.add(site.call);
  if (site.group >= 0) {
    l.add(" of group ");
    l.add(site.group);
  }
  if (site.step > 0) {
    l.add(" at step ");
    l.add(site.step);
  }
  l.add(
      "; the process cannot continue: the crash is in the plugin's code, which runs in this process. "
      "Rerun with torch_compile_backend = \"eager\" or another backend, and report it to the plugin's vendor");
  *l.at = '\0';
  return static_cast<size_t>(l.at - buffer);
}

void install_plugin_crash_handler() {
  std::call_once(g_installed, [] {
    for (int sig : kSignals) {
      struct sigaction a {};
      a.sa_sigaction = on_fatal_signal;
      a.sa_flags = SA_SIGINFO | SA_ONSTACK;
      sigemptyset(&a.sa_mask);
      sigaction(sig, &a, &g_previous[sig]);
    }
  });
}

PluginCallScope::PluginCallScope(const char* plugin, const char* path, const char* call)
    : site_{plugin, path, call, t_group, t_step, t_site} {
  static const bool installed = (install_plugin_crash_handler(), true);
  (void)installed;
  t_site = &site_;
  g_plugin.store(plugin, std::memory_order_relaxed);
  g_path.store(path, std::memory_order_relaxed);
  g_call.store(call, std::memory_order_relaxed);
  g_group.store(site_.group, std::memory_order_relaxed);
  g_step.store(site_.step, std::memory_order_relaxed);
  g_active.fetch_add(1, std::memory_order_relaxed);
}

PluginCallScope::~PluginCallScope() {
  g_active.fetch_sub(1, std::memory_order_relaxed);
  t_site = site_.outer;
}

PluginGroupScope::PluginGroupScope(int64_t group) : saved_(t_group) { t_group = group; }
PluginGroupScope::~PluginGroupScope() { t_group = saved_; }

int64_t current_plugin_step() { return t_step; }

PluginStepScope::PluginStepScope(int64_t step) : saved_(t_step) { t_step = step; }
PluginStepScope::~PluginStepScope() { t_step = saved_; }

}  // namespace kiln
