#!/usr/bin/env bash
# The main job, short: with the settings of train.toml (read by default) and --steps 24 over its
# max_steps, 24 steps on windows of the licence texts of 16 to 64 characters, batches padded to
# their longest and run through the compiled step, make the evaluation loss fall, write the metrics
# file at the file's logging and evaluation steps, checkpoints, and loss.png, which must decode with
# Python's zlib and show both curves; --resume continues from the newest to 32 steps. --config
# reads another file; a bad key in it, and a missing text file, are errors that name them.
#   smoke_test.sh path/to/kiln_char_gpt
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; echo "$out"; exit 1; }
out=$("$bin" --steps 24 --output-dir "$dir/run" 2>&1) || fail "exit $?"
[[ $out == *"config: $here/train.toml"* ]] || fail "train.toml not read by default"
[[ $out == *"24 steps in"*", compiled;"* ]] || fail "24 compiled steps expected"
[[ $out == *"ms a step: LibTorch eager "*", kiln "*x\)* ]] || fail "no eager-vs-kiln timing"
before=$(sed -n 's/.*evaluation loss \([0-9.]*\) before, \([0-9.]*\) after.*/\1/p' <<<"$out")
after=$(sed -n 's/.*evaluation loss \([0-9.]*\) before, \([0-9.]*\) after.*/\2/p' <<<"$out")
[[ -n $before && -n $after ]] || fail "no evaluation losses"
awk -v b="$before" -v a="$after" 'BEGIN { exit !(a < b - 0.5) }' || fail "evaluation loss $before -> $after did not fall by 0.5"
[[ -s $dir/run/metrics.jsonl && -d $dir/run/checkpoint-24 ]] || fail "no metrics file or checkpoint-24"
# train.toml's logging_steps = 5 and eval_steps = 10.
# (JSON with or without spaces after its colons and commas.)
logged=$(grep -o '"step": *[0-9]*, *"epoch": *[0-9.e-]*, *"loss"' "$dir/run/metrics.jsonl" | grep -o '"step": *[0-9]*' | tr -d '"step: ' | xargs)
evaluated=$(grep '"eval_loss"' "$dir/run/metrics.jsonl" | grep -o '"step": *[0-9]*' | tr -d '"step: ' | xargs)
[[ $logged == "5 10 15 20" && $evaluated == "10 20" ]] ||
  fail "loss logged at steps '$logged' and evaluated at '$evaluated', not train.toml's '5 10 15 20' and '10 20'"
[[ $out == *"loss curves: $dir/run/loss.png"* ]] || fail "no loss.png reported"
python3 "$here/../loss_plot/check_png.py" "$dir/run/loss.png" 800 500 || fail "loss.png"
out=$("$bin" --steps 32 --output-dir "$dir/run" --resume 2>&1) || fail "resume: exit $?"
[[ $out == *"32 steps in"* && -d $dir/run/checkpoint-32 ]] || fail "resume did not reach step 32"
# pad_to_multiple_of = 64: every batch padded to the whole context, one shape (warm-up, capture, compiled).
printf 'torch_compile = true\nmax_steps = 3\nlogging_steps = 1\npad_to_multiple_of = 64\noutput_dir = "%s"\n' \
  "$dir/other" >"$dir/other.toml"
out=$("$bin" --config "$dir/other.toml" 2>&1) || fail "--config: exit $?"
[[ $out == *"3 steps in"*", compiled;"* && -d $dir/other/checkpoint-3 ]] || fail "--config $dir/other.toml not used"
printf 'torch_compile = true\nmax_steps = 2\nlearning_rat = 0.1\n' >"$dir/bad.toml"
out=$("$bin" --config "$dir/bad.toml" 2>&1)
[[ $? -eq 1 && $out == *"$dir/bad.toml:3:1: unknown key 'learning_rat'; did you mean 'learning_rate'?"* ]] ||
  fail "the bad key is not reported with its file, line and name"
out=$("$bin" --data "$dir/no-such-text" --steps 2 2>&1)
[[ $? -eq 1 && $out == *"cannot read $dir/no-such-text"* ]] || fail "missing text not reported"
echo "char_gpt: evaluation loss $before -> $after in 24 steps; resumed to 32; loss.png checked; --config and a bad key checked"
