#!/usr/bin/env bash
# The license classifier, as it ships: a backend that compiles is chosen, every step after the
# warm-up and the capture runs compiled with no fallback to eager (the EmbeddingBag included), the
# held-out accuracy rises from about chance (a third) to above one half and the evaluation loss
# falls by 0.15; a missing license folder is an error that names the file.
#   smoke_test.sh path/to/kiln_text_classifier
set -uo pipefail
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; echo "$out"; exit 1; }
out=$("$bin" --output-dir "$dir/run" 2>&1) || fail "exit $?"
[[ $out == *"backend: "* && $out != *"backend: eager"* ]] || fail "no compiling backend chosen"
[[ $out == *"300 steps in "*": 298 compiled, 2 eager (warm-up and capture); fallback: none"* ]] ||
  fail "298 of 300 steps compiled, with no fallback, expected"
number() { sed -n "s/.*$1 \([0-9.]*\) before, \([0-9.]*\) after.*/\\$2/p" <<<"$out"; }
acc_before=$(number "held-out accuracy" 1) acc_after=$(number "held-out accuracy" 2)
loss_before=$(number "evaluation loss" 1) loss_after=$(number "evaluation loss" 2)
[[ -n $acc_before && -n $acc_after && -n $loss_before && -n $loss_after ]] || fail "no accuracies or losses"
awk -v b="$acc_before" -v a="$acc_after" 'BEGIN { exit !(b < 0.45 && a > 0.5 && a > b + 0.15) }' ||
  fail "held-out accuracy $acc_before -> $acc_after: expected below 0.45 before, above 0.5 and 0.15 higher after"
awk -v b="$loss_before" -v a="$loss_after" 'BEGIN { exit !(a < b - 0.15) }' ||
  fail "evaluation loss $loss_before -> $loss_after did not fall by 0.15"
out=$("$bin" --licenses "$dir/none" --steps 2 2>&1)
[[ $? -eq 1 && $out == *"cannot read $dir/none/GPL-3"* ]] || fail "missing license file not reported"
echo "text_classifier: held-out accuracy $acc_before -> $acc_after, evaluation loss $loss_before -> $loss_after"
