#!/usr/bin/env bash
# Delta benchmark (issue 21), every figure against a peer in the same run:
# - one window of ROWS rows by `highwater ingest` into a Delta table
#   (format = "delta") against the same into today's Parquet folder
#   (target: Delta >= 0.9x the folder's rows/s), each landed and then
#   re-landed (the Delta re-land also removes the old version's files);
# - dlt's delta destination (filesystem, table_format = "delta") on the
#   same table, if `pip install "dlt[deltalake]"` works (target: highwater
#   >= 4x its rows/s).
#
#   bash bench/ingest_delta.sh                          # ROWS=5000000
#   HW=target/debug/highwater bash bench/ingest_delta.sh  # a binary already built
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${ROWS:-5000000}
BENCH_DIR=${BENCH_DIR:-/tmp/highwater-bench}/ingest_delta
if [ -z "${HW:-}" ]; then
    cargo build --release -q -p highwater
    HW="$PWD/target/release/highwater"
fi
HW=$(realpath "$HW")
REPO=$PWD
# shellcheck source=scripts/pg.sh
. scripts/pg.sh
pg_start
rm -rf "$BENCH_DIR" && mkdir -p "$BENCH_DIR"
psql -q -c "DROP TABLE IF EXISTS orders_delta_bench;
    CREATE TABLE orders_delta_bench AS
    SELECT g::int8 AS id, (g * 1.5)::numeric(14, 2) AS amount, md5(g::text) AS note,
           g % 1000 = 0 AS flagged,
           timestamptz '2026-03-01' + g * interval '10 ms' AS updated_at
    FROM generate_series(1, $ROWS) g;
    ALTER TABLE orders_delta_bench ADD PRIMARY KEY (id); ANALYZE orders_delta_bench;"
src() { # name output [extra lines]
    cat <<TOML
[sources.$1]
kind = "postgres"
url_env = "HIGHWATER_TEST_PG_URL"
table = "orders_delta_bench"
key = ["id"]
mode = "updated_at"
cursor = "updated_at"
interval = "1d"
start = "2026-03-01T00:00:00Z"
output = "$2"
${3:-}
TOML
}
{
    src folder 'raw/orders/{date}'
    src delta 'lake/orders' 'format = "delta"'
} >"$BENCH_DIR/highwater.toml"
secs() { awk -v ns="$1" 'BEGIN { printf "%.3f", ns / 1e9 }'; }
timed() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null; t1=$(date +%s%N); secs $((t1 - t0)); }
rate() { awk -v n="$1" -v t="$2" 'BEGIN { printf "%.0f", n / t }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
W="2026-03-01T00:00:00Z/2026-03-02T00:00:00Z"
NOW=2026-06-01T00:00:00Z
cd "$BENCH_DIR"
# Interleaved, so that a change in the machine's load hits both alike.
t_f1=$(timed "$HW" ingest folder --window "$W" --now "$NOW")
t_d1=$(timed "$HW" ingest delta --window "$W" --now "$NOW")
t_f2=$(timed "$HW" ingest folder --window "$W" --now "$NOW")
t_d2=$(timed "$HW" ingest delta --window "$W" --now "$NOW")
n=$(awk -v r="$ROWS" 'BEGIN { print r - 0 }')
echo "# Delta benchmark ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, $ROWS rows, one 1-day window, binary $HW)"
echo "Parquet folder, land:    ${t_f1} s  ($(rate "$n" "$t_f1") rows/s)"
echo "Delta table, land:       ${t_d1} s  ($(rate "$n" "$t_d1") rows/s), $(ratio "$t_f1" "$t_d1")x the folder's rate (target >= 0.9)"
echo "Parquet folder, re-land: ${t_f2} s  ($(rate "$n" "$t_f2") rows/s)"
echo "Delta table, re-land:    ${t_d2} s  ($(rate "$n" "$t_d2") rows/s), $(ratio "$t_f2" "$t_d2")x the folder's rate (target >= 0.9)"
echo "Delta log after the re-land: $(ls lake/orders/_delta_log | tr '\n' ' ')"
DLT_PY=${DLT_PY:-/tmp/dltenv/bin/python}
if [ ! -x "$DLT_PY" ]; then
    python3 -m venv /tmp/dltenv >/dev/null 2>&1 || true
    /tmp/dltenv/bin/pip install -q "dlt[deltalake]" sqlalchemy psycopg2-binary pyarrow >/dev/null 2>&1 || true
fi
if "$DLT_PY" -c "import dlt, deltalake, sqlalchemy, pyarrow, psycopg2" 2>/dev/null; then
    PG_URL="postgresql+psycopg2://postgres@127.0.0.1:$PGPORT/postgres"
    read -r dlt_rows t_dlt < <("$DLT_PY" "$REPO/bench/dlt_orders.py" "$PG_URL" orders_delta_bench "$BENCH_DIR/dlt" delta)
    echo "dlt $("$DLT_PY" -c 'import dlt; print(dlt.__version__)') sql_table (pyarrow backend) into its delta destination:  ${t_dlt} s for $dlt_rows rows ($(rate "$dlt_rows" "$t_dlt") rows/s); highwater's Delta land is $(ratio "$t_dlt" "$t_d1")x dlt's rate (target >= 4)"
else
    echo "dlt[deltalake]: did not install from PyPI here; no figure"
fi
