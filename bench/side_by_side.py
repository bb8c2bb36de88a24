#!/usr/bin/env python3
"""Runs kiln's and PyTorch's benchmarks one after the other on this machine and prints one table
(see scripts/bench): per workload, LibTorch eager and kiln (`kiln bench`, run twice: cold and warm
compile cache) and every PyTorch configuration of bench/reference.py, each with its speed-up over
its own side's eager and kiln's speed-up over it. All numbers come from this run.

For gpt and gpt-medium it also prints each side's achieved TFLOP/s: the step's model FLOPs
(bench/reference.py's train_flops, at the workload's default batch and block size) over its time.

With --dynamic MIN:MAX, gpt (or gpt-medium, when it is the one workload named) at a sequence length
drawn per step from [MIN, MAX] instead (the same lengths on both sides, from --dynamic-seed):
`kiln bench W --dynamic` (LibTorch eager, kiln with the configuration's dynamic setting, kiln with
dynamic = false, kiln at the mean length) and `bench/reference.py W --dynamic` (PyTorch eager,
torch.compile with its default dynamic shapes; --configs for more), one table in tokens per second,
warm-up and steady state apart."""
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


def fmt(x, f="{:.2f}"):
    return f.format(x) if isinstance(x, (int, float)) else "—"


def ratio(num, den):
    return num / den if isinstance(num, (int, float)) and isinstance(den, (int, float)) and den > 0 else None


def table_rows(r, backend, mode):
    """One row per configuration of one workload: kiln bench's two sides, then every PyTorch one.
    Columns: configuration, ms/step, speed-up over the same side's eager, kiln's speed-up over it
    (its ms / kiln's ms: above 1, kiln is faster), first step, peak memory above the start."""
    k, kw = r["kiln_cold"] or {}, r["kiln_warm"] or {}
    kiln_ms = kw.get("kiln_ms", k.get("kiln_ms"))
    eager_ms = kw.get("eager_ms", k.get("eager_ms"))
    mib = lambda x: fmt(x, "{:.1f} MiB") if x else "—"
    runs_on = kw.get("runs_on", k.get("runs_on", "?"))
    rows = [
        ["LibTorch eager (kiln bench)", fmt(eager_ms, "{:.3f}"), "1.00x", fmt(ratio(eager_ms, kiln_ms), "{:.2f}x"), "—",
         mib(kw.get("eager_peak_mb"))],
        [f"**kiln** ({backend}, mode {mode}; runs on {runs_on})", fmt(kiln_ms, "{:.3f}"),
         fmt(ratio(eager_ms, kiln_ms), "{:.2f}x"), "—",
         fmt(k.get("kiln_first_step_s"), "{:.2f} s") + " cold / " + fmt(kw.get("kiln_first_step_s"), "{:.2f} s") + " warm",
         mib(kw.get("kiln_peak_mb"))],
    ]
    torch_rows = [t for t in r["torch"] if "ms_per_step" in t]
    eager_py = next((t["ms_per_step"] for t in torch_rows if t["config"] == "eager"), None)
    for t in torch_rows:
        above = t.get("peak_mem_above_start_bytes")
        rows.append([f"PyTorch {t['config']}", fmt(t["ms_per_step"], "{:.3f}"),
                     fmt(ratio(eager_py, t["ms_per_step"]), "{:.2f}x"),
                     fmt(ratio(t["ms_per_step"], kiln_ms), "{:.2f}x"), fmt(t["first_step_s"], "{:.2f} s"),
                     mib(above / 2**20 if above else None)])
    for t in r["torch"]:
        if "error" in t:
            rows.append([f"PyTorch {t['config']}", "did not run: " + t["error"], "", "", "", ""])
    return rows


def kernel_lines(r):
    """kiln bench --kernels of the warm run, one line per workload (CUDA: kernels; CPU: operators)."""
    kw = r["kiln_warm"] or {}
    kr = kw.get("kernels")
    if not kr:
        return []
    if not kr.get("ok"):
        return [f"  {r['workload']}: not measured: {kr.get('reason')}"]
    e, g = kr["eager"], kr["kiln"]
    if kr["unit"] == "cuda_kernels":
        return [f"  {r['workload']}: kernels per step eager {e['kernels_per_step']:.1f}, kiln {g['kernels_per_step']:.1f} "
                f"({g['generated_kernels_per_step']:.1f} generated: {100 * g['generated_share']:.1f} % of kiln's kernel "
                f"time); GPU busy per step eager {e['gpu_busy_us_per_step'] / 1e3:.3f} ms, kiln "
                f"{g['gpu_busy_us_per_step'] / 1e3:.3f} ms; launch calls per step eager {e['launch_calls_per_step']:.1f}, "
                f"kiln {g['launch_calls_per_step']:.1f} (+{g['graph_launches_per_step']:.1f} graph launches)"]
    return [f"  {r['workload']}: ATen operator calls per step (outermost) eager {e['op_calls_per_step']:.1f}, "
            f"kiln {g['op_calls_per_step']:.1f}"]


