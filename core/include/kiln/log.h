// Logging for all of kiln. Everything goes to the one spdlog logger named "kiln" (and per-plugin
// children "kiln.<plugin>"); library code never writes to std::cout.
//
// This header does not include spdlog on purpose: LibTorch ships its own fmt headers, and a
// translation unit that sees both LibTorch and the system spdlog/fmt does not compile. Code that
// includes LibTorch formats its message itself (c10::str) and calls these functions; LibTorch-free
// code may use kiln/internal/logger.h for the spdlog logger directly.
#pragma once

#include <string>

namespace kiln {

enum class LogLevel { trace, debug, info, warn, error, critical, off };

void log(LogLevel level, const std::string& message);
void log_plugin(const std::string& plugin, LogLevel level, const std::string& message);
bool log_enabled(LogLevel level);

inline void log_debug(const std::string& m) { log(LogLevel::debug, m); }
inline void log_info(const std::string& m) { log(LogLevel::info, m); }
inline void log_warn(const std::string& m) { log(LogLevel::warn, m); }
inline void log_error(const std::string& m) { log(LogLevel::error, m); }

// Level by name (trace, debug, info, warn, error, critical, off); throws std::invalid_argument.
// The level starts at initial_log_level() (kiln/config.h); TrainingArguments::log_level sets it
// for a compiled step.
void set_log_level(const std::string& level);

}  // namespace kiln
