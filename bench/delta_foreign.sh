#!/usr/bin/env bash
# Delta tables other engines maintain (issue 46), every figure a ratio
# against a peer in the same run, interleaved:
# 1. copy on write: a re-land of one window in a table that the
#    `deltalake` package compacted (OPTIMIZE) into one file of ROWS rows,
#    against the same re-land in a table highwater alone wrote (the
#    window's own files removed). Each round re-lands another window, so
#    that every round in the compacted table rewrites the big file.
# 3. a recipe change re-landing a day that `highwater compact` rewrote
#    into one file (its 24 windows in one commit, the file removed whole),
#    against the same re-land of a day left as 24 window commits.
# 2. the land of one window of ROWS rows with file statistics (AFTER)
#    against the binary before them (BEFORE), if BEFORE is given
#    (target: at least 0.9x).
#
#   HW=target/release/highwater bash bench/delta_foreign.sh
#   HW=... BEFORE=/tmp/hw-before bash bench/delta_foreign.sh   # with the A/B
#   ROWS=5000000 ROUNDS=3 (defaults)
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${ROWS:-5000000}
ROUNDS=${ROUNDS:-3}
BENCH_DIR=${BENCH_DIR:-/tmp/highwater-bench}/delta_foreign
if [ -z "${HW:-}" ]; then
    cargo build --release -q -p highwater
    HW="$PWD/target/release/highwater"
fi
HW=$(realpath "$HW")
# shellcheck source=scripts/deps.sh
. scripts/deps.sh
deps_pyosmium # the venv with deltalake
PY=$HIGHWATER_TEST_PYTHON
# shellcheck source=scripts/pg.sh
. scripts/pg.sh
pg_start
rm -rf "$BENCH_DIR" && mkdir -p "$BENCH_DIR"
# ROWS rows over one day: 24 hourly windows.
psql -q -c "DROP TABLE IF EXISTS orders_foreign_bench;
    CREATE TABLE orders_foreign_bench AS
    SELECT g::int8 AS id, g * 1.5 AS amount, md5(g::text) AS note,
           timestamptz '2026-03-01' + (g - 1) * (interval '1 day' / $ROWS) AS updated_at
    FROM generate_series(1, $ROWS) g;
    ALTER TABLE orders_foreign_bench ADD PRIMARY KEY (id); ANALYZE orders_foreign_bench;"
# The recipe-change pair: the same relation written two ways, so that each
# round changes the recipe (and re-lands every window) by swapping them.
RELATION_A='table = "orders_foreign_bench"'
RELATION_B='query = "SELECT id, amount, note, updated_at FROM orders_foreign_bench"'
src() { # name output interval [relation]
    local relation=${4:-$RELATION_A}
    cat <<TOML
[sources.$1]
kind = "postgres"
url_env = "HIGHWATER_TEST_PG_URL"
$relation
key = ["id"]
mode = "updated_at"
cursor = "updated_at"
interval = "$3"
start = "2026-03-01T00:00:00Z"
output = "$2"
format = "delta"
version_retention_s = 0
TOML
}
{
    src alone lake/alone 1h
    src compacted lake/compacted 1h
    src day lake/day 1d
} >"$BENCH_DIR/highwater.toml"
periods_toml() { # relation
    src plain lake/plain 1h "$1"
    src period lake/period 1h "$1"
    printf '[sources.period.compact]\ninto = "1d"\n'
}
secs() { awk -v ns="$1" 'BEGIN { printf "%.3f", ns / 1e9 }'; }
timed() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null; t1=$(date +%s%N); secs $((t1 - t0)); }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# Just after the day closes: the 24 hourly windows and the daily one, no more.
NOW=2026-03-02T00:30:00Z
cd "$BENCH_DIR"
"$HW" ingest alone --now "$NOW" >/dev/null
"$HW" ingest compacted --now "$NOW" >/dev/null
"$PY" - lake/compacted <<'PY'
import sys
from deltalake import DeltaTable
dt = DeltaTable(sys.argv[1])
m = dt.optimize.compact(target_size=1 << 40)
dt = DeltaTable(sys.argv[1])
print("deltalake optimize:", m["numFilesRemoved"], "files into", m["numFilesAdded"], "; table files now", len(dt.file_uris()), file=sys.stderr, flush=True)
import os
os._exit(0)
PY
echo "# Delta copy on write ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, $ROWS rows in 24 hourly windows, binary $HW)"
echo "| round | window | alone s | compacted s | ratio |"
echo "|---|---|---|---|---|"
alone=() cow=()
for r in $(seq 1 "$ROUNDS"); do
    h=$(printf '%02d' $((r * 5 % 24)))
    W="2026-03-01T$h:00:00Z/$(date -u -d "2026-03-01T$h:00:00Z + 1 hour" +%Y-%m-%dT%H:%M:%SZ)"
    a=$(timed "$HW" ingest alone --window "$W" --now "$NOW")
    c=$(timed "$HW" ingest compacted --window "$W" --now "$NOW")
    alone+=("$a") cow+=("$c")
    echo "| $r | $h:00 | $a | $c | $(ratio "$c" "$a")x |"
