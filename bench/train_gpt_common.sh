# Shared set-up of the benchmarks that drive the train_gpt example (predict_memory_table.sh, fit_table.sh,
# pipeline_table.sh, tensor_parallel_table.sh, ...): builds memtrain_train_gpt unless SKIP_BUILD=1 and sets `bin`
# to it, `work` to a scratch directory (WORK, default a mktemp) and `py` to the Python that reads the JSON files
# (PYTHON, default python3); defines json FILE KEY... (a value of a JSON file, by its keys) and run (one run of
# the example, below). Sourced from the repository root after scripts/common.sh.
build_dir=${MEMTRAIN_BUILD_DIR:-build}
[[ ${SKIP_BUILD:-0} == 1 ]] || MEMTRAIN_BUILD_DIR=$build_dir bash scripts/build.sh memtrain_train_gpt
bin=$build_dir/examples/memtrain_train_gpt
[[ -x $bin ]] || mt_die "$bin is missing (build it, or unset SKIP_BUILD)"
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
py=${PYTHON:-python3}

json() { "$py" -c 'import json, sys
j = json.load(open(sys.argv[1]))
for k in sys.argv[2:]: j = j[k]
print(j)' "$@"; }

# run NAME THREADS [LAUNCHER WORDS...] -- [FLAGS...]: the example with OMP_NUM_THREADS=THREADS under the launcher
# (e.g. mpirun -np 2; none: alone), with the caller's `common` flags and then FLAGS; its run files in $work/NAME/,
# its summary in $work/NAME.json, its output in $work/NAME.log, printed when it fails (which ends the script).
run() {
  local name=$1 threads=$2
  shift 2
  local launcher=()
  while [[ $1 != -- ]]; do launcher+=("$1"); shift; done
  shift
  OMP_NUM_THREADS=$threads "${launcher[@]}" "$bin" "${common[@]}" --out-dir "$work/$name" \
    --summary-json "$work/$name.json" "$@" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
}

# fit_flags_of LINE: train_gpt flags for a candidate line of a --fit report ("bf16, adamw8bit, params bf16,
# galore r192, ckpt budget:40MiB, micro-batch 4 x 2, layer-wise").
fit_flags_of() { "$py" -c 'import sys
parts = [p.strip() for p in sys.argv[1].split(",")]
out = ["--precision", parts[0], "--optimizer", parts[1]]
for p in parts[2:]:
    if p.startswith("params "): out += ["--param-dtype", p[7:]]
    elif p.startswith("galore r"): out += ["--galore-rank", p[8:]]
    elif p.startswith("ckpt "): out += ["--checkpoint", p[5:]]
    elif p.startswith("micro-batch "):
        mb, acc = p[12:].split(" x "); out += ["--micro-batch", mb, "--grad-accum", acc]
    elif p == "layer-wise": out += ["--layerwise"]
    elif p == "offload": raise SystemExit("an offloaded candidate needs its directory: " + sys.argv[1])
print(" ".join(out))' "$1"; }

# Median step seconds of a metrics file, the first step left out.
median_step() { "$py" -c 'import json, statistics, sys
t = [json.loads(l)["step_seconds"] for l in open(sys.argv[1])][1:]
print(statistics.median(t))' "$1"; }
