#include "commands.h"

namespace kiln::cli {
int cmd_probe(int, char**) { return not_available_yet("probe", "lands with the hardware probe issue"); }
}  // namespace kiln::cli
