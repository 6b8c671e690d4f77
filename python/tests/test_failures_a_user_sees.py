"""Failures a Python user sees (issue 48): a failed item raises and the
script exits non-zero; Ctrl-C stops the run with the state consistent; the
root is the pipeline file's folder wherever the script starts; a script
without the main guard, and a stage the workers cannot import, are refused
with the fix; the exceptions live in `highwater` and pickle."""

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import highwater as hw
import pytest

FAILING = '''
import highwater as hw

p = hw.Pipeline(".")

@p.stage(inputs=["data/*.txt"], output="out/{stem}.txt")
def tidy(input, output):
    if input.stem == "bad":
        raise ValueError("this input is bad")
    output.write_text(input.read_text().strip())

if __name__ == "__main__":
    p.run(jobs=2)
'''


def script(project, path, *args, cwd=None, stdin=None):
    return subprocess.run(
        [sys.executable, str(path), *args],
        cwd=cwd or project.root,
        capture_output=True,
        text=True,
        timeout=300,
        input=stdin,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )


def test_a_failing_item_fails_the_script(project):
    project.write("pipeline.py", FAILING)
    project.write("data/good.txt", " good \n")
    project.write("data/bad.txt", " bad \n")
    r = script(project, project.root / "pipeline.py")
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "highwater.errors.RunFailed" in r.stderr, r.stderr
    assert "stage tidy: 1 item(s) failed (data/bad.txt)" in r.stderr, r.stderr
    assert "ValueError: this input is bad" in r.stderr, r.stderr
    # The good item is done and recorded; only the bad one runs again.
    assert (project.root / "out/good.txt").read_text() == "good"
    changed = project.plan()["tidy"]["changed"]
    assert [(c["input"], c["reason"]) for c in changed] == [("data/bad.txt", "failed")]


def test_raise_on_failure_false_returns_the_result_and_run_failed_pickles(project):
    project.write("pipeline.py", FAILING.split("if __name__")[0])
    project.write("data/bad.txt", "x\n")
    project.write(
        "check.py",
        '''
import json, pickle, sys
import highwater as hw
from pipeline import p

if __name__ == "__main__":
    result = p.run(jobs=1, raise_on_failure=False)
    assert not result.ok
    try:
        p.run(jobs=1)
    except hw.RunFailed as e:
        back = pickle.loads(pickle.dumps(e))
        print(json.dumps({
            "type": type(back).__module__ + "." + type(back).__name__,
            "message": str(back),
            "failed": [f.input for f in back.result.stages["tidy"].failed],
            "first": [f.input for f in result.stages["tidy"].failed],
        }))
    else:
        sys.exit("no RunFailed")
''',
    )
    r = script(project, "check.py")
    assert r.returncode == 0, r.stderr
    import json

    got = json.loads(r.stdout)
    assert got["type"] == "highwater.errors.RunFailed"
    assert got["failed"] == got["first"] == ["data/bad.txt"]
    assert "this input is bad" in got["message"]


SLOW = '''
import pathlib, time
import highwater as hw

p = hw.Pipeline()

@p.stage(inputs=["data/*.txt"], output="out/{stem}.txt")
def slow(input, output):
    root = pathlib.Path(__file__).parent
    (root / "started").mkdir(exist_ok=True)
    (root / "started" / input.stem).write_text("")
    # Held until the test releases it (bounded, so a broken test ends).
    for _ in range(12000):
        if (root / "release").exists():
            break
        time.sleep(0.01)
    output.write_text(input.read_text().upper())

if __name__ == "__main__":
    p.run(jobs=2)
'''

ITEMS = ["a", "b", "c", "d", "e", "f"]


def wait_until(cond, proc, what, limit_s=120):
    for _ in range(limit_s * 100):
        if cond():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {proc.stderr.read()}")
        time.sleep(0.01)
    raise AssertionError(f"{what} never happened")


