#!/usr/bin/env python3
"""Reference trajectories of galore_torch's GaLore-AdamW (the authors' package, galore-torch 1.0 from PyPI) for
tests/test_galore_torch.cpp, written to tests/fixtures/galore_torch_adamw.json.

galore_torch's projector is patched with the canonical sign rule of memtrain's projector
(include/memtrain/optim/galore_projector.h): a first basis has each basis vector's largest-magnitude entry
positive (the lowest index on a tie), a later one has each vector's dot product with the previous basis's same
vector >= 0. Without it, the two implementations' SVD libraries (LAPACK here, Eigen there) choose signs
independently and the trajectories part after the first refresh.

Inputs need no fixture: the weights and every step's gradient are closed formulas of (i, j, t) evaluated with
math.sin in float64 and rounded to float32 (the gradients planted directions plus a hash-like noise), which the
test evaluates the same way.

Usage (Debian's python3-torch runs under /usr/bin/python3; galore_torch imports transformers only for a version
check, stubbed here, so the wheel is enough):
    pip download galore-torch==1.0 --no-deps -d /tmp/gt && unzip -o /tmp/gt/galore_torch-1.0-py3-none-any.whl -d /tmp/gt/x
    /usr/bin/python3 scripts/make_galore_torch_fixture.py /tmp/gt/x tests/fixtures/galore_torch_adamw.json
"""
import importlib.util
import json
import math
import sys
import types
import warnings

import torch

RANK, GAP, SCALE, LR, EPS, STEPS = 3, 3, 0.25, 1e-3, 1e-6, 7
SHAPES = [(12, 24), (24, 12)]  # m < n: the left side (P^T G); m > n: the right side (G Q)
DECAYS = [0.0, 0.1]


def weight(m, n):
    return [[0.001 * math.sin(0.7 * i + 1.3 * j + 0.1) for j in range(n)] for i in range(m)]


def noise(i, j, t):
    """A hash of (i, j, t) in [-0.5, 0.5): the fractional part of a scaled sine, as random as Gaussian
    gradients for this purpose and the same bits in C++ (glibc's sin, double arithmetic)."""
    x = math.sin(12.9898 * (i + 1) + 78.233 * (j + 1) + 37.719 * (t + 1)) * 43758.5453
    return x - math.floor(x) - 0.5


def gradient(m, n, t):
    """Five planted directions with well-separated strengths (8, 4, 2.7, 2, 1.6, each within 5% of that over the
    steps) on orthonormal sine vectors, plus noise: a top-3 subspace that any two correct SVDs agree on to
    rounding, as real gradients' leading directions are (a pure noise matrix has near-equal singular values at
    the cut, where two libraries' subspaces differ by more than rounding)."""
    def sine(k, i, size):
        return math.sqrt(2.0 / (size + 1)) * math.sin(math.pi * (k + 1) * (i + 1) / (size + 1))
    strengths = [8.0 / (k + 1) * (1.0 + 0.05 * math.sin(0.7 * t + k)) for k in range(5)]
    return [[sum(strengths[k] * sine(k, i, m) * sine(k, j, n) for k in range(5)) + 0.05 * noise(i, j, t)
             for j in range(n)] for i in range(m)]


def f32(rows):
    return torch.tensor(rows, dtype=torch.float64).float()


def load_galore_torch(root):
    # transformers.utils.versions.require_version is galore_torch's only use of transformers.
    for name in ["transformers", "transformers.utils", "transformers.utils.versions"]:
        sys.modules[name] = types.ModuleType(name)
    sys.modules["transformers.utils.versions"].require_version = lambda *a, **k: None
    package = types.ModuleType("galore_torch")
    package.__path__ = [f"{root}/galore_torch"]
    sys.modules["galore_torch"] = package
    modules = {}
    for name in ["galore_projector", "adamw"]:
        spec = importlib.util.spec_from_file_location(f"galore_torch.{name}", f"{root}/galore_torch/{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[f"galore_torch.{name}"] = module
        spec.loader.exec_module(module)
        modules[name] = module
    return modules["galore_projector"].GaLoreProjector, modules["adamw"].AdamW


def canonical(new, previous, vectors_are_rows):
    """memtrain's sign rule on a basis whose vectors are its columns (left: U[:, :r]) or rows (right: Vh[:r])."""
    x = new.t() if vectors_are_rows else new
    signs = torch.ones(x.shape[1], dtype=x.dtype)
    for c in range(x.shape[1]):
        if previous is None:
            top = int(torch.argmax(x[:, c].abs()))  # the first maximal index: the lowest row on a tie
            flip = float(x[top, c]) < 0.0
        else:
            p = previous.t() if vectors_are_rows else previous
            flip = float((x[:, c].double() * p[:, c].double()).sum()) < 0.0
        if flip:
            signs[c] = -1.0
    out = x * signs
    return out.t().contiguous() if vectors_are_rows else out


def patch_sign_rule(projector_class):
    original = projector_class.get_orthogonal_matrix

    def get_orthogonal_matrix(self, weights, rank, type):
        basis = original(self, weights, rank, type)
        if type == "full":
            raise ValueError("the fixture covers the left and right sides only")
        return canonical(basis, self.ortho_matrix, vectors_are_rows=(type == "right"))

    projector_class.get_orthogonal_matrix = get_orthogonal_matrix


def run(adamw_class, m, n, weight_decay):
    w = torch.nn.Parameter(f32(weight(m, n)))
    group = {"params": [w], "rank": RANK, "update_proj_gap": GAP, "scale": SCALE, "proj_type": "std"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = adamw_class([group], lr=LR, eps=EPS, weight_decay=weight_decay, no_deprecation_warning=True)
    after = []
    for t in range(STEPS):
        w.grad = f32(gradient(m, n, t))
        opt.step()
        after.append([float(f"{v:.9g}") for v in w.detach().reshape(-1).tolist()])  # 9 digits: f32 exactly
    return after


def main():
    root, out = sys.argv[1], sys.argv[2]
    projector_class, adamw_class = load_galore_torch(root)
    patch_sign_rule(projector_class)
    cases = []
    for m, n in SHAPES:
        for wd in DECAYS:
            cases.append({"m": m, "n": n, "weight_decay": wd, "weights_after_step": run(adamw_class, m, n, wd)})
    fixture = {
        "source": "galore-torch 1.0 (PyPI) GaLoreAdamW, proj_type std, sign rule patched in; torch " + torch.__version__,
        "rank": RANK, "update_proj_gap": GAP, "scale": SCALE, "lr": LR, "eps": EPS, "betas": [0.9, 0.999],
        "steps": STEPS, "cases": cases,
    }
    with open(out, "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
