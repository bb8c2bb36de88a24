#include "commands.h"

namespace kiln::cli {
int cmd_cache(int, char**) { return not_available_yet("cache", "lands with the inductor backend issue"); }
}  // namespace kiln::cli
