#!/usr/bin/env bash
# End-to-end GPT training step on this machine's CPU (AdamW, f32 master weights): memtrain beside two peers,
# libtorch 1.13 (C++) and PyTorch 2.x (Python, eager), in fp32 and in bf16, in one session. Prints the CPU
# (model, AVX-512 / bf16 flags) and thread count, then one table row per config and precision with each
# program's median step ms per round ("591 / 562" for 2 rounds) and the ratios of the medians over rounds.
#
# The programs (all run with the same --model --seq-len --batch --steps --warmup --threads):
#   memtrain  $MEMTRAIN_BUILD_DIR/bench/bench_gpt_e2e --precision fp32|bf16 (bf16 = amp::Autocast, with the LM
#             head's GEMMs in bf16 too: --head-gemm $MT_BF16_HEAD_GEMM, default compute, as the Trainer's
#             default)
#   libtorch  bench/torch_peer/gpt_step_torch.cpp, libtorch 1.13.1 from Debian (fp32 only: "-" in bf16 rows)
#   pytorch2  bench/torch_peer/gpt_step_pytorch.py --precision fp32|bf16 (bf16 = torch.autocast("cpu",
#             dtype=torch.bfloat16) around forward + loss), PyTorch 2.x defaults: eager, no torch.compile
# Rounds: ROUNDS times over every config and precision; within a round the programs alternate (memtrain,
# libtorch, pytorch2 for one config and precision, then the next), so a change of machine load hits all three.
#
# Environments: memtrain and pytorch2 run untuned (plain environment). The libtorch peer runs tuned, and only
# it: jemalloc preloaded with page decay off (MALLOC_CONF dirty/muzzy_decay_ms:-1), OMP_WAIT_POLICY=PASSIVE,
# and OPENBLAS_CORETYPE=SkylakeX where the CPU has AVX-512 (on a CPU without it OpenBLAS's SkylakeX kernels
# die with SIGILL, so the variable is left unset there and OpenBLAS picks its kernels itself). Wall-clock time
# is what the table compares; each program also prints its CPU time per step (listed under the table), which
# shows how much a busy machine inflated the wall time.
#
# Getting the peers (each missing one is skipped with a warning, its column "-"):
#   libtorch 1.13: as root, apt-get install libtorch-dev libjemalloc2 (Debian 12; CMake finds it as Torch).
#     The peer is built in $MEMTRAIN_BUILD_DIR when that directory defines gpt_step_torch (it does when it was
#     configured after libtorch-dev was installed), otherwise on its own in $TORCH_PEER_BUILD_DIR
#     (default build-torch-peer) from bench/torch_peer/CMakeLists.txt, leaving the main build directory alone.
#   PyTorch 2.x: bash scripts/setup_torch2_venv.sh (a venv at $TORCH2_VENV, default /work/torch2-venv).
#
# Usage: bench/run_gpt_side_by_side.sh [configs...]   config = model:seq_len:batch
#   default configs: small:256:8 gpt2-124M:256:4
#   full comparison: ROUNDS=2 OUT_MD=docs/results/gpt_cpu_peers.md bench/run_gpt_side_by_side.sh
#   quick check:     STEPS=2 WARMUP=1 ROUNDS=1 SKIP_BUILD=1 bench/run_gpt_side_by_side.sh small:64:2
# Environment: MEMTRAIN_BUILD_DIR (default build), STEPS (10), WARMUP (3), THREADS (nproc), ROUNDS (2),
#   PRECISIONS ("fp32 bf16"), SKIP_BUILD=1 to use existing binaries, TORCH_PEER_BUILD_DIR (build-torch-peer),
#   PEER_BIN (the libtorch peer's binary, found by itself otherwise), TORCH2_VENV (/work/torch2-venv),
#   TORCH2_PYTHON (default $TORCH2_VENV/bin/python), OUT_MD (also write the table, as markdown, to this file).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
cd "$MEMTRAIN_ROOT"
warn() { printf 'warning: %s\n' "$*" >&2; }

