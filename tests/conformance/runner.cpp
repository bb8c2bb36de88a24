#include "runner.h"
#include "kiln/internal/elf_check.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "kiln/internal/command_line.h"
#include "kiln/internal/json_text.h"

namespace kiln::conformance {

namespace fs = std::filesystem;

const char* to_string(Outcome o) {
  switch (o) {
    case Outcome::passed: return "passed";
    case Outcome::failed: return "failed";
    case Outcome::skipped: return "skipped";
    case Outcome::crashed: return "crashed";
    case Outcome::hung: return "hung";
  }
  return "?";
}

std::optional<int> parse_runner_args(int argc, char** argv, RunnerOptions& o) {
  CLI::App app;
  cli::setup_command(
      app, "kiln conformance",
      "usage: kiln conformance PLUGIN.so [--json FILE] [--filter PATTERN] [--device cpu|cuda]\n"
      "                        [--timeout SECONDS] [--jobs N] [--seed N] [--steps N] [--log-dir DIR] [--list]",
      "Runs the plugin conformance suite against one backend plugin file. Every case runs in its own\n"
      "process; a crash or a hang is reported for that case and the suite goes on. Exit status: 0 when\n"
      "every case that applies passes, 1 when any failed, crashed or hung, 2 on a usage error.\n"
      "Matching numbers are not enough: a whole-step case (Workload.*) fails when none of the plugin's\n"
      "code ran (it declined every group it claimed) or a claimed group failed to compile.");
  app.footer(
      "The plugin's options come from KILN_PLUGIN_OPTIONS, as everywhere in kiln, e.g.\n"
      "  KILN_PLUGIN_OPTIONS=inductor.cuda=false kiln conformance libkiln_inductor.so --device cuda\n"
      "\n"
      "docs/conformance.md says what each case proves and how to read a failure.");
  app.add_option("plugin", o.plugin, "the backend plugin file to check")->type_name("PLUGIN.so");
  app.add_option("--json", o.json, "also write the report as JSON")->type_name("FILE");
  app.add_option("--filter", o.filter, "cases to run, gtest style: 'ABI.*:Numeric.Matmul-ABI.LoadUnload*'")
      ->type_name("PATTERN");
  app.add_option("--device", o.device, "the device the numeric and use cases compile for (default cpu)")
      ->type_name("KIND")
      ->check(CLI::IsMember({"cpu", "cuda"}).description(""));
  app.add_option("--timeout", o.timeout_s, "time limit per case (default 120; whole-step cases get 4x)")
      ->type_name("SECONDS")
      ->transform(cli::positive_number());
  app.add_option("--jobs", o.jobs, "cases run at once (default 1)")->type_name("N")->transform(cli::integer<int>(1));
  app.add_option("--seed", o.seed, "seed of the random inputs (default: a fresh one, printed)")
      ->type_name("N")
      ->transform(cli::integer<unsigned long long>());
  app.add_option("--steps", o.steps, "training steps the whole-step cases compare (default 3)")
      ->type_name("N")
      ->transform(cli::integer<int>(1));
  app.add_option("--log-dir", o.log_dir, "keep each case's output in DIR/<case>.log")->type_name("DIR");
  app.add_flag("--list", o.list_only, "list the cases and exit");
  if (auto status = cli::parse_command_line(app, argc, argv)) return status;
  if (o.plugin.empty() && !o.list_only) return cli::usage_error(app, "which plugin? give the path of its .so");
  return std::nullopt;
}

bool filter_matches(const std::string& filter, const std::string& name) {
  const size_t dash = filter.find('-');
  const std::string pos = dash == std::string::npos ? filter : filter.substr(0, dash);
  const std::string neg = dash == std::string::npos ? "" : filter.substr(dash + 1);
  auto any = [&](const std::string& list) {
    std::stringstream ss(list);
    std::string p;
    while (std::getline(ss, p, ':'))
      if (!p.empty() && ::fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
    return false;
  };
  return (pos.empty() || any(pos)) && !any(neg);
}

namespace {

std::string self_exe() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

std::string first_line(const std::string& s) {
  const size_t nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

// GoogleTest puts its own lines ("Value of: x", "Expected: ...") first and the case's message
// last: the last line says what went wrong.
std::string last_line(const std::string& s) {
  // An exception escaping a case: GoogleTest quotes its description, which starts the message.
  if (s.rfind("C++ exception with description", 0) == 0) return first_line(s);
  size_t end = s.find_last_not_of('\n');
  if (end == std::string::npos) return s;
  const size_t nl = s.rfind('\n', end);
  return s.substr(nl == std::string::npos ? 0 : nl + 1, end - (nl == std::string::npos ? 0 : nl + 1) + 1);
}

struct Running {
  size_t index;
  pid_t pid;
  std::chrono::steady_clock::time_point start;
  double limit;
  std::string result_file, log_file;
};

// Reads the case's trail and turns the process's end into a report.
CaseReport finish(const std::string& name, const Running& r, int status, bool timed_out, double seconds) {
  CaseReport rep;
  rep.name = name;
  rep.seconds = seconds;
  std::ifstream in(r.result_file);
  std::string line, result, last_progress, skip;
  std::vector<std::string> failures, notes;
  while (std::getline(in, line)) {
    // A line cut short (the case was killed while writing it) is not JSON: it is skipped.
    const Json entry = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!entry.is_object() || !entry.value("kind", Json()).is_string() || !entry.value("text", Json()).is_string())
      continue;
    const auto kind = entry["kind"].get<std::string>(), text = entry["text"].get<std::string>();
    if (kind == "progress") last_progress = text;
    else if (kind == "note") notes.push_back(text);
    else if (kind == "failure") failures.push_back(text);
    else if (kind == "skip") skip = text;
    else if (kind == "result") result = text;
  }
  for (const auto& n : notes) rep.details.push_back("note: " + n);
  for (const auto& f : failures) rep.details.push_back("failure: " + f);
  const std::string during = last_progress.empty() ? "" : " during: " + last_progress;
  if (timed_out) {
    rep.outcome = Outcome::hung;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.0f", r.limit);
    rep.message = std::string("no result within ") + buf + " s; killed" + during;
  } else if (WIFSIGNALED(status)) {
    rep.outcome = Outcome::crashed;
    const int sig = WTERMSIG(status);
    const char* sname = sigabbrev_np(sig);
    rep.message = std::string("killed by SIG") + (sname ? sname : std::to_string(sig).c_str()) + " (" + strsignal(sig) +
                  ")" + during;
  } else if (result.empty()) {
    rep.outcome = Outcome::crashed;
    rep.message = "exited with status " + std::to_string(WEXITSTATUS(status)) + " before reporting a result" + during;
  } else if (result == "skipped") {
    rep.outcome = Outcome::skipped;
    rep.message = first_line(skip);
    if (!skip.empty()) rep.details.push_back("skipped: " + skip);
  } else if (result == "failed" || WEXITSTATUS(status) != 0) {
    rep.outcome = Outcome::failed;
    rep.message = failures.empty() ? "failed" : last_line(failures.front());
    if (failures.size() > 1) rep.message += " (+" + std::to_string(failures.size() - 1) + " more)";
  } else {
    rep.outcome = Outcome::passed;
    rep.message = notes.empty() ? "" : first_line(notes.back());
  }
  if (!last_progress.empty() && rep.outcome != Outcome::passed && rep.outcome != Outcome::skipped)
    rep.details.push_back("last progress: " + last_progress);
  rep.details.push_back("log: " + r.log_file);
  return rep;
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fs", s);
  return buf;
}

}  // namespace

int run_suite(const RunnerOptions& o, const std::vector<std::string>& cases) {
  if (!fs::exists(o.plugin)) {
    std::fprintf(stderr, "kiln conformance: %s: no such file\n", o.plugin.c_str());
    return 2;
  }
  // A file no case could load (a library cut short, another machine's, not a library at all):
  // said once, before any case runs.
  if (std::string why = kiln::elf_precheck(o.plugin); !why.empty()) {
    std::fprintf(stderr, "kiln conformance: %s: not a loadable library: %s\n", o.plugin.c_str(), why.c_str());
    return 2;
  }
  const std::string exe = self_exe();
  const std::string plugin = fs::absolute(o.plugin).string();
  unsigned long long seed = o.seed;
  if (seed == 0) seed = (static_cast<unsigned long long>(std::random_device{}()) << 20) ^ std::random_device{}();
  seed &= (1ull << 53) - 1;  // exact in JSON numbers
  if (seed == 0) seed = 1;

  bool temp_logs = o.log_dir.empty();
  std::string log_dir = o.log_dir;
  if (temp_logs) {
    std::string tmpl = (fs::temp_directory_path() / "kiln-conformance-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) {
      std::fprintf(stderr, "kiln conformance: cannot make a temporary directory\n");
      return 2;
    }
    log_dir = tmpl;
  } else {
    fs::create_directories(log_dir);
  }

  std::printf("kiln conformance: %s\n  device %s, seed %llu, %zu cases, %d at a time, %.0f s limit per case\n\n",
              plugin.c_str(), o.device.c_str(), seed, cases.size(), o.jobs, o.timeout_s);
  std::fflush(stdout);

  std::vector<CaseReport> reports(cases.size());
  std::vector<Running> running;
  size_t next = 0, done = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (done < cases.size()) {
    while (running.size() < static_cast<size_t>(o.jobs) && next < cases.size()) {
      Running r;
      r.index = next++;
      const std::string& name = cases[r.index];
      r.result_file = log_dir + "/" + name + ".result";
      r.log_file = log_dir + "/" + name + ".log";
      r.limit = name.rfind("Workload.", 0) == 0 ? o.timeout_s * 4 : o.timeout_s;
      std::remove(r.result_file.c_str());
      r.start = std::chrono::steady_clock::now();
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::setpgid(0, 0);  // the watchdog kills the whole group (compilers the plugin started too)
        const int fd = ::open(r.log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
          ::dup2(fd, 1);
          ::dup2(fd, 2);
          ::close(fd);
        }
        ::setenv("KILN_CONFORMANCE_PLUGIN", plugin.c_str(), 1);
        ::setenv("KILN_CONFORMANCE_DEVICE", o.device.c_str(), 1);
        ::setenv("KILN_CONFORMANCE_RESULT", r.result_file.c_str(), 1);
        ::setenv("KILN_CONFORMANCE_SEED", std::to_string(seed).c_str(), 1);
        ::setenv("KILN_CONFORMANCE_STEPS", std::to_string(o.steps).c_str(), 1);
        std::string case_arg = name;
        char* args[] = {const_cast<char*>(exe.c_str()), const_cast<char*>("--case"), case_arg.data(), nullptr};
        ::execv(exe.c_str(), args);
        std::perror("execv");
        ::_exit(127);
      }
      if (pid < 0) {
        std::fprintf(stderr, "kiln conformance: fork failed: %s\n", std::strerror(errno));
        return 2;
      }
      ::setpgid(pid, pid);
      r.pid = pid;
      running.push_back(r);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    for (size_t k = 0; k < running.size();) {
      Running& r = running[k];
      int status = 0;
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - r.start).count();
      pid_t w = ::waitpid(r.pid, &status, WNOHANG);
      bool timed_out = false;
      if (w == 0 && elapsed > r.limit) {
        ::kill(-r.pid, SIGKILL);
        ::waitpid(r.pid, &status, 0);
        timed_out = true;
        w = r.pid;
      }
      if (w != r.pid) {
        ++k;
        continue;
      }
      ::kill(-r.pid, SIGKILL);  // anything the case left running in its group
      CaseReport rep = finish(cases[r.index], r, status, timed_out, elapsed);
      ++done;
      std::printf("[%3zu/%zu] %-52s %-8s %8s  %s\n", done, cases.size(), rep.name.c_str(), to_string(rep.outcome),
                  fmt_seconds(rep.seconds).c_str(), rep.message.c_str());
      std::fflush(stdout);
      reports[r.index] = std::move(rep);
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int counts[5] = {0, 0, 0, 0, 0};
  for (const auto& r : reports) ++counts[static_cast<int>(r.outcome)];

  std::printf("\n%-52s %-8s %8s  %s\n", "case", "result", "time", "message");
  for (const auto& r : reports)
    std::printf("%-52s %-8s %8s  %s\n", r.name.c_str(), to_string(r.outcome), fmt_seconds(r.seconds).c_str(),
                r.message.c_str());
  std::printf("\npassed %d, failed %d, skipped %d, crashed %d, hung %d (of %zu cases) in %.1f s\n", counts[0],
              counts[1], counts[2], counts[3], counts[4], reports.size(), total);
  bool bad = counts[1] + counts[3] + counts[4] > 0;
  if (bad) {
    std::printf("\nWhat went wrong:\n");
    for (const auto& r : reports) {
      if (r.outcome == Outcome::passed || r.outcome == Outcome::skipped) continue;
      std::printf("  %s (%s)\n", r.name.c_str(), to_string(r.outcome));
      for (const auto& d : r.details) std::printf("    %s\n", last_line(d).c_str());
    }
    if (temp_logs) std::printf("\nCase logs kept in %s\n", log_dir.c_str());
  }
  std::fflush(stdout);

  if (!o.json.empty()) {
    std::ofstream j(o.json);
    if (!j) {
      std::fprintf(stderr, "kiln conformance: cannot write %s\n", o.json.c_str());
      return 2;
    }
    Json cases = Json::array();
    for (const auto& r : reports)
      cases.push_back({{"name", r.name},
                       {"result", to_string(r.outcome)},
                       {"seconds", r.seconds},
                       {"message", r.message},
                       {"details", r.details}});
    const Json report = {{"plugin", plugin},     {"device", o.device},  {"seed", seed},
                         {"passed", counts[0]},  {"failed", counts[1]}, {"skipped", counts[2]},
                         {"crashed", counts[3]}, {"hung", counts[4]},   {"total", reports.size()},
                         {"seconds", total},     {"cases", cases}};
    j << json_text(report, 2) << "\n";
  }
  if (temp_logs && !bad) {
    std::error_code ec;
    fs::remove_all(log_dir, ec);
  }
  return bad ? 1 : 0;
}

}  // namespace kiln::conformance
