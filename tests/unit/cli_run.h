// Running a command line in a test: its exit status, stdout and stderr (through a file of its own
// per call: ctest runs tests in parallel processes that share TempDir(), and a shared name let one
// test read another's stderr). Shared by the tests of kiln's command line tool.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace kiln::test {

struct CliRun {
  int status = -1;
  std::string out, err;
};

// `s` as one single-quoted shell word.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs `cmd` through the shell, stderr to a file named after `tag`, the process and the call.
inline CliRun run_command(const std::string& cmd, const std::string& tag) {
  static int calls = 0;
  const std::string err_file =
      ::testing::TempDir() + tag + "_stderr." + std::to_string(::getpid()) + "." + std::to_string(++calls) + ".txt";
  CliRun r;
  FILE* p = ::popen((cmd + " 2>" + shell_quote(err_file)).c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream e(err_file);
  std::stringstream ss;
  ss << e.rdbuf();
  r.err = ss.str();
  std::remove(err_file.c_str());
  return r;
}

}  // namespace kiln::test
