#!/bin/sh
# make_plugin_seeds.sh DIR: seed inputs for fuzz_plugin_returns (fuzzed_plugin.c reads them in
# order): a well-formed plugin that claims, compiles and runs; one with a table too small; tables
# of other majors (1.2 in the 1.x layout, 1.2 in a 2.x layout, 3.0, the largest major); one whose
# descriptor lacks its name.
set -e
d=$1
mkdir -p "$d"
# init: shape, major (5: the host's), minor (1: the next byte's value mod 5), functions (available),
# name, version, vendor, descriptor size, description,
# device kinds, modes, capabilities, score; then available (flags, score, a short reason), claim
# (two nodes: 0 and 1), compile (an executable), execute (no error).
good='\000\005\001\002\040\001\010inductor\001\0050.1.0\001\004kiln\000\001\000\000\000\001\000\000\000\001'
good="$good"'\000\000\000\000\000\000\000\000\000\000\000\144'
good="$good"'\001\000\000\000\001\000\000\000\144\002ok\001\002\000\001\002\000\001'
printf "$good" > "$d/good"
printf '\001\005\001\002\000\000\010inductor' > "$d/small_table"
# Another major: major (0: 1, 2: host+1 or +2, 3: the largest), minor, error functions (0: set),
# table layout (0: 1.2 whole, 1: 1.2 up to shutdown, 2: 2.0, 3: this SDK's).
printf '\000\000\001\002\000\000' > "$d/abi1_2_layout1"
printf '\000\000\001\002\000\003' > "$d/abi1_2_layout2"
printf '\000\002\000\001\000\000\002' > "$d/abi3"
printf '\020\003\001\000\000\001\002' > "$d/largest_major_init_fails"
printf '\000\005\001\002\000\000\000\004\0050.1.0\004kiln' > "$d/no_name"
