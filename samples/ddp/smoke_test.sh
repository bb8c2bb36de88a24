#!/usr/bin/env bash
# The data-parallel sample through torchrun: two ranks (Gloo over loopback) train the character GPT
# for a few compiled steps; both end with the same parameters (the same checksum), rank 0 alone
# writes the metrics and the checkpoint, and the loss falls.
#   smoke_test.sh path/to/torchrun path/to/kiln_ddp
set -uo pipefail
torchrun=$1
bin=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; echo "$out"; exit 1; }
out=$(OMP_NUM_THREADS=1 timeout 240 "$torchrun" --standalone --nproc-per-node 2 --no-python "$bin" --steps 20 \
  --output-dir "$dir/run" 2>&1) || fail "exit $?"
[[ $out == *"2 ranks, "* ]] || fail "rank 0 did not see two ranks"
sum0=$(sed -n 's/.*rank 0 of 2: 20 steps, compiled, .*parameter checksum \(.*\)$/\1/p' <<<"$out")
sum1=$(sed -n 's/.*rank 1 of 2: 20 steps, compiled, .*parameter checksum \(.*\)$/\1/p' <<<"$out")
[[ -n $sum0 && -n $sum1 ]] || fail "both ranks must report 20 compiled steps"
[[ $sum0 == "$sum1" ]] || fail "the ranks' parameters differ: $sum0 against $sum1"
[[ -d $dir/run/checkpoint-20 && -s $dir/run/metrics.jsonl ]] || fail "no checkpoint-20 or metrics.jsonl from rank 0"
first=$(grep -o '"loss": *[0-9.]*' "$dir/run/metrics.jsonl" | head -1 | grep -o '[0-9.]*$')
last=$(grep -o '"loss": *[0-9.]*' "$dir/run/metrics.jsonl" | tail -1 | grep -o '[0-9.]*$')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "the logged loss did not fall: $first -> $last"
echo "ddp: 2 ranks, 20 compiled steps, parameters equal (checksum $sum0), loss $first -> $last"
