#!/usr/bin/env bash
# Runs every case of tests/bad_inputs/cases.tsv against a ulysses-train binary and prints
# PASS/FAIL per case; exits 1 if any case fails (or the corpus was modified), 0 otherwise.
#
# Usage: tests/bad_inputs/run_cases.sh [path/to/ulysses-train] [name-regex]
#   default binary: build/apps/ulysses-train of this repository
#   name-regex: run only the cases whose name matches (grep -E)
#
# Each case runs as `timeout 60 bash -c COMMAND` from tests/bad_inputs/, with stdin from
# /dev/null, and with TRAIN, MPIRUN ("mpirun --bind-to none -np"), DIR (this folder,
# absolute) and TMP (a fresh empty folder, removed afterwards) exported. OMP_NUM_THREADS
# defaults to 1 (the cases are tiny; this keeps them fast on a busy machine). A case passes
# when the exit status equals expected_exit and stdout+stderr contain message_fragment
# (case-sensitive, literal).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BINARY=${1:-$HERE/../../build/apps/ulysses-train}
FILTER=${2:-}
if [[ ! -x $BINARY ]]; then
  echo "run_cases.sh: no ulysses-train binary at $BINARY" >&2
  exit 2
fi
command -v mpirun >/dev/null || echo "run_cases.sh: warning: mpirun not found; the \$MPIRUN cases will fail" >&2

export TRAIN DIR MPIRUN TMP
TRAIN=$(realpath "$BINARY")
DIR=$HERE
MPIRUN="mpirun --bind-to none -np"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# The corpus must never be written to: fingerprint it before and after.
fingerprint() {
  (cd "$HERE" && find . -path ./.git -prune -o -print0 | LC_ALL=C sort -z |
    xargs -0 stat -c '%n %s %Y %F' | md5sum)
}
BEFORE=$(fingerprint)

cd "$HERE" || exit 2
pass=0
fail=0
failed=()
line_number=0
while IFS= read -r line || [[ -n $line ]]; do
  line_number=$((line_number + 1))
  [[ -z ${line//[[:space:]]/} || $line == \#* ]] && continue
  IFS=$'\t' read -r -a fields <<<"$line"
  if [[ ${#fields[@]} -ne 4 || ! ${fields[1]} =~ ^[0-9]+$ ]]; then
    echo "FAIL  cases.tsv:$line_number: malformed line (need name, exit code, fragment, command separated by tabs)"
    fail=$((fail + 1))
    failed+=("cases.tsv:$line_number")
    continue
  fi
  name=${fields[0]} expected=${fields[1]} fragment=${fields[2]} command=${fields[3]}
  if [[ -n $FILTER ]] && ! grep -qE -- "$FILTER" <<<"$name"; then continue; fi

  TMP=$(mktemp -d "${TMPDIR:-/tmp}/bad_inputs.XXXXXX")
  start=$(date +%s.%N)
  output=$(timeout -k 10 60 bash -c "$command" </dev/null 2>&1)
  actual=$?
  seconds=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
  rm -rf "$TMP"

  problems=()
  [[ $actual -eq $expected ]] || problems+=("exit $actual, expected $expected")
  [[ $output == *"$fragment"* ]] || problems+=("output lacks '$fragment'")
  if [[ ${#problems[@]} -eq 0 ]]; then
    printf 'PASS  %-52s exit %d  %5ss\n' "$name" "$actual" "$seconds"
    pass=$((pass + 1))
  else
    printf 'FAIL  %-52s exit %d  %5ss  (%s)\n' "$name" "$actual" "$seconds" "$(IFS=';'; echo "${problems[*]}")"
    printf '      command: %s\n' "$command"
    # The last lines of the output, without MPI's boilerplate, colour codes and NUL bytes.
    tail -n 40 <<<"$output" | sed -e 's/\x1b\[[0-9;]*m//g' | tr -d '\000' |
      grep -v -e '^-\{20,\}$' -e 'MPI_ABORT' -e 'orte_base_help_aggregate' -e 'help-mpi-api' |
      tail -n 6 | cut -c1-400 | sed 's/^/      | /'
    fail=$((fail + 1))
    failed+=("$name")
  fi
done <"$HERE/cases.tsv"

AFTER=$(fingerprint)
if [[ $BEFORE != "$AFTER" ]]; then
  echo "FAIL  the corpus under $HERE changed while the cases ran (a case wrote outside \$TMP)"
  fail=$((fail + 1))
  failed+=("corpus-unchanged")
fi

echo
echo "$pass passed, $fail failed"
if [[ $fail -gt 0 ]]; then
  printf 'failed: %s\n' "${failed[*]}"
  exit 1
fi
exit 0
