#!/usr/bin/env python3
"""PyTorch peer of bench/bench_cuda_gemm.cpp: the same GEMM cases, timed the same way, same table and JSON.

    python3 scripts/device/gemm_peer.py [out.json]

Cases: square M=N=K in {4096, 8192} and the GPT-2 124M training shapes at B*T = 8192 tokens
([8192x768]x[768x2304], [8192x768]x[768x3072], [8192x3072]x[3072x768], [8192x768]x[768x50304]), each in
f32 (torch.matmul, TF32 off), tf32 (TF32 on), bf16 (torch.matmul) and fp8 (E4M3 x E4M3 -> bf16 through
torch._scaled_mm with per-tensor scales; B stored [N, K], as cuBLASLt requires). Random inputs, never
zeros; 3 warm-up products, then 30 timed one by one with torch.cuda.Event pairs enqueued back to back,
reported as the median TFLOP/s (2*M*N*K per product). The products rotate among enough buffer sets that
one pass over them is at least 4x the 60 MB L2. Without CUDA (or without torch) it says so and exits 0;
fp8 is skipped where this torch has no float8 or no _scaled_mm.
"""
import json
import sys

L2_BYTES = 60_000_000
WARMUP = 3
REPS = 30
SHAPES = [
    ("square_4096", 4096, 4096, 4096),
    ("square_8192", 8192, 8192, 8192),
    ("gpt2_qkv", 8192, 2304, 768),
    ("gpt2_fc", 8192, 3072, 768),
    ("gpt2_proj", 8192, 768, 3072),
    ("gpt2_lm_head", 8192, 50304, 768),
]
PRECISIONS = ["f32", "tf32", "bf16", "fp8_e4m3"]


def random_nonzero(torch, shape, dtype, lo, hi):
    """Uniform magnitudes in [lo, hi) with random signs, made on the GPU and rounded to dtype."""
    mag = torch.rand(shape, device="cuda", dtype=torch.float32) * (hi - lo) + lo
    sign = torch.randint(0, 2, shape, device="cuda", dtype=torch.int8).to(torch.float32) * 2 - 1
    return (mag * sign).to(dtype)


def run_case(torch, name, m, n, k, precision):
    r = {"shape": name, "precision": precision, "m": m, "n": n, "k": k, "buffer_sets": 0,
         "median_ms": 0.0, "tflops": 0.0, "error": None}
    fp8 = precision == "fp8_e4m3"
    if fp8 and not (hasattr(torch, "float8_e4m3fn") and hasattr(torch, "_scaled_mm")):
        r["error"] = "this torch (%s) has no float8_e4m3fn / _scaled_mm" % torch.__version__
        return r
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    in_dtype = {"f32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}.get(precision)
    in_size = 1 if fp8 else (4 if in_dtype == torch.float32 else 2)
    out_dtype = torch.bfloat16 if fp8 else in_dtype
    out_size = 4 if out_dtype == torch.float32 else 2
    set_bytes = (m * k + k * n) * in_size + m * n * out_size
    sets = min(max(-(-4 * L2_BYTES // set_bytes), 2), 64)
    r["buffer_sets"] = sets
    try:
        bufs = []
        for _ in range(sets):
            if fp8:
                a = random_nonzero(torch, (m, k), torch.float32, 0.125, 8.0).to(torch.float8_e4m3fn)
                bt = random_nonzero(torch, (n, k), torch.float32, 0.125, 8.0).to(torch.float8_e4m3fn)
                b = bt.t()  # [k, n], column-major: _scaled_mm's required layout for mat2
            else:
                a = random_nonzero(torch, (m, k), in_dtype, 0.0625, 2.0)
                b = random_nonzero(torch, (k, n), in_dtype, 0.0625, 2.0)
            c = torch.empty((m, n), device="cuda", dtype=out_dtype)
            bufs.append((a, b, c))
        one = torch.ones((), device="cuda", dtype=torch.float32)

        if fp8:
            try:  # writing into the set's own output, where this torch's _scaled_mm takes out=
                torch._scaled_mm(bufs[0][0], bufs[0][1], scale_a=one, scale_b=one, out_dtype=out_dtype,
                                 out=bufs[0][2])
                with_out = True
            except TypeError:
                with_out = False

            def product(i):
                a, b, c = bufs[i % sets]
                if with_out:
                    torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=out_dtype, out=c)
                else:
                    torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=out_dtype)
        else:
            def product(i):
                a, b, c = bufs[i % sets]
                torch.matmul(a, b, out=c)

        for i in range(WARMUP):
            product(i)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(REPS + 1)]
        events[0].record()
        for i in range(REPS):
            product(i)
            events[i + 1].record()
        events[-1].synchronize()
        ms = sorted(events[i].elapsed_time(events[i + 1]) for i in range(REPS))
        median = ms[REPS // 2] if REPS % 2 else 0.5 * (ms[REPS // 2 - 1] + ms[REPS // 2])
        r["median_ms"] = median
        r["tflops"] = 2.0 * m * n * k / (median * 1e-3) / 1e12
    except Exception as e:  # report and go on with the other cases
        r["error"] = "%s: %s" % (type(e).__name__, e)
    finally:
        bufs = None
        torch.cuda.empty_cache()
    return r


def main(argv):
    try:
        import torch
    except ImportError as e:
        print("no CUDA device: torch is not installed (%s)" % e)
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: torch %s sees none (torch.cuda.is_available() is False)" % torch.__version__)
        return 0
    results = []
    for name, m, n, k in SHAPES:
        for p in PRECISIONS:
            r = run_case(torch, name, m, n, k, p)
            results.append(r)
            if r["error"]:
                print("%s %s: error: %s" % (name, p, r["error"]), file=sys.stderr)
            else:
                print("%s %s: %.4f ms, %.1f TFLOP/s (%d buffer sets)"
                      % (name, p, r["median_ms"], r["tflops"], r["buffer_sets"]), file=sys.stderr)
    torch.backends.cuda.matmul.allow_tf32 = False

    lines = ["| shape | M | N | K | " + " | ".join(PRECISIONS) + " |",
             "|---|---:|---:|---:|" + "---:|" * len(PRECISIONS)]
    for name, m, n, k in SHAPES:
        cells = []
        for p in PRECISIONS:
            r = next(x for x in results if x["shape"] == name and x["precision"] == p)
            cells.append("error" if r["error"] else "%.1f" % r["tflops"])
        lines.append("| %s | %d | %d | %d | %s |" % (name, m, n, k, " | ".join(cells)))
    device = torch.cuda.get_device_name(0)
    print("PyTorch %s on %s, TFLOP/s, median of %d; fp8 = E4M3 x E4M3 -> bf16 (torch._scaled_mm)\n"
          % (torch.__version__, device, REPS))
    print("\n".join(lines))
    if len(argv) > 1:
        with open(argv[1], "w") as f:
            json.dump({"tool": "torch %s" % torch.__version__, "device": device, "reps": REPS, "warmup": WARMUP,
                       "l2_bytes_assumed": L2_BYTES, "results": results}, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
