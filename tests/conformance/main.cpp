// kiln_conformance: the plugin conformance suite (`kiln conformance PLUGIN.so` runs it).
//
// Two roles in one program. Without --case it is the runner (runner.h): it lists the cases and
// runs each in a fresh process of itself. With --case NAME it is that process: GoogleTest runs the
// one case, and a listener writes its failures, skip reason and result to the result file.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "harness.h"
#include "runner.h"

namespace {

using namespace kiln::conformance;

class ResultWriter : public ::testing::EmptyTestEventListener {
 public:
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.skipped()) {
      std::string m = r.message();
      if (m.rfind("Skipped\n", 0) == 0) m.erase(0, 8);
      else if (m == "Skipped") m.clear();
      append_result_line("skip", m);
    } else if (r.failed()) {
      std::string where = r.file_name() ? std::string(r.file_name()) : "";
      where = where.substr(where.find_last_of('/') + 1);
      // The location goes on the message's last non-blank line, the one the report shows.
      std::string m = r.message();
      m.erase(m.find_last_not_of(" \t\n") + 1);
      append_result_line("failure",
                         m + (where.empty() ? "" : " [" + where + ":" + std::to_string(r.line_number()) + "]"));
    }
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const auto* r = info.result();
    append_result_line("result", r->Skipped() ? "skipped" : r->Failed() ? "failed" : "passed");
  }
};

std::vector<std::string> all_cases() {
  std::vector<std::string> out;
  auto* u = ::testing::UnitTest::GetInstance();
  for (int i = 0; i < u->total_test_suite_count(); ++i) {
    const auto* s = u->GetTestSuite(i);
    for (int j = 0; j < s->total_test_count(); ++j)
      out.push_back(std::string(s->name()) + "." + s->GetTestInfo(j)->name());
  }
  return out;
}

int run_case(const std::string& name) {
  const char* seed = std::getenv("KILN_CONFORMANCE_SEED");
  at::manual_seed(seed ? std::strtoull(seed, nullptr, 10) : 1);
  std::string filter = "--gtest_filter=" + name;
  std::vector<char*> args = {const_cast<char*>("kiln_conformance"), filter.data(), nullptr};
  int argc = 2;
  ::testing::InitGoogleTest(&argc, args.data());
  ::testing::UnitTest::GetInstance()->listeners().Append(new ResultWriter);
  return RUN_ALL_TESTS();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--case") == 0) return run_case(argv[2]);

  RunnerOptions options;
  if (auto status = parse_runner_args(argc, argv, options)) return *status;
  int one = 1;
  char* prog[] = {argv[0], nullptr};
  ::testing::InitGoogleTest(&one, prog);
  std::vector<std::string> cases;
  for (const auto& c : all_cases())
    if (filter_matches(options.filter, c)) cases.push_back(c);
  if (options.list_only) {
    for (const auto& c : cases) std::printf("%s\n", c.c_str());
    return 0;
  }
  if (cases.empty()) {
    std::fprintf(stderr, "kiln conformance: no case matches --filter '%s' (see --list)\n", options.filter.c_str());
    return 2;
  }
  return run_suite(options, cases);
}
