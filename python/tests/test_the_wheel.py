"""Install without Rust (issue 48): this suite runs against the very wheel
scripts/py.sh builds (manylinux_2_28, its extension linked against glibc
2.28's symbols) with no cargo on PATH, and the wheel installs into a fresh
venv, with no network and no compiler, and runs a pipeline there.

scripts/py.sh passes the wheel's path in HIGHWATER_WHEEL; without it the
test fails (it does not skip)."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

def wheel() -> Path:
    path = os.environ.get("HIGHWATER_WHEEL")
    assert path, "HIGHWATER_WHEEL is not set: run the suite with scripts/py.sh, which builds the wheel"
    return Path(path)


def test_the_suite_runs_the_wheel_it_built_without_cargo():
    whl = wheel()
    tags = whl.name[: -len(".whl")].split("-")[-1]
    assert tags == "manylinux_2_28_x86_64", whl.name
    with zipfile.ZipFile(whl) as z:
        ext = [n for n in z.namelist() if n.startswith("highwater/_core") and n.endswith(".so")]
        assert len(ext) == 1, z.namelist()
        assert "highwater/py.typed" in z.namelist()
        # The glibc symbol versions the extension needs (the names in its
        # dynamic string table): none past 2.28, which the tag promises.
        needed = {int(v) for v in re.findall(rb"GLIBC_2\.(\d+)", z.read(ext[0]))}
    assert needed and max(needed) <= 28, sorted(needed)
    # The package the suite imports is that wheel, and no cargo is at hand.
    dist = importlib.metadata.distribution("highwater")
    assert f"-{tags}\n" in (dist.read_text("WHEEL") or ""), dist.read_text("WHEEL")
    assert dist.version == whl.name.split("-")[1]
    for tool in ("cargo", "rustc"):
        assert shutil.which(tool) is None, f"{tool} is on PATH: {shutil.which(tool)}"


PIPELINE = '''
import json
import highwater as hw

p = hw.Pipeline()

@p.stage(inputs=["data/*.txt"], output="out/{stem}.txt")
def shout(input, output):
    with open("config.json") as f:
        mark = json.load(f)["mark"]
    output.write_text(input.read_text().strip().upper() + mark)

if __name__ == "__main__":
    import sys
    if sys.argv[1:] == ["plan"]:
        plan = p.plan()
        print(json.dumps({n: [[i.input, i.reason] for i in s.changed] for n, s in plan.stages.items()}))
    else:
        r = p.run(jobs=2)
        print(json.dumps({n: s.processed for n, s in r.stages.items()}))
'''


def test_the_wheel_installs_into_a_fresh_venv_and_runs_a_pipeline_with_no_rust(tmp_path):
    whl = wheel()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin/python"
    # Only the venv's own bin on PATH: no cargo, rustc, cc or maturin.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CARGO", "RUST", "VIRTUAL_ENV", "PYTHON"))}
    env["PATH"] = str(venv / "bin")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for tool in ("cargo", "rustc", "cc", "gcc", "maturin"):
        assert shutil.which(tool, path=env["PATH"]) is None, tool
    r = subprocess.run(
        [str(py), "-m", "pip", "install", "--no-index", "--no-deps", "--quiet", str(whl)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr

    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "pipeline.py").write_text(textwrap.dedent(PIPELINE))
    (project / "config.json").write_text('{"mark": "!"}')
    (project / "data/a.txt").write_text("a\n")
    (project / "data/b.txt").write_text("b\n")

    def call(*args: str, cwd: Path = project) -> str:
        r = subprocess.run([*args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{args} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
        return r.stdout

    # Run from another folder: the root is the script's.
    out = call(str(py), str(project / "pipeline.py"), cwd=tmp_path)
    assert out.strip() == '{"shout": 2}', out
    assert (project / "out/a.txt").read_text() == "A!"
    assert call(str(py), "pipeline.py", "plan").strip() == '{"shout": []}'
    (project / "config.json").write_text('{"mark": "?"}')
    assert call(str(py), "pipeline.py", "plan").strip() == (
        '{"shout": [["data/a.txt", "dependency"], ["data/b.txt", "dependency"]]}'
    )
    # The console script from the wheel: the CLI inside the extension.
    status = call(str(venv / "bin/highwater"), "status")
    assert "shout" in status, status
    version = call(str(py), "-c", "import highwater; print(highwater.__version__)").strip()
    assert version == whl.name.split("-")[1], version
