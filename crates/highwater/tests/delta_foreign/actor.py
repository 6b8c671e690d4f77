"""The foreign engine of tests/delta_foreign_writers.rs (issue 46): the
`deltalake` package (delta-rs) and Polars acting on, and reading, a Delta
table that highwater also writes.

    python actor.py URI COMMAND

COMMAND is a JSON object `{"op": ...}` or a list of them, run in order; the
output is one JSON line: the result of each command (a list if COMMAND was
a list). Any failure raises, so the process exits non-zero with the Python
traceback on stderr: the test fails loudly, nothing is skipped.

Commands:
- `read`: the table as deltalake and Polars see it (version, protocol,
  configuration, partition columns, schema, every row's id, note and
  `_highwater_window` in µs, Polars' ids).
- `meta`: `read` without the rows (deltalake's pyarrow scan refuses
  tables with deletion vectors or column mapping; their log it reads).
- `checkpoint`: the protocol and configuration inside the checkpoint that
  `_last_checkpoint` names, read from its Parquet file(s) directly.
- `append` (`rows`: list of objects): rows appended by deltalake in the
  table's own schema; columns not given are null (`_highwater_window` too).
- `optimize`: `optimize.compact()`.
- `delete` (`predicate`): `delete(predicate)`.
- `vacuum`: `vacuum(retention_hours=0, enforce_retention_duration=False,
  dry_run=False)`.
- `checkpoint_cleanup`: `delta.logRetentionDuration = interval 0 seconds`
  (a commit of its own, if not already set), `create_checkpoint()`, then
  `cleanup_metadata()`: the logs before the checkpoint are deleted.
- `add_constraint` (`name`, `expr`): `alter.add_constraint`.
- `set_properties` (`properties`): `alter.set_table_properties`.
- `add_feature` (`features`: TableFeatures names): `alter.add_feature`,
  protocol versions allowed to increase.
- `create` (`schema`: [[name, type]], `partition_by`, `configuration`,
  `rows`): a new table written by deltalake (`write_deltalake`, mode
  "error"); types: int64, float64, string, timestamp_utc.
"""

import datetime
import json
import os
import sys

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, TableFeatures, write_deltalake

URI = sys.argv[1]

TYPES = {
    "int64": pa.int64(),
    "float64": pa.float64(),
    "string": pa.string(),
    "timestamp_utc": pa.timestamp("us", tz="UTC"),
}


def value(v, ty):
    """A JSON value as the Arrow type wants it."""
    if v is None:
        return None
    if pa.types.is_timestamp(ty):
        if isinstance(v, str):
            return datetime.datetime.fromisoformat(v.replace("Z", "+00:00"))
        return datetime.datetime.fromtimestamp(v / 1e6, tz=datetime.timezone.utc)
    if pa.types.is_floating(ty):
        return float(v)
    if pa.types.is_integer(ty):
        return int(v)
    return v


def arrow_table(schema, rows):
    cols = {
        f.name: pa.array([value(r.get(f.name), f.type) for r in rows], type=f.type)
        for f in schema
    }
    return pa.table(cols, schema=schema)


def protocol(p):
    return {
        "min_reader_version": p.min_reader_version,
        "min_writer_version": p.min_writer_version,
        "reader_features": sorted(p.reader_features or []),
        "writer_features": sorted(p.writer_features or []),
    }


def meta():
    dt = DeltaTable(URI)
    md = dt.metadata()
    return {
        "version": dt.version(),
        "protocol": protocol(dt.protocol()),
        "configuration": dict(md.configuration),
        "partition_columns": list(md.partition_columns),
        "schema": [[f.name, str(f.type)] for f in dt.schema().fields],
    }


