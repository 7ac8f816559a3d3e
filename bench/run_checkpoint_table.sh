#!/usr/bin/env bash
# Activation checkpointing on the GPT training step (CPU, fp32, AdamW): memtrain under each policy beside
# PyTorch with and without per-block checkpointing, all in one run, one markdown table per config.
#
# Per config the runs interleave, so a change in machine load hits both sides alike:
#   memtrain none, torch none, memtrain full, torch full, memtrain every:2, memtrain selective,
#   memtrain selective:scaled_dot_product_attention,linear@mlp.fc (op labels: keep attention and the MLP's fc
#   output, recompute the qkv projection), memtrain budget:X
# memtrain is bench_gpt_e2e --checkpoint POLICY; the peer is bench/torch_peer/gpt_ckpt_torch.py (Python torch,
# torch.utils.checkpoint per block, use_reentrant=False). The peer's runs are skipped with a warning where
# `$PYTHON -c 'import torch'` fails.
#
# The budget X is half of the activation peak memtrain's `none` run measured for the same config, rounded down
# to whole MiB (KiB below 2 MiB). The budget bounds what the blocks keep (their inputs plus what their ops save,
# as the planner counts it), while the activation peak also holds what lives outside the blocks (embedding sum,
# ln_f output, the fused head's saved rows) and, during backward, the one block being recomputed. With a fused
# head the outside part is small, so half of none's peak asks the planner to drop a bit more than half of what
# the blocks keep under none: a point between full and none, where a mixed plan (some blocks selective or none,
# the rest full) is the interesting answer and every:2 keeps about as much, for comparison. The halfway point
# between the full and none peaks minus the outside part would need that outside part measured separately; a
# fraction of none's peak needs only the run already made.
#
# Columns: act peak = memtrain: peak bytes of the allocator's activations category over the timed steps (what
#   the forward allocated and is still alive, plus a recomputed block during backward); torch: bytes of the
#   distinct storages saved for backward at the end of the forward (parameters excluded, see the peer's
#   docstring) - the two are close but not the same measure. cut = 1 - act / act(none) of the same program.
#   total peak = memtrain's allocator peak over all categories (parameters, gradients, AdamW state,
#   activations, workspace); torch has no such counter. RSS = VmHWM (the peer's includes the interpreter).
#   step = median wall seconds of a training step; cpu = median CPU seconds (both threads) of a step;
#   overhead = step / step(none) - 1 of the same program. load = 1-minute load average when the run started.
#
# Usage: bench/run_checkpoint_table.sh [configs...]   config = model:seq_len:batch
#   default configs: small:256:8 gpt2-124M:256:4
# Environment: MEMTRAIN_BUILD_DIR (default build; the binary is $MEMTRAIN_BUILD_DIR/bench/bench_gpt_e2e),
#   STEPS (10), WARMUP (3), THREADS (nproc), SKIP_BUILD=1 to use an existing binary, PYTHON (/usr/bin/python3).
#   The peer runs as in run_gpt_side_by_side.sh: jemalloc preloaded where installed, OMP_WAIT_POLICY=PASSIVE.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
cd "$MEMTRAIN_ROOT"

configs=("$@")
((${#configs[@]} > 0)) || configs=(small:256:8 gpt2-124M:256:4)
# shellcheck source=bench/gpt_table_common.sh
source bench/gpt_table_common.sh

# run IMPL POLICY: runs one program, appends "impl|policy|load|RESULT line" to rows and the describe line
# (memtrain) to notes.
rows=() notes=()
run() {
  local impl=$1 policy=$2 load out
  load=$(load1)
  if [[ $impl == memtrain ]]; then
    mt_step "memtrain $model T=$seq B=$batch --checkpoint $policy (load: $(cut -d' ' -f1-3 /proc/loadavg))"
    out=$("$mt_bin" "${args[@]}" --checkpoint "$policy" | tee -a /dev/stderr)
    notes+=("- $model, memtrain $policy: $(grep '^checkpointing ' <<<"$out")")
  else
    mt_step "torch $model T=$seq B=$batch --checkpoint $policy, env: ${peer_env[*]} (load: $(cut -d' ' -f1-3 /proc/loadavg))"
    out=$(env "${peer_env[@]}" "$python" "$peer" "${args[@]}" --checkpoint "$policy" | tee -a /dev/stderr)
  fi
  rows+=("$impl|$policy|$load|$(grep '^RESULT' <<<"$out")")
}

tables=()
for cfg in "${configs[@]}"; do
  IFS=: read -r model seq batch <<<"$cfg"
  args=(--model "$model" --seq-len "$seq" --batch "$batch" --steps "$steps" --warmup "$warmup" --threads "$threads")
  rows=()
  run memtrain none
  ((have_peer)) && run torch none
  run memtrain full
  ((have_peer)) && run torch full
  run memtrain every:2
  run memtrain selective
  run memtrain selective:scaled_dot_product_attention,linear@mlp.fc
  none_act=$(field "${rows[0]##*|}" act_peak_bytes)
  budget=$(awk -v b="$none_act" 'BEGIN { h = b / 2; m = int(h / 1048576);
    if (m >= 2) printf "%dMiB", m; else printf "%dKiB", int(h / 1024) }')
  run memtrain "budget:$budget"

  table="### $model, T=$seq, B=$batch ($steps timed steps after $warmup warm-up, $threads threads)"$'\n\n'
  table+="| program | policy | act peak MiB | cut vs none | total peak MiB | RSS MiB | step s | cpu s | overhead vs none | load |"$'\n'
  table+="|---|---|---|---|---|---|---|---|---|---|"$'\n'
  declare -A base_act=() base_ms=()
  for row in "${rows[@]}"; do
    IFS='|' read -r impl policy load res <<<"$row"
    act=$(field "$res" act_peak_bytes) ms=$(field "$res" step_ms) cpu=$(field "$res" cpu_ms)
    total=$(field "$res" total_peak_bytes) rss=$(field "$res" rss_mib) kept=$(field "$res" plan_kept_bytes)
    [[ $policy == none ]] && base_act[$impl]=$act base_ms[$impl]=$ms
    label=$policy
    [[ $impl == torch ]] && label="$policy (saved tensors)"
    [[ -n $kept && $kept != 0 ]] && label+=$(awk -v k="$kept" 'BEGIN { printf " (plan keeps %.0f MiB)", k / 1048576 }')
    table+=$(awk -v impl="$impl" -v label="$label" -v act="$act" -v a0="${base_act[$impl]}" -v total="$total" \
      -v rss="$rss" -v ms="$ms" -v m0="${base_ms[$impl]}" -v cpu="$cpu" -v load="$load" 'BEGIN {
        tot = total > 0 ? sprintf("%.0f", total / 1048576) : "-"
        printf "| %s | %s | %.0f | %.0f%% | %s | %s | %.2f | %.2f | %+.0f%% | %s |", impl, label, act / 1048576,
          100 * (1 - act / a0), tot, rss, ms / 1000, cpu / 1000, 100 * (ms / m0 - 1), load }')$'\n'
  done
  unset base_act base_ms
  tables+=("$table")
done

echo
for t in "${tables[@]}"; do printf '%s\n' "$t"; done
echo "Plans (memtrain's describe line per run):"
printf '%s\n' "${notes[@]}"
