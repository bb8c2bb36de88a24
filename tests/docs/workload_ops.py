#!/usr/bin/env python3
"""The ATen ops of the reference workloads' steps, as docs/writing-a-backend.md lists them, checked.

  workload_ops.py check DOC --kiln KILN --out DIR
      runs `kiln bench W --backend eager` for mlp, cnn and gpt on the CPU with [debug] dump_dir in
      DIR/W, counts the ops of the graph kiln's passes leave (the dump after the last graph pass,
      *-dce_final.kir: what a plugin's claim is shown on the CPU) and compares them with DOC's table;
      exit 1 naming every op whose count differs.
  workload_ops.py table --kiln KILN --out DIR
      the same runs; prints the table in DOC's format.

DOC's table is the one under the heading "What the reference workloads run": a row per op,
| `aten::op.overload` | mlp | cnn | gpt |, each cell the op's node count in that workload's step,
or "—" for none. A small batch (--batch 2) keeps the runs short; the ops and their counts do not
depend on it.
"""
import argparse
import glob
import os
import re
import subprocess
import sys
from collections import Counter

WORKLOADS = ["mlp", "cnn", "gpt"]
HEADING = "What the reference workloads run"
# A node: its results (a value, or _ for one nothing reads), then " = <op>(".
NODE_OP = re.compile(r"^\s+(?:%\d+ :|_,).*? = ([a-z_0-9]+::[A-Za-z0-9_.]+)\(")


def measure(kiln, out):
    ops = {}
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    for w in WORKLOADS:
        d = os.path.join(out, w)
        for old in glob.glob(os.path.join(d, "*")):
            os.remove(old)
        env["KILN_DEBUG_DIR"] = d
        cmd = [kiln, "bench", w, "--backend", "eager", "--device", "cpu", "--steps", "4", "--batch", "2"]
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            sys.exit(f"workload_ops.py: {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        dumps = sorted(glob.glob(os.path.join(d, "*-dce_final.kir")))
        if len(dumps) != 1:
            sys.exit(f"workload_ops.py: expected one *-dce_final.kir in {d}, found {os.listdir(d) if os.path.isdir(d) else 'no folder'}")
        counts = Counter()
        with open(dumps[0], encoding="utf-8") as f:
            for line in f:
                m = NODE_OP.match(line)
                if m:
                    counts[m.group(1)] += 1
        if not counts:
            sys.exit(f"workload_ops.py: no nodes in {dumps[0]}")
        ops[w] = counts
    return ops


def table(ops):
    names = set().union(*ops.values())
    order = sorted(names, key=lambda n: (-sum(1 for w in WORKLOADS if ops[w][n]),
                                         -sum(ops[w][n] for w in WORKLOADS), n))
    lines = ["| op | " + " | ".join(WORKLOADS) + " |", "|---|" + "---:|" * len(WORKLOADS)]
    for n in order:
        lines.append(f"| `{n}` | " + " | ".join(str(ops[w][n]) if ops[w][n] else "—" for w in WORKLOADS) + " |")
    lines.append("| nodes | " + " | ".join(str(sum(ops[w].values())) for w in WORKLOADS) + " |")
    return "\n".join(lines)


def documented(doc):
    """{workload: Counter} from DOC's table, and the line of each op's row."""
    with open(doc, encoding="utf-8") as f:
        lines = f.read().split("\n")
    start = next((i for i, l in enumerate(lines) if l.startswith("#") and HEADING in l), None)
    if start is None:
        sys.exit(f"workload_ops.py: {doc} has no section '{HEADING}'")
    ops = {w: Counter() for w in WORKLOADS}
    rows = {}
    totals = None
    for i in range(start + 1, len(lines)):
        l = lines[i]
        if l.startswith("#"):
            break
        m = re.match(r"\|\s*`([^`]+)`\s*\|(.*)\|\s*$", l)
        t = re.match(r"\|\s*nodes\s*\|(.*)\|\s*$", l)
        if m:
            cells = [c.strip() for c in m.group(2).split("|")]
            rows[m.group(1)] = i + 1
            for w, c in zip(WORKLOADS, cells):
                if c not in ("—", "-", ""):
                    ops[w][m.group(1)] = int(c)
        elif t:
            totals = [int(c.strip()) for c in t.group(1).split("|")]
    if not rows:
        sys.exit(f"workload_ops.py: the section '{HEADING}' of {doc} has no table of ops")
    return ops, rows, totals


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["check", "table"])
    parser.add_argument("doc", nargs="?")
    parser.add_argument("--kiln", required=True)
    parser.add_argument("--out", required=True)
    a = parser.parse_args()
    if a.what == "check" and not a.doc:
        parser.error("check needs DOC")
    if a.what == "check":
        doc_ops, rows, totals = documented(a.doc)  # before the runs: a missing table fails fast
    measured = measure(a.kiln, a.out)
    if a.what == "table":
        print(table(measured))
        return 0
    wrong = []
    for n in sorted(set().union(*measured.values(), *doc_ops.values())):
        for w in WORKLOADS:
            if measured[w][n] != doc_ops[w][n]:
                where = f"{a.doc}:{rows[n]}" if n in rows else a.doc
                wrong.append(f"{where}: {n} in {w}: the table says {doc_ops[w][n] or '—'}, "
                             f"the step has {measured[w][n] or '—'}")
    want_totals = [sum(measured[w].values()) for w in WORKLOADS]
    if totals != want_totals:
        wrong.append(f"{a.doc}: the nodes row says {totals}, the steps have {want_totals}")
    for w in wrong:
        print(w)
    if wrong:
        print("FAIL: the table of the reference workloads' ops is not what kiln captures; measured:\n" + table(measured))
        return 1
    print("ok: " + ", ".join(f"{w} {want_totals[i]} nodes, {len(measured[w])} ops" for i, w in enumerate(WORKLOADS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
