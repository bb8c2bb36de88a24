#!/bin/sh
# make_plugin_seeds.sh DIR: seed inputs for fuzz_plugin_returns (fuzzed_plugin.c reads them in
# order): a well-formed plugin that claims, compiles and runs; one with a table too small; one
# built for another ABI major; one whose descriptor lacks its name.
set -e
d=$1
mkdir -p "$d"
# init: shape, minor, functions (available), name, version, vendor, descriptor size, description,
# device kinds, modes, capabilities, score; then available (flags, score, a short reason), claim
# (two nodes: 0 and 1), compile (an executable), execute (no error).
good='\000\002\040\001\010inductor\001\0050.1.0\001\004kiln\000\001\000\000\000\001\000\000\000\001'
good="$good"'\000\000\000\000\000\000\000\000\000\000\000\144'
good="$good"'\001\000\000\000\001\000\000\000\144\002ok\001\002\000\001\002\000\001'
printf "$good" > "$d/good"
printf '\001\002\000\000\010inductor' > "$d/small_table"
printf '\004\001\000\000\010inductor' > "$d/other_major"
printf '\000\002\000\000\000\004\0050.1.0\004kiln' > "$d/no_name"
