// Configuration: TOML loading in the [runtime]/[debug]/[experimental] layout, the one rule of the
// environment overrides, Hugging Face semantics, the exact error every bad file must give (file,
// line, column, key), and that docs/config.md lists exactly the settings the code reads.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kiln/config.h"
#include "kiln/internal/json_text.h"

namespace fs = std::filesystem;
using kiln::ConfigError;
using kiln::TrainingArguments;

namespace {

// Every variable the settings read, so that the machine's environment cannot leak into a test.
void unset_kiln_environment() {
  for (const auto& s : kiln::settings())
    if (!s.env.empty()) unsetenv(s.env.c_str());
}

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unset_kiln_environment();
    dir_ = fs::temp_directory_path() / ("kiln_config_test_" + std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    unset_kiln_environment();
    fs::remove_all(dir_);
  }
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

std::string env_error() {
  TrainingArguments a;
  try {
    a.apply_env();
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
  EXPECT_EQ(a.max_grad_norm, 0.0);
  EXPECT_EQ(a.log_level, "info");
  // Trainer::train's settings: Hugging Face's defaults, output_dir apart ("" writes no file).
  EXPECT_EQ(a.output_dir, "");
  EXPECT_EQ(a.num_train_epochs, 3.0);
  EXPECT_EQ(a.max_steps, -1);
  EXPECT_EQ(a.per_device_train_batch_size, 8);
  EXPECT_EQ(a.gradient_accumulation_steps, 1);
  EXPECT_FALSE(a.learning_rate.has_value());  // train() keeps the optimizer's own rates
  EXPECT_FALSE(a.bf16 || a.fp16 || a.tf32);
  EXPECT_EQ(a.optim, "adamw_torch");
  EXPECT_EQ(a.weight_decay, 0.0);
  EXPECT_EQ(a.adam_beta1, 0.9);
  EXPECT_EQ(a.adam_beta2, 0.999);
  EXPECT_EQ(a.adam_epsilon, 1e-8);
  EXPECT_EQ(a.lr_scheduler_type, "linear");
  EXPECT_EQ(a.warmup_steps, 0);
  EXPECT_EQ(a.warmup_ratio, 0.0);
  EXPECT_EQ(a.logging_steps, 500);
  EXPECT_EQ(a.seed, 42);
  EXPECT_FALSE(a.runtime.fullgraph);
  EXPECT_EQ(a.runtime.recompile_limit, 8);
  EXPECT_TRUE(a.runtime.plugin_dirs.empty());
  EXPECT_TRUE(a.runtime.cpu_block_cache);
  EXPECT_EQ(a.runtime.cpu_block_cache_max_mb, 2048);
  EXPECT_FALSE(a.runtime.writeback_copy);
  EXPECT_EQ(a.debug.dump_dir, "");
  EXPECT_FALSE(a.debug.check_meta || a.debug.verify_groups || a.debug.lift_runtime_scalars || a.debug.no_comm_overlap);
  EXPECT_FALSE(a.experimental.batch_optimizer);
  EXPECT_NO_THROW(a.validate());
}

TEST_F(ConfigTest, CacheDirDefaultsToXdgThenHome) {
  const char* home = std::getenv("HOME");
  const std::string saved_home = home ? home : "";
  setenv("HOME", "/home/someone", 1);
  unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(TrainingArguments::default_cache_dir(), "/home/someone/.cache/kiln");
  EXPECT_EQ(TrainingArguments().runtime.cache_dir, "/home/someone/.cache/kiln");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(TrainingArguments().runtime.cache_dir, "/xdg/kiln");
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", saved_home.c_str(), 1);
}

TEST_F(ConfigTest, LoadsEveryKeyFromToml) {
  auto path = write("train.toml", R"(torch_compile = true
torch_compile_backend = "inductor"
torch_compile_mode = "max-autotune"
max_grad_norm = 0.5
log_level = "debug"
output_dir = "/tmp/run"
num_train_epochs = 2.5
max_steps = 100
per_device_train_batch_size = 16
gradient_accumulation_steps = 4
learning_rate = 3e-4
lr_scheduler_type = "cosine"
warmup_steps = 10
warmup_ratio = 0.1
logging_steps = 5
seed = 7
save_strategy = "epoch"
save_steps = 50
save_total_limit = 2
resume_from_checkpoint = "/tmp/run/checkpoint-50"
eval_strategy = "steps"
eval_steps = 25
per_device_eval_batch_size = 32
report_to = ["jsonl"]
disable_tqdm = true
ddp_backend = "gloo"
ddp_bucket_cap_mb = 50
ddp_find_unused_parameters = true
ddp_timeout = 120
group_by_length = true
pad_to_multiple_of = 8
overwrite_output_dir = true
bf16 = true
fp16 = false
tf32 = true
optim = "sgd"
weight_decay = 0.01
adam_beta1 = 0.8
adam_beta2 = 0.99
adam_epsilon = 1e-6
logging_first_step = true
data_seed = 11
run_name = "cosine-run"
dataloader_drop_last = true
load_best_model_at_end = true
metric_for_best_model = "accuracy"
greater_is_better = true

[runtime]
fullgraph = true
recompile_limit = 3
dynamic = false
mark_dynamic = ["0:1", "1:1"]
dynamic_shape_cache = 5
plugin_dirs = ["/opt/a", "/opt/b"]
cache_dir = "/tmp/kc"
cpu_block_cache = false
cpu_block_cache_max_mb = 512
writeback_copy = true
compile_threads = 3
channels_last = "never"
graph_copies = false
activation_memory_budget = 0.25

[debug]
dump_dir = "/tmp/ir"
check_meta = true
verify_groups = true
lift_runtime_scalars = true
no_comm_overlap = true

[experimental]
batch_optimizer = true

[plugin.inductor]
threads = 16
simd = "avx512"
fast_math = false
ratio = 0.5

[lr_scheduler_kwargs]
num_cycles = 1.5
)");
  auto a = TrainingArguments::from_toml(path);
  EXPECT_TRUE(a.logging_first_step);
  EXPECT_EQ(a.data_seed, 11);
  EXPECT_EQ(a.run_name, "cosine-run");
  EXPECT_TRUE(a.dataloader_drop_last);
  EXPECT_TRUE(a.load_best_model_at_end);
  EXPECT_EQ(a.metric_for_best_model, "accuracy");
  EXPECT_EQ(a.greater_is_better, true);
  EXPECT_EQ(a.lr_scheduler_kwargs.at("num_cycles"), "1.5");
  EXPECT_TRUE(a.torch_compile);
  EXPECT_EQ(a.torch_compile_backend, "inductor");
  EXPECT_EQ(a.torch_compile_mode, "max-autotune");
  EXPECT_EQ(a.max_grad_norm, 0.5);
  EXPECT_EQ(a.log_level, "debug");
  EXPECT_EQ(a.output_dir, "/tmp/run");
  EXPECT_EQ(a.num_train_epochs, 2.5);
  EXPECT_EQ(a.max_steps, 100);
  EXPECT_EQ(a.per_device_train_batch_size, 16);
  EXPECT_EQ(a.gradient_accumulation_steps, 4);
  EXPECT_EQ(a.learning_rate.value_or(-1), 3e-4);
  EXPECT_EQ(a.lr_scheduler_type, "cosine");
  EXPECT_EQ(a.warmup_steps, 10);
  EXPECT_EQ(a.warmup_ratio, 0.1);
  EXPECT_EQ(a.logging_steps, 5);
  EXPECT_EQ(a.seed, 7);
  EXPECT_EQ(a.save_strategy, "epoch");
  EXPECT_EQ(a.save_steps, 50);
  EXPECT_EQ(a.save_total_limit, 2);
  EXPECT_EQ(a.resume_from_checkpoint, "/tmp/run/checkpoint-50");
  EXPECT_EQ(a.eval_strategy, "steps");
  EXPECT_EQ(a.eval_steps, 25);
  EXPECT_EQ(a.per_device_eval_batch_size, 32);
  EXPECT_EQ(a.report_to, std::vector<std::string>{"jsonl"});
  EXPECT_TRUE(a.disable_tqdm);
  EXPECT_EQ(a.ddp_backend, "gloo");
  EXPECT_EQ(a.ddp_bucket_cap_mb, 50);
  EXPECT_TRUE(a.ddp_find_unused_parameters);
  EXPECT_EQ(a.ddp_timeout, 120);
  EXPECT_TRUE(a.runtime.fullgraph);
  EXPECT_EQ(a.runtime.recompile_limit, 3);
  EXPECT_EQ(a.runtime.dynamic, "false");  // a TOML boolean, as PyTorch's dynamic=False
  EXPECT_EQ(a.runtime.mark_dynamic, (std::vector<std::string>{"0:1", "1:1"}));
  EXPECT_EQ(a.runtime.dynamic_shape_cache, 5);
  EXPECT_TRUE(a.group_by_length);
  EXPECT_EQ(a.pad_to_multiple_of, 8);
  EXPECT_TRUE(a.overwrite_output_dir);
  EXPECT_TRUE(a.bf16);
  EXPECT_FALSE(a.fp16);
  EXPECT_TRUE(a.tf32);
  EXPECT_EQ(a.optim, "sgd");
  EXPECT_EQ(a.weight_decay, 0.01);
  EXPECT_EQ(a.adam_beta1, 0.8);
  EXPECT_EQ(a.adam_beta2, 0.99);
  EXPECT_EQ(a.adam_epsilon, 1e-6);
  EXPECT_EQ(a.runtime.plugin_dirs, (std::vector<std::string>{"/opt/a", "/opt/b"}));
  EXPECT_EQ(a.runtime.cache_dir, "/tmp/kc");
  EXPECT_FALSE(a.runtime.cpu_block_cache);
  EXPECT_EQ(a.runtime.cpu_block_cache_max_mb, 512);
  EXPECT_TRUE(a.runtime.writeback_copy);
  EXPECT_EQ(a.runtime.compile_threads, 3);
  EXPECT_EQ(a.runtime.channels_last, "never");
  EXPECT_FALSE(a.runtime.graph_copies);
  EXPECT_EQ(a.runtime.activation_memory_budget, 0.25);
  EXPECT_EQ(a.debug.dump_dir, "/tmp/ir");
  EXPECT_TRUE(a.debug.check_meta);
  EXPECT_TRUE(a.debug.verify_groups);
  EXPECT_TRUE(a.debug.lift_runtime_scalars);
  EXPECT_TRUE(a.debug.no_comm_overlap);
  EXPECT_TRUE(a.experimental.batch_optimizer);
  EXPECT_EQ(a.plugin_options.at("inductor").at("threads"), "16");
  EXPECT_EQ(a.plugin_options.at("inductor").at("simd"), "avx512");
  EXPECT_EQ(a.plugin_options.at("inductor").at("fast_math"), "false");
  EXPECT_EQ(a.plugin_options.at("inductor").at("ratio"), "0.5");
  EXPECT_EQ(a.origins.at("torch_compile_mode").describe(), path + ":3:22");
  EXPECT_EQ(a.origins.at("ddp_timeout").describe(), path + ":29:15");
  EXPECT_EQ(a.origins.at("adam_beta2").describe(), path + ":39:14");
  EXPECT_EQ(a.origins.at("runtime.recompile_limit").describe(), path + ":51:19");
  EXPECT_EQ(a.origins.at("experimental.batch_optimizer").describe(), path + ":73:19");
  EXPECT_EQ(a.origins.at("plugin.inductor.simd").describe(), path + ":77:8");
  // Every key of the table was set by this file.
  for (const auto& s : kiln::settings())
    if (s.key.rfind("plugin.", 0) != 0) {
      EXPECT_EQ(a.origins.count(s.key), 1u) << s.key;
    }
}

TEST_F(ConfigTest, NamingABackendOrModeTurnsCompileOn) {
  auto a = TrainingArguments::from_toml_string("torch_compile_mode = \"reduce-overhead\"\n", "m.toml");
  EXPECT_TRUE(a.torch_compile);
  auto b = TrainingArguments::from_toml_string("torch_compile_backend = \"cudagraphs\"\n", "b.toml");
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
  auto path = write("t.toml",
                    "torch_compile_backend = \"inductor\"\n[runtime]\ncache_dir = \"/from/file\"\n"
                    "plugin_dirs = [\"/file/dir\"]\ncpu_block_cache_max_mb = 100\n");
  TrainingArguments a;
  a.runtime.cache_dir = "/from/code";
  a.torch_compile_backend = "ipex";
  a.runtime.cpu_block_cache_max_mb = 50;
  a.runtime.plugin_dirs = {"/code/dir"};
  a.apply_toml(path);
  EXPECT_EQ(a.runtime.cache_dir, "/from/file");
  EXPECT_EQ(a.torch_compile_backend, "inductor");
  EXPECT_EQ(a.runtime.cpu_block_cache_max_mb, 100);
  EXPECT_EQ(a.runtime.plugin_dirs, (std::vector<std::string>{"/file/dir"}));
  setenv("KILN_BACKEND", "cudagraphs", 1);
  setenv("KILN_CACHE_DIR", "/from/env", 1);
  setenv("KILN_PLUGIN_PATH", "/env/one::/env/two", 1);
  setenv("KILN_LOG_LEVEL", "warn", 1);
  setenv("KILN_CPU_CACHE_MAX_MB", "300", 1);
  a.apply_env();
  EXPECT_EQ(a.torch_compile_backend, "cudagraphs");
  EXPECT_EQ(a.runtime.cache_dir, "/from/env");
  // KILN_PLUGIN_PATH's directories are searched first, then the file's.
  EXPECT_EQ(a.runtime.plugin_dirs, (std::vector<std::string>{"/env/one", "/env/two", "/file/dir"}));
  EXPECT_EQ(a.log_level, "warn");
  EXPECT_EQ(a.runtime.cpu_block_cache_max_mb, 300);
  EXPECT_EQ(a.origins.at("torch_compile_backend").describe(), "environment (KILN_BACKEND)");
  EXPECT_EQ(a.origins.at("runtime.plugin_dirs").describe(), "environment (KILN_PLUGIN_PATH)");
}

TEST_F(ConfigTest, ApplyingTheEnvironmentTwiceIsApplyingItOnce) {
  setenv("KILN_PLUGIN_PATH", "/env/one:/env/two", 1);
  setenv("KILN_PLUGIN_OPTIONS", "inductor.cxx=clang++", 1);
  TrainingArguments a;
  a.runtime.plugin_dirs = {"/code/dir", "/env/two"};
  a.apply_env();
  const TrainingArguments once = a;
  a.apply_env();
  EXPECT_EQ(a.runtime.plugin_dirs, (std::vector<std::string>{"/env/one", "/env/two", "/code/dir"}));
  EXPECT_EQ(a.runtime.plugin_dirs, once.runtime.plugin_dirs);
  EXPECT_EQ(a.plugin_options, once.plugin_options);
}

// Every variable in the table reaches its own key: set each to a value other than the default and
// look for it in origins and in the value the table reports back.
TEST_F(ConfigTest, EveryEnvironmentVariableSetsItsKey) {
  size_t variables = 0;
  for (const auto& s : kiln::settings()) {
    if (s.env.empty()) continue;
    ++variables;
    unset_kiln_environment();
    std::string value, origin_key = s.key;
    if (s.default_text == "false") value = "yes";
    else if (s.default_text == "true") value = "off";
    else if (s.key == "torch_compile_mode") value = "max-autotune";
    else if (s.key == "log_level") value = "error";
    else if (s.key == "runtime.cpu_block_cache_max_mb") value = "7";
    else if (s.key == "runtime.compile_threads") value = "2";
    else if (s.key == "runtime.activation_memory_budget") value = "0.5";
    else if (s.key == "runtime.channels_last") value = "always";
    else if (s.key == "runtime.dynamic") value = "false";
    else if (s.key == "plugin.<name>.<option>")
      value = "some_plugin.some_option=v", origin_key = "plugin.some_plugin.some_option";
    else value = "/some/value";
    setenv(s.env.c_str(), value.c_str(), 1);
    TrainingArguments a;
    a.apply_env();
    ASSERT_EQ(a.origins.count(origin_key), 1u) << s.env << " did not set " << origin_key;
    EXPECT_EQ(a.origins.at(origin_key).describe(), "environment (" + s.env + ")");
  }
  EXPECT_EQ(variables, 20u);  // KILN_BACKEND ... KILN_BATCH_OPTIMIZER, KILN_PLUGIN_OPTIONS
}

TEST_F(ConfigTest, EnvironmentBooleansFollowOneRule) {
  for (const char* yes : {"1", "true", "TRUE", "on", "On", "yes"}) {
    setenv("KILN_WRITEBACK_COPY", yes, 1);
    setenv("KILN_CPU_CACHE", yes, 1);
    TrainingArguments a;
    a.runtime.cpu_block_cache = false;
    a.apply_env();
    EXPECT_TRUE(a.runtime.writeback_copy) << yes;
    EXPECT_TRUE(a.runtime.cpu_block_cache) << yes;
  }
  for (const char* no : {"0", "false", "False", "off", "no", "NO"}) {
    setenv("KILN_WRITEBACK_COPY", no, 1);
    setenv("KILN_CPU_CACHE", no, 1);
    TrainingArguments a;
    a.runtime.writeback_copy = true;
    a.apply_env();
    EXPECT_FALSE(a.runtime.writeback_copy) << no;
    EXPECT_FALSE(a.runtime.cpu_block_cache) << no;
  }
}

TEST_F(ConfigTest, SetButEmptyVariableIsUnset) {
  setenv("KILN_CPU_CACHE", "", 1);
  setenv("KILN_BACKEND", "", 1);
  TrainingArguments a;
  a.apply_env();
  EXPECT_TRUE(a.runtime.cpu_block_cache);
  EXPECT_EQ(a.torch_compile_backend, "auto");
  EXPECT_TRUE(a.origins.empty());
}

TEST_F(ConfigTest, BadEnvironmentValuesNameTheVariableAndTheValue) {
  setenv("KILN_CPU_CACHE", "maybe", 1);
  EXPECT_EQ(env_error(),
            "environment (KILN_CPU_CACHE): 'maybe' is not a boolean; use 1/0, true/false, on/off or yes/no");
  unset_kiln_environment();
  setenv("KILN_CHECK_META", "2", 1);
  EXPECT_EQ(env_error(), "environment (KILN_CHECK_META): '2' is not a boolean; use 1/0, true/false, on/off or yes/no");
  unset_kiln_environment();
  setenv("KILN_CPU_CACHE_MAX_MB", "12x", 1);
  EXPECT_EQ(env_error(), "environment (KILN_CPU_CACHE_MAX_MB): '12x' is not an integer");
  unset_kiln_environment();
  setenv("KILN_CPU_CACHE_MAX_MB", "-5", 1);
  EXPECT_EQ(env_error(),
            "environment (KILN_CPU_CACHE_MAX_MB): key 'runtime.cpu_block_cache_max_mb' must be between 0 "
            "and 1073741824, got -5");
  unset_kiln_environment();
  setenv("KILN_LOG_LEVEL", "verbose", 1);
  EXPECT_EQ(env_error(),
            "environment (KILN_LOG_LEVEL): unknown log level 'verbose'; valid levels: trace, debug, info, "
            "warning, warn, error, critical, off, passive");
  unset_kiln_environment();
  setenv("KILN_MODE", "fast", 1);
  TrainingArguments a;
  try {
    a.apply_env();
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "environment (KILN_MODE): unknown mode 'fast'; valid modes: default, "
                 "reduce-overhead, max-autotune, max-autotune-no-cudagraphs");
    EXPECT_EQ(e.key(), "torch_compile_mode");
    EXPECT_EQ(e.where().source, "environment (KILN_MODE)");
  }
}

TEST_F(ConfigTest, PluginOptionsFromEnvironmentReplaceSingleOptions) {
  auto path = write("p.toml", "[plugin.inductor]\nthreads = 16\ncxx = \"g++\"\n");
  setenv("KILN_PLUGIN_OPTIONS", "inductor.cxx=clang++,inductor.profile=1,other.x.y=a=b", 1);
  auto a = TrainingArguments::from_toml(path);
  EXPECT_EQ(a.plugin_options.at("inductor"),
            (std::map<std::string, std::string>{{"threads", "16"}, {"cxx", "clang++"}, {"profile", "1"}}));
  // The plugin's name ends at the first '.', the value starts after the first '='.
  EXPECT_EQ(a.plugin_options.at("other").at("x.y"), "a=b");
  EXPECT_EQ(a.origins.at("plugin.inductor.threads").describe(), path + ":2:11");
  EXPECT_EQ(a.origins.at("plugin.inductor.cxx").describe(), "environment (KILN_PLUGIN_OPTIONS)");
}

TEST_F(ConfigTest, BadPluginOptionsEntryNamesTheVariableAndTheEntry) {
  for (const char* bad : {"inductor", "inductor.profile", ".profile=1", "inductor.=1", "inductor.profile=1,,x"}) {
    setenv("KILN_PLUGIN_OPTIONS", bad, 1);
    const std::string err = env_error();
    EXPECT_EQ(err.rfind("environment (KILN_PLUGIN_OPTIONS): entry '", 0), 0u) << bad << ": " << err;
    EXPECT_NE(err.find("must be <plugin>.<option>=<value>"), std::string::npos) << err;
  }
  setenv("KILN_PLUGIN_OPTIONS", "inductor.profile=1,cxx", 1);
  EXPECT_EQ(env_error(),
            "environment (KILN_PLUGIN_OPTIONS): entry 'cxx' must be <plugin>.<option>=<value>, as in "
            "'inductor.cxx=clang++'; entries are separated by ','");
}

TEST_F(ConfigTest, LoggerStartsAtTheEnvironmentsLevel) {
  EXPECT_EQ(kiln::initial_log_level(), "info");
  setenv("KILN_LOG_LEVEL", "debug", 1);
  EXPECT_EQ(kiln::initial_log_level(), "debug");
  setenv("KILN_LOG_LEVEL", "verbose", 1);  // reported by apply_env, not by the logger
  EXPECT_EQ(kiln::initial_log_level(), "info");
}

TEST_F(ConfigTest, ValidateChecksValuesSetInCode) {
  auto error_in_code = [](const TrainingArguments& a) -> std::string {
    try {
      a.validate();
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(no error)";
  };
  TrainingArguments a;
  a.torch_compile_mode = "max_autotune";
  EXPECT_EQ(error_in_code(a),
            "code: unknown mode 'max_autotune'; did you mean 'max-autotune'? Valid modes: "
            "default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs");
  TrainingArguments b;
  b.runtime.recompile_limit = -1;
  EXPECT_EQ(error_in_code(b), "code: key 'runtime.recompile_limit' must be between 0 and 1000000, got -1");
  TrainingArguments c;
  c.runtime.cache_dir = "";
  EXPECT_EQ(error_in_code(c), "code: key 'runtime.cache_dir' must not be empty");
  TrainingArguments d;
  d.max_grad_norm = -2;
  EXPECT_EQ(error_in_code(d), "code: key 'max_grad_norm' must be a finite number >= 0 (0 turns clipping off), got -2");
  TrainingArguments e;
  e.log_level = "errror";
  EXPECT_EQ(error_in_code(e),
            "code: unknown log level 'errror'; did you mean 'error'? Valid levels: trace, debug, "
            "info, warning, warn, error, critical, off, passive");
  TrainingArguments f;
  f.lr_scheduler_type = "cosin";
  EXPECT_EQ(error_in_code(f),
            "code: unknown lr_scheduler_type 'cosin'; did you mean 'cosine'? Valid types: constant, "
            "constant_with_warmup, linear, cosine, cosine_with_restarts, polynomial, inverse_sqrt, cosine_with_min_lr, "
            "warmup_stable_decay, reduce_lr_on_plateau");
  TrainingArguments g;
  g.warmup_ratio = 1.5;
  EXPECT_EQ(error_in_code(g), "code: key 'warmup_ratio' must be a number from 0 to 1, got 1.5");
  TrainingArguments h;
  h.gradient_accumulation_steps = 0;
  EXPECT_EQ(error_in_code(h), "code: key 'gradient_accumulation_steps' must be between 1 and 1048576, got 0");
}

TEST_F(ConfigTest, UnknownBackendIsCheckedAgainstPluginsFound) {
  auto path = write("b.toml", "  torch_compile_backend = \"inductr\"\n");
  auto a = TrainingArguments::from_toml(path);
  try {
    a.validate_backend({"inductor", "cudagraphs", "my_backend"});
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), path +
                                         ":1:27: unknown backend 'inductr'; did you mean 'inductor'? "
                                         "Backends found: inductor, cudagraphs, my_backend");
  }
  a.torch_compile_backend = "my_backend";
  EXPECT_NO_THROW(a.validate_backend({"inductor", "my_backend"}));
  a.torch_compile_backend = "auto";
  EXPECT_NO_THROW(a.validate_backend({}));
}

