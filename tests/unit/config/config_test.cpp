// Configuration: TOML loading, environment overrides, Hugging Face semantics, and the exact
// error every bad file must give (file, line, column, key).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "kiln/config.h"
#include "kiln/json_text.h"

namespace fs = std::filesystem;
using kiln::ConfigError;
using kiln::TrainingArguments;

namespace {

// Clears the KILN_* variables for the duration of a test, restoring nothing: tests set what they need.
class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : {"KILN_BACKEND", "KILN_MODE", "KILN_PLUGIN_PATH", "KILN_CACHE_DIR", "KILN_LOG_LEVEL"})
      unsetenv(v);
    dir_ = fs::temp_directory_path() / ("kiln_config_test_" + std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    auto p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  fs::path dir_;
};

std::string error_of(const std::string& path) {
  try {
    TrainingArguments::from_toml(path);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_F(ConfigTest, DefaultsMatchHuggingFace) {
  TrainingArguments a;
  EXPECT_FALSE(a.torch_compile);
  EXPECT_FALSE(a.compile_enabled());
  EXPECT_EQ(a.torch_compile_backend, "auto");
  EXPECT_EQ(a.torch_compile_mode, "default");
  EXPECT_FALSE(a.fullgraph);
  EXPECT_EQ(a.recompile_limit, 8);
  EXPECT_TRUE(a.plugin_dirs.empty());
  setenv("HOME", "/home/someone", 1);
  unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(TrainingArguments::default_cache_dir(), "/home/someone/.cache/kiln");
}

TEST_F(ConfigTest, LoadsEveryKeyFromToml) {
  auto path = write("train.toml", R"([compile]
torch_compile = true
torch_compile_backend = "inductor"
torch_compile_mode = "max-autotune"
fullgraph = true
recompile_limit = 3
plugin_dirs = ["/opt/a", "/opt/b"]
cache_dir = "/tmp/kc"

[logging]
level = "debug"

[plugin.inductor]
threads = 16
simd = "avx512"
fast_math = false
ratio = 0.5
)");
  auto a = TrainingArguments::from_toml(path);
  EXPECT_TRUE(a.torch_compile);
  EXPECT_EQ(a.torch_compile_backend, "inductor");
  EXPECT_EQ(a.torch_compile_mode, "max-autotune");
  EXPECT_TRUE(a.fullgraph);
  EXPECT_EQ(a.recompile_limit, 3);
  EXPECT_EQ(a.plugin_dirs, (std::vector<std::string>{"/opt/a", "/opt/b"}));
  EXPECT_EQ(a.cache_dir, "/tmp/kc");
  EXPECT_EQ(a.log_level, "debug");
  EXPECT_EQ(a.plugin_options.at("inductor").at("threads"), "16");
  EXPECT_EQ(a.plugin_options.at("inductor").at("simd"), "avx512");
  EXPECT_EQ(a.plugin_options.at("inductor").at("fast_math"), "false");
  EXPECT_EQ(a.plugin_options.at("inductor").at("ratio"), "0.5");
  EXPECT_EQ(a.origins.at("torch_compile_mode").describe(), path + ":4:22");
}

TEST_F(ConfigTest, NamingABackendOrModeTurnsCompileOn) {
  auto a = TrainingArguments::from_toml_string("[compile]\ntorch_compile_mode = \"reduce-overhead\"\n", "m.toml");
  EXPECT_TRUE(a.torch_compile);
  auto b = TrainingArguments::from_toml_string("[compile]\ntorch_compile_backend = \"cudagraphs\"\n", "b.toml");
  EXPECT_TRUE(b.torch_compile);
  TrainingArguments c;
  c.torch_compile_backend = "ipex";  // set in code
  EXPECT_FALSE(c.torch_compile);
  EXPECT_TRUE(c.compile_enabled());
  setenv("KILN_MODE", "max-autotune-no-cudagraphs", 1);
  TrainingArguments d;
  d.apply_env();
  EXPECT_TRUE(d.torch_compile);
  EXPECT_EQ(d.torch_compile_mode, "max-autotune-no-cudagraphs");
}

TEST_F(ConfigTest, EnvironmentBeatsFileBeatsCode) {
  auto path = write("t.toml", "[compile]\ntorch_compile_backend = \"inductor\"\ncache_dir = \"/from/file\"\nplugin_dirs = [\"/file/dir\"]\n");
  TrainingArguments a;
  a.cache_dir = "/from/code";
  a.torch_compile_backend = "ipex";
  a.apply_toml(path);
  EXPECT_EQ(a.cache_dir, "/from/file");
  EXPECT_EQ(a.torch_compile_backend, "inductor");
  setenv("KILN_BACKEND", "cudagraphs", 1);
  setenv("KILN_CACHE_DIR", "/from/env", 1);
  setenv("KILN_PLUGIN_PATH", "/env/one:/env/two", 1);
  setenv("KILN_LOG_LEVEL", "warn", 1);
  a.apply_env();
  EXPECT_EQ(a.torch_compile_backend, "cudagraphs");
  EXPECT_EQ(a.cache_dir, "/from/env");
  EXPECT_EQ(a.plugin_dirs, (std::vector<std::string>{"/env/one", "/env/two", "/file/dir"}));
  EXPECT_EQ(a.log_level, "warn");
  EXPECT_EQ(a.origins.at("torch_compile_backend").describe(), "environment (KILN_BACKEND)");
}

TEST_F(ConfigTest, BadModeFromEnvironmentNamesTheVariable) {
  setenv("KILN_MODE", "fast", 1);
  TrainingArguments a;
  try {
    a.apply_env();
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "environment (KILN_MODE): unknown mode 'fast' Valid modes: default, "
                           "reduce-overhead, max-autotune, max-autotune-no-cudagraphs");
    EXPECT_EQ(e.key(), "KILN_MODE");
  }
}

TEST_F(ConfigTest, BadModeSetInCodeIsCaughtByValidate) {
  TrainingArguments a;
  a.torch_compile_mode = "max_autotune";
  try {
    a.validate();
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "code: unknown mode 'max_autotune'; did you mean 'max-autotune'? Valid modes: "
                           "default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs");
  }
}

