#!/usr/bin/env bash
# Replication over HTTP and tile serving, each against a peer in the same run:
# 1. Monaco 3048..3076 replicated from a loopback HTTP server (python's
#    http.server over the test data): `highwater osm replicate` against
#    `pyosmium-get-changes` + `osmium apply-changes` on the same server.
# 2. `highwater serve`: 1,000 tile requests (4 at once, keep-alive) over the
#    Monaco tiles, tiles/s and p99 latency, against tileserver-gl-light (npm)
#    if it installs, and against reading the same tiles from the MBTiles with
#    sqlite3 (no HTTP at all: the floor).
#
#   bash bench/serve.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
BENCH_DIR=${BENCH_DIR:-/tmp/highwater-bench}/serve
cargo build --release -q -p highwater
HW="$REPO/target/release/highwater"
DATA="$REPO/crates/highwater-osm/tests/data"
# shellcheck source=scripts/deps.sh
. scripts/deps.sh
deps_pyosmium
PY=$HIGHWATER_TEST_PYTHON
rm -rf "$BENCH_DIR" && mkdir -p "$BENCH_DIR" && cd "$BENCH_DIR"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
secs() { awk -v ns="$1" 'BEGIN { printf "%.3f", ns / 1e9 }'; }
timed() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null 2>&1; t1=$(date +%s%N); secs $((t1 - t0)); }

# --- 1. replication over HTTP -------------------------------------------------
mkdir -p www/replication && cp -r "$DATA/monaco-updates/000" www/replication/
cp www/replication/000/003/076.state.txt www/replication/state.txt
PORT=$(free_port)
(cd www && exec python3 -m http.server "$PORT" --bind 127.0.0.1 >/dev/null 2>&1) &
WWW=$!
trap 'kill $WWW 2>/dev/null || true; kill ${SERVE:-0} 2>/dev/null || true; kill ${TSGL:-0} 2>/dev/null || true' EXIT
sleep 1
URL="http://127.0.0.1:$PORT/replication"
best_hw=""
for _ in 1 2 3; do
    rm -rf hw && mkdir hw
    printf '[osm]\nstore = ".highwater/osm"\n' >hw/highwater.toml
    (cd hw && "$HW" osm import "$DATA/monaco-3047-20210801.osm.pbf" >/dev/null)
    t=$(cd hw && timed "$HW" osm replicate --url "$URL")
    seq=$(cd hw && "$HW" osm status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["sequence"])')
    [ "$seq" = 3076 ] || { echo "highwater reached $seq, not 3076" >&2; exit 1; }
    if [ -z "$best_hw" ] || awk -v a="$t" -v b="$best_hw" 'BEGIN { exit !(a < b) }'; then best_hw=$t; fi
done
best_peer=""
for _ in 1 2 3; do
    rm -f merged.osc.gz out.osm.pbf
    t0=$(date +%s%N)
    "$HIGHWATER_PYOSMIUM_GET_CHANGES" --server "$URL" -I 3047 -o merged.osc.gz >/dev/null
    osmium apply-changes -O "$DATA/monaco-3047-20210801.osm.pbf" merged.osc.gz -o out.osm.pbf
    t=$(secs $(($(date +%s%N) - t0)))
    if [ -z "$best_peer" ] || awk -v a="$t" -v b="$best_peer" 'BEGIN { exit !(a < b) }'; then best_peer=$t; fi
done
echo "# serve benchmark ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores)"
echo "replicate Monaco 3048..3076 over loopback HTTP (best of 3):"
echo "  highwater osm replicate --url:                       ${best_hw} s"
echo "  pyosmium-get-changes + osmium apply-changes (.pbf):   ${best_peer} s"
echo "  ratio: highwater takes $(awk -v a="$best_hw" -v b="$best_peer" 'BEGIN { printf "%.2f", a / b }')x the peers' time"

