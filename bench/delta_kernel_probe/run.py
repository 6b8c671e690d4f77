"""Issue 46 probe driver: tables in the states issue 46 lists, made with the
`deltalake` package (the "other engine"), then `probe --write` on each, then
a read-back with deltalake and Polars.

    python run.py PROBE_BINARY WORKDIR [STATE ...]

For each state it records: the kernel's read (ok? rows as deltalake counts?),
the kernel's write (refused, with its text, or committed), and after a commit
whether deltalake and Polars see the probe's row exactly once and every other
row unchanged. Writes WORKDIR/results.json and prints a Markdown table.
"""

import json
import os
import shutil
import subprocess
import sys
import time
import traceback

import pyarrow as pa
import polars as pl
from deltalake import DeltaTable, write_deltalake

PROBE_ID = 990001


def batch(lo, hi, neg=False):
    ids = list(range(lo, hi))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "amount": pa.array([(i * 3) % 50 for i in ids], pa.int64()),
            "region": pa.array([("eu", "us", "ap")[i % 3] for i in ids], pa.string()),
        }
    )


def base(path, n_commits=4, **kw):
    """n_commits appends of 10 rows each (several small files)."""
    for c in range(n_commits):
        write_deltalake(path, batch(c * 10, c * 10 + 10), mode="append", **kw)


def log_files(path):
    return sorted(os.listdir(os.path.join(path, "_delta_log")))


def log_has(path, needle):
    d = os.path.join(path, "_delta_log")
    for f in os.listdir(d):
        if f.endswith(".json"):
            with open(os.path.join(d, f)) as fh:
                if needle in fh.read():
                    return True
    return False


# ---- states --------------------------------------------------------------


def s_plain(p):
    base(p)
    return "4 appends of 10 rows"


def s_optimized(p):
    base(p)
    m = DeltaTable(p).optimize.compact()
    return f"optimize.compact(): {m['numFilesRemoved']} files -> {m['numFilesAdded']}"


def s_deleted(p):
    base(p)
    m = DeltaTable(p).delete("id < 5")
    return f"delete(id < 5): {m.get('num_deleted_rows')} rows deleted, {m.get('num_removed_files')} files rewritten"


def s_vacuumed(p):
    base(p)
    dt = DeltaTable(p)
    dt.optimize.compact()
    dt = DeltaTable(p)
    dt.delete("id < 5")
    dt = DeltaTable(p)
    gone = dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    return f"optimize + delete(id < 5) + vacuum(0h): {len(gone)} files deleted"


def s_checkpoint_cleanup(p):
    base(p, configuration={"delta.logRetentionDuration": "interval 0 seconds"})
    dt = DeltaTable(p)
    dt.create_checkpoint()
    time.sleep(1.1)
    write_deltalake(p, batch(40, 50), mode="append")
    dt = DeltaTable(p)
    dt.create_checkpoint()
    time.sleep(1.1)
    n = dt.cleanup_metadata()
    lf = log_files(p)
    has0 = "00000000000000000000.json" in lf
    return f"checkpoints at v3 and v4, cleanup_metadata() removed {n}; 0.json present: {has0}; log: {' '.join(f for f in lf if not f.startswith('.'))}"


def s_check_constraint(p):
    base(p)
    DeltaTable(p).alter.add_constraint({"c": "amount >= 0"})
    return 'alter.add_constraint({"c": "amount >= 0"}); probe writes amount = -5'


def s_legacy_writer_3(p):
    base(p, configuration={"delta.minWriterVersion": "3"})
    return "protocol (1, 3) and no constraint (a writer version CHECK constraints need, none added)"


def s_append_only(p):
    base(p, configuration={"delta.appendOnly": "true"})
    return "configuration delta.appendOnly = true"


def s_partitioned(p):
    base(p, partition_by=["region"])
    return "partition_by=['region'] (probe writes region = 'probe-1')"


def s_deletion_vectors(p):
    base(p, configuration={"delta.enableDeletionVectors": "true"})
    DeltaTable(p).delete("id < 5")
    dv = log_has(p, '"deletionVector":{')
    return f"delta.enableDeletionVectors = true, then delete(id < 5); a DV in the log: {dv}"


def s_column_mapping(p):
    base(p, configuration={"delta.columnMapping.mode": "name"})
    return "delta.columnMapping.mode = name"


def s_column_mapping_3_7(p):
    base(p, configuration={"delta.columnMapping.mode": "name", "delta.minReaderVersion": "3", "delta.minWriterVersion": "7"})
    return "delta.columnMapping.mode = name on protocol (3, 7) (features listed, no legacy checkConstraints)"


