#!/usr/bin/python3
"""Writes the PyTorch golden fixtures that tests/test_nn_models.cpp checks nn::Llama and nn::CNN against.

  tests/fixtures/golden_llama.safetensors   LLaMA (HF LlamaForCausalLM's definition, written here in plain torch
                                            since there is no `transformers` package): V=64, T=8, B=2, C=32, H=4,
                                            L=2, intermediate 88 (8C/3 rounded up to a multiple of 8)
  tests/fixtures/golden_cnn_bn.safetensors  the Fashion-MNIST CNN shrunk to 1x12x12 images, channels 4 and 8,
                                            hidden 16, 10 classes, B=4; batch norm in training mode

Each model gets seeded random weights, runs forward and backward once in float64, and the file holds
  state.<name>   every parameter and buffer before the step (F32; num_batches_tracked I64), under the name the
                 torch module gives it: HF's for LLaMA ("model.layers.0.self_attn.q_proj.weight", "lm_head.weight"),
                 PyTorch's for the CNN ("bn1.running_mean")
  input.*        idx/targets (I64) for LLaMA; x (F32) and targets (I64) for the CNN; some targets are -100
  loss           the mean cross entropy (F64, 0-d)
  act.logits     the logits of that forward (F32)
  grad.<name>    d loss / d parameter (F32: the float64 result rounded once)
  after.<name>   CNN only: batch-norm buffers after the training step (running stats F32, num_batches_tracked I64)
  act.eval_logits  CNN only: logits of the same batch in eval mode after the step (uses the running stats)
and config values in __metadata__ (strings). Weights and inputs are drawn in float64 and rounded to float32, and
those rounded values are the masters, so a float32 run in the test sees exactly the reference's numbers and
measures compute error only. Results rounded to f32 carry a relative error <= 6e-8, far under the test tolerances.

Regenerate (Debian 12, PyTorch from Debian's python3-torch under the system interpreter):
  /usr/bin/python3 scripts/make_llama_cnn_fixtures.py
The output is deterministic for a given PyTorch build (seeded CPU generator, float64 math).
"""

