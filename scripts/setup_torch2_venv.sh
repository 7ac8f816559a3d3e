#!/usr/bin/env bash
# Creates the Python virtual environment with PyTorch 2.x (CPU build) that bench/run_gpt_side_by_side.sh
# uses for its PyTorch 2.x eager peer (bench/torch_peer/gpt_step_pytorch.py). Debian 12 ships only
# PyTorch 1.13 (python3-torch, libtorch-dev), so PyTorch 2.x comes from pip, in a venv of its own.
#
# Idempotent: when the venv already imports torch >= 2 it touches nothing and needs no network.
# It first tries PyTorch's CPU-only wheel index (a ~200 MB wheel, no CUDA libraries); where that index
# cannot be reached it falls back to plain `pip install torch` from PyPI (a larger download).
#
# Usage: bash scripts/setup_torch2_venv.sh
# Environment: TORCH2_VENV (default /work/torch2-venv), TORCH2_SPEC (default "torch>=2", the pip requirement).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

venv=${TORCH2_VENV:-/work/torch2-venv}
spec=${TORCH2_SPEC:-torch>=2}
py=$venv/bin/python

has_torch2() {
  [[ -x $py ]] && "$py" -c 'import sys, torch; sys.exit(0 if int(torch.__version__.split(".")[0]) >= 2 else 1)' \
    2>/dev/null
}

if has_torch2; then
  echo "$venv already has torch $("$py" -c 'import torch; print(torch.__version__)')"
  exit 0
fi

if [[ ! -x $py ]]; then
  mt_step "creating the venv $venv"
  if ! python3 -m venv "$venv"; then
    # Debian's python3 has venv in a separate package (python3-venv); install it when we may.
    if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
      mt_run apt-get install -y -q python3-venv
      rm -rf "$venv"
      mt_run python3 -m venv "$venv"
    else
      mt_die "python3 -m venv failed; install python3-venv (as root: apt-get install python3-venv)"
    fi
  fi
fi

mt_step "installing $spec (CPU build) into $venv"
mt_run "$py" -m pip install -q --upgrade pip
if ! mt_run "$py" -m pip install -q "$spec" --index-url https://download.pytorch.org/whl/cpu; then
  echo "PyTorch's CPU wheel index is unreachable or failed; falling back to the default index"
  mt_run "$py" -m pip install -q "$spec"
fi
# The peer's only other import; small, and pip installs it with torch anyway.
mt_run "$py" -m pip install -q numpy || true
has_torch2 || mt_die "$venv still has no torch >= 2"
"$py" -c 'import torch; print("torch", torch.__version__, "threads", torch.get_num_threads(),
      "cpu capability", torch.backends.cpu.get_cpu_capability())'
