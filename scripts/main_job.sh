#!/usr/bin/env bash
# memtrain's main job, start to finish: install the dependencies, build, and train the GPT example on
# Debian's fortunes corpus with the memory-efficient defaults (8-bit AdamW); it prints the loss as it
# falls, a generated sample, and ends with the memory report. Idempotent: a second run reuses the
# packages, the build and the prepared corpus (data/fortunes); run files go to runs/gpt.
#
# Environment: MEMTRAIN_EXAMPLE picks the example (default train_gpt, i.e. examples/train_gpt/main.cpp,
# binary build/examples/memtrain_train_gpt); the build variables of scripts/build.sh apply too.
# Arguments are passed to the example (see: build/examples/memtrain_train_gpt --help).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$MEMTRAIN_ROOT"
start=$SECONDS

example=${MEMTRAIN_EXAMPLE:-train_gpt}
build_dir=${MEMTRAIN_BUILD_DIR:-build}
export MEMTRAIN_BUILD_DIR=$build_dir

bash scripts/setup.sh

if [[ ! -f examples/$example/main.cpp ]]; then
  bash scripts/build.sh memtrain
  mt_die "examples/$example/main.cpp does not exist yet: the library is built, but there is no example to run"
fi

bash scripts/build.sh "memtrain_$example"

mt_step "run: examples/$example"
mt_run "$build_dir/examples/memtrain_$example" "$@"

mt_step "main job done in $((SECONDS - start)) s"