def s_v2_checkpoint(p):
    base(p, configuration={"delta.checkpointPolicy": "v2"})
    DeltaTable(p).create_checkpoint()
    lf = log_files(p)
    v2 = any(".checkpoint." in f and f.count(".") >= 3 and "parquet" in f and len(f.split(".")) > 3 for f in lf)
    return f"delta.checkpointPolicy = v2, create_checkpoint(); log: {' '.join(lf)}; v2-named checkpoint: {v2}"


HERE = os.path.dirname(os.path.abspath(__file__))


def s_dv_spark(p):
    """deltalake 1.6.6 cannot write to (or read) a table with deletion vectors:
    a Databricks-written table from delta-kernel-rs's test data instead."""
    shutil.copytree(os.path.join(HERE, "fixtures", "table-with-dv-small"), p)
    return "fixture table-with-dv-small (Databricks: 10 rows, DELETE wrote a DV for 2), protocol (3, 7) [deletionVectors]"


def s_v2_spark(p):
    """deltalake writes classic checkpoints only: Spark 3.5 / Delta 3.4 test
    table from delta-kernel-rs, with the commits before its last v2 checkpoint
    removed (as log cleanup would), so a reader must go through the v2
    checkpoint and its sidecars."""
    tmp = p + ".x"
    os.makedirs(tmp, exist_ok=True)
    subprocess.run(
        ["tar", "--zstd", "-xf", os.path.join(HERE, "fixtures", "v2-checkpoints-parquet-with-sidecars.tar.zst"), "-C", tmp],
        check=True,
    )
    shutil.move(os.path.join(tmp, "v2-checkpoints-parquet-with-sidecars"), p)
    shutil.rmtree(tmp)
    log = os.path.join(p, "_delta_log")
    with open(os.path.join(log, "_last_checkpoint")) as fh:
        last = json.load(fh)["version"]
    gone = 0
    for f in os.listdir(log):
        if f.endswith(".json") and f[:20].isdigit() and int(f[:20]) < last:
            os.remove(os.path.join(log, f))
            gone += 1
    return f"fixture v2-checkpoints-parquet-with-sidecars (Spark 3.5.3 / Delta 3.4), commits < {last} removed ({gone}); protocol (3, 7) [v2Checkpoint]"


STATES = [
    ("plain", s_plain, 7),
    ("optimized", s_optimized, 7),
    ("deleted", s_deleted, 7),
    ("vacuumed", s_vacuumed, 7),
    ("checkpoint_cleanup", s_checkpoint_cleanup, 7),
    ("check_constraint", s_check_constraint, -5),
    ("legacy_writer_3", s_legacy_writer_3, 7),
    ("append_only", s_append_only, 7),
    ("partitioned", s_partitioned, 7),
    ("deletion_vectors", s_deletion_vectors, 7),
    ("column_mapping", s_column_mapping, 7),
    ("column_mapping_3_7", s_column_mapping_3_7, 7),
    ("v2_checkpoint", s_v2_checkpoint, 7),
    ("dv_spark", s_dv_spark, 7),
    ("v2_checkpoint_spark", s_v2_spark, 7),
]
GENERIC = {"dv_spark", "v2_checkpoint_spark"}


# ---- checks --------------------------------------------------------------


def rows_generic(t):
    cols = t.column_names
    return sorted(tuple(r) for r in zip(*(t.column(c).to_pylist() for c in cols)))


def rows_deltalake(p, generic=False):
    t = DeltaTable(p).to_pyarrow_table()
    if generic:
        return rows_generic(t)
    return sorted(zip(*(t.column(c).to_pylist() for c in ("id", "amount", "region"))))


def rows_polars(p, generic=False):
    if generic:
        return rows_generic(pl.read_delta(p).to_arrow())
    df = pl.read_delta(p).select("id", "amount", "region").sort("id", "amount", "region")
    return [tuple(r) for r in df.rows()]


def protocol(p):
    pr = DeltaTable(p).protocol()
    return {
        "min_reader": pr.min_reader_version,
        "min_writer": pr.min_writer_version,
        "reader_features": pr.reader_features,
        "writer_features": pr.writer_features,
    }


