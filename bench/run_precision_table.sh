#!/usr/bin/env bash
# Mixed precision on the GPT training step (CPU, AdamW, f32 master weights): memtrain under fp32, bf16, fp16
# and fp8 (blockwise and delayed scaling) beside PyTorch in fp32 and under torch.autocast("cpu", bfloat16), all
# in one run, one markdown table per config. The runs interleave (memtrain fp32, torch fp32, memtrain bf16,
# torch bf16, memtrain fp16, fp8 blockwise, fp8 delayed), so a change in machine load hits both sides alike.
# memtrain is bench_gpt_e2e --precision P; the peer is bench/torch_peer/gpt_ckpt_torch.py --precision P
# (skipped with a warning where torch cannot be imported).
#
# Columns: act peak = memtrain: peak of the allocator's activations category over the timed steps (what the
#   forward allocated and is still alive, including the f32 temporaries ops make while they widen narrow
#   inputs); torch: bytes of the distinct storages saved for backward at the end of the forward. act kept =
#   memtrain's activations live when the total peaked (the tensors saved for backward). copies = peak of the
#   compute_weights category (the bf16/f16 copies of the weights). total peak = the allocator's peak over all
#   categories. RSS = VmHWM. step = median wall seconds; vs fp32 = step / step(fp32) - 1 of the same program.
#   loss = the loss of the last step (same weights, tokens and steps for every row of a program).
#
# Usage: bench/run_precision_table.sh [configs...]   config = model:seq_len:batch (default gpt2-124M:256:4)
# Environment: as run_checkpoint_table.sh (MEMTRAIN_BUILD_DIR, STEPS, WARMUP, THREADS, SKIP_BUILD, PYTHON).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
cd "$MEMTRAIN_ROOT"
configs=("$@")
((${#configs[@]} > 0)) || configs=(gpt2-124M:256:4)
# shellcheck source=bench/gpt_table_common.sh
source bench/gpt_table_common.sh

rows=()
run() {  # run IMPL FLAGS...: appends "impl|load|RESULT line" to rows
  local impl=$1 load out
  shift
  load=$(load1)
  mt_step "$impl $model T=$seq B=$batch $* (load: $(cut -d' ' -f1-3 /proc/loadavg))"
  if [[ $impl == memtrain ]]; then
    out=$("$mt_bin" "${args[@]}" "$@" | tee -a /dev/stderr)
  else
    out=$(env "${peer_env[@]}" "$python" "$peer" "${args[@]}" "$@" | tee -a /dev/stderr)
  fi
  rows+=("$impl|$load|$(grep '^RESULT' <<<"$out")")
}

for cfg in "${configs[@]}"; do
  IFS=: read -r model seq batch <<<"$cfg"
  args=(--model "$model" --seq-len "$seq" --batch "$batch" --steps "$steps" --warmup "$warmup" --threads "$threads")
  rows=()
  run memtrain --precision fp32
  ((have_peer)) && run torch --precision fp32
  run memtrain --precision bf16
  ((have_peer)) && run torch --precision bf16
  run memtrain --precision fp16
  run memtrain --precision fp8 --fp8-scaling blockwise
  run memtrain --precision fp8 --fp8-scaling delayed

  echo
  echo "### $model, T=$seq, B=$batch ($steps timed steps after $warmup warm-up, $threads threads)"
  echo
  echo "| program | precision | act peak MiB | vs fp32 | act kept MiB | copies MiB | total peak MiB | RSS MiB | step s | vs fp32 | loss | load |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  declare -A base_act=() base_ms=()
  for row in "${rows[@]}"; do
    IFS='|' read -r impl load res <<<"$row"
    precision=$(field "$res" precision) act=$(field "$res" act_peak_bytes) ms=$(field "$res" step_ms)
    [[ $precision == fp32 ]] && base_act[$impl]=$act base_ms[$impl]=$ms
    awk -v impl="$impl" -v p="$precision" -v act="$act" -v a0="${base_act[$impl]}" \
      -v kept="$(field "$res" act_at_peak_bytes)" -v copies="$(field "$res" weight_copies_peak_bytes)" \
      -v total="$(field "$res" total_peak_bytes)" -v rss="$(field "$res" rss_mib)" -v ms="$ms" \
      -v m0="${base_ms[$impl]}" -v loss="$(field "$res" loss)" -v load="$load" 'BEGIN {
        mib = 1048576
        k = kept > 0 ? sprintf("%.0f", kept / mib) : "-"; t = total > 0 ? sprintf("%.0f", total / mib) : "-"
        c = impl == "memtrain" ? sprintf("%.0f", copies / mib) : "-"
        printf "| %s | %s | %.0f | %+.0f%% | %s | %s | %s | %s | %.2f | %+.0f%% | %s | %s |\n", impl, p, act / mib,
          100 * (act / a0 - 1), k, c, t, rss, ms / 1000, 100 * (ms / m0 - 1), loss, load }'
  done
  unset base_act base_ms
done
