#!/usr/bin/env bash
# Ingestion benchmark: a PostgreSQL table extracted to Parquet by
# `highwater ingest`, against `psql -c "COPY (SELECT ...) TO STDOUT" > /dev/null`
# on the same rows in the same run. Also the peak memory of ingest for a
# small and a large window, which must stay flat as the window grows.
#
#   bash bench/ingest.sh            # ROWS=5000000 by default
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${ROWS:-5000000}
SMALL=$((ROWS / 10))
BENCH_DIR=${BENCH_DIR:-/tmp/highwater-bench}/ingest
cargo build --release -q -p highwater
HW="$PWD/target/release/highwater"
# shellcheck source=scripts/pg.sh
. scripts/pg.sh
pg_start
rm -rf "$BENCH_DIR" && mkdir -p "$BENCH_DIR"
for t in orders:$ROWS orders_small:$SMALL; do
    name=${t%%:*}
    n=${t##*:}
    psql -q -c "CREATE TABLE $name AS
        SELECT g::int8 AS id, (g * 1.5)::numeric(14, 2) AS amount, md5(g::text) AS note,
               g % 1000 = 0 AS flagged,
               timestamptz '2026-03-01' + g * interval '10 ms' AS updated_at
        FROM generate_series(1, $n) g;
        ALTER TABLE $name ADD PRIMARY KEY (id); ANALYZE $name;"
done
cat > "$BENCH_DIR/highwater.toml" <<'TOML'
[sources.orders]
kind = "postgres"
url_env = "HIGHWATER_TEST_PG_URL"
table = "orders"
key = ["id"]
mode = "updated_at"
cursor = "updated_at"
interval = "1d"
start = "2026-03-01T00:00:00Z"
output = "raw/orders/{date}"

[sources.orders_nocheck]
kind = "postgres"
url_env = "HIGHWATER_TEST_PG_URL"
table = "orders"
key = ["id"]
mode = "updated_at"
cursor = "updated_at"
interval = "1d"
start = "2026-03-01T00:00:00Z"
output = "raw/orders_nocheck/{date}"
[sources.orders_nocheck.checks]
unique_key = "off"

[sources.orders_small]
kind = "postgres"
url_env = "HIGHWATER_TEST_PG_URL"
table = "orders_small"
key = ["id"]
mode = "updated_at"
cursor = "updated_at"
interval = "1d"
start = "2026-03-01T00:00:00Z"
output = "raw/orders_small/{date}"
TOML
secs() { awk -v ns="$1" 'BEGIN { printf "%.3f", ns / 1e9 }'; }
timed() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null; t1=$(date +%s%N); secs $((t1 - t0)); }
W="2026-03-01T00:00:00Z/2026-03-02T00:00:00Z"
NOW=2026-03-03T00:00:00Z
SQL="COPY (SELECT id, amount, note, flagged, updated_at FROM orders WHERE updated_at >= '2026-03-01' AND updated_at < '2026-03-02') TO STDOUT"
psql -q -c "$SQL" >/dev/null # warm the cache
t_copy=$(timed psql -q -c "$SQL")
cd "$BENCH_DIR"
t_hw=$(timed "$HW" ingest orders --window "$W" --now "$NOW")
t_hw_nc=$(timed "$HW" ingest orders_nocheck --window "$W" --now "$NOW")
rss_big=$(/usr/bin/time -f %M "$HW" ingest orders --window "$W" --now "$NOW" 2>&1 >/dev/null | tail -n 1)
rss_small=$(/usr/bin/time -f %M "$HW" ingest orders_small --window "$W" --now "$NOW" 2>&1 >/dev/null | tail -n 1)
bytes=$(du -sb raw/orders | cut -f1)
rate() { awk -v n="$ROWS" -v t="$1" 'BEGIN { printf "%.0f", n / t }'; }
echo "# ingest benchmark ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, $ROWS rows, one 1-day window)"
echo "psql COPY TO STDOUT > /dev/null:      ${t_copy} s  ($(rate "$t_copy") rows/s)"
echo "highwater ingest (unique-key check):  ${t_hw} s  ($(rate "$t_hw") rows/s), ratio $(awk -v a="$t_copy" -v b="$t_hw" 'BEGIN { printf "%.2f", a / b }')x COPY's rate"
echo "highwater ingest (no key check):      ${t_hw_nc} s  ($(rate "$t_hw_nc") rows/s), ratio $(awk -v a="$t_copy" -v b="$t_hw_nc" 'BEGIN { printf "%.2f", a / b }')x COPY's rate (target >= 0.5)"
echo "Parquet written (zstd):               $bytes bytes"
echo "peak RSS, $SMALL rows:               ${rss_small} KiB"
echo "peak RSS, $ROWS rows:              ${rss_big} KiB"
