// TrainingArguments: defaults < TOML file < environment, with errors that name file, line and key.
#include "kiln/config.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <toml++/toml.h>

namespace kiln {
namespace {

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

SettingOrigin origin_of(const toml::node& n, const std::string& source) {
  SettingOrigin o;
  o.source = source;
  o.line = static_cast<int>(n.source().begin.line);
  o.column = static_cast<int>(n.source().begin.column);
  return o;
}

const char* type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "string";
    case toml::node_type::integer: return "integer";
    case toml::node_type::floating_point: return "float";
    case toml::node_type::boolean: return "boolean";
    case toml::node_type::array: return "array";
    case toml::node_type::table: return "table";
    case toml::node_type::date: return "date";
    case toml::node_type::time: return "time";
    case toml::node_type::date_time: return "date-time";
    default: return "nothing";
  }
}

// "a string", "an integer", "an array": for messages.
std::string a_type(const toml::node& n) {
  std::string t = type_name(n);
  return (t[0] == 'a' || t[0] == 'i' ? "an " : "a ") + t;
}

void unknown_key(const std::string& key, const std::string& full_key,
                 const std::vector<std::string>& known, const SettingOrigin& where) {
  std::string msg = "unknown key '" + full_key + "'";
  if (auto near = nearest_name(key, known)) msg += "; did you mean '" + *near + "'?";
  else msg += "; known keys here: " + join(known);
  throw ConfigError(where, full_key, msg);
}

void check_mode(const std::string& mode, const SettingOrigin& where, const std::string& key) {
  const auto& modes = valid_modes();
  if (std::find(modes.begin(), modes.end(), mode) != modes.end()) return;
  std::string msg = "unknown mode '" + mode + "'";
  if (auto near = nearest_name(mode, modes)) msg += "; did you mean '" + *near + "'?";
  msg += " Valid modes: " + join(modes);
  throw ConfigError(where, key, msg);
}

std::string scalar_to_string(const toml::node& n) {
  if (auto s = n.as_string()) return s->get();
  if (auto i = n.as_integer()) return std::to_string(i->get());
  if (auto f = n.as_floating_point()) {
    std::ostringstream os;
    os.precision(17);
    os << f->get();
    return os.str();
  }
  if (auto b = n.as_boolean()) return b->get() ? "true" : "false";
  return {};
}

}  // namespace

const std::vector<std::string>& valid_modes() {
  static const std::vector<std::string> m = {"default", "reduce-overhead", "max-autotune",
                                             "max-autotune-no-cudagraphs"};
  return m;
}

const std::vector<std::string>& builtin_backends() {
  static const std::vector<std::string> b = {"auto", "inductor", "cudagraphs", "ipex",
                                             "hpu_backend", "neuron"};
  return b;
}

std::string SettingOrigin::describe() const {
  if (line > 0) return source + ":" + std::to_string(line) + ":" + std::to_string(column);
  return source.empty() ? std::string("code") : source;
}

ConfigError::ConfigError(SettingOrigin where, std::string key, std::string what)
    : std::runtime_error(where.describe() + ": " + what),
      where_(std::move(where)),
      key_(std::move(key)) {}

std::optional<std::string> nearest_name(const std::string& name,
                                        const std::vector<std::string>& candidates) {
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        size_t sub = prev[j - 1] + (std::tolower(a[i - 1]) == std::tolower(b[j - 1]) ? 0 : 1);
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
      }
      std::swap(prev, cur);
    }
    return prev[b.size()];
  };
  std::optional<std::string> best;
  size_t best_d = 0;
  for (const auto& c : candidates) {
    size_t d = distance(name, c);
    if (!best || d < best_d) best = c, best_d = d;
  }
  // Close enough to be a typo: at most a third of the longer name, and at least one edit allowed.
  if (best && best_d <= std::max<size_t>(2, std::max(name.size(), best->size()) / 3)) return best;
  return std::nullopt;
}

std::string TrainingArguments::default_cache_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/kiln";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/kiln";
  return "/tmp/kiln-cache";
}

bool TrainingArguments::compile_enabled() const {
  return torch_compile || torch_compile_backend != "auto" || torch_compile_mode != "default";
}

TrainingArguments TrainingArguments::from_toml(const std::string& path) {
  TrainingArguments args;
  args.apply_toml(path);
  args.apply_env();
  return args;
}

TrainingArguments TrainingArguments::from_toml_string(const std::string& text,
                                                      const std::string& source_name) {
  TrainingArguments args;
  args.apply_toml_string(text, source_name);
  args.apply_env();
  return args;
}

void TrainingArguments::apply_toml(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError({path, 0, 0}, "", "cannot open the configuration file");
  std::stringstream ss;
  ss << in.rdbuf();
  apply_toml_string(ss.str(), path);
}

