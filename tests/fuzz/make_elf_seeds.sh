#!/bin/sh
# make_elf_seeds.sh CLANG SEED_C WORK CORPUS: a tiny shared library compiled by CLANG, whole and cut
# short at 64, 200 and 3000 bytes, each after the 8-byte file size the target reads first.
set -e
clang=$1 seed_c=$2 work=$3 corpus=$4
mkdir -p "$corpus"
"$clang" -shared -fPIC -O1 "$seed_c" -o "$work/seed.so"
printf '\000\000\000\000\000\000\000\000' | cat - "$work/seed.so" > "$corpus/whole"
for n in 72 208 3008; do head -c "$n" "$corpus/whole" > "$corpus/cut$n"; done
