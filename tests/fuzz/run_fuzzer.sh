#!/bin/sh
# run_fuzzer.sh TARGET SECONDS SEEDS RUN DICT: TARGET for SECONDS on the seeds, new inputs in a fresh
# RUN folder (the seeds stay as they are), crash inputs as RUN/crash-*; exits non-zero on a finding.
set -e
target=$1 seconds=$2 seeds=$3 run=$4 dict=$5
rm -rf "$run"
mkdir -p "$run"
exec "$target" -max_total_time="$seconds" -max_len=8192 -dict="$dict" -artifact_prefix="$run/" "$run" "$seeds"
