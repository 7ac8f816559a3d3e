#!/usr/bin/env python3
"""The PyTorch 2.x eager peer of bench/bench_gpt_e2e.cpp (and of gpt_step_torch.cpp, its libtorch 1.13 peer).

The same GPT-2 as gpt_step_torch.cpp, built by scripts/device/gpt_peer.py (the GPU peer): pre-LN blocks, tanh
GELU, learned positions, head tied to wte, causal attention, dropout 0, GPT-2 init (weights N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 L)), biases 0,
LayerNorm weight 1); AdamW (lr 3e-4) with the same two decay groups (weight decay 0.1 on rank >= 2 parameters,
0 on biases and LayerNorm gains); the same step loop:
    loss = cross_entropy(model(idx), targets); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)

Written as a PyTorch user writes it, with PyTorch's defaults: eager mode (no torch.compile), the default AdamW
(PyTorch picks its implementation), F.scaled_dot_product_attention(is_causal=True) (PyTorch picks the CPU
kernel: flash attention on CPU from 2.2 on), F.cross_entropy. --precision bf16 wraps forward + loss in
torch.autocast("cpu", dtype=torch.bfloat16); the backward runs outside it, the weights and AdamW stay f32.

The tokens are random (torch.Generator seeded 42), one fixed batch for every step as in the C++ programs;
their values differ from the C++ programs' (another generator), which does not change the work a step does.

Output lines match bench_gpt_e2e's, including the machine-readable "RESULT ..." line (step_ms = median step,
cpu_ms = median process CPU time per step, all threads, tok_s, rss_mib = peak RSS from getrusage, alloc_mib 0
since PyTorch's CPU allocator keeps no peak counter, base_rss_mib = the resident set right after `import torch`,
which the peak includes: the torch libraries' pages, large with a CUDA-enabled wheel).

Run: python gpt_step_pytorch.py [--model small|gpt2-124M|tiny] [--seq-len T] [--batch B] [--steps N]
                                [--warmup W] [--threads P] [--precision fp32|bf16]
(with a Python whose torch is 2.x: bash scripts/setup_torch2_venv.sh makes one).
"""

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import torch


def rss_mib():
    """The process's resident set now (VmRSS), in MiB; 0 where /proc is absent."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


# What importing torch alone keeps resident (its libraries): part of every peak RSS below, printed beside it.
BASE_RSS_MIB = rss_mib()

# The model is scripts/device/gpt_peer.py's (the GPU peer's): one PyTorch 2.x GPT for both peers.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "device"))
from gpt_peer import PRESETS, build  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="small", choices=sorted(PRESETS))
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads; 0 = PyTorch's default")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    a = ap.parse_args()
    if a.steps < 1:
        sys.exit("gpt_step_pytorch: --steps must be >= 1")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    cfg = PRESETS[a.model]
    if a.seq_len > cfg[1]:
        sys.exit("gpt_step_pytorch: seq-len exceeds block_size")
    torch.manual_seed(1337)
    model = build(torch, *cfg)

    # The two decay groups of optim::decay_groups: rank >= 2 decays, rank 0/1 (biases, LN gains) does not.
    params = list(model.parameters())
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=3e-4)

    gen = torch.Generator().manual_seed(42)
    idx = torch.randint(0, cfg[0], (a.batch, a.seq_len), generator=gen, dtype=torch.long)
    targets = torch.randint(0, cfg[0], (a.batch, a.seq_len), generator=gen, dtype=torch.long)
    autocast = a.precision == "bf16"
    nparams = sum(p.numel() for p in params)
    print(f"pytorch {torch.__version__} GPT {a.model} (params {nparams * 1e-6:.2f}M) B={a.batch} T={a.seq_len} "
          f"threads={torch.get_num_threads()} precision={a.precision} "
          f"cpu_capability={torch.backends.cpu.get_cpu_capability()}", flush=True)

    ms, cpu_ms = [], []
    loss_value = float("nan")
    for s in range(a.warmup + a.steps):
        c0 = time.process_time()
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model.loss(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_value = loss.item()  # the step's work is done by now (CPU ops are synchronous)
        dt = 1e3 * (time.perf_counter() - t0)
        dc = 1e3 * (time.process_time() - c0)
        tag = " (warm-up)" if s < a.warmup else "          "
        print(f"  step {s:2d}{tag} {dt:9.1f} ms  (cpu {dc:9.1f} ms)  loss {loss_value:.4f}", flush=True)
        if s >= a.warmup:
            ms.append(dt)
            cpu_ms.append(dc)

    median, cpu_median = statistics.median(ms), statistics.median(cpu_ms)
    tok_s = a.batch * a.seq_len / (median * 1e-3)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # ru_maxrss is KiB on Linux
    print(f"median step {median:.1f} ms (cpu {cpu_median:.1f} ms), {tok_s:.0f} tokens/s, peak RSS {rss_mib:.0f} MiB")
    print(f"RESULT impl=pytorch2 model={a.model} B={a.batch} T={a.seq_len} threads={torch.get_num_threads()} "
          f"step_ms={median:.1f} cpu_ms={cpu_median:.1f} tok_s={tok_s:.0f} rss_mib={rss_mib:.0f} alloc_mib=0 "
          f"base_rss_mib={BASE_RSS_MIB:.0f} precision={a.precision} loss={loss_value:.4f} torch={torch.__version__}", flush=True)


if __name__ == "__main__":
    main()