def checkpoint():
    """The protocol and configuration in the newest checkpoint itself, as
    `_last_checkpoint` names it (classic, single or multi-part)."""
    log = os.path.join(URI, "_delta_log")
    with open(os.path.join(log, "_last_checkpoint")) as f:
        last = json.load(f)
    v = last["version"]
    parts = last.get("parts")
    if parts:
        names = [f"{v:020}.checkpoint.{i:010}.{parts:010}.parquet" for i in range(1, parts + 1)]
    else:
        names = [f"{v:020}.checkpoint.parquet"]
    out = {"version": v, "protocol": None, "configuration": None}
    for name in names:
        for row in pq.read_table(os.path.join(log, name)).to_pylist():
            p = row.get("protocol")
            if p:
                out["protocol"] = {
                    "min_reader_version": p["minReaderVersion"],
                    "min_writer_version": p["minWriterVersion"],
                    "reader_features": sorted(p.get("readerFeatures") or []),
                    "writer_features": sorted(p.get("writerFeatures") or []),
                }
            md = row.get("metaData")
            if md:
                conf = md.get("configuration") or {}
                out["configuration"] = dict(conf) if not isinstance(conf, dict) else conf
    return out


def read():
    dt = DeltaTable(URI)
    t = dt.to_pyarrow_table()
    names = t.column_names
    ids = t.column("id").to_pylist()
    notes = t.column("note").to_pylist() if "note" in names else [None] * len(ids)
    if "_highwater_window" in names:
        col = t.column("_highwater_window")
        hw = col.cast(pa.int64()).to_pylist() if pa.types.is_timestamp(col.type) else col.to_pylist()
    else:
        hw = [None] * len(ids)
    rows = sorted(
        ({"id": i, "note": n, "hw": h} for i, n, h in zip(ids, notes, hw)),
        key=lambda r: (r["id"], str(r["hw"])),
    )
    polars_ids = sorted(pl.read_delta(URI).get_column("id").to_list())
    out = meta()
    # The version the rows were read at (meta() loads the table again).
    out["version"] = dt.version()
    out.update(
        {
            "arrow_schema": [[f.name, str(f.type)] for f in t.schema],
            "files": len(dt.file_uris()),
            "rows": rows,
            "polars_ids": polars_ids,
        }
    )
    return out


def run(cmd):
    op = cmd["op"]
    if op == "read":
        return read()
    if op == "meta":
        return meta()
    if op == "checkpoint":
        return checkpoint()
    if op == "create":
        schema = pa.schema([pa.field(n, TYPES[ty]) for n, ty in cmd["schema"]])
        write_deltalake(
            URI,
            arrow_table(schema, cmd.get("rows", [])),
            mode="error",
            partition_by=cmd.get("partition_by") or None,
            configuration=cmd.get("configuration") or None,
        )
        return {"version": DeltaTable(URI).version()}
    dt = DeltaTable(URI)
    if op == "append":
        schema = dt.to_pyarrow_dataset().schema
        write_deltalake(dt, arrow_table(schema, cmd["rows"]), mode="append")
        return {"version": DeltaTable(URI).version()}
    if op == "optimize":
        return dt.optimize.compact()
    if op == "delete":
        return dt.delete(cmd["predicate"])
    if op == "vacuum":
        return dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    if op == "checkpoint_cleanup":
        key = "delta.logRetentionDuration"
        if dt.metadata().configuration.get(key) != "interval 0 seconds":
            dt.alter.set_table_properties({key: "interval 0 seconds"})
            dt = DeltaTable(URI)
        dt.create_checkpoint()
        dt.cleanup_metadata()
        return {"version": DeltaTable(URI).version()}
    if op == "add_constraint":
        dt.alter.add_constraint({cmd["name"]: cmd["expr"]})
        return {"version": DeltaTable(URI).version()}
    if op == "set_properties":
        dt.alter.set_table_properties(cmd["properties"], raise_if_not_exists=False)
        return {"version": DeltaTable(URI).version()}
    if op == "add_feature":
        dt.alter.add_feature(
            [getattr(TableFeatures, f) for f in cmd["features"]],
            allow_protocol_versions_increase=True,
        )
        return {"version": DeltaTable(URI).version()}
    raise ValueError(f"unknown op {op!r}")


def main():
    cmd = json.loads(sys.argv[2])
    out = [run(c) for c in cmd] if isinstance(cmd, list) else run(cmd)
    print(json.dumps(out, default=str))


main()
