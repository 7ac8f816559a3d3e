# Shared set-up of the benchmarks that drive the train_gpt example (predict_memory_table.sh, fit_table.sh):
# builds memtrain_train_gpt unless SKIP_BUILD=1 and sets `bin` to it, `work` to a scratch directory (WORK, default
# a mktemp) and `py` to the Python that reads the JSON files (PYTHON, default python3); defines json FILE KEY...
# (a value of a JSON file, by its keys). Sourced from the repository root after scripts/common.sh.
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
