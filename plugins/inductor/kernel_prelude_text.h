// The text of kernel_prelude.h, which every generated source begins with. The build embeds the
// header's bytes (embed_text.cmake): the prelude is written, compiled and tested as a real
// header, and the generated code carries it unchanged.
#pragma once

#include <string_view>

namespace kiln::inductor {

std::string_view kernel_prelude();

}  // namespace kiln::inductor
