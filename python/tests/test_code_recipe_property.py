"""The code recipe, as a property (issue 48): in a generated project
(functions, constants and constants built from others, classes with a
reached and an unreached method, dataclasses, enums, dispatch tables,
partials, a registry filled at import, functions that read a data file),
after each random edit, of the code or of a data file, exactly the stages
whose reachable code or read files changed re-run: never one that cannot
reach the edit (irrelevant churn), never too few (stale). A model of what
each stage reaches is the oracle; the pipeline is planned and run for
real."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

KINDS = ["func", "const", "derived", "class", "dataclass", "enum", "table", "partial", "register", "file"]


@st.composite
def projects(draw):
    """Elements of lib.py, each able to use earlier ones, and the stages'
    references. An element is (kind, index, payloads, deps)."""
    n = draw(st.integers(min_value=3, max_value=9))
    elements = []
    funcs, values = [], []
    for i in range(n):
        kinds = ["func", "const", "class", "dataclass", "enum", "file"]
        if values:
            kinds.append("derived")
        if funcs:
            kinds += ["table", "partial", "register"]
        kind = draw(st.sampled_from(kinds))
        if kind == "file":
            # A function whose value is a data file's content: its payload
            # lives in the file, not in lib.py.
            elements.append(("file", i, [1], []))
            funcs.append(i)
        elif kind == "func":
            dep = draw(st.sampled_from([None] + funcs + values))
            elements.append(("func", i, [1], [dep] if dep is not None else []))
            funcs.append(i)
        elif kind in ("const", "dataclass", "enum"):
            elements.append((kind, i, [1], []))
            values.append(i)
        elif kind == "derived":
            elements.append((kind, i, [1], [draw(st.sampled_from(values))]))
            values.append(i)
        elif kind == "class":
            elements.append((kind, i, [1, 1], []))
        elif kind == "table":
            deps = [draw(st.sampled_from(funcs)), draw(st.sampled_from(funcs))]
            elements.append((kind, i, [], deps))
        elif kind == "partial":
            elements.append((kind, i, [], [draw(st.sampled_from(funcs))]))
        else:
            elements.append((kind, i, [], [draw(st.sampled_from(funcs))]))
    # What a stage may use: (element index, part): part "a"/"b" picks a
    # class's method; a registry is used as a whole (index -1).
    usable = []
    for kind, i, _, _ in elements:
        if kind == "class":
            usable += [(i, "a"), (i, "b")]
        elif kind != "register":
            usable.append((i, None))
    if any(e[0] == "register" for e in elements):
        usable.append((-1, None))
    stages = draw(
        st.lists(
            st.lists(st.sampled_from(usable), min_size=1, max_size=3),
            min_size=2,
            max_size=4,
        )
    )
    return elements, stages


def ref(kinds, i, part, q=""):
    """The expression by which code uses element `i`; `q`: "lib." from
    pipeline.py."""
    return {
        "func": f"{q}f{i}(x)",
        "file": f"{q}f{i}(x)",
        "const": f"{q}c{i}",
        "derived": f"{q}c{i}",
        "dataclass": f"{q}D{i}().v",
        "enum": f"{q}E{i}.A.value",
        "table": f"{q}t{i}['p'](x) + {q}t{i}['q'](x)",
        "partial": f"{q}q{i}(x)",
        "class": f"{q}K{i}().{part}{i}(x)",
    }[kinds[i]]


def render(elements, stages):
    kinds = {i: k for k, i, _, _ in elements}
    lines = ["import functools", "from dataclasses import dataclass", "from enum import Enum", "", "R = []", ""]
    for kind, i, pay, deps in elements:
        if kind == "file":
            lines += [f"def f{i}(x):", f"    with open('v{i}.txt') as f:", "        return x + int(f.read())", ""]
        elif kind == "func":
            use = ref(kinds, deps[0], None) if deps else "x"
            lines += [f"def f{i}(x):", f"    return {use} + {pay[0]}", ""]
        elif kind == "const":
            lines += [f"c{i} = {pay[0]}", ""]
        elif kind == "derived":
            lines += [f"c{i} = {ref(kinds, deps[0], None)} * 2 + {pay[0]}", ""]
        elif kind == "class":
            lines += [f"class K{i}:", f"    def a{i}(self, x):", f"        return x + {pay[0]}",
                      f"    def b{i}(self, x):", f"        return x + {pay[1]}", ""]
        elif kind == "dataclass":
            lines += ["@dataclass", f"class D{i}:", f"    v: int = {pay[0]}", ""]
        elif kind == "enum":
            lines += [f"class E{i}(Enum):", f"    A = {pay[0]}", ""]
        elif kind == "table":
            lines += [f"t{i} = {{'p': f{deps[0]}, 'q': f{deps[1]}}}", ""]
        elif kind == "partial":
            lines += [f"q{i} = functools.partial(f{deps[0]})", ""]
        else:
            lines += [f"R.append(f{deps[0]})", ""]
    pipe = ["import highwater as hw", "import lib", "", "p = hw.Pipeline()", ""]
    for k, uses in enumerate(stages):
        pipe += [f'@p.stage(inputs=["d{k}/*.txt"], output="o{k}/{{stem}}.txt", name="s{k}")',
                 f"def s{k}(input, output):", "    x = len(input.read_text())"]
        for i, part in uses:
            if i == -1:
                pipe += ["    for g in lib.R:", "        x = g(x)"]
            else:
                pipe.append(f"    x = x + {ref(kinds, i, part, 'lib.')}")
        pipe += ["    output.write_text(str(x))", ""]
    return "\n".join(lines) + "\n", "\n".join(pipe) + "\n"


def reach(elements, i, part):
    """What using element `i` (or the registry, -1) reaches: a set of
    (index, payload slot)."""
    by = {e[1]: e for e in elements}
    if i == -1:
        out = set()
        for kind, j, _, deps in elements:
            if kind == "register":
                out |= reach(elements, deps[0], None)
        return out
    kind, _, pay, deps = by[i]
    if kind == "class":
        return {(i, 0 if part == "a" else 1)}
    out = {(i, s) for s in range(len(pay))}
    for d in deps:
        out |= reach(elements, d, None)
    return out


def data_files(elements) -> dict:
    """The data files the `file` elements read, by name: their payloads."""
    return {f"v{i}.txt": f"{pay[0]}\n" for kind, i, pay, _ in elements if kind == "file"}


DRIVER = """
import json, sys
from pipeline import p

