#!/usr/bin/env bash
# Ingestion benchmark, every figure against a peer in the same run:
# - one window of ROWS rows extracted to Parquet by `highwater ingest`,
#   unchunked and chunked (4 chunks), against
#   `psql -c "COPY (SELECT ...) TO STDOUT" > /dev/null` on the same rows,
#   and against dlt (sql_database, pyarrow backend) if it installs;
# - peak RSS for ROWS/10, ROWS and LARGE_ROWS rows (chunked), which must
#   stay flat as the window grows;
# - compaction of HOURS hourly windows into daily files: time, and files
#   before and after, against DuckDB rewriting the same files if it installs.
#
#   bash bench/ingest.sh     # ROWS=5000000 LARGE_ROWS=50000000 HOURS=720
#   LARGE_ROWS=0 bash bench/ingest.sh     # skip the large table
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${ROWS:-5000000}
SMALL=$((ROWS / 10))
LARGE_ROWS=${LARGE_ROWS:-50000000}
HOURS=${HOURS:-720}
PER_HOUR=${PER_HOUR:-2000}
BENCH_DIR=${BENCH_DIR:-/tmp/highwater-bench}/ingest
cargo build --release -q -p highwater
HW="$PWD/target/release/highwater"
REPO=$PWD
# shellcheck source=scripts/pg.sh
. scripts/pg.sh
pg_start
rm -rf "$BENCH_DIR" && mkdir -p "$BENCH_DIR"
mk() { # name rows step
    psql -q -c "CREATE TABLE $1 AS
        SELECT g::int8 AS id, (g * 1.5)::numeric(14, 2) AS amount, md5(g::text) AS note,
               g % 1000 = 0 AS flagged,
               timestamptz '2026-03-01' + g * interval '$3' AS updated_at
        FROM generate_series(1, $2) g;
        ALTER TABLE $1 ADD PRIMARY KEY (id); ANALYZE $1;"
}
mk orders "$ROWS" '10 ms'
mk orders_small "$SMALL" '10 ms'
if [ "$LARGE_ROWS" -gt 0 ]; then mk orders_large "$LARGE_ROWS" '1 ms'; fi
psql -q -c "CREATE TABLE events AS
    SELECT g::int8 AS id, md5(g::text) AS note,
           timestamptz '2026-04-01' + (g::int8 * 3600000 / $PER_HOUR) * interval '1 ms' AS updated_at
    FROM generate_series(0, $HOURS * $PER_HOUR - 1) g;
    ALTER TABLE events ADD PRIMARY KEY (id); ANALYZE events;"
