#include "log_capture.h"

#include <algorithm>

#include <spdlog/sinks/ringbuffer_sink.h>

#include "kiln/internal/logger.h"

struct LogCapture::Impl {
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000);
};

LogCapture::LogCapture() : impl_(std::make_unique<Impl>()) {
  impl_->sink->set_pattern("%l %v");
  kiln::logger()->sinks().push_back(impl_->sink);
  // Plugins' loggers ("kiln.<plugin>") made before this capture hold the sinks they were made with.
  spdlog::apply_all([&](const std::shared_ptr<spdlog::logger>& lg) {
    if (lg->name().rfind("kiln.", 0) == 0) lg->sinks().push_back(impl_->sink);
  });
}

LogCapture::~LogCapture() {
  auto drop = [&](const std::shared_ptr<spdlog::logger>& lg) {
    auto& sinks = lg->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), impl_->sink), sinks.end());
  };
  drop(kiln::logger());
  spdlog::apply_all([&](const std::shared_ptr<spdlog::logger>& lg) {
    if (lg->name().rfind("kiln.", 0) == 0) drop(lg);
  });
}

std::vector<std::string> LogCapture::warnings() const {
  std::vector<std::string> out;
  for (auto& line : impl_->sink->last_formatted())
    if (line.rfind("warning ", 0) == 0) out.push_back(line);
  return out;
}
