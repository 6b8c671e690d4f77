#!/usr/bin/env bash
# Issue 23: serving tiles, three measurements in one run.
# 1. A dirty z14 tile served fresh (cut from the store; the first request
#    per tile, then from memory) against a clean tile, p50/p99, same run.
# 2. Clean tiles: `highwater serve` against martin (the Rust tile server,
#    `cargo install martin@1.14.0 --locked --no-default-features
#    --features mbtiles`) on the same MBTiles file, 4 clients at once
#    (4 keep-alive connections, a thread each, of bench/load.rs: a compiled
#    client light enough that the servers, not it, take the cores), the
#    same request list for both, rounds interleaved, each server's own CPU
#    per tile read from /proc.
# 3. The Zipf simulation: over the Liechtenstein pyramid, a day of requests
#    drawn from a Zipf mix; how many tiles of the dirty set would be re-cut
#    on request, against a full drain of the whole dirty set.
#
#   MARTIN=/path/to/martin bash bench/serve_tiles.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
BENCH_DIR=${BENCH_DIR:-/tmp/highwater-bench}/serve_tiles
HW=${HW:-$REPO/target/release/highwater}
[ -x "$HW" ] || cargo build --release -q -p highwater
MARTIN=${MARTIN:-martin}
if ! [ -x "$MARTIN" ]; then MARTIN=$(command -v "$MARTIN" || echo "$MARTIN"); fi
DATA="$REPO/crates/highwater-osm/tests/data"
LIE=${LIE:-/work/shared/data/osm/liechtenstein}
rm -rf "$BENCH_DIR" && mkdir -p "$BENCH_DIR" && cd "$BENCH_DIR"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do python3 -c "import socket; socket.create_connection(('127.0.0.1', $1))" 2>/dev/null && return; sleep 0.1; done; echo "nothing listens on $1" >&2; exit 1; }
trap 'kill ${SERVE:-0} ${MART:-0} 2>/dev/null || true' EXIT

# The load generator: `load PORT PATH_TEMPLATE TILES_FILE N CLIENTS` ->
# "tiles/s p50_ms p99_ms" (bench/load.rs, no dependencies).
rustc --edition 2021 -O -o load "$REPO/bench/load.rs"
LOAD=$PWD/load

# --- 1 and 2: Monaco, z12-14 ---------------------------------------------------
mkdir mon && cd mon
cat >highwater.toml <<'TOML'
[osm]
store = ".highwater/osm"
[osm.tiles.base]
zooms = "10-16"
keys = ["building", "highway", "landuse", "natural", "waterway", "railway"]
mbtiles = "tiles/base.mbtiles"
drain = "deferred"
affected_guard = 0
TOML
"$HW" osm import "$DATA/monaco-3047-20210801.osm.pbf" >/dev/null
"$HW" osm tiles build >/dev/null
sqlite3 tiles/base.mbtiles "SELECT zoom_level, tile_column, (1 << zoom_level) - 1 - tile_row FROM tiles" | tr '|' ' ' >all.txt
cp -r "$DATA/monaco-updates" updates
"$HW" osm replicate --from updates >/dev/null
sqlite3 .highwater/osm/store.db "SELECT z, x, y FROM dirty WHERE dataset = 'base' AND z = 14" | tr '|' ' ' >dirty14.txt
sqlite3 .highwater/osm/store.db "SELECT z, x, y FROM dirty WHERE dataset = 'base'" | tr '|' ' ' | sort >dirty.txt
sort all.txt | comm -23 - dirty.txt | awk '$1 == 14' >clean14.txt
sort all.txt | comm -23 - dirty.txt >clean.txt
echo "Monaco after 3048..3076 deferred: $(wc -l <all.txt) tiles, $(wc -l <dirty.txt) dirty ($(wc -l <dirty14.txt) at z14)"
PORT=$(free_port)
"$HW" serve --listen "127.0.0.1:$PORT" 2>serve.log &
SERVE=$!
wait_port "$PORT"
T="/tiles/base/{z}/{x}/{y}.pbf"
n14=$(wc -l <dirty14.txt)
echo "1. one client, z14 (p50 / p99 ms):"
echo "   dirty, first request (cut fresh): $("$LOAD" "$PORT" "$T" dirty14.txt "$n14" 1)"
echo "   dirty, again (fresh, from memory): $("$LOAD" "$PORT" "$T" dirty14.txt 20000 1)"
echo "   clean (stored):                    $("$LOAD" "$PORT" "$T" clean14.txt 20000 1)"

