#include "commands.h"

namespace kiln::cli {
int cmd_plugins(int, char**) { return not_available_yet("plugins", "lands with the plugin ABI issue"); }
}  // namespace kiln::cli