def run_probe(probe, p, amount):
    cp = subprocess.run(
        [probe, p, "--write", "--amount", str(amount), "--id", str(PROBE_ID)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    res = None
    for line in cp.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
    return cp, res


def one(probe, work, name, make, amount):
    p = os.path.join(work, name)
    shutil.rmtree(p, ignore_errors=True)
    rec = {"state": name}
    try:
        rec["setup"] = make(p)
    except Exception as e:  # noqa: BLE001
        rec["setup_error"] = f"{type(e).__name__}: {e}"
        return rec
    generic = name in GENERIC
    try:
        rec["protocol_before"] = protocol(p)
    except Exception as e:  # noqa: BLE001
        rec["protocol_before"] = f"{type(e).__name__}: {e}"[:300]
    try:
        before = rows_deltalake(p, generic)
    except Exception as e:  # noqa: BLE001
        rec["deltalake_before_error"] = f"{type(e).__name__}: {e}"[:300]
        before = None
    rec["rows_before"] = len(before) if before is not None else None
    log_before = log_files(p)
    cp, res = run_probe(probe, p, amount)
    rec["probe_stdout"] = cp.stdout
    rec["probe_stderr"] = cp.stderr[-2000:]
    rec["probe_exit"] = cp.returncode
    rec["probe"] = res
    if res is None:
        return rec
    rec["kernel_read_ok"] = bool(res.get("read_ok"))
    if before is not None:
        rec["kernel_rows_right"] = res.get("rows") == len(before)
    rec["log_new"] = [f for f in log_files(p) if f not in log_before]
    if res.get("write") == "committed":
        exp = sorted(before + [(PROBE_ID, amount, "probe-1")]) if before is not None and not generic else None
        for reader, fn in (("deltalake", rows_deltalake), ("polars", rows_polars)):
            try:
                after = fn(p, generic)
                rec[f"{reader}_rows_after"] = len(after)
                rec[f"{reader}_probe_rows"] = sum(1 for r in after if r[0] == PROBE_ID)
                if exp is None:
                    if before is not None:
                        rec[f"{reader}_exact"] = len(after) == len(before) + 1
                    continue
                rec[f"{reader}_exact"] = after == exp
                if after != exp:
                    rec[f"{reader}_diff"] = {
                        "missing": [r for r in exp if r not in after][:5],
                        "extra": [r for r in after if r not in exp][:5],
                    }
            except Exception as e:  # noqa: BLE001
                rec[f"{reader}_error"] = f"{type(e).__name__}: {e}"[:500]
        rec["protocol_after"] = protocol(p)
        # the commit the kernel wrote
        v = res.get("write_version")
        if v is not None:
            f = os.path.join(p, "_delta_log", f"{v:020d}.json")
            if os.path.exists(f):
                with open(f) as fh:
                    rec["commit_actions"] = [list(json.loads(l).keys())[0] for l in fh if l.strip()]
                    fh.seek(0)
                    rec["commit_add_has_stats"] = '"stats"' in fh.read()
        # a second reader of the protocol view: the kernel again, read only
        cp2 = subprocess.run([probe, p], capture_output=True, text=True, timeout=300)
        for line in cp2.stdout.splitlines():
            if line.startswith("RESULT "):
                r2 = json.loads(line[7:])
                rec["kernel_reread_rows"] = r2.get("rows")
                rec["kernel_reread_files"] = r2.get("files")
                rec["kernel_reread_error"] = r2.get("read_error")
    return rec


def main():
    probe, work = sys.argv[1], sys.argv[2]
    only = set(sys.argv[3:])
    os.makedirs(work, exist_ok=True)
    out = []
    for name, make, amount in STATES:
        if only and name not in only:
            continue
        try:
            rec = one(probe, work, name, make, amount)
        except Exception:  # noqa: BLE001
            rec = {"state": name, "driver_error": traceback.format_exc()[-1500:]}
        out.append(rec)
        print(json.dumps(rec, default=str), flush=True)
    with open(os.path.join(work, "results.json"), "w") as fh:
        json.dump(out, fh, indent=1, default=str)
    print()
    print("| state | setup | kernel read | rows (kernel/deltalake) | kernel write | deltalake after | polars after |")
    print("|---|---|---|---|---|---|---|")
    for r in out:
        pr = r.get("probe") or {}
        if "setup_error" in r:
            print(f"| {r['state']} | setup failed: {r['setup_error'][:120]} | | | | | |")
            continue
        w = pr.get("write", "-")
        if w == "refused":
            w = f"refused ({pr.get('write_stage')}): {pr.get('write_error', '')[:160]}"
        elif w == "committed":
            w = f"committed v{pr.get('write_version')}"
        rd = "ok" if pr.get("read_ok") else f"FAILED: {pr.get('read_error', '')[:160]}"

        def after(reader):
            if f"{reader}_error" in r:
                return "error: " + r[f"{reader}_error"][:120]
            if f"{reader}_exact" not in r:
                return "-" if "deltalake_before_error" not in r else "cannot read: " + r["deltalake_before_error"][:100]
            return ("exact" if r[f"{reader}_exact"] else "WRONG") + f" ({r[f'{reader}_rows_after']} rows, probe row x{r[f'{reader}_probe_rows']})"

        row = (
            f"| {r['state']} | {r.get('setup', '')[:200]} | {rd} | {pr.get('rows')}/{r.get('rows_before')} | {w} | {after('deltalake')} | {after('polars')} |"
        )
        print(" ".join(row.split()))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
