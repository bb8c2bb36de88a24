#include "log_capture.h"

#include <memory>
#include <sstream>

#include <spdlog/sinks/ostream_sink.h>

#include "kiln/internal/logger.h"

namespace kiln::test {

namespace {
std::ostringstream& stream() {
  static std::ostringstream s;
  return s;
}
}  // namespace

void start_log_capture() {
  static std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink;
  auto lg = plugin_logger("inductor");
  if (!sink) {
    sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(stream());
    lg->sinks().push_back(sink);
  }
  lg->set_level(spdlog::level::debug);
  stream().str("");
}

std::string captured_log() { return stream().str(); }

}  // namespace kiln::test
