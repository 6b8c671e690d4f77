#!/usr/bin/env bash
# Issue 50: `osm tiles publish` to a bucket after a minutely diff, against
# a whole publish of the same tiles, on the largest synthetic store
# (highwater-osmgen's world of NODES nodes, default 2.1M, the size of the
# seven-region store) and its minutely-sized diff (3,300 changes).
#
# The bucket is moto on loopback with S3's own 5 MiB part minimum; what
# was sent is read from moto's request log (every PUT/POST body), not from
# highwater's report. Per round, from the same snapshot (store, MBTiles,
# and the bucket's pointer at version 1): apply the diff and drain, then
# the incremental publish (to maps:tiles/base.pmtiles, which holds
# version 1) and a whole publish of the same tiles (to a place never
# published, maps:fullN/base.pmtiles), in alternating order. Medians of
# ROUNDS.
#
#   ROUNDS=3 NODES=2100000 CHANGES=3300 bash bench/osm_pmtiles.sh
# CHANGES: the diff's size. 3,300 is a planet minute; spread over this
# world's 607 cities it touches every city, so every tile at z10-14 (the
# publish then rewrites whole, past pmtiles_dead_share_max_pct): a smaller
# CHANGES is a minute's share of a world this size.
# Needs osmium (Debian's osmium-tool) and the test venv
# (HIGHWATER_TEST_PYTHON, scripts/deps.sh: moto, boto3). HW and GEN may
# name prebuilt binaries (default: release builds).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
NODES=${NODES:-2100000}
CHANGES=${CHANGES:-3300}
W=${BENCH_DIR:-/tmp/hw-osm-pmtiles}
PY=${HIGHWATER_TEST_PYTHON:?run . scripts/deps.sh or set HIGHWATER_TEST_PYTHON}
if [ -z "${HW:-}" ] || [ -z "${GEN:-}" ]; then
  cargo build -q --release -p highwater -p highwater-osmgen
  HW=${HW:-$PWD/target/release/highwater}
  GEN=${GEN:-$PWD/target/release/highwater-osmgen}
fi
mkdir -p "$W"
pbf="$W/w$NODES.osm.pbf"
[ -s "$pbf" ] || "$GEN" extract --nodes "$NODES" --seed 25 | osmium cat -F osm - -o "$pbf" -O
[ -s "$W/minute-$CHANGES.osc" ] || "$GEN" diff --nodes "$NODES" --changes "$CHANGES" --seed 25 --diff-seed 2 -o "$W/minute-$CHANGES.osc"

HW="$HW" W="$W" PBF="$pbf" ROUNDS="$ROUNDS" OSC="$W/minute-$CHANGES.osc" "$PY" - <<'PY'
import json, os, shutil, socket, statistics, subprocess, sys, time
import boto3

HW, W, PBF, ROUNDS = os.environ["HW"], os.environ["W"], os.environ["PBF"], int(os.environ["ROUNDS"])
P = f"{W}/project"
LOG = f"{W}/requests.jsonl"

# moto with a request log (the server's own record of each body's length).
SERVER = r'''
import json, os, sys
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
inner = DomainDispatcherApplication(create_backend_app)
log = os.environ["LOG"]
def app(environ, start_response):
    with open(log, "a") as f:
        f.write(json.dumps({"method": environ.get("REQUEST_METHOD"), "path": environ.get("PATH_INFO"),
                            "length": int(environ.get("CONTENT_LENGTH") or 0),
                            "copy": environ.get("HTTP_X_AMZ_COPY_SOURCE")}) + "\n")
    return inner(environ, start_response)
run_simple("127.0.0.1", int(sys.argv[1]), app, threaded=True, request_handler=MotoRequestHandler)
'''
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
open(LOG, "w").close()
moto = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], env={**os.environ, "LOG": LOG},
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
import atexit; atexit.register(moto.kill)  # also when an assertion stops the run
endpoint = f"http://127.0.0.1:{port}"
for _ in range(200):
    try:
        socket.create_connection(("127.0.0.1", port)).close(); break
    except OSError:
        time.sleep(0.1)
s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                  aws_secret_access_key="testing", region_name="us-east-1")
s3.create_bucket(Bucket="maps")
ENV = {**os.environ, "S3_ENDPOINT": endpoint, "AWS_ACCESS_KEY_ID": "testing",
       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}

