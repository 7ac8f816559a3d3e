#!/usr/bin/python3
"""Writes the Hugging Face GPT-2 checkpoint fixture that tests/test_hf_gpt2.cpp loads into nn::GPT.

A small GPT-2 (V 96, n_positions 32, C 32, L 2, H 4) with seeded random weights, saved exactly as the
`transformers` library lays a checkpoint out, and PyTorch's loss and logits for a fixed batch:
  tests/fixtures/hf_gpt2/config.json            HF GPT2Config keys (gelu_new, layer_norm_epsilon 1e-5, ...)
  tests/fixtures/hf_gpt2/model.safetensors      F32, GPT2LMHeadModel layout: "transformer." prefix, Conv1D
                                                weights [in, out], causal-mask buffers h.{i}.attn.bias (BOOL
                                                [1,1,T,T]) and h.{i}.attn.masked_bias (F32 0-d), and the tied
                                                lm_head.weight (equal to wte)
  tests/fixtures/hf_gpt2/model_f16.safetensors  the same weights rounded to F16, GPT2Model layout as on the hub
                                                (no prefix, no lm_head, F16 float masks h.{i}.attn.bias)
  tests/fixtures/hf_gpt2/model_bf16.safetensors the same weights rounded to BF16, no prefix, no extra tensors
  tests/fixtures/hf_gpt2/expected.safetensors   idx, targets [2, 16] (I64; one target is -100, ignored), and in
                                                F64: loss and logits [2, 16, 96] of the F32 weights, loss_f16
                                                and loss_bf16 of the rounded weights
The committed files mean CI never needs PyTorch.

The `transformers` package is not used (Debian ships only torch): GPT-2 is written out below in plain torch
as HF's GPT2LMHeadModel computes it (eager attention): Conv1D y = x @ W + b with W [in, out]; attention
scores q k^T / sqrt(D), the causal mask applied with where(mask, s, finfo.min), softmax, then @ v; gelu_new
(tanh approximation); LayerNorm eps 1e-5; the head tied to wte. The reference runs in float64 on weights
whose values are exact in float32 (resp. F16/BF16), so the C++ test measures compute error only.

Regenerate (Debian 12):
  apt-get install -y python3-torch
  /usr/bin/python3 scripts/make_hf_gpt2_fixture.py
The output is deterministic for a given PyTorch build (seeded CPU generator); the torch version is in
expected.safetensors' metadata.
"""

import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "hf_gpt2")

V, NPOS, C, L, H = 96, 32, 32, 2, 4
B, T = 2, 16

ST_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.int64: "I64", torch.bool: "BOOL"}
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def save_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, tensor). The safetensors layout, by hand: u64 header length, JSON header
    (padded with spaces to 8 bytes, as the reference writer does), then the raw little-endian bytes."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors:
        t = t.detach().contiguous().cpu()
        raw = t.view(torch.int16) if t.dtype in (torch.float16, torch.bfloat16) else t  # numpy has no bf16
        data = raw.to(torch.uint8).numpy().tobytes() if t.dtype == torch.bool else raw.numpy().tobytes()
        header[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)
    print("wrote %s (%d bytes, %d tensors)" % (os.path.relpath(path, ROOT), os.path.getsize(path), len(tensors)))


def make_params(gen):
    """HF names (no prefix) -> float64 tensors exact in float32. Conv1D weights are [in, out] as HF stores
    them. std 0.1 weights, LayerNorm gains 1 +- 0.1, non-zero biases: each block adds O(0.3) per channel to an
    O(0.14) embedding, so the blocks dominate the residual stream and a mis-transposed weight moves every logit."""
    def r(shape, std=0.1, mean=0.0):
        return (mean + std * torch.randn(*shape, generator=gen, dtype=torch.float64)).to(torch.float32).double()
    p = {"wte.weight": r((V, C)), "wpe.weight": r((NPOS, C))}
    for i in range(L):
        h = "h.%d." % i
        p[h + "ln_1.weight"], p[h + "ln_1.bias"] = r((C,), 0.1, 1.0), r((C,))
        p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"] = r((C, 3 * C)), r((3 * C,))
        p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"] = r((C, C)), r((C,))
        p[h + "ln_2.weight"], p[h + "ln_2.bias"] = r((C,), 0.1, 1.0), r((C,))
        p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"] = r((C, 4 * C)), r((4 * C,))
        p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"] = r((4 * C, C)), r((C,))
    p["ln_f.weight"], p["ln_f.bias"] = r((C,), 0.1, 1.0), r((C,))
    return p


def gelu_new(x):
    # transformers.activations.NewGELUActivation
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def conv1d(x, w, b):
    # transformers.pytorch_utils.Conv1D: addmm(b, x, w) with w [in, out]
    return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).reshape(*x.shape[:-1], w.shape[-1])


