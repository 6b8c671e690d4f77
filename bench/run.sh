#!/usr/bin/env bash
# highwater benchmarks, each a ratio against a peer tool timed in the same run.
#
#   bash bench/run.sh            # all file benchmarks
#   N_FILES=20000 bash bench/run.sh
#
# 1. plan over N_FILES (100,000) unchanged small files, warm cache, against
#    `git status` on the same tree (committed). Target: at most 1.5x git.
#    Also `dvc status` when dvc is installed (pip install dvc).
# 2. hashing one 1 GiB file against b3sum (cargo install b3sum).
#    Target: at least 0.9x b3sum's throughput.
# 3. per-item overhead of `run` with a trivial command (cp), items per
#    second, beside the bare spawn rate of the same command under xargs.
#
# Timings are the best of REPEAT (7) runs, wall clock. Work files go to
# BENCH_DIR (default /tmp/highwater-bench) and are left for inspection.
set -euo pipefail
cd "$(dirname "$0")/.."
N_FILES=${N_FILES:-100000}
REPEAT=${REPEAT:-7}
BENCH_DIR=${BENCH_DIR:-/tmp/highwater-bench}
RUN_ITEMS=${RUN_ITEMS:-3000}

cargo build --release -q -p highwater
HW="$PWD/target/release/highwater"
mkdir -p "$BENCH_DIR"

# best CMD...: the fastest of REPEAT runs, in seconds, on stdout.
best() {
    local min=""
    for _ in $(seq "$REPEAT"); do
        local t0 t1
        t0=$(date +%s%N)
        "$@" >/dev/null 2>&1
        t1=$(date +%s%N)
        local d=$((t1 - t0))
        if [ -z "$min" ] || [ "$d" -lt "$min" ]; then min=$d; fi
    done
    awk -v ns="$min" 'BEGIN { printf "%.4f", ns / 1e9 }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

echo "# highwater benchmarks ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores)"
echo

# --- 1. plan over unchanged files vs git status ------------------------------
P="$BENCH_DIR/plan-$N_FILES"
if [ ! -f "$P/.ready" ]; then
    rm -rf "$P"
    mkdir -p "$P"
    python3 - "$P" "$N_FILES" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = f"{root}/data/d{i // 100:04d}"
    o = f"{root}/out/d{i // 100:04d}"
    if i % 100 == 0:
        os.makedirs(d, exist_ok=True)
        os.makedirs(o, exist_ok=True)
    body = f"item {i}\n".encode() * 8
    with open(f"{d}/f{i:06d}.txt", "wb") as f:
        f.write(body)
    with open(f"{o}/f{i:06d}.txt.out", "wb") as f:
        f.write(body)
PY
    cat > "$P/highwater.toml" <<'TOML'
[stages.copy]
inputs = ["data/**/*.txt"]
output = "out/{relpath}.out"
command = ["cp", "{input}", "{output}"]
TOML
    (cd "$P" && printf 'out/\n.highwater/\nhighwater.toml\n.ready\n' > .gitignore \
        && git init -q && git add -A data .gitignore \
        && git -c user.name=b -c user.email=b@b commit -qm data)
    # Let the files age past the racy margin before their evidence is recorded.
    sleep 2
    (cd "$P" && "$HW" adopt >/dev/null)
    touch "$P/.ready"
fi
changed=$(cd "$P" && "$HW" plan --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["stages"][0]["changed"]))')
[ "$changed" = 0 ] || { echo "plan sees $changed changes; expected none" >&2; exit 1; }
dirty=$(cd "$P" && git status --porcelain | wc -l)
[ "$dirty" = 0 ] || { echo "git status sees $dirty changes; expected none" >&2; exit 1; }
# Let writeback of the freshly made tree finish, so that it does not
# compete with either tool, then warm both up once.
sync
(cd "$P" && "$HW" plan >/dev/null && git status --porcelain >/dev/null)
t_hw=$(cd "$P" && best "$HW" plan)
t_git=$(cd "$P" && best git status --porcelain)
echo "## plan over $N_FILES unchanged files (warm cache)"
echo "highwater plan:  ${t_hw} s"
echo "git status:      ${t_git} s"
echo "ratio hw/git:    $(ratio "$t_hw" "$t_git")   (target <= 1.5)"
if command -v dvc >/dev/null 2>&1; then
    D="$BENCH_DIR/dvc-$N_FILES"
    if [ ! -f "$D/.ready" ]; then
        rm -rf "$D" && mkdir -p "$D" && cp -r "$P/data" "$D/data"
        (cd "$D" && dvc init -q --no-scm && dvc config core.analytics false && dvc add -q data >/dev/null 2>&1)
        touch "$D/.ready"
    fi
    t_dvc=$(cd "$D" && REPEAT=3 best dvc status)
    echo "dvc status:      ${t_dvc} s"
    echo "ratio hw/dvc:    $(ratio "$t_hw" "$t_dvc")"
