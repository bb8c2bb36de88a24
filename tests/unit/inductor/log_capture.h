// Captures what plugins log through the host (spdlog), for tests that check warnings. Its own TU:
// spdlog and LibTorch never meet in one translation unit.
#pragma once

#include <string>

namespace kiln::test {

void start_log_capture();  // attaches a sink to the "kiln.inductor" logger, clears what it holds
std::string captured_log();

}  // namespace kiln::test
