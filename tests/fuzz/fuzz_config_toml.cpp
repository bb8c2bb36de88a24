// libFuzzer target: kiln's TOML configuration (TrainingArguments::from_toml_string, what a
// training program's `--config` file and `kiln` read). Any input must either give settings that
// validate() accepts or throw ConfigError (a bad file is reported with its line and key) - never
// crash, overrun, hang or throw anything else (which libFuzzer reports as a crash). What is
// accepted must be stable: reading the same text again gives the same settings, by key and origin.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kiln/config.h"

namespace {

// The settings a text made, as "key=line:column" for every key it set.
std::string fingerprint(const kiln::TrainingArguments& a) {
  std::string s = a.torch_compile_backend + "|" + a.torch_compile_mode + "|" + std::to_string(a.max_steps) + "|";
  for (const auto& [key, origin] : a.origins) s += key + "=" + origin.describe() + ";";
  for (const auto& [plugin, opts] : a.plugin_options)
    for (const auto& [k, v] : opts) s += plugin + "." + k + "=" + v + ";";
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 1 << 14) return 0;  // configuration files are short; long inputs only slow the search
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::string first;
  try {
    const auto a = kiln::TrainingArguments::from_toml_string(text, "fuzz.toml");
    a.validate();
    first = fingerprint(a);
  } catch (const kiln::ConfigError& e) {
    if (std::getenv("KILN_FUZZ_VERBOSE")) std::fprintf(stderr, "ConfigError: %s\n", e.what());
    return 0;
  }
  if (std::getenv("KILN_FUZZ_VERBOSE")) std::fprintf(stderr, "accepted: %s\n", first.c_str());
  std::string second;
  try {
    second = fingerprint(kiln::TrainingArguments::from_toml_string(text, "fuzz.toml"));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "accepted once, refused the second time: %s\n", e.what());
    std::abort();
  }
  if (second != first) {
    std::fprintf(stderr, "the same text read twice gave different settings:\n%s\n%s\n", first.c_str(), second.c_str());
    std::abort();
  }
  return 0;
}
