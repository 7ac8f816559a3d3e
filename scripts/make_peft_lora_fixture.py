#!/usr/bin/env python3
"""Writes the Hugging Face PEFT LoRA interop fixture for GPT-2: a base checkpoint, two adapters saved by the real
`peft` library, and the logits the real PEFT model gives, so that CI (no PyTorch) can check that memtrain loads
PEFT adapters and computes the same thing. A second mode checks the reverse direction (memtrain saves, PEFT loads).

Unlike scripts/make_hf_gpt2_fixture.py (plain torch, no `transformers`), this one runs the real `transformers` +
`peft` from PyPI: the point is to pin down the exact files PEFT writes and the exact numbers PEFT computes.

Writes tests/fixtures/peft_lora/:
  base/config.json, base/generation_config.json, base/model.safetensors
      GPT2LMHeadModel(GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=4, all pdrop 0,
      bos/eos_token_id 95)), saved by transformers' save_pretrained (safetensors). Computation keys stay at the
      GPT-2 defaults memtrain's HF loader insists on: activation_function gelu_new, layer_norm_epsilon 1e-5,
      n_inner null, scale_attn_weights true, tie_word_embeddings true, model_type gpt2. The weights are
      re-drawn after HF's init (seeded): std 0.1 weights, LayerNorm gains 1 +- 0.1, non-zero biases, as in the
      hf_gpt2 fixture (HF's std-0.02 init with zero biases leaves the blocks nearly inert, so a wrong transpose
      or scaling would barely move a logit). As transformers 5.25 writes it: model.safetensors holds the 28 F32
      parameters, "transformer."-prefixed, Conv1D weights [in, out], NO lm_head.weight (tied to wte, dropped)
      and NO attn.bias / attn.masked_bias mask buffers; metadata {"format": "pt"}. config.json has "dtype":
      "float32" (not the older "torch_dtype") and no n_ctx; generation_config.json (bos/eos 95) is also
      written by save_pretrained and is not needed by memtrain. transformers 5 has no safe_serialization
      argument any more: it always writes safetensors.
  adapter/adapter_config.json, adapter/adapter_model.safetensors
      LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"], lora_dropout=0.0, bias="none",
      fan_in_fan_out=True, task_type="CAUSAL_LM"), get_peft_model, lora_A as PEFT initialises it
      (kaiming-uniform, seeded global generator), every lora_B re-drawn N(0, 0.02^2) (PEFT initialises B to
      zero, which would make the adapter a no-op; adapter_config.json still says "init_lora_weights": true),
      PeftModel.save_pretrained. "c_proj" matches both attn.c_proj and mlp.c_proj, so all four Conv1D layers
      of each block are adapted.
  adapter_rslora/ (same two files)
      LoraConfig(r=4, lora_alpha=8, use_rslora=True, target_modules=["c_attn"], otherwise as above).
  expected.safetensors
      input_ids [2, 16] I64 (seeded, < 96), and F64 logits [2, 16, 96]: logits_base, logits_adapter,
      logits_adapter_rslora. Metadata: the torch/transformers/peft/safetensors/numpy versions used.
PEFT's save_pretrained also writes a README.md model card into each adapter directory; it is boilerplate, not
read by PEFT's loader, so this script deletes it. Everything else is byte-for-byte what the libraries wrote.

How the logits are computed: the committed files are reloaded from disk (GPT2LMHeadModel.from_pretrained with
attn_implementation="eager", then PeftModel.from_pretrained(base, adapter_dir)), converted with .double() and
run in eval mode. All stored weights are float32, so the float64 run is the exact model those files describe
and the C++ test measures only its own float32 error. (The script prints the float32-vs-float64 gap of the
PEFT run itself for reference.)

What PEFT writes, as observed with the versions below (the script asserts the key names and shapes):
  adapter_model.safetensors keys (F32), for i in {0, 1}, r = 4, C = 32, names without the ".default" adapter
  name that the in-memory parameters carry:
    base_model.model.transformer.h.{i}.attn.c_attn.lora_A.weight   [4, 32]    (r, in)
    base_model.model.transformer.h.{i}.attn.c_attn.lora_B.weight   [96, 4]    (out, r)
    base_model.model.transformer.h.{i}.attn.c_proj.lora_A.weight   [4, 32]
    base_model.model.transformer.h.{i}.attn.c_proj.lora_B.weight   [32, 4]
    base_model.model.transformer.h.{i}.mlp.c_fc.lora_A.weight      [4, 32]
    base_model.model.transformer.h.{i}.mlp.c_fc.lora_B.weight      [128, 4]
    base_model.model.transformer.h.{i}.mlp.c_proj.lora_A.weight    [4, 128]
    base_model.model.transformer.h.{i}.mlp.c_proj.lora_B.weight    [32, 4]
  (16 tensors; adapter_rslora/ has only the 4 attn.c_attn ones.) No bias tensors (bias="none").
  Shapes: lora_A is always [r, in] and lora_B [out, r], nn.Linear layout, whatever the base layer is:
  fan_in_fan_out=True does NOT transpose A or B. HF's Conv1D stores its own weight as W [in, out] (y = x W + b);
  PEFT's forward is y = base(x) + lora_B(lora_A(x)) * scaling = x W + b + x A^T B^T * scaling, i.e. exactly the
  same as for a Linear: delta = B @ A ([out, in]) applied as x @ (B A)^T * scaling. fan_in_fan_out only matters
  when merging: get_delta_weight transposes B @ A to [in, out] to add it to the Conv1D weight.
  scaling = lora_alpha / r = 8 / 4 = 2 for adapter/, lora_alpha / sqrt(r) = 8 / 2 = 4 for adapter_rslora/.
  adapter_config.json: the full text is in the fixture; keys the loader needs are peft_type "LORA", r,
  lora_alpha, use_rslora, target_modules (PEFT writes it as a list in unspecified order - match by suffix),
  fan_in_fan_out, bias, lora_dropout, task_type "CAUSAL_LM", base_model_name_or_path, and a long tail of
  feature keys at their off values (use_dora false, alpha_pattern {}, rank_pattern {}, layers_to_transform null,
  modules_to_save null, ...), which a loader must check are off rather than ignore.

Regenerate (from the repository root; PyTorch's own wheel index was not reachable, so torch came from PyPI):
  python3 -m venv /work/peft_venv
  /work/peft_venv/bin/pip install torch transformers peft safetensors numpy
  /work/peft_venv/bin/python scripts/make_peft_lora_fixture.py
Versions used: torch 2.15.0+cu132 (the PyPI wheel; run on CPU), transformers 5.25.0, peft 0.21.2,
safetensors 0.8.0, numpy 2.4.6, Python 3.11.7; also stored in expected.safetensors' metadata. The output is
deterministic for a given torch build (global and explicit CPU generators are seeded; one thread; the script
re-executes itself with PYTHONHASHSEED=0 because PEFT writes target_modules in set order; expected.safetensors
is written with sorted header keys). Regeneration was checked to be byte-identical.

Reverse check (memtrain wrote an adapter directory DIR and the logits FILE of base + that adapter on
expected.safetensors' input_ids, a safetensors file with one tensor "logits" [2, 16, 96]):
  /work/peft_venv/bin/python scripts/make_peft_lora_fixture.py --check-memtrain-adapter DIR --logits FILE
It loads base/ from this fixture, PeftModel.from_pretrained(base, DIR) (after checking that DIR's tensor names
are exactly the LoRA parameters PEFT expects, since PEFT itself only warns about missing keys), runs in
float64, prints max abs error and relative error (max |diff| / max |reference|) and exits 1 if the relative
error exceeds 1e-5 (2 on a key-name or shape mismatch).
"""