if [ -x "$MARTIN" ]; then
    MPORT=$(free_port)
    "$MARTIN" --listen-addresses "127.0.0.1:$MPORT" tiles/base.mbtiles >martin.log 2>&1 &
    MART=$!
    wait_port "$MPORT"
    M="/base/{z}/{x}/{y}"
    # Rounds of 400,000: a round of 100,000 lasts about a second, and the
    # kernel's placement of client and server threads, which moves both
    # servers' tiles/s by up to 2x, does not average out (bench/README.md).
    ROUNDS=${ROUNDS:-9}; PER=${PER_ROUND:-400000}
    echo "2. clean tiles, 4 clients, $PER requests per round, $ROUNDS rounds interleaved, who goes first alternating (tiles/s p50_ms p99_ms server_cpu_us_per_tile):"
    : >ratios.txt; : >cpu.txt
    # The server's own CPU (user + system ticks from /proc) per round: what a
    # tile costs the server, apart from the load generator sharing the cores.
    ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
    hz=$(getconf CLK_TCK)
    round() { # PID PORT TEMPLATE -> "tiles/s p50 p99 cpu_us_per_tile"
        local t0 out t1; t0=$(ticks "$1")
        out=$("$LOAD" "$2" "$3" clean.txt "$PER" 4)
        t1=$(ticks "$1")
        echo "$out $(awk -v d=$((t1 - t0)) -v hz="$hz" -v n="$PER" 'BEGIN { printf "%.1f", d / hz * 1e6 / n }')"
    }
    for r in $(seq "$ROUNDS"); do
        if [ $((r % 2)) = 1 ]; then
            h=$(round "$SERVE" "$PORT" "$T"); m=$(round "$MART" "$MPORT" "$M")
        else
            m=$(round "$MART" "$MPORT" "$M"); h=$(round "$SERVE" "$PORT" "$T")
        fi
        echo "   round $r highwater: $h"
        echo "   round $r martin:    $m"
        echo "${h%% *} ${m%% *}" | awk '{ printf "%.3f\n", $1 / $2 }' >>ratios.txt
        echo "$h $m" | awk '{ print $4, $8 }' >>cpu.txt
    done
    echo "   highwater / martin tiles/s per round: $(sort -n ratios.txt | tr '\n' ' '); median $(sort -n ratios.txt | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')x"
    echo "   server CPU per tile (us), summed over the rounds: $(awk '{ h += $1; m += $2 } END { printf "highwater %.1f, martin %.1f: martin / highwater %.2fx", h / NR, m / NR, m / h }' cpu.txt)"
    kill $MART
else
    echo "2. skipped: no martin at $MARTIN"
fi
kill $SERVE; wait $SERVE 2>/dev/null || true
cd ..

# --- 3: Zipf over the Liechtenstein pyramid -------------------------------------
# (SKIP_ZIPF=1 stops here: parts 1 and 2 only.)
[ "${SKIP_ZIPF:-0}" = 1 ] && exit 0
mkdir lie && cd lie
cat >highwater.toml <<'TOML'
[osm]
store = ".highwater/osm"
[osm.tiles.base]
zooms = "0-16"
keys = ["building", "highway", "landuse", "natural", "waterway", "railway", "place"]
mbtiles = "tiles/base.mbtiles"
drain = "deferred"
affected_guard = 0
TOML
"$HW" osm import "$LIE/liechtenstein-2434-20191118.osm.pbf" >/dev/null
"$HW" osm tiles build >/dev/null
# The dirty set: the daily diffs after the extract (2435..2437) dirty no
# tile at these keys, so the three-year derived diff 2434 -> 3402 stands in
# for a busy period's backlog.
"$HW" osm apply "$LIE/derived/liechtenstein-2434__to__3402.osc.gz" >/dev/null
sqlite3 tiles/base.mbtiles "SELECT zoom_level, tile_column, (1 << zoom_level) - 1 - tile_row FROM tiles" | tr '|' ' ' >all.txt
sqlite3 .highwater/osm/store.db "SELECT z, x, y FROM dirty WHERE dataset = 'base'" | tr '|' ' ' >dirty.txt
python3 - all.txt dirty.txt <<'PY'
# The mix: tiles ranked by popularity = low zoom first (a map opens
# zoomed out), then by distance from Vaduz's centre at each zoom; request
# probability of rank r is 1/r^s (Zipf), s = 1.0 and 1.2; a day = 100,000
# requests (what one busy regional map sees). Counted: distinct dirty tiles
# hit (what drain-on-request re-cuts) against the whole dirty set.
import math, random, sys
tiles = [tuple(map(int, l.split())) for l in open(sys.argv[1])]
dirty = {tuple(map(int, l.split())) for l in open(sys.argv[2])}
def lonlat(z, x, y):
    n = 2 ** z
    lon = (x + .5) / n * 360 - 180
    lat = math.degrees(math.atan(math.sinh(math.pi * (1 - 2 * (y + .5) / n))))
    return lon, lat
vaduz = (9.5209, 47.1410)
tiles.sort(key=lambda t: (t[0], (lonlat(*t)[0] - vaduz[0]) ** 2 + (lonlat(*t)[1] - vaduz[1]) ** 2))
print(f"3. Liechtenstein: {len(tiles)} tiles, {len(dirty)} dirty after 2434 -> 3402")
for s in (1.0, 1.2):
    w = [1 / (r + 1) ** s for r in range(len(tiles))]
    random.seed(23)
    for n in (10_000, 100_000):
        hit = set(random.choices(tiles, weights=w, k=n))
        d = len(hit & dirty)
        print(f"   Zipf s={s}, {n} requests: {len(hit)} distinct tiles asked, {d} of them dirty: re-cut on request {d} vs full drain {len(dirty)} ({d / max(1, len(dirty)) * 100:.1f}%)")
PY
