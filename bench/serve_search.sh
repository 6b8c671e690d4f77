#!/usr/bin/env bash
# Issue 50: `GET /search` of `highwater serve` against `highwater osm
# search` run per query (a process each: open the config, the index,
# answer, exit), on Monaco's search dataset, 4 clients at once for both,
# the same query list, rounds interleaved (HTTP, then processes, ROUNDS
# times). HTTP load: bench/load.rs (4 keep-alive connections, a thread
# each); processes: 4 threads each running the command in turn.
# Prints queries/s and p50/p99 per round and their ratio.
#
#   bash bench/serve_search.sh          (ROUNDS=3 N_HTTP=4000 N_CLI=200)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
BENCH_DIR=${BENCH_DIR:-/tmp/highwater-bench}/serve_search
HW=${HW:-$REPO/target/release/highwater}
[ -x "$HW" ] || cargo build --release -q -p highwater
ROUNDS=${ROUNDS:-3}
N_HTTP=${N_HTTP:-4000}
N_CLI=${N_CLI:-200}
DATA="$REPO/crates/highwater-osm/tests/data"
rm -rf "$BENCH_DIR" && mkdir -p "$BENCH_DIR" && cd "$BENCH_DIR"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do python3 -c "import socket; socket.create_connection(('127.0.0.1', $1))" 2>/dev/null && return; sleep 0.1; done; echo "nothing listens on $1" >&2; exit 1; }
trap 'kill ${SERVE:-0} 2>/dev/null || true' EXIT

rustc --edition 2021 -O -o load "$REPO/bench/load.rs"

cat >highwater.toml <<'TOML'
[osm]
store = ".highwater/osm"
[osm.search.places]
index = "search/places"
TOML
"$HW" osm import "$DATA/monaco-3047-20210801.osm.pbf" >/dev/null
"$HW" osm rebuild places >/dev/null
# The queries: one word or a quoted phrase each, URL-encoded for HTTP
# (load.rs takes "z x y" lines; {z} is the query, x and y unused).
QUERIES=(Casino Fontvieille Grimaldi Boulevard Hôtel Port Avenue Monte Rue Princesse Jardin Place)
: >queries.txt
for q in "${QUERIES[@]}"; do
  printf '%s 0 0\n' "$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1]))' "$q")" >>queries.txt
done
printf '%s\n' "${QUERIES[@]}" >queries.plain
PORT=$(free_port)
"$HW" serve --listen "127.0.0.1:$PORT" 2>serve.log &
SERVE=$!
wait_port "$PORT"
# Warm: the first request opens the index.
./load "$PORT" "/search?q={z}&limit=10" queries.txt 48 4 >/dev/null

cli_round() {
  python3 - "$HW" "$N_CLI" <<'PY'
import subprocess, sys, threading, time
hw, n = sys.argv[1], int(sys.argv[2])
qs = [l.strip() for l in open("queries.plain") if l.strip()]
lat, lock = [], threading.Lock()
def client(c):
    for i in range(c, n, 4):
        t = time.perf_counter()
        subprocess.run([hw, "osm", "search", qs[i % len(qs)], "--limit", "10", "--json"],
                       check=True, stdout=subprocess.DEVNULL)
        with lock:
            lat.append(time.perf_counter() - t)
t0 = time.perf_counter()
ts = [threading.Thread(target=client, args=(c,)) for c in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
el = time.perf_counter() - t0
lat.sort()
print(f"{n / el:.1f} {lat[len(lat) // 2] * 1000:.2f} {lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000:.2f}")
PY
}

echo "round  http q/s  p50 ms  p99 ms | osm search q/s  p50 ms  p99 ms | ratio"
for r in $(seq "$ROUNDS"); do
  read -r hq hp50 hp99 < <(./load "$PORT" "/search?q={z}&limit=10" queries.txt "$N_HTTP" 4)
  read -r cq cp50 cp99 < <(cli_round)
  ratio=$(python3 -c "print(f'{$hq / $cq:.0f}')")
  echo "$r      $hq  $hp50  $hp99 | $cq  $cp50  $cp99 | ${ratio}x"
done
