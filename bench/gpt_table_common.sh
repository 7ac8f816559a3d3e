# Shared set-up of the GPT side-by-side tables (run_checkpoint_table.sh, run_precision_table.sh): builds
# bench_gpt_e2e unless SKIP_BUILD=1, finds the Python torch peer, and the environment the peer runs in.
# Sourced from the repository root after scripts/common.sh; sets build_dir, steps, warmup, threads, python,
# mt_bin, peer, have_peer, peer_env and defines warn, field (a key of a RESULT line) and load1.
warn() { printf 'warning: %s\n' "$*" >&2; }

build_dir=${MEMTRAIN_BUILD_DIR:-build}
steps=${STEPS:-10}
warmup=${WARMUP:-3}
threads=${THREADS:-$(nproc)}
python=${PYTHON:-/usr/bin/python3}

[[ ${SKIP_BUILD:-0} == 1 ]] || MEMTRAIN_BUILD_DIR=$build_dir bash scripts/build.sh bench_gpt_e2e
mt_bin=$build_dir/bench/bench_gpt_e2e
peer=bench/torch_peer/gpt_ckpt_torch.py
[[ -x $mt_bin ]] || mt_die "$mt_bin is missing (build it, or unset SKIP_BUILD)"
have_peer=1
"$python" -c 'import torch' 2>/dev/null || { warn "$python cannot import torch: memtrain rows only"; have_peer=0; }

peer_env=(OMP_WAIT_POLICY=PASSIVE)
for f in /usr/lib/*-linux-gnu/libjemalloc.so.2 /usr/lib/libjemalloc.so.2; do
  [[ -e $f ]] && { peer_env+=("LD_PRELOAD=$f" "MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1"); break; }
done

# Field `key` of a RESULT line.
field() { sed -n "s/.* $2=\([^ ]*\).*/\1/p" <<<"$1"; }
load1() { cut -d' ' -f1 /proc/loadavg; }
