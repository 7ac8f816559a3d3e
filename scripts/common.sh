# shellcheck shell=bash disable=SC2034
# Shared helpers for the scripts in scripts/: sourced, never run. Every script prints each command it
# runs (the "+ " lines) so a log shows exactly what happened.

# The repository root, whatever directory the caller ran the script from.
MEMTRAIN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

mt_step() { printf '\n==> %s\n' "$*"; }
mt_run() {
  printf '+ %s\n' "$*"
  "$@"
}
mt_die() {
  printf 'error: %s\n' "$*" >&2
  exit 1
}
