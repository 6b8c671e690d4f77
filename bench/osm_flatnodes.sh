#!/usr/bin/env bash
# Issue 25: flat nodes against node blocks on a real extract (default: the
# 2.1M-node merged seven-region file of ../shared/data/osm/scale, ids up to
# 13.7 billion). Per mode, the median of RUNS interleaved imports:
#
#   import s, elements/s and its ratio to `osmium cat EXTRACT -o X.pbf`
#   store bytes per node (store.db, ways and relations included)
#   flat file bytes per node on disk (allocated blocks: holes are free)
#   the rule's verdict as `osm import` prints it (stderr)
#
# Usage: RUNS=3 bash bench/osm_flatnodes.sh [EXTRACT]
# Needs osmium (Debian's osmium-tool). Builds the release binary of
# highwater only. No timed assertion anywhere: it prints figures.
set -euo pipefail
cd "$(dirname "$0")/.."
PBF=${1:-../shared/data/osm/scale/merged-7regions-2025.osm.pbf}
[ -e "$PBF" ] || PBF=/work/shared/data/osm/scale/merged-7regions-2025.osm.pbf
PBF=$(realpath "$PBF")
RUNS=${RUNS:-3}
W=${BENCH_DIR:-/tmp/hw-osm-flat}
T=${CARGO_TARGET_DIR:-$PWD/target}
mkdir -p "$W/blocks" "$W/flat/ff"
cargo build -q --release -p highwater
HW=$T/release/highwater
df -h "$W" | tail -1 >&2

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
now() { date +%s.%N; }

printf '[osm]\nstore = "store"\n' > "$W/blocks/highwater.toml"
printf '[osm]\nstore = "store"\nflat_nodes = "ff/nodes.flat"\n' > "$W/flat/highwater.toml"

: > "$W/times.txt"
for run in $(seq "$RUNS"); do
  for mode in blocks flat; do
    d=$W/$mode
    rm -rf "$d/store" "$d/ff/nodes.flat" "$d/ff/nodes.flat.undo"
    t0=$(now)
    (cd "$d" && "$HW" osm import "$PBF" > out.txt 2> err.txt)
    t1=$(now)
    echo "$mode $(echo "$t1 - $t0" | bc)" >> "$W/times.txt"
  done
  t0=$(now)
  osmium cat "$PBF" -o "$W/cat.osm.pbf" --overwrite
  t1=$(now)
  echo "osmium $(echo "$t1 - $t0" | bc)" >> "$W/times.txt"
done

elements=$(awk '/^imported/ {print $2 + $4 + $6}' "$W/blocks/out.txt")
nodes=$(awk '/^imported/ {print $2}' "$W/blocks/out.txt")
osm_s=$(awk '$1 == "osmium" {print $2}' "$W/times.txt" | median)
echo "extract: $PBF ($nodes nodes, $elements elements); osmium cat: $osm_s s"
printf '%-7s %9s %12s %9s %15s %15s %15s\n' mode import_s elements/s x_osmium store_B/node flat_B/node total_B/node
for mode in blocks flat; do
  d=$W/$mode
  s=$(awk -v m=$mode '$1 == m {print $2}' "$W/times.txt" | median)
  store=$(du -sb --apparent-size "$d/store" | cut -f1)
  flat=0
  [ -e "$d/ff/nodes.flat" ] && flat=$(du -B1 "$d/ff/nodes.flat" | cut -f1)
  awk -v m=$mode -v s="$s" -v e="$elements" -v o="$osm_s" -v n="$nodes" -v st="$store" -v f="$flat" 'BEGIN {
    printf "%-7s %9.2f %12.0f %9.2f %15.1f %15.1f %15.1f\n", m, s, e / s, o / s, st / n, f / n, (st + f) / n }'
  sed 's/^/  stderr: /' "$d/err.txt"
done
