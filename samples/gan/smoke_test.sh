#!/usr/bin/env bash
# The GAN, as it ships: a backend that compiles is chosen, every step after the warm-up and the
# capture runs compiled with no fallback to eager (two optimizers and noise drawn inside one step),
# and the generated points move onto the ring: from under 10% within three spreads of a mode to
# more than 40% of them, and their mean distance to the nearest mode falls to under a third.
#   smoke_test.sh path/to/kiln_gan
set -uo pipefail
bin=$1
fail() { echo "FAIL: $*"; echo "$out"; exit 1; }
out=$("$bin" 2>&1) || fail "exit $?"
[[ $out == *"backend: "* && $out != *"backend: eager"* ]] || fail "no compiling backend chosen"
[[ $out == *"1000 steps in "*": 998 compiled, 2 eager (warm-up and capture); fallback: none"* ]] ||
  fail "998 of 1000 steps compiled, with no fallback, expected"
number() { sed -n "s/.*$1 \([0-9.]*\) before, \([0-9.]*\) after.*/\\$2/p" <<<"$out"; }
near_before=$(number "near a mode:" 1) near_after=$(number "near a mode:" 2)
dist_before=$(number "nearest mode" 1) dist_after=$(number "nearest mode" 2)
[[ -n $near_before && -n $near_after && -n $dist_before && -n $dist_after ]] || fail "no quality figures"
awk -v b="$near_before" -v a="$near_after" 'BEGIN { exit !(b < 0.1 && a > 0.4) }' ||
  fail "points near a mode $near_before -> $near_after: expected below 0.1 before and above 0.4 after"
awk -v b="$dist_before" -v a="$dist_after" 'BEGIN { exit !(a < b / 3) }' ||
  fail "mean distance to the nearest mode $dist_before -> $dist_after did not fall to under a third"
echo "gan: points near a mode $near_before -> $near_after, mean distance $dist_before -> $dist_after"
