"""The code recipe (issue 22): which edits re-run which items, with which
reason and which named component. One `check` helper; the cases are the
edit and what it must re-run."""

import json
import subprocess
import sys
import time

import pytest

PIPELINE = '''
import highwater as hw
import helpers

p = hw.Pipeline(".")

@p.stage(inputs=["data/*.txt"], output="out/{stem}.txt")
def tidy(input, output):
    """Tidies one text."""
    text = helpers.clean(input.read_text())
    text = helpers.Cleaner().run(text)
    text = helpers.norm(text)
    output.write_text(helpers.JOIN(text))
'''

HELPERS = '''
"""Helpers of the test project."""
MARK = "*"
SEP = "|"


def clean(text):
    """Strips the text."""
    # trailing blanks go
    return text.strip() + MARK


def unused(text):
    return text * 2


class Cleaner:
    """Lower-cases."""
    def run(self, text):
        return text.lower()


norm = lambda s: s.replace("  ", " ")


def joiner():
    prefix = ">"
    def join(s):
        return prefix + s + SEP
    return join


JOIN = joiner()
'''

EVERYTHING = ["data/a.txt", "data/b.txt"]

# (case, old text in helpers.py, new text, items re-run, detail)
CASES = [
    ("helper", 'text.strip() + MARK', 'text.strip(" ") + MARK', EVERYTHING, "helpers.clean"),
    ("docstring", '"""Strips the text."""', '"""Strips the text, and more."""', [], None),
    ("comment and formatting", "    # trailing blanks go\n    return text.strip() + MARK",
     "    # blanks at both ends go\n    return (text.strip()\n            + MARK)", [], None),
    ("uncalled function", "return text * 2", "return text * 3", [], None),
    ("constant", 'MARK = "*"', 'MARK = "+"', EVERYTHING, "helpers.MARK"),
    ("method", "return text.lower()", "return text.casefold()", EVERYTHING, "helpers.Cleaner.run"),
    ("lambda", 'norm = lambda s: s.replace("  ", " ")', 'norm = lambda s: s.replace("   ", " ")',
     EVERYTHING, "helpers.norm"),
    ("closure over a module global", 'SEP = "|"', 'SEP = "/"', EVERYTHING, "helpers.SEP"),
    ("closure variable", 'prefix = ">"', 'prefix = "<"', EVERYTHING,
     "helpers.joiner.<locals>.join.<closure prefix>"),
]


def check(project, old, new, rerun, detail):
    project.write("pipeline.py", PIPELINE)
    project.write("helpers.py", HELPERS)
    for name in ("a", "b"):
        project.write(f"data/{name}.txt", f" {name}  text \n")
    assert project.run()["tidy"]["processed"] == 2
    assert old in HELPERS
    project.write("helpers.py", HELPERS.replace(old, new))
    plan = project.plan()["tidy"]
    got = [(c["input"], c["reason"], c["detail"]) for c in plan["changed"]]
    assert got == [(i, "recipe", detail) for i in rerun]
    r = project.run()["tidy"]
    assert (r["processed"], r["failed"]) == (len(rerun), [])
    assert project.plan()["tidy"]["changed"] == []


@pytest.mark.parametrize("case,old,new,rerun,detail", CASES, ids=[c[0] for c in CASES])
def test_edit_reruns_exactly(project, case, old, new, rerun, detail):
    check(project, old, new, rerun, detail)


def test_dynamic_references_are_listed_unresolved(project):
    project.write(
        "pipeline.py",
        '''
        import importlib
        import highwater as hw
        import helpers

        p = hw.Pipeline(".")

        @p.stage(inputs=["data/*.txt"], output="out/{stem}.txt")
        def tidy(input, output):
            name = "clean"
            fn = getattr(helpers, name)
            mod = importlib.import_module("helpers")
            output.write_text(fn(input.read_text()) + str(mod))
        ''',
    )
    project.write("helpers.py", "def clean(t):\n    return t\n")
    project.write("data/a.txt", "a\n")
    plan = project.plan()["tidy"]
    unresolved = "\n".join(plan["unresolved"])
    assert "getattr with a computed name" in unresolved
    assert "importlib.import_module" in unresolved


def test_ignore_and_libraries(project):
    # `ignore=` drops a component: an edit there re-runs nothing. A library
    # from outside the project is in the recipe as name==version.
    project.write(
        "pipeline.py",
        '''
        import highwater as hw
        import pytest
        import helpers

        p = hw.Pipeline(".")

        @p.stage(inputs=["data/*.txt"], output="out/{stem}.txt", ignore=["helpers.log"])
        def tidy(input, output):
            helpers.log(pytest.__name__)
            output.write_text(input.read_text())
        ''',
    )
    project.write("helpers.py", "def log(t):\n    return t\n")
    project.write("data/a.txt", "a\n")
    plan = project.plan()["tidy"]
    assert plan["components"]["library pytest"].startswith("pytest==")
    assert "helpers.log" not in plan["components"]
    assert project.run()["tidy"]["processed"] == 1
    project.write("helpers.py", "def log(t):\n    return t * 2\n")
    assert project.plan()["tidy"]["changed"] == []