CONFIG = """
[osm]
store = "store"

[osm.tiles.base]
zooms = "10-14"
keys = ["building", "highway", "landuse", "name", "amenity", "natural"]
mbtiles = "base.mbtiles"
drain = "deferred"

[storage.maps]
kind = "s3"
bucket = "maps"
endpoint_env = "S3_ENDPOINT"
region = "us-east-1"
"""

def hw(*args, cwd=P):
    t = time.perf_counter()
    out = subprocess.run([HW, *args], cwd=cwd, capture_output=True, text=True, env=ENV)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: {out.stdout}{out.stderr}")
    return out.stdout, time.perf_counter() - t

def sent():
    with open(LOG) as f:
        reqs = [json.loads(l) for l in f]
    open(LOG, "w").close()
    return (sum(r["length"] for r in reqs if r["method"] in ("PUT", "POST")),
            sum(1 for r in reqs if r["copy"]))

def publish(to):
    sent()
    out, s = hw("osm", "tiles", "publish", "base", "--to", to, "--json")
    b, copies = sent()
    return json.loads(out), s, b, copies

shutil.rmtree(P, ignore_errors=True); os.makedirs(P)
open(f"{P}/highwater.toml", "w").write(CONFIG)
_, s_import = hw("osm", "import", PBF)
_, s_build = hw("osm", "tiles", "build")
first, s_first, b_first, _ = publish("maps:tiles/base.pmtiles")
pointer = s3.get_object(Bucket="maps", Key="tiles/base.pmtiles.json")["Body"].read()
snap = f"{W}/snapshot"
shutil.rmtree(snap, ignore_errors=True); shutil.copytree(P, snap)
print(f"import {s_import:.1f} s, tiles build {s_build:.1f} s; first publish {s_first:.2f} s, "
      f"{first['tiles']} tiles, archive {first['archive_bytes']} B, moto received {b_first} B", file=sys.stderr)

inc, full = [], []
for r in range(ROUNDS):
    shutil.rmtree(P); shutil.copytree(snap, P)
    s3.put_object(Bucket="maps", Key="tiles/base.pmtiles.json", Body=pointer)
    subprocess.run(["sync"])
    _, s_apply = hw("osm", "apply", os.environ["OSC"])
    out, s_drain = hw("osm", "tiles", "drain", "--json")
    subprocess.run(["sync"])
    order = ["inc", "full"] if r % 2 == 0 else ["full", "inc"]
    for which in order:
        if which == "inc":
            rep, s, b, copies = publish("maps:tiles/base.pmtiles")
            # A diff that touches most tiles is rewritten whole, by the
            # dead-bytes rule: reported, not hidden.
            if rep["full_reason"] is not None:
                print(f"round {r}: the publish after the diff was whole: {rep['full_reason']}", file=sys.stderr)
            inc.append((s, b, copies, rep))
        else:
            rep, s, b, copies = publish(f"maps:full{r}/base.pmtiles")
            full.append((s, b, copies, rep))
    print(f"round {r}: apply {s_apply:.2f} s, drain {s_drain:.2f} s; incremental {inc[-1][0]:.2f} s "
          f"{inc[-1][1]} B ({inc[-1][3]['tiles_changed']} tiles changed, {inc[-1][2]} part copies); "
          f"whole {full[-1][0]:.2f} s {full[-1][1]} B", file=sys.stderr)
moto.kill()

def med(xs): return statistics.median(xs)
arch = med([x[3]["archive_bytes"] for x in inc])
print("| publish | seconds (median) | bytes sent (moto's log) | share of the archive | tiles written |")
print("|---|---|---|---|---|")
print(f"| incremental, after the minutely diff | {med([x[0] for x in inc]):.2f} | {med([x[1] for x in inc]):,.0f} | "
      f"{med([x[1] for x in inc]) / arch:.1%} | {med([x[3]['tiles_changed'] for x in inc]):,.0f} |")
print(f"| whole, same tiles | {med([x[0] for x in full]):.2f} | {med([x[1] for x in full]):,.0f} | "
      f"{med([x[1] for x in full]) / med([x[3]['archive_bytes'] for x in full]):.1%} | {med([x[3]['tiles'] for x in full]):,.0f} |")
print(f"\nincremental / whole: {med([x[0] for x in inc]) / med([x[0] for x in full]):.2f}x seconds, "
      f"{med([x[1] for x in inc]) / med([x[1] for x in full]):.3f}x bytes; archive {arch:,.0f} B "
      f"({inc[0][3]['tiles']:,} tiles); runs inc {[round(x[0], 2) for x in inc]} s, whole {[round(x[0], 2) for x in full]} s")
PY
