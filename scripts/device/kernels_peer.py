#!/usr/bin/env python3
"""PyTorch peer of bench/bench_cuda_kernels.cpp: the same kernel cases, timed the same way, same table and JSON.

    python3 scripts/device/kernels_peer.py [out.json]

Cases (random data, never zeros; GPT-2 124M shapes):
  attention: F.scaled_dot_product_attention(is_causal=True) on [B, H, T, D] = [8, 12, 1024, 64] head views of a
    fused [B, T, 3 * H * D] QKV tensor (nanoGPT's split / view / transpose), f32 and bf16. fwd is timed with
    grad enabled; fwd+bwd adds torch.autograd.grad(out, (q, k, v), dout); bwd = median(fwd+bwd) - median(fwd).
    FLOPs: 4 B H T^2 D / 2 for the forward, 2.5x for the backward.
  optimizer step on one f32 parameter of n = 124,439,808: torch.optim.AdamW fused=True (reported as
    adamw_step), foreach=True and foreach=False; bitsandbytes AdamW8bit when it imports. Lion has no torch
    peer. Bytes: n * (12 + 2 * state bytes per param), the state measured from the optimizer's state tensors.
  layer_norm: F.layer_norm over C = 768 of (N = 8192, C) with weight and bias, f32 and bf16; bwd through
    torch.autograd.grad(out, (x, w, b), dout).
  cross_entropy: F.cross_entropy (mean) of (N = 8192, V = 50304) logits with int64 targets, f32 and bf16; bwd
    through torch.autograd.grad(loss, logits).
Bytes and FLOPs are the same formulas as the C++ bench (the least each op must move), so GB/s is an
effective bandwidth comparable across the two.

Method: 3 warm-up calls, then torch.cuda._sleep for ~20 ms so the host is far ahead of the device, then 30
calls timed one by one with torch.cuda.Event pairs enqueued back to back, reported as the median. Small
cases rotate among enough buffer sets that one pass is >= 4x the 60 MB L2. Without CUDA (or without torch)
it says so and exits 0.
"""
import json
import math
import sys

L2_BYTES = 60_000_000
WARMUP = 3
REPS = 30
PAD_MS = 20.0

ATTN_B, ATTN_H, ATTN_T, ATTN_D = 8, 12, 1024, 64
OPTIM_N = 124_439_808
ROWS = 8192
LN_C = 768
VOCAB = 50304


def random_nonzero(torch, shape, dtype, lo, hi, positive=False):
    """Uniform magnitudes in [lo, hi) with random signs (unless positive), made on the GPU, rounded to dtype."""
    mag = torch.rand(shape, device="cuda", dtype=torch.float32) * (hi - lo) + lo
    if positive:
        return mag.to(dtype)
    sign = torch.randint(0, 2, shape, device="cuda", dtype=torch.int8).to(torch.float32) * 2 - 1
    return (mag * sign).to(dtype)


def buffer_sets(set_bytes):
    return int(min(max(math.ceil(4.0 * L2_BYTES / set_bytes), 1), 16))


class Pad:
    """torch.cuda._sleep sized to ~PAD_MS, enqueued before each timed series."""

    def __init__(self, torch):
        self.torch = torch
        self.cycles = 0
        if not hasattr(torch.cuda, "_sleep"):
            return
        probe = 1_000_000
        torch.cuda._sleep(probe)
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(probe)
        b.record()
        b.synchronize()
        ms = max(a.elapsed_time(b), 1e-3)
        self.cycles = int(min(probe * PAD_MS / ms, 100 * probe))  # at most ~50 ms at ~2 GHz

    def enqueue(self):
        if self.cycles:
            self.torch.cuda._sleep(self.cycles)


