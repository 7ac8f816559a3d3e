#!/usr/bin/python3
"""Writes the golden fixtures that tests/test_golden.cpp checks memtrain against.

Two tiny models with fixed, seeded weights are run forward and backward in PyTorch in float64; the inputs,
the weights, a few intermediate activations, the loss and every parameter gradient are written to
  tests/fixtures/golden_gpt2_block.bin   GPT-2 block + tied head (V=64, T=8, B=2, C=32, H=4)
  tests/fixtures/golden_cnn.bin          conv -> relu -> max-pool -> grouped strided conv -> relu ->
                                         avg-pool -> flatten -> linear -> cross-entropy
The committed fixtures mean CI never needs PyTorch.

Regenerate (Debian 12; PyTorch comes from Debian's package and runs under the system interpreter, which is
not necessarily the `python3` first on PATH):
  apt-get install -y python3-torch
  /usr/bin/python3 scripts/make_golden_fixtures.py
The output is deterministic for a given PyTorch build (seeded CPU generator, float64 math); the torch
version used is recorded in each file as the record "meta/torch_version".

Weights and float inputs are drawn in float64 and then rounded to float32 values, and those rounded values
are the master copies: they are stored as f32 and both the f64 reference here and the f32/f64 runs in the
test see exactly the same numbers, so the f32 test measures compute error only, not input rounding.

File format (little-endian), read by the tiny reader in tests/test_golden.cpp:
  magic  b"MTGOLD01"
  u32    record count
  per record: u32 name length, name (utf-8), u8 dtype (0 = f64, 1 = f32, 2 = i64), u8 ndim,
              i64 dims[ndim], then numel * element-size bytes of row-major data.
Record names: "input/*" and "param/*" are the leaves; "grad/<leaf name>" is the gradient of the loss with
respect to that leaf; "act/*" are forward activations (to point at the failing op); "loss" is 0-d.
"""

import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

DTYPE_CODES = {torch.float64: 0, torch.float32: 1, torch.int64: 2}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")


def write_fixture(path, records):
    """records: list of (name, tensor). Tensors are written contiguous, in their own dtype."""
    with open(path, "wb") as f:
        f.write(b"MTGOLD01")
        f.write(struct.pack("<I", len(records)))
        for name, t in records:
            t = t.detach().contiguous().cpu()
            name_bytes = name.encode("utf-8")
            f.write(struct.pack("<I", len(name_bytes)))
            f.write(name_bytes)
            f.write(struct.pack("<BB", DTYPE_CODES[t.dtype], t.dim()))
            for d in t.shape:
                f.write(struct.pack("<q", d))
            fmt = {torch.float64: "d", torch.float32: "f", torch.int64: "q"}[t.dtype]
            f.write(struct.pack("<%d%s" % (t.numel(), fmt), *t.reshape(-1).tolist()))
    print("wrote %s (%d bytes, %d records)" % (os.path.relpath(path, ROOT), os.path.getsize(path), len(records)))


def f32_exact(t):
    """float64 tensor whose values are exactly representable in float32 (see the header)."""
    return t.to(torch.float32).to(torch.float64)


def rand_param(gen, shape, std, mean=0.0):
    return f32_exact(mean + std * torch.randn(*shape, generator=gen, dtype=torch.float64))


def meta_records():
    version = torch.__version__.encode("utf-8")
    return [("meta/torch_version", torch.tensor(list(version), dtype=torch.int64))]


# ---- GPT-2 block ----------------------------------------------------------------------------------------

def gpt2_params(gen, V, T, C):
    # Scales chosen so every op works in its interesting range: activations O(1), attention scores O(1),
    # logits with std ~2 (a far-from-uniform softmax), LayerNorm gains away from 1 and non-zero biases.
    p = {}
    p["wte"] = rand_param(gen, (V, C), 0.3)
    p["wpe"] = rand_param(gen, (T, C), 0.3)
    p["ln1.weight"] = rand_param(gen, (C,), 0.2, 1.0)
    p["ln1.bias"] = rand_param(gen, (C,), 0.1)
    p["attn.c_attn.weight"] = rand_param(gen, (3 * C, C), 1.0 / math.sqrt(C))
    p["attn.c_attn.bias"] = rand_param(gen, (3 * C,), 0.1)
    p["attn.c_proj.weight"] = rand_param(gen, (C, C), 1.0 / math.sqrt(C))
    p["attn.c_proj.bias"] = rand_param(gen, (C,), 0.1)
    p["ln2.weight"] = rand_param(gen, (C,), 0.2, 1.0)
    p["ln2.bias"] = rand_param(gen, (C,), 0.1)
    p["mlp.c_fc.weight"] = rand_param(gen, (4 * C, C), 1.0 / math.sqrt(C))
    p["mlp.c_fc.bias"] = rand_param(gen, (4 * C,), 0.1)
    p["mlp.c_proj.weight"] = rand_param(gen, (C, 4 * C), 1.0 / math.sqrt(4 * C))
    p["mlp.c_proj.bias"] = rand_param(gen, (C,), 0.1)
    p["ln_f.weight"] = rand_param(gen, (C,), 0.2, 1.0)
    p["ln_f.bias"] = rand_param(gen, (C,), 0.1)
    return p


