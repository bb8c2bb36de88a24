#!/usr/bin/env python3
"""PyTorch's side of the side-by-side benchmark: the reference workloads of docs/workloads.md
(mlp, cnn, gpt, gpt-medium; mlp, cnn and gpt when none is named) with PyTorch eager,
torch.compile and PyTorch's best whole-step configurations, from the same torch==2.11.0 that
scripts/setup installs. kiln's own side is `kiln bench`; scripts/bench runs both and prints one
table.

A step is zero_grad, forward, loss, backward and optimizer.step() (gpt and gpt-medium on CUDA under
bf16 autocast), as in kiln's workloads. The configurations (--configs):
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
   "peak_mem_bytes", "peak_mem_above_start_bytes", "final_loss", "model_flops_per_step",
   "tflops_per_s"}
peak_mem_bytes is torch.cuda.max_memory_allocated() (parameters and batch included);
peak_mem_above_start_bytes leaves out what was allocated before the first step or warm-up (the
model and the batch), as kiln bench reports its peaks. Both include compilation and, for the
whole-step graphs, the warm-up and the graph's memory pool. On the CPU, where LibTorch keeps no
allocator statistics, peak_mem_above_start_bytes is counted from torch.profiler's memory events
(profile_memory=True: every CPU allocation and release with its size) over the first step and the
warm-up steps, where the peak falls (gradients and optimizer state are made, the compile runs);
peak_mem_bytes is null. The profiler's bookkeeping then slows first_step_s a little: --no-memory
leaves it out. A configuration that cannot run
prints {"workload", "device", "config", "error"}.
model_flops_per_step (gpt and gpt-medium; null for mlp and cnn) is the step's matrix-multiply work
by the usual count for transformers (train_flops below: 6 N B T + 12 L B T^2 C), and tflops_per_s
that over ms_per_step: the achieved TFLOP/s, whatever the configuration actually ran.

--dynamic MIN:MAX (gpt or gpt-medium; `kiln bench W --dynamic MIN:MAX` is kiln's side) trains the
model at a sequence length that changes every step, drawn uniformly from [MIN, MAX] with
splitmix64 from --dynamic-seed (1234), exactly as kiln's dynamic_lengths draws it; a step at length
T trains the first T tokens of every row of the batch, built from kiln bench's seed (1234), so that
PyTorch eager and LibTorch eager train the same numbers. Its configurations:
  eager                         PyTorch eager
  default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs
                                torch.compile(model, mode=M) with its default dynamic shapes
                                (dynamic=None: the first shape compiles static, a change of size
                                compiles again with that dimension dynamic)
  dynamic-false                 torch.compile(model, dynamic=False): a graph per shape, eager past
                                torch._dynamo.config.recompile_limit (8)
  static-mean                   torch.compile(model), every step at the lengths' mean (rounded)
The default set is eager and default. Every step is timed alone, ending in a device sync; a step is
warm-up when it is the first or when Dynamo compiled in it (a new graph, or compile time spent),
steady otherwise. One JSON object per configuration:
  {"workload", "device", "config", "dynamic", "length_seed", "steps", "batch", "distinct_lengths",
   "mean_length", "lengths" (the drawn ones), "static_length" (static-mean's, else null), "tokens", "tokens_per_s", "steady_tokens_per_s", "warmup_s",
   "warmup_steps", "steady_s", "steady_steps", "unique_graphs", "recompiles", "compile_s",
   "hit_recompile_limit", "first_step_s", "threads", "final_loss", "tflops_per_s",
   "steady_tflops_per_s"}
tflops_per_s and steady_tflops_per_s are train_flops at each step's length, summed over the steps
(all of them, or the steady ones), over their time.
tokens is batch x length summed over the steps; unique_graphs is torch._dynamo's
counters["stats"]["unique_graphs"]; recompiles the graphs compiled after the first step's;
compile_s torch._dynamo.utils.calculate_time_spent()'s total_wall_time (Dynamo, AOTAutograd and
Inductor, forward and backward). --lengths prints the lengths alone (no torch needed).
"""
import argparse
import json
import math
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
KILN_BENCH_SEED = 1234  # the weights' and batch's seed of kiln bench (core/cli/cmd_bench.cpp)
DYNAMIC_CONFIGS = ["eager", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs",
                   "dynamic-false", "static-mean"]