def start_slow_run(project, tmp_path):
    """The pipeline's script, started from another folder in a session of
    its own, as a terminal would: Ctrl-C then goes to every process of it."""
    project.write("pipeline.py", SLOW)
    for name in ITEMS:
        project.write(f"data/{name}.txt", f"{name}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    err = open(tmp_path / "stderr.txt", "w+")
    proc = subprocess.Popen(
        [sys.executable, str(project.root / "pipeline.py")],
        cwd=elsewhere,
        stdout=subprocess.DEVNULL,
        stderr=err,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    started = project.root / "started"
    wait_until(lambda: started.is_dir() and len(list(started.iterdir())) == 2, proc, "two items started")
    return proc, err, elsewhere


def started_items(project):
    return sorted(p.name for p in (project.root / "started").iterdir())


def test_ctrl_c_stops_scheduling_and_lets_running_items_finish(project, tmp_path):
    proc, err, elsewhere = start_slow_run(project, tmp_path)
    running = started_items(project)
    os.killpg(proc.pid, signal.SIGINT)
    wait_until(lambda: "highwater: stopping" in (tmp_path / "stderr.txt").read_text(), proc, "the stop notice")
    (project.root / "release").write_text("")
    proc.wait(timeout=300)
    err.seek(0)
    stderr = err.read()
    # Python's own exit for an uncaught KeyboardInterrupt: killed by SIGINT.
    assert proc.returncode == -signal.SIGINT, (proc.returncode, stderr)
    assert "KeyboardInterrupt" in stderr, stderr
    # Nothing started after the Ctrl-C; the two running items finished and
    # were recorded; the others were never touched.
    assert started_items(project) == running
    for name in ITEMS:
        out = project.root / f"out/{name}.txt"
        assert out.exists() == (name in running), name
        if name in running:
            assert out.read_text() == f"{name.upper()}\n"
    # The run took its root from the script, not from where it started.
    assert not (elsewhere / ".highwater").exists()
    plan = project.plan()["slow"]
    assert sorted((c["input"], c["reason"]) for c in plan["changed"]) == [
        (f"data/{n}.txt", "new") for n in ITEMS if n not in running
    ]
    assert project.run()["slow"]["processed"] == len(ITEMS) - 2
    assert project.plan()["slow"]["changed"] == []


def test_a_second_ctrl_c_kills_the_running_items(project, tmp_path):
    proc, err, _ = start_slow_run(project, tmp_path)
    running = started_items(project)
    os.killpg(proc.pid, signal.SIGINT)
    wait_until(lambda: "highwater: stopping" in (tmp_path / "stderr.txt").read_text(), proc, "the stop notice")
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=300)
    err.seek(0)
    stderr = err.read()
    assert proc.returncode == -signal.SIGINT, (proc.returncode, stderr)
    # The killed items published nothing and left no temp output behind.
    assert started_items(project) == running
    assert not (project.root / "out").exists() or [
        p.name for p in (project.root / "out").iterdir()
    ] == []
    (project.root / "release").write_text("")
    plan = project.plan()["slow"]
    assert sorted((c["input"], c["reason"]) for c in plan["changed"]) == sorted(
        (f"data/{n}.txt", "failed" if n in running else "new") for n in ITEMS
    )
    assert project.run()["slow"]["processed"] == len(ITEMS)
    assert project.plan()["slow"]["changed"] == []


def test_the_root_is_the_pipeline_files_folder(project, tmp_path):
    project.write("pipeline.py", FAILING.replace('hw.Pipeline(".")', 'hw.Pipeline("work")'))
    project.write("work/data/good.txt", " good \n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "data").mkdir()
    (elsewhere / "data/decoy.txt").write_text("decoy\n")
    r = script(project, project.root / "pipeline.py", cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    assert (project.root / "work/out/good.txt").read_text() == "good"
    assert not (elsewhere / "out").exists() and not (elsewhere / ".highwater").exists()

    project.write("pipeline.py", FAILING.replace('hw.Pipeline(".")', 'hw.Pipeline("missing")'))
    r = script(project, project.root / "pipeline.py", cwd=elsewhere)
    assert r.returncode == 1
    assert "highwater.errors.HighwaterError" in r.stderr, r.stderr
    assert f"the pipeline's root {project.root / 'missing'} is not a folder" in r.stderr, r.stderr


def test_a_script_without_the_main_guard_is_told_the_fix(project):
    project.write("pipeline.py", FAILING.replace('if __name__ == "__main__":\n    ', ""))
    project.write("data/good.txt", "good\n")
    r = script(project, "pipeline.py")
    assert r.returncode == 1, r.stderr
    assert 'if __name__ == "__main__":' in r.stderr, r.stderr
    assert "the worker processes died as they started" in r.stderr, r.stderr
    assert not (project.root / "out/good.txt").exists()


LAMBDA = '''
import highwater as hw

p = hw.Pipeline()
tidy = p.stage(inputs=["data/*.txt"], output="out/{stem}.txt", name="tidy"IN_PROCESS)(
    lambda input, output: output.write_text(input.read_text().upper())
)

if __name__ == "__main__":
    p.run(jobs=1)
'''


def test_a_stage_the_workers_cannot_import_is_refused_at_declaration(project):
    project.write("data/a.txt", "a\n")
    project.write("pipeline.py", LAMBDA.replace("IN_PROCESS", ""))
    r = script(project, "pipeline.py")
    assert r.returncode == 1
    assert "highwater.errors.DeclarationError: stage 'tidy'" in r.stderr, r.stderr
    assert "it is a lambda" in r.stderr and "in_process=True" in r.stderr, r.stderr
    assert not (project.root / ".highwater").exists()

    # The same from stdin: no file for the workers to import.
    stdin = FAILING.replace('hw.Pipeline(".")', f'hw.Pipeline({str(project.root)!r})')
    r = script(project, "-", stdin=stdin)
    assert r.returncode == 1
    assert "an interactive session, a notebook or stdin" in r.stderr, r.stderr

    # The fix the message names works.
    project.write("pipeline.py", LAMBDA.replace("IN_PROCESS", ", in_process=True"))
    r = script(project, "pipeline.py")
    assert r.returncode == 0, r.stderr
    assert (project.root / "out/a.txt").read_text() == "A\n"


def test_exceptions_live_in_highwater_pickle_and_say_force_true(tmp_path):
    for cls in (hw.HighwaterError, hw.GuardError, hw.RunFailed, hw.DeclarationError):
        assert cls.__module__ == "highwater.errors"
    (tmp_path / "data").mkdir()
    for i in range(4):
        (tmp_path / f"data/{i}.txt").write_text(f"{i}\n")

    def declare(version):
        p = hw.Pipeline(tmp_path)

        @p.stage(
            inputs=["data/*.txt"], output="out/{stem}.txt", version=version, guard=0.5,
            guard_items_min=1, in_process=True,
        )
        def copy(input, output):
            output.write_text(input.read_text())

        return p

    assert declare("1").run().stages["copy"].processed == 4
    with pytest.raises(hw.GuardError) as e:
        declare("2").run()
    text = str(e.value)
    assert "force=True" in text and "--force" not in text, text
    back = pickle.loads(pickle.dumps(e.value))
    assert type(back) is hw.GuardError and str(back) == text
    assert declare("2").run(force=True).stages["copy"].processed == 4
