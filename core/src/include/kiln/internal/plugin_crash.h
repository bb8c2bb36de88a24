// Naming the plugin a fatal signal came from. A plugin runs in kiln's process, so a crash inside it
// (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) ends the process; what kiln can do is say whose it was.
// Every call into a plugin is made inside a PluginCallScope, which marks the thread as running that
// plugin's code; the first scope installs a handler for those signals that, on a thread inside a
// scope, prints one line to stderr naming the plugin, its file, the call and, when known, the
// partition group and the training step, and then hands the signal on unchanged: to the handler
// that was installed before kiln's, or to the default action (a core dump, a debugger's stop).
//
// A signal on a thread that is in no scope while a plugin call runs on another thread (a plugin's
// own worker threads: OpenMP, a runtime's) names that call too, as the likely culprit. Outside
// plugin calls the handler only hands the signal on, so programs see what they saw before.
// The scopes cost two thread-local stores; nothing is allocated or formatted until a signal comes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln {

// What the thread is running, as the handler reads it. Strings are borrowed from the plugin object,
// which outlives every call into it, or are literals.
struct PluginCallSite {
  const char* plugin = "";
  const char* path = "";
  const char* call = "";
  int64_t group = -1;  // partition group, -1: none
  int64_t step = 0;    // training step, 0: none
  const PluginCallSite* outer = nullptr;
};

// Marks the thread as inside `call` of a plugin while it lives. Scopes nest (a host service a plugin
// calls back may call another plugin): the innermost names the crash.
class PluginCallScope {
 public:
  PluginCallScope(const char* plugin, const char* path, const char* call);
  ~PluginCallScope();
  PluginCallScope(const PluginCallScope&) = delete;
  PluginCallScope& operator=(const PluginCallScope&) = delete;

 private:
  PluginCallSite site_;
};

// The partition group whose executable the thread is compiling or running (-1: none), for the
// crash line. Restores the previous value when it ends.
class PluginGroupScope {
 public:
  explicit PluginGroupScope(int64_t group);
  ~PluginGroupScope();
  PluginGroupScope(const PluginGroupScope&) = delete;
  PluginGroupScope& operator=(const PluginGroupScope&) = delete;

 private:
  int64_t saved_;
};

// The training step (1 for the first) the thread is running (0: none), for the crash line.
class PluginStepScope {
 public:
  explicit PluginStepScope(int64_t step);
  ~PluginStepScope();
  PluginStepScope(const PluginStepScope&) = delete;
  PluginStepScope& operator=(const PluginStepScope&) = delete;

 private:
  int64_t saved_;
};

// This thread's PluginStepScope value (0: none), to carry into threads that compile for the step.
int64_t current_plugin_step();

// Installs the handler now (PluginCallScope does it on first use). Idempotent.
void install_plugin_crash_handler();

// The line the handler prints for `signal` on a thread inside `site` (own_thread), or on another
// thread while `site` runs, written into `buffer` (NUL-terminated, cut to fit); its length.
// Async-signal safe; public for tests.
size_t format_plugin_crash(char* buffer, size_t capacity, int signal, const PluginCallSite& site,
                           bool own_thread = true);

}  // namespace kiln