def dynamic_table(kiln, torch_rows, a):
    """The --dynamic table: one row per kiln mode and PyTorch configuration. "kiln vs it" is the
    first kiln mode's (the configuration's dynamic setting) tokens/s over the row's, over all steps
    (above 1: kiln is faster)."""
    f = lambda x, spec="{:.1f}": fmt(x, spec)
    rows = []
    modes = (kiln or {}).get("modes", [])
    kiln_tps = modes[1]["tokens_per_s"] if len(modes) > 1 else None
    kiln_eager = modes[0] if modes else {}
    for m in modes:
        rows.append([f"kiln bench: {m['name']}", m["runs_on"], f"{m['compiled_steps']}/{m['steps']}",
                     f"{m['compiles']} ({m['shape_specialisations']} specialised)" if m["key"] != "eager" else "—",
                     f(m["compile_s"], "{:.2f}") if m["key"] != "eager" else "—",
                     f"{m['warmup_s']:.2f} ({m['warmup_steps']})", f(m["steady_tokens_per_s"]),
                     fmt(ratio(m["steady_tokens_per_s"], kiln_eager.get("steady_tokens_per_s")), "{:.2f}x"),
                     f(m["tokens_per_s"]), fmt(ratio(m["tokens_per_s"], kiln_eager.get("tokens_per_s")), "{:.2f}x"),
                     fmt(ratio(kiln_tps, m["tokens_per_s"]), "{:.2f}x")])
    py_eager = next((t for t in torch_rows if t.get("config") == "eager" and "tokens_per_s" in t), {})
    for t in torch_rows:
        if "error" in t:
            rows.append([f"PyTorch {t['config']}", "did not run: " + t["error"]] + [""] * 9)
            continue
        compiled = t["config"] != "eager"
        rows.append([f"PyTorch {t['config']}", "torch.compile" if compiled else "eager", "—",
                     (f"{t['unique_graphs']} graphs ({t['recompiles']} recompiles"
                      + (", hit recompile_limit" if t.get("hit_recompile_limit") else "") + ")") if compiled else "—",
                     f(t["compile_s"], "{:.2f}") if compiled else "—", f"{t['warmup_s']:.2f} ({t['warmup_steps']})",
                     f(t["steady_tokens_per_s"]),
                     fmt(ratio(t["steady_tokens_per_s"], py_eager.get("steady_tokens_per_s")), "{:.2f}x"),
                     f(t["tokens_per_s"]), fmt(ratio(t["tokens_per_s"], py_eager.get("tokens_per_s")), "{:.2f}x"),
                     fmt(ratio(kiln_tps, t["tokens_per_s"]), "{:.2f}x")])
    return rows