import argparse
import json
import math
import os
import struct
import sys
import warnings

import numpy as np
import peft
import safetensors
import safetensors.torch
import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

transformers.utils.logging.disable_progress_bar()
warnings.filterwarnings("ignore", category=FutureWarning)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "peft_lora")
BASE_DIR = os.path.join(OUT, "base")
EXPECTED = os.path.join(OUT, "expected.safetensors")

V, NPOS, C, L, H = 96, 32, 32, 2, 4
BATCH, T = 2, 16
R, ALPHA = 4, 8
B_STD = 0.02  # lora_B draw; with A ~ kaiming-uniform (PEFT's init) the adapters move logits by O(0.5)
REL_TOL = 1e-5

VERSIONS = {"torch_version": torch.__version__, "transformers_version": transformers.__version__,
            "peft_version": peft.__version__, "safetensors_version": safetensors.__version__,
            "numpy_version": np.__version__, "python_version": "%d.%d.%d" % sys.version_info[:3]}


def lora_config(**kw):
    args = dict(r=R, lora_alpha=ALPHA, target_modules=["c_attn", "c_proj", "c_fc"], lora_dropout=0.0, bias="none",
                fan_in_fan_out=True, task_type="CAUSAL_LM")
    args.update(kw)
    return peft.LoraConfig(**args)