DEFAULT_DYNAMIC_CONFIGS = ["eager", "default"]
DEFAULT_CONFIGS = {
    "cpu": ["eager", "default", "compiled-model-compiled-optimizer"],
    "cuda": ["eager", "default", "reduce-overhead", "compiled-model-compiled-optimizer", "whole-step-graph",
             "whole-step-graph-compiled"],
}


# The sequence workloads, as kiln's make_workload builds them: gpt, a character GPT, and gpt-medium,
# GPT-2 small's shape (GPT-2's vocabulary 50257 padded to 50304, a multiple of 64, and GPT-2's tanh
# GELU). block: the context (the position embedding's rows, the batch's length; kiln's
# workload_block_size), batch: the batch size, each per device; gelu: F.gelu's `approximate`.
GPT_SHAPES = {
    "gpt": dict(block={"cpu": 64, "cuda": 256}, batch={"cpu": 8, "cuda": 64}, layers=6, heads=6, width=384,
                vocab=65, gelu="none"),
    "gpt-medium": dict(block={"cpu": 128, "cuda": 1024}, batch={"cpu": 1, "cuda": 8}, layers=12, heads=12,
                       width=768, vocab=50304, gelu="tanh"),
}
WORKLOADS = ["mlp", "cnn", "gpt", "gpt-medium"]
DEFAULT_WORKLOADS = ["mlp", "cnn", "gpt"]  # gpt-medium runs when named


def block_size(workload, device):
    """The workload's context: the longest sequence its position embedding holds (kiln's
    workload_block_size); 0 for mlp and cnn."""
    return GPT_SHAPES[workload]["block"][device] if workload in GPT_SHAPES else 0


def train_flops(workload, batch, length):
    """A training step's model FLOPs for gpt and gpt-medium at `batch` sequences of `length` tokens
    (None for mlp and cnn), counted as nanoGPT's estimate_mfu and PaLM's appendix B count them:

        6 * N * B * T + 12 * L * B * T^2 * C,    N = 12 * L * C^2 + C * V

    N is the weights of the matrix multiplies: per block qkv (3 C^2), proj (C^2), fc (4 C^2) and out
    (4 C^2), and the head (C V). Each weight costs 2 FLOPs a token forward (a multiply and an add)
    and 4 backward (the input's gradient and the weight's): 6 N per token. Attention's two products,
    Q K^T and A V, cost 2 * 2 * T^2 * C a sequence a layer forward, three times that for the step:
    12 L T^2 C a sequence; the half the causal mask leaves out is counted, as that formula does.
    Biases, embeddings (lookups), LayerNorms, GELU, softmax, the loss and the optimizer are left out.
    gpt-medium on CUDA (B 8, T 1024): N = 123,568,128, 6.07e12 + 0.93e12 = 7.00e12 FLOPs a step."""
    if workload not in GPT_SHAPES:
        return None
    g = GPT_SHAPES[workload]
    L, C, V = g["layers"], g["width"], g["vocab"]
    n = 12 * L * C * C + C * V
    return 6 * n * batch * length + 12 * L * batch * length * length * C


def parse_dynamic(text):
    """"MIN:MAX" -> (MIN, MAX), 1 <= MIN <= MAX, or SystemExit naming the flag."""
    usage = "use MIN:MAX, two sequence lengths with 1 <= MIN <= MAX (e.g. 16:48)"
    parts = text.split(":")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise SystemExit(f"--dynamic {text!r}: {usage}")
    lo, hi = int(parts[0]), int(parts[1])
    if lo < 1 or lo > hi:
        raise SystemExit(f"--dynamic {text!r}: {usage}")
    return lo, hi


