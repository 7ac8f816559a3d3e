#!/usr/bin/env bash
# A rank killed mid-collective must end the run, not hang it: runs DistKilledRank (test_killed_rank.cpp) at 2
# ranks and passes when the launcher exits with a failure within the time limit and its output names rank 1.
# Usage: killed_rank.sh <seconds> <mpirun and its arguments...> <memtrain_dist_tests>
set -uo pipefail
limit=$1
shift
start=$SECONDS
output=$(MEMTRAIN_DIST_KILL_TEST=1 timeout --kill-after=10 "$limit" "$@" --gtest_filter='DistKilledRank.*' 2>&1)
status=$?
elapsed=$((SECONDS - start))
echo "$output"
echo "killed_rank.sh: the run exited with status $status after $elapsed s"
if ((status == 0)); then
  echo "FAIL: the run succeeded although rank 1 was killed"
  exit 1
fi
# By elapsed time, not status: mpirun itself exits 137 (128 + SIGKILL) when a rank was killed.
if ((status == 124 || elapsed >= limit)); then
  echo "FAIL: the run did not end within $limit s"
  exit 1
fi
# mpirun's "process rank 1 with PID ... exited on signal 9", or rank 0's PeerTimeout "... for rank 1 (dead or stuck?)".
if ! grep -Eq 'process rank 1 |for rank 1 \(dead' <<<"$output"; then
  echo "FAIL: the output does not name rank 1"
  exit 1
fi
echo "PASS: the run failed within $limit s and named rank 1"