def rel(p):
    return os.path.relpath(p, ROOT)


def make_base():
    cfg = GPT2Config(vocab_size=V, n_positions=NPOS, n_embd=C, n_layer=L, n_head=H, resid_pdrop=0.0,
                     attn_pdrop=0.0, embd_pdrop=0.0, bos_token_id=V - 1, eos_token_id=V - 1)
    torch.manual_seed(20240612)
    model = GPT2LMHeadModel(cfg)
    # Re-draw every parameter (see the docstring): std 0.1, LayerNorm gains around 1, non-zero biases.
    gen = torch.Generator().manual_seed(20240613)
    with torch.no_grad():
        for name, p in model.named_parameters():  # lm_head.weight is wte.weight: named_parameters lists it once
            noise = 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.copy_(noise + 1.0 if (".ln_" in name or name.startswith("transformer.ln_f")) and name.endswith(
                ".weight") else noise)
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), "lm_head not tied"
    return model


def load_base(dtype=torch.float64):
    m = GPT2LMHeadModel.from_pretrained(BASE_DIR, attn_implementation="eager")
    return m.to(dtype).eval()


def randomise_lora_b(model, seed):
    gen = torch.Generator().manual_seed(seed)
    n = 0
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if ".lora_B." in name:
                p.copy_(B_STD * torch.randn(p.shape, generator=gen, dtype=torch.float32))
                n += 1
    assert n > 0
    return n


def write_adapter(subdir, config, seed):
    out = os.path.join(OUT, subdir)
    # Loaded by its path relative to the repository root (the cwd here), which PEFT records as
    # base_model_name_or_path; an absolute path would leak this machine's layout into the fixture.
    base = GPT2LMHeadModel.from_pretrained(rel(BASE_DIR), attn_implementation="eager")
    torch.manual_seed(seed)  # PEFT draws lora_A (kaiming-uniform) from the global generator
    pm = peft.get_peft_model(base, config)
    randomise_lora_b(pm, seed + 1)
    pm.save_pretrained(out)
    readme = os.path.join(out, "README.md")
    if os.path.exists(readme):
        os.remove(readme)
    for f in sorted(os.listdir(out)):
        print("wrote %s (%d bytes)" % (rel(os.path.join(out, f)), os.path.getsize(os.path.join(out, f))))
    return out


def expected_adapter_keys(model):
    """The file names PEFT uses for a PeftModel's LoRA parameters: the in-memory name less '.<adapter>'."""
    keys = set()
    for name, _ in model.named_parameters():
        if ".lora_A." in name or ".lora_B." in name:
            keys.add(name.replace(".default.", "."))
    return keys


def file_shapes(path):
    with safetensors.safe_open(path, "pt") as f:
        return {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}


def check_adapter_file(subdir, conv_names):
    """Asserts the documented layout: lora_A [r, in], lora_B [out, r], F32, names without '.default'."""
    io = {"attn.c_attn": (C, 3 * C), "attn.c_proj": (C, C), "mlp.c_fc": (C, 4 * C), "mlp.c_proj": (4 * C, C)}
    want = {}
    for i in range(L):
        for m in conv_names:
            pre = "base_model.model.transformer.h.%d.%s." % (i, m)
            want[pre + "lora_A.weight"] = ((R, io[m][0]), "F32")
            want[pre + "lora_B.weight"] = ((io[m][1], R), "F32")
    got = file_shapes(os.path.join(OUT, subdir, "adapter_model.safetensors"))
    assert got == want, "%s: unexpected layout\n got  %s\n want %s" % (subdir, sorted(got.items()),
                                                                      sorted(want.items()))
    print("%s/adapter_model.safetensors: %d tensors, layout as documented" % (subdir, len(got)))
    for k, (shape, dt) in sorted(got.items()):
        print("  %-62s %-10s %s" % (k, list(shape), dt))


