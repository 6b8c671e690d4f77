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