def gpt2_forward(p, idx, targets, H):
    """Returns (loss, dict of intermediate activations). Same composition as the C++ test."""
    B, T = idx.shape
    C = p["wte"].shape[1]
    D = C // H
    x = F.embedding(idx, p["wte"]) + p["wpe"][:T]                                  # (B,T,C)
    a = F.layer_norm(x, (C,), p["ln1.weight"], p["ln1.bias"], 1e-5)
    qkv = F.linear(a, p["attn.c_attn.weight"], p["attn.c_attn.bias"])              # (B,T,3C)
    q, k, v = qkv.split(C, dim=-1)
    q, k, v = (t.reshape(B, T, H, D).transpose(1, 2) for t in (q, k, v))          # (B,H,T,D)
    # Causal attention written out (Debian's torch 1.13 has no F.scaled_dot_product_attention).
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))                         # (B,H,T,T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    att = F.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
    y = att @ v                                                                    # (B,H,T,D)
    y = y.transpose(1, 2).reshape(B, T, C)
    h = x + F.linear(y, p["attn.c_proj.weight"], p["attn.c_proj.bias"])
    m = F.layer_norm(h, (C,), p["ln2.weight"], p["ln2.bias"], 1e-5)
    m = F.gelu(F.linear(m, p["mlp.c_fc.weight"], p["mlp.c_fc.bias"]), approximate="tanh")  # (B,T,4C)
    h2 = h + F.linear(m, p["mlp.c_proj.weight"], p["mlp.c_proj.bias"])
    f = F.layer_norm(h2, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    logits = f @ p["wte"].t()                                                      # (B,T,V)
    loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1), ignore_index=-100, reduction="mean")
    acts = {"act/x": x, "act/attn_y": y, "act/h": h, "act/h2": h2, "act/logits": logits}
    return loss, acts


def make_gpt2(gen):
    V, T, B, C, H = 64, 8, 2, 32, 4
    p = gpt2_params(gen, V, T, C)
    idx = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets[1, 3] = -100  # exercises ignore_index: the mean is over the 15 remaining targets

    for t in p.values():
        t.requires_grad_(True)
    loss, acts = gpt2_forward(p, idx, targets, H)
    loss.backward()

    records = meta_records()
    records.append(("config", torch.tensor([V, T, B, C, H], dtype=torch.int64)))
    records.append(("input/idx", idx))
    records.append(("input/targets", targets))
    records += [("param/" + n, t.to(torch.float32)) for n, t in p.items()]
    records += [(n, t.to(torch.float64)) for n, t in acts.items()]
    records.append(("loss", loss))
    records += [("grad/param/" + n, t.grad) for n, t in p.items()]
    report_f32_error("gpt2", p, lambda q: gpt2_forward(q, idx, targets, H)[0])
    return records


# ---- CNN ------------------------------------------------------------------------------------------------

def cnn_params(gen):
    p = {}
    p["conv1.weight"] = rand_param(gen, (4, 1, 3, 3), 1.0 / 3.0)
    p["conv1.bias"] = rand_param(gen, (4,), 0.1)
    p["conv2.weight"] = rand_param(gen, (8, 2, 3, 3), 1.0 / math.sqrt(18.0))  # groups = 2: Cin/groups = 2
    p["conv2.bias"] = rand_param(gen, (8,), 0.1)
    p["fc.weight"] = rand_param(gen, (10, 32), 1.0 / math.sqrt(32.0))
    p["fc.bias"] = rand_param(gen, (10,), 0.1)
    return p


def cnn_forward(p, x, targets):
    c1 = F.relu(F.conv2d(x, p["conv1.weight"], p["conv1.bias"], stride=1, padding=1))            # (2,4,16,16)
    p1 = F.max_pool2d(c1, 2)                                                                     # (2,4,8,8)
    c2 = F.relu(F.conv2d(p1, p["conv2.weight"], p["conv2.bias"], stride=2, padding=1, groups=2))  # (2,8,4,4)
    p2 = F.avg_pool2d(c2, 2)                                                                     # (2,8,2,2)
    logits = F.linear(p2.flatten(1), p["fc.weight"], p["fc.bias"])                               # (2,10)
    loss = F.cross_entropy(logits, targets, reduction="mean")
    acts = {"act/conv1": c1, "act/pool1": p1, "act/conv2": c2, "act/pool2": p2, "act/logits": logits}
    return loss, acts


def make_cnn(gen):
    p = cnn_params(gen)
    x = f32_exact(torch.randn(2, 1, 16, 16, generator=gen, dtype=torch.float64))
    targets = torch.tensor([3, 7], dtype=torch.int64)

    for t in p.values():
        t.requires_grad_(True)
    x.requires_grad_(True)
    loss, acts = cnn_forward(p, x, targets)
    loss.backward()

    records = meta_records()
    records.append(("input/x", x.to(torch.float32)))
    records.append(("input/targets", targets))
    records += [("param/" + n, t.to(torch.float32)) for n, t in p.items()]
    records += [(n, t.to(torch.float64)) for n, t in acts.items()]
    records.append(("loss", loss))
    records += [("grad/param/" + n, t.grad) for n, t in p.items()]
    records.append(("grad/input/x", x.grad))
    report_f32_error("cnn", p, lambda q: cnn_forward(q, x.detach().to(torch.float32), targets)[0])
    return records


def report_f32_error(model, p64, loss_fn):
    """Prints how far PyTorch's own float32 run lands from its float64 run: the yardstick for memtrain's
    f32 tolerance in the test."""
    q = {n: t.detach().to(torch.float32).requires_grad_(True) for n, t in p64.items()}
    loss = loss_fn(q)
    loss.backward()
    worst = 0.0
    for n, t in q.items():
        ref = p64[n].grad
        err = (t.grad.double() - ref).norm().item() / ref.norm().item()
        worst = max(worst, err)
    print("  %s: torch f32 vs f64: worst normwise grad error %.2e" % (model, worst))


def main():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.makedirs(FIXTURES, exist_ok=True)
    write_fixture(os.path.join(FIXTURES, "golden_gpt2_block.bin"), make_gpt2(torch.Generator().manual_seed(1234)))
    write_fixture(os.path.join(FIXTURES, "golden_cnn.bin"), make_cnn(torch.Generator().manual_seed(5678)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