import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
ST_DTYPES = {torch.float64: ("F64", "d"), torch.float32: ("F32", "f"), torch.int64: ("I64", "q")}


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, tensor) written in order; metadata: dict of str -> str."""
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors:
        t = t.detach().contiguous().cpu()
        code, fmt = ST_DTYPES[t.dtype]
        blob = struct.pack("<%d%s" % (t.numel(), fmt), *t.reshape(-1).tolist())
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)  # data section 8-byte aligned, as the reference writer does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    print("wrote %s (%d bytes, %d tensors)" % (os.path.relpath(path, ROOT), os.path.getsize(path), len(tensors)))


def f32_exact(t):
    """float64 values that are exactly representable in float32."""
    return t.to(torch.float32).to(torch.float64)


def fill_(gen, t, std, mean=0.0):
    with torch.no_grad():
        t.copy_(f32_exact(mean + std * torch.randn(t.shape, generator=gen, dtype=torch.float64)))


def as_f32(t):
    return t.detach().to(torch.float32)


# ---- LLaMA, following transformers' modeling_llama.py (LlamaForCausalLM) ------------------------------------


class LlamaRMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, x):
        # HF upcasts to float32 for the variance; everything here is float64 already, so no cast.
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotary_tables(dim, T, base):
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = torch.einsum("i,j->ij", torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[None, None], emb.sin()[None, None]  # (1, 1, T, D)


class LlamaAttention(nn.Module):
    def __init__(self, C, H, T, theta):
        super().__init__()
        self.H, self.D = H, C // H
        self.q_proj = nn.Linear(C, C, bias=False)
        self.k_proj = nn.Linear(C, C, bias=False)
        self.v_proj = nn.Linear(C, C, bias=False)
        self.o_proj = nn.Linear(C, C, bias=False)
        self.cos, self.sin = rotary_tables(self.D, T, theta)

    def forward(self, x):
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.D).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.H, self.D).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.H, self.D).transpose(1, 2)
        cos, sin = self.cos[:, :, :T], self.sin[:, :, :T]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        att = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.D)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        att = F.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(B, T, C)
        return self.o_proj(y)


class LlamaMLP(nn.Module):
    def __init__(self, C, I):
        super().__init__()
        self.gate_proj = nn.Linear(C, I, bias=False)
        self.up_proj = nn.Linear(C, I, bias=False)
        self.down_proj = nn.Linear(I, C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, C, H, I, T, eps, theta):
        super().__init__()
        self.self_attn = LlamaAttention(C, H, T, theta)
        self.mlp = LlamaMLP(C, I)
        self.input_layernorm = LlamaRMSNorm(C, eps)
        self.post_attention_layernorm = LlamaRMSNorm(C, eps)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, V, C, H, I, L, T, eps, theta):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, C)
        self.layers = nn.ModuleList([LlamaDecoderLayer(C, H, I, T, eps, theta) for _ in range(L)])
        self.norm = LlamaRMSNorm(C, eps)

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, V, C, H, I, L, T, eps, theta):
        super().__init__()
        self.model = LlamaModel(V, C, H, I, L, T, eps, theta)
        self.lm_head = nn.Linear(C, V, bias=False)

    def forward(self, idx):
        return self.lm_head(self.model(idx))


def make_llama(gen):
    V, T, B, C, H, L, eps, theta = 64, 8, 2, 32, 4, 2, 1e-6, 10000.0
    I = 8 * ((int(2 * 4 * C / 3) + 7) // 8)  # LLaMA's rounding: 8C/3 up to a multiple (8 here) -> 88
    model = LlamaForCausalLM(V, C, H, I, L, T, eps, theta).double()
    # Weights of order 1/sqrt(fan_in) (not HF's 0.02) so attention and the MLP are far from linear and every
    # gradient is well above rounding; RMSNorm weights near 1 but not 1, so a dropped weight shows.
    for name, p in model.named_parameters():
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            fill_(gen, p, 0.1, mean=1.0)
        elif "embed_tokens" in name:
            fill_(gen, p, 1.0)
        else:
            fill_(gen, p, 1.0 / math.sqrt(p.shape[1]))
    idx = torch.randint(0, V, (B, T), generator=gen)
    targets = torch.randint(0, V, (B, T), generator=gen)
    targets[0, 3] = targets[1, 0] = -100
    logits = model(idx)
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-100)
    loss.backward()
    print("llama: loss %.6f, %d parameters" % (loss.item(), sum(p.numel() for p in model.parameters())))
    records = [("state." + n, as_f32(p)) for n, p in model.named_parameters()]
    records += [("input.idx", idx), ("input.targets", targets), ("loss", loss.detach()), ("act.logits", as_f32(logits))]
    records += [("grad." + n, as_f32(p.grad)) for n, p in model.named_parameters()]
    meta = {"vocab_size": V, "block_size": T, "batch": B, "n_embd": C, "n_head": H, "n_layer": L,
            "intermediate_size": I, "rms_norm_eps": eps, "rope_theta": theta}
    return records, meta


# ---- CNN (nn::CNN's architecture, in torch.nn modules) -------------------------------------------------------


class CNN(nn.Module):
    def __init__(self, cin, side, c1, c2, hidden, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, c1, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(c1)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(c2)
        self.fc1 = nn.Linear(c2 * (side // 4) ** 2, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def make_cnn(gen):
    cin, side, c1, c2, hidden, classes, B = 1, 12, 4, 8, 16, 10, 4
    model = CNN(cin, side, c1, c2, hidden, classes).double()
    for name, p in model.named_parameters():
        if name.startswith("bn") and name.endswith("weight"):
            fill_(gen, p, 0.2, mean=1.0)
        elif name.startswith("bn"):
            fill_(gen, p, 0.2)
        else:
            fan_in = p[0].numel() if p.dim() > 1 else None
            fill_(gen, p, 1.0 / math.sqrt(fan_in) if fan_in else 0.1)
    # Running stats that are not the defaults, and a nonzero counter, so the update formula is what is tested.
    for bn in (model.bn1, model.bn2):
        fill_(gen, bn.running_mean, 0.5)
        with torch.no_grad():
            bn.running_var.copy_(f32_exact(0.5 + torch.rand(bn.running_var.shape, generator=gen, dtype=torch.float64)))
        bn.num_batches_tracked.fill_(3)
    before = [("state." + n, as_f32(t) if t.is_floating_point() else t.clone()) for n, t in model.state_dict().items()]
    x = f32_exact(torch.randn(B, cin, side, side, generator=gen, dtype=torch.float64))
    targets = torch.randint(0, classes, (B,), generator=gen)
    targets[2] = -100
    model.train()
    logits = model(x)
    loss = F.cross_entropy(logits, targets, ignore_index=-100)
    loss.backward()
    model.eval()
    with torch.no_grad():
        eval_logits = model(x)
    print("cnn: loss %.6f, %d parameters" % (loss.item(), sum(p.numel() for p in model.parameters())))
    records = before + [("input.x", as_f32(x)), ("input.targets", targets), ("loss", loss.detach()),
                        ("act.logits", as_f32(logits)), ("act.eval_logits", as_f32(eval_logits))]
    records += [("grad." + n, as_f32(p.grad)) for n, p in model.named_parameters()]
    records += [("after." + n, as_f32(t) if t.is_floating_point() else t.clone()) for n, t in model.named_buffers()]
    meta = {"in_channels": cin, "image_size": side, "conv1_channels": c1, "conv2_channels": c2, "hidden": hidden,
            "num_classes": classes, "batch": B}
    return records, meta


def main():
    os.makedirs(FIXTURES, exist_ok=True)
    for file, make, seed in (("golden_llama.safetensors", make_llama, 2024),
                             ("golden_cnn_bn.safetensors", make_cnn, 2025)):
        records, meta = make(torch.Generator().manual_seed(seed))
        meta = {k: repr(v) if isinstance(v, float) else str(v) for k, v in meta.items()}
        meta["torch_version"] = torch.__version__
        write_safetensors(os.path.join(FIXTURES, file), records, meta)


if __name__ == "__main__":
    main()
