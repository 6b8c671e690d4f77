#!/usr/bin/env bash
# Shared state and object storage (issue 11), each figure against a peer in
# the same run:
# 1. A no-change plan over N_FILES (100,000) items with PostgreSQL state
#    against the same plan with the embedded SQLite state (and `git status`
#    for scale). Target: PostgreSQL at most 2x SQLite. The state is moved
#    with `highwater state migrate`, which is timed too.
# 2. Throughput of 1, 2 and 4 `highwater run` processes (one job each) on
#    FLEET_ITEMS (2,000) items of a command that sleeps 50 ms, on PostgreSQL
#    state: items per second, and the overhead per item of claim + fence +
#    commit (the 1-process wall time against a single SQLite run of the
#    same items, per item).
# 3. Upload throughput to a local S3 server (moto on loopback): a stage
#    whose outputs go to the bucket (UPLOAD_FILES files of UPLOAD_MB MiB,
#    command `cp`) against a plain boto3 script uploading the same files one
#    after another, as `aws s3 cp` does.
#
# Needs PostgreSQL (scripts/pg.sh starts a throw-away cluster) and moto and
# boto3 (scripts/deps.sh installs them in the test venv).
set -euo pipefail
cd "$(dirname "$0")/.."
N_FILES=${N_FILES:-100000}
FLEET_ITEMS=${FLEET_ITEMS:-2000}
UPLOAD_FILES=${UPLOAD_FILES:-200}
UPLOAD_MB=${UPLOAD_MB:-1}
REPEAT=${REPEAT:-5}
BENCH_DIR=${BENCH_DIR:-/tmp/highwater-bench}

. scripts/deps.sh
. scripts/pg.sh
deps_pyosmium
pg_start
cargo build --release -q -p highwater
HW="$PWD/target/release/highwater"
PY="$HIGHWATER_TEST_PYTHON"
mkdir -p "$BENCH_DIR"

best() {
    local min=""
    for _ in $(seq "$REPEAT"); do
        local t0 t1
        t0=$(date +%s%N)
        "$@" >/dev/null 2>&1
        t1=$(date +%s%N)
        local d=$((t1 - t0))
        if [ -z "$min" ] || [ "$d" -lt "$min" ]; then min=$d; fi
    done
    awk -v ns="$min" 'BEGIN { printf "%.4f", ns / 1e9 }'
}
once() {
    local t0 t1
    t0=$(date +%s%N)
    "$@" >/dev/null
    t1=$(date +%s%N)
    awk -v ns="$((t1 - t0))" 'BEGIN { printf "%.4f", ns / 1e9 }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
newdb() {
    psql -q -c "DROP DATABASE IF EXISTS $1" -c "CREATE DATABASE $1" >/dev/null 2>&1
    echo "$HIGHWATER_TEST_PG_URL dbname=$1"
}

echo "# shared state and object storage ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, PostgreSQL on loopback)"
echo

# --- 1. no-change plan: PostgreSQL vs SQLite --------------------------------
P="$BENCH_DIR/fleet-plan-$N_FILES"
if [ ! -f "$P/.ready" ]; then
    rm -rf "$P" && mkdir -p "$P"
    python3 - "$P" "$N_FILES" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d, o = f"{root}/data/d{i // 100:04d}", f"{root}/out/d{i // 100:04d}"
    if i % 100 == 0:
        os.makedirs(d, exist_ok=True)
        os.makedirs(o, exist_ok=True)
    body = f"item {i}\n".encode() * 8
    open(f"{d}/f{i:06d}.txt", "wb").write(body)
    open(f"{o}/f{i:06d}.txt.out", "wb").write(body)
PY
    printf '[stages.copy]\ninputs = ["data/**/*.txt"]\noutput = "out/{relpath}.out"\ncommand = ["cp", "{input}", "{output}"]\n' > "$P/highwater.toml"
    (cd "$P" && printf 'out/\n.highwater/\n*.toml\n.ready\n' > .gitignore && git init -q && git add -A data .gitignore \
        && git -c user.name=b -c user.email=b@b commit -qm data)
    sleep 2
    (cd "$P" && "$HW" adopt >/dev/null)
    touch "$P/.ready"
fi
export HIGHWATER_STATE_URL
HIGHWATER_STATE_URL=$(newdb hw_bench_plan)
t_migrate=$(cd "$P" && once "$HW" state migrate --to-env HIGHWATER_STATE_URL)
{ printf '[state]\nurl_env = "HIGHWATER_STATE_URL"\n'; cat "$P/highwater.toml"; } > "$P/pg.toml"
changed=$(cd "$P" && "$HW" --config pg.toml plan --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["stages"][0]["changed"]))')
[ "$changed" = 0 ] || { echo "plan on PostgreSQL sees $changed changes; expected none" >&2; exit 1; }
sync
(cd "$P" && "$HW" plan >/dev/null && "$HW" --config pg.toml plan >/dev/null && git status --porcelain >/dev/null)
t_sqlite=$(cd "$P" && best "$HW" plan)
t_pg=$(cd "$P" && best "$HW" --config pg.toml plan)
t_git=$(cd "$P" && best git status --porcelain)
echo "## no-change plan over $N_FILES items (warm cache)"
echo "SQLite state:        ${t_sqlite} s"
echo "PostgreSQL state:    ${t_pg} s"
echo "git status:          ${t_git} s"
echo "ratio PostgreSQL/SQLite: $(ratio "$t_pg" "$t_sqlite")   (target <= 2)"
echo "state migrate of $N_FILES entries: ${t_migrate} s"
echo

