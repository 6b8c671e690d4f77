#!/usr/bin/env bash
# Issue 25: what a diff costs, apply plus drain of every derived dataset,
# as the rest of the world grows. Planet-like synthetic worlds made by
# highwater-osmgen (a smaller world is a larger one's shared region); the
# same diffs (made on the smallest world) applied to each:
#
#   d2000:  2,000 changes                       (issue: at most 1.3x from 1M to 10M)
#   minute: 3,300 changes, ~3,000 nodes and ~300 ways, the planet's minutely rate
#           (issue: under 1 s on the largest store)
#
# Datasets: Shortbread tiles z0-14 (MBTiles), the search index, aggregates.
# Each apply runs on a fresh copy of the store and its datasets, the sizes
# interleaved round by round (load on the machine moves absolute times;
# interleaving keeps the ratio honest). Reported: the wall time of
# `osm apply --json` (derive, apply, and each dataset's drain), and each
# dataset's own elapsed_ms, medians of ROUNDS.
#
# Usage: SIZES="1000000 10000000" ROUNDS=5 bash bench/osm_scale_datasets.sh
# Needs osmium (Debian's osmium-tool). Builds release binaries of highwater
# and highwater-osmgen. Scratch in BENCH_DIR (default /tmp/hw-osm-scale-ds).
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${SIZES:-"1000000 10000000"}
ROUNDS=${ROUNDS:-5}
W=${BENCH_DIR:-/tmp/hw-osm-scale-ds}
mkdir -p "$W"
cargo build -q --release -p highwater -p highwater-osmgen
HW=$PWD/target/release/highwater GEN=$PWD/target/release/highwater-osmgen \
W="$W" SIZES="$SIZES" ROUNDS="$ROUNDS" python3 - <<'PY'
import json, os, shutil, statistics, subprocess, time

HW, GEN, W = os.environ["HW"], os.environ["GEN"], os.environ["W"]
SIZES = [int(s) for s in os.environ["SIZES"].split()]
ROUNDS = int(os.environ["ROUNDS"])
CONFIG = """
[osm]
store = "store"

[osm.tiles.base]
schema = "shortbread"
mbtiles = "base.mbtiles"
# Every dirty tile is re-cut, never a rebuild in its place: this measures
# the incremental path.
drain_rebuild_share = 1000
tiles_affected_max = 10000000

[osm.search.places]
index = "search"

[osm.aggregates.admin]
classes = ["building", "highway=*"]
"""
DATASETS = {"base": "tiles", "places": "search", "admin": "aggregates"}


def sh(*args, cwd=None):
    r = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited {r.returncode}: {r.stderr[-2000:]}")
    return r.stdout


def world(n):
    pbf = f"{W}/w{n}.osm.pbf"
    if not os.path.exists(pbf):
        sh("bash", "-c", f"'{GEN}' extract --nodes {n} --seed 25 | osmium cat -F osm - -o '{pbf}' -O")
    return pbf


def built(n):
    """The world of n nodes imported and its datasets built, kept as a
    folder that each apply copies."""
    d = f"{W}/built{n}"
    if os.path.exists(f"{d}/done"):
        return d
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    open(f"{d}/highwater.toml", "w").write(CONFIG)
    t = time.perf_counter()
    sh(HW, "osm", "import", world(n), cwd=d)
    imp = time.perf_counter() - t
    builds = {}
    for name in DATASETS:
        t = time.perf_counter()
        sh(HW, "osm", "rebuild", name, cwd=d)
        builds[name] = time.perf_counter() - t
    print(f"  world {n:,} nodes: import {imp:.1f} s; rebuild "
          + ", ".join(f"{DATASETS[k]} {v:.1f} s" for k, v in builds.items()), flush=True)
    open(f"{d}/done", "w").write("")
    return d


def apply(n, osc):
    d = f"{W}/run"
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(built(n), d)
    # The copy's pages written out first: else the apply's fsync pays for
    # writing the whole copied store, and larger stores look slower.
    os.sync()
    time.sleep(1)
    t = time.perf_counter()
    out = sh(HW, "osm", "apply", osc, "--json", cwd=d)
    wall = time.perf_counter() - t
    lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    per = {}
    # One line per dataset after the apply's report, its outcome under
    # its kind's key ("drain" for tiles) with the dataset's name.
    for l in lines[1:]:
        for key in ("drain", "search", "aggregates"):
            if key in l:
                per[l[key]["dataset"]] = l["elapsed_ms"] / 1000
    missing = set(DATASETS) - set(per)
    if missing:
        raise SystemExit(f"osm apply reported no drain of {sorted(missing)}: {out}")
    return wall, per


small = SIZES[0]
for n in SIZES:
    built(n)
diffs = {}
for name, changes, seed in [("d2000", 2000, 1), ("minute", 3300, 2)]:
    osc = f"{W}/{name}.osc"
    if not os.path.exists(osc):
        sh(GEN, "diff", "--nodes", str(small), "--changes", str(changes), "--seed", "25",
           "--diff-seed", str(seed), "-o", osc)
    diffs[name] = osc

res = {(d, n): [] for d in diffs for n in SIZES}
for r in range(ROUNDS):
    for d, osc in diffs.items():
        order = SIZES if r % 2 == 0 else list(reversed(SIZES))
        for n in order:
            res[(d, n)].append(apply(n, osc))

print(f"\n# apply + drain, medians of {ROUNDS} ({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, {os.cpu_count()} cores)\n")
print("| diff | store nodes | apply+drain s | " + " | ".join(f"{k} s" for k in DATASETS.values()) + " |")
print("|---|---|---|" + "---|" * len(DATASETS))
med = {}
for d in diffs:
    for n in SIZES:
        runs = res[(d, n)]
        wall = statistics.median(w for w, _ in runs)
        per = {k: statistics.median(p.get(k, 0) for _, p in runs) for k in DATASETS}
        med[(d, n)] = (wall, per)
        print(f"| {d} | {n:,} | {wall:.3f} | " + " | ".join(f"{per[k]:.3f}" for k in DATASETS) + " |")
        print(f"  runs: {' '.join(f'{w:.3f}' for w, _ in runs)}", flush=True)
print()
for d in diffs:
    for n in SIZES[1:]:
        (w0, p0), (w1, p1) = med[(d, small)], med[(d, n)]
        per = ", ".join(f"{DATASETS[k]} {p1[k] / p0[k]:.2f}x" for k in DATASETS if p0[k] > 0)
        print(f"{d}: {n:,} vs {small:,} nodes: apply+drain {w1 / w0:.2f}x ({per})")
PY
