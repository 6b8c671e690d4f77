"""Issue 49: a Python stage over a source's landed windows. The source is
declared in highwater.toml and landed by the CLI; the stage, declared in
Python with `inputs={"source": ..., "by": "day"}`, gets each day's data
files, its output and the day's bounds, and re-runs only the day whose
rows changed, the window named as the reason."""

import json
import sqlite3
import subprocess
import sys

TOML = """
[sources.orders]
kind = "sqlite"
path = "src.db"
table = "orders"
key = ["id"]
mode = "updated_at"
cursor = "updated_at"
interval = "1h"
start = "2026-03-01T00:00:00Z"
settle = "1m"
output = "raw/orders/date={date}/hour={hour}"
"""

PIPELINE = """
import json
import highwater as hw
import pyarrow.parquet as pq

p = hw.Pipeline(".", config="highwater.toml")

@p.stage(inputs={"source": "orders", "by": "day"}, output="marts/{day}.json")
def daily(files, output, window):
    start, end = window
    rows = []
    for f in files:
        t = pq.read_table(f, columns=["id", "amount", "updated_at"])
        cols = [t.column(c).to_pylist() for c in ["id", "amount", "updated_at"]]
        rows += [[i, a] for i, a, u in zip(*cols) if start <= u < end]
    output.write_text(json.dumps({"rows": len(rows), "total": sum(a for _, a in rows)}))
"""


def ingest(project, *args):
    r = subprocess.run(
        [sys.executable, "-c", "from highwater.cli import main; main()", "ingest", "orders", *args],
        cwd=project.root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr


def test_python_stage_over_windows_reruns_only_the_changed_day(project):
    project.write("highwater.toml", TOML)
    project.write("pipeline.py", PIPELINE)
    db = sqlite3.connect(project.root / "src.db")
    db.execute("CREATE TABLE orders(id INTEGER PRIMARY KEY, amount INTEGER, updated_at TEXT)")
    for day in (1, 2):
        for hour in range(24):
            i = (day * 24 + hour) * 2
            for j in (0, 1):
                db.execute(
                    "INSERT INTO orders VALUES(?, ?, ?)",
                    (i + j, 1, f"2026-03-0{day}T{hour:02}:{10 + 20 * j}:00Z"),
                )
    db.commit()
    ingest(project, "--now", "2026-03-03T00:30:00Z")

    assert project.run()["daily"]["processed"] == 2
    day1 = json.loads((project.root / "marts/2026-03-01.json").read_text())
    assert day1 == {"rows": 48, "total": 48}
    assert project.run()["daily"]["processed"] == 0

    db.execute("UPDATE orders SET amount = 100 WHERE id = ?", ((24 + 9) * 2,))
    db.commit()
    ingest(project, "--now", "2026-03-03T00:30:00Z", "--window",
           "2026-03-01T09:00:00Z/2026-03-01T10:00:00Z")
    [item] = project.plan()["daily"]["changed"]
    assert item["input"] == "orders/2026-03-01T00:00:00Z/2026-03-02T00:00:00Z"
    assert item["detail"] == "re-landed 2026-03-01T09 (rows changed)"
    assert project.run()["daily"]["processed"] == 1
    day1 = json.loads((project.root / "marts/2026-03-01.json").read_text())
    assert day1 == {"rows": 48, "total": 147}