def dynamic_lengths(lo, hi, steps, seed):
    """kiln's dynamic_lengths (core/src/workloads/workloads.cpp), line for line: splitmix64 from
    seed, each length lo + z mod (hi - lo + 1)."""
    mask = (1 << 64) - 1
    state, out = seed & mask, []
    for _ in range(steps):
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z ^= z >> 31
        out.append(lo + z % (hi - lo + 1))
    return out


def mean_length(lengths):
    """The mean, rounded half away from zero as kiln's std::llround does."""
    return math.floor(sum(lengths) / len(lengths) + 0.5)


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
    elif workload in GPT_SHAPES:
        gpu = device == "cuda"
        g = GPT_SHAPES[workload]
        B, T, C, H, L, V = g["batch"][device], g["block"][device], g["width"], g["heads"], g["layers"], g["vocab"]
        gelu = g["gelu"]  # "none" (erf) for gpt, "tanh" for gpt-medium, as at::gelu in kiln's Block

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
                return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate=gelu))

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
        raise SystemExit(f"unknown workload {workload!r}; use {', '.join(WORKLOADS)}")
    model.to(dev)  # moves parameters in place: the optimizer keeps the same Parameter objects
    return model, opt, x.to(dev), y.to(dev), loss_fn, autocast


def cpu_peak_above_start(prof):
    """The most CPU memory allocated at once in a torch.profiler run with profile_memory=True,
    above what was allocated when it began: the running sum of its allocations and releases."""
    import json
    import os
    import tempfile
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.unlink(path)
    mem = sorted((e for e in events if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0),
                 key=lambda e: e["ts"])
    now = peak = 0
    for e in mem:
        now += e["args"]["Bytes"]
        peak = max(peak, now)
    return peak


