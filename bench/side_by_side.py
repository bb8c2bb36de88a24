#!/usr/bin/env python3
"""Runs kiln's and PyTorch's benchmarks one after the other on this machine and prints one table
(see scripts/bench). All numbers come from this run; ratios are eager/other (above 1: faster than
eager)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json(cmd, env=None, timeout=1800):
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    rows = []
    for line in out.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    if out.returncode not in (0, 1) or not rows:
        sys.stderr.write(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}\n")
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workloads", nargs="*", default=["mlp", "cnn", "gpt"])
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--mode", default="default")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--configs", default=None, help="torch.compile configurations for bench/reference.py")
    ap.add_argument("--json", default=None, help="also write every row to this file")
    a = ap.parse_args()

    cache = tempfile.mkdtemp(prefix="kiln-bench-cache-")
    env = dict(os.environ, KILN_CACHE_DIR=cache)
    rows = []
    for w in a.workloads:
        base = [a.kiln, "bench", w, "--device", a.device, "--backend", a.backend, "--mode", a.mode,
                "--steps", str(a.steps), "--json"]
        if a.device == "cpu":
            # LibTorch eager and kiln take turns step by step: a shared CPU whose load changes
            # during the run slows both alike (on CUDA the blocks of kiln bench are kept).
            base.append("--interleave")
        cold = run_json(base, env)
        warm = run_json(base, env)  # same cache directory: compiled kernels are found
        ref_cmd = [sys.executable, os.path.join(HERE, "reference.py"), w, "--device", a.device,
                   "--steps", str(a.steps)]
        if a.configs:
            ref_cmd += ["--configs", a.configs]
        ref = run_json(ref_cmd)
        rows.append({"workload": w, "kiln_cold": cold[0] if cold else None,
                     "kiln_warm": warm[0] if warm else None, "torch": ref})

    threads = os.environ.get("OMP_NUM_THREADS", str(os.cpu_count()))
    print(f"\nside by side on {a.device} ({threads} threads), backend {a.backend}, mode {a.mode}, "
          f"{a.steps} steps; ms/step (median), ratios = eager/x\n")
    head = ["workload", "LibTorch eager", "kiln", "kiln/eager", "PyTorch eager", "torch.compile (best)",
            "kiln vs compile", "kiln 1st step cold", "kiln 1st step warm", "compile 1st step"]
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for r in rows:
        k, kw = r["kiln_cold"] or {}, r["kiln_warm"] or {}
        torch_rows = [t for t in r["torch"] if "ms_per_step" in t]
        eager_py = next((t for t in torch_rows if t["config"] == "eager"), None)
        compiled = [t for t in torch_rows if t["config"] != "eager"]
        best = min(compiled, key=lambda t: t["ms_per_step"]) if compiled else None
        kiln_ms = kw.get("kiln_ms", k.get("kiln_ms"))
        eager_ms = kw.get("eager_ms", k.get("eager_ms"))
        fmt = lambda x, f="{:.2f}": f.format(x) if isinstance(x, (int, float)) else "—"
        print(" | ".join([
            r["workload"], fmt(eager_ms), fmt(kiln_ms),
            fmt(eager_ms / kiln_ms if eager_ms and kiln_ms else None, "{:.2f}x"),
            fmt(eager_py["ms_per_step"] if eager_py else None),
            (fmt(best["ms_per_step"]) + f" ({best['config']})") if best else "—",
            fmt(best["ms_per_step"] / kiln_ms if best and kiln_ms else None, "{:.2f}x"),
            fmt(k.get("kiln_first_step_s"), "{:.2f} s"), fmt(kw.get("kiln_first_step_s"), "{:.2f} s"),
            fmt(best["first_step_s"] if best else None, "{:.1f} s"),
        ]))
    print("\nevery PyTorch configuration (ms/step, first step, peak memory):")
    for r in rows:
        for t in r["torch"]:
            if "ms_per_step" in t:
                mem = t.get("peak_mem_bytes")
                print(f"  {r['workload']:4} {t['config']:28} {t['ms_per_step']:9.3f} ms  {t['first_step_s']:6.2f} s"
                      + (f"  {mem / 2**20:8.1f} MiB" if mem else ""))
    for r in rows:
        for t in r["torch"]:
            if "error" in t:
                print(f"note: PyTorch {t['config']} on {r['workload']}: {t['error']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
