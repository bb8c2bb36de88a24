// kiln's configuration: TrainingArguments with the Hugging Face names, loaded from TOML and
// overridden by environment variables (code < file < environment). No LibTorch here.
#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln {

// The compile modes, with the meanings PyTorch's torch.compile gives them.
const std::vector<std::string>& valid_modes();
// The in-tree backends plus "auto"; third-party names are checked against the loaded plugins.
const std::vector<std::string>& builtin_backends();

// Where a setting came from, so later checks (a backend name against the plugins found) can
// point at the file and line that set it.
struct SettingOrigin {
  std::string source;  // a file path, "environment (KILN_BACKEND)" or "code"
  int line = 0;        // 1-based; 0 when not from a file
  int column = 0;
  std::string describe() const;  // "train.toml:3:1" or "environment (KILN_BACKEND)"
};

// Every configuration error says what was wrong and where.
class ConfigError : public std::runtime_error {
 public:
  ConfigError(SettingOrigin where, std::string key, std::string what);
  const SettingOrigin& where() const { return where_; }
  const std::string& key() const { return key_; }

 private:
  SettingOrigin where_;
  std::string key_;
};

struct TrainingArguments {
  bool torch_compile = false;
  std::string torch_compile_backend = "auto";
  std::string torch_compile_mode = "default";
  bool fullgraph = false;
  int recompile_limit = 8;
  // Trainer: clip the gradients' total 2-norm to this before the optimizer step
  // (torch::nn::utils::clip_grad_norm_). 0 turns clipping off. Hugging Face's default is 1.0;
  // kiln's is 0, so that a Trainer step computes what the plain LibTorch loop it replaces computes.
  double max_grad_norm = 0.0;
  std::vector<std::string> plugin_dirs;
  std::string cache_dir = default_cache_dir();
  std::string log_level = "info";
  // [plugin.<name>] tables: free-form key/value options handed to that plugin as strings.
  std::map<std::string, std::map<std::string, std::string>> plugin_options;

  // Keys set by a file or the environment, with where they came from.
  std::map<std::string, SettingOrigin> origins;

  // Defaults, then the file, then the environment. Throws ConfigError.
  static TrainingArguments from_toml(const std::string& path);
  // Same, from TOML text; `source_name` is used in error messages.
  static TrainingArguments from_toml_string(const std::string& text,
                                            const std::string& source_name = "<string>");

  // Layers a file over these settings (code < file).
  void apply_toml(const std::string& path);
  void apply_toml_string(const std::string& text, const std::string& source_name);
  // Layers KILN_BACKEND, KILN_MODE, KILN_PLUGIN_PATH, KILN_CACHE_DIR, KILN_LOG_LEVEL on top.
  void apply_env();
  // Checks values set in code too (mode name, recompile_limit); throws ConfigError.
  void validate() const;
  // Checks the backend name against the plugins actually found ("auto" always passes).
  void validate_backend(const std::vector<std::string>& available) const;

  // Hugging Face semantics: naming a backend or a mode turns torch_compile on.
  bool compile_enabled() const;

  static std::string default_cache_dir();
};

// Levenshtein-nearest candidate within a small distance, for "did you mean".
std::optional<std::string> nearest_name(const std::string& name,
                                        const std::vector<std::string>& candidates);

}  // namespace kiln