def median_ms(torch, pad, work):
    for i in range(WARMUP):
        work(i)
    pad.enqueue()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(REPS + 1)]
    events[0].record()
    for i in range(REPS):
        work(i)
        events[i + 1].record()
    events[-1].synchronize()
    ms = sorted(events[i].elapsed_time(events[i + 1]) for i in range(REPS))
    return ms[REPS // 2] if REPS % 2 else 0.5 * (ms[REPS // 2 - 1] + ms[REPS // 2])


def plan(name, dtype, flops=0.0, nbytes=0.0, state=0.0, note=""):
    return {"case": name, "dtype": dtype, "median_ms": 0.0, "flops": flops, "bytes": nbytes, "tflops": 0.0,
            "gbps": 0.0, "state_bytes_per_param": state, "note": note, "error": None}


def run_group(torch, results, group, body):
    """Runs body(group); an exception marks every case of the group not yet measured with the error."""
    try:
        body(group)
    except Exception as e:  # report and go on with the other cases
        for r in group:
            if not r["median_ms"]:
                r["error"] = "%s: %s" % (type(e).__name__, e)
    finally:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    for r in group:
        if r["median_ms"] > 0:
            if r["flops"]:
                r["tflops"] = r["flops"] / (r["median_ms"] * 1e-3) / 1e12
            if r["bytes"]:
                r["gbps"] = r["bytes"] / (r["median_ms"] * 1e-3) / 1e9
        if r["error"]:
            print("%s %s: error: %s" % (r["case"], r["dtype"], r["error"]), file=sys.stderr)
        else:
            print("%s %s: %.4f ms" % (r["case"], r["dtype"], r["median_ms"]), file=sys.stderr)
        results.append(r)


def fwd_bwd_rows(torch, pad, group, fwd, fwd_bwd):
    """group = [fwd, bwd, fwd+bwd] rows: times fwd and fwd+bwd, bwd as their difference."""
    f = median_ms(torch, pad, fwd)
    group[0]["median_ms"] = f
    fb = median_ms(torch, pad, fwd_bwd)
    group[2]["median_ms"] = fb
    if fb > f:
        group[1]["median_ms"] = fb - f
    else:
        group[1]["error"] = "fwd+bwd (%.4f ms) not above fwd (%.4f ms)" % (fb, f)


def dtype_of(torch, name):
    return torch.float32 if name == "f32" else torch.bfloat16


def bench_attention(torch, F, results, pad, dn):
    B, H, T, D = ATTN_B, ATTN_H, ATTN_T, ATTN_D
    C = H * D
    fwd_flops = 4.0 * B * H * T * T * D / 2
    note = "bwd = (fwd+bwd) - fwd"
    group = [plan("attention_fwd", dn, fwd_flops), plan("attention_bwd", dn, 2.5 * fwd_flops, note=note),
             plan("attention_fwd+bwd", dn, 3.5 * fwd_flops)]

    def body(group):
        dt = dtype_of(torch, dn)
        es = 4 if dn == "f32" else 2
        n = B * T * C
        sets = buffer_sets(8 * n * es + B * H * T * 4)
        qkvs = [random_nonzero(torch, (B, T, 3 * C), dt, 0.0625, 1.0).requires_grad_(True) for _ in range(sets)]
        douts = [random_nonzero(torch, (B, H, T, D), dt, 0.0625, 1.0) for _ in range(sets)]

        def forward(i):
            q, k, v = qkvs[i % sets].split(C, dim=2)
            q, k, v = (x.view(B, T, H, D).transpose(1, 2) for x in (q, k, v))
            return F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v)

        def fwd(i):
            forward(i)

        def fwd_bwd(i):
            out, qkv = forward(i)
            torch.autograd.grad(out, qkv, douts[i % sets])

        fwd_bwd_rows(torch, pad, group, fwd, fwd_bwd)

    run_group(torch, results, group, body)


def state_bytes_per_param(torch, opt, n):
    total = 0
    for state in opt.state.values():
        for t in state.values():
            if torch.is_tensor(t):
                total += t.numel() * t.element_size()
    return total / n


def bench_optimizer(torch, results, pad, name, note, make):
    """One optimizer step case on one parameter of OPTIM_N; make(params) builds the optimizer."""
    group = [plan(name, "f32", note=note)]

    def body(group):
        p = torch.nn.Parameter(random_nonzero(torch, (OPTIM_N,), torch.float32, 0.01, 0.1))
        p.grad = random_nonzero(torch, (OPTIM_N,), torch.float32, 1e-4, 1e-2)
        opt = make([p])
        opt.step()  # creates the state
        state = state_bytes_per_param(torch, opt, OPTIM_N)
        group[0]["state_bytes_per_param"] = state
        group[0]["bytes"] = OPTIM_N * (12 + 2 * state)
        group[0]["median_ms"] = median_ms(torch, pad, lambda i: opt.step())

    run_group(torch, results, group, body)


def bench_layer_norm(torch, F, results, pad, dn):
    N, C = ROWS, LN_C
    es = 4 if dn == "f32" else 2
    fwd_bytes = 2.0 * N * C * es + 2.0 * C * es + 8.0 * N
    bwd_bytes = 3.0 * N * C * es + 3.0 * C * es + 8.0 * N
    group = [plan("layer_norm_fwd", dn, nbytes=fwd_bytes),
             plan("layer_norm_bwd", dn, nbytes=bwd_bytes, note="bwd = (fwd+bwd) - fwd"),
             plan("layer_norm_fwd+bwd", dn, nbytes=fwd_bytes + bwd_bytes)]

    def body(group):
        dt = dtype_of(torch, dn)
        sets = buffer_sets(4 * N * C * es + 8 * N)
        xs = [random_nonzero(torch, (N, C), dt, 0.0625, 2.0).requires_grad_(True) for _ in range(sets)]
        douts = [random_nonzero(torch, (N, C), dt, 0.0625, 2.0) for _ in range(sets)]
        w = random_nonzero(torch, (C,), dt, 0.5, 1.5, positive=True).requires_grad_(True)
        b = random_nonzero(torch, (C,), dt, 0.0625, 0.5).requires_grad_(True)

        def fwd(i):
            return F.layer_norm(xs[i % sets], (C,), w, b, 1e-5)

        def fwd_bwd(i):
            torch.autograd.grad(fwd(i), (xs[i % sets], w, b), douts[i % sets])

        fwd_bwd_rows(torch, pad, group, fwd, fwd_bwd)

    run_group(torch, results, group, body)


