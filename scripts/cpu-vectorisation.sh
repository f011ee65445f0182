#!/usr/bin/env bash
# Whether GCC vectorises every `#pragma omp simd` loop of the CPU kernels (kernels/cpu/*.cpp),
# from the compiler alone: each file is compiled as the build compiles it (its
# compile_commands.json) with -fopt-info-vec, and each such loop gets a row with the number of
# vectorised versions GCC reports for it (the loop, its vectorised remainder; twice that for a
# tile kernel, built for AVX2 and for the baseline) and the number of versions left scalar.
# Why: the same loop left scalar gives the same bits and passes every test, only slower; a
# small refactor once left the attention backward's softmax loop scalar, +30% on a step.
# With --check it exits 1 when a loop was not vectorised in some build (a ctest runs it), and
# 77 when the compiler is not GCC (other compilers report differently) or the build is not
# optimised (-O2 or -O3).
# Usage: scripts/cpu-vectorisation.sh [--build-dir DIR] [--check]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=build
check=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --check) check=1; shift ;;
    *) echo "cpu-vectorisation: unknown argument '$1' (--build-dir DIR, --check)" >&2; exit 2 ;;
  esac
done
commands="$build_dir/compile_commands.json"
[ -f "$commands" ] || {
  echo "cpu-vectorisation: no $commands (configure the build first; --build-dir DIR)" >&2
  exit 2
}
exec /usr/bin/python3 - "$commands" "$check" <<'PY'
import json, os, re, shlex, subprocess, sys, tempfile

commands_path, check = sys.argv[1], sys.argv[2] == "1"
entries = {os.path.realpath(e["file"]): e for e in json.load(open(commands_path))}


def simd_loops(path):
    """(pragma line, first line, last line) of each `#pragma omp simd` loop, 1-based."""
    text = open(path).read()
    line_starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
    line_of = lambda offset: sum(1 for start in line_starts if start <= offset)
    loops = []
    for pragma in re.finditer(r"#pragma omp simd[^\n]*\n", text):
        header = text.index("(", pragma.end())
        depth, i = 0, header
        while True:  # the for's parenthesis, then its body: a braced block or one statement
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
            if depth == 0:
                break
        while text[i].isspace():
            i += 1
        depth = 0
        while True:
            depth += {"{": 1, "(": 1, "}": -1, ")": -1}.get(text[i], 0)
            if depth == 0 and text[i] in ";}":
                break
            i += 1
        loops.append((line_of(pragma.start()), line_of(pragma.end()), line_of(i)))
    return loops


def gcc_reports(entry, path):
    """(line, vectorised?) of each loop report GCC gives for the file itself."""
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    version = subprocess.run([args[0], "--version"], capture_output=True, text=True).stdout
    if "Free Software Foundation" not in version:
        print(f"cpu-vectorisation: {args[0]} is not GCC; the check reads GCC's -fopt-info")
        sys.exit(77)
    if not {"-O2", "-O3"} & set(args):
        print(f"cpu-vectorisation: {entry['file']} is built without -O2 or -O3 (a Debug build?);"
              " GCC vectorises from -O2")
        sys.exit(77)
    with tempfile.TemporaryDirectory() as work:
        out = args.index("-o")
        args[out + 1] = os.path.join(work, "kernel.o")
        info = os.path.join(work, "vec.txt")
        subprocess.run(args + [f"-fopt-info-vec-all={info}"], cwd=entry["directory"], check=True)
        reports = []
        for line in open(info):
            where = re.match(r"(.+?):(\d+):\d+: (optimized: loop vectorized|missed: couldn't "
                             r"vectorize loop)", line)
            if where and os.path.realpath(os.path.join(entry["directory"], where.group(1))) == path:
                reports.append((int(where.group(2)), where.group(3).startswith("optimized")))
        return reports


failed, rows = [], []
for path in sorted(p for p in entries if "/kernels/cpu/" in p and p.endswith(".cpp")):
    loops = simd_loops(path)
    if not loops:
        continue
    reports = gcc_reports(entries[path], path)
    name = path[path.index("kernels/cpu/"):]
    for pragma, first, last in loops:
        inside = [vectorised for line, vectorised in reports if first <= line <= last]
        done, missed = inside.count(True), inside.count(False)
        rows.append(f"| {name} | {pragma} | {done} | {missed} |")
        if done == 0 or missed:
            failed.append(f"{name}:{pragma}")
print("| kernel file | line of the pragma | versions vectorised | versions left scalar |")
print("| --- | --- | --- | --- |")
print("\n".join(rows))
for loop in failed:
    print(f"not vectorised: the omp simd loop at {loop}")
sys.exit(1 if check and failed else 0)
PY
