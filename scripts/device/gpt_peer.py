#!/usr/bin/env python3
"""PyTorch eager peer of bench/bench_gpt_e2e.cpp --device cuda: the same GPT-2 training step on the GPU.

    python3 scripts/device/gpt_peer.py [--model gpt2-124M] [--seq-len 1024] [--batch 8] [--steps 10]
                                       [--warmup 3] [--modes fp32,bf16] [--json out.json]

The model is bench/torch_peer/gpt_step_torch.cpp's (and memtrain's nn::GPT): pre-LN blocks, tanh GELU,
learned positions, causal attention (F.scaled_dot_product_attention), the head tied to wte, biases
everywhere, GPT-2 init (weights N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 L)), biases 0, LN 1).
AdamW (lr 3e-4, weight decay 0.1 on rank >= 2 parameters only, fused=True), random tokens, and the loop
    loss = cross_entropy(model(idx), targets); loss.backward(); opt.step(); zero_grad(set_to_none)
Modes: fp32 (TF32 off, as memtrain's f32 cuBLAS calls) and bf16 (torch.autocast(bfloat16) over f32
weights). Each step ends with torch.cuda.synchronize(); the median over the timed steps is reported with
tokens/s, and torch.cuda.max_memory_allocated() over the timed steps (reset after the warm-up, which makes
the optimizer state). One "RESULT impl=torch ..." line per mode, fields named as bench_gpt_e2e's.
Without CUDA (or torch) it says so and exits 0.
"""
import argparse
import json
import math
import statistics
import sys
import time

PRESETS = {  # vocab_size, block_size, n_layer, n_head, n_embd (nn::GPTConfig::preset)
    "tiny": (512, 64, 2, 2, 64),
    "small": (8192, 256, 6, 6, 384),
    "gpt2-124M": (50257, 1024, 12, 12, 768),
}


def build(torch, vocab, block, n_layer, n_head, n_embd):
    nn = torch.nn
    F = torch.nn.functional
    proj_std = 0.02 / math.sqrt(2 * n_layer)

    def linear(i, o, std):
        lin = nn.Linear(i, o, bias=True)
        nn.init.normal_(lin.weight, 0.0, std)
        nn.init.zeros_(lin.bias)
        return lin

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
            self.c_attn = linear(n_embd, 3 * n_embd, 0.02)
            self.attn_proj = linear(n_embd, n_embd, proj_std)
            self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
            self.c_fc = linear(n_embd, 4 * n_embd, 0.02)
            self.mlp_proj = linear(4 * n_embd, n_embd, proj_std)

        def attn(self, x):
            B, T, C = x.shape
            H, D = n_head, C // n_head
            q, k, v = self.c_attn(x).split(C, dim=-1)  # 3 x (B,T,C)
            heads = lambda t: t.view(B, T, H, D).transpose(1, 2)  # (B,H,T,D)
            y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
            return self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))

        def forward(self, x):
            h = x + self.attn(self.ln_1(x))
            return h + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(h)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, n_embd)
            self.wpe = nn.Embedding(block, n_embd)
            nn.init.normal_(self.wte.weight, 0.0, 0.02)
            nn.init.normal_(self.wpe.weight, 0.0, 0.02)
            self.h = nn.ModuleList([Block() for _ in range(n_layer)])
            self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)

        def loss(self, idx, targets):
            T = idx.shape[1]
            pos = torch.arange(T, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)  # (B,T,C)
            for b in self.h:
                x = b(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # (B,T,V), tied head
            return F.cross_entropy(logits.view(-1, vocab).float(), targets.view(-1))

    return GPT()


def run_mode(torch, args, mode):
    vocab, block, n_layer, n_head, n_embd = PRESETS[args.model]
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, as memtrain's cuBLAS calls
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1337)
    model = build(torch, vocab, block, n_layer, n_head, n_embd).cuda()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, fused=True)
    g = torch.Generator(device="cuda").manual_seed(42)
    idx = torch.randint(0, vocab, (args.batch, args.seq_len), device="cuda", generator=g)
    targets = torch.randint(0, vocab, (args.batch, args.seq_len), device="cuda", generator=g)
    nparams = sum(p.numel() for p in model.parameters())
    print("torch %s GPT %s (params %.2fM) B=%d T=%d mode=%s device=%s" %
          (torch.__version__, args.model, nparams * 1e-6, args.batch, args.seq_len, mode,
           torch.cuda.get_device_name(0)), flush=True)
    ms = []
    loss_value = float("nan")
    for s in range(args.warmup + args.steps):
        if s == args.warmup:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=(mode == "bf16")):
            loss = model.loss(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = 1e3 * (time.perf_counter() - t0)
        loss_value = loss.item()
        print("  step %2d%s %9.1f ms  loss %.4f" % (s, " (warm-up)" if s < args.warmup else "          ", dt,
                                                   loss_value), flush=True)
        if s >= args.warmup:
            ms.append(dt)
    median = statistics.median(ms)
    tok_s = args.batch * args.seq_len / (median * 1e-3)
    peak = torch.cuda.max_memory_allocated()
    print("RESULT impl=torch model=%s B=%d T=%d step_ms=%.1f tok_s=%.0f total_peak_bytes=%d alloc_mib=%.0f "
          "precision=%s optimizer=adamw-fused loss=%.4f device=cuda" %
          (args.model, args.batch, args.seq_len, median, tok_s, peak, peak / 2**20, mode, loss_value), flush=True)
    result = {"mode": mode, "step_ms": median, "tok_s": tok_s, "max_memory_allocated": peak, "loss": loss_value,
              "steps_ms": ms}
    del model, opt, loss
    torch.cuda.empty_cache()
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2-124M", choices=sorted(PRESETS))
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--modes", default="fp32,bf16")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print("gpt_peer: no torch (%s); skipped" % e)
        return 0
    if not torch.cuda.is_available():
        print("gpt_peer: torch %s sees no CUDA device; skipped" % torch.__version__)
        return 0
    if args.seq_len > PRESETS[args.model][1]:
        print("gpt_peer: seq-len %d exceeds block_size %d" % (args.seq_len, PRESETS[args.model][1]))
        return 1
    results = []
    for mode in args.modes.split(","):
        try:
            results.append(run_mode(torch, args, mode))
        except Exception as e:  # one failing mode (e.g. out of memory) must not hide the others
            print("gpt_peer: mode %s failed: %s" % (mode, e), flush=True)
            results.append({"mode": mode, "error": str(e)})
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "model": args.model,
                       "B": args.batch, "T": args.seq_len, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