if __name__ == "__main__":
    if sys.argv[1] == "plan":
        print(json.dumps(sorted(n for n, s in p.plan().stages.items() if s.changed)))
    else:
        r = p.run(jobs=1)
        print(json.dumps(sorted(n for n, s in r.stages.items() if s.processed)))
"""


def call(root: Path, what: str) -> set:
    r = subprocess.run(
        [sys.executable, "driver.py", what],
        cwd=root, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert r.returncode == 0, r.stderr
    return set(json.loads(r.stdout))


def write(root: Path, elements, stages) -> None:
    lib, pipe = render(elements, stages)
    for name, text in [("lib.py", lib), ("pipeline.py", pipe), *data_files(elements).items()]:
        path = root / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


@settings(max_examples=10, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(project=projects(), data=st.data())
def test_exactly_the_stages_that_reach_an_edit_rerun(project, data):
    elements, stages = project
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "driver.py").write_text(DRIVER)
        for k in range(len(stages)):
            (root / f"d{k}").mkdir()
            (root / f"d{k}/a.txt").write_text("item\n")
        write(root, elements, stages)
        assert call(root, "run") == {f"s{k}" for k in range(len(stages))}
        assert call(root, "plan") == set()
        editable = [(e[1], s) for e in elements for s in range(len(e[2]))]
        for _ in range(3):
            i, slot = data.draw(st.sampled_from(editable))
            for e in elements:
                if e[1] == i:
                    e[2][slot] += 1
            write(root, elements, stages)
            expected = {
                f"s{k}"
                for k, uses in enumerate(stages)
                if any((i, slot) in reach(elements, j, part) for j, part in uses)
            }
            lib, pipe = render(elements, stages)
            assert call(root, "plan") == expected, (i, slot, lib, pipe, data_files(elements))
            assert call(root, "run") == expected, (i, slot, lib, pipe)
