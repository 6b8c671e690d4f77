"""Dagster (issue 22): a stage as an asset materializes, and after an edit
to a helper the stage calls Dagster itself reports it stale, because its
code_version is the stage's recipe id."""

import json
import os
import subprocess
import sys

PIPELINE = '''
import highwater as hw
import helpers

p = hw.Pipeline(".")

@p.stage(inputs=["data/*.txt"], output="out/{stem}.txt")
def tidy(input, output):
    output.write_text(helpers.clean(input.read_text()))
'''

DEFS = '''
import json, sys
import dagster as dg
from dagster._core.instance.ref import InstanceRef
from dagster._utils.test.data_versions import get_stale_status_resolver
from highwater.dagster import asset
from pipeline import p

tidy = asset(p, "tidy")

def main():
  instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(sys.argv[2]))
  if sys.argv[1] == "materialize":
    r = dg.materialize([tidy], instance=instance)
    mat = r.asset_materializations_for_node("tidy")[0]
    print(json.dumps({"success": r.success, "processed": mat.metadata["processed"].value}))
  else:
    res = get_stale_status_resolver(instance, [tidy])
    print(json.dumps({
        "status": res.get_status(tidy.key).value,
        "causes": [[c.category.value, c.reason] for c in res.get_stale_causes(tidy.key)],
        "code_version": tidy.code_versions_by_key[tidy.key],
    }))

# Items run in spawned processes, which import this script again.
if __name__ == "__main__":
    main()
'''


def dagster(project, what, *args):
    """Runs the project's defs.py with `what`, the Dagster home and `args`
    in a fresh interpreter; what it printed last, as JSON."""
    r = subprocess.run(
        [sys.executable, "defs.py", what, str(project.root / "dagster-home"), *args],
        cwd=project.root,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "DAGSTER_HOME": str(project.root / "dagster-home")},
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_asset_materializes_and_goes_stale_after_a_helper_edit(project):
    project.write("pipeline.py", PIPELINE)
    project.write("helpers.py", "def clean(t):\n    return t.strip()\n")
    project.write("defs.py", DEFS)
    project.write("data/a.txt", " a \n")
    (project.root / "dagster-home").mkdir()

    assert dagster(project, "materialize") == {"success": True, "processed": 1}
    assert (project.root / "out/a.txt").read_text() == "a"
    fresh = dagster(project, "status")
    assert fresh["status"] == "FRESH", fresh
    assert fresh["code_version"] == project.call("plan")["stages"]["tidy"]["recipe"]

    # A docstring edit changes nothing, for Dagster either.
    project.write("helpers.py", 'def clean(t):\n    """Strips."""\n    return t.strip()\n')
    assert dagster(project, "status")["status"] == "FRESH"

    project.write("helpers.py", "def clean(t):\n    return t.strip().upper()\n")
    stale = dagster(project, "status")
    assert stale["status"] == "STALE", stale
    assert [c[0] for c in stale["causes"]] == ["CODE"]

    again = dagster(project, "materialize")
    assert again == {"success": True, "processed": 1}
    assert (project.root / "out/a.txt").read_text() == "A"
    assert dagster(project, "status")["status"] == "FRESH"


# Issue 48: the stage's inputs as an observable source asset whose data
# version is what the engine sees of them, so that an input edit (or an
# edit to a file the function reads) makes the asset stale.
DATA_PIPELINE = '''
import json
import highwater as hw

p = hw.Pipeline(".")

@p.stage(inputs=["data/*.txt"], output="out/{stem}.txt")
def tidy(input, output):
    with open("config.json") as f:
        sep = json.load(f)["sep"]
    output.write_text(sep.join(input.read_text().split()))
'''

DATA_DEFS = '''
import json, sys
import dagster as dg
from dagster._core.definitions.observe import observe
from dagster._core.instance.ref import InstanceRef
from dagster._utils.test.data_versions import get_stale_status_resolver
from highwater.dagster import assets
from pipeline import p

inputs, tidy = assets(p, "tidy")

def main():
  instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(sys.argv[2]))
  if sys.argv[1] == "observe":
    assert observe([inputs], instance=instance).success
    print(json.dumps({}))
  elif sys.argv[1] == "materialize":
    r = dg.materialize([tidy], instance=instance)
    mat = r.asset_materializations_for_node("tidy")[0]
    print(json.dumps({"success": r.success, "processed": mat.metadata["processed"].value}))
  else:
    res = get_stale_status_resolver(instance, [inputs, tidy])
    print(json.dumps({
        "status": res.get_status(tidy.key).value,
        "causes": [[c.category.value, c.reason] for c in res.get_stale_causes(tidy.key)],
    }))

if __name__ == "__main__":
    main()
'''


def test_an_input_edit_makes_the_asset_stale(project):
    project.write("pipeline.py", DATA_PIPELINE)
    project.write("defs.py", DATA_DEFS)
    project.write("config.json", '{"sep": "-"}')
    project.write("data/a.txt", "a b\n")
    project.write("data/b.txt", "c d\n")
    (project.root / "dagster-home").mkdir()

    def status():
        return dagster(project, "status")["status"]

    dagster(project, "observe")
    assert dagster(project, "materialize") == {"success": True, "processed": 2}
    # The first run recorded config.json as read: the version grows by it
    # once (as documented), and the next materialisation runs nothing.
    dagster(project, "observe")
    assert dagster(project, "materialize") == {"success": True, "processed": 0}
    dagster(project, "observe")
    assert status() == "FRESH"

    # An input edit: stale (once observed), with the cause DATA.
    project.write("data/a.txt", "a b e\n")
    dagster(project, "observe")
    stale = dagster(project, "status")
    assert stale["status"] == "STALE", stale
    assert [c[0] for c in stale["causes"]] == ["DATA"], stale
    assert dagster(project, "materialize") == {"success": True, "processed": 1}
    assert (project.root / "out/a.txt").read_text() == "a-b-e"
    # The run changed nothing else: the next observation keeps it fresh.
    dagster(project, "observe")
    assert status() == "FRESH"

    # An edit to the file the function reads: stale too.
    project.write("config.json", '{"sep": "+"}')
    dagster(project, "observe")
    assert status() == "STALE"
    assert dagster(project, "materialize") == {"success": True, "processed": 2}
    dagster(project, "observe")
    assert status() == "FRESH"

    # A new input and a deleted one: stale; a rewrite with the same
    # content: not.
    project.write("data/c.txt", "f\n")
    dagster(project, "observe")
    assert status() == "STALE"
    assert dagster(project, "materialize") == {"success": True, "processed": 1}
    dagster(project, "observe")
    assert status() == "FRESH"
    (project.root / "data/b.txt").unlink()
    dagster(project, "observe")
    assert status() == "STALE"
    dagster(project, "materialize")
    dagster(project, "observe")
    assert status() == "FRESH"
    project.write("data/a.txt", "a b e\n")
    dagster(project, "observe")
    assert status() == "FRESH"