done
ma=$(printf '%s\n' "${alone[@]}" | median)
mc=$(printf '%s\n' "${cow[@]}" | median)
echo "median: alone $ma s, compacted $mc s: the copy on write costs $(ratio "$mc" "$ma")x"
"$PY" - lake/compacted <<'PY'
import sys
from deltalake import DeltaTable
t = DeltaTable(sys.argv[1]).to_pyarrow_table(columns=["id"])
ids = t.column("id").to_pylist()
print("compacted table after the re-lands:", len(ids), "rows,", len(set(ids)), "distinct", file=sys.stderr, flush=True)
# pyarrow's threads can abort the interpreter's shutdown after the answer.
import os
os._exit(0)
PY
echo "# Recipe change over a compacted day ($ROWS rows, 24 hourly windows)"
echo "| round | plain s | compacted period s | ratio |"
echo "|---|---|---|---|"
periods_toml "$RELATION_A" >periods.toml
"$HW" ingest plain --config periods.toml --now "$NOW" >/dev/null
"$HW" ingest period --config periods.toml --now "$NOW" >/dev/null
plain=() period=()
for r in $(seq 1 "$ROUNDS"); do
    "$HW" compact period --config periods.toml --now "$NOW" >/dev/null
    if [ $((r % 2)) = 1 ]; then rel=$RELATION_B; else rel=$RELATION_A; fi
    periods_toml "$rel" >periods.toml
    a=$(timed "$HW" ingest plain --config periods.toml --force --now "$NOW")
    b=$(timed "$HW" ingest period --config periods.toml --force --now "$NOW")
    plain+=("$a") period+=("$b")
    echo "| $r | $a | $b | $(ratio "$b" "$a")x |"
done
mp=$(printf '%s\n' "${plain[@]}" | median)
mq=$(printf '%s\n' "${period[@]}" | median)
echo "median: plain $mp s, compacted period $mq s: re-landing a compacted day costs $(ratio "$mq" "$mp")x re-landing the same windows uncompacted"
"$PY" - lake/period <<'PY'
import sys
from deltalake import DeltaTable
t = DeltaTable(sys.argv[1]).to_pyarrow_table(columns=["id"])
ids = t.column("id").to_pylist()
print("compacted-period table after the re-lands:", len(ids), "rows,", len(set(ids)), "distinct", file=sys.stderr, flush=True)
import os
os._exit(0)
PY
if [ -n "${BEFORE:-}" ]; then
    BEFORE=$(realpath "$BEFORE")
    D="2026-03-01T00:00:00Z/2026-03-02T00:00:00Z"
    echo "# Land of one window of $ROWS rows: $BEFORE (before) against $HW (after, with statistics)"
    echo "| round | before s | after s |"
    echo "|---|---|---|"
    before=() after=()
    for r in $(seq 1 "$ROUNDS"); do
        rm -rf lake/day .highwater
        b=$(timed "$BEFORE" ingest day --window "$D" --now "$NOW")
        rm -rf lake/day .highwater
        a=$(timed "$HW" ingest day --window "$D" --now "$NOW")
        before+=("$b") after+=("$a")
        echo "| $r | $b | $a |"
    done
    mb=$(printf '%s\n' "${before[@]}" | median)
    ma=$(printf '%s\n' "${after[@]}" | median)
    echo "median: before $mb s, after $ma s: after lands at $(ratio "$mb" "$ma")x the rate before (target >= 0.9)"
fi