// "a+b" composes backends (b takes the nodes a leaves): each part is checked by name, and "auto"
// or "eager" cannot be a part.
TEST_F(ConfigTest, AComposedBackendChecksEachOfItsNames) {
  auto path = write("c.toml", "torch_compile_backend = \"ipex+inductr\"\n");
  auto a = TrainingArguments::from_toml(path);
  try {
    a.validate_backend({"inductor", "ipex"});
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), path +
                                         ":1:25: unknown backend 'inductr' in 'ipex+inductr'; did you mean "
                                         "'inductor'? Backends found: inductor, ipex");
  }
  a.torch_compile_backend = "ipex+inductor";
  EXPECT_NO_THROW(a.validate_backend({"inductor", "ipex"}));
  for (const char* bad : {"ipex+auto", "eager+inductor", "ipex+"}) {
    a.torch_compile_backend = bad;
    try {
      a.validate_backend({"inductor", "ipex", "eager"});
      FAIL() << bad << ": expected an error";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("a composition of backends"), std::string::npos) << e.what();
    }
  }
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
  unset_kiln_environment();
  const std::string path = std::string(KILN_BAD_TOML_DIR) + "/" + GetParam().file;
  ASSERT_TRUE(fs::exists(path)) << path;
  EXPECT_EQ(error_of(path), path + ":" + GetParam().message);
}

