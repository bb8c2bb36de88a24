#!/usr/bin/env bash
# The image classifier, as it ships: a backend that compiles is chosen, every step after the
# warm-up and the capture runs compiled with no fallback to eager, the held-out accuracy goes from
# chance (0.25) to above 0.85, and the metrics file holds the evaluations' accuracies.
#   smoke_test.sh path/to/kiln_image_classifier
set -uo pipefail
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; echo "$out"; exit 1; }
out=$("$bin" --output-dir "$dir/run" 2>&1) || fail "exit $?"
[[ $out == *"backend: "* && $out != *"backend: eager"* ]] || fail "no compiling backend chosen"
[[ $out == *"300 steps in "*": 298 compiled, 2 eager (warm-up and capture); fallback: none"* ]] ||
  fail "298 of 300 steps compiled, with no fallback, expected"
before=$(sed -n 's/.*held-out accuracy \([0-9.]*\) before, \([0-9.]*\) after.*/\1/p' <<<"$out")
after=$(sed -n 's/.*held-out accuracy \([0-9.]*\) before, \([0-9.]*\) after.*/\2/p' <<<"$out")
[[ -n $before && -n $after ]] || fail "no accuracies"
awk -v b="$before" -v a="$after" 'BEGIN { exit !(b < 0.4 && a > 0.85) }' ||
  fail "held-out accuracy $before -> $after: expected below 0.4 before and above 0.85 after"
grep -q '"eval_accuracy"' "$dir/run/metrics.jsonl" || fail "no eval_accuracy in metrics.jsonl"
echo "image_classifier: held-out accuracy $before -> $after"
