"""A process-pool worker killed mid-item (issue 22): the state stays
consistent (no output published for it, every other output whole) and the
item runs again at the next run."""

import os
import signal
import subprocess
import sys
import time

PIPELINE = '''
import os, pathlib, time
import highwater as hw

p = hw.Pipeline(".")

@p.stage(inputs=["data/*.txt"], output="out/{stem}.txt")
def slow(input, output):
    output.write_text("partial")
    if input.stem == "b" and not pathlib.Path("killed-once").exists():
        pathlib.Path("pids").mkdir(exist_ok=True)
        pathlib.Path("pids/b.tmp").write_text(str(os.getpid()))
        os.replace("pids/b.tmp", "pids/b")
        # Held here until the test kills this process (bounded, so that a
        # broken test cannot hang the suite).
        for _ in range(6000):
            time.sleep(0.01)
        raise RuntimeError("the test did not kill the worker")
    output.write_text(input.read_text().upper())
'''


def wait_for(path, proc, limit_s=120):
    # Polls for the file; fails (never skips) if the run ended without it.
    for _ in range(limit_s * 100):
        if path.exists():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {path} appeared: {proc.stderr.read()}")
        time.sleep(0.01)
    raise AssertionError(f"{path} never appeared")


def test_killed_worker_item_fails_then_reruns(project):
    project.write("pipeline.py", PIPELINE)
    for name in ("a", "b", "c", "d"):
        project.write(f"data/{name}.txt", f"{name}\n")
    proc = subprocess.Popen(
        [sys.executable, "run.py", "run", "2"],
        cwd=project.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(project.root / "pids/b", proc)
    os.kill(int((project.root / "pids/b").read_text()), signal.SIGKILL)
    (project.root / "killed-once").write_text("")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    import json

    r = json.loads(out)["stages"]["slow"]
    failed = {f["input"]: f["error"] for f in r["failed"]}
    assert "worker process running this item died" in failed["data/b.txt"]
    # What was published is whole; b's temp output never reached its place.
    assert not (project.root / "out/b.txt").exists()
    for name in ("a", "c", "d"):
        out_file = project.root / f"out/{name}.txt"
        if f"data/{name}.txt" in failed:
            assert not out_file.exists()
        else:
            assert out_file.read_text() == f"{name.upper()}\n"
    leftovers = [p.name for p in (project.root / "out").iterdir() if not p.name.endswith(".txt")]
    assert leftovers == []

    plan = project.plan()["slow"]
    assert {c["input"]: c["reason"] for c in plan["changed"]} == {i: "failed" for i in failed}
    again = project.run()["slow"]
    assert (again["processed"], again["failed"]) == (len(failed), [])
    for name in ("a", "b", "c", "d"):
        assert (project.root / f"out/{name}.txt").read_text() == f"{name.upper()}\n"
    assert project.plan()["slow"]["changed"] == []