def gpt2_lm_forward(p, idx):
    """GPT2LMHeadModel.forward(idx).logits in eval mode (dropout off), eager attention."""
    Bn, Tn = idx.shape
    D = C // H
    pos = torch.arange(Tn)
    x = p["wte.weight"][idx] + p["wpe.weight"][pos]                                   # (B,T,C)
    causal = torch.tril(torch.ones(NPOS, NPOS, dtype=torch.bool))[:Tn, :Tn]            # attn.bias buffer
    for i in range(L):
        h = "h.%d." % i
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], 1e-5)
        q, k, v = conv1d(a, p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"]).split(C, dim=2)
        q, k, v = (t.reshape(Bn, Tn, H, D).permute(0, 2, 1, 3) for t in (q, k, v))  # (B,H,T,D)
        w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], v.size(-1) ** 0.5, dtype=q.dtype)
        w = torch.where(causal, w, torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype))
        y = torch.matmul(F.softmax(w, dim=-1), v)                                      # (B,H,T,D)
        y = y.permute(0, 2, 1, 3).reshape(Bn, Tn, C)
        x = x + conv1d(y, p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"])
        m = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], 1e-5)
        m = gelu_new(conv1d(m, p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"]))      # (B,T,4C)
        x = x + conv1d(m, p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"])
    f = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    return F.linear(f, p["wte.weight"])                                               # lm_head, tied


def mean_ce(logits, targets):
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-100, reduction="mean")


def main():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    gen = torch.Generator().manual_seed(20240611)
    p = make_params(gen)
    idx = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets[1, 5] = -100  # ignored: the mean is over the 31 others

    logits = gpt2_lm_forward(p, idx)
    loss = mean_ce(logits, targets)
    f32 = {n: t.float() for n, t in p.items()}
    loss32 = mean_ce(gpt2_lm_forward(f32, idx), targets).double()
    print("loss %.10f (log V = %.4f); torch f32 vs f64 relative error %.2e"
          % (loss.item(), math.log(V), abs(loss32.item() - loss.item()) / loss.item()))

    # Rounded copies: the reference for a half-precision file is the model whose weights are those values.
    half = {dt: {n: t.to(dt) for n, t in p.items()} for dt in (torch.float16, torch.bfloat16)}
    loss_half = {dt: mean_ce(gpt2_lm_forward({n: t.double() for n, t in q.items()}, idx), targets)
                 for dt, q in half.items()}

    mask = torch.tril(torch.ones(NPOS, NPOS, dtype=torch.bool)).view(1, 1, NPOS, NPOS)

    # GPT2LMHeadModel file: prefixed names, each block's mask buffers after its attention weights.
    lm = []
    for n, t in f32.items():
        lm.append(("transformer." + n, t))
        if n.endswith("attn.c_proj.bias"):
            blk = n[: -len("attn.c_proj.bias")]
            lm.append(("transformer." + blk + "attn.bias", mask))
            lm.append(("transformer." + blk + "attn.masked_bias", torch.tensor(-1e4, dtype=torch.float32)))
    lm.append(("lm_head.weight", f32["wte.weight"]))
    save_safetensors(os.path.join(OUT, "model.safetensors"), lm, {"format": "pt"})

    f16 = list(half[torch.float16].items())
    f16 += [("h.%d.attn.bias" % i, mask.to(torch.float16)) for i in range(L)]
    save_safetensors(os.path.join(OUT, "model_f16.safetensors"), f16, {"format": "pt"})
    save_safetensors(os.path.join(OUT, "model_bf16.safetensors"), list(half[torch.bfloat16].items()),
                     {"format": "pt"})

    save_safetensors(os.path.join(OUT, "expected.safetensors"), [
        ("idx", idx), ("targets", targets), ("loss", loss), ("logits", logits),
        ("loss_f16", loss_half[torch.float16]), ("loss_bf16", loss_half[torch.bfloat16]),
    ], {"torch_version": torch.__version__, "script": "scripts/make_hf_gpt2_fixture.py"})

    config = {  # the keys of the hub's gpt2 config.json, sizes changed
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
        "bos_token_id": V - 1, "embd_pdrop": 0.1, "eos_token_id": V - 1, "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": NPOS, "n_embd": C, "n_head": H,
        "n_inner": None, "n_layer": L, "n_positions": NPOS, "resid_pdrop": 0.1, "summary_activation": None,
        "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
        "summary_use_proj": True, "vocab_size": V,
    }
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    print("wrote %s" % os.path.relpath(os.path.join(OUT, "config.json"), ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
