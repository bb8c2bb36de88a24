#include "kiln_log.h"

#include <algorithm>

#include <spdlog/sinks/ringbuffer_sink.h>

#include "kiln/internal/logger.h"

namespace programs {

struct KilnLog::Impl {
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000);
};

namespace {

bool is_kiln_logger(const std::shared_ptr<spdlog::logger>& l) {
  return l->name() == "kiln" || l->name().rfind("kiln.", 0) == 0;
}

}  // namespace

KilnLog::KilnLog() : impl_(std::make_unique<Impl>()) {
  impl_->sink->set_pattern("%l %v");
  impl_->sink->set_level(spdlog::level::warn);
  // Plugin loggers copy the parent's sinks when they are made: the ones made before now need the
  // sink too; the ones made later inherit it from the parent.
  auto parent = kiln::logger();
  spdlog::apply_all([&](std::shared_ptr<spdlog::logger> l) {
    if (is_kiln_logger(l) && l != parent) l->sinks().push_back(impl_->sink);
  });
  parent->sinks().push_back(impl_->sink);
}

KilnLog::~KilnLog() {
  auto sink = impl_->sink;
  auto drop = [&](spdlog::logger& l) {
    auto& sinks = l.sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink), sinks.end());
  };
  drop(*kiln::logger());
  spdlog::apply_all([&](std::shared_ptr<spdlog::logger> l) {
    if (is_kiln_logger(l)) drop(*l);
  });
}

std::vector<std::string> KilnLog::warnings() const { return impl_->sink->last_formatted(); }

}  // namespace programs
