#!/usr/bin/env bash
# Issue 25: two builds of highwater on the same minutely diff, interleaved
# run by run (load on the machine moves absolute times; interleaving keeps
# the ratio honest). Each `osm apply --json` runs on a fresh copy of a
# world that bench/osm_scale_datasets.sh built (its BENCH_DIR), written out
# (`sync`) before the clock starts. Reported: wall time of the whole
# process and each dataset's drain, medians of ROUNDS.
#
# Usage: BEFORE=/path/to/old/highwater AFTER=target/release/highwater \
#        SIZES="1000000 10000000" ROUNDS=5 DIFF=minute bash bench/osm_apply_ab.sh
# Build BEFORE from another commit with a worktree and CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${BEFORE:?give BEFORE, the highwater binary to compare against}"
AFTER=${AFTER:-$PWD/target/release/highwater}
W=${BENCH_DIR:-/tmp/hw-osm-scale-ds} BEFORE="$BEFORE" AFTER="$AFTER" \
SIZES=${SIZES:-"1000000 10000000"} ROUNDS=${ROUNDS:-5} DIFF=${DIFF:-minute} python3 - <<'PY'
import json, os, shutil, statistics, subprocess, time

W = os.environ["W"]
BINS = {"before": os.environ["BEFORE"], "after": os.environ["AFTER"]}
SIZES = [int(s) for s in os.environ["SIZES"].split()]
ROUNDS, DIFF = int(os.environ["ROUNDS"]), os.environ["DIFF"]
for n in SIZES:
    if not os.path.exists(f"{W}/built{n}/done"):
        raise SystemExit(f"no built world of {n:,} nodes in {W}: run bench/osm_scale_datasets.sh first")


def run(b, n):
    d = f"{W}/run"
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(f"{W}/built{n}", d)
    os.sync()
    time.sleep(1)
    t = time.perf_counter()
    r = subprocess.run([BINS[b], "osm", "apply", f"{W}/{DIFF}.osc", "--json"],
                       cwd=d, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{b} exited {r.returncode}: {r.stderr[-2000:]}")
    per = {}
    for line in r.stdout.splitlines()[1:]:
        j = json.loads(line)
        for k in ("drain", "search", "aggregates"):
            if k in j:
                per[k] = j["elapsed_ms"]
    return wall, per


res = {}
for r in range(ROUNDS):
    for n in (SIZES if r % 2 == 0 else SIZES[::-1]):
        for b in (["before", "after"] if r % 2 == 0 else ["after", "before"]):
            res.setdefault((b, n), []).append(run(b, n))
print(f"\n# {DIFF}: apply + drain, medians of {ROUNDS} ({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, {os.cpu_count()} cores)\n")
print("| store nodes | build | apply+drain s | tiles ms | search ms | aggregates ms | runs s |")
print("|---|---|---|---|---|---|---|")
for n in SIZES:
    for b in BINS:
        runs = res[(b, n)]
        med = lambda k: statistics.median(p.get(k, 0) for _, p in runs)
        print(f"| {n:,} | {b} | {statistics.median(w for w, _ in runs):.3f} | {med('drain'):.0f} | "
              f"{med('search'):.0f} | {med('aggregates'):.0f} | {' '.join(f'{w:.3f}' for w, _ in runs)} |")
PY
