#!/usr/bin/env bash
# Issue 47: the no-change plan over N observed Python items against the
# same stage unobserved (`observe = false`), interleaved.
#   bench/observe_plan_python.sh [HW=target/release/highwater] [N=5000] [REPEAT=7]
# Each item runs `python3 t.py IN OUT` (t.py imports a helper from lib/),
# so each observed item records Python's startup set (its stdlib modules,
# the helper, the loader's libraries: one dependency set shared by all).
# Prints each timed plan and the median of each, best of REPEAT too.
set -euo pipefail
HW=$(realpath "${1:-target/release/highwater}")
N=${2:-5000}
REPEAT=${3:-7}
PY=${PY:-$(python3 -c 'import sys; print(sys.executable)')}
W=${BENCH_DIR:-$(mktemp -d)}
mkdir -p "$W"
cd "$W"
if [ ! -f highwater.toml ]; then
  mkdir -p lib in
  printf 'def f(s):\n    return s.upper()\n' > lib/helpers.py
  printf 'import sys\nsys.path.insert(0, "lib")\nimport helpers\nopen(sys.argv[2], "w").write(helpers.f(open(sys.argv[1]).read()))\n' > t.py
  for i in $(seq "$N"); do echo "item $i" > "in/$i.txt"; done
  for s in obs plain; do
    o=true; [ "$s" = plain ] && o=false
    printf '[stages.%s]\ninputs = ["in/*.txt"]\noutput = "out/%s/{relpath}"\ncommand = ["%s", "t.py", "{input}", "{output}"]\nobserve = %s\n\n' "$s" "$s" "$PY" "$o"
  done > highwater.toml
  "$HW" run --jobs 2 > /dev/null
  # The inputs were written just before that run, within the racy window
  # of the stat taken when it planned, so every entry says "read me again"
  # and each later plan re-hashes all 5,000 inputs of whichever stage kept
  # its first record (that made the observed stage 1.6x; measured twice).
  # A second run, a second later, re-records them: the steady state a
  # nightly plan meets.
  sleep 1
  "$HW" run --jobs 2 > /dev/null
fi
ms() { local t0 t1; t0=$(date +%s%N); "$HW" plan --stage "$1" > /dev/null; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000000 )); }
"$HW" plan | tail -3
deps=$("$HW" deps obs --summary --json 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print(len(d.get("deps", d)) if isinstance(d, (dict, list)) else "?")' 2>/dev/null || echo "?")
echo "distinct dependencies of the observed stage: $deps"
o=(); p=()
for r in $(seq "$REPEAT"); do
  ms obs > /dev/null; ms plain > /dev/null   # warm
  if [ $((r % 2)) = 1 ]; then a=$(ms obs); b=$(ms plain); else b=$(ms plain); a=$(ms obs); fi
  o+=("$a"); p+=("$b")
  echo "round $r: observed $a ms, plain $b ms"
done
python3 - "${o[*]}" "${p[*]}" <<'PY'
import statistics, sys
o = [int(x) for x in sys.argv[1].split()]; p = [int(x) for x in sys.argv[2].split()]
mo, mp = statistics.median(o), statistics.median(p)
print(f"median: observed {mo} ms, plain {mp} ms, ratio {mo / mp:.2f}x; best {min(o)} / {min(p)} ms, {min(o) / min(p):.2f}x")
PY
