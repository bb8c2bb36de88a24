#!/usr/bin/env python3
"""Summarises one profiled step from Nsight Compute's CSV (`ncu --csv --metrics
gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size
... kiln bench W --device cuda --profiler-range`): the step's kernels and GPU time, the share of
kiln's generated kernels (named kiln_k<N>), and the kernels that cost most, grouped by name, grid
and block, with the memory speed each reached. With --sources (the `inductor` folder of
KILN_CACHE_DIR), each generated kernel is named with what it computes, from the comment line that
begins it in the source (`// kiln_k5: flat bf16[64,256,1536], 2 stages; grid 2112, block 256`);
names repeat across groups, so a name, grid and block can stand for several."""
import argparse
import collections
import csv
import glob
import os
import re
import sys

TIME_SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
BYTE_SCALE = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}
GENERATED = re.compile(r"^kiln_[kh][0-9]")


def read_launches(path):
    """One dict per profiled launch, in launch order: name, grid, block, us, bytes."""
    with open(path, newline="") as f:
        rows = [line for line in f if line.startswith('"')]
    if not rows:
        raise ValueError(f"{path}: no ncu CSV rows (lines starting with a quote); was it written by ncu --csv?")
    launches = collections.OrderedDict()
    for row in csv.DictReader(rows):
        missing = [k for k in ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value") if k not in row]
        if missing:
            raise ValueError(f"{path}: the CSV has no column {missing[0]!r}")
        k = launches.setdefault(row["ID"], {"name": row["Kernel Name"], "us": 0.0, "bytes": 0.0, "grid": "?",
                                            "block": "?"})
        metric, unit, value = row["Metric Name"], row["Metric Unit"], row["Metric Value"].replace(",", "")
        if metric == "gpu__time_duration.sum":
            if unit not in TIME_SCALE:
                raise ValueError(f"{path}: launch {row['ID']}: unknown time unit {unit!r}")
            k["us"] = float(value) * TIME_SCALE[unit]
        elif metric in ("dram__bytes_read.sum", "dram__bytes_write.sum"):
            if unit not in BYTE_SCALE:
                raise ValueError(f"{path}: launch {row['ID']}: unknown byte unit {unit!r}")
            k["bytes"] += float(value) * BYTE_SCALE[unit]
        elif metric == "launch__grid_size":
            k["grid"] = value
        elif metric == "launch__block_size":
            k["block"] = value
    return list(launches.values())


def read_whats(folder):
    """(name, grid, block) -> set of what the generated kernels of that launch shape compute."""
    whats = collections.defaultdict(set)
    files = glob.glob(os.path.join(folder, "*.cu"))
    if not files:
        raise ValueError(f"{folder}: no generated sources (*.cu); pass the inductor folder of KILN_CACHE_DIR")
    for path in files:
        with open(path) as f:
            for line in f:
                m = re.match(r"// (kiln_[kh]\S+): (.*); grid (\d+), block (\d+)$", line.rstrip("\n"))
                if m:
                    whats[(m.group(1), m.group(3), m.group(4))].add(m.group(2))
    return whats


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="ncu --csv output of one profiled step")
    ap.add_argument("--sources", help="the generated sources (KILN_CACHE_DIR's inductor folder)")
    ap.add_argument("--top", type=int, default=25, help="kernel groups to list (default 25)")
    a = ap.parse_args()
    try:
        launches = read_launches(a.csv)
        whats = read_whats(a.sources) if a.sources else {}
    except (OSError, ValueError) as e:
        sys.stderr.write(f"ncu_summary: {e}\n")
        return 2
    total = sum(k["us"] for k in launches)
    gen = [k for k in launches if GENERATED.match(k["name"])]
    gen_us = sum(k["us"] for k in gen)
    print(f"{len(launches)} kernels, {total:.1f} us of GPU time; generated: {len(gen)} kernels, {gen_us:.1f} us "
          f"({100 * gen_us / total if total else 0:.1f} %)")
    groups = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for k in launches:
        g = groups[(k["name"], k["grid"], k["block"])]
        g[0] += 1
        g[1] += k["us"]
        g[2] += k["bytes"]
    print(f"{'us':>9} {'launches':>8} {'TB/s':>6}  kernel")
    for (name, grid, block), (n, us, by) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:a.top]:
        speed = by / us / 1e6 if us > 0 else 0.0
        label = name if len(name) <= 60 else name[:57] + "..."
        what = " | ".join(sorted(whats.get((name, grid, block), ())))
        print(f"{us:9.1f} {n:8d} {speed:6.2f}  {label} (grid {grid}, block {block})" + (f": {what}" if what else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
