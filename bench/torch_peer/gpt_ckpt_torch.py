#!/usr/bin/python3
"""PyTorch peer of bench/bench_gpt_e2e.cpp for activation checkpointing (bench/run_checkpoint_table.sh).

The model and loop of bench/torch_peer/gpt_step_torch.cpp, in Python: GPT-2 with pre-LN blocks, tanh GELU,
learned positions, head tied to wte, causal attention (torch 1.13's _scaled_dot_product_attention, the math
path on the CPU), fp32, no dropout; the loop is
    loss = cross_entropy(model(idx), targets); loss.backward(); opt.step(); zero_grad(set_to_none=True)
with AdamW (lr 3e-4, weight decay 0.1 on rank >= 2 parameters only). --checkpoint full wraps each block in
torch.utils.checkpoint.checkpoint(use_reentrant=False); none runs the blocks plainly. Tokens are random
(torch.randint from a generator seeded 42), not the C++ programs' mt19937 draws: the step's cost and memory
do not depend on the values.

"Saved bytes" (act_peak_bytes on the RESULT line): during each forward a saved_tensors_hooks pair sees every
tensor autograd saves for backward outside checkpointed regions, and the inputs torch.utils.checkpoint holds
for each region are added by hand (its non-reentrant form keeps them in a closure, not through the hooks;
inside a region the checkpoint's own hooks replace ours, so what a region drops is not seen). The figure is
the sum of nbytes of the distinct storages among them (a view counts its whole storage, once), excluding the
parameters' storages and the input token tensors. It is what is held for backward at the end of the forward;
the block that a checkpointed backward recomputes at a time is not in it. Peak RSS is VmHWM of the process
(the interpreter and torch's libraries included). torch's CPU allocator keeps no peak counter, so
total_peak_bytes is reported as 0. The hooks cost a Python call per saved tensor (a few hundred per step),
negligible beside a step of seconds.

Run: gpt_ckpt_torch.py [--model small|gpt2-124M|tiny] [--seq-len T] [--batch B] [--steps N] [--warmup W]
                       [--threads P] [--checkpoint none|full]
"""
import argparse
import math
import resource
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

# vocab_size, block_size, n_layer, n_head, n_embd: include/memtrain/nn/gpt_config.h's presets.
PRESETS = {
    "tiny": (512, 64, 2, 2, 64),
    "mini": (4096, 128, 4, 4, 256),
    "small": (8192, 256, 6, 6, 384),
    "gpt2-124M": (50257, 1024, 12, 12, 768),
}


def make_linear(n_in, n_out, std):
    lin = nn.Linear(n_in, n_out, bias=True)
    with torch.no_grad():
        lin.weight.normal_(0.0, std)
        lin.bias.zero_()
    return lin


class Block(nn.Module):
    def __init__(self, n_layer, n_head, n_embd):
        super().__init__()
        proj_std = 0.02 / math.sqrt(2.0 * n_layer)  # GPT-2's residual projections
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.c_attn = make_linear(n_embd, 3 * n_embd, 0.02)
        self.attn_proj = make_linear(n_embd, n_embd, proj_std)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.c_fc = make_linear(n_embd, 4 * n_embd, 0.02)
        self.mlp_proj = make_linear(4 * n_embd, n_embd, proj_std)

    def attn(self, x):
        B, T, C = x.shape
        H, D = self.n_head, C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=-1)  # 3 x (B,T,C)
        heads = lambda t: t.view(B, T, H, D).transpose(1, 2)  # (B,H,T,D)
        y, _ = F._scaled_dot_product_attention(heads(q), heads(k), heads(v), None, 0.0, False, True)
        return self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        h = x + self.attn(self.ln_1(x))
        return h + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(h)), approximate="tanh"))


