#!/usr/bin/env bash
# Issue 25: OSM at scale on planet-like synthetic extracts made by
# highwater-osmgen (ids in runs spread up to 13 billion, ~0.12 ways/node).
#
#   import: peak RSS (GNU time's maximum resident set), store bytes per node
#           (ways included), elements/s against `osmium cat EXTRACT -o X.pbf`
#           (median of IMPORT_RUNS interleaved runs)
#   diff:   a 2,000-change diff of the same shape (highwater-osmgen diff
#           --nodes of the smallest world: the shared region) applied to every
#           store: `osm apply` wall time, no datasets configured (the store's
#           own apply; see bench/README.md for what that leaves out)
#   minute: a minutely-sized diff (3,300 changes: ~3,000 nodes, ~300 ways)
#           on the largest store
#
# Usage: SIZES="1000000 10000000" CACHE_MB=256 bash bench/osm_scale.sh
# Needs osmium (Debian's osmium-tool) and GNU time. Builds release binaries
# of highwater and highwater-osmgen only.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${SIZES:-"1000000 10000000"}
CACHE_MB=${CACHE_MB:-256}
IMPORT_RUNS=${IMPORT_RUNS:-3}
W=${BENCH_DIR:-/tmp/hw-osm-scale}
mkdir -p "$W"
cargo build -q --release -p highwater -p highwater-osmgen
HW=$PWD/target/release/highwater
GEN=$PWD/target/release/highwater-osmgen
df -h "$W" | tail -1 >&2

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
now() { date +%s.%N; }

cat > "$W/highwater.toml" <<TOML
[osm]
store = "store"
cache_mb = $CACHE_MB
TOML
small=""
for n in $SIZES; do
  [ -n "$small" ] || small=$n
  pbf="$W/w$n.osm.pbf"
  [ -s "$pbf" ] || "$GEN" extract --nodes "$n" --seed 25 | osmium cat -F osm - -o "$pbf" -O
done
"$GEN" diff --nodes "$small" --changes 2000 --seed 25 --diff-seed 1 -o "$W/d2000.osc"
"$GEN" diff --nodes "$small" --changes 3300 --seed 25 --diff-seed 2 -o "$W/minute.osc"

echo "| nodes | elements | peak RSS MiB | store bytes/node | import s | elements/s | osmium cat s | elements/s | ratio |"
echo "|---|---|---|---|---|---|---|---|---|"
for n in $SIZES; do
  pbf="$W/w$n.osm.pbf"
  elems=$(osmium fileinfo -e -g data.count.nodes "$pbf")
  ways=$(osmium fileinfo -e -g data.count.ways "$pbf")
  rels=$(osmium fileinfo -e -g data.count.relations "$pbf")
  total=$((elems + ways + rels))
  ti=(); to=(); rss=()
  for _ in $(seq "$IMPORT_RUNS"); do
    rm -rf "$W/store"
    t0=$(now)
    (cd "$W" && /usr/bin/time -f "%M" -o "$W/rss" "$HW" --config highwater.toml osm import "$pbf" >/dev/null)
    ti+=("$(echo "$(now) - $t0" | bc)"); rss+=("$(cat "$W/rss")")
    t0=$(now)
    osmium cat "$pbf" -o "$W/cat.osm.pbf" -O
    to+=("$(echo "$(now) - $t0" | bc)")
  done
  mi=$(printf '%s\n' "${ti[@]}" | median); mo=$(printf '%s\n' "${to[@]}" | median)
  mr=$(printf '%s\n' "${rss[@]}" | median)
  bytes=$(stat -c %s "$W/store/store.db")
  awk -v n="$elems" -v t="$total" -v r="$mr" -v b="$bytes" -v i="$mi" -v o="$mo" 'BEGIN {
    printf "| %d | %d | %.0f | %.1f | %.2f | %.0f | %.2f | %.0f | %.2fx |\n", n, t, r/1024, b/n, i, t/i, o, t/o, o/i }'
  echo "  runs: import ${ti[*]} s; osmium ${to[*]} s; rss ${rss[*]} KiB" >&2
  cp -r "$W/store" "$W/store$n"
done

echo
echo "| store nodes | diff | changes | apply s (median of 3, fresh copy each) |"
echo "|---|---|---|---|"
for n in $SIZES; do
  for d in d2000 minute; do
    ts=()
    for _ in 1 2 3; do
      rm -rf "$W/store"; cp -r "$W/store$n" "$W/store"
      t0=$(now)
      (cd "$W" && "$HW" --config highwater.toml osm apply "$W/$d.osc" >/dev/null)
      ts+=("$(echo "$(now) - $t0" | bc)")
    done
    c=$(grep -c '<node \|<way ' "$W/$d.osc")
    echo "| $n | $d | $c | $(printf '%s\n' "${ts[@]}" | median) |"
    echo "  runs: ${ts[*]} s" >&2
  done
done
