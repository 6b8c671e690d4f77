#!/usr/bin/env bash
# Issue 24: the cost of observing a command (ptrace + seccomp filter) against
# running it plainly, in the same process, alternating, best of ROUNDS.
#   bench/observe_overhead.sh [PY_RUNS=400] [CP_RUNS=10000] [ROUNDS=3]
set -euo pipefail
PY_RUNS=${1:-400}
CP_RUNS=${2:-10000}
ROUNDS=${3:-3}
cd "$(dirname "$0")/.."
cargo build --release -q -p highwater-observe --example observe_bench
PY=$(python3 -c 'import sys; print(sys.executable)')  # past pyenv's shim
BIN=${CARGO_TARGET_DIR:-target}/release/examples/observe_bench
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/lib" "$W/out"
printf 'def f(s):\n    return s.upper()\n' > "$W/lib/helpers.py"
printf 'import sys\nsys.path.insert(0, "lib")\nimport helpers, json\nprint(helpers.f("x"))\n' > "$W/t.py"
head -c 4096 /dev/urandom > "$W/in.bin"
for r in $(seq "$ROUNDS"); do
  "$BIN" plain "$PY_RUNS" "$W" "$PY" t.py | sed "s/^/python3 round $r: /"
  "$BIN" observed "$PY_RUNS" "$W" "$PY" t.py | sed "s/^/python3 round $r: /"
  "$BIN" plain "$CP_RUNS" "$W" cp in.bin 'out/{i}' | sed "s/^/cp round $r: /"
  "$BIN" observed "$CP_RUNS" "$W" cp in.bin 'out/{i}' | sed "s/^/cp round $r: /"
done
