#!/bin/sh
# make_probe_seeds.sh DIR: seed inputs for fuzz_probe_tree (its input format is in the target's
# header comment): a Gaudi2 machine, a Trainium one, an H200 one, and a tree of odd values.
set -e
d=$1
mkdir -p "$d"
cpu='aprocessor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nphysical id\t: 0\ncore id\t\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile amx_bf16\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\nphysical id\t: 0\ncore id\t\t: 1\n\000bMemTotal:       2113470464 kB\nMemFree: 1000 kB\n\000c0\n\000d0\n\000e0\n\000f1\n\000g1\n\000hData\n\000i48K\n\000j2048K\n\000'
printf "\022${cpu}k0x1da3\n\000l0x1020\n\000m0x120000\n\000" > "$d/gaudi2"
printf "\054${cpu}n0x1d0f\n\000o0x7164\n\000p0x088000\n\000" > "$d/trainium"
printf "\001${cpu}k0x10de\n\000l0x2335\n\000m0x030200\n\000" > "$d/h200"
printf '\077axx\000b-1 kB\000c99999999999999999999\000i0K\000k0x1da3\000l0x0001\000mzz\000n0x1d0f\000o0xffff\000p\000' > "$d/odd"
