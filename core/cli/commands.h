// The `kiln` tool's subcommands. Each lives in its own cmd_<name>.cpp; argv[0] is the subcommand.
#pragma once

namespace kiln::cli {

int cmd_probe(int argc, char** argv);
int cmd_plugins(int argc, char** argv);
int cmd_conformance(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_cache(int argc, char** argv);

// For subcommands that are not implemented yet: says so on stderr and returns 3.
int not_available_yet(const char* name, const char* what);

}  // namespace kiln::cli
