#!/usr/bin/env bash
# kill -9 during checkpoint saves, 50 times: a train_gpt run that saves every step is killed at a random
# moment, then started again with --resume, over and over. Checks that
#   - every restart resumes from the newest checkpoint on disk (never a torn one: a torn file would fail to
#     load, and the run would stop with an error);
#   - kills did land inside saves (a temp file was left behind), so the test saw what it is about;
#   - the run, finished after the last kill, ends with a checkpoint byte-identical to that of the same run
#     never killed.
# With OFFLOAD=1 both runs keep the optimizer state in files (--offload-optimizer file:DIR): a kill mid-step
# leaves nothing there that a restart could trust, and the restart resumes from the checkpoint.
#   [OFFLOAD=1] train_gpt_kill_resume.sh <memtrain_train_gpt binary> <corpus.txt> <scratch dir> [kills, default 50]
set -euo pipefail
bin=$1 corpus=$2 dir=$3 kills=${4:-50}
rm -rf "$dir" && mkdir -p "$dir"
steps=400
args=(--model tiny --vocab-size 300 --data "$corpus" --data-dir "$dir/data" --micro-batch 4 --sample-tokens 0
      --steps "$steps" --checkpoint-interval 1 --out-dir "$dir/run")
if [[ ${OFFLOAD:-0} == 1 ]]; then
  mkdir -p "$dir/offload"
  args+=(--offload-optimizer "file:$dir/offload")
fi
# Checkpoint paths are in each checkpoint's config: both runs use the same --out-dir, the reference moved away.
"$bin" "${args[@]}" > "$dir/reference.log" 2>&1 || { cat "$dir/reference.log"; exit 1; }
mv "$dir/run" "$dir/reference"
final=$(printf 'ckpt_%08d.safetensors' "$steps")

newest_step() {  # the step of the newest checkpoint in run/checkpoints, or 0
  local last
  last=$(ls "$dir/run/checkpoints" 2>/dev/null | grep -E '^ckpt_[0-9]+\.safetensors$' | tail -n 1)
  [[ -n $last ]] || { echo 0; return; }
  last=${last#ckpt_}
  echo $((10#${last%.safetensors}))
}

mid_save=0 checked=0
for ((i = 1; i <= kills; i++)); do
  expected=$(newest_step)
  "$bin" "${args[@]}" --resume > "$dir/kill_$i.log" 2>&1 &
  pid=$!
  # Killed once it has resumed and saved 0 to 4 more checkpoints: every other restart as soon as its next save
  # has begun (its temp file exists), the others 0 to 19 ms later, inside a step (a few ms) or a save (about
  # 10 ms). So a few steps at most per restart, whatever the machine's speed.
  more=$((RANDOM % 5))
  for ((wait_ms = 0; wait_ms < 60000; wait_ms += 5)); do
    kill -0 "$pid" 2>/dev/null || break
    if ((expected == 0)) || grep -qs "resumed at step" "$dir/kill_$i.log"; then
      (($(newest_step) >= expected + more)) && break
    fi
    sleep 0.005
  done
  if ((i % 2 == 1)); then
    for ((wait_ms = 0; wait_ms < 60000; wait_ms += 1)); do
      compgen -G "$dir/run/checkpoints/*.tmp.$pid" > /dev/null || ! kill -0 "$pid" 2>/dev/null && break
      sleep 0.001
    done
  else
    sleep "0.0$(printf '%02d' $((RANDOM % 20)))"
  fi
  kill -9 "$pid" 2>/dev/null || true
  status=0
  wait "$pid" || status=$?
  if [[ $status -ne 137 ]]; then
    echo "restart $i ended by itself with status $status before it was killed:"; cat "$dir/kill_$i.log"; exit 1
  fi
  if grep -q "resumed at step" "$dir/kill_$i.log"; then
    grep -q "resumed at step $expected\$" "$dir/kill_$i.log" ||
      { echo "restart $i: newest checkpoint was step $expected, but:"; grep "resumed at" "$dir/kill_$i.log"; exit 1; }
    checked=$((checked + 1))
  elif ((expected > 0)) && grep -q "^step " "$dir/kill_$i.log"; then
    echo "restart $i trained without resuming from step $expected"; exit 1
  fi
  # A kill inside a save leaves its temp file, named after the killed process; the next complete save
  # removes it.
  if compgen -G "$dir/run/checkpoints/*.tmp.$pid" > /dev/null; then mid_save=$((mid_save + 1)); fi
done
echo "$kills kills: $mid_save inside a save, $checked restarts seen resuming from the newest checkpoint"
((mid_save >= kills / 4)) ||
  { echo "only $mid_save kills landed inside a save: the test did not test what it is about"; exit 1; }
((checked > kills / 2)) || { echo "only $checked of $kills restarts got as far as resuming"; exit 1; }
(($(newest_step) > 0)) || { echo "no checkpoint survived the kills"; exit 1; }

"$bin" "${args[@]}" --resume > "$dir/finish.log" 2>&1 || { cat "$dir/finish.log"; exit 1; }
cmp "$dir/reference/checkpoints/$final" "$dir/run/checkpoints/$final" ||
  { echo "the killed and resumed run ended with other bits than the run never killed"; exit 1; }
if [[ ${OFFLOAD:-0} == 1 && -n $(ls -A "$dir/offload") ]]; then
  echo "state files outlived their runs:"; ls -l "$dir/offload"; exit 1
fi
if compgen -G "$dir/run/checkpoints/*.tmp.*" > /dev/null; then
  echo "temp files of killed saves are left after a complete run:"; ls "$dir/run/checkpoints"; exit 1
fi
echo "bit-identical to the run never killed after $kills kills"