const BadFile kCorpus[] = {
    BadFile{"unterminated_string.toml",
            "2:30: TOML syntax error: Error while parsing string: unescaped control characters other than TAB (U+0009) "
            "are explicitly prohibited"},
    BadFile{"unknown_key_typo.toml", "1:1: unknown key 'torch_compil'; did you mean 'torch_compile'?"},
    BadFile{"hugging_face_key.toml",
            "2:1: key 'gradient_checkpointing' is Hugging Face's, and kiln does not have it: kiln does not "
            "rematerialise activations yet; leave it out (the step keeps what its backward reads)"},
    BadFile{"optim_not_in_libtorch.toml",
            "1:9: key 'optim' is 'adafactor', a Hugging Face optimizer that LibTorch does not have; a Trainer makes "
            "one of adamw_torch, adamw_torch_fused, sgd, adagrad, rmsprop, or make the optimizer yourself and hand "
            "it to the Trainer"},
    BadFile{"wrong_type_bool.toml", "2:13: key 'runtime.fullgraph' must be a boolean, not a string"},
    BadFile{"unknown_mode.toml",
            "1:22: unknown mode 'reduce_overhead'; did you mean 'reduce-overhead'? Valid modes: default, "
            "reduce-overhead, max-autotune, max-autotune-no-cudagraphs"},
    BadFile{"wrong_type_int.toml", "2:19: key 'runtime.recompile_limit' must be an integer, not a float"},
    BadFile{"negative_recompile_limit.toml",
            "2:19: key 'runtime.recompile_limit' must be between 0 and 1000000, got -1"},
    BadFile{"plugin_dirs_not_array.toml", "2:15: key 'runtime.plugin_dirs' must be an array of strings, not a string"},
    BadFile{"plugin_dirs_bad_entry.toml",
            "2:22: every entry of 'runtime.plugin_dirs' must be a string, not an integer"},
    BadFile{"unknown_table.toml", "1:2: unknown key 'runtim'; did you mean 'runtime'?"},
    BadFile{"runtime_not_table.toml", "1:11: key 'runtime' must be a table, not an integer"},
    BadFile{"plugin_option_array.toml",
            "2:11: plugin option 'plugin.inductor.threads' must be a string, integer, float or boolean, not an array"},
    BadFile{"bad_log_level.toml",
            "1:13: unknown log level 'verbose'; valid levels: trace, debug, info, warning, warn, error, critical, "
            "off, passive"},
    BadFile{"duplicate_key.toml",
            "2:17: TOML syntax error: Error while parsing key-value pair: cannot redefine existing boolean "
            "'torch_compile'"},
    BadFile{"empty_cache_dir.toml", "4:13: key 'runtime.cache_dir' must not be empty"},
    BadFile{"debug_unknown_key.toml", "2:1: unknown key 'debug.dump_dri'; did you mean 'debug.dump_dir'?"},
    BadFile{"key_in_wrong_table.toml", "1:1: unknown key 'fullgraph'; did you mean 'runtime.fullgraph'?"},
    BadFile{"key_after_table.toml",
            "3:1: unknown key 'runtime.torch_compile_backend'; did you mean 'torch_compile_backend'?"},
    BadFile{"first_error_in_file_order.toml",
            "2:19: key 'runtime.recompile_limit' must be between 0 and 1000000, got -1"},
    BadFile{"cpu_cache_max_out_of_range.toml",
            "2:26: key 'runtime.cpu_block_cache_max_mb' must be between 0 and 1073741824, got 3000000000"},
    BadFile{"negative_max_grad_norm.toml",
            "1:17: key 'max_grad_norm' must be a finite number >= 0 (0 turns clipping off), got -1"},
    BadFile{"experimental_wrong_type.toml",
            "2:19: key 'experimental.batch_optimizer' must be a boolean, not an integer"},
    BadFile{"unknown_ddp_backend.toml",
            "2:15: unknown ddp_backend 'ncl'; did you mean 'nccl'? Valid values: gloo, nccl"},
    BadFile{"zero_ddp_timeout.toml", "2:15: key 'ddp_timeout' must be between 1 and 2147483648, got 0"},
    BadFile{"activation_memory_budget_above_one.toml",
            "2:28: key 'runtime.activation_memory_budget' must be between 0 and 1, got 1.5"},
    BadFile{"ddp_find_unused_wrong_type.toml",
            "1:30: key 'ddp_find_unused_parameters' must be a boolean, not a string"},
    BadFile{"old_compile_table.toml", "3:1: key 'compile.fullgraph' moved to 'runtime.fullgraph'"},
    BadFile{"old_training_table.toml", "2:1: key 'training.max_grad_norm' moved to 'max_grad_norm'"},
    BadFile{"old_logging_table.toml", "2:1: key 'logging.level' moved to 'log_level'"},
    BadFile{"old_compile_typo.toml",
            "2:1: unknown key 'compile.torch_compil'; table 'compile' is gone: its keys moved to the top level "
            "(torch_compile, torch_compile_backend, torch_compile_mode) and [runtime]; did you mean 'torch_compile'?"},
    BadFile{"old_compile_not_table.toml",
            "1:1: table 'compile' is gone: its keys moved to the top level (torch_compile, torch_compile_backend, "
            "torch_compile_mode) and [runtime]"},
};