void TrainingArguments::apply_toml_string(const std::string& text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    SettingOrigin where{source, static_cast<int>(e.source().begin.line),
                        static_cast<int>(e.source().begin.column)};
    throw ConfigError(where, "", "TOML syntax error: " + std::string(e.description()));
  }

  static const std::vector<std::string> top_keys = {"compile", "training", "plugin", "logging"};
  static const std::vector<std::string> training_keys = {"max_grad_norm"};
  static const std::vector<std::string> compile_keys = {
      "torch_compile", "torch_compile_backend", "torch_compile_mode", "fullgraph",
      "recompile_limit", "plugin_dirs", "cache_dir"};
  static const std::vector<std::string> logging_keys = {"level"};

  auto expect_table = [&](const toml::node& n, const std::string& key) -> const toml::table& {
    if (!n.is_table())
      throw ConfigError(origin_of(n, source), key,
                        "key '" + key + "' must be a table, not " + a_type(n));
    return *n.as_table();
  };
  auto wrong_type = [&](const toml::node& n, const std::string& key, const char* want) {
    throw ConfigError(origin_of(n, source), key,
                      "key '" + key + "' must be " + std::string(want) + ", not " + a_type(n));
  };
  auto get_string = [&](const toml::node& n, const std::string& key) {
    if (!n.is_string()) wrong_type(n, key, "a string");
    return n.as_string()->get();
  };
  auto get_bool = [&](const toml::node& n, const std::string& key) {
    if (!n.is_boolean()) wrong_type(n, key, "a boolean");
    return n.as_boolean()->get();
  };

  for (const auto& [k, node] : root) {
    const std::string key(k.str());
    if (key == "compile") {
      for (const auto& [ck, v] : expect_table(node, key)) {
        const std::string name(ck.str());
        const std::string full = "compile." + name;
        const SettingOrigin where = origin_of(v, source);
        if (name == "torch_compile") {
          torch_compile = get_bool(v, full);
        } else if (name == "torch_compile_backend") {
          torch_compile_backend = get_string(v, full);
          if (torch_compile_backend.empty())
            throw ConfigError(where, full, "key '" + full + "' must not be empty; use \"auto\"");
          torch_compile = true;
        } else if (name == "torch_compile_mode") {
          torch_compile_mode = get_string(v, full);
          check_mode(torch_compile_mode, where, full);
          torch_compile = true;
        } else if (name == "fullgraph") {
          fullgraph = get_bool(v, full);
        } else if (name == "recompile_limit") {
          if (!v.is_integer()) wrong_type(v, full, "an integer");
          int64_t n = v.as_integer()->get();
          if (n < 0 || n > 1000000)
            throw ConfigError(where, full, "key '" + full + "' must be between 0 and 1000000, got " +
                                               std::to_string(n));
          recompile_limit = static_cast<int>(n);
        } else if (name == "plugin_dirs") {
          if (!v.is_array()) wrong_type(v, full, "an array of strings");
          plugin_dirs.clear();
          for (const auto& e : *v.as_array()) {
            if (!e.is_string())
              throw ConfigError(origin_of(e, source), full,
                                "every entry of '" + full + "' must be a string, not " + a_type(e));
            plugin_dirs.push_back(e.as_string()->get());
          }
        } else if (name == "cache_dir") {
          cache_dir = get_string(v, full);
          if (cache_dir.empty()) throw ConfigError(where, full, "key '" + full + "' must not be empty");
        } else {
          unknown_key(name, full, compile_keys, where);
        }
        origins[name] = where;
      }
    } else if (key == "training") {
      for (const auto& [tk, v] : expect_table(node, key)) {
        const std::string name(tk.str());
        const std::string full = "training." + name;
        const SettingOrigin where = origin_of(v, source);
        if (name != "max_grad_norm") unknown_key(name, full, training_keys, where);
        if (!v.is_number()) wrong_type(v, full, "a number");
        const double d = v.is_integer() ? static_cast<double>(v.as_integer()->get()) : v.as_floating_point()->get();
        if (!(d >= 0) || !std::isfinite(d))
          throw ConfigError(where, full, "key '" + full + "' must be a finite number >= 0 (0 turns clipping off), got " +
                                             scalar_to_string(v));
        max_grad_norm = d;
        origins[name] = where;
      }
    } else if (key == "logging") {
      for (const auto& [lk, v] : expect_table(node, key)) {
        const std::string name(lk.str());
        const std::string full = "logging." + name;
        if (name != "level") unknown_key(name, full, logging_keys, origin_of(v, source));
        std::string level = get_string(v, full);
        static const std::vector<std::string> levels = {"trace", "debug", "info", "warn",
                                                        "error", "critical", "off"};
        if (std::find(levels.begin(), levels.end(), level) == levels.end())
          throw ConfigError(origin_of(v, source), full,
                            "unknown log level '" + level + "'; valid levels: " + join(levels));
        log_level = level;
        origins["log_level"] = origin_of(v, source);
      }
    } else if (key == "plugin") {
      for (const auto& [pk, pv] : expect_table(node, key)) {
        const std::string plugin(pk.str());
        const std::string full = "plugin." + plugin;
        auto& opts = plugin_options[plugin];
        for (const auto& [ok, ov] : expect_table(pv, full)) {
          const std::string okey = full + "." + std::string(ok.str());
          if (!(ov.is_string() || ov.is_integer() || ov.is_floating_point() || ov.is_boolean()))
            throw ConfigError(origin_of(ov, source), okey,
                              "plugin option '" + okey + "' must be a string, integer, float or boolean, not " +
                                  a_type(ov));
          opts[std::string(ok.str())] = scalar_to_string(ov);
        }
      }
    } else {
      unknown_key(key, key, top_keys, origin_of(node, source));
    }
  }
}

