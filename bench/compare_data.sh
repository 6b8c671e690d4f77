#!/usr/bin/env bash
# Issue 49: the data digest of a ~1 GB GeoPackage and a ~1 GB Parquet file,
# against the byte hash of the same file and against reading it as a layer,
# interleaved, best of $RUNS, warm page cache; and a no-change plan over
# those files with compare = "data" against compare = "bytes".
#
#   bash bench/compare_data.sh     # RUNS=5, work files in /tmp/highwater-bench/compare
#
# Per file, each round times:
#   b3sum            BLAKE3 of the bytes (b3sum if installed, else `plan` on a
#                    fresh state with compare = "bytes": highwater's own BLAKE3)
#   data-after-layout  `plan` with compare = "data" after a layout-only change
#                    (the GeoPackage VACUUMed with another page_size; the
#                    Parquet file rewritten with zstd and other row groups):
#                    the byte hash, then the data digest, then the plan
#   layer            GDAL reading every feature (`ogrinfo -al -q`, output to
#                    /dev/null) / pyarrow's `pq.read_table` (timed inside Python)
#   noop-bytes, noop-data   a no-change plan of the same file in each mode
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
W=${W:-/tmp/highwater-bench/compare}
PY=${HIGHWATER_TEST_PYTHON:-python3}
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
# HW=path/to/highwater uses that binary instead of a release build.
if [ -z "${HW:-}" ]; then
  [ -n "${GEN_ONLY:-}" ] || cargo build --release -p highwater >/dev/null
  HW=$TARGET/release/highwater
fi
mkdir -p "$W/gen"
cd "$W"

# ---- the files, made once ----
if [ ! -f gen/roads.gpkg ]; then
  "$PY" - <<'EOF'
import json, random
random.seed(7)
fs = []
for i in range(20000):
    x, y = random.uniform(-10, 10), random.uniform(40, 60)
    pts = [[x + k * 0.001, y + k * 0.0013] for k in range(random.randint(2, 8))]
    fs.append({"type": "Feature", "properties": {"name": f"road {i}", "lanes": random.randint(1, 4),
               "speed": random.random() * 100, "surface": random.choice(["asphalt", "gravel", "paved"])},
               "geometry": {"type": "LineString", "coordinates": pts}})
json.dump({"type": "FeatureCollection", "features": fs}, open("gen/seed.geojson", "w"))
EOF
  ogr2ogr -f GPKG gen/roads.gpkg gen/seed.geojson -nln roads -lco SPATIAL_INDEX=NO
  # 20,000 seed features x 250: 5,000,000 rows, attributes varied so that
  # no two rows are equal; then the R-tree spatial index, by GDAL.
  sqlite3 gen/roads.gpkg "
    PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;
    CREATE TEMP TABLE seed AS SELECT geom, name, lanes, speed, surface FROM roads;
    WITH RECURSIVE k(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM k WHERE n < 249)
    INSERT INTO roads(geom, name, lanes, speed, surface)
      SELECT geom, name || ' #' || n, lanes, speed + n, surface FROM seed, k;"
  ogrinfo gen/roads.gpkg -sql "SELECT CreateSpatialIndex('roads', 'geom')" >/dev/null
  cp gen/roads.gpkg gen/roads.layout.gpkg
  sqlite3 gen/roads.layout.gpkg "PRAGMA page_size = 8192; VACUUM;"
fi
if [ ! -f gen/orders.parquet ]; then
  "$PY" - <<'EOF'