else
    echo "dvc status:      not installed (pip install dvc), skipped"
fi
echo

# --- 2. hashing 1 GiB vs b3sum ---------------------------------------------------
H="$BENCH_DIR/hash"
mkdir -p "$H/data"
if [ ! -f "$H/data/big.bin" ]; then
    head -c $((1 << 30)) /dev/urandom > "$H/data/big.bin"
fi
cat > "$H/highwater.toml" <<'TOML'
[stages.copy]
inputs = ["data/*.bin"]
output = "out/{name}"
command = ["cp", "{input}", "{output}"]
TOML
cat "$H/data/big.bin" > /dev/null
B3SUM=$(command -v b3sum || echo "$HOME/.cargo/bin/b3sum")
echo "## hashing one 1 GiB file (page cache warm)"
# `plan` on a fresh store hashes the one new input in full.
t_hw=$(cd "$H" && best "$HW" plan --rehash)
echo "highwater plan:  ${t_hw} s  ($(awk -v t="$t_hw" 'BEGIN { printf "%.2f", 1.073741824 / t }') GB/s, process start and store open included)"
if [ -x "$B3SUM" ]; then
    t_b3=$(best "$B3SUM" "$H/data/big.bin")
    echo "b3sum:           ${t_b3} s  ($(awk -v t="$t_b3" 'BEGIN { printf "%.2f", 1.073741824 / t }') GB/s)"
    echo "throughput hw/b3sum: $(ratio "$t_b3" "$t_hw")   (target >= 0.9)"
else
    echo "b3sum: not installed (cargo install b3sum), skipped"
fi
echo

# --- 3. per-item overhead of run ---------------------------------------------------
R="$BENCH_DIR/run"
rm -rf "$R" && mkdir -p "$R/data"
python3 - "$R" "$RUN_ITEMS" <<'PY'
import sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    open(f"{root}/data/f{i:05d}.txt", "w").write(f"item {i}\n")
PY
cat > "$R/highwater.toml" <<'TOML'
[stages.copy]
inputs = ["data/*.txt"]
output = "out/{name}"
command = ["cp", "{input}", "{output}"]
TOML
t0=$(date +%s%N)
(cd "$R" && "$HW" run --jobs "$(nproc)" >/dev/null 2>&1)
t1=$(date +%s%N)
t_run=$(awk -v ns=$((t1 - t0)) 'BEGIN { printf "%.3f", ns / 1e9 }')
rm -rf "$R/xargs-out" && mkdir -p "$R/xargs-out"
t0=$(date +%s%N)
(cd "$R" && find data -name '*.txt' -print0 | xargs -0 -P "$(nproc)" -I{} cp {} xargs-out/)
t1=$(date +%s%N)
t_x=$(awk -v ns=$((t1 - t0)) 'BEGIN { printf "%.3f", ns / 1e9 }')
echo "## run: $RUN_ITEMS items of cp, $(nproc) workers"
echo "highwater run:   ${t_run} s  ($(awk -v n="$RUN_ITEMS" -v t="$t_run" 'BEGIN { printf "%.0f", n / t }') items/s, each fsynced, renamed and recorded)"
echo "xargs -P cp:     ${t_x} s  ($(awk -v n="$RUN_ITEMS" -v t="$t_x" 'BEGIN { printf "%.0f", n / t }') items/s, no fsync, no state)"
echo "ratio hw/xargs:  $(ratio "$t_run" "$t_x")"
t_noop=$(cd "$R" && best "$HW" run)
echo "no-op re-run:    ${t_noop} s"