@torch.no_grad()
def logits_of(model, input_ids):
    return model(input_ids=input_ids).logits


def peft_model(adapter_dir, dtype=torch.float64):
    pm = peft.PeftModel.from_pretrained(load_base(torch.float32), adapter_dir)
    return pm.to(dtype).eval()


def check_scaling(pm, want):
    for name, mod in pm.named_modules():
        if hasattr(mod, "scaling") and isinstance(mod.scaling, dict) and "default" in mod.scaling:
            assert math.isclose(mod.scaling["default"], want), (name, mod.scaling)
            # the delta as documented: x @ (B A)^T * scaling, same as for a Linear
            A, B = mod.lora_A["default"].weight, mod.lora_B["default"].weight
            x = torch.randn(3, A.shape[1], dtype=A.dtype, generator=torch.Generator().manual_seed(1))
            direct = mod(x) - mod.base_layer(x)
            assert torch.allclose(direct, x @ (B @ A).T * want, rtol=1e-10, atol=1e-12), name
            assert torch.allclose(mod.get_delta_weight("default"), (B @ A).T * want), name  # merge: [in, out]


def save_safetensors_sorted(path, tensors, metadata):
    """safetensors.torch.save_file writes __metadata__ in hash order (it differs run to run); this writes the
    same format with sorted keys: u64 header length, JSON header padded with spaces to 8 bytes, raw LE data."""
    dtypes = {torch.float64: "F64", torch.float32: "F32", torch.int64: "I64"}
    header, blobs, offset = {"__metadata__": dict(sorted(metadata.items()))}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        data = t.numpy().astype(t.numpy().dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)
    back = safetensors.torch.load_file(path)
    assert set(back) == set(tensors) and all(torch.equal(back[k], tensors[k]) for k in tensors)


def generate():
    os.chdir(ROOT)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.makedirs(BASE_DIR, exist_ok=True)

    base = make_base()
    base.save_pretrained(BASE_DIR)
    for f in sorted(os.listdir(BASE_DIR)):
        print("wrote %s (%d bytes)" % (rel(os.path.join(BASE_DIR, f)), os.path.getsize(os.path.join(BASE_DIR, f))))
    with open(os.path.join(BASE_DIR, "config.json")) as f:
        cfg = json.load(f)
    for k, v in (("activation_function", "gelu_new"), ("layer_norm_epsilon", 1e-5), ("n_inner", None),
                 ("scale_attn_weights", True), ("model_type", "gpt2"), ("scale_attn_by_inverse_layer_idx", False)):
        assert cfg.get(k, v) == v, (k, cfg.get(k))
    assert cfg.get("tie_word_embeddings", True) is True, cfg.get("tie_word_embeddings")
    print("base/model.safetensors keys:", {k: list(s) for k, (s, _) in sorted(
        file_shapes(os.path.join(BASE_DIR, "model.safetensors")).items())})

    write_adapter("adapter", lora_config(), 20240614)
    write_adapter("adapter_rslora", lora_config(use_rslora=True, target_modules=["c_attn"]), 20240616)
    check_adapter_file("adapter", ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"])
    check_adapter_file("adapter_rslora", ["attn.c_attn"])

    gen = torch.Generator().manual_seed(20240618)
    input_ids = torch.randint(0, V, (BATCH, T), generator=gen, dtype=torch.int64)

    # Everything below from the files just written, reloaded.
    logits = {"logits_base": logits_of(load_base(), input_ids)}
    for key, subdir, scaling in (("logits_adapter", "adapter", ALPHA / R),
                                 ("logits_adapter_rslora", "adapter_rslora", ALPHA / math.sqrt(R))):
        pm = peft_model(os.path.join(OUT, subdir))
        check_scaling(pm, scaling)
        logits[key] = logits_of(pm, input_ids)
        l32 = logits_of(peft_model(os.path.join(OUT, subdir), torch.float32), input_ids).double()
        merged = pm.merge_and_unload()  # the merged Conv1D weights must give the same logits
        lm = logits_of(merged, input_ids)
        print("%s: max |adapter - base| %.4f (max |logit| %.3f); PEFT f32 vs f64 max abs %.2e; merged vs unmerged "
              "%.2e" % (subdir, (logits[key] - logits["logits_base"]).abs().max().item(),
                        logits[key].abs().max().item(), (l32 - logits[key]).abs().max().item(),
                        (lm - logits[key]).abs().max().item()))
    # How much a wrong scaling (alpha/r instead of alpha/sqrt(r)) would move the rslora logits:
    pm = peft_model(os.path.join(OUT, "adapter_rslora"))
    for mod in pm.modules():
        if hasattr(mod, "scaling") and isinstance(mod.scaling, dict) and "default" in mod.scaling:
            mod.scaling["default"] = ALPHA / R
    print("adapter_rslora with scaling alpha/r instead: max logit change %.4f"
          % (logits_of(pm, input_ids) - logits["logits_adapter_rslora"]).abs().max().item())

    tensors = {"input_ids": input_ids.contiguous()}
    tensors.update({k: v.contiguous() for k, v in logits.items()})
    meta = dict(VERSIONS, script="scripts/make_peft_lora_fixture.py", logits_dtype="float64",
                lora_B_std=str(B_STD))
    save_safetensors_sorted(EXPECTED, tensors, meta)
    print("wrote %s (%d bytes)" % (rel(EXPECTED), os.path.getsize(EXPECTED)))
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT) for f in fs)
    print("fixture total %d bytes; versions %s" % (total, VERSIONS))
    return 0


