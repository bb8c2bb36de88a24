#!/usr/bin/env bash
# The main job, short: 24 compiled steps on the GPL text make the evaluation loss fall, write the
# metrics file and checkpoints; --resume continues from the newest to 32 steps; a missing text file
# is an error that names it.
#   smoke_test.sh path/to/kiln_char_gpt
set -uo pipefail
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; echo "$out"; exit 1; }
out=$("$bin" --steps 24 --output-dir "$dir/run" 2>&1) || fail "exit $?"
[[ $out == *"24 steps in"*", compiled;"* ]] || fail "24 compiled steps expected"
before=$(sed -n 's/.*evaluation loss \([0-9.]*\) before, \([0-9.]*\) after.*/\1/p' <<<"$out")
after=$(sed -n 's/.*evaluation loss \([0-9.]*\) before, \([0-9.]*\) after.*/\2/p' <<<"$out")
[[ -n $before && -n $after ]] || fail "no evaluation losses"
awk -v b="$before" -v a="$after" 'BEGIN { exit !(a < b - 0.5) }' || fail "evaluation loss $before -> $after did not fall by 0.5"
[[ -s $dir/run/metrics.jsonl && -d $dir/run/checkpoint-24 ]] || fail "no metrics file or checkpoint-24"
out=$("$bin" --steps 32 --output-dir "$dir/run" --resume 2>&1) || fail "resume: exit $?"
[[ $out == *"32 steps in"* && -d $dir/run/checkpoint-32 ]] || fail "resume did not reach step 32"
out=$("$bin" --data "$dir/no-such-text" --steps 2 2>&1)
[[ $? -eq 1 && $out == *"cannot read the training text $dir/no-such-text"* ]] || fail "missing text not reported"
echo "char_gpt: evaluation loss $before -> $after in 24 steps; resumed to 32"
