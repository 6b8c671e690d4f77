"""The code recipe misses nothing silently (issue 48): each construct the
recipe used to miss (an edit re-ran nothing; the outputs were stale), or
hashed by an address (everything re-ran at every plan). Per construct: the
exact items re-run, with the detail naming the component; a stage that does
not reach it re-runs nothing."""

import pytest

PIPELINE = '''
import functools
import highwater as hw
import helpers

p = hw.Pipeline(ROOT)

@p.stage(inputs=["data/*.txt"], output="out/{stem}.txt")
def uses(input, output):
    text = input.read_text().strip()
    BODY
    output.write_text(str(text))

@p.stage(inputs=["other/*.txt"], output="other-out/{stem}.txt")
def other(input, output):
    output.write_text(input.read_text())
'''

USES = ["data/a.txt", "data/b.txt"]

# (case, helpers.py, the body of `uses`, old text, new text, detail, re-run)
CASES = [
    (
        "a constant built from another",
        "BASE = 2\nDERIVED = BASE * 2\n",
        "text = text * helpers.DERIVED",
        "BASE = 2", "BASE = 3", "helpers.BASE", USES,
    ),
    (
        "a value made by a call at import",
        "def factory():\n    return 2\n\n\nSCALE = factory()\n",
        "text = text * helpers.SCALE",
        "return 2", "return 3", "helpers.factory", USES,
    ),
    (
        "a call at import that registers a function",
        "ORDER = []\n\n\ndef f(t):\n    return t + 'f'\n\n\nORDER.append(f)\n",
        "for g in helpers.ORDER:\n        text = g(text)",
        "return t + 'f'", "return t + 'F'", "helpers.f", USES,
    ),
    (
        "the class of a module-level instance",
        "class Base:\n    def run(self, t):\n        return t.upper()\n\n\n"
        "class Child(Base):\n    pass\n\n\nINSTANCE = Child()\n",
        "text = helpers.INSTANCE.run(text)",
        "return t.upper()", "return t.lower()", "helpers.Base.run", USES,
    ),
    (
        "the target of a partial",
        "import functools\n\n\ndef scale(t, n):\n    return t * n\n\n\n"
        "TWICE = functools.partial(scale, n=2)\n",
        "text = helpers.TWICE(text)",
        "return t * n", "return t * (n + 1)", "helpers.scale", USES,
    ),
    (
        "a function in a dispatch table",
        "def a(t):\n    return t + 'a'\n\n\ndef b(t):\n    return t + 'b'\n\n\n"
        "TABLE = {'a': a, 'b': b}\n",
        "text = helpers.TABLE['b'](text)",
        "return t + 'b'", "return t + 'B'", "helpers.b", USES,
    ),
    (
        "getattr with a literal name",
        "def shout(t):\n    return t.upper()\n",
        "text = getattr(helpers, 'shout')(text)",
        "return t.upper()", "return t.upper() + '!'", "helpers.shout", USES,
    ),
    (
        "a dataclass's field default",
        "from dataclasses import dataclass\n\n\n@dataclass\nclass Conf:\n    sep: str = '-'\n",
        "text = helpers.Conf().sep.join(text)",
        "sep: str = '-'", "sep: str = '+'", "helpers.Conf", USES,
    ),
    (
        "a NamedTuple's field default",
        "from typing import NamedTuple\n\n\nclass Pt(NamedTuple):\n    sep: str = '-'\n",
        "text = helpers.Pt().sep.join(text)",
        "sep: str = '-'", "sep: str = '+'", "helpers.Pt", USES,
    ),
    (
        "an Enum's member",
        "from enum import Enum\n\n\nclass Mode(Enum):\n    A = 'x'\n",
        "text = text + helpers.Mode.A.value",
        "A = 'x'", "A = 'y'", "helpers.Mode", USES,
    ),
    (
        "an object assigned inside an if",
        "class Box:\n    def __init__(self, v):\n        self.v = v\n\n\nif True:\n    OBJ = Box('y')\n",
        "text = text + helpers.OBJ.v",
        "Box('y')", "Box('z')", "helpers.OBJ", USES,
    ),
    (
        "an object a closure captured",
        "class Box:\n    def __init__(self, v):\n        self.v = v\n\n\n"
        "def make():\n    box = Box('x')\n\n    def inner(t):\n        return t + box.v\n\n"
        "    return inner\n\n\nFN = make()\n",
        "text = helpers.FN(text)",
        "Box('x')", "Box('w')", "helpers.make.<locals>.inner.<closure box>", USES,
    ),
    (
        "a method the stage never reaches",
        "class Tool:\n    def used(self, t):\n        return t.upper()\n\n"
        "    def unused(self, t):\n        return t * 2\n",
        "text = helpers.Tool().used(text)",
        "return t * 2", "return t * 3", None, [],
    ),
    (
        "a method the stage reaches",
        "class Tool:\n    def used(self, t):\n        return t.upper()\n\n"
        "    def unused(self, t):\n        return t * 2\n",
        "text = helpers.Tool().used(text)",
        "return t.upper()", "return t.title()", "helpers.Tool.used", USES,
    ),
    (
        "every method of a class passed somewhere opaque",
        "class Tool:\n    def used(self, t):\n        return t.upper()\n\n"
        "    def unused(self, t):\n        return t * 2\n\n\n"
        "def call(cls, name, t):\n    return getattr(cls(), name)(t)\n",
        "text = helpers.call(helpers.Tool, 'un' + 'used', text)",
        "return t * 2", "return t * 3", "helpers.Tool.unused", USES,
    ),
]