void TrainingArguments::apply_env() {
  auto env = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (!v || !*v) return std::nullopt;
    return std::string(v);
  };
  if (auto v = env("KILN_BACKEND")) {
    torch_compile_backend = *v;
    torch_compile = true;
    origins["torch_compile_backend"] = {"environment (KILN_BACKEND)", 0, 0};
  }
  if (auto v = env("KILN_MODE")) {
    SettingOrigin where{"environment (KILN_MODE)", 0, 0};
    check_mode(*v, where, "KILN_MODE");
    torch_compile_mode = *v;
    torch_compile = true;
    origins["torch_compile_mode"] = where;
  }
  if (auto v = env("KILN_PLUGIN_PATH")) {
    // Colon-separated, searched before the configured plugin_dirs.
    std::vector<std::string> dirs;
    std::stringstream ss(*v);
    for (std::string d; std::getline(ss, d, ':');)
      if (!d.empty()) dirs.push_back(d);
    dirs.insert(dirs.end(), plugin_dirs.begin(), plugin_dirs.end());
    plugin_dirs = std::move(dirs);
    origins["plugin_dirs"] = {"environment (KILN_PLUGIN_PATH)", 0, 0};
  }
  if (auto v = env("KILN_CACHE_DIR")) {
    cache_dir = *v;
    origins["cache_dir"] = {"environment (KILN_CACHE_DIR)", 0, 0};
  }
  if (auto v = env("KILN_LOG_LEVEL")) {
    log_level = *v;
    origins["log_level"] = {"environment (KILN_LOG_LEVEL)", 0, 0};
  }
}

static SettingOrigin origin_or_code(const TrainingArguments& a, const std::string& key) {
  auto it = a.origins.find(key);
  return it == a.origins.end() ? SettingOrigin{"code", 0, 0} : it->second;
}

void TrainingArguments::validate() const {
  check_mode(torch_compile_mode, origin_or_code(*this, "torch_compile_mode"), "torch_compile_mode");
  if (recompile_limit < 0)
    throw ConfigError(origin_or_code(*this, "recompile_limit"), "recompile_limit",
                      "recompile_limit must not be negative, got " + std::to_string(recompile_limit));
  if (torch_compile_backend.empty())
    throw ConfigError(origin_or_code(*this, "torch_compile_backend"), "torch_compile_backend",
                      "torch_compile_backend must not be empty; use \"auto\"");
  if (!(max_grad_norm >= 0) || !std::isfinite(max_grad_norm))
    throw ConfigError(origin_or_code(*this, "max_grad_norm"), "max_grad_norm",
                      "max_grad_norm must be a finite number >= 0 (0 turns clipping off), got " +
                          std::to_string(max_grad_norm));
  static const std::vector<std::string> levels = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  if (std::find(levels.begin(), levels.end(), log_level) == levels.end())
    throw ConfigError(origin_or_code(*this, "log_level"), "log_level",
                      "unknown log level '" + log_level + "'; valid levels: " + join(levels));
}

void TrainingArguments::validate_backend(const std::vector<std::string>& available) const {
  if (torch_compile_backend == "auto") return;
  if (std::find(available.begin(), available.end(), torch_compile_backend) != available.end()) return;
  std::string msg = "unknown backend '" + torch_compile_backend + "'";
  if (auto near = nearest_name(torch_compile_backend, available)) msg += "; did you mean '" + *near + "'?";
  msg += " Backends found: " + (available.empty() ? std::string("(none)") : join(available));
  throw ConfigError(origin_or_code(*this, "torch_compile_backend"), "torch_compile_backend", msg);
}

}  // namespace kiln
