"""The package behaves like one (issue 48): `py.typed` and type hints that
`typing.get_type_hints` can read, `__version__`, docstrings, a readable
`repr`, each run's outcome on the `highwater` logger, and a progress bar on
a terminal (nothing when stderr is not one)."""

import importlib.metadata
import logging
import os
import pty
import subprocess
import sys
import typing
from pathlib import Path

import highwater as hw


def test_version_type_hints_docstrings_and_repr(tmp_path):
    assert hw.__version__ == importlib.metadata.version("highwater")
    assert (Path(hw.__file__).parent / "py.typed").is_file()
    for fn in (hw.Pipeline.__init__, hw.Pipeline.stage, hw.Pipeline.plan, hw.Pipeline.run):
        hints = typing.get_type_hints(fn)
        assert "return" in hints, fn
    assert typing.get_type_hints(hw.Pipeline.run)["return"] is hw.Result
    for obj in (hw, hw.Pipeline, hw.Plan, hw.Result, hw.Pipeline.stage, hw.Pipeline.plan,
                hw.Pipeline.run, hw.RunFailed, hw.GuardError):
        assert obj.__doc__ and obj.__doc__.strip(), obj
    p = hw.Pipeline(tmp_path)
    assert repr(p) == f"Pipeline(root={str(tmp_path)!r}, stages=[])"


def test_a_run_logs_to_the_highwater_logger(tmp_path, caplog):
    (tmp_path / "data").mkdir()
    (tmp_path / "data/good.txt").write_text("good\n")
    (tmp_path / "data/bad.txt").write_text("bad\n")
    p = hw.Pipeline(tmp_path)

    @p.stage(inputs=["data/*.txt"], output="out/{stem}.txt", in_process=True)
    def tidy(input, output):
        if input.stem == "bad":
            raise ValueError("this input is bad")
        output.write_text(input.read_text())

    with caplog.at_level(logging.INFO, logger="highwater"):
        result = p.run(raise_on_failure=False)
    assert not result.ok
    got = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert ("highwater", "INFO", "stage tidy: 1 processed, 0 unchanged, 0 deleted, 1 failed") in got, got
    assert (
        "highwater", "WARNING", "stage tidy: data/bad.txt failed: ValueError: this input is bad"
    ) in got, got


SCRIPT = '''
import highwater as hw

p = hw.Pipeline()

@p.stage(inputs=["data/*.txt"], output="out/{stem}.txt")
def tidy(input, output):
    output.write_text(input.read_text())

if __name__ == "__main__":
    p.run(jobs=1)
'''


def test_a_progress_bar_on_a_terminal_and_nothing_otherwise(tmp_path):
    (tmp_path / "pipeline.py").write_text(SCRIPT)
    (tmp_path / "data").mkdir()
    for i in range(3):
        (tmp_path / f"data/{i}.txt").write_text(f"{i}\n")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    r = subprocess.run([sys.executable, "pipeline.py"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0 and r.stderr == "", r.stderr

    for f in (tmp_path / "out").iterdir():
        f.unlink()
    (tmp_path / "data/0.txt").write_text("changed\n")
    (tmp_path / "data/1.txt").write_text("changed\n")
    main, sub = pty.openpty()
    proc = subprocess.Popen([sys.executable, "pipeline.py"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=sub, env=env)
    os.close(sub)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(timeout=300) == 0, seen
    os.close(main)
    assert b"tidy [" in seen and b"/3" in seen, seen