def check_memtrain_adapter(adapter_dir, logits_file):
    torch.set_num_threads(1)
    input_ids = safetensors.torch.load_file(EXPECTED)["input_ids"]
    got = safetensors.torch.load_file(logits_file)
    if "logits" not in got:
        print("FAIL: %s has no tensor 'logits' (has %s)" % (logits_file, sorted(got)))
        return 2
    got = got["logits"].double()

    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        print("adapter_config.json:", json.dumps(json.load(f), sort_keys=True))
    pm = peft_model(adapter_dir)
    want_keys = expected_adapter_keys(pm)
    file_keys = set(file_shapes(os.path.join(adapter_dir, "adapter_model.safetensors")))
    if file_keys != want_keys:
        print("FAIL: adapter tensor names differ from what PEFT expects\n  missing in file: %s\n  not used by PEFT: %s"
              % (sorted(want_keys - file_keys), sorted(file_keys - want_keys)))
        return 2
    scalings = sorted({m.scaling["default"] for m in pm.modules()
                       if hasattr(m, "scaling") and isinstance(m.scaling, dict) and "default" in m.scaling})
    print("PEFT loaded %d LoRA tensors from %s; scaling %s" % (len(file_keys), adapter_dir, scalings))

    want = logits_of(pm, input_ids)
    if tuple(got.shape) != tuple(want.shape):
        print("FAIL: logits shape %s, PEFT gives %s" % (list(got.shape), list(want.shape)))
        return 2
    base = safetensors.torch.load_file(EXPECTED)["logits_base"]
    diff = (got - want).abs()
    max_abs = diff.max().item()
    max_rel = max_abs / want.abs().max().item()
    elem_rel = (diff / want.abs().clamp_min(1e-3)).max().item()
    print("max abs error %.3e, relative error (max|diff|/max|ref|) %.3e, max elementwise rel (|ref| floored at "
          "1e-3) %.3e; for scale: max |PEFT adapter - base| %.3e"
          % (max_abs, max_rel, elem_rel, (want - base).abs().max().item()))
    if not max_rel <= REL_TOL:
        print("FAIL: relative error above %.0e" % REL_TOL)
        return 1
    print("OK")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check-memtrain-adapter", metavar="DIR",
                    help="adapter directory written by memtrain (adapter_config.json + adapter_model.safetensors)")
    ap.add_argument("--logits", metavar="FILE", help="safetensors file with tensor 'logits' computed by memtrain")
    a = ap.parse_args()
    if a.check_memtrain_adapter or a.logits:
        if not (a.check_memtrain_adapter and a.logits):
            ap.error("--check-memtrain-adapter and --logits go together")
        return check_memtrain_adapter(a.check_memtrain_adapter, a.logits)
    if os.environ.get("PYTHONHASHSEED") != "0":
        # PEFT turns target_modules into a set and writes list(set) to adapter_config.json, so the order there
        # follows string hashing: fix the hash seed for byte-identical regeneration.
        os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, PYTHONHASHSEED="0"))
    return generate()


if __name__ == "__main__":
    sys.exit(main())
