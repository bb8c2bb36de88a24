#include "commands.h"

namespace kiln::cli {
int cmd_bench(int, char**) { return not_available_yet("bench", "lands with the compile pipeline issue"); }
}  // namespace kiln::cli
