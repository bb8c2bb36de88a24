#!/bin/sh
# cut_library_check.sh KILN PLUGIN WORK: the first 3000 bytes of PLUGIN (an interrupted copy) given to
# `kiln conformance` must be refused once, exit 2, with the reason, before any case maps it.
set -u
kiln=$1 plugin=$2 work=$3
mkdir -p "$work"
head -c 3000 "$plugin" > "$work/libkiln_cut.so"
"$kiln" conformance "$work/libkiln_cut.so" > "$work/out.txt" 2>&1
rc=$?
cat "$work/out.txt"
[ "$rc" -eq 2 ] || { echo "exit status $rc, expected 2"; exit 1; }
grep -Eq "libkiln_cut.so: not a loadable library: truncated: loadable segment [0-9]+ ends at byte [0-9]+, the file has 3000 bytes" "$work/out.txt" ||
  { echo "the reason is not in the output"; exit 1; }
[ "$(grep -c 'not a loadable library' "$work/out.txt")" -eq 1 ] || { echo "said more than once"; exit 1; }
