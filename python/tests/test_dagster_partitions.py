"""Issue 48: a stage's items as Dagster partitions. Observing the inputs
asset registers one partition per item and versions each on its own, so
Dagster reports stale exactly the partition whose input was edited (or
added); materialising a partition runs only its items. A stage over
landed days (`marts/{day}.json`) is partitioned by day on its own."""

import json
import sqlite3

from test_dagster import dagster
from test_stages_over_windows import TOML, ingest

DEFS = '''
import json, sys
import dagster as dg
from dagster._core.definitions.observe import observe
from dagster._core.instance.ref import InstanceRef
from dagster._utils.test.data_versions import get_stale_status_resolver
from highwater.dagster import inputs_asset, asset
from pipeline import p

STAGE = "%(stage)s"
inputs = inputs_asset(p, STAGE, partitioned=%(partitioned)s)
stage = asset(p, STAGE, partitioned=%(partitioned)s)

def main():
    instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(sys.argv[2]))
    what = sys.argv[1]
    keys = lambda: sorted(instance.get_dynamic_partitions("highwater_" + STAGE))
    if what == "observe":
        r = observe([inputs], instance=instance)
        print(json.dumps({"success": r.success, "partitions": keys()}))
    elif what == "materialize":
        r = dg.materialize([inputs, stage], selection=[stage], partition_key=sys.argv[3], instance=instance)
        mat = r.asset_materializations_for_node(STAGE)[0]
        print(json.dumps({"success": r.success, "processed": mat.metadata["processed"].value,
                          "items": mat.metadata["items"].value}))
    else:
        res = get_stale_status_resolver(instance, [inputs, stage])
        print(json.dumps({k: res.get_status(stage.key, k).value for k in keys()}))

if __name__ == "__main__":
    main()
'''

FILES = '''
import highwater as hw

p = hw.Pipeline(".")

@p.stage(inputs=["data/*.txt"], output="out/{stem}.txt")
def tidy(input, output):
    output.write_text(input.read_text().strip())
'''


def test_each_item_is_a_partition_and_only_the_edited_one_goes_stale(project):
    project.write("pipeline.py", FILES)
    project.write("defs.py", DEFS % {"stage": "tidy", "partitioned": "True"})
    project.write("data/a.txt", " a \n")
    project.write("data/b.txt", " b \n")
    (project.root / "dagster-home").mkdir()

    assert dagster(project, "observe") == {"success": True, "partitions": ["data/a.txt", "data/b.txt"]}
    assert dagster(project, "status") == {"data/a.txt": "MISSING", "data/b.txt": "MISSING"}

    # One partition runs its one item; the other stays pending.
    got = dagster(project, "materialize", "data/a.txt")
    assert got == {"success": True, "processed": 1, "items": ["data/a.txt"]}
    assert (project.root / "out/a.txt").read_text() == "a"
    assert not (project.root / "out/b.txt").exists()
    assert [c["input"] for c in project.plan()["tidy"]["changed"]] == ["data/b.txt"]
    assert dagster(project, "materialize", "data/b.txt")["processed"] == 1
    assert dagster(project, "status") == {"data/a.txt": "FRESH", "data/b.txt": "FRESH"}

    # An edit to b's input makes b stale once observed, and a not.
    project.write("data/b.txt", " bee \n")
    dagster(project, "observe")
    assert dagster(project, "status") == {"data/a.txt": "FRESH", "data/b.txt": "STALE"}
    assert dagster(project, "materialize", "data/b.txt")["processed"] == 1
    assert (project.root / "out/b.txt").read_text() == "bee"
    assert dagster(project, "status") == {"data/a.txt": "FRESH", "data/b.txt": "FRESH"}

    # A new input is a new partition; a deleted one's partition goes.
    project.write("data/c.txt", "c")
    (project.root / "data/a.txt").unlink()
    assert dagster(project, "observe")["partitions"] == ["data/b.txt", "data/c.txt"]
    assert dagster(project, "materialize", "data/c.txt")["processed"] == 1
    # What the partitions made equals a rebuild of what is there now,
    # but for the deleted input, whose deletion the next whole run does.
    assert (project.root / "out/c.txt").read_text() == "c"


def test_a_stage_over_landed_days_is_partitioned_by_day(project):
    project.write("highwater.toml", TOML)
    project.write("pipeline.py", '''
import json
import highwater as hw
import pyarrow.parquet as pq

p = hw.Pipeline(".", config="highwater.toml")

@p.stage(inputs={"source": "orders", "by": "day"}, output="marts/{day}.json")
def daily(files, output, window):
    start, end = window
    total = 0
    for f in files:
        t = pq.read_table(f, columns=["amount", "updated_at"])
        total += sum(a for a, u in zip(t.column(0).to_pylist(), t.column(1).to_pylist()) if start <= u < end)
    output.write_text(json.dumps({"total": total}))
''')
    project.write("defs.py", DEFS % {"stage": "daily", "partitioned": "None"})
    (project.root / "dagster-home").mkdir()
    db = sqlite3.connect(project.root / "src.db")
    db.execute("CREATE TABLE orders(id INTEGER PRIMARY KEY, amount INTEGER, updated_at TEXT)")
    for day in (1, 2):
        for hour in range(24):
            db.execute("INSERT INTO orders VALUES(?, 1, ?)", (day * 100 + hour, f"2026-03-0{day}T{hour:02}:10:00Z"))
    db.commit()
    ingest(project, "--now", "2026-03-03T00:30:00Z")

    assert dagster(project, "observe")["partitions"] == ["2026-03-01", "2026-03-02"]
    got = dagster(project, "materialize", "2026-03-02")
    assert got["processed"] == 1
    assert got["items"] == ["orders/2026-03-02T00:00:00Z/2026-03-03T00:00:00Z"]
    assert json.loads((project.root / "marts/2026-03-02.json").read_text()) == {"total": 24}
    assert not (project.root / "marts/2026-03-01.json").exists()
    assert dagster(project, "materialize", "2026-03-01")["processed"] == 1
    assert dagster(project, "status") == {"2026-03-01": "FRESH", "2026-03-02": "FRESH"}
    # The first runs read a file no run had read (pyarrow's time zone), so
    # the next observation versions each day anew, once (the module's
    # docstring says so); materialising again runs nothing.
    dagster(project, "observe")
    for d in ("2026-03-01", "2026-03-02"):
        assert dagster(project, "materialize", d)["processed"] == 0
    assert dagster(project, "status") == {"2026-03-01": "FRESH", "2026-03-02": "FRESH"}

    # A late row re-lands one hour of day 1: that day's partition goes
    # stale, day 2's does not.
    db.execute("UPDATE orders SET amount = 50 WHERE id = ?", (100 + 9,))
    db.commit()
    ingest(project, "--now", "2026-03-03T00:30:00Z", "--window", "2026-03-01T09:00:00Z/2026-03-01T10:00:00Z")
    dagster(project, "observe")
    assert dagster(project, "status") == {"2026-03-01": "STALE", "2026-03-02": "FRESH"}
    assert dagster(project, "materialize", "2026-03-01")["processed"] == 1
    assert json.loads((project.root / "marts/2026-03-01.json").read_text()) == {"total": 73}
