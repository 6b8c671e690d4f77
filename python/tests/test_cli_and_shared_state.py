"""The `highwater` command that `pip install` puts on PATH (issue 22) is the
CLI, run inside the extension; and a Python stage and a highwater.toml stage
in one folder share one state store."""

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

HIGHWATER = Path(sys.executable).parent / "highwater"

TOML = '''
[state]
store = "sqlite:.highwater/state.db"

[stages.copy]
inputs = ["raw/*.txt"]
output = "copied/{name}"
command = ["cp", "{input}", "{output}"]
'''

PIPELINE = '''
import highwater as hw

p = hw.Pipeline(".")

@p.stage(inputs=["data/*.txt"], output="out/{stem}.txt")
def tidy(input, output):
    output.write_text(input.read_text().strip())
'''


def cli(project, *args):
    return subprocess.run(
        [str(HIGHWATER), *args], cwd=project.root, capture_output=True, text=True, timeout=300
    )


def test_console_script_is_the_cli_and_the_state_is_shared(project):
    assert HIGHWATER.exists(), f"{HIGHWATER}: the console script was not installed"
    project.write("highwater.toml", TOML)
    project.write("raw/r.txt", "raw\n")
    project.write("pipeline.py", PIPELINE)
    project.write("data/a.txt", " a \n")

    r = cli(project, "run", "--json")
    assert r.returncode == 0, r.stderr
    [stage] = json.loads(r.stdout)["stages"]
    assert (stage["name"], stage["processed"]) == ("copy", 1)
    assert project.run()["tidy"]["processed"] == 1

    # One store: both stages' entries in the same SQLite file.
    db = sqlite3.connect(project.root / ".highwater/state.db")
    stages = sorted({row[0] for row in db.execute("SELECT stage FROM entries")})
    db.close()
    assert stages == ["copy", "tidy"]

    # The CLI's exit codes hold: an unknown stage is refused (2), nothing touched.
    r = cli(project, "run", "--stage", "nope")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "nope" in r.stderr
    r = cli(project, "plan", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["stages"][0]["changed"] == []


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_status_and_serve_show_the_python_stage(project):
    """`highwater status` and the `serve` page list a stage that only Python
    declares, beside the highwater.toml stage, with where it was declared."""
    import time
    import urllib.request

    project.write("highwater.toml", TOML)
    project.write("raw/r.txt", "raw\n")
    project.write("pipeline.py", PIPELINE)
    project.write("data/a.txt", " a \n")
    project.write("data/b.txt", " b \n")
    assert cli(project, "run").returncode == 0
    assert project.run()["tidy"]["processed"] == 2

    r = cli(project, "status", "--json")
    assert r.returncode == 0, r.stderr
    stages = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert sorted(stages) == ["copy", "tidy"]
    assert stages["copy"]["declared_in"] == "highwater.toml"
    tidy = stages["tidy"]
    assert tidy["declared_in"] == "python:pipeline.py:tidy"
    assert (tidy["entries"], tidy["ok"], tidy["failed"]) == (2, 2, [])
    assert tidy["last_run"]["exit_code"] == 0
    assert tidy["last_run"]["summary"]["processed"] == 2
    # The recipe shown is the one the Python plan reports.
    assert tidy["recipe"] == project.plan()["tidy"]["recipe"]

    r = cli(project, "status")
    assert r.returncode == 0, r.stderr
    assert "tidy (declared in python:pipeline.py:tidy): 2 entries, 0 failed" in r.stdout, r.stdout

    port = free_port()
    serve = subprocess.Popen(
        [str(HIGHWATER), "serve", "--listen", f"127.0.0.1:{port}"],
        cwd=project.root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        page = None
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as resp:
                    page = resp.read().decode()
                break
            except OSError:
                assert serve.poll() is None, serve.stderr.read().decode()
                time.sleep(0.1)
        assert page is not None, "serve never answered"
        assert 'data-stage="tidy"' in page and "python:pipeline.py:tidy" in page, page
        assert 'data-stage="copy"' in page
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=5) as resp:
            api = json.loads(resp.read())
        declared = {s["name"]: s["declared_in"] for s in api["stages"]}
        assert declared == {"copy": "highwater.toml", "tidy": "python:pipeline.py:tidy"}, api
        assert api["errors"] == [], api
    finally:
        serve.kill()
        serve.wait(timeout=30)


def test_the_cli_lists_and_plans_a_python_stage(project):
    """Issue 48: in a folder whose only stages are Python's, `highwater
    plan`, `status` and `deps` show them (from the declarations the last
    Python plan or run recorded beside the state), and beside a
    highwater.toml `plan` includes them; `run` leaves them to Python."""
    project.write("pipeline.py", PIPELINE)
    project.write("data/a.txt", " a \n")
    project.write("data/b.txt", " b \n")
    assert project.run()["tidy"]["processed"] == 2

    r = cli(project, "plan", "--json")
    assert r.returncode == 0, r.stderr
    [stage] = json.loads(r.stdout)["stages"]
    assert (stage["name"], stage["changed"]) == ("tidy", []), stage
    assert "stage `tidy` is declared in Python (python:pipeline.py:tidy)" in r.stderr, r.stderr

    # An input edit: the CLI's plan and Python's agree, item and reason.
    project.write("data/b.txt", " b, edited \n")
    r = cli(project, "plan", "--json")
    assert r.returncode == 0, r.stderr
    [stage] = json.loads(r.stdout)["stages"]
    assert [(c["input"], c["reason"]) for c in stage["changed"]] == [("data/b.txt", "size")]
    py = project.plan()["tidy"]
    assert [(c["input"], c["reason"]) for c in py["changed"]] == [("data/b.txt", "size")]

    r = cli(project, "status", "--json")
    assert r.returncode == 0, r.stderr
    [st] = json.loads(r.stdout)["stages"]
    assert (st["name"], st["declared_in"], st["entries"]) == ("tidy", "python:pipeline.py:tidy", 2)
    assert st["recipe"] == py["recipe"]

    # Its items and what each read (its input is its own, not a
    # dependency), as the worker's audit hook saw them.
    r = cli(project, "deps", "tidy", "--json")
    assert r.returncode == 0, r.stderr
    items = json.loads(r.stdout)["items"]
    assert sorted(i["item"] for i in items) == ["data/a.txt", "data/b.txt"], items
    assert all(i["stage"] == "tidy" for i in items)

    # Beside a highwater.toml: plan lists both; run runs only the toml's.
    project.write("highwater.toml", TOML)
    project.write("raw/r.txt", "raw\n")
    r = cli(project, "plan", "--json")
    assert r.returncode == 0, r.stderr
    assert sorted(s["name"] for s in json.loads(r.stdout)["stages"]) == ["copy", "tidy"]
    r = cli(project, "run", "--json")
    assert r.returncode == 0, r.stderr
    assert [s["name"] for s in json.loads(r.stdout)["stages"]] == ["copy"]
    assert project.run()["tidy"]["processed"] == 1
