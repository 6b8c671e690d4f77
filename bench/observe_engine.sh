#!/usr/bin/env bash
# Issue 24: observation's cost inside highwater, in the same run: a stage of
# PY_ITEMS items of a small Python command and a stage of CP_ITEMS items of
# `cp`, each beside an identical stage with `observe = false`.
#   bench/observe_engine.sh [HIGHWATER=target/debug/highwater] [PY_ITEMS=400] [CP_ITEMS=10000] [JOBS=2] [ROUNDS=1]
# Prints each pair in both orders, ROUNDS times, and the geometric mean of
# all (one run's ratio moves by up to 0.08 from run to run here).
set -euo pipefail
HW=$(realpath "${1:-target/debug/highwater}")
PY_ITEMS=${2:-400}
CP_ITEMS=${3:-10000}
JOBS=${4:-2}
ROUNDS=${5:-1}
# PY=/root/.pyenv/shims/python3 measures a command started through a shim.
PY=${PY:-$(python3 -c 'import sys; print(sys.executable)')}  # past pyenv's shim
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W"
mkdir -p lib py cp
printf 'def f(s):\n    return s.upper()\n' > lib/helpers.py
printf 'import sys\nsys.path.insert(0, "lib")\nimport helpers\nopen(sys.argv[2], "w").write(helpers.f(open(sys.argv[1]).read()))\n' > t.py
for i in $(seq "$PY_ITEMS"); do echo "item $i" > "py/$i.txt"; done
for i in $(seq "$CP_ITEMS"); do echo "item $i" > "cp/$i.txt"; done
stage() { # name inputs command observe
  printf '[stages.%s]\ninputs = ["%s"]\noutput = "out/%s/{relpath}"\ncommand = %s\nobserve = %s\n\n' "$1" "$2" "$1" "$3" "$4"
}
# Stages run in name order, so each pair runs twice: observed first, then
# plain first (a fresh state and outputs each time). The stage run first
# meets colder caches and the second one the first one's writeback; the
# geometric mean of the two orders cancels that.
for round in $(seq "$ROUNDS"); do
for order in observed-first plain-first; do
  rm -rf out .highwater
  if [ "$order" = observed-first ]; then first=(observed true); second=(plain false);
  else first=(plain false); second=(observed true); fi
  {
    stage "py_1_${first[0]}" "py/*.txt" "[\"$PY\", \"t.py\", \"{input}\", \"{output}\"]" "${first[1]}"
    stage "py_2_${second[0]}" "py/*.txt" "[\"$PY\", \"t.py\", \"{input}\", \"{output}\"]" "${second[1]}"
    stage "cp_1_${first[0]}" "cp/*.txt" '["cp", "{input}", "{output}"]' "${first[1]}"
    stage "cp_2_${second[0]}" "cp/*.txt" '["cp", "{input}", "{output}"]' "${second[1]}"
  } > highwater.toml
  "$HW" run --jobs "$JOBS" --json 2>/dev/null > "run-$round-$order.json"
  "$HW" plan 2>/dev/null | grep -c " 0 changed" | sed "s/^/round $round, $order: stages unchanged on the next plan (of 4): /"
done
done
python3 - run-*-*.json <<'PY'
import json, sys
# "cp_1_observed" -> "cp_observed"
runs = [{s["name"][:3] + s["name"][5:]: s for s in json.load(open(f))["stages"]}
        for f in sys.argv[1:]]
names = [f.split("-", 2)[1] + ", " + f.split("-", 2)[2][:-5] for f in sys.argv[1:]]
for k in ("py", "cp"):
    ratios = []
    for order, r in zip(names, runs):
        o, p = r[k + "_observed"], r[k + "_plain"]
        ratio = o["duration_ms"] / max(p["duration_ms"], 1)
        ratios.append(ratio)
        print(f'{k}, {order}: {o["processed"]} items, observed {o["duration_ms"]} ms, plain {p["duration_ms"]} ms, ratio {ratio:.2f}x')
    mean = 1.0
    for x in ratios:
        mean *= x
    print(f'{k}: geometric mean of {len(ratios)} runs {mean ** (1 / len(ratios)):.2f}x')
PY