def bench_cross_entropy(torch, F, results, pad, dn):
    N, V = ROWS, VOCAB
    es = 4 if dn == "f32" else 2
    fwd_bytes = 1.0 * N * V * es + 8.0 * N + 8.0 * N
    bwd_bytes = 2.0 * N * V * es + 8.0 * N + 4.0 * N + 4.0
    group = [plan("cross_entropy_fwd", dn, nbytes=fwd_bytes),
             plan("cross_entropy_bwd", dn, nbytes=bwd_bytes, note="bwd = (fwd+bwd) - fwd"),
             plan("cross_entropy_fwd+bwd", dn, nbytes=fwd_bytes + bwd_bytes)]

    def body(group):
        dt = dtype_of(torch, dn)
        sets = buffer_sets(2 * N * V * es + 16 * N)
        logits = [random_nonzero(torch, (N, V), dt, 0.0625, 4.0).requires_grad_(True) for _ in range(sets)]
        targets = [torch.randint(0, V, (N,), device="cuda", dtype=torch.int64) for _ in range(sets)]

        def fwd(i):
            return F.cross_entropy(logits[i % sets], targets[i % sets])

        def fwd_bwd(i):
            torch.autograd.grad(fwd(i), logits[i % sets])

        fwd_bwd_rows(torch, pad, group, fwd, fwd_bwd)

    run_group(torch, results, group, body)


def main(argv):
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print("no CUDA device: torch is not installed (%s)" % e)
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: torch %s sees none (torch.cuda.is_available() is False)" % torch.__version__)
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    pad = Pad(torch)
    results = []
    if not hasattr(F, "scaled_dot_product_attention"):
        for dn in ("f32", "bf16"):
            for c in ("attention_fwd", "attention_bwd", "attention_fwd+bwd"):
                r = plan(c, dn)
                r["error"] = "torch %s has no F.scaled_dot_product_attention" % torch.__version__
                results.append(r)
    else:
        for dn in ("f32", "bf16"):
            bench_attention(torch, F, results, pad, dn)

    hyper = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    bench_optimizer(torch, results, pad, "adamw_step", "torch.optim.AdamW fused=True",
                    lambda ps: torch.optim.AdamW(ps, fused=True, **hyper))
    bench_optimizer(torch, results, pad, "adamw_step foreach", "torch.optim.AdamW foreach=True",
                    lambda ps: torch.optim.AdamW(ps, foreach=True, **hyper))
    bench_optimizer(torch, results, pad, "adamw_step for-loop", "torch.optim.AdamW foreach=False",
                    lambda ps: torch.optim.AdamW(ps, foreach=False, **hyper))
    try:
        import bitsandbytes as bnb
        bnb_version = getattr(bnb, "__version__", "?")
    except Exception as e:  # ImportError, or a broken install that fails on import
        bnb = None
        print("bitsandbytes is absent (%s: %s): no AdamW8bit peer" % (type(e).__name__, e))
    if bnb is not None:
        bench_optimizer(torch, results, pad, "adamw8bit_step", "bitsandbytes %s AdamW8bit" % bnb_version,
                        lambda ps: bnb.optim.AdamW8bit(ps, **hyper))
    print("Lion / Lion8bit: no PyTorch peer (skipped)")

    for dn in ("f32", "bf16"):
        bench_layer_norm(torch, F, results, pad, dn)
    for dn in ("f32", "bf16"):
        bench_cross_entropy(torch, F, results, pad, dn)

    def num(x, digits):
        return ("%.*f" % (digits, x)) if x > 0 else "-"

    lines = ["| case | dtype | ms | TFLOP/s | GB/s | notes |", "|---|---|---:|---:|---:|---|"]
    for r in results:
        notes = r["note"]
        if r["state_bytes_per_param"] > 0:
            notes = ("state %.3f B/param; " % r["state_bytes_per_param"]) + notes
        if r["error"]:
            lines.append("| %s | %s | error | | | %s |" % (r["case"], r["dtype"], r["error"]))
        else:
            lines.append("| %s | %s | %.4f | %s | %s | %s |" % (r["case"], r["dtype"], r["median_ms"],
                                                                num(r["tflops"], 1), num(r["gbps"], 0), notes))
    device = torch.cuda.get_device_name(0)
    print("PyTorch %s on %s, median of %d (GPT-2 124M shapes): attention B=%d H=%d T=%d D=%d causal, fused QKV; "
          "optimizers n=%d; layer_norm N=%d C=%d; cross_entropy N=%d V=%d\n"
          % (torch.__version__, device, REPS, ATTN_B, ATTN_H, ATTN_T, ATTN_D, OPTIM_N, ROWS, LN_C, ROWS, VOCAB))
    print("\n".join(lines))
    if len(argv) > 1:
        with open(argv[1], "w") as f:
            json.dump({"tool": "torch %s" % torch.__version__, "device": device, "reps": REPS, "warmup": WARMUP,
                       "l2_bytes_assumed": L2_BYTES, "pad_sleep_cycles": pad.cycles, "results": results}, f,
                      indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
