#!/usr/bin/env bash
# Warehouse load benchmark (issue 21), against its peer in the same run:
# one window of ROWS rows, published as Parquet by `highwater ingest`, loaded
# into a PostgreSQL table by `[sources.orders.load]` (read back from the
# Parquet files, binary COPY, one transaction), against
# `psql -c "\copy raw.orders FROM 'orders.csv' CSV"` of the same rows (a CSV
# exported from that table after highwater loaded it, so derived from the
# same Parquet) into the same table, emptied before each run. Best of RUNS
# runs each, alternating.
#
#   bash bench/warehouse_load.sh        # ROWS=5000000 RUNS=3
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${ROWS:-5000000}
RUNS=${RUNS:-3}
BENCH_DIR=${BENCH_DIR:-/tmp/highwater-bench}/warehouse
cargo build --release -q -p highwater
HW="$PWD/target/release/highwater"
# shellcheck source=scripts/pg.sh
. scripts/pg.sh
pg_start
rm -rf "$BENCH_DIR" && mkdir -p "$BENCH_DIR"
psql -q -c "DROP DATABASE IF EXISTS hw_bench_wh" -c "CREATE DATABASE hw_bench_wh"
psql -q -c "DROP TABLE IF EXISTS wh_orders; CREATE TABLE wh_orders AS
    SELECT g::int8 AS id, (g * 1.5)::float8 AS amount, md5(g::text) AS note,
           g % 1000 = 0 AS flagged,
           timestamptz '2026-03-01' + g * interval '10 ms' AS updated_at
    FROM generate_series(1, $ROWS) g;
    ALTER TABLE wh_orders ADD PRIMARY KEY (id); ANALYZE wh_orders;"
WH_URL="$HIGHWATER_TEST_PG_URL dbname=hw_bench_wh"
wh() { psql -q -d hw_bench_wh "$@"; }
cat >"$BENCH_DIR/highwater.toml" <<TOML
[sources.orders]
kind = "postgres"
url_env = "HIGHWATER_TEST_PG_URL"
table = "wh_orders"
key = ["id"]
mode = "updated_at"
cursor = "updated_at"
interval = "1d"
start = "2026-03-01T00:00:00Z"
output = "raw/orders/{date}"
[sources.orders.load]
kind = "postgres"
url_env = "WAREHOUSE_URL"
table = "raw.orders"
TOML
secs() { awk -v ns="$1" 'BEGIN { printf "%.3f", ns / 1e9 }'; }
rate() { awk -v n="$1" -v t="$2" 'BEGIN { printf "%.0f", n / t }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
best() { awk -v a="$1" -v b="$2" 'BEGIN { print (b == "" || a < b) ? a : b }'; }
W="2026-03-01T00:00:00Z/2026-03-02T00:00:00Z"
NOW=2026-06-01T00:00:00Z
cd "$BENCH_DIR"
export WAREHOUSE_URL="$WH_URL"
# The first run creates the table (with its index on _highwater_window).
"$HW" ingest orders --window "$W" --now "$NOW" --json >first.json
wh -c "\copy (SELECT * FROM raw.orders) TO '$BENCH_DIR/orders.csv' CSV"
n=$(wh -At -c "SELECT count(*) FROM raw.orders")
[ "$n" = "$ROWS" ] || { echo "loaded $n rows, wanted $ROWS" >&2; exit 1; }
t_hw="" t_psql=""
for _ in $(seq "$RUNS"); do
    wh -c "TRUNCATE raw.orders; CHECKPOINT"
    t0=$(date +%s%N)
    wh -c "\copy raw.orders FROM '$BENCH_DIR/orders.csv' CSV"
    t_psql=$(best "$(secs $(($(date +%s%N) - t0)))" "$t_psql")
    wh -c "TRUNCATE raw.orders; CHECKPOINT"
    # The load alone: the window is re-landed (extracted again), and its
    # load's own time is in the report (connect, Parquet read back, COPY,
    # commit).
    "$HW" ingest orders --window "$W" --now "$NOW" --json >run.json
    ms=$(python3 -c "import json; l = json.load(open('run.json'))['loads']; assert l[0]['status'] == 'loaded' and l[0]['rows'] == $ROWS, l; print(l[0]['duration_ms'])")
    t_hw=$(best "$(awk -v ms="$ms" 'BEGIN { printf "%.3f", ms / 1000 }')" "$t_hw")
done
echo "# warehouse load benchmark ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, $ROWS rows, one window, best of $RUNS)"
echo "psql \\copy FROM CSV into raw.orders:      ${t_psql} s  ($(rate "$ROWS" "$t_psql") rows/s)"
echo "highwater load (Parquet -> binary COPY):  ${t_hw} s  ($(rate "$ROWS" "$t_hw") rows/s), $(ratio "$t_psql" "$t_hw")x psql's rate (target >= 0.8)"
