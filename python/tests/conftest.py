"""Helpers of the Python tests (issue 22): a throw-away project folder whose
pipeline runs in a fresh interpreter each time, as a user's would, so that an
edit to a module is seen exactly as on the next real run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# What each project's `run.py` does: plan or run its pipeline and print the
# outcome as JSON on stdout.
DRIVER = '''
import json, sys
from pipeline import p

def main():
    what = sys.argv[1]
    if what == "plan":
        out = p.plan()
    elif what == "run":
        out = p.run(jobs=int(sys.argv[2]) if len(sys.argv) > 2 else 2, raise_on_failure=False)
    else:
        raise SystemExit(f"unknown {what}")
    print(json.dumps(out.as_dict()))

if __name__ == "__main__":
    main()
'''


class Project:
    def __init__(self, root: Path):
        self.root = root
        (root / "run.py").write_text(DRIVER)

    def write(self, rel: str, text: str) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path

    def call(self, *args: str, check: bool = True) -> dict:
        r = subprocess.run(
            [sys.executable, "run.py", *args],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )
        if check and r.returncode != 0:
            raise AssertionError(f"run.py {args} exited {r.returncode}:\n{r.stderr}")
        return json.loads(r.stdout)

    def run(self) -> dict:
        return self.call("run")["stages"]

    def plan(self) -> dict:
        return self.call("plan")["stages"]


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path)
