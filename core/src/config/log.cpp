#include "kiln/internal/logger.h"

#include "kiln/config.h"

#include <mutex>
#include <stdexcept>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace kiln {

std::shared_ptr<spdlog::logger> logger() {
  static std::once_flag once;
  static std::shared_ptr<spdlog::logger> log;
  std::call_once(once, [] {
    log = spdlog::get("kiln");
    if (!log) {
      // stderr, so that tools printing JSON on stdout stay parseable.
      log = spdlog::stderr_color_mt("kiln");
      log->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%^%l%$] %v");
    }
    // Messages logged before any TrainingArguments is read already honour KILN_LOG_LEVEL.
    log->set_level(spdlog::level::from_str(initial_log_level()));
  });
  return log;
}

std::shared_ptr<spdlog::logger> plugin_logger(const std::string& plugin_name) {
  const std::string name = "kiln." + plugin_name;
  auto parent = logger();
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (auto existing = spdlog::get(name)) return existing;
  auto child = std::make_shared<spdlog::logger>(name, parent->sinks().begin(), parent->sinks().end());
  child->set_level(parent->level());
  // No set_pattern here: the sinks are the parent's, and a logger's set_pattern reformats every
  // sink it holds (a test's capture sink included).
  spdlog::register_logger(child);
  return child;
}

void set_log_level(const std::string& level) {
  if (level == "passive") return;  // Hugging Face's: the level stays as the program or the environment set it
  auto l = spdlog::level::from_str(level);
  if (l == spdlog::level::off && level != "off") throw std::invalid_argument("unknown log level '" + level + "'");
  logger()->set_level(l);
  spdlog::apply_all([&](const std::shared_ptr<spdlog::logger>& lg) {
    if (lg->name().rfind("kiln", 0) == 0) lg->set_level(l);
  });
}

static spdlog::level::level_enum to_spdlog(LogLevel l) {
  return static_cast<spdlog::level::level_enum>(static_cast<int>(l));
}

void log(LogLevel level, const std::string& message) { logger()->log(to_spdlog(level), message); }

void log_plugin(const std::string& plugin, LogLevel level, const std::string& message) {
  plugin_logger(plugin)->log(to_spdlog(level), message);
}

bool log_enabled(LogLevel level) { return logger()->should_log(to_spdlog(level)); }

}  // namespace kiln
