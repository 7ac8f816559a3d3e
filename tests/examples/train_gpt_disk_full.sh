#!/usr/bin/env bash
# A checkpoint save that runs out of room: train_gpt under a file-size limit (ulimit -f, which fails a write
# past it with EFBIG as a full disk fails it with ENOSPC) stops with an error naming the checkpoint file and the
# bytes it needs, leaves no temp file, and keeps the checkpoints before it whole: --resume continues from the
# newest of them, to the same bits as the same runs without the failed attempt between them.
#   train_gpt_disk_full.sh <memtrain_train_gpt binary> <corpus.txt> <scratch dir>
set -euo pipefail
bin=$1 corpus=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir"
args=(--model tiny --vocab-size 300 --data "$corpus" --data-dir "$dir/data" --micro-batch 4 --sample-tokens 0
      --checkpoint-interval 1 --out-dir "$dir/run")
# The reference: 3 steps, then resumed to 6 (the lr schedule follows --steps, so the runs below do the same).
"$bin" "${args[@]}" --steps 3 > "$dir/reference.log" 2>&1 &&
  "$bin" "${args[@]}" --steps 6 --resume >> "$dir/reference.log" 2>&1 || { cat "$dir/reference.log"; exit 1; }
mv "$dir/run" "$dir/reference"
"$bin" "${args[@]}" --steps 3 > "$dir/first.log" 2>&1 || { cat "$dir/first.log"; exit 1; }
ckpt=$dir/run/checkpoints
size=$(stat -c %s "$ckpt/ckpt_00000003.safetensors")
cp "$ckpt/ckpt_00000003.safetensors" "$dir/step3.copy"

# A limit of half a checkpoint (ulimit -f counts KiB): the step-4 save cannot be written.
status=0
(ulimit -f $((size / 2048)) && exec "$bin" "${args[@]}" --steps 6 --resume) > "$dir/full.log" 2>&1 || status=$?
((status == 1)) || { echo "the run under the limit ended with status $status, expected 1:"; cat "$dir/full.log"; exit 1; }
grep -q "ckpt_00000004.safetensors': needs [0-9]* bytes on disk" "$dir/full.log" && grep -q "bytes free on" "$dir/full.log" ||
  { echo "the error does not name the file and the bytes it needs:"; tail -n 3 "$dir/full.log"; exit 1; }
if compgen -G "$ckpt/*.tmp.*" > /dev/null || [[ -e $ckpt/ckpt_00000004.safetensors ]]; then
  echo "the failed save left a file behind:"; ls "$ckpt"; exit 1
fi
cmp "$ckpt/ckpt_00000003.safetensors" "$dir/step3.copy" || { echo "the step-3 checkpoint changed"; exit 1; }

"$bin" "${args[@]}" --steps 6 --resume > "$dir/resumed.log" 2>&1 || { cat "$dir/resumed.log"; exit 1; }
grep -q "resumed at step 3$" "$dir/resumed.log" || { echo "did not resume from step 3"; cat "$dir/resumed.log"; exit 1; }
cmp "$dir/reference/checkpoints/ckpt_00000006.safetensors" "$ckpt/ckpt_00000006.safetensors" ||
  { echo "the resumed run ended with other bits than the runs without the failed attempt"; exit 1; }
echo "the save past the limit failed cleanly, naming $(grep -o 'needs [0-9]* bytes' "$dir/full.log"); resumed bit-identically"