def setup(project, helpers, body, root='"."'):
    project.write(
        "pipeline.py", PIPELINE.replace("BODY", body).replace("ROOT", root)
    )
    project.write("helpers.py", helpers)
    base = "" if root == '"."' else root.strip('"') + "/"
    for name in ("a", "b"):
        project.write(f"{base}data/{name}.txt", f"{name}\n")
    project.write(f"{base}other/c.txt", "c\n")


def changed(plan, stage):
    return [(c["input"], c["reason"], c["detail"]) for c in plan[stage]["changed"]]


@pytest.mark.parametrize(
    "case,helpers,body,old,new,detail,rerun", CASES, ids=[c[0] for c in CASES]
)
def test_an_edit_reruns_exactly_what_reaches_it(project, case, helpers, body, old, new, detail, rerun):
    setup(project, helpers, body)
    r = project.run()
    assert (r["uses"]["processed"], r["uses"]["failed"]) == (2, []), r
    # Nothing hashed by an address: a plan with no edit re-runs nothing.
    plan = project.plan()
    assert changed(plan, "uses") == [], plan["uses"]["components"]
    assert old in helpers
    project.write("helpers.py", helpers.replace(old, new))
    plan = project.plan()
    assert changed(plan, "uses") == [(i, "recipe", detail) for i in rerun], plan["uses"]
    assert changed(plan, "other") == []
    r = project.run()["uses"]
    assert (r["processed"], r["failed"]) == (len(rerun), [])
    assert changed(project.plan(), "uses") == []


def test_import_module_is_listed_unresolved(project):
    setup(project, "def clean(t):\n    return t\n", "text = import_module('helpers').clean(text)")
    pipeline = (project.root / "pipeline.py").read_text()
    project.write("pipeline.py", "from importlib import import_module\n" + pipeline)
    plan = project.plan()
    line = next(
        i for i, text in enumerate((project.root / "pipeline.py").read_text().splitlines(), 1)
        if "import_module('helpers')" in text
    )
    assert f"pipeline.uses: importlib.import_module (line {line})" in plan["uses"]["unresolved"], plan


def test_the_projects_code_one_folder_above_the_data_is_code(project):
    # Pipeline("work"): the data in work/, the code beside pipeline.py.
    setup(project, "def clean(t):\n    return t.strip()\n", "text = helpers.clean(text)", root='"work"')
    assert project.run()["uses"]["processed"] == 2
    plan = project.plan()
    assert "helpers.clean" in plan["uses"]["components"]
    assert not any(k.startswith("library helpers") for k in plan["uses"]["components"])
    project.write("helpers.py", "def clean(t):\n    return t.strip().upper()\n")
    assert changed(project.plan(), "uses") == [(i, "recipe", "helpers.clean") for i in USES]