INSTANTIATE_TEST_SUITE_P(Corpus, BadToml, ::testing::ValuesIn(kCorpus),
                         [](const ::testing::TestParamInfo<BadFile>& info) {
                           std::string n = info.param.file;
                           return n.substr(0, n.find('.'));
                         });

// Every file of the corpus has its message above, so that no bad file goes unchecked.
TEST(BadTomlCorpus, EveryFileHasItsMessage) {
  std::set<std::string> on_disk, pinned;
  for (const auto& e : fs::directory_iterator(KILN_BAD_TOML_DIR)) on_disk.insert(e.path().filename().string());
  for (const auto& b : kCorpus) pinned.insert(b.file);
  EXPECT_EQ(on_disk, pinned);
}

// ---- docs/config.md and its translations list exactly the code's settings ----------------------

namespace {

struct DocRow {
  std::string env;
  std::string default_text;
};

std::string first_code_span(const std::string& cell) {
  const size_t a = cell.find('`');
  if (a == std::string::npos) return "";
  const size_t b = cell.find('`', a + 1);
  return b == std::string::npos ? "" : cell.substr(a + 1, b - a - 1);
}

// The rows of the settings' tables: every four-column table line whose first cell is a code span.
std::map<std::string, DocRow> settings_in(const std::string& page, std::string* all_text) {
  std::ifstream in(page);
  std::stringstream ss;
  ss << in.rdbuf();
  *all_text = ss.str();
  std::map<std::string, DocRow> rows;
  std::istringstream lines(*all_text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells;
    std::string cell;
    for (size_t i = 1; i < line.size(); ++i) {
      if (line[i] == '|' && line[i - 1] != '\\') {
        cells.push_back(cell);
        cell.clear();
      } else {
        cell += line[i];
      }
    }
    if (cells.size() != 4) continue;  // the settings' tables have four columns
    const std::string key = first_code_span(cells[0]);
    EXPECT_EQ(rows.count(key), 0u) << page << " lists '" << key << "' twice";
    rows[key] = {first_code_span(cells[1]), first_code_span(cells[2])};
  }
  return rows;
}

}  // namespace

