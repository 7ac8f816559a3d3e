#!/usr/bin/env python3
"""Writes tests/fixtures/fp8_delayed_scaling.json: Transformer Engine's DelayedScaling update rule, run in
float32 torch ops on fixed sequences of amax values.

Regenerate with Debian's torch:  /usr/bin/python3 scripts/fp8_delayed_scaling_reference.py
Read by tests/test_fp8_scaling.cpp (Fp8DelayedScaling.MatchesTransformerEngineReference).

The rule is TE's PyTorch one (transformer_engine/pytorch: _update_amax_history,
_default_get_amax_and_update_history, _default_sf_compute), restated here because TE is not installed:
  history[0] holds this step's amax; after the step
    amax = max(history) (torch.max: NaN wins) or history[0] (most_recent)
    history = roll(history, -1); history[0] = 0
    sf = (fp8_max / amax) / 2**margin; keep the old scale where amax <= 0 or amax is not finite;
    sf = FLT_MAX where sf is Inf; scale_inv = 1 / sf.
The scale starts at 1 and the history at zeros, as in TE.

Format: {"amax": [...], "cases": [{"name", "format" ("e4m3" | "e5m2"), "history_len", "margin", "algo"
("max" | "most_recent"), "steps": [[scale, inv_scale], ...]}]}. "amax" is the sequence every case records,
one per step; steps[k] is the scale and inverse scale after step k's update. Every float is its IEEE f32
bit pattern as a hex string ("0x3f800000"): JSON has no NaN or Inf, and bits compare exactly.
"""
import json
import math
import os
import struct

import torch

FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
FLT_MAX = torch.finfo(torch.float32).max


def f32_bits(t):
    return "0x%08x" % struct.unpack("<I", struct.pack("<f", float(t)))[0]


def run_case(fmt, history_len, margin, algo, amaxes):
    history = torch.zeros(history_len, dtype=torch.float32)
    scale = torch.ones(1, dtype=torch.float32)
    steps = []
    for a in amaxes:
        history[0] = a  # one quantize per step: the slot holds that amax
        amax = torch.max(history, dim=0).values if algo == "max" else history[0].clone()
        if history_len > 1:
            history = torch.roll(history, -1, 0)
        history[0] = 0.0
        # fp8_max as a tensor: torch evaluates python_scalar / tensor as reciprocal-then-multiply (two
        # roundings), while TE's CUDA update divides once; 2**margin is exact either way.
        sf = (torch.full_like(amax, FP8_MAX[fmt]) / amax) / (2 ** margin)
        sf = torch.where(amax > 0.0, sf, scale)
        sf = torch.where(torch.isfinite(amax), sf, scale)
        sf = torch.where(torch.isinf(sf), torch.full_like(sf, FLT_MAX), sf)
        scale = sf.to(torch.float32).reshape(1)
        inv = (1.0 / scale).to(torch.float32)
        steps.append([f32_bits(scale[0]), f32_bits(inv[0])])
    return {"name": "%s_len%d_margin%d_%s" % (fmt, history_len, margin, algo), "format": fmt,
            "history_len": history_len, "margin": margin, "algo": algo, "steps": steps}


def amax_sequence():
    # Float32 values: starts with zeros (scale stays 1), ordinary values, a spike that must dominate the
    # window until it rolls out (the sequence is longer than every history tested), Inf and NaN (scale
    # frozen while they are in the window), a tiny amax whose scale overflows f32 (clamped to FLT_MAX),
    # values past fp8_max (scale < 1), and a decay so most_recent and max part ways.
    seq = [0.0, 0.0, 1.0, 3.5, 2.0, 1000.0, 0.75, 0.5, 0.25, 0.125, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3,
           0.3, 0.3, 0.3, 0.3, math.inf, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6,
           0.6, 0.6, 0.6, math.nan, 2.5, 2.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
           0.0, 0.0, 1e-40, 7e5, 1.1e5, 3.0e-3]
    seq += [0.01 * 1.37 ** k for k in range(24)]
    return [struct.unpack("<f", struct.pack("<f", v))[0] for v in seq]


def main():
    cases = []
    seq = amax_sequence()
    # most_recent reads only the current slot, so one history length covers it.
    configs = [(n, "max") for n in (1, 4, 16)] + [(4, "most_recent")]
    for fmt in ("e4m3", "e5m2"):
        for history_len, algo in configs:
            for margin in (0, 1):
                cases.append(run_case(fmt, history_len, margin, algo, seq))
    out = {"generator": "scripts/fp8_delayed_scaling_reference.py, torch %s" % torch.__version__,
           "amax": [f32_bits(a) for a in seq], "cases": cases}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                        "fp8_delayed_scaling.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print("wrote %s: %d cases x %d steps" % (os.path.normpath(path), len(cases), len(seq)))


if __name__ == "__main__":
    main()
