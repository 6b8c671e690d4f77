#!/usr/bin/env bash
# Derived datasets (issue 5): for each diff, the time to bring each dataset
# current incrementally (vector tiles, search index, aggregates) against its
# full rebuild from the same store, in the same run; the share of changes
# filtered early; tiles re-cut per diff; and the crossover (the diff size at
# which a rebuild would be as fast). Timelines: Liechtenstein 2434 + daily
# 2435..2437, Liechtenstein 2434 -> 3402 (about three years in one derived
# diff), Monaco 2787 -> 2947 -> 3047 (derived) then daily 3048..3076.
# Reads the larger files from ../shared/data/osm.
#
#   bash bench/osm-datasets.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${OSM_DATA:-../shared/data/osm}
[ -d "$DATA" ] || { echo "no OSM data at $DATA (set OSM_DATA)" >&2; exit 2; }
DATA=$(cd "$DATA" && pwd)
cargo build --release -q -p highwater
HW="$PWD/target/release/highwater" W="${BENCH_DIR:-/tmp/highwater-bench}/datasets" DATA="$DATA" python3 - <<'PY'
import json, os, shutil, subprocess, time

HW, W, DATA = os.environ["HW"], os.environ["W"], os.environ["DATA"]
CONFIG = """
[osm]
store = "store"

[osm.tiles.base]
zooms = "10-16"
keys = ["building", "highway", "landuse", "name", "amenity", "natural", "waterway", "railway"]
buffer = 0.1
diff_expire = true
mbtiles = "base.mbtiles"
# Always drain here, to time the incremental path against the rebuild.
drain_rebuild_share = 1000

[osm.search.places]
index = "search"

[osm.aggregates.admin]
classes = ["building", "highway=*"]
admin_levels = [2, 4, 6, 8]
"""

def hw(*args):
    t = time.perf_counter()
    out = subprocess.run([HW, *args], cwd=W, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: {out.stderr}")
    lines = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    return lines, time.perf_counter() - t

def rebuild_ms():
    ms = {}
    for name in ["base", "places", "admin"]:
        lines, _ = hw("osm", "rebuild", name, "--json")
        ms[name] = lines[-1]["elapsed_ms"]
    return ms

def timeline(title, base, diffs):
    shutil.rmtree(W, ignore_errors=True)
    os.makedirs(W)
    open(f"{W}/highwater.toml", "w").write(CONFIG)
    hw("osm", "import", base)
    first = rebuild_ms()
    print(f"\n## {title}\n")
    print(f"full build at the base: tiles {first['base']} ms, search {first['places']} ms, aggregates {first['admin']} ms\n")
    print("| diff | changes | filtered early | tiles re-cut | tiles inc / rebuild ms | search inc / rebuild ms (reindexed) | aggregates inc / rebuild ms (changed) | derive+apply+drain s |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for d in diffs:
        lines, wall = hw("osm", "apply", d, "--json")
        rep = lines[0]["datasets"][0]
        inc = {}
        for l in lines[1:]:
            if "drain" in l:
                inc["base"] = (l["elapsed_ms"], l["drain"]["recut"])
            elif "search" in l:
                inc["places"] = (l["elapsed_ms"], l["search"]["reindexed"])
            elif "aggregates" in l:
                inc["admin"] = (l["elapsed_ms"], l["aggregates"]["changed"])
        full = rebuild_ms()
        share = rep["filtered"] / rep["changes"] if rep["changes"] else 0
        name = os.path.basename(d)
        rows.append((rep["changes"], inc, full))
        print(f"| {name} | {rep['changes']} | {share:.0%} | {inc['base'][1]} | {inc['base'][0]} / {full['base']} "
              f"| {inc['places'][0]} / {full['places']} ({inc['places'][1]}) | {inc['admin'][0]} / {full['admin']} ({inc['admin'][1]}) | {wall:.2f} |")
    # Crossover, a rough linear estimate: incremental time taken as
    # proportional to the number of changes, through the largest diff of
    # the timeline (the three-year Liechtenstein diff measures it directly).
    big = max(rows, key=lambda r: r[0])
    print()
    for key, label in [("base", "tiles"), ("places", "search"), ("admin", "aggregates")]:
        inc_ms = max(big[1][key][0], 1)
        cross = big[0] * big[2][key] / inc_ms
        print(f"crossover {label}: a rebuild pays off beyond about {cross:,.0f} changes per diff "
              f"(largest diff here: {big[0]} changes, {inc_ms} ms incremental vs {big[2][key]} ms rebuild)")

print(f"# Derived datasets benchmark ({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, {os.cpu_count()} cores)")
L = f"{DATA}/liechtenstein"
timeline("Liechtenstein 2434 + daily 2435..2437", f"{L}/liechtenstein-2434-20191118.osm.pbf",
         [f"{L}/liechtenstein-updates/000/002/{s}.osc.gz" for s in (435, 436, 437)])
timeline("Liechtenstein 2434 -> 3402 (one derived diff, about three years)", f"{L}/liechtenstein-2434-20191118.osm.pbf",
         [f"{L}/derived/liechtenstein-2434__to__3402.osc.gz"])
M = f"{DATA}/monaco"
timeline("Monaco 2787 -> 2947 -> 3047 (derived) then daily 3048..3076", f"{M}/monaco-2787-20201109.osm.pbf",
         [f"{M}/derived/monaco-2787__to__2947.osc.gz", f"{M}/derived/monaco-2947__to__3047.osc.gz"]
         + [f"{M}/monaco-updates/000/003/{s:03}.osc.gz" for s in range(48, 77)])
PY
