#!/usr/bin/env bash
# Python stages (issue 48), on a machine shared with other builds: the
# figures of bench/python.sh, each command interleaved with its peer round
# after round (bench/interleave.py), so that the load falls on both alike;
# the ratios are the figures, the absolute times are the machine's.
#  1. a no-change plan over 20,000 items from Python (interpreter start
#     included; file dependencies on: every item read config.json) against
#     `git status --porcelain` on the same committed tree;
#  2. 2,000 items of a trivial function (process pool, temp + fsync +
#     rename, manifest, reads observed) against joblib.Memory and a plain
#     loop doing the same writes with the same fsyncs; ms per item over the
#     loop.
# Needs the extension in the venv (scripts/py.sh installs the wheel).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${HIGHWATER_BENCH_PYTHON:-${HIGHWATER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/highwater/venv}/bin/python}
W=${HIGHWATER_BENCH_DIR:-/tmp/highwater-bench/python-interleaved}
ROUNDS=${PLAN_ROUNDS:-20}
RUN_ROUNDS=${RUN_ROUNDS:-5}
IL="$PY $(pwd)/bench/interleave.py"
rm -rf "$W"; mkdir -p "$W"

# 1. no-change plan, 20,000 items
P="$W/plan"; mkdir -p "$P/data"
"$PY" - "$P" <<'PYEOF'
import sys, os
root = sys.argv[1]
for i in range(20000):
    d = os.path.join(root, "data", f"d{i // 1000:02}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i:05}.txt"), "w") as f:
        f.write(f"item {i}\n")
with open(os.path.join(root, "config.json"), "w") as f:
    f.write('{"suffix": "!"}\n')
PYEOF
cat > "$P/pipeline.py" <<'PYEOF'
import json
import highwater as hw
p = hw.Pipeline()
@p.stage(inputs=["data/**/*.txt"], output="out/{relpath}", guard=1.0)
def copy(input, output):
    with open("config.json") as f:
        suffix = json.load(f)["suffix"]
    output.write_bytes(input.read_bytes() + suffix.encode())
if __name__ == "__main__":
    import sys
    if sys.argv[1:] == ["run"]:
        r = p.run()
        assert r.ok, r
        print(r.stages["copy"].processed)
    else:
        plan = p.plan()
        assert not plan.stages["copy"].changed, "the plan is not empty"
PYEOF
(cd "$P" && "$PY" pipeline.py run >/dev/null)
# Past the racy margin, a no-op run re-records the evidence (as `git
# status` refreshes its index); the plan then measures a settled state.
sleep 1.2
(cd "$P" && [ "$("$PY" pipeline.py run)" = 0 ])
(cd "$P" && git init -q && git add data config.json && git -c user.email=b@b -c user.name=b commit -qm data)
echo "== no-change plan, 20,000 items, file dependencies on ($(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)); interleaved, $ROUNDS rounds after 3 warm-ups"
$IL --rounds "$ROUNDS" --warmup 3 --cwd "$P" -- "$PY pipeline.py plan" "$PY -c 'import highwater'" "git status --porcelain"

# 2. 2,000 items of a trivial function
R="$W/run"; mkdir -p "$R/data"
"$PY" - "$R" <<'PYEOF'
import sys, os
for i in range(2000):
    with open(os.path.join(sys.argv[1], "data", f"f{i:04}.txt"), "w") as f:
        f.write(f"item {i}\n")
PYEOF
sed -n '/^cat > "\$R\/work.py" <<.PYEOF.$/,/^PYEOF$/p' bench/python.sh | sed '1d;$d' > "$R/work.py"
echo "== 2,000 trivial items, first run, whole process; interleaved, $RUN_ROUNDS rounds; the last (the plain loop) is the peer"
$IL --rounds "$RUN_ROUNDS" --warmup 0 --per 2000 --cwd "$R" -- \
    "$PY work.py joblib" "$PY work.py hw-2" "$PY work.py hw-1" "$PY work.py plain"