class ConfigDocs : public ::testing::TestWithParam<const char*> {};

TEST_P(ConfigDocs, ListExactlyTheKeysVariablesAndDefaultsOfTheCode) {
  const std::string page = std::string(KILN_DOCS_DIR) + "/" + GetParam();
  ASSERT_TRUE(fs::exists(page)) << page;
  std::string text;
  const auto rows = settings_in(page, &text);
  std::set<std::string> code_keys, code_envs;
  for (const auto& s : kiln::settings()) {
    code_keys.insert(s.key);
    if (!s.env.empty()) code_envs.insert(s.env);
    auto it = rows.find(s.key);
    if (it == rows.end()) {
      ADD_FAILURE() << page << " does not list the key '" << s.key << "'";
      continue;
    }
    EXPECT_EQ(it->second.env, s.env) << page << ": environment variable of '" << s.key << "'";
    EXPECT_EQ(it->second.default_text, s.default_text) << page << ": default of '" << s.key << "'";
  }
  for (const auto& [key, row] : rows)
    EXPECT_EQ(code_keys.count(key), 1u) << page << " lists '" << key << "', which the code does not read";
  // No variable in the prose that the code does not read: the settings' variables, and the
  // hardware probe's test seam, which is not a setting.
  const std::regex var(R"(KILN_[A-Z0-9_]+)");
  std::set<std::string> mentioned;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), var); it != std::sregex_iterator(); ++it)
    mentioned.insert(it->str());
  code_envs.insert("KILN_SYSFS_ROOT");
  EXPECT_EQ(mentioned, code_envs) << page;
}

