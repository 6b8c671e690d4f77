"""Issue 49 from Python: a stage declared with `compare="data"` does not
re-run for a gzip input whose bytes changed and whose data did not (a new
header mtime), says so as `layout`, and re-runs for a changed byte of the
content."""

import gzip

PIPELINE = '''
import gzip
import highwater as hw

p = hw.Pipeline(".")

@p.stage(inputs=["data/*.gz"], output="out/{stem}", compare="data")
def unzip(input, output):
    output.write_bytes(gzip.decompress(input.read_bytes()))
'''


def write_gz(project, text: str, mtime: int) -> None:
    path = project.root / "data/a.txt.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as raw:
        with gzip.GzipFile(filename="a.txt", mode="wb", fileobj=raw, mtime=mtime) as g:
            g.write(text.encode())


def test_a_regzipped_input_is_layout_and_a_changed_one_re_runs(project):
    project.write("pipeline.py", PIPELINE)
    write_gz(project, "alpha\n", 1)
    assert project.run()["unzip"]["processed"] == 1
    write_gz(project, "alpha\n", 2)
    plan = project.plan()["unzip"]
    assert plan["changed"] == []
    assert plan["layout"] == ["data/a.txt.gz"]
    r = project.run()["unzip"]
    assert (r["processed"], r["layout"]) == (0, ["data/a.txt.gz"])
    write_gz(project, "omega\n", 2)
    r = project.run()["unzip"]
    assert r["processed"] == 1
    assert (project.root / "out/a.txt").read_text() == "omega\n"
