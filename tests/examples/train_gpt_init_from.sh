#!/usr/bin/env bash
# train_gpt started from a Hugging Face GPT-2 checkpoint (tests/fixtures/hf_gpt2: n_positions 32, vocab 96) on
# llm.c token shards written here: --seq-len shorter than n_positions trains and evaluates on windows of that
# length, a longer one is refused naming the flag and both lengths; --eval-only over a val set of one window
# evaluates it once and says so, in the log and in --summary-json.
#   train_gpt_init_from.sh <memtrain_train_gpt binary> <hf_gpt2 fixture dir> <scratch dir>
set -euo pipefail
bin=$1 hf=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir"
# An llm.c shard: 256 int32 header (magic 20240520, version 1, token count), then uint16 tokens i*7 % 96.
shard() { perl -e 'my $n = $ARGV[0]; print pack("l<3", 20240520, 1, $n), "\0" x (253 * 4), pack("S<*", map { $_ * 7 % 96 } 0 .. $n - 1)' "$1" > "$2"; }
shard 400 "$dir/train.bin"
shard 33 "$dir/val.bin"  # one window of n_positions = 32 tokens (+1 target)
common=(--init-from "$hf/model.safetensors" --data "$dir/train.bin" --micro-batch 2 --sample-tokens 0)

"$bin" "${common[@]}" --out-dir "$dir/run" --steps 2 --seq-len 16 > "$dir/train.log" 2>&1 || { cat "$dir/train.log"; exit 1; }
# Every step trains on micro-batch 2 x 16 target tokens, not 2 x n_positions (32).
tokens=$(grep -o '"tokens":[0-9]*' "$dir/run/metrics.jsonl" | sort -u)
[[ $tokens == '"tokens":32' ]] || { echo "steps trained on $tokens, expected 32 tokens (2 windows of 16)"; cat "$dir/train.log"; exit 1; }

# The default eval_batches is 8; the val set holds one window.
"$bin" "${common[@]}" --val-data "$dir/val.bin" --out-dir "$dir/eval" --eval-only --summary-json "$dir/eval_summary.json" \
  > "$dir/eval.log" 2>&1 || { cat "$dir/eval.log"; exit 1; }
grep -q "over 1 windows in 1 batches (32 tokens)" "$dir/eval.log" || { echo "eval does not say it covered 1 window"; cat "$dir/eval.log"; exit 1; }
[[ -s $dir/eval_summary.json ]] || { echo "--eval-only wrote no --summary-json"; exit 1; }
for want in '"final_val_loss": [0-9]' '"val_tokens": 32,?$' '"val_samples": 1,?$' '"val_batches": 1,?$' '"steps": 0,?$'; do
  grep -Eq "$want" "$dir/eval_summary.json" || { echo "eval summary without $want:"; cat "$dir/eval_summary.json"; exit 1; }
done

# A window longer than the checkpoint's 32 positions is refused, naming the flag and both lengths.
if "$bin" "${common[@]}" --out-dir "$dir/long" --steps 2 --seq-len 40 > "$dir/long.log" 2>&1; then
  echo "--seq-len 40 > n_positions 32 was accepted"; cat "$dir/long.log"; exit 1
fi
grep -- "--seq-len 40" "$dir/long.log" | grep -q "32" || { echo "the refusal does not name --seq-len 40 and 32"; cat "$dir/long.log"; exit 1; }
echo "train_gpt init-from: ok"