class SavedBytes:
    """Sums nbytes of the distinct storages saved for backward while `counting` (see the module docstring)."""

    def __init__(self, excluded_tensors):
        self.excluded = {t.storage().data_ptr() for t in excluded_tensors}
        self.seen = set()
        self.bytes = 0

    def reset(self):
        self.seen.clear()
        self.bytes = 0

    def add(self, t):
        # A saved storage stays alive until backward, so its address cannot be reused within one forward.
        ptr = t.storage().data_ptr()
        if ptr not in self.excluded and ptr not in self.seen:
            self.seen.add(ptr)
            self.bytes += t.storage().nbytes()

    def pack(self, t):
        self.add(t)
        return t

    @staticmethod
    def unpack(t):
        return t


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        self.vocab_size = vocab_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        with torch.no_grad():
            self.wte.weight.normal_(0.0, 0.02)
            self.wpe.weight.normal_(0.0, 0.02)
        self.h = nn.ModuleList(Block(n_layer, n_head, n_embd) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)
        self.checkpointing = False

    def loss(self, idx, targets, saved):
        pos = torch.arange(idx.size(1), dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)  # (B,T,C)
        for block in self.h:
            if self.checkpointing:
                saved.add(x)  # the region's input, which checkpoint keeps
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # (B,T,V), tied head
        return F.cross_entropy(logits.view(-1, self.vocab_size), targets.view(-1))


def peak_rss_kib():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def cpu_seconds():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="small", choices=sorted(PRESETS))
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--checkpoint", default="none", choices=["none", "full"])
    # bf16: the forward under torch.autocast("cpu", torch.bfloat16), torch's CPU mixed precision (f32 weights).
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    a = p.parse_args()
    if a.steps < 1 or a.warmup < 0 or a.batch < 1 or a.seq_len < 1:
        p.error("need steps >= 1, warmup >= 0, batch >= 1, seq-len >= 1")
    V, block_size, L, H, C = PRESETS[a.model]
    if a.seq_len > block_size:
        p.error(f"seq-len {a.seq_len} exceeds block_size {block_size} of {a.model}")
    if a.threads > 0:
        torch.set_num_threads(a.threads)

    torch.manual_seed(1337)
    model = GPT(V, block_size, L, H, C)
    model.checkpointing = a.checkpoint == "full"
    params = list(model.parameters())
    decay = [q for q in params if q.dim() >= 2]
    no_decay = [q for q in params if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4)
    gen = torch.Generator().manual_seed(42)
    idx = torch.randint(0, V, (a.batch, a.seq_len), generator=gen)
    targets = torch.randint(0, V, (a.batch, a.seq_len), generator=gen)
    saved = SavedBytes(params + [idx, targets])

    nparams = sum(q.numel() for q in params)
    print(f"torch {torch.__version__} (python) GPT {a.model} (params {nparams * 1e-6:.2f}M) B={a.batch} "
          f"T={a.seq_len} threads={torch.get_num_threads()} checkpoint={a.checkpoint}")
    ms, cpu_ms, saved_bytes = [], [], []
    for s in range(a.warmup + a.steps):
        c0 = cpu_seconds()
        t0 = time.perf_counter()
        saved.reset()
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack), \
                torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = model.loss(idx, targets, saved)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = 1e3 * (time.perf_counter() - t0)
        dc = 1e3 * (cpu_seconds() - c0)
        warm = " (warm-up)" if s < a.warmup else "          "
        print(f"  step {s:2d}{warm} {dt:9.1f} ms  (cpu {dc:9.1f} ms)  loss {loss.item():.4f}  "
              f"saved {saved.bytes / 2**20:.1f} MiB", flush=True)
        if s >= a.warmup:
            ms.append(dt)
            cpu_ms.append(dc)
            saved_bytes.append(saved.bytes)
    med, cpu_med = median(ms), median(cpu_ms)
    tok_s = a.batch * a.seq_len / (med * 1e-3)
    rss_mib = peak_rss_kib() / 1024.0
    act = max(saved_bytes)
    print(f"median step {med:.1f} ms (cpu {cpu_med:.1f} ms), {tok_s:.0f} tokens/s, peak RSS {rss_mib:.0f} MiB, "
          f"saved for backward {act / 2**20:.1f} MiB")
    print(f"RESULT impl=torch-py model={a.model} B={a.batch} T={a.seq_len} threads={torch.get_num_threads()} "
          f"step_ms={med:.1f} cpu_ms={cpu_med:.1f} tok_s={tok_s:.0f} rss_mib={rss_mib:.0f} alloc_mib=0 "
          f"policy={a.checkpoint} act_peak_bytes={act} act_at_peak_bytes=0 total_peak_bytes=0 plan_kept_bytes=0 "
          f"precision={a.precision} weight_copies_peak_bytes=0 loss={loss.item():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