import pyarrow as pa, pyarrow.compute as pc, pyarrow.parquet as pq
n = 30_000_000
ids = pa.array(range(n), pa.int64())
t = pa.table({
    "id": ids,
    "amount": pc.multiply(pc.random(n), 1000.0),
    "qty": pc.cast(pc.floor(pc.multiply(pc.random(n), 100.0)), pa.int32()),
    "at": pc.cast(pc.multiply(ids, 1000), pa.timestamp("ms", tz="UTC")),
    "note": pc.binary_join_element_wise("order note ", pc.cast(pc.floor(pc.multiply(pc.random(n), 1e9)), pa.int64()).cast(pa.string()), ""),
})
pq.write_table(t, "gen/orders.parquet", compression="snappy", row_group_size=1_000_000)
pq.write_table(t, "gen/orders.layout.parquet", compression="zstd", row_group_size=250_000)
EOF
fi
ls -l gen/*.gpkg gen/*.parquet
[ -z "${GEN_ONLY:-}" ] || exit 0

# ---- a project per (file, mode); the stage's command does nothing ----
project() { # dir, file, mode
  rm -rf "$1"; mkdir -p "$1/data"
  cp "gen/$2" "$1/data/$2"
  cat > "$1/highwater.toml" <<EOF
[stages.read]
inputs = ["data/*"]
output = "out/{name}.done"
command = ["touch", "{output}"]
observe = false
compare = "$3"
EOF
  (cd "$1" && "$HW" run --json >/dev/null)
  # The copy was written just before that run, inside the racy window of
  # its stat, so its record says "read me again" and every later plan
  # would re-hash the file (0.17-0.36 s a plan, 2026-12-07). A second run,
  # a second later, records it as a nightly plan finds it.
  sleep 1
  (cd "$1" && "$HW" run --json >/dev/null)
}
for f in roads.gpkg orders.parquet; do
  for mode in bytes data; do project "p_${mode}_$f" "$f" "$mode"; done
done

now() { date +%s.%N; }
declare -A T
add() { T[$1]+="$2 "; echo "round $i: $1: $2 s" >&2; }
timed() { # name, command...
  local name=$1; shift
  local t0 t1; t0=$(now); "$@" >/dev/null 2>&1; t1=$(now)
  add "$name" "$(echo "$t1 - $t0" | bc)"
}
hash_bytes() { # file: BLAKE3 of its bytes
  if command -v b3sum >/dev/null; then b3sum --no-names "gen/$1"
  else rm -rf "p_bytes_$1/.highwater"; (cd "p_bytes_$1" && "$HW" plan); fi
}
layer() {
  case $1 in
    *.gpkg) ogrinfo -al -q "gen/$1" ;;
    *.parquet) "$PY" -c "
import time, pyarrow.parquet as pq
t = time.perf_counter(); pq.read_table('gen/$1'); print(time.perf_counter() - t)" ;;
  esac
}

for i in $(seq "$RUNS"); do
  for f in roads.gpkg orders.parquet; do
    stem=${f%.*}; ext=${f##*.}
    timed "$f byte hash (b3sum or plan, compare=bytes)" hash_bytes "$f"
    # Back to the original bytes, recorded; then the layout-only change.
    cp "gen/$f" "p_data_$f/data/$f"; (cd "p_data_$f" && "$HW" run >/dev/null)
    cp "gen/$stem.layout.$ext" "p_data_$f/data/$f"; cat "p_data_$f/data/$f" >/dev/null
    timed "$f plan after layout change (compare=data)" bash -c "cd p_data_$f && '$HW' plan | grep -q 'layout data/$f'"
    (cd "p_data_$f" && "$HW" run >/dev/null)
    if [[ $f == *.parquet ]]; then
      add "$f pyarrow read_table (in-process)" "$(layer "$f")"
    else
      timed "$f ogrinfo -al -q (every feature)" layer "$f"
    fi
    timed "$f no-change plan, compare=bytes" bash -c "cd p_bytes_$f && '$HW' plan"
    timed "$f no-change plan, compare=data" bash -c "cd p_data_$f && '$HW' plan"
  done
done
echo
# Keys hold spaces: one a line. (Each figure is also printed as it is taken,
# above, so a failure here loses nothing.)
while IFS= read -r k; do
  printf '%-52s best %8.3f s   all: %s\n' "$k" "$(echo "${T[$k]}" | tr ' ' '\n' | grep . | sort -g | head -1)" "${T[$k]}"
done < <(printf '%s\n' "${!T[@]}" | sort)
