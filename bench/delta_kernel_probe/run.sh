#!/usr/bin/env bash
# Issue 46, "Library or our own: decide by conformance": builds the
# delta_kernel probe and runs it on tables in the states issue 46 lists,
# made with the `deltalake` package, then reads each back with deltalake
# and Polars (run.py). See REPORT.md.
#
#   bash bench/delta_kernel_probe/run.sh              # all states
#   bash bench/delta_kernel_probe/run.sh plain partitioned   # some
#   COLD=1 bash bench/delta_kernel_probe/run.sh       # also a timed cold build
#
# Env: CARGO_TARGET_DIR (default /tmp/probe-target), WORK (default
# /tmp/delta-kernel-probe), PY (default the highwater venv's python).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/tmp/probe-target}
WORK=${WORK:-/tmp/delta-kernel-probe}
PY=${PY:-/root/.cache/highwater/venv/bin/python}
cd "$HERE"
if [ "${COLD:-0}" = 1 ]; then
    # From an empty target dir, crates already downloaded (cargo fetch), so
    # the figure is compile time only. On a shared VM read user+sys too.
    cargo fetch -q
    rm -rf "$CARGO_TARGET_DIR"
    /usr/bin/time -v nice -n 10 cargo build --release --offline 2>&1 |
        grep -E 'Finished|Elapsed|User time|System time|Maximum resident|error' || true
    ls -l "$CARGO_TARGET_DIR/release/probe"
fi
nice -n 10 cargo build --release -q
PROBE="$CARGO_TARGET_DIR/release/probe"
mkdir -p "$WORK"
"$PY" "$HERE/run.py" "$PROBE" "$WORK" "$@" | tee "$WORK/run.log"