INSTANTIATE_TEST_SUITE_P(Pages, ConfigDocs, ::testing::Values("config.md", "es/config.md", "pt/config.md"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string n = info.param;
                           return n == "config.md"         ? std::string("English")
                                  : n.rfind("es/", 0) == 0 ? std::string("Spanish")
                                                           : std::string("Portuguese");
                         });

// ---- docs/huggingface.md and its translations: every Hugging Face key, as the code treats it ----

// Each row of the page's key table is `key` | `status` | note. A key kiln has (same, differs) is a
// setting the code reads; one it does not have (n/a) is answered, in a file, with the error that
// says what to do instead, and so is one not built yet unless it is a setting the Trainer refuses
// (fp16). The three pages list the same keys with the same statuses.
class HuggingFaceDocs : public ::testing::TestWithParam<const char*> {};

std::vector<std::pair<std::string, std::string>> hugging_face_rows(const std::string& page) {
  std::ifstream in(std::string(KILN_DOCS_DIR) + "/" + page);
  EXPECT_TRUE(in.good()) << page;
  std::vector<std::pair<std::string, std::string>> rows;
  const std::regex row(R"(^\| `([a-z0-9_]+)` \| `(same|differs|not yet|n/a)` \|)");
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, row)) rows.emplace_back(m[1], m[2]);
  }
  return rows;
}

TEST_P(HuggingFaceDocs, EveryKeysStatusIsWhatTheCodeDoes) {
  unset_kiln_environment();
  const std::string page = GetParam();
  const auto rows = hugging_face_rows(page);
  EXPECT_GT(rows.size(), 100u) << page;
  EXPECT_EQ(rows, hugging_face_rows("huggingface.md")) << page << " lists other keys or statuses than the English page";
  std::set<std::string> settings;
  for (const auto& s : kiln::settings()) settings.insert(s.key);
  for (const auto& [key, status] : rows) {
    const bool kiln_has = settings.count(key) > 0;
    if (status == "same" || status == "differs") {
      EXPECT_TRUE(kiln_has) << page << ": '" << key << "' is '" << status << "', but kiln reads no such key";
      continue;
    }
    if (kiln_has) {
      EXPECT_EQ(status, "not yet") << page << ": '" << key << "' is a key kiln reads";
      continue;
    }
    std::string error;
    try {
      TrainingArguments::from_toml_string(key + " = 1\n", "hf.toml");
    } catch (const ConfigError& e) {
      error = e.what();
    }
    // Hugging Face's `debug` (a string) is kiln's [debug] table: a number there is the wrong type.
    const std::string expected =
        key == "debug" ? "key 'debug' must be a table" : "is Hugging Face's, and kiln does not have it: ";
    EXPECT_NE(error.find(expected), std::string::npos) << page << ": '" << key << "' gets: " << error;
  }
}

