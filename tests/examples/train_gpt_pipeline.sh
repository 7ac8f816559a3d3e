#!/usr/bin/env bash
# The train_gpt example as a 2-stage pipeline under mpirun: it trains, the summary's `stages` table has both
# stages, and the final train and val losses equal, to the last digit written, those of the same run alone with
# --canonical-reduction.
#   train_gpt_pipeline.sh <memtrain_train_gpt binary> <corpus.txt> <scratch dir> <mpiexec, its flags, its -np flag>
set -euo pipefail
bin=$1 corpus=$2 dir=$3
shift 3
rm -rf "$dir" && mkdir -p "$dir"
base=(--model tiny --vocab-size 300 --data "$corpus" --data-dir "$dir/data" --micro-batch 4 --grad-accum 4
      --steps 4 --sample-tokens 0 --checkpoint-interval 0)
"$bin" "${base[@]}" --canonical-reduction --out-dir "$dir/alone" > "$dir/alone.log" 2>&1 ||
  { cat "$dir/alone.log"; exit 1; }
"$@" 2 "$bin" "${base[@]}" --pipeline-stages 2 --out-dir "$dir/pipeline" > "$dir/pipeline.log" 2>&1 ||
  { cat "$dir/pipeline.log"; exit 1; }
# The summary is indented JSON, one field a line: a field's text as written (%.17g, so equal text is equal bits).
field() { grep -o "\"$2\": [^,]*" "$1" | head -1 | sed 's/^[^:]*: //'; }
for f in final_train_loss final_val_loss; do
  alone=$(field "$dir/alone/summary.json" "$f") piped=$(field "$dir/pipeline/summary.json" "$f")
  [[ -n $alone && $alone == "$piped" ]] || { echo "$f: pipeline $piped, alone $alone"; cat "$dir/pipeline.log"; exit 1; }
done
[[ $(grep -c '"stage": ' "$dir/pipeline/summary.json") == 2 ]] ||
  { echo "the summary has no table of the 2 stages"; exit 1; }
grep -q "^rank 1 (data 0, stage 1): peak" "$dir/pipeline.log" || { echo "the report has no line for stage 1"; cat "$dir/pipeline.log"; exit 1; }
echo "pipeline at 2 stages: final losses equal the run alone's ($(field "$dir/alone/summary.json" final_train_loss))"