# --- 2. throughput of 1, 2, 4 processes ----------------------------------------
F="$BENCH_DIR/fleet-run"
rm -rf "$F" && mkdir -p "$F/data"
python3 - "$F" "$FLEET_ITEMS" <<'PY'
import sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    open(f"{root}/data/f{i:05d}.txt", "w").write(f"item {i}\n")
PY
cat > "$F/sqlite.toml" <<'TOML'
[stages.slow]
inputs = ["data/*.txt"]
output = "out/{relpath}.out"
command = ["sh", "-c", "sleep 0.05; cp \"$1\" \"$2\"", "_", "{input}", "{output}"]
TOML
{ printf '[state]\nurl_env = "HIGHWATER_STATE_URL"\n'; cat "$F/sqlite.toml"; } > "$F/pg.toml"
echo "## $FLEET_ITEMS items of a 50 ms command, one job per process"
rm -rf "$F/out" "$F/.highwater"
t_single=$(cd "$F" && once "$HW" --config sqlite.toml run --jobs 1)
echo "SQLite, 1 process:       ${t_single} s  ($(awk -v n="$FLEET_ITEMS" -v t="$t_single" 'BEGIN { printf "%.1f", n / t }') items/s)"
for procs in 1 2 4; do
    rm -rf "$F/out"
    HIGHWATER_STATE_URL=$(newdb "hw_bench_fleet_$procs")
    t0=$(date +%s%N)
    pids=()
    for _ in $(seq "$procs"); do
        (cd "$F" && "$HW" --config pg.toml run --jobs 1 >/dev/null 2>&1) &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    t1=$(date +%s%N)
    t=$(awk -v ns="$((t1 - t0))" 'BEGIN { printf "%.4f", ns / 1e9 }')
    n_out=$(find "$F/out" -type f | wc -l)
    [ "$n_out" = "$FLEET_ITEMS" ] || { echo "$procs processes made $n_out outputs, expected $FLEET_ITEMS" >&2; exit 1; }
    echo "PostgreSQL, $procs process(es): ${t} s  ($(awk -v n="$FLEET_ITEMS" -v t="$t" 'BEGIN { printf "%.1f", n / t }') items/s)"
    if [ "$procs" = 1 ]; then t_one=$t; fi
done
echo "overhead per item of claim + fence + commit (1 process, against SQLite): $(awk -v a="$t_one" -v b="$t_single" -v n="$FLEET_ITEMS" 'BEGIN { printf "%.2f ms", (a - b) * 1000 / n }')"
echo

# --- 3. upload throughput to a local S3 server -----------------------------------
U="$BENCH_DIR/fleet-upload"
rm -rf "$U" && mkdir -p "$U/data"
for i in $(seq -w 1 "$UPLOAD_FILES"); do head -c $((UPLOAD_MB << 20)) /dev/urandom > "$U/data/f$i.bin"; done
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$HIGHWATER_MOTO_SERVER" -H 127.0.0.1 -p "$port" >/dev/null 2>&1 &
moto=$!
trap 'kill $moto 2>/dev/null; pg_stop' EXIT
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break; sleep 0.1; done
export S3_ENDPOINT="http://127.0.0.1:$port" AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1
"$PY" - <<'PY'
import boto3, os
boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"]).create_bucket(Bucket="bench")
PY
cat > "$U/highwater.toml" <<'TOML'
[storage.lake]
kind = "s3"
bucket = "bench"
endpoint_env = "S3_ENDPOINT"
region = "us-east-1"

[stages.up]
inputs = ["data/*.bin"]
output = "lake:hw/{relpath}"
command = ["cp", "{input}", "{output}"]
TOML
total_mb=$((UPLOAD_FILES * UPLOAD_MB))
t_hw=$(cd "$U" && once "$HW" run --jobs 1)
t_py=$(once "$PY" - "$U/data" <<'PY'
import boto3, os, sys
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"])
d = sys.argv[1]
for name in sorted(os.listdir(d)):
    s3.upload_file(os.path.join(d, name), "bench", "py/" + name)
PY
)
echo "## upload of $UPLOAD_FILES files of $UPLOAD_MB MiB to moto on loopback, one at a time"
echo "highwater run (cp + upload + record): ${t_hw} s  ($(awk -v m="$total_mb" -v t="$t_hw" 'BEGIN { printf "%.1f", m / t }') MiB/s)"
echo "boto3 upload_file loop:               ${t_py} s  ($(awk -v m="$total_mb" -v t="$t_py" 'BEGIN { printf "%.1f", m / t }') MiB/s)"
echo "throughput hw/boto3: $(ratio "$t_py" "$t_hw")"