INSTANTIATE_TEST_SUITE_P(Pages, HuggingFaceDocs,
                         ::testing::Values("huggingface.md", "es/huggingface.md", "pt/huggingface.md"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string n = info.param;
                           return n == "huggingface.md"    ? std::string("English")
                                  : n.rfind("es/", 0) == 0 ? std::string("Spanish")
                                                           : std::string("Portuguese");
                         });

// kiln's one way of writing JSON (the command line's --json, metrics.jsonl, trainer_state.json, the
// conformance report): whatever a string holds, the text parses back to it.
TEST(JsonText, StringsRoundTripThroughNlohmannParsing) {
  const std::vector<std::string> strings = {
      "plain",
      "a \"quoted\" word",
      "back\\slash and C:\\path",
      "\n\r\t\b\f",
      std::string("nul\0end", 7) + " \x01 \x1f \x7f",
      "/home/jos\xc3\xa9/caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac/\xf0\x9f\x94\xa5.so",  // UTF-8 paths
  };
  kiln::Json doc = kiln::Json::object();
  for (size_t i = 0; i < strings.size(); ++i) doc["s" + std::to_string(i)] = strings[i];
  doc["list"] = strings;
  for (int indent : {-1, 2}) {
    const std::string text = kiln::json_text(doc, indent);
    EXPECT_EQ(text.find('\n') == std::string::npos, indent < 0) << text;  // one line, or indented
    const auto back = nlohmann::json::parse(text);
    for (size_t i = 0; i < strings.size(); ++i)
      EXPECT_EQ(back.at("s" + std::to_string(i)).get<std::string>(), strings[i]) << text;
    EXPECT_EQ(back.at("list").get<std::vector<std::string>>(), strings) << text;
  }
  // Non-ASCII is written as it is, not as \u escapes; control characters are escaped.
  EXPECT_EQ(kiln::json_text("caf\xc3\xa9"), "\"caf\xc3\xa9\"");
  EXPECT_EQ(kiln::json_text("\x01\n\"\\"), "\"\\u0001\\n\\\"\\\\\"");
}

// Bytes that are not UTF-8 (a device name from a broken sysfs tree, a path) cannot throw half-way
// through a report: each becomes U+FFFD and the document stays valid JSON.
TEST(JsonText, InvalidUtf8BecomesTheReplacementCharacter) {
  const std::string text = kiln::json_text(kiln::Json{{"name", "bad \xff\xfe bytes"}});
  EXPECT_EQ(nlohmann::json::parse(text).at("name").get<std::string>(), "bad \xef\xbf\xbd\xef\xbf\xbd bytes") << text;
}

// Keys stay in the order they were set (the order the docs list them), and a number that is not
// finite is null, never the "nan" printf would write.
TEST(JsonText, KeysKeepTheirOrderAndNonFiniteNumbersAreNull) {
  kiln::Json j = kiln::Json::object();
  j["workload"] = "mlp";
  j["device"] = "cpu";
  j["ratio"] = std::nan("");
  j["eager_ms"] = 0.1;
  EXPECT_EQ(kiln::json_text(j), R"({"workload":"mlp","device":"cpu","ratio":null,"eager_ms":0.1})");
}

// TOML allows characters outside ASCII only in strings and comments. Outside them kiln reports a
// syntax error with where, before the TOML parser sees the text: Debian 12's TOML++ reaches
// undefined behaviour testing some of them (é among them) for whitespace (found by fuzzing).
TEST_F(ConfigTest, ACharacterOutsideAsciiOutsideAStringIsASyntaxErrorWithWhere) {
  const std::string e = write("e.toml", "max_steps = 3\noutput_dir = \xc3\xa9t\xc3\xa9\n");
  EXPECT_EQ(error_of(e), e + ":2:14: TOML syntax error: U+00E9 outside a string or comment (TOML allows only ASCII "
                             "there; quote the value)");
  EXPECT_NE(
      error_of(write("k.toml", "cl\xc3\xa9 = 1\n")).find("k.toml:1:3: TOML syntax error: U+00E9 outside a string"),
      std::string::npos);
  EXPECT_NE(error_of(write("b.toml", "seed = 1\xff\n")).find("b.toml:1:9: TOML syntax error: byte 0xFF outside"),
            std::string::npos);
  // In strings of every kind and in comments they are the file's own.
  const auto a = TrainingArguments::from_toml_string(
      "# configuraci\xc3\xb3n de entrenamiento\n"
      "output_dir = \"caf\xc3\xa9/\\\"sal\xc3\xad\"  # r\xc3\xa9sum\xc3\xa9\n"
      "[plugin.inductor]\n"
      "cxx = '''g++ \xe2\x80\x94 ''''\n"
      "note = \"\"\"l\xc3\xadnea \\\n   \xc3\xba \"\"\"\"\n"
      "\"cl\xc3\xa9\" = '\xc3\xa9'\n",
      "u.toml");
  EXPECT_EQ(a.output_dir, "caf\xc3\xa9/\"sal\xc3\xad");
  EXPECT_EQ(a.plugin_options.at("inductor").at("cxx"), "g++ \xe2\x80\x94 '");
  EXPECT_EQ(a.plugin_options.at("inductor").at("note"), "l\xc3\xadnea \xc3\xba \"");
  EXPECT_EQ(a.plugin_options.at("inductor").at("cl\xc3\xa9"), "\xc3\xa9");
}