def run_one(workload, device, config, steps, warmup, memory=True):
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
    mem_prof = None
    if not cuda and memory:
        from torch.profiler import ProfilerActivity, profile
        mem_prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        mem_prof.__enter__()
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
    cpu_peak = None
    if mem_prof is not None:
        mem_prof.__exit__(None, None, None)
        cpu_peak = cpu_peak_above_start(mem_prof)
    blocks = []
    per_block = max(1, steps // 5)
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(per_block):
            loss = step()
        sync()
        blocks.append((time.perf_counter() - t) * 1000 / per_block)
    ms = statistics.median(blocks)
    flops = train_flops(workload, x.shape[0], x.shape[1]) if workload in GPT_SHAPES else None
    return {
        "workload": workload, "device": device, "config": config,
        "ms_per_step": ms, "first_step_s": first, "steps": per_block * 5,
        "threads": torch.get_num_threads(),
        "peak_mem_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "peak_mem_above_start_bytes": torch.cuda.max_memory_allocated() - start_bytes if cuda else cpu_peak,
        "final_loss": float(loss.detach().float().item()),
        "model_flops_per_step": flops, "tflops_per_s": flops / (ms * 1e-3) / 1e12 if flops else None,
    }


def run_dynamic(workload, device, config, lengths, spec, seed):
    """gpt or gpt-medium at a changing sequence length (the module's docstring, --dynamic)."""
    import torch
    import torch._dynamo.utils as dynamo_utils
    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda, but torch.cuda.is_available() is False")
    if config in CUDA_ONLY and not cuda:
        raise SystemExit(f"{config} {CUDA_ONLY[config]}: it needs --device cuda")
    # kiln bench's seed (1234), so that both sides start from the same weights and batch and train
    # the same numbers at the same lengths (the final losses can be compared).
    model, opt, x, y, loss_fn, autocast = build(workload, device, seed=KILN_BENCH_SEED)
    drawn = lengths
    if config == "eager":
        fwd = model
    elif config == "dynamic-false":
        fwd = torch.compile(model, dynamic=False)
    elif config == "static-mean":
        fwd = torch.compile(model)
        lengths = [mean_length(lengths)] * len(lengths)
    else:
        fwd = torch.compile(model, mode=config)
    # Every length's batch made before the first step, as kiln bench does: the first T tokens of
    # every row (kiln's workload_batch).
    batches = {t: (x[:, :t].contiguous(), y[:, :t].contiguous()) for t in sorted(set(lengths))}
    batch = x.shape[0]

    def compile_seconds():
        return dynamo_utils.calculate_time_spent().get("total_wall_time", 0.0)

    def graphs():
        return dynamo_utils.counters["stats"]["unique_graphs"]

    dynamo_utils.counters.clear()
    c_start = compile_seconds()
    tokens = steady_tokens = warm_steps = steady_steps = flops = steady_flops = 0
    warm_s = steady_s = 0.0
    graphs_after_first = 0
    first = 0.0
    loss = None
    for i, t in enumerate(lengths):
        xb, yb = batches[t]
        g0, c0 = graphs(), compile_seconds()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(fwd(xb), yb)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        loss_value = float(loss.detach().float().item())
        if i == 0:
            first = dt
            graphs_after_first = graphs()
        warm = i == 0 or graphs() != g0 or compile_seconds() != c0
        tokens += batch * t
        flops += train_flops(workload, batch, t)
        if warm:
            warm_s += dt
            warm_steps += 1
        else:
            steady_s += dt
            steady_steps += 1
            steady_tokens += batch * t
            steady_flops += train_flops(workload, batch, t)
    unimplemented = dynamo_utils.counters.get("unimplemented", {})
    return {
        "workload": workload, "device": device, "config": config, "dynamic": spec,
        "length_seed": seed, "steps": len(lengths), "batch": batch,
        "distinct_lengths": len(set(drawn)), "mean_length": sum(drawn) / len(drawn), "lengths": drawn,
        "static_length": lengths[0] if config == "static-mean" else None,
        "tokens": tokens, "tokens_per_s": tokens / (warm_s + steady_s),
        "steady_tokens_per_s": steady_tokens / steady_s if steady_s > 0 else None,
        "warmup_s": warm_s, "warmup_steps": warm_steps, "steady_s": steady_s, "steady_steps": steady_steps,
        "unique_graphs": graphs(), "recompiles": graphs() - graphs_after_first,
        "compile_s": compile_seconds() - c_start,
        "hit_recompile_limit": any("recompile limit" in k.lower() or "recompile_limit" in k for k in unimplemented),
        "first_step_s": first, "threads": torch.get_num_threads(), "final_loss": loss_value,
        "tflops_per_s": flops / (warm_s + steady_s) / 1e12,
        "steady_tflops_per_s": steady_flops / steady_s / 1e12 if steady_s > 0 else None,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workloads", nargs="*", default=DEFAULT_WORKLOADS,
                    help=f"of: {', '.join(WORKLOADS)} (default: {' '.join(DEFAULT_WORKLOADS)})")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--configs", default=None, help="comma-separated, of: " + ", ".join(CONFIGS) + "; default: "
                    + ",".join(DEFAULT_CONFIGS["cpu"]) + " on CPU, " + ",".join(DEFAULT_CONFIGS["cuda"]) + " on CUDA")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 50); with --dynamic every step "
                    "of the run (default 120)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-memory", dest="memory", action="store_false",
                    help="on the CPU: leave out the memory profiling of the first steps (peak_mem_above_start_bytes)")
    ap.add_argument("--timeout", type=int, default=None, help="seconds per configuration (default 300; with "
                    "--dynamic 1800: every new shape may compile)")
    ap.add_argument("--dynamic", default=None, metavar="MIN:MAX",
                    help="gpt or gpt-medium at a sequence length drawn per step from [MIN, MAX] (see above); "
                    "--steps is then every step of the run (default 120)")
    ap.add_argument("--dynamic-seed", type=int, default=1234, help="with --dynamic: the lengths' seed")
    ap.add_argument("--lengths", action="store_true", help="with --dynamic: print the lengths as JSON and exit")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child mode
    a = ap.parse_args()
    for w in a.workloads:
        if w not in WORKLOADS:
            raise SystemExit(f"unknown workload {w!r}; use {', '.join(WORKLOADS)}")
    if a.dynamic is not None:
        lo, hi = parse_dynamic(a.dynamic)
        if a.workloads == DEFAULT_WORKLOADS:
            a.workloads = ["gpt"]
        if len(a.workloads) != 1 or a.workloads[0] not in GPT_SHAPES:
            raise SystemExit(f"--dynamic {a.dynamic!r}: one workload with a sequence length: gpt or gpt-medium")
        workload = a.workloads[0]
        if hi > block_size(workload, a.device):
            raise SystemExit(f"--dynamic {a.dynamic!r}: MAX ({hi}) is above {workload}'s block size on {a.device} "
                             f"({block_size(workload, a.device)})")
        if a.steps is None:
            a.steps = 120
        if a.timeout is None:
            a.timeout = 1800
        lengths = dynamic_lengths(lo, hi, a.steps, a.dynamic_seed)
        if a.lengths:
            print(json.dumps({"dynamic": a.dynamic, "seed": a.dynamic_seed, "steps": a.steps, "lengths": lengths,
                              "distinct_lengths": len(set(lengths)), "static_length": mean_length(lengths)}))
            return
        configs = a.configs.split(",") if a.configs else DEFAULT_DYNAMIC_CONFIGS
        for c in configs:
            if c not in DYNAMIC_CONFIGS:
                raise SystemExit(f"unknown config {c!r} with --dynamic; use {', '.join(DYNAMIC_CONFIGS)}")
        if a.one:
            print(json.dumps(run_dynamic(workload, a.device, configs[0], lengths, a.dynamic, a.dynamic_seed)),
                  flush=True)
            return
        for c in configs:
            cmd = [sys.executable, os.path.abspath(__file__), workload, "--device", a.device, "--configs", c,
                   "--steps", str(a.steps), "--dynamic", a.dynamic, "--dynamic-seed", str(a.dynamic_seed), "--one"]
            run_child(cmd, workload, a.device, c, a.timeout)
        return
    if a.steps is None:
        a.steps = 50
    if a.timeout is None:
        a.timeout = 300
    configs = a.configs.split(",") if a.configs else DEFAULT_CONFIGS[a.device]
    for c in configs:
        if c not in CONFIGS:
            raise SystemExit(f"unknown config {c!r}; use {', '.join(CONFIGS)}")
    if a.one:
        print(json.dumps(run_one(a.workloads[0], a.device, configs[0], a.steps, a.warmup, a.memory)), flush=True)
        return
    for w in a.workloads:
        for c in configs:
            cmd = [sys.executable, os.path.abspath(__file__), w, "--device", a.device, "--configs", c,
                   "--steps", str(a.steps), "--warmup", str(a.warmup), "--one"] + ([] if a.memory else ["--no-memory"])
            run_child(cmd, w, a.device, c, a.timeout)


def run_child(cmd, workload, device, config, timeout):
    """One configuration in a process of its own: prints its JSON line, or one naming its error."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        line = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else None
        if line:
            print(line, flush=True)
        else:
            err = (out.stderr.strip().splitlines() or ["no output"])[-1]
            print(json.dumps({"workload": workload, "device": device, "config": config, "error": err}), flush=True)
    except subprocess.TimeoutExpired:
        print(json.dumps({"workload": workload, "device": device, "config": config,
                          "error": f"did not finish within {timeout} s"}), flush=True)


if __name__ == "__main__":
    main()
