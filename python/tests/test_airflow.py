"""Airflow (issue 22): a highwater task runs the stage, skips when the plan
is empty (Airflow then records no asset event), and runs again after a
helper edit. Airflow lives in a venv of its own (scripts/py.sh makes it:
its pins and Dagster's need not agree) and holds the wheel built from this
checkout, as an Airflow worker would. A missing Airflow fails the test."""

import json
import os
import subprocess
from pathlib import Path

PIPELINE = '''
import highwater as hw
import helpers

p = hw.Pipeline(".")

@p.stage(inputs=["data/*.txt"], output="out/{stem}.txt")
def tidy(input, output):
    output.write_text(helpers.clean(input.read_text()))
'''

DAG = '''
import json
import pendulum
from airflow.sdk import DAG
from highwater.airflow import task
from pipeline import p

with DAG("highwater_tidy", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")) as dag:
    tidy = task(p, "tidy")

# Items run in spawned processes, which import this file again.
if __name__ == "__main__":
    run = dag.test()
    print(json.dumps({ti.task_id: str(ti.state) for ti in run.get_task_instances()}))
'''


def test_task_skips_on_an_empty_plan(project):
    python = os.environ.get("HIGHWATER_TEST_AIRFLOW_PYTHON")
    assert python, "HIGHWATER_TEST_AIRFLOW_PYTHON is not set: run the tests through scripts/py.sh"
    project.write("pipeline.py", PIPELINE)
    project.write("helpers.py", "def clean(t):\n    return t.strip()\n")
    project.write("dag.py", DAG)
    project.write("data/a.txt", " a \n")
    home = project.root / "airflow-home"
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(project.root),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    airflow = str(Path(python).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=600)

    def dag_test():
        r = subprocess.run(
            [python, "dag.py"], cwd=project.root, env=env, capture_output=True, text=True, timeout=600
        )
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])["highwater_tidy"]

    assert dag_test() == "success"
    assert (project.root / "out/a.txt").read_text() == "a"
    assert dag_test() == "skipped"
    project.write("helpers.py", "def clean(t):\n    return t.strip().upper()\n")
    assert dag_test() == "success"
    assert (project.root / "out/a.txt").read_text() == "A"
