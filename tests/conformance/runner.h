// The conformance runner: runs every selected case in its own process (this program re-executed
// with --case NAME), so that a plugin that crashes, hangs or corrupts memory costs one case, not
// the suite. A watchdog kills a case (and every process it started) past its time limit. The
// runner never loads the plugin itself.
//
// Each case process appends its trail to a result file (harness.h: progress, note; the listener
// in main.cpp: failures, skip reason, result); the runner reads it back, prints the table and
// writes the JSON report.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace kiln::conformance {

enum class Outcome { passed, failed, skipped, crashed, hung };
const char* to_string(Outcome o);

struct CaseReport {
  std::string name;
  Outcome outcome = Outcome::passed;
  double seconds = 0;
  std::string message;               // one line for the table
  std::vector<std::string> details;  // every failure, note and the last progress
};

struct RunnerOptions {
  std::string plugin;
  std::string json;          // "" = no JSON
  std::string filter = "*";  // gtest-style: POS[:POS...][-NEG[:NEG...]]
  std::string device = "cpu";
  double timeout_s = 120;  // per case; Workload.* cases get 4x
  int jobs = 1;
  unsigned long long seed = 0;  // 0 = random
  int steps = 3;                // whole-step cases: steps compared
  std::string log_dir;          // "" = a temporary directory, removed unless a case did not pass
  bool list_only = false;
};

// Parses `kiln conformance` arguments (argv[0] is the command name) into `out`. Returns nothing
// when the suite is to run, else the exit status: 0 after --help (printed), 2 after a usage error
// (said on stderr).
std::optional<int> parse_runner_args(int argc, char** argv, RunnerOptions& out);

// Whether `name` ("Suite.Case") passes a gtest-style filter.
bool filter_matches(const std::string& filter, const std::string& name);

// Runs the cases (all registered gtest cases matching the filter) and prints the table; returns
// the exit code: 0 when nothing failed, crashed or hung, 1 otherwise, 2 for a setup error.
int run_suite(const RunnerOptions& options, const std::vector<std::string>& cases);

}  // namespace kiln::conformance
