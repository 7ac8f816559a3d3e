#!/usr/bin/env bash
# Issue 29's goal, measured: gpt2-124M, windows of 256, micro-batch 4, 3 steps with the evaluation and the
# end-of-run checkpoint save, trained for real by memtrain_train_gpt, once per configuration:
#   fp32 AdamW                          --optimizer adamw --precision fp32
#   recipe, f32 master weights          --precision bf16 --optimizer adamw8bit --galore-rank 128 --layerwise
#                                       --checkpoint full
#   recipe                              the same with --param-dtype bf16 (no f32 master)
# One markdown row per configuration from its run summary: the allocator's bytes by category at the moment of the
# total live peak, the live peak and its share of fp32 AdamW's, the peak reserved bytes over the live peak, and the
# process's peak RSS (VmHWM) above the live peak and as a share of fp32 AdamW's.
#
# Usage: bench/recipe_table.sh [label|flags ...]   (default: the three above)
# Environment: MEMTRAIN_BUILD_DIR (default build), SKIP_BUILD=1 to use the built example, WORK (a scratch dir).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
cd "$MEMTRAIN_ROOT"

# shellcheck source=bench/train_gpt_common.sh
source bench/train_gpt_common.sh

recipe="--precision bf16 --optimizer adamw8bit --galore-rank 128 --layerwise --checkpoint full"
if (($# > 0)); then
  configs=("$@")
else
  configs=("fp32 AdamW|--optimizer adamw --precision fp32"
           "recipe, f32 masters|$recipe"
           "recipe|$recipe --param-dtype bf16")
fi

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) threads; gpt2-124M, T=256, micro-batch 4, 3 steps + eval + save"
echo
echo "| run | parameters | compute_weights | gradients | optimizer_state | activations | workspace | live peak | of fp32 AdamW | reserved / live | peak RSS | RSS - live | RSS of fp32 AdamW's |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
base_peak="" base_rss=""
i=0
for config in "${configs[@]}"; do
  label=${config%%|*} flags=${config#*|}
  i=$((i + 1))
  # shellcheck disable=SC2206  # the flags are split on purpose
  args=(--model gpt2-124M --seq-len 256 --micro-batch 4 --steps 3 $flags --sample-tokens 0 --data-dir "$work/data")
  "$bin" "${args[@]}" --out-dir "$work/run$i" --summary-json "$work/run$i.json" > "$work/run$i.log" 2>&1 ||
    { cat "$work/run$i.log"; mt_die "run of '$config' failed"; }
  peak=$(json "$work/run$i.json" peak_bytes_total) rss=$(json "$work/run$i.json" peak_rss_bytes)
  reserved=$(json "$work/run$i.json" reserved_peak_bytes)
  [[ -n $base_peak ]] || { base_peak=$peak base_rss=$rss; }
  "$py" - "$work/run$i.json" "$label" "$peak" "$reserved" "$rss" "$base_peak" "$base_rss" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
label, peak, reserved, rss, base_peak, base_rss = sys.argv[2], *map(int, sys.argv[3:])
mib = lambda b: f"{b / 2**20:.1f} MiB"
cat = s["peak_bytes_by_category"]
cols = [mib(cat.get(k, 0)) for k in
        ("parameters", "compute_weights", "gradients", "optimizer_state", "activations", "workspace")]
print(f"| {label} | " + " | ".join(cols) + f" | {mib(peak)} | {100 * peak / base_peak:.1f}% | "
      f"{reserved / peak:.3f}x | {mib(rss)} | {mib(rss - peak)} | {100 * rss / base_rss:.1f}% |")
EOF
done
