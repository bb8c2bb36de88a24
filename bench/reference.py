#!/usr/bin/env python3
"""PyTorch's side of the side-by-side benchmark: the three reference workloads of
docs/workloads.md (mlp, cnn, gpt) with PyTorch eager and torch.compile, from the same
torch==2.11.0 that scripts/setup installs. kiln's own side is `kiln bench`; scripts/bench runs
both and prints one table.

Each configuration runs in its own process (as docs/workloads.md describes), so one compile does
not warm the next. Prints one JSON object per configuration on stdout:
  {"workload", "device", "config", "ms_per_step", "first_step_s", "steps", "peak_mem_bytes"}
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS = ["eager", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", "cudagraphs",
           "whole-step-graph"]


def build(workload, device, seed=0):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(seed)
    dev = torch.device(device)
    if workload == "mlp":
        model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(256, 784)
        y = torch.randint(0, 10, (256,))
        loss_fn = F.cross_entropy
        autocast = False
    elif workload == "cnn":
        def block(i, o, s):
            return [nn.Conv2d(i, o, 3, stride=s, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU()]
        model = nn.Sequential(*block(3, 32, 1), *block(32, 64, 2), *block(64, 128, 2),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(128, 3, 32, 32)
        y = torch.randint(0, 10, (128,))
        loss_fn = F.cross_entropy
        autocast = False
    elif workload == "gpt":
        gpu = device == "cuda"
        B, T, C, H, L, V = (64, 256, 384, 6, 6, 65) if gpu else (8, 64, 384, 6, 6, 65)

        class Attn(nn.Module):
            def __init__(self):
                super().__init__()
                self.qkv = nn.Linear(C, 3 * C)
                self.proj = nn.Linear(C, C)

            def forward(self, x):
                b, t, c = x.shape
                q, k, v = self.qkv(x).split(c, 2)
                q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.ln1, self.attn, self.ln2 = nn.LayerNorm(C), Attn(), nn.LayerNorm(C)
                self.fc, self.out = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

            def forward(self, x):
                x = x + self.attn(self.ln1(x))
                return x + self.out(F.gelu(self.fc(self.ln2(x))))

        class GPT(nn.Module):
            def __init__(self):
                super().__init__()
                self.tok, self.pos = nn.Embedding(V, C), nn.Embedding(T, C)
                self.blocks = nn.ModuleList(Block() for _ in range(L))
                self.ln_f, self.head = nn.LayerNorm(C), nn.Linear(C, V, bias=False)

            def forward(self, idx):
                x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
                for b in self.blocks:
                    x = b(x)
                return self.head(self.ln_f(x))

        model = GPT()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randint(0, V, (B, T))
        y = torch.randint(0, V, (B, T))
        loss_fn = lambda logits, t: F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t.reshape(-1))
        autocast = gpu
    else:
        raise SystemExit(f"unknown workload {workload!r}; use mlp, cnn or gpt")
    model.to(dev)  # moves parameters in place: the optimizer keeps the same Parameter objects
    return model, opt, x.to(dev), y.to(dev), loss_fn, autocast


def run_one(workload, device, config, steps, warmup):
    import torch
    model, opt, x, y, loss_fn, autocast = build(workload, device)
    fwd = model
    if config == "cudagraphs":
        fwd = torch.compile(model, backend="cudagraphs")
    elif config not in ("eager", "whole-step-graph"):
        fwd = torch.compile(model, mode=config)
    cuda = device == "cuda"

    def body():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(fwd(x), y)
        loss.backward()
        opt.step()
        return loss

    def step():
        opt.zero_grad(set_to_none=True)
        return body()

    if config == "whole-step-graph":
        # The hand-made bar: forward, backward and optimizer.step() captured by hand in
        # one torch.cuda.graph after a warm-up on a side stream (PyTorch's documented whole-network
        # recipe; AdamW needs capturable=True to keep its step counts on the device).
        if not cuda:
            raise SystemExit("whole-step-graph needs --device cuda")
        if isinstance(opt, torch.optim.AdamW):
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
        t_first = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            static_loss = body()
        capture_s = time.perf_counter() - t_first

        def step():  # noqa: F811 -- replays the recorded step
            graph.replay()
            return static_loss

    def sync():
        if cuda:
            torch.cuda.synchronize()

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    step()
    sync()
    first = time.perf_counter() - t0
    if config == "whole-step-graph":
        first += capture_s  # the eager warm-up and the capture came first
    for _ in range(warmup):
        step()
    sync()
    blocks = []
    per_block = max(1, steps // 5)
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(per_block):
            step()
        sync()
        blocks.append((time.perf_counter() - t) * 1000 / per_block)
    return {
        "workload": workload, "device": device, "config": config,
        "ms_per_step": statistics.median(blocks), "first_step_s": first, "steps": per_block * 5,
        "threads": torch.get_num_threads(),
        "peak_mem_bytes": torch.cuda.max_memory_allocated() if cuda else None,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workloads", nargs="*", default=["mlp", "cnn", "gpt"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--configs", default=None, help="comma-separated; default: eager,default on CPU, "
                    "eager,default,reduce-overhead,cudagraphs,whole-step-graph on CUDA")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per configuration")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child mode
    a = ap.parse_args()
    configs = a.configs.split(",") if a.configs else (
        ["eager", "default"] if a.device == "cpu" else ["eager", "default", "reduce-overhead", "cudagraphs", "whole-step-graph"])
    if a.one:
        print(json.dumps(run_one(a.workloads[0], a.device, configs[0], a.steps, a.warmup)), flush=True)
        return
    for w in a.workloads:
        for c in configs:
            if c not in CONFIGS:
                raise SystemExit(f"unknown config {c!r}; use {', '.join(CONFIGS)}")
            cmd = [sys.executable, os.path.abspath(__file__), w, "--device", a.device, "--configs", c,
                   "--steps", str(a.steps), "--warmup", str(a.warmup), "--one"]
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
                line = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else None
                if line:
                    print(line, flush=True)
                else:
                    err = (out.stderr.strip().splitlines() or ["no output"])[-1]
                    print(json.dumps({"workload": w, "device": a.device, "config": c, "error": err}), flush=True)
            except subprocess.TimeoutExpired:
                print(json.dumps({"workload": w, "device": a.device, "config": c,
                                  "error": f"did not finish within {a.timeout} s"}), flush=True)


if __name__ == "__main__":
    main()