build_dir=${MEMTRAIN_BUILD_DIR:-build}
peer_build_dir=${TORCH_PEER_BUILD_DIR:-build-torch-peer}
steps=${STEPS:-10}
warmup=${WARMUP:-3}
threads=${THREADS:-$(nproc)}
rounds=${ROUNDS:-2}
read -r -a precisions <<<"${PRECISIONS:-fp32 bf16}"
torch2_python=${TORCH2_PYTHON:-${TORCH2_VENV:-/work/torch2-venv}/bin/python}
pt2_script=bench/torch_peer/gpt_step_pytorch.py
configs=("$@")
((${#configs[@]} > 0)) || configs=(small:256:8 gpt2-124M:256:4)
[[ $rounds =~ ^[1-9][0-9]*$ ]] || mt_die "ROUNDS must be a positive integer (got '$rounds')"
for p in "${precisions[@]}"; do [[ $p == fp32 || $p == bf16 ]] || mt_die "PRECISIONS: fp32 and/or bf16 (got '$p')"; done

torch_cmake_found() {
  local d
  for d in /usr/lib/*-linux-gnu/cmake/Torch /usr/share/cmake/Torch /usr/local/share/cmake/Torch; do
    [[ -e $d/TorchConfig.cmake ]] && return 0
  done
  [[ -n ${Torch_DIR:-} && -e ${Torch_DIR}/TorchConfig.cmake ]]
}

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  MEMTRAIN_BUILD_DIR=$build_dir bash scripts/build.sh bench_gpt_e2e
  # bench/CMakeLists.txt defines the peer's target only when find_package(Torch) succeeded.
  if grep -q 'gpt_step_torch' "$build_dir/build.ninja"; then
    mt_run cmake --build "$build_dir" --parallel "${MEMTRAIN_JOBS:-2}" --target gpt_step_torch
  elif torch_cmake_found; then
    mt_run cmake -S bench/torch_peer -B "$peer_build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release
    mt_run cmake --build "$peer_build_dir" --parallel "${MEMTRAIN_JOBS:-2}"
  else
    warn "libtorch not found by CMake (as root: apt-get install libtorch-dev): no libtorch column"
  fi
fi
mt_bin=$build_dir/bench/bench_gpt_e2e
[[ -x $mt_bin ]] || mt_die "$mt_bin is missing (build it, or unset SKIP_BUILD)"
peer_bin=${PEER_BIN:-}
if [[ -z $peer_bin ]]; then
  for f in "$build_dir/bench/torch_peer/gpt_step_torch" "$peer_build_dir/gpt_step_torch"; do
    [[ -x $f ]] && { peer_bin=$f; break; }
  done
fi
have_lt=0
if [[ -n $peer_bin && -x $peer_bin ]]; then
  have_lt=1
else
  warn "no libtorch peer binary (apt-get install libtorch-dev, then run without SKIP_BUILD): libtorch column '-'"
fi
have_pt2=0
pt2_version=-
if [[ -x $torch2_python ]] &&
  pt2_version=$("$torch2_python" -c 'import torch; print(torch.__version__)' 2>/dev/null) &&
  [[ ${pt2_version%%.*} -ge 2 ]]; then
  have_pt2=1
else
  pt2_version=-
  warn "$torch2_python has no torch >= 2 (bash scripts/setup_torch2_venv.sh makes one): pytorch2 column '-'"
fi

# The libtorch peer's environment.
peer_env=(OMP_WAIT_POLICY=PASSIVE)
find_jemalloc() {
  local f
  for f in /usr/lib/*-linux-gnu/libjemalloc.so.2 /usr/lib/libjemalloc.so.2; do
    [[ -e $f ]] && { echo "$f"; return; }
  done
}
jemalloc=$(find_jemalloc)
if [[ -z $jemalloc ]] && ((have_lt)) && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
  mt_run apt-get install -y -q libjemalloc2 >/dev/null && jemalloc=$(find_jemalloc)
fi
if [[ -n $jemalloc ]]; then
  peer_env+=("LD_PRELOAD=$jemalloc" "MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1")
else
  warn "libjemalloc2 not found: the libtorch peer runs with glibc malloc"
fi
if grep -qw avx512f /proc/cpuinfo; then
  peer_env+=(OPENBLAS_CORETYPE=SkylakeX)
else
  warn "no AVX-512 on this CPU: OPENBLAS_CORETYPE=SkylakeX would SIGILL, so it is left unset for the peer"
fi

# The machine, printed first and kept for the markdown file.
cpu_model=$(sed -n 's/^model name[[:space:]]*: *//p' /proc/cpuinfo | head -n 1)
cpu_id=$(awk -F': *' '/^cpu family/ { f = $2 } /^model[[:space:]]*:/ { m = $2 } /^stepping/ { s = $2 }
  /^$/ { exit } END { if (f != "") printf "family %s model %s stepping %s", f, m, s }' /proc/cpuinfo)
cpu_flags=""
for f in avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_tile; do
  if grep -qw "$f" /proc/cpuinfo; then cpu_flags+=" $f:yes"; else cpu_flags+=" $f:no"; fi
done
cpu_flags=${cpu_flags# }
lt_version=-
((have_lt)) && lt_version=$(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null || echo "(version unknown)")
lt_where="" pt2_where=""
((have_lt)) && lt_where=" ($peer_bin)"
((have_pt2)) && pt2_where=" ($torch2_python)"
header=(
  "CPU: ${cpu_model:-unknown}${cpu_id:+, $cpu_id} ($(nproc) logical CPUs online)"
  "CPU flags: $cpu_flags"
  "threads: $threads per program; $steps timed steps after $warmup warm-up; $rounds round(s), programs alternating"
  "programs: memtrain $(git rev-parse --short HEAD 2>/dev/null || echo ?) ($mt_bin); libtorch $lt_version$lt_where; pytorch $pt2_version$pt2_where"
  "started: $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
)
mt_step "side by side"
printf '%s\n' "${header[@]}"

# Field `key` of a RESULT line.
field() { sed -n "s/.* $2=\([^ ]*\).*/\1/p" <<<"$1"; }

declare -A res=()  # res[impl|config|precision|round] = RESULT line ("" when the run failed)
runs=()            # "impl|config|precision|round|load" in the order run
run_one() {        # run_one IMPL CONFIG PRECISION ROUND
  local impl=$1 cfg=$2 prec=$3 r=$4 model seq batch out load
  IFS=: read -r model seq batch <<<"$cfg"
  local args=(--model "$model" --seq-len "$seq" --batch "$batch" --steps "$steps" --warmup "$warmup"
    --threads "$threads")
  local cmd
  case $impl in
    memtrain)
      cmd=("$mt_bin" "${args[@]}" --precision "$prec")
      if [[ $prec == bf16 ]]; then cmd+=(--head-gemm "${MT_BF16_HEAD_GEMM:-compute}"); fi
      ;;
    libtorch) cmd=(env "${peer_env[@]}" "$peer_bin" "${args[@]}") ;;
    pytorch2) cmd=("$torch2_python" "$pt2_script" "${args[@]}" --precision "$prec") ;;
  esac
  load=$(cut -d' ' -f1 /proc/loadavg)
  mt_step "round $r/$rounds: $impl $model T=$seq B=$batch $prec (load: $(cut -d' ' -f1-3 /proc/loadavg))"
  if out=$("${cmd[@]}" 2>&1 | tee -a /dev/stderr); then
    res[$impl|$cfg|$prec|$r]=$(grep '^RESULT' <<<"$out" | tail -n 1 || true)
  else
    warn "$impl $cfg $prec round $r failed (exit status above): its cell shows 'x'"
    res[$impl|$cfg|$prec|$r]=""
  fi
  runs+=("$impl|$cfg|$prec|$r|$load")
}

for ((r = 1; r <= rounds; ++r)); do
  for cfg in "${configs[@]}"; do
    for prec in "${precisions[@]}"; do
      run_one memtrain "$cfg" "$prec" "$r"
      ((have_lt)) && [[ $prec == fp32 ]] && run_one libtorch "$cfg" "$prec" "$r"
      ((have_pt2)) && run_one pytorch2 "$cfg" "$prec" "$r"
    done
  done
done

# Formatting: step ms to 3 significant-ish digits, medians, ratios.
fmt_ms() { awk -v x="$1" 'BEGIN { printf (x >= 100 ? "%.0f" : "%.1f"), x }'; }
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) exit; print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
mib() { [[ -n $1 ]] && awk -v x="$1" 'BEGIN { printf "%.0f", x }' || echo -; }
ratio() { [[ -n $1 && -n $2 ]] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }' || echo -; }
available() {  # available IMPL PRECISION: whether the program ran in that precision at all
  case $1 in
    memtrain) return 0 ;;
    libtorch) ((have_lt)) && [[ $2 == fp32 ]] ;;
    pytorch2) ((have_pt2)) ;;
  esac
}
# cell IMPL CONFIG PRECISION KEY: the per-round values ("591 / 562"), or "-" where the program does not run
cell() {
  local impl=$1 cfg=$2 prec=$3 key=$4 r line v parts=()
  available "$impl" "$prec" || { echo -; return; }
  for ((r = 1; r <= rounds; ++r)); do
    line=${res[$impl|$cfg|$prec|$r]:-}
    v=$(field "$line" "$key")
    if [[ -z $v ]]; then parts+=(x); elif [[ $key == step_ms ]]; then parts+=("$(fmt_ms "$v")"); else parts+=("$v"); fi
  done
  local joined="" part
  for part in "${parts[@]}"; do joined+="${joined:+ / }$part"; done
  echo "$joined"
}
# med IMPL CONFIG PRECISION KEY: median over the rounds that succeeded (empty when none did)
med() {
  local r line v vals=()
  available "$1" "$3" || return 0
  for ((r = 1; r <= rounds; ++r)); do
    line=${res[$1|$2|$3|$r]:-}
    v=$(field "$line" "$4")
    [[ -n $v ]] && vals+=("$v")
  done
  ((${#vals[@]} > 0)) && median "${vals[@]}"
  return 0
}

cols=(config precision "memtrain ms" "libtorch 1.13 ms" "pytorch2 ms" "mt/libtorch" "mt/pytorch2" "mt bf16/fp32"
  "pt2 bf16/fp32" "peak RSS MiB mt / lt / pt2")
table=()
for cfg in "${configs[@]}"; do
  for prec in "${precisions[@]}"; do
    m=$(med memtrain "$cfg" "$prec" step_ms)
    l=$(med libtorch "$cfg" "$prec" step_ms)
    p=$(med pytorch2 "$cfg" "$prec" step_ms)
    if [[ $prec == bf16 ]]; then
      m_bf=$(ratio "$m" "$(med memtrain "$cfg" fp32 step_ms)")
      p_bf=-
      ((have_pt2)) && p_bf=$(ratio "$p" "$(med pytorch2 "$cfg" fp32 step_ms)")
    else
      m_bf=- p_bf=-
    fi
    rss="$(mib "$(med memtrain "$cfg" "$prec" rss_mib)") / $(mib "$(med libtorch "$cfg" "$prec" rss_mib)")"
    rss+=" / $(mib "$(med pytorch2 "$cfg" "$prec" rss_mib)")"
    table+=("$cfg|$prec|$(cell memtrain "$cfg" "$prec" step_ms)|$(cell libtorch "$cfg" "$prec" step_ms)|$(cell pytorch2 "$cfg" "$prec" step_ms)|$(ratio "$m" "$l")|$(ratio "$m" "$p")|$m_bf|$p_bf|$rss")
  done
done
notes=(
  "Cells: median step ms of each round (round 1 / round 2 / ...); x = that run failed; - = not run (libtorch: fp32 only)."
  "Ratios: of the medians over rounds; below 1 means memtrain is faster (mt bf16/fp32, pt2 bf16/fp32: below 1 means bf16 is faster)."
  "Peak RSS: median over rounds of each process's peak RSS (memtrain, libtorch: VmHWM; pytorch2: getrusage ru_maxrss, which includes the resident pages of the torch libraries: see 'after import torch' below)."
)

echo
printf '%s\n' "${header[@]}"
echo
fmt='%-18s %-5s | %-17s %-17s %-17s | %11s %11s %12s %13s | %s\n'
# shellcheck disable=SC2059
printf "$fmt" "${cols[@]}"
for row in "${table[@]}"; do
  IFS='|' read -r -a c <<<"$row"
  # shellcheck disable=SC2059
  printf "$fmt" "${c[@]}"
done
printf '%s\n' "${notes[@]}"
echo
echo "Runs (in order): impl config precision round: step ms, cpu ms per step (all threads), peak RSS MiB, load at start"
run_lines=()
for run in "${runs[@]}"; do
  IFS='|' read -r impl cfg prec r load <<<"$run"
  line=${res[$impl|$cfg|$prec|$r]:-}
  if [[ -n $line ]]; then
    base=$(field "$line" base_rss_mib)
    run_lines+=("$impl $cfg $prec round $r: $(field "$line" step_ms) ms, cpu $(field "$line" cpu_ms) ms, RSS $(field "$line" rss_mib) MiB${base:+ ($base MiB after import torch)}, load $load")
  else
    run_lines+=("$impl $cfg $prec round $r: failed, load $load")
  fi
done
printf '  %s\n' "${run_lines[@]}"

if [[ -n ${OUT_MD:-} ]]; then
  {
    echo "# GPT training step on the CPU: memtrain, libtorch 1.13 and PyTorch 2.x, fp32 and bf16"
    echo
    printf -- '- %s\n' "${header[@]}"
    echo "- command: \`ROUNDS=$rounds STEPS=$steps WARMUP=$warmup THREADS=$threads bench/run_gpt_side_by_side.sh ${configs[*]}\`"
    echo
    printf '| %s ' "${cols[@]}"
    echo "|"
    printf '|---%.0s' "${cols[@]}"
    echo "|"
    for row in "${table[@]}"; do
      echo "| ${row//|/ | } |"
    done
    echo
    printf '%s\n' "${notes[@]}"
    echo
    echo "Runs, in order (step ms, CPU ms per step over all threads, peak RSS, load average at the start):"
    echo
    printf -- '- %s\n' "${run_lines[@]}"
  } >"$OUT_MD"
  echo "markdown table written to $OUT_MD"
fi
