"""One namespace of stages (issue 48): a stage is its name and where it
was declared. The same name declared in two places of one root (a Python
script and highwater.toml; two scripts) is refused before anything runs,
naming both, by Python and by the CLI alike."""

import os
import subprocess
import sys
from pathlib import Path

HIGHWATER = Path(sys.executable).parent / "highwater"

TOML = '''
[stages.clean]
inputs = ["raw/*.txt"]
output = "copied/{name}"
command = ["cp", "{input}", "{output}"]
'''

SCRIPT = '''
import json, sys
import highwater as hw

p = hw.Pipeline()

@p.stage(inputs=["IN/*.txt"], output="OUT/{stem}.txt")
def clean(input, output):
    output.write_text(input.read_text().strip())

if __name__ == "__main__":
    print(json.dumps(p.run(jobs=1).as_dict()))
'''


def script(project, name, inputs="data", outputs="out"):
    project.write(name, SCRIPT.replace("IN/", f"{inputs}/").replace("OUT/", f"{outputs}/"))


def call(project, *args):
    return subprocess.run(
        [*args], cwd=project.root, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )


def py(project, name):
    return call(project, sys.executable, name)


def cli(project, *args):
    return call(project, str(HIGHWATER), *args)


def test_a_python_stage_named_like_a_toml_stage_is_refused(project):
    project.write("highwater.toml", TOML)
    project.write("raw/r.txt", "raw\n")
    assert cli(project, "run").returncode == 0
    script(project, "etl.py")
    project.write("data/a.txt", " a \n")
    r = py(project, "etl.py")
    assert r.returncode == 1, r.stderr
    assert (
        "stage `clean` is declared in two places: python:etl.py:clean and highwater.toml"
        in r.stderr
    ), r.stderr
    assert "`name=` on the Python decorator" in r.stderr
    # Nothing ran: the toml stage's output stands, the Python one never came.
    assert (project.root / "copied/r.txt").read_text() == "raw\n"
    assert not (project.root / "out").exists()
    r = cli(project, "plan", "--json")
    assert r.returncode == 0, r.stderr


def test_the_cli_refuses_a_toml_stage_a_python_script_declared_first(project):
    script(project, "etl.py")
    project.write("data/a.txt", " a \n")
    assert py(project, "etl.py").returncode == 0
    project.write("highwater.toml", TOML)
    project.write("raw/r.txt", "raw\n")
    for args in (["run"], ["plan"]):
        r = cli(project, *args)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert (
            "stage `clean` is declared in two places: highwater.toml and python:etl.py:clean"
            in r.stderr
        ), r.stderr
    assert (project.root / "out/a.txt").read_text() == "a"
    assert not (project.root / "copied").exists()


def test_two_scripts_of_one_folder_with_one_stage_name_are_refused(project):
    script(project, "first.py")
    script(project, "second.py", inputs="other", outputs="elsewhere")
    project.write("data/a.txt", " a \n")
    project.write("other/b.txt", " b \n")
    assert py(project, "first.py").returncode == 0
    r = py(project, "second.py")
    assert r.returncode == 1, r.stderr
    assert (
        "stage `clean` is declared in two places: python:second.py:clean and python:first.py:clean"
        in r.stderr
    ), r.stderr
    assert (project.root / "out/a.txt").read_text() == "a"
    assert not (project.root / "elsewhere").exists()
    # The first script is still the stage's; it re-runs nothing.
    r = py(project, "first.py")
    assert r.returncode == 0, r.stderr
    assert '"processed": 0' in r.stdout

    # A stage moved to another file (the old one no longer names it) is the
    # same stage, not a second declaration.
    (project.root / "first.py").unlink()
    r = py(project, "second.py")
    assert r.returncode == 0, r.stderr
    assert (project.root / "elsewhere/b.txt").read_text() == "b"
