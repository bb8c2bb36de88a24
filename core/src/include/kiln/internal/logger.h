// The spdlog logger behind kiln/log.h, for LibTorch-free code (see the note in kiln/log.h).
#pragma once

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

#include "kiln/log.h"

namespace kiln {

std::shared_ptr<spdlog::logger> logger();
std::shared_ptr<spdlog::logger> plugin_logger(const std::string& plugin_name);

}  // namespace kiln
