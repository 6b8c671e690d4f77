"""Files a Python stage's function reads are its dependencies (issue 48),
as they are for a CLI command's: seen by audit hooks in the worker, inside
the function and at the import of its modules, recorded with the engine's
evidence; an edit re-runs exactly the items that read the file, naming it.
Files it writes, and code files, are not dependencies."""

PIPELINE = '''
import json
import highwater as hw
import helpers

p = hw.Pipeline()

@p.stage(inputs=["data/*.txt"], output="out/{stem}.txt")
def tidy(input, output):
    config = json.load(open("config.json"))
    per_item = open(f"lookup/{input.stem}.txt").read().strip()
    with open("log.txt", "a") as log:
        log.write(input.name + "\\n")
    output.write_text(config["sep"].join([input.read_text().strip(), per_item, helpers.MODE]))
'''

HELPERS = '''
import pathlib

MODE = pathlib.Path(__file__).with_name("mode.txt").read_text().strip()
'''


def setup(project):
    project.write("pipeline.py", PIPELINE)
    project.write("helpers.py", HELPERS)
    project.write("config.json", '{"sep": "-"}')
    project.write("mode.txt", "m1\n")
    for name in ("a", "b"):
        project.write(f"data/{name}.txt", f"{name}\n")
        project.write(f"lookup/{name}.txt", f"{name}{name}\n")


def changed(project):
    return sorted((c["input"], c["reason"], c["detail"]) for c in project.plan()["tidy"]["changed"])


def test_a_file_the_function_reads_reruns_the_items_that_read_it(project):
    # The worker opens files relative to its working folder: the root.
    setup(project)
    r = project.run()["tidy"]
    assert (r["processed"], r["failed"]) == (2, []), r
    assert (project.root / "out/a.txt").read_text() == "a-aa-m1"
    # Nothing it wrote (its log, its output) is a dependency.
    assert changed(project) == []

    project.write("config.json", '{"sep": "+"}')
    assert changed(project) == [
        ("data/a.txt", "dependency", "config.json"),
        ("data/b.txt", "dependency", "config.json"),
    ]
    assert project.run()["tidy"]["processed"] == 2
    assert (project.root / "out/a.txt").read_text() == "a+aa+m1"

    # A file one item read re-runs that item only.
    project.write("lookup/b.txt", "bbb\n")
    assert changed(project) == [("data/b.txt", "dependency", "lookup/b.txt")]
    assert project.run()["tidy"]["processed"] == 1
    assert changed(project) == []


def test_a_file_read_at_import_is_a_dependency_of_every_item(project):
    setup(project)
    assert project.run()["tidy"]["processed"] == 2
    project.write("mode.txt", "m2\n")
    assert changed(project) == [
        ("data/a.txt", "dependency", "mode.txt"),
        ("data/b.txt", "dependency", "mode.txt"),
    ]
    assert project.run()["tidy"]["processed"] == 2
    assert (project.root / "out/b.txt").read_text() == "b-bb-m2"
    assert changed(project) == []


def test_a_tree_removed_before_the_run_names_no_dependency(project):
    # shutil.rmtree opens each folder relative to its parent's descriptor;
    # the audit event does not say so, and those names once became absent
    # files at the root that every item depended on (issue 48: a script
    # that removed a cache folder first made its run six times as long).
    setup(project)
    project.write(
        "pipeline.py",
        PIPELINE + "import os, shutil\n"
        "for d in ('sub1', 'sub2/deeper'):\n"
        "    os.makedirs(os.path.join('cache', d), exist_ok=True)\n"
        "    open(os.path.join('cache', d, 'entry.bin'), 'w').close()\n"
        "shutil.rmtree('cache')\n"
        "list(os.fwalk('data'))\n",
    )
    assert project.run()["tidy"]["processed"] == 2
    for name in ("sub1", "sub2", "deeper", "data"):
        (project.root / name).mkdir(exist_ok=True) if name == "data" else project.write(name, "x\n")
    assert changed(project) == []
    # What the function reads still counts.
    project.write("lookup/a.txt", "changed\n")
    assert changed(project) == [("data/a.txt", "dependency", "lookup/a.txt")]


C_READER = '''
import sqlite3
import highwater as hw

p = hw.Pipeline()

@p.stage(inputs=["data/*.txt"], output="out/{stem}.txt")
def lookup(input, output):
    db = sqlite3.connect("names.db")
    (name,) = db.execute("select name from names where id = ?", (input.stem,)).fetchone()
    output.write_text(name)

@p.stage(inputs=["data/*.txt"], output="plain/{stem}.txt")
def plain(input, output):
    output.write_text(input.read_text())
'''


def test_a_library_that_opens_files_in_c_is_named_as_unseen(project):
    # SQLite opens names.db itself, past Python's open and so past the read
    # hook: the plan says so for the stage that reaches it, and only there.
    import sqlite3

    project.write("pipeline.py", C_READER)
    project.write("data/a.txt", "a\n")
    db = sqlite3.connect(project.root / "names.db")
    db.execute("create table names (id text, name text)")
    db.execute("insert into names values ('a', 'Ada')")
    db.commit()
    db.close()
    plan = project.plan()
    assert plan["lookup"]["unresolved"] == [
        "library sqlite3: files SQLite opens in C are not seen as dependencies "
        "(declare them in version=, or read them through Python's open)"
    ], plan["lookup"]
    assert plan["plain"]["unresolved"] == []
    r = project.run()
    assert r["lookup"]["processed"] == 1 and (project.root / "out/a.txt").read_text() == "Ada"