TEST_F(ConfigTest, UnknownBackendIsCheckedAgainstPluginsFound) {
  auto path = write("b.toml", "[compile]\n  torch_compile_backend = \"inductr\"\n");
  auto a = TrainingArguments::from_toml(path);
  try {
    a.validate_backend({"inductor", "cudagraphs", "my_backend"});
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), path + ":2:27: unknown backend 'inductr'; did you mean 'inductor'? "
                                            "Backends found: inductor, cudagraphs, my_backend");
  }
  a.torch_compile_backend = "my_backend";
  EXPECT_NO_THROW(a.validate_backend({"inductor", "my_backend"}));
  a.torch_compile_backend = "auto";
  EXPECT_NO_THROW(a.validate_backend({}));
}

TEST_F(ConfigTest, MissingFileIsAnError) {
  EXPECT_EQ(error_of("/nonexistent/kiln.toml"), "/nonexistent/kiln.toml: cannot open the configuration file");
}

// Each bad file and the exact message it must give, after "<path>:".
struct BadFile {
  const char* file;
  const char* message;
};

class BadToml : public ::testing::TestWithParam<BadFile> {};

TEST_P(BadToml, GivesTheExactError) {
  for (const char* v : {"KILN_BACKEND", "KILN_MODE", "KILN_PLUGIN_PATH", "KILN_CACHE_DIR", "KILN_LOG_LEVEL"})
    unsetenv(v);
  const std::string path = std::string(KILN_BAD_TOML_DIR) + "/" + GetParam().file;
  ASSERT_TRUE(fs::exists(path)) << path;
  EXPECT_EQ(error_of(path), path + ":" + GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    Corpus, BadToml,
    ::testing::Values(
        BadFile{"unterminated_string.toml", "3:30: TOML syntax error: Error while parsing string: unescaped control characters other than TAB (U+0009) are explicitly prohibited"},
        BadFile{"unknown_key_typo.toml", "2:16: unknown key 'compile.torch_compil'; did you mean 'torch_compile'?"},
        BadFile{"wrong_type_bool.toml", "2:17: key 'compile.torch_compile' must be a boolean, not a string"},
        BadFile{"unknown_mode.toml", "2:22: unknown mode 'reduce_overhead'; did you mean 'reduce-overhead'? Valid modes: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs"},
        BadFile{"wrong_type_int.toml", "2:19: key 'compile.recompile_limit' must be an integer, not a float"},
        BadFile{"negative_recompile_limit.toml", "2:19: key 'compile.recompile_limit' must be between 0 and 1000000, got -1"},
        BadFile{"plugin_dirs_not_array.toml", "2:15: key 'compile.plugin_dirs' must be an array of strings, not a string"},
        BadFile{"plugin_dirs_bad_entry.toml", "2:22: every entry of 'compile.plugin_dirs' must be a string, not an integer"},
        BadFile{"unknown_table.toml", "1:1: unknown key 'compiler'; did you mean 'compile'?"},
        BadFile{"compile_not_table.toml", "1:11: key 'compile' must be a table, not an integer"},
        BadFile{"plugin_option_array.toml", "2:11: plugin option 'plugin.inductor.threads' must be a string, integer, float or boolean, not an array"},
        BadFile{"bad_log_level.toml", "2:9: unknown log level 'verbose'; valid levels: trace, debug, info, warn, error, critical, off"},
        BadFile{"duplicate_key.toml", "3:17: TOML syntax error: Error while parsing key-value pair: cannot redefine existing boolean 'torch_compile'"},
        BadFile{"empty_cache_dir.toml", "4:13: key 'compile.cache_dir' must not be empty"},
        BadFile{"logging_unknown_key.toml", "2:9: unknown key 'logging.levle'; did you mean 'level'?"}),
    [](const ::testing::TestParamInfo<BadFile>& info) {
      std::string n = info.param.file;
      return n.substr(0, n.find('.'));
    });

// The one JSON escaping rule of kiln's command line, reports and conformance runner.
TEST(JsonText, EscapesQuotesBackslashesAndEveryControlCharacter) {
  EXPECT_EQ(kiln::json_quote("plain"), "\"plain\"");
  EXPECT_EQ(kiln::json_escape("a\"b\\c"), "a\\\"b\\\\c");
  EXPECT_EQ(kiln::json_escape("\n\r\t\b\f"), "\\n\\r\\t\\b\\f");
  EXPECT_EQ(kiln::json_escape(std::string("\x01\x1f\x7f", 3)), "\\u0001\\u001f\\u007f");
  EXPECT_EQ(kiln::json_escape(std::string("nul\0end", 7)), "nul\\u0000end");
  EXPECT_EQ(kiln::json_escape("caf\xc3\xa9"), "caf\xc3\xa9");  // UTF-8 passes through
}
