#!/usr/bin/env bash
# What the tensor-core attention kernels ask of an SM, from the compiler alone (no GPU
# needed): ptxas' registers per thread and spills for each mma kernel of
# kernels/cuda/cuda_attention.cu, built as the project builds it, for sm_80 and sm_90, and the
# 128-thread blocks per SM those registers allow (65536 per SM, allocated per warp in steps of
# 256, i.e. 8 per thread). docs/cuda.md, "Attention on tensor cores", has the shared memory
# that bounds them too.
# Any kernel of the file that spills is named below the table. With --check it exits 1 when a
# tensor-core kernel spills (a ctest runs it where nvcc is: a change that pushes them past
# their register budget shows there).
# Usage: scripts/cuda-resources.sh [--nvcc PATH] [--check]
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
check=0
while [ $# -gt 0 ]; do
  case "$1" in
    --nvcc) nvcc=$2; shift 2 ;;
    --check) check=1; shift ;;
    *) echo "cuda-resources: unknown argument '$1' (--nvcc PATH, --check)" >&2; exit 2 ;;
  esac
done
[ -x "$nvcc" ] || { echo "cuda-resources: no nvcc (looked for '$nvcc'; --nvcc PATH)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for arch in 80 90; do
  "$nvcc" -O3 -DNDEBUG -std=c++17 -I. --generate-code=arch=compute_$arch,code=sm_$arch \
    -Xptxas -v -c kernels/cuda/cuda_attention.cu -o "$work/attention.o" 2>"$work/ptxas.txt"
  echo "sm_$arch (ptxas -v, -O3):"
  /usr/bin/python3 - "$work/ptxas.txt" "$check" <<'PY' || status=1
import re, subprocess, sys
rows, kernel, spilling = [], None, []
for line in open(sys.argv[1]):
    entry = re.search(r"Compiling entry function '(\w+)'", line)
    if entry:
        kernel = entry.group(1)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if spills and kernel:
        stores, loads = spills.groups()
        if stores != "0" or loads != "0":
            name = subprocess.run(["c++filt", kernel], capture_output=True, text=True).stdout
            spilling.append((kernel, name.split("(")[0].split("::")[-1], f"{stores}/{loads}"))
    used = re.search(r"Used (\d+) registers", line)
    if used and kernel and "_mma_kernel" in kernel:
        name = subprocess.run(["c++filt", kernel], capture_output=True, text=True).stdout.strip()
        name = re.sub(r"^void ulysses::cuda_attention::", "", name).split("(")[0]
        registers = int(used.group(1))
        per_warp = ((registers + 7) // 8) * 8 * 32
        rows.append((name, registers, f"{stores}/{loads}", 65536 // (per_warp * 4)))
    if used:
        kernel = None
print("| kernel | registers | spill stores/loads (bytes) | blocks per SM by registers |")
print("| --- | --- | --- | --- |")
for name, registers, spill, blocks in sorted(rows):
    print(f"| {name} | {registers} | {spill} | {blocks} |")
for kernel, name, spill in spilling:
    print(f"spills: {name}, {spill} bytes stored/loaded")
if sys.argv[2] == "1" and any("_mma_kernel" in kernel for kernel, _, _ in spilling):
    sys.exit(1)
PY
done
exit "${status:-0}"