// A quote that cannot open a string where it stands does not hide what follows it: after a
// value's '.' (`1.'''...`, found by fuzzing: the parser reads it as a bad float and reached the
// same undefined behaviour at U+FEBF) and a multi-line quote on a key's side are junk, so the
// non-ASCII after them is reported. Dotted keys in inline tables and multi-line strings inside
// multi-line arrays stay strings.
TEST_F(ConfigTest, AQuoteThatOpensNoStringDoesNotHideNonAsciiAfterIt) {
  const std::string f = write("f.toml",
                              "k_cmhc_aax_em = 1.'''''c!uObl\x07"
                              "ck_cmehc_aax_YYg\xef\xba\xbf]Y0\n");
  EXPECT_NE(error_of(f).find("f.toml:1:47: TOML syntax error: U+FEBF outside a string or comment"), std::string::npos)
      << error_of(f);
  // A number's text runs on to a space, ']', '}', ',' or '#': the parser scans the quote and what
  // follows it as part of the number (found by fuzzing).
  const std::string n = write("n.toml", "cole =[[0x10[[2[[\"constantX\xef\xbb\xbawith\"]]]]]\n");
  EXPECT_NE(error_of(n).find("n.toml:1:28: TOML syntax error: U+FEFA outside a string or comment"), std::string::npos)
      << error_of(n);
  // Three quotes open a multi-line string where a key stands too (the parser reads it, then says a
  // key cannot be one), so a backslash inside it is a multi-line basic string's (found by fuzzing).
  const std::string k = write("k.toml", "'\'\'a\xc3\xa9\'\'\' = 1\n");
  EXPECT_NE(error_of(k).find(
                "k.toml:1:1: TOML syntax error: Error while parsing key: multi-line strings are prohibited in keys"),
            std::string::npos)
      << error_of(k);
  const std::string m = write("m.toml", "\"\"\"s\npdirs = '\'\'\"/\\\xef\xbb\xbe.'/]\n");
  EXPECT_NE(error_of(m).find("m.toml:2:15: TOML syntax error: U+FEFE after a backslash is not an escape"),
            std::string::npos)
      << error_of(m);
  // Valid: the parser reads them, and reports only that a plugin option cannot be a table or array.
  const std::string t = write("t.toml", "[plugin.inductor]\nt = { a.'cl\xc3\xa9' = 'x', b.\"\xc3\xba\" = 'y' }\n");
  EXPECT_NE(error_of(t).find("t.toml:2:5: plugin option 'plugin.inductor.t' must be a string"), std::string::npos)
      << error_of(t);
  const std::string l =
      write("l.toml", "[plugin.inductor]\nl = [\n  '\'\'\xc3\xa9\n\'\'\',\n  \"\"\"\xc3\xad\"\"\", # \xc3\xb3\n]\n");
  EXPECT_NE(error_of(l).find("l.toml:2:5: plugin option 'plugin.inductor.l' must be a string"), std::string::npos)
      << error_of(l);
}

// A date, a space and a digit may begin a date-time written with a space for its 'T': the parser
// reads the character after that digit as more of the value even when it is a '#', and tests
// what follows for the value's end (found by fuzzing: U+FDFF after `0#~` reached TOML++'s
// undefined behaviour). kiln reports the non-ASCII there; a comment after a space stays a comment.
TEST_F(ConfigTest, AHashRightAfterADateTimesSpaceAndDigitIsNoComment) {
  // The file `name` holding `text` fails to load with `expected` in its error.
  auto expect_error = [&](const std::string& name, const std::string& text, const std::string& expected) {
    const std::string e = error_of(write(name, text));
    EXPECT_NE(e.find(name + ":" + expected), std::string::npos) << e;
  };
  expect_error("d.toml", " l=\t19A9-05-27 0#~\xef\xb7\xbfrt[",
               "1:19: TOML syntax error: U+FDFF outside a string or comment");
  // The parser's scan takes '=' as part of the date's ten characters (the fuzzer's next find).
  expect_error("q.toml", " l=\t19A9-0=-27 0#~\xef\xb7\xbf",
               "1:19: TOML syntax error: U+FDFF outside a string or comment");
  expect_error("u.toml", "x = 1_979-05-27 7#\xc3\xa9\n", "1:19: TOML syntax error: U+00E9 outside a string or comment");
  // Comments after a whole date-time, after a date alone and after a number are the file's own.
  expect_error("c.toml",
               "[plugin.inductor]\nwhen = 1979-05-27 07:32:00 # \xef\xb7\xbf\n"
               "day = 1979-05-27 # \xc3\xa9\nn = 10#\xc3\xa9\n",
               "2:8: plugin option 'plugin.inductor.when' must be a string");
}

// In a multi-line basic string the parser tests the character after a backslash, and the first
// one after a line-ending backslash, for whitespace: where TOML++ 3.3 reaches undefined behaviour
// (found by fuzzing), kiln reports the invalid ones and reads the valid ones as written.
TEST_F(ConfigTest, NonAsciiAfterABackslashInAMultiLineStringIsReadOrReported) {
  const auto a = TrainingArguments::from_toml_string(
      "[plugin.inductor]\n"
      "note = \"\"\"a \\\n   \xc3\xa9t\xc3\xa9 \\\n\n\xef\xba\xbf\\\n\xe3\x80\x80.\"\"\"\n",
      "m.toml");
  // U+3000 is whitespace to TOML++, skipped after a line-ending backslash as before.
  EXPECT_EQ(a.plugin_options.at("inductor").at("note"), "a \xc3\xa9t\xc3\xa9 \xef\xba\xbf.");
  // What TOML++ takes for whitespace (U+FEFF) is skipped too, and the character after it is the one
  // tested (U+03DA; found by fuzzing).
  const auto b = TrainingArguments::from_toml_string(
      "[plugin.inductor]\nnote = \"\"\"x\\\n\xef\xbb\xbf\xcf\x9a\"\"\"\n", "b.toml");
  EXPECT_EQ(b.plugin_options.at("inductor").at("note"), "x\xcf\x9a");
  const std::string e = write("e.toml", "x = 1\n[plugin.inductor]\nnote = \"\"\"ab\\\xc3\xa9\"\"\"\n");
  EXPECT_EQ(error_of(e), e + ":3:14: TOML syntax error: U+00E9 after a backslash is not an escape");
  const std::string s = write("s.toml", "[plugin.inductor]\nnote = \"\"\"\\  \xd2\x85\n\"\"\"\n");
  EXPECT_EQ(error_of(s), s + ":2:14: TOML syntax error: U+0485 after a backslash and spaces (a line-ending "
                             "backslash must be the last character on its line)");
}
