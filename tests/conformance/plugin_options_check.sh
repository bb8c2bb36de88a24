#!/usr/bin/env bash
# KILN_PLUGIN_OPTIONS reaches the plugin under test in every case process: inductor with a C++
# compiler that always fails (cxx=/bin/false) must fail the numeric case with the compile error,
# and pass it without the option.
#   plugin_options_check.sh path/to/kiln path/to/libkiln_inductor.so
set -uo pipefail
kiln=$1 plugin=$2
out=$(KILN_PLUGIN_OPTIONS=inductor.cxx=/bin/false "$kiln" conformance "$plugin" --filter Numeric.UnaryPointwise --seed 7 2>&1)
rc=$?
if [[ $rc -ne 1 || $out != *"claimed, then failed to compile"* ]]; then
  echo "with inductor.cxx=/bin/false: expected the case to fail to compile (exit 1), got exit $rc:"; echo "$out"; exit 1
fi
out=$("$kiln" conformance "$plugin" --filter Numeric.UnaryPointwise --seed 7 2>&1)
rc=$?
if [[ $rc -ne 0 ]]; then echo "without options: expected a pass, got exit $rc:"; echo "$out"; exit 1; fi
echo "KILN_PLUGIN_OPTIONS reaches the plugin in the conformance cases"
