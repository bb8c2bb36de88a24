#!/usr/bin/env python3
"""PyTorch's side of the side-by-side benchmark: the three reference workloads of
docs/workloads.md (mlp, cnn, gpt) with PyTorch eager, torch.compile and PyTorch's best
whole-step configurations, from the same torch==2.11.0 that scripts/setup installs. kiln's own
side is `kiln bench`; scripts/bench runs both and prints one table.

A step is zero_grad, forward, loss, backward and optimizer.step() (gpt on CUDA under bf16
autocast), as in kiln's workloads. The configurations (--configs):
  eager                         PyTorch eager
  default, max-autotune, max-autotune-no-cudagraphs
                                the model compiled with torch.compile(model, mode=M); the loss,
                                backward's driver and the optimizer run eagerly
  reduce-overhead               the same with mode="reduce-overhead" (CUDA graphs of the forward
                                and backward; CUDA only)
  cudagraphs                    torch.compile(model, backend="cudagraphs") (CUDA only)
  compiled-model-compiled-optimizer
                                the model compiled (default mode) and optimizer.step() compiled
                                too, as PyTorch's tutorial on compiling the optimizer does
                                (torch.compile(fullgraph=False) around a function calling step())
  whole-step-graph              forward, loss, backward and optimizer.step() recorded by hand in
                                one torch.cuda.graph and replayed (PyTorch's whole-network
                                recipe: warm-up on a side stream, grads set to None before the
                                capture, AdamW(capturable=True)); eager kernels (CUDA only)
  whole-step-graph-compiled     the same with the model compiled (default mode) inside the graph
                                (CUDA only)
  whole-step-graph-max-autotune the same with torch.compile(model, mode="max-autotune-no-cudagraphs")
                                (CUDA only; autotuning makes its first step long)

Each configuration runs in its own process (as docs/workloads.md describes), so one compile does
not warm the next, and is timed as `kiln bench` times: the first step alone (for the whole-step
graphs: the warm-up, the capture and the first replay), then a few untimed steps, then five
blocks of steps, each ending in one device synchronisation; ms_per_step is the median block's.
Prints one JSON object per configuration on stdout:
  {"workload", "device", "config", "ms_per_step", "first_step_s", "steps", "threads",
   "peak_mem_bytes", "peak_mem_above_start_bytes", "final_loss"}
peak_mem_bytes is torch.cuda.max_memory_allocated() (parameters and batch included);
peak_mem_above_start_bytes leaves out what was allocated before the first step or warm-up (the
model and the batch), as kiln bench reports its peaks. Both include compilation and, for the
whole-step graphs, the warm-up and the graph's memory pool. A configuration that cannot run
prints {"workload", "device", "config", "error"}.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS = ["eager", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", "cudagraphs",
           "compiled-model-compiled-optimizer", "whole-step-graph", "whole-step-graph-compiled",
           "whole-step-graph-max-autotune"]
# Configurations that record CUDA graphs: on the CPU they would run without graphs and time
# something else than their name says, so they refuse to run there.
CUDA_ONLY = {
    "reduce-overhead": "records CUDA graphs of the compiled model",
    "cudagraphs": "records CUDA graphs of the model",
    "whole-step-graph": "records the whole step in one CUDA graph",
    "whole-step-graph-compiled": "records the whole step in one CUDA graph",
    "whole-step-graph-max-autotune": "records the whole step in one CUDA graph",
}
# The model inside each whole-step graph: eager, or compiled with this torch.compile mode.
WHOLE_STEP_GRAPH = {"whole-step-graph": None, "whole-step-graph-compiled": "default",
                    "whole-step-graph-max-autotune": "max-autotune-no-cudagraphs"}
DEFAULT_CONFIGS = {
    "cpu": ["eager", "default", "compiled-model-compiled-optimizer"],
    "cuda": ["eager", "default", "reduce-overhead", "compiled-model-compiled-optimizer", "whole-step-graph",
             "whole-step-graph-compiled"],
}


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
    cuda = device == "cuda"
    if config in CUDA_ONLY and not cuda:
        raise SystemExit(f"{config} {CUDA_ONLY[config]}: it needs --device cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda, but torch.cuda.is_available() is False")
    model, opt, x, y, loss_fn, autocast = build(workload, device)
    graphed = config in WHOLE_STEP_GRAPH
    if graphed and isinstance(opt, torch.optim.AdamW):
        # Same hyper-parameters (build's), with the step count on the device so that the update
        # can be recorded; SGD keeps no host state and is recorded as it is.
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)

    if config in ("eager", "whole-step-graph"):
        fwd = model
    elif config == "cudagraphs":
        fwd = torch.compile(model, backend="cudagraphs")
    elif config == "compiled-model-compiled-optimizer":
        fwd = torch.compile(model)
    elif graphed:
        fwd = torch.compile(model, mode=WHOLE_STEP_GRAPH[config])
    else:
        fwd = torch.compile(model, mode=config)

    opt_step = opt.step
    if config == "compiled-model-compiled-optimizer":
        # PyTorch's recipe for compiling the optimizer: the step() call inside a compiled
        # function (Dynamo makes the update capturable on CUDA itself).
        @torch.compile(fullgraph=False)
        def opt_step():
            opt.step()

    def body():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(fwd(x), y)
        loss.backward()
        opt_step()
        return loss

    def step():
        opt.zero_grad(set_to_none=True)
        return body()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    if cuda:
        sync()
        torch.cuda.reset_peak_memory_stats()
        start_bytes = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    if graphed:
        # The whole step by hand in one torch.cuda.graph: warm-up steps on a side stream (they
        # compile the model when it is compiled, and create the optimizer state), the gradients
        # set to None, then one capture of forward, loss, backward and step(): backward writes
        # fresh .grad tensors from the graph's pool, which every replay overwrites, so the
        # recorded step needs no zero_grad of its own.
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

        def step():  # noqa: F811 -- replays the recorded step on the static batch
            graph.replay()
            return static_loss

    loss = step()
    sync()
    first = time.perf_counter() - t0  # with a whole-step graph: warm-up, capture, first replay
    for _ in range(warmup):
        loss = step()
    sync()
    blocks = []
    per_block = max(1, steps // 5)
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(per_block):
            loss = step()
        sync()
        blocks.append((time.perf_counter() - t) * 1000 / per_block)
    return {
        "workload": workload, "device": device, "config": config,
        "ms_per_step": statistics.median(blocks), "first_step_s": first, "steps": per_block * 5,
        "threads": torch.get_num_threads(),
        "peak_mem_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "peak_mem_above_start_bytes": torch.cuda.max_memory_allocated() - start_bytes if cuda else None,
        "final_loss": float(loss.detach().float().item()),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workloads", nargs="*", default=["mlp", "cnn", "gpt"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--configs", default=None, help="comma-separated, of: " + ", ".join(CONFIGS) + "; default: "
                    + ",".join(DEFAULT_CONFIGS["cpu"]) + " on CPU, " + ",".join(DEFAULT_CONFIGS["cuda"]) + " on CUDA")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per configuration")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child mode
    a = ap.parse_args()
    configs = a.configs.split(",") if a.configs else DEFAULT_CONFIGS[a.device]
    for c in configs:
        if c not in CONFIGS:
            raise SystemExit(f"unknown config {c!r}; use {', '.join(CONFIGS)}")
    if a.one:
        print(json.dumps(run_one(a.workloads[0], a.device, configs[0], a.steps, a.warmup)), flush=True)
        return
    for w in a.workloads:
        for c in configs:
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