def main_dynamic(a):
    cache = tempfile.mkdtemp(prefix="kiln-bench-cache-")
    env = dict(os.environ, KILN_CACHE_DIR=cache)
    steps = ["--steps", str(a.steps)] if a.steps_given else []
    w = a.workloads[0]
    kiln = run_json([a.kiln, "bench", w, "--device", a.device, "--backend", a.backend, "--mode", a.mode,
                     "--dynamic", a.dynamic, "--dynamic-seed", str(a.dynamic_seed), "--json"] + steps, env)
    ref_cmd = [sys.executable, os.path.join(HERE, "reference.py"), w, "--device", a.device, "--dynamic", a.dynamic,
               "--dynamic-seed", str(a.dynamic_seed)] + steps
    if a.configs:
        ref_cmd += ["--configs", a.configs]
    if a.timeout:
        ref_cmd += ["--timeout", str(a.timeout)]
    ref = run_json(ref_cmd)
    k = kiln[0] if kiln else {}
    d = k.get("dynamic", {})
    same = all(t.get("lengths") == d.get("lengths") for t in ref if "lengths" in t)
    threads = os.environ.get("OMP_NUM_THREADS", str(os.cpu_count()))
    print(f"\n{w} at sequence lengths {a.dynamic} on {a.device} ({threads} threads), seed {a.dynamic_seed}: "
          f"{k.get('steps', '?')} steps, {d.get('distinct_lengths', '?')} distinct lengths, mean "
          f"{fmt(d.get('mean_length'))}, batch {k.get('batch', '?')}; the same lengths on both sides: "
          f"{'yes' if same and d else 'NO'}. kiln backend {k.get('backend_selected', a.backend)}, mode {a.mode}, "
          f"its dynamic setting {k.get('config_dynamic', '?')}. Every step timed alone; warm-up = the first step and "
          f"every step that compiled; tok/s = batch x length summed over the steps / their time; \"vs its eager\" "
          f"against that side's eager; \"kiln vs it\" = kiln's (first kiln row) tok/s over all steps / its\n")
    head = ["configuration", "runs on", "compiled steps", "compiles", "compile s", "warm-up s (steps)",
            "steady tok/s", "vs its eager", "all tok/s", "vs its eager", "kiln vs it"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for row in dynamic_table(k, ref, a):
        print("| " + " | ".join(row) + " |")
    eager_k = next((m for m in k.get("modes", []) if m["key"] == "eager"), {})
    eager_py = next((t for t in ref if t.get("config") == "eager" and "final_loss" in t), {})
    if eager_k and eager_py:
        print(f"\nfinal loss after the same steps from the same weights: LibTorch eager {eager_k['final_loss']:.6g}, "
              f"PyTorch eager {eager_py['final_loss']:.6g}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"kiln": k, "torch": ref}, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workloads", nargs="*", default=["mlp", "cnn", "gpt"])
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--mode", default="default")
    ap.add_argument("--steps", type=int, default=None, help="steps (default 30; with --dynamic kiln bench's and "
                    "reference.py's default, 120)")
    ap.add_argument("--dynamic", default=None, metavar="MIN:MAX", help="gpt (or gpt-medium, named alone) at a "
                    "sequence length drawn per step from [MIN, MAX], both sides on the same lengths")
    ap.add_argument("--dynamic-seed", type=int, default=1234, help="with --dynamic: the lengths' seed")
    ap.add_argument("--configs", default=None, help="PyTorch configurations for bench/reference.py (comma-separated; "
                    "default: reference.py's for the device)")
    ap.add_argument("--timeout", type=int, default=None, help="seconds per PyTorch configuration (reference.py's "
                    "--timeout)")
    ap.add_argument("--kernels", action="store_true", help="also run kiln bench --kernels (on the warm run, after "
                    "its timed steps): kernels per step, GPU busy time and the generated kernels' share")
    ap.add_argument("--json", default=None, help="also write every row to this file")
    a = ap.parse_args()
    a.steps_given = a.steps is not None
    if a.dynamic is not None:
        if a.workloads == ["mlp", "cnn", "gpt"]:
            a.workloads = ["gpt"]
        if a.workloads not in (["gpt"], ["gpt-medium"]):
            raise SystemExit(f"--dynamic {a.dynamic!r}: one workload with a sequence length: gpt or gpt-medium")
        main_dynamic(a)
        return
    if a.steps is None:
        a.steps = 30

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
        warm = run_json(base + (["--kernels"] if a.kernels else []), env)  # same cache: compiled kernels are found
        ref_cmd = [sys.executable, os.path.join(HERE, "reference.py"), w, "--device", a.device,
                   "--steps", str(a.steps)]
        if a.configs:
            ref_cmd += ["--configs", a.configs]
        if a.timeout:
            ref_cmd += ["--timeout", str(a.timeout)]
        ref = run_json(ref_cmd)
        rows.append({"workload": w, "kiln_cold": cold[0] if cold else None,
                     "kiln_warm": warm[0] if warm else None, "torch": ref})

    threads = os.environ.get("OMP_NUM_THREADS", str(os.cpu_count()))
    print(f"\nside by side on {a.device} ({threads} threads), kiln backend {a.backend}, mode {a.mode}, {a.steps} steps; "
          f"ms/step is the median of five timed blocks; \"vs its eager\" = that side's eager ms / its ms "
          f"(LibTorch eager for kiln, PyTorch eager for PyTorch); \"kiln vs it\" = its ms / kiln's ms (above 1: "
          f"kiln is faster); peak = allocated above the start (CUDA: the caching allocator's statistics; CPU: "
          f"kiln's counting allocator for kiln bench, torch.profiler's memory events over the first steps for "
          f"PyTorch)\n")
    head = ["workload", "configuration", "ms/step", "vs its eager", "kiln vs it", "first step", "peak"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        for row in table_rows(r, a.backend, a.mode):
            print("| " + " | ".join([r["workload"]] + row) + " |")
    print()
    for r in rows:
        k, kw = r["kiln_cold"] or {}, r["kiln_warm"] or {}
        kiln_ms = kw.get("kiln_ms", k.get("kiln_ms"))
        compiled = [t for t in r["torch"] if "ms_per_step" in t and t["config"] != "eager"]
        if compiled and kiln_ms:
            best = min(compiled, key=lambda t: t["ms_per_step"])
            print(f"{r['workload']}: ratio kiln vs PyTorch's fastest here ({best['config']}, "
                  f"{best['ms_per_step']:.3f} ms/step): {best['ms_per_step'] / kiln_ms:.2f}x (kiln {kiln_ms:.3f} ms/step)")
    for r in rows:
        flops = next((t.get("model_flops_per_step") for t in r["torch"] if t.get("model_flops_per_step")), None)
        kw = r["kiln_warm"] or r["kiln_cold"] or {}
        if flops:
            tf = lambda ms: fmt(flops / (ms * 1e-3) / 1e12 if ms else None, "{:.3g}")
            sides = [f"LibTorch eager {tf(kw.get('eager_ms'))}", f"kiln {tf(kw.get('kiln_ms'))}"]
            sides += [f"PyTorch {t['config']} {tf(t['ms_per_step'])}" for t in r["torch"] if "ms_per_step" in t]
            print(f"{r['workload']}: achieved TFLOP/s ({flops / 1e12:.3f} TFLOP a step, bench/reference.py's "
                  f"train_flops): " + ", ".join(sides))
    lines = [line for r in rows for line in kernel_lines(r)]
    if lines:
        print("\nkiln bench --kernels (profiled steps, slower than the timed ones):")
        print("\n".join(lines))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
