"""The seed's change-detection tests, from Python (issue 22): process, and
everything ran; re-run, and nothing ran; edit a file, and exactly one item
ran; bump the recipe, and everything ran."""

PIPELINE = '''
import highwater as hw
import helpers

p = hw.Pipeline(".")

@p.stage(inputs=["data/*.txt"], output="out/{stem}.txt", version=VERSION)
def tidy(input, output):
    output.write_text(helpers.clean(input.read_text()))
'''

HELPERS = '''
def clean(text):
    return text.strip().upper() + "\\n"
'''


def setup(project, version="None"):
    project.write("pipeline.py", PIPELINE.replace("VERSION", version))
    project.write("helpers.py", HELPERS)
    for name in ("a", "b", "c"):
        project.write(f"data/{name}.txt", f"  {name} text  \n")


def test_process_rerun_edit_bump(project):
    setup(project)
    first = project.run()["tidy"]
    assert (first["processed"], first["new"], first["failed"]) == (3, 3, [])
    assert (project.root / "out/a.txt").read_text() == "A TEXT\n"

    again = project.run()["tidy"]
    assert (again["processed"], again["unchanged"]) == (0, 3)

    project.write("data/b.txt", "  b edited  \n")
    plan = project.plan()["tidy"]
    assert [(c["input"], c["reason"]) for c in plan["changed"]] == [("data/b.txt", "size")]
    edited = project.run()["tidy"]
    assert (edited["processed"], edited["unchanged"]) == (1, 2)
    assert (project.root / "out/b.txt").read_text() == "B EDITED\n"

    # `version=` on the decorator stands for the whole code recipe.
    setup(project, version='"2"')
    plan = project.plan()["tidy"]
    assert sorted((c["input"], c["reason"]) for c in plan["changed"]) == [
        ("data/a.txt", "recipe"),
        ("data/b.txt", "recipe"),
        ("data/c.txt", "recipe"),
    ]
    bumped = project.run()["tidy"]
    assert (bumped["processed"], bumped["unchanged"]) == (3, 0)
    assert project.plan()["tidy"]["changed"] == []


def test_deleted_input_removes_its_output_and_failure_keeps_traceback(project):
    setup(project)
    project.write(
        "helpers.py",
        '''
        def clean(text):
            if "boom" in text:
                raise ValueError("cannot clean " + text.strip())
            return text.strip().upper() + "\\n"
        ''',
    )
    project.write("data/c.txt", "boom\n")
    r = project.run()["tidy"]
    assert r["processed"] == 2
    [failed] = r["failed"]
    assert failed["input"] == "data/c.txt"
    # The Python traceback is the item's error, as a command's stderr is.
    assert "Traceback" in failed["error"] and "ValueError: cannot clean boom" in failed["error"]
    assert not (project.root / "out/c.txt").exists()

    (project.root / "data/a.txt").unlink()
    project.write("data/c.txt", "fixed\n")
    plan = project.plan()["tidy"]
    assert sorted((c["input"], c["reason"]) for c in plan["changed"]) == [
        ("data/a.txt", "deleted"),
        ("data/c.txt", "failed"),
    ]
    r = project.run()["tidy"]
    assert (r["processed"], r["deleted"], r["failed"]) == (1, 1, [])
    assert not (project.root / "out/a.txt").exists()
    assert (project.root / "out/c.txt").read_text() == "FIXED\n"