# --- 2. tiles ------------------------------------------------------------------
mkdir -p tiles && cd tiles
cat >highwater.toml <<'TOML'
[osm]
store = ".highwater/osm"
[osm.tiles.base]
zooms = "10-16"
keys = ["*"]
mbtiles = "tiles/base.mbtiles"
TOML
"$HW" osm import "$DATA/monaco-3047-20210801.osm.pbf" >/dev/null
"$HW" osm tiles build >/dev/null
SPORT=$(free_port)
"$HW" serve --listen "127.0.0.1:$SPORT" 2>/dev/null &
SERVE=$!
sleep 1
cat >load.py <<'PY'
import http.client, sqlite3, sys, threading, time
mode, port, mbtiles, n, conc = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
db = sqlite3.connect(mbtiles)
tiles = [(z, x, (1 << z) - 1 - r) for z, x, r in db.execute("SELECT zoom_level, tile_column, tile_row FROM tiles")]
db.close()
jobs = [tiles[i % len(tiles)] for i in range(n)]
lat, lock = [], threading.Lock()
def http_worker(part, path):
    c = http.client.HTTPConnection("127.0.0.1", int(port))
    for z, x, y in part:
        t0 = time.perf_counter()
        c.request("GET", path.format(z=z, x=x, y=y))
        r = c.getresponse(); r.read()
        assert r.status in (200, 204), r.status
        with lock: lat.append(time.perf_counter() - t0)
def sqlite_worker(part, _):
    c = sqlite3.connect(mbtiles)
    for z, x, y in part:
        t0 = time.perf_counter()
        c.execute("SELECT tile_data FROM tiles WHERE zoom_level=? AND tile_column=? AND tile_row=?", (z, x, (1 << z) - 1 - y)).fetchone()
        with lock: lat.append(time.perf_counter() - t0)
path = {"highwater": "/tiles/base/{z}/{x}/{y}.pbf", "tsgl": "/data/base/{z}/{x}/{y}.pbf"}.get(mode)
worker = sqlite_worker if mode == "sqlite" else http_worker
t0 = time.perf_counter()
ts = [threading.Thread(target=worker, args=(jobs[i::conc], path)) for i in range(conc)]
[t.start() for t in ts]; [t.join() for t in ts]
wall = time.perf_counter() - t0
lat.sort()
print(f"{n / wall:.0f} tiles/s, p50 {lat[len(lat) // 2] * 1000:.2f} ms, p99 {lat[int(len(lat) * 0.99)] * 1000:.2f} ms ({len(tiles)} distinct tiles)")
PY
echo "1,000 tile requests, 4 at once, over the Monaco tiles (z10-16, every key):"
echo "  highwater serve:        $(python3 load.py highwater "$SPORT" tiles/base.mbtiles 1000 4)"
TSGL_BIN=/tmp/tsgl/node_modules/.bin/tileserver-gl
if [ ! -x "$TSGL_BIN" ]; then
    (mkdir -p /tmp/tsgl && cd /tmp/tsgl && timeout 300 npm install --silent tileserver-gl-light >/dev/null 2>&1) || true
fi
if [ -x "$TSGL_BIN" ]; then
    TPORT=$(free_port)
    # Data only: the light package's default config points at styles it
    # does not ship.
    cat >tsgl.json <<'JSON'
{"options": {"paths": {"root": ".", "mbtiles": "tiles", "styles": ".", "fonts": ".", "sprites": ".", "icons": "."}}, "styles": {}, "data": {"base": {"mbtiles": "base.mbtiles"}}}
JSON
    "$TSGL_BIN" -c tsgl.json --port "$TPORT" --bind 127.0.0.1 >/dev/null 2>&1 &
    TSGL=$!
    for _ in $(seq 150); do curl -sf "127.0.0.1:$TPORT/data/base.json" >/dev/null 2>&1 && break; sleep 0.2; done
    echo "  tileserver-gl-light $(cd /tmp/tsgl && node -p 'require("tileserver-gl-light/package.json").version'): $(python3 load.py tsgl "$TPORT" tiles/base.mbtiles 1000 4)"
else
    echo "  tileserver-gl-light:    did not install from npm here; no figure"
fi
echo "  sqlite3, no HTTP:       $(python3 load.py sqlite 0 tiles/base.mbtiles 1000 4)"
