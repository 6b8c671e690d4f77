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
# the same stage over them. A third, for scale: a file stage over the
# landed windows' own N Parquet files (one folder each), what a user wrote
# before stages over windows. All ran once, so the plans find nothing to
# do. Target: the window plan no slower than the flat file plan (ratio <=
# 1.0).
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
mkdir -p "$BENCH_DIR/w" "$BENCH_DIR/f/data" "$BENCH_DIR/g"
W="$BENCH_DIR/w"
F="$BENCH_DIR/f"
G="$BENCH_DIR/g"
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
cp -r "$W/raw" "$G/raw"
cat > "$G/highwater.toml" <<TOML
[stages.per_file]
inputs = ["raw/orders/**/*.parquet"]
output = "out/{relpath}.txt"
command = ["sh", "-c", "cat \"\$1\" > \"\$0\"", "{output}", "{input}"]
TOML
(cd "$G" && "$HW" run >/dev/null)
# Both plans must find nothing to do, or the comparison means nothing.
(cd "$W" && "$HW" plan | grep -q "discovered $N, 0 changed") || { echo "window plan is not a no-change plan of $N items"; exit 1; }
(cd "$F" && "$HW" plan | grep -q "discovered $N, 0 changed") || { echo "file plan is not a no-change plan of $N items"; exit 1; }
(cd "$G" && "$HW" plan | grep -q "discovered $N, 0 changed") || { echo "landed-files plan is not a no-change plan of $N items"; exit 1; }

# Interleaved rounds (windows, files, landed files, shuffled), each plan timed
# from Python around the process (its spawn included, the same for all).
python3 - "$HW" "$REPEAT" "$N" "$W" "$F" "$G" <<'PY'
import os, random, statistics, subprocess, sys, time
hw, rounds, n_items, dirs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
names = ["windows (by window)", "files", "landed files"]
t = {n: [] for n in names}
order = list(zip(names, dirs))
rng = random.Random(49)
for _ in range(rounds):
    # Each round in another order: whatever runs just before a plan (the
    # landed files' 17 ms of stats) falls on each alike.
    rng.shuffle(order)
    for n, d in order:
        a = time.perf_counter()
        subprocess.run([hw, "plan"], cwd=d, stdout=subprocess.DEVNULL, check=True)
        t[n].append((time.perf_counter() - a) * 1e3)
load = os.getloadavg()[0]
print(f"# no-change plan, {n_items} items, {rounds} interleaved rounds ({os.cpu_count()} cores, load {load:.2f})")
for n in names:
    print(f"{n + ':':21s}best {min(t[n]):.2f} ms, median {statistics.median(t[n]):.2f} ms")
w = t[names[0]]
for n in names[1:]:
    print(f"ratio windows/{n}: best {min(w) / min(t[n]):.3f}, median {statistics.median(w) / statistics.median(t[n]):.3f}")
PY
