#!/usr/bin/env bash
# OSM benchmark, each figure against a peer tool in the same run:
#   import:  `highwater osm import` vs `osmium cat EXTRACT -f opl -o /dev/null`
#   per diff: derive + apply (`highwater osm apply`, best of 3) vs `osmium apply-changes`
#             (which derives nothing), on Liechtenstein 2434 + 2435..2437 and
#             on the derived Monaco diffs 2787 -> 2947 -> 3047, zooms 10-16;
#   tiles:   the number of z/x/y lines expired, and osm2pgsql's
#            `--append --slim --expire-tiles=10-16` figures when osm2pgsql
#            and PostGIS are installed (they are not needed otherwise).
# Reads the larger files from ../shared/data/osm (not in the repository).
#
#   bash bench/osm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${OSM_DATA:-../shared/data/osm}
[ -d "$DATA" ] || { echo "no OSM data at $DATA (set OSM_DATA)" >&2; exit 2; }
DATA=$(cd "$DATA" && pwd)
command -v osmium >/dev/null || { echo "osmium is needed: apt-get install osmium-tool" >&2; exit 2; }
cargo build --release -q -p highwater
HW="$PWD/target/release/highwater"
W=${BENCH_DIR:-/tmp/highwater-bench}/osm
rm -rf "$W" && mkdir -p "$W"
cat > "$W/highwater.toml" <<'TOML'
[osm]
store = "store"

[osm.tiles.base]
zooms = "10-16"
keys = ["*"]
buffer = 0
diff_expire = true
TOML
# The same layer expiring every tile the old or new feature touches, for
# the count only (a dry run against the same store).
sed 's/diff_expire = true/diff_expire = false/' "$W/highwater.toml" > "$W/full.toml"
secs() { awk -v ns="$1" 'BEGIN { printf "%.3f", ns / 1e9 }'; }
t() { local a b; a=$(date +%s%N); "$@" >/dev/null 2>&1; b=$(date +%s%N); secs $((b - a)); }
min() { if [ -z "$1" ]; then echo "$2"; else awk -v a="$1" -v b="$2" 'BEGIN { print (a < b ? a : b) }'; fi; }
echo "# OSM benchmark ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores)"

run_timeline() { # name base.pbf diff...
    local name=$1 base=$2
    shift 2
    rm -rf "$W/store" "$W/cur.pbf"
    local elems
    elems=$(osmium fileinfo -e -g data.count.nodes "$base")
    elems=$((elems + $(osmium fileinfo -e -g data.count.ways "$base") + $(osmium fileinfo -e -g data.count.relations "$base")))
    local ti to
    ti=$(cd "$W" && t "$HW" osm import "$base")
    to=$(t osmium cat "$base" -f opl -o /dev/null -O)
    echo
    echo "## $name"
    echo "import: highwater $ti s ($(awk -v n="$elems" -v s="$ti" 'BEGIN { printf "%.0f", n / s }') elements/s), osmium cat $to s ($(awk -v n="$elems" -v s="$to" 'BEGIN { printf "%.0f", n / s }') elements/s)"
    cp "$base" "$W/cur.pbf"
    for d in "$@"; do
        local th tosm tiles full
        (cd "$W" && "$HW" osm apply --config full.toml --dry-run "$d" --expire-output "$W/full.txt" >/dev/null 2>&1)
        full=$(wc -l < "$W/full.txt")
        # Best of three, each on a fresh copy of the store (apply moves it).
        th=
        for _ in 1 2 3; do
            rm -rf "$W/try" && cp -r "$W/store" "$W/try"
            th=$(min "$th" "$(cd "$W" && t "$HW" osm apply --store try "$d" --expire-output "$W/expire.txt")")
        done
        rm -rf "$W/store" && mv "$W/try" "$W/store"
        tiles=$(wc -l < "$W/expire.txt")
        tosm=
        for _ in 1 2 3; do
            tosm=$(min "$tosm" "$(t osmium apply-changes "$W/cur.pbf" "$d" -o "$W/next.pbf" -O)")
        done
        mv "$W/next.pbf" "$W/cur.pbf"
        echo "diff $(basename "$d"): derive+apply $th s; osmium apply-changes $tosm s (ratio $(awk -v a="$th" -v b="$tosm" 'BEGIN { printf "%.2f", a / b }')x); $tiles tiles expired at z10-16 ($full without diff_expire)"
    done
}

L="$DATA/liechtenstein"
run_timeline "Liechtenstein 2434 + 2435..2437" "$L/liechtenstein-2434-20191118.osm.pbf" \
    "$L/liechtenstein-updates/000/002/435.osc.gz" "$L/liechtenstein-updates/000/002/436.osc.gz" \
    "$L/liechtenstein-updates/000/002/437.osc.gz"
M="$DATA/monaco"
run_timeline "Monaco 2787 -> 2947 -> 3047 (derived diffs)" "$M/monaco-2787-20201109.osm.pbf" \
    "$M/derived/monaco-2787__to__2947.osc.gz" "$M/derived/monaco-2947__to__3047.osc.gz"

if command -v osm2pgsql >/dev/null && ls /usr/lib/postgresql/*/lib/postgis-3.so >/dev/null 2>&1; then
    . scripts/pg.sh
    pg_start
    psql -q -c "CREATE EXTENSION postgis; CREATE EXTENSION hstore;"
    echo
    echo "## osm2pgsql --slim, --append --expire-tiles=10-16 (default style)"
    osm2pgsql -c --slim -O pgsql --number-processes 2 "$L/liechtenstein-2434-20191118.osm.pbf" >/dev/null 2>&1
    for d in 435 436 437; do
        a=$(date +%s%N)
        osm2pgsql --append --slim --number-processes 2 --expire-tiles=10-16 --expire-output="$W/o2p-$d.txt" \
            "$L/liechtenstein-updates/000/002/$d.osc.gz" >/dev/null 2>&1
        b=$(date +%s%N)
        echo "diff $d.osc.gz: osm2pgsql --append $(secs $((b - a))) s; $(sort -u "$W/o2p-$d.txt" | wc -l) tiles expired"
    done
    osm2pgsql -c --slim -O pgsql --number-processes 2 "$M/monaco-2787-20201109.osm.pbf" >/dev/null 2>&1
    for d in monaco-2787__to__2947 monaco-2947__to__3047; do
        a=$(date +%s%N)
        osm2pgsql --append --slim --number-processes 2 --expire-tiles=10-16 --expire-output="$W/o2p-$d.txt" \
            "$M/derived/$d.osc.gz" >/dev/null 2>&1
        b=$(date +%s%N)
        echo "diff $d.osc.gz: osm2pgsql --append $(secs $((b - a))) s; $(sort -u "$W/o2p-$d.txt" | wc -l) tiles expired"
    done
else
    echo
    echo "osm2pgsql or PostGIS not installed: apt-get install osm2pgsql postgresql-15-postgis-3 to compare"
fi