def test_library_versions_are_what_importlib_metadata_says():
    # A library's version is read from its `.dist-info` folder without
    # importing importlib.metadata (35 ms of a no-change plan, issue 48):
    # for every distribution installed here, under each name a module could
    # give it, the answer is importlib.metadata's, or the lookup defers to it.
    import importlib.metadata as m

    from highwater import recipe

    checked = 0
    for d in m.distributions():
        name = d.metadata["Name"]
        for top in {name, name.replace("-", "_"), name.lower(), name.split("-")[0]}:
            fast = recipe._distribution_by_name(top)
            try:
                found = m.distribution(top)
                slow = [f"{found.metadata['Name']}=={found.version}"]
            except m.PackageNotFoundError:
                slow = []
            if fast is not None:
                assert fast == slow, (top, fast, slow)
                checked += 1
    assert checked > 100, checked  # the venv holds pytest, dagster and their dependencies
    import highwater

    assert recipe._distributions("highwater") == [f"highwater=={highwater.__version__}"]


def test_a_distribution_inside_a_zip_on_sys_path_is_importlib_metadatas(tmp_path, monkeypatch):
    # A zip archive on sys.path is read inside by importlib.metadata; the
    # folder lookup defers to it rather than calling the library unversioned.
    import zipfile

    from highwater import recipe

    archive = tmp_path / "bundle.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("zipped_lib/__init__.py", "")
        z.writestr("zipped_lib-1.2.dist-info/METADATA", "Metadata-Version: 2.1\nName: zipped-lib\nVersion: 1.2\n")
    monkeypatch.syspath_prepend(str(archive))
    assert recipe._distribution_by_name("zipped_lib") is None
    assert recipe._distributions("zipped_lib") == ["zipped-lib==1.2"]


def test_kept_module_facts_never_vouch_for_an_edited_file(project):
    # A plan keeps what it read of each module's syntax tree in the state
    # folder, keyed by the file's stat, so that an unchanged module is not
    # parsed again. An edit of the same size, and a cache file that is not
    # ours, must still give the recipe a fresh parse gives.
    project.write("pipeline.py", PIPELINE)
    project.write("helpers.py", HELPERS)
    project.write("data/a.txt", " a  text \n")
    # Files changed within 2 s of a plan are not kept (the racy margin):
    # wait it out, so that this plan keeps helpers.py's facts.
    time.sleep(2.2)
    assert project.run()["tidy"]["processed"] == 1
    cache = project.root / ".highwater" / "python-recipe-facts"
    assert cache.exists()
    assert str(project.root / "helpers.py").encode() in cache.read_bytes()
    assert project.plan()["tidy"]["changed"] == []

    # Same size, one character: only the stat tells the file changed.
    edited = HELPERS.replace('MARK = "*"', 'MARK = "+"')
    assert len(edited) == len(HELPERS)
    project.write("helpers.py", edited)
    got = [(c["input"], c["reason"], c["detail"]) for c in project.plan()["tidy"]["changed"]]
    assert got == [("data/a.txt", "recipe", "helpers.MARK")]
    assert project.run()["tidy"]["processed"] == 1

    # A cache that is not what a plan wrote is ignored, not trusted.
    real = cache.read_bytes()
    damaged = real[:-1] + bytes([real[-1] ^ 1])
    for junk in (b"", b"\x00garbage", b"\xe3" + b"\xff" * 64, damaged):
        cache.write_bytes(junk)
        assert project.plan()["tidy"]["changed"] == []
    project.write("helpers.py", HELPERS)
    got = [(c["input"], c["detail"]) for c in project.plan()["tidy"]["changed"]]
    assert got == [("data/a.txt", "helpers.MARK")]


MAIN = '''

if __name__ == "__main__":
    import json
    print(json.dumps(p.plan().as_dict()))
'''


@pytest.mark.parametrize("how", [["pipeline.py"], ["-m", "pipeline"]], ids=["script", "module"])
def test_a_script_and_its_import_are_one_recipe(project, how):
    # Run as a script (`__main__`) or imported by a driver (run.py here;
    # Dagster and Airflow likewise), a stage is the same stage: its
    # components are named by the module, never `__main__`, so switching
    # between the two re-runs nothing. And an edit is named the same way.
    project.write("pipeline.py", PIPELINE + MAIN)
    project.write("helpers.py", HELPERS)
    project.write("data/a.txt", " a  text \n")
    assert project.run()["tidy"]["processed"] == 1  # run.py: `from pipeline import p`

    def plan_as_main():
        r = subprocess.run(
            [sys.executable, *how], cwd=project.root, capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["stages"]["tidy"]

    got = plan_as_main()
    assert got["changed"] == [], got
    assert "pipeline.tidy" in got["components"] and not any(
        k.startswith("__main__") for k in got["components"]
    ), got["components"]
    project.write("pipeline.py", (PIPELINE + MAIN).replace('"""Tidies one text."""', "x = 1"))
    got = plan_as_main()
    assert [(c["input"], c["reason"], c["detail"]) for c in got["changed"]] == [
        ("data/a.txt", "recipe", "pipeline.tidy")
    ]