src() { # name table output [extra lines]
    cat <<TOML
[sources.$1]
kind = "postgres"
url_env = "HIGHWATER_TEST_PG_URL"
table = "$2"
key = ["id"]
mode = "updated_at"
cursor = "updated_at"
interval = "${4:-1d}"
start = "${5:-2026-03-01T00:00:00Z}"
output = "$3"
TOML
}
{
    src orders orders 'raw/orders/{date}'
    src orders_nocheck orders 'raw/orders_nocheck/{date}'
    printf '[sources.orders_nocheck.checks]\nunique_key = "off"\n'
    src orders_chunked orders 'raw/orders_chunked/{date}'
    # About 4 chunks whatever the planner's estimate is off by (±7%).
    printf 'chunk_by = "id"\nchunk_rows = %d\n' $((ROWS * 27 / 100))
    src orders_small orders_small 'raw/orders_small/{date}'
    src orders_large orders_large 'raw/orders_large/{date}'
    printf 'chunk_by = "id"\nchunk_rows = %d\n' $((ROWS * 27 / 100))
    src events events 'raw/events/{date}/{hour}' 1h 2026-04-01T00:00:00Z
    printf '[sources.events.compact]\ninto = "1d"\ntarget_file_mb = 128\n'
} >"$BENCH_DIR/highwater.toml"
secs() { awk -v ns="$1" 'BEGIN { printf "%.3f", ns / 1e9 }'; }
timed() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null; t1=$(date +%s%N); secs $((t1 - t0)); }
rss() { /usr/bin/time -f %M "$@" 2>&1 >/dev/null | tail -n 1; }
rate() { awk -v n="$1" -v t="$2" 'BEGIN { printf "%.0f", n / t }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
W="2026-03-01T00:00:00Z/2026-03-02T00:00:00Z"
NOW=2026-06-01T00:00:00Z
copy_sql() { echo "COPY (SELECT id, amount, note, flagged, updated_at FROM $1 WHERE updated_at >= '2026-03-01' AND updated_at < '2026-03-02') TO STDOUT"; }
psql -q -c "$(copy_sql orders)" >/dev/null # warm the cache
t_copy=$(timed psql -q -c "$(copy_sql orders)")
cd "$BENCH_DIR"
t_hw=$(timed "$HW" ingest orders --window "$W" --now "$NOW")
t_hw_nc=$(timed "$HW" ingest orders_nocheck --window "$W" --now "$NOW")
t_hw_ch2=$(timed "$HW" ingest orders_chunked --window "$W" --now "$NOW" --max-parallel 2)
chunks=$(python3 -c "import json; print(len(json.load(open('raw/orders_chunked/2026-03-01/_manifest.json'))['chunks']))")
t_hw_ch4=$(timed "$HW" ingest orders_chunked --window "$W" --now "$NOW" --max-parallel 4)
rss_big=$(rss "$HW" ingest orders --window "$W" --now "$NOW")
rss_small=$(rss "$HW" ingest orders_small --window "$W" --now "$NOW")
rss_chunked=$(rss "$HW" ingest orders_chunked --window "$W" --now "$NOW" --max-parallel 2)
bytes=$(du -sb raw/orders | cut -f1)
echo "# ingest benchmark ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, $ROWS rows, one 1-day window)"
echo "psql COPY TO STDOUT > /dev/null:        ${t_copy} s  ($(rate "$ROWS" "$t_copy") rows/s)"
echo "highwater ingest (unique-key check):    ${t_hw} s  ($(rate "$ROWS" "$t_hw") rows/s), $(ratio "$t_copy" "$t_hw")x COPY's rate (target >= 0.8)"
echo "highwater ingest (no key check):        ${t_hw_nc} s  ($(rate "$ROWS" "$t_hw_nc") rows/s), $(ratio "$t_copy" "$t_hw_nc")x COPY's rate"
echo "highwater ingest, $chunks chunks, 2 at once:  ${t_hw_ch2} s  ($(rate "$ROWS" "$t_hw_ch2") rows/s), $(ratio "$t_copy" "$t_hw_ch2")x COPY's rate (target >= 0.8)"
echo "highwater ingest, $chunks chunks, 4 at once:  ${t_hw_ch4} s  ($(rate "$ROWS" "$t_hw_ch4") rows/s), $(ratio "$t_copy" "$t_hw_ch4")x COPY's rate"
echo "Parquet written (zstd):                 $bytes bytes"
echo "peak RSS, $SMALL rows:                 ${rss_small} KiB"
echo "peak RSS, $ROWS rows:                ${rss_big} KiB"
echo "peak RSS, $ROWS rows, chunked:       ${rss_chunked} KiB"
# dlt, the peer: the pyarrow backend, into Parquet on the local filesystem.
DLT_PY=${DLT_PY:-/tmp/dltenv/bin/python}
if [ ! -x "$DLT_PY" ]; then
    python3 -m venv /tmp/dltenv >/dev/null 2>&1 || true
    /tmp/dltenv/bin/pip install -q dlt sqlalchemy psycopg2-binary pyarrow >/dev/null 2>&1 || true
fi
if "$DLT_PY" -c "import dlt, sqlalchemy, pyarrow, psycopg2" 2>/dev/null; then
    PG_URL="postgresql+psycopg2://postgres@127.0.0.1:$PGPORT/postgres"
    read -r dlt_rows t_dlt < <("$DLT_PY" "$REPO/bench/dlt_orders.py" "$PG_URL" orders "$BENCH_DIR/dlt")
    echo "dlt $("$DLT_PY" -c 'import dlt; print(dlt.__version__)') sql_table, pyarrow backend:  ${t_dlt} s for $dlt_rows rows ($(rate "$dlt_rows" "$t_dlt") rows/s); highwater (key check) is $(ratio "$t_dlt" "$t_hw")x dlt's rate (target >= 4)"
else
    echo "dlt: did not install from PyPI here; no figure"
fi
if [ "$LARGE_ROWS" -gt 0 ]; then
    t_copy_l=$(cd "$REPO" && timed psql -q -c "$(copy_sql orders_large)")
    t0=$(date +%s%N)
    rss_large=$(rss "$HW" ingest orders_large --window "$W" --now "$NOW" --max-parallel 2)
    t_large=$(secs $(($(date +%s%N) - t0)))
    chunks_l=$(python3 -c "import json; print(len(json.load(open('raw/orders_large/2026-03-01/_manifest.json'))['chunks']))")
    echo "$LARGE_ROWS rows, psql COPY:          ${t_copy_l} s ($(rate "$LARGE_ROWS" "$t_copy_l") rows/s)"
    echo "$LARGE_ROWS rows, $chunks_l chunks, 2 at once: ${t_large} s ($(rate "$LARGE_ROWS" "$t_large") rows/s), $(ratio "$t_copy_l" "$t_large")x COPY's rate, peak RSS ${rss_large} KiB"
fi
# Compaction: HOURS hourly windows into daily files.
t_ing=$(timed "$HW" ingest events --now "$NOW" --max-parallel 2)
files_before=$(find raw/events -name '*.parquet' -not -path '*/.*' | wc -l)
cp -r raw/events raw_events_copy
t_compact=$(timed "$HW" compact events --now "$NOW")
files_after=$(find raw/events -name '*.parquet' -not -path '*/.*' | wc -l)
echo "compaction: $HOURS hourly windows of $PER_HOUR rows (ingested in ${t_ing} s): $files_before files -> $files_after files in ${t_compact} s"
if "$DLT_PY" -c "import duckdb" 2>/dev/null || /tmp/dltenv/bin/pip install -q duckdb >/dev/null 2>&1; then
    t_duck=$(timed "$DLT_PY" -c "
import duckdb
duckdb.sql(\"\"\"COPY (SELECT *, strftime(updated_at, '%Y-%m-%d') AS day
    FROM read_parquet('raw_events_copy/**/*.parquet')) TO 'duck_events' (FORMAT parquet, PARTITION_BY (day))\"\"\")
")
    echo "DuckDB $("$DLT_PY" -c 'import duckdb; print(duckdb.__version__)') rewriting the same files by day (no checks, no swap): ${t_duck} s; highwater compact takes $(ratio "$t_compact" "$t_duck")x its time"
fi
