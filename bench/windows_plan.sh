#!/usr/bin/env bash
# Issue 49: a no-change plan of a file stage over 1,000 landed windows
# against a no-change plan of the same stage over 1,000 files, interleaved
# (window plan, file plan, window plan, ...), each the real binary.
#
#   bash bench/windows_plan.sh
#   HW=/path/to/highwater N=1000 REPEAT=15 bash bench/windows_plan.sh
#
# The window project: a SQLite source with N hourly windows of 3 rows,
# landed; a stage over them by window. The file project: N small files and
# the same stage over them. Both ran once, so the plans find nothing to do.
# Target: the window plan no slower than the file plan (ratio <= 1.0).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-1000}
REPEAT=${REPEAT:-15}
BENCH_DIR=${BENCH_DIR:-/tmp/highwater-bench-windows}
if [ -z "${HW:-}" ]; then
    cargo build --release -q -p highwater
    HW="$PWD/target/release/highwater"
fi
rm -rf "$BENCH_DIR"
mkdir -p "$BENCH_DIR/w" "$BENCH_DIR/f/data"
W="$BENCH_DIR/w"
F="$BENCH_DIR/f"
CMD='command = ["sh", "-c", "cat \"$@\" > \"$0\"", "{output}", "{files}"]'

cat > "$W/highwater.toml" <<TOML
[sources.orders]
kind = "sqlite"
path = "src.db"
table = "orders"
key = ["id"]
mode = "updated_at"
cursor = "updated_at"
interval = "1h"
start = "2026-01-01T00:00:00Z"
settle = "1m"
output = "raw/orders/date={date}/hour={hour}"

[stages.per_window]
inputs = { source = "orders", by = "window" }
output = "marts/{window_start}.txt"
$CMD
TOML
python3 - "$W/src.db" "$N" "$F/data" <<'PY'
import sqlite3, sys, datetime
db, n, data = sys.argv[1], int(sys.argv[2]), sys.argv[3]
c = sqlite3.connect(db)
c.execute("CREATE TABLE orders(id INTEGER PRIMARY KEY, amount INTEGER, updated_at TEXT NOT NULL)")
t0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
for h in range(n):
    for i in range(3):
        t = t0 + datetime.timedelta(hours=h, minutes=10 + 10 * i)
        c.execute("INSERT INTO orders VALUES(?, ?, ?)", (h * 3 + i, i, t.strftime("%Y-%m-%dT%H:%M:%SZ")))
    with open(f"{data}/f{h:05d}.txt", "w") as f:
        f.write(f"window {h}\n")
c.commit()
PY
NOW=$(python3 -c "import datetime; print((datetime.datetime(2026,1,1)+datetime.timedelta(hours=$N, minutes=30)).strftime('%Y-%m-%dT%H:%M:%SZ'))")
cat > "$F/highwater.toml" <<TOML
[stages.per_file]
inputs = ["data/*.txt"]
output = "out/{name}"
command = ["sh", "-c", "cat \"\$1\" > \"\$0\"", "{output}", "{input}"]
TOML

# A run lands at most catch_up_windows_max (720) windows: enough runs for N.
for _ in $(seq $(( N / 720 + 1 ))); do
    (cd "$W" && "$HW" ingest orders --now "$NOW" --max-parallel 2 >/dev/null)
done
(cd "$W" && "$HW" run >/dev/null)
(cd "$F" && "$HW" run >/dev/null)
# Both plans must find nothing to do, or the comparison means nothing.
(cd "$W" && "$HW" plan | grep -q "discovered $N, 0 changed") || { echo "window plan is not a no-change plan of $N items"; exit 1; }
(cd "$F" && "$HW" plan | grep -q "discovered $N, 0 changed") || { echo "file plan is not a no-change plan of $N items"; exit 1; }

# Microseconds of one plan, the subshell's fork included (the same for both).
us() { local t0 t1; t0=$(date +%s%N); (cd "$1" && "$HW" plan >/dev/null); t1=$(date +%s%N); echo $(( (t1 - t0) / 1000 )); }
ws=(); fs=()
for _ in $(seq "$REPEAT"); do
    ws+=("$(us "$W")")
    fs+=("$(us "$F")")
done
stats() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {printf "best %.1f ms, median %.1f ms", a[1] / 1000, a[int((NR+1)/2)] / 1000}'; }
best() { printf '%s\n' "$@" | sort -n | head -1; }
med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "# no-change plan, $N items, $REPEAT interleaved rounds ($(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))"
echo "windows (by window): $(stats "${ws[@]}")"
echo "files:               $(stats "${fs[@]}")"
awk -v a="$(best "${ws[@]}")" -v b="$(best "${fs[@]}")" -v c="$(med "${ws[@]}")" -v d="$(med "${fs[@]}")" \
    'BEGIN { printf "ratio windows/files: best %.2f, median %.2f\n", a / b, c / d }'
