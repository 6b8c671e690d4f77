#!/usr/bin/env bash
# Issue 24: observation's cost inside highwater, in the same run: a stage of
# PY_ITEMS items of a small Python command and a stage of CP_ITEMS items of
# `cp`, each beside an identical stage with `observe = false`.
#   bench/observe_engine.sh [HIGHWATER=target/debug/highwater] [PY_ITEMS=400] [CP_ITEMS=10000] [JOBS=2]
set -euo pipefail
HW=$(realpath "${1:-target/debug/highwater}")
PY_ITEMS=${2:-400}
CP_ITEMS=${3:-10000}
JOBS=${4:-2}
PY=$(python3 -c 'import sys; print(sys.executable)')  # past pyenv's shim
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
{
  stage py_observed "py/*.txt" "[\"$PY\", \"t.py\", \"{input}\", \"{output}\"]" true
  stage py_plain "py/*.txt" "[\"$PY\", \"t.py\", \"{input}\", \"{output}\"]" false
  stage cp_observed "cp/*.txt" '["cp", "{input}", "{output}"]' true
  stage cp_plain "cp/*.txt" '["cp", "{input}", "{output}"]' false
} > highwater.toml
"$HW" run --jobs "$JOBS" --json 2>/dev/null > run.json
python3 - run.json <<'PY'
import json, sys
r = {s["name"]: s for s in json.load(open(sys.argv[1]))["stages"]}
for k in ("py", "cp"):
    o, p = r[k + "_observed"], r[k + "_plain"]
    ratio = o["duration_ms"] / max(p["duration_ms"], 1)
    print(f'{k}: {o["processed"]} items, observed {o["duration_ms"]} ms, plain {p["duration_ms"]} ms, ratio {ratio:.2f}x')
PY
"$HW" plan 2>/dev/null | grep -c " 0 changed" | sed 's/^/stages unchanged on the next plan (of 4): /'
