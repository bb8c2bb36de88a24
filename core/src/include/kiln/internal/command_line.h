// The command lines of the `kiln` tool and of its conformance suite, parsed with CLI11, so that
// every subcommand behaves alike: --help prints the command's usage on stdout and exits 0; a usage
// error (an unknown or misspelt option, a value that is not a number or is out of range, a missing
// value) is one line on stderr, "kiln <command>: <what> (see kiln <command> --help)", that names the
// flag and the value and, for a misspelt option, the nearest one; the command then exits 2.
// Header-only and internal: CLI11 is the tool's, never libkiln's nor a user program's.
#pragma once

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "kiln/config.h"  // nearest_name

namespace kiln::cli {

// CLI11's help, laid out as kiln's always was: the usage line the docs show ("usage: kiln probe
// [--json] ..."), the description, the options with their explanations aligned after the longest
// name, and the footer.
class HelpFormatter : public CLI::Formatter {
 public:
  explicit HelpFormatter(std::string usage) : usage_(std::move(usage)) {}

  std::string make_help(const CLI::App* app, std::string, CLI::AppFormatMode mode) const override {
    size_t width = 0;
    for (const CLI::Option* opt : app->get_options())
      width = std::max(width, 2 + make_option_name(opt, opt->get_positional()).size() + make_option_opts(opt).size());
    HelpFormatter aligned(*this);
    aligned.column_width(std::min<size_t>(width + 2, 24));
    std::string out = usage_ + "\n";
    if (!app->get_description().empty()) out += "\n" + app->get_description() + "\n";
    out += aligned.make_positionals(app) + aligned.make_groups(app, mode);
    if (!app->get_footer().empty()) out += "\n" + app->get_footer() + "\n";
    return out;
  }

 private:
  std::string usage_;
};

// A command line of kiln: `name` is how messages call it ("kiln probe"), `usage` its usage line,
// `description` what --help says below it. Options keep the last value given (--steps 4 --steps 8
// is 8), and arguments CLI11 does not know are left for parse_command_line to report.
inline void setup_command(CLI::App& app, const std::string& name, const std::string& usage,
                          const std::string& description) {
  app.name(name);
  app.description(description);
  app.formatter(std::make_shared<HelpFormatter>(usage));
  app.set_help_flag("-h,--help", "show this help and exit");
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.allow_extras();
}

// Says a usage error the way every kiln command does and returns its exit status, 2.
inline int usage_error(const CLI::App& app, const std::string& what) {
  std::fprintf(stderr, "%s: %s (see %s --help)\n", app.get_name().c_str(), what.c_str(), app.get_name().c_str());
  return 2;
}

// What is wrong with `arg`, an argument the command does not take: "unknown option '--kernel'; did
// you mean '--kernels'?" (`what` names it: "option", "argument"), or "unexpected argument 'x'".
inline std::string unknown_argument(const CLI::App& app, const std::string& arg, const std::string& what = "option") {
  if (arg.size() < 2 || arg[0] != '-') return "unexpected argument '" + arg + "'";
  std::string msg = "unknown " + what + " '" + arg + "'";
  const std::string bare = arg.substr(0, arg.find('=')).substr(arg[1] == '-' ? 2 : 1);
  std::vector<std::string> names;
  for (const CLI::Option* opt : app.get_options())
    for (const std::string& n : opt->get_lnames()) names.push_back(n);
  if (auto near = nearest_name(bare, names)) msg += "; did you mean '--" + *near + "'?";
  return msg;
}

// Parses argv (argv[0] is the command's own name) into `app`. Returns nothing when the command is
// to run, else its exit status: 0 after --help (printed on stdout), 2 after a usage error (said on
// stderr). `unknown` names what an unknown option is called in the message.
inline std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv,
                                             const std::string& unknown = "option") {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    return usage_error(app, e.what());
  }
  const std::vector<std::string> extra = app.remaining();
  if (!extra.empty()) return usage_error(app, unknown_argument(app, extra.front(), unknown));
  return std::nullopt;
}

// ---- Checked numbers ----
// Each is a CLI11 transform: it checks the text and rewrites it as plain decimal, so that CLI11's own
// conversion, which would read "010" as octal, sees what the user meant. A bad value is a usage
// error naming the flag and the value: "--steps: 'abc' is not an integer", "--steps: '2' must be at
// least 4".

// An integer of type T in [lo, hi], written in decimal.
template <typename T>
CLI::Validator integer(T lo = std::numeric_limits<T>::min(), T hi = std::numeric_limits<T>::max()) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        T v{};
        const char* end = text.data() + text.size();
        const auto [stop, ec] = std::from_chars(text.data(), end, v);
        const bool negative = !text.empty() && text[0] == '-';
        if (text.empty() || stop != end || ec == std::errc::invalid_argument)
          return "'" + text + "' is not " +
                 (negative && std::is_unsigned_v<T> ? "a non-negative integer" : "an integer");
        if ((ec == std::errc::result_out_of_range && negative) || (ec == std::errc() && v < lo))
          return "'" + text + "' must be at least " + std::to_string(lo);
        if (ec == std::errc::result_out_of_range || v > hi)
          return "'" + text + "' must be at most " + std::to_string(hi);
        text = std::to_string(v);
        return "";
      },
      "", "INTEGER");
}

// A finite number, at least `lo` (more than `lo` when `exclusive`).
inline CLI::Validator number(double lo, bool exclusive, const std::string& meaning) {
  return CLI::Validator(
      [lo, exclusive, meaning](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const double v = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
        if (text.empty() || *end || errno == ERANGE || !std::isfinite(v) || v < lo || (exclusive && v == lo))
          return "'" + text + "' is not " + meaning;
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.17g", v);
        text = buf;
        return "";
      },
      "", "NUMBER");
}
inline CLI::Validator non_negative_number() { return number(0.0, false, "a non-negative number"); }
inline CLI::Validator positive_number() { return number(0.0, true, "a positive number"); }

}  // namespace kiln::cli
