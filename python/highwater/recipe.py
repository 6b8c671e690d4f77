"""The code recipe of a Python stage (issue 22).

A stage's recipe is made of named components, each with a digest:

- ``module.qualname`` of the stage function and of every function, method and
  class in the project that it uses, transitively (a class's own component
  holds its body without its methods; each method is a component of its own,
  so an edit to ``Cleaner.run`` is named as such);
- ``module.NAME`` of the module-level constants they read (the AST of the
  assignment, so a constant is hashed as written, not as a repr that could
  hold addresses);
- ``library name`` with ``name==version`` of each distribution outside the
  project that they use;
- ``python`` with the interpreter's minor version.

Functions are hashed as a normalised AST with a serialisation of our own:
docstrings, comments, formatting and line numbers do not count. (``ast.dump``
text changed in 3.13, cpython #116023, and bytecode changes every minor
release; neither is a stable key.)

What cannot be resolved statically (``getattr`` with a computed name,
``importlib``, ``eval``, a name that is not there) is listed in
``Recipe.unresolved``, never silently ignored.
"""

from __future__ import annotations

import builtins
import marshal
import os
import sys
import time
import types

from highwater._records import Record

# Not imported here: `ast` and `inspect` (with `dis`, `enum` and `re`, most
# of this package's import). They are needed only to read a module's source,
# and a module whose file has not changed since a plan read it is not read
# again: the facts the walk takes from its syntax tree are kept in the
# state's folder, keyed by the file's stat (see `_Facts`). Names are still
# resolved live, against the imported modules, every time.

# BLAKE2 from its own module: `hashlib` would load OpenSSL (6 ms of every
# plan's start) for a hash that does not need it.
try:
    from _blake2 import blake2b as _blake2b
except ImportError:  # an interpreter built without it
    from hashlib import blake2b as _blake2b

# Components per stage, whatever the call graph holds: a walk that finds more
# is cut and says so in `unresolved`.
COMPONENTS_MAX = 10_000

_DYNAMIC_CALLS = {
    "getattr": "getattr with a computed name",
    "setattr": "setattr with a computed name",
    "eval": "eval",
    "exec": "exec",
    "__import__": "__import__",
    "globals": "globals()",
    "vars": "vars()",
}


class Recipe(Record):
    __slots__ = _fields = ("components", "unresolved")

    def config(self) -> dict[str, Any]:
        # What goes into the recipe id. Not `unresolved`: its messages hold
        # line numbers, and moving a function must not re-run anything (the
        # AST of the function that holds the `getattr` is hashed already).
        return {"components": self.components}


def _digest(text: str) -> str:
    return _blake2b(text.encode(), digest_size=12).hexdigest()


_SKIP_FIELDS = {"lineno", "col_offset", "end_lineno", "end_col_offset", "type_comment", "kind"}


def _canon(node: Any, skip: frozenset = frozenset(), methods: bool = True) -> str:
    """A stable text of an AST: node type names and fields, no positions, no
    docstrings. `skip`: fields of this node left out (a function's own name
    and decorators: the component's name stands for them); `methods=False`:
    a class's methods left out (each is a component of its own). The tree is
    never changed: it is shared by every function of its module."""
    import ast

    if isinstance(node, ast.AST):
        parts = [type(node).__name__]
        for name in node._fields:
            if name in _SKIP_FIELDS or name in skip:
                continue
            value = getattr(node, name, None)
            if (
                name == "body"
                and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module))
                and isinstance(value, list)
            ):
                value = value[1:] if value and _is_docstring(value[0]) else value
                if not methods:
                    value = [
                        v for v in value if not isinstance(v, (ast.FunctionDef, ast.AsyncFunctionDef))
                    ]
            parts.append(f"{name}={_canon(value)}")
        return "(" + " ".join(parts) + ")"
    if isinstance(node, list):
        return "[" + ",".join(_canon(n) for n in node) + "]"
    return repr(node)


def _is_docstring(st: Any) -> bool:
    import ast

    return (
        isinstance(st, ast.Expr)
        and isinstance(st.value, ast.Constant)
        and isinstance(st.value.value, str)
    )


# -- what the walk takes from a syntax tree ----------------------------------
#
# A function's facts are its digest and its references, in the order
# `ast.walk` meets them:
#   ("d", name, computed, line)  a call of one of `_DYNAMIC_CALLS` by name;
#                                `computed`: not getattr/setattr with a
#                                constant name;
#   ("a", base, chain, line, opaque)  an attribute load `base.a.b` (chain
#                                a, b), or `getattr(base, "a")` with a
#                                literal name; `opaque`: the value is used
#                                other than by calling it or reading an
#                                attribute of it (passed, stored, returned);
#   ("n", name, line, opaque)    a name load;
#   ("m", attr)                  an attribute name read anywhere (`x.run`,
#                                `self.run`, `Cls().run`): which methods of
#                                a project class the code can reach;
#   ("b", names)                 names bound in nested scopes (parameters
#                                of lambdas and inner functions,
#                                comprehension targets), first if any.
# What each name means is decided when the recipe is computed, never here.
# The same facts are taken from module-level statements (see
# `_module_facts`): what a module-level value is built from.


def _refs(nodes: Iterable[Any]) -> tuple:
    """The references (above) made by the syntax trees `nodes`."""
    import ast

    # Nodes used by calling them or reading an attribute of them; any other
    # load of a name or attribute chain hands the value on (opaque).
    direct: set[int] = set()
    walked = [n for root in nodes for n in ast.walk(root)]
    for n in walked:
        if isinstance(n, ast.Call):
            direct.add(id(n.func))
        elif isinstance(n, ast.Attribute):
            direct.add(id(n.value))
    refs: list[tuple] = []
    # Names bound in scopes nested in these trees (a lambda's or inner
    # function's parameters, a comprehension's targets): never "not
    # defined", though still resolved if a global has the name too.
    bound = set()
    for n in walked:
        if isinstance(n, ast.arg):
            bound.add(n.arg)
        elif isinstance(n, ast.comprehension):
            bound.update(t.id for t in ast.walk(n.target) if isinstance(t, ast.Name))
        elif isinstance(n, ast.NamedExpr) and isinstance(n.target, ast.Name):
            bound.add(n.target.id)
    if bound:
        refs.append(("b", tuple(sorted(bound))))
    for n in walked:
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _DYNAMIC_CALLS:
            literal = (
                n.func.id in ("getattr", "setattr")
                and len(n.args) >= 2
                and isinstance(n.args[1], ast.Constant)
                and isinstance(n.args[1].value, str)
            )
            refs.append(("d", n.func.id, not literal, n.lineno))
            if literal and n.func.id == "getattr":
                attr = n.args[1].value
                refs.append(("m", attr))
                if isinstance(n.args[0], ast.Name):
                    refs.append(("a", n.args[0].id, (attr,), n.lineno, id(n) not in direct))
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load):
            refs.append(("m", n.attr))
            chain = []
            cur: Any = n
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name):
                refs.append(("a", cur.id, tuple(reversed(chain)), n.lineno, id(n) not in direct))
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            refs.append(("n", n.id, n.lineno, id(n) not in direct))
    return tuple(refs)


def _function_facts(node: Any) -> tuple[str, tuple]:
    # The name is the component's name; the body is its recipe.
    return _digest(_canon(node, skip=frozenset({"name", "decorator_list"}))), _refs([node])


def _module_statements(body: list) -> Iterable[Any]:
    """The module-level statements, those inside module-level `if`, `for`,
    `while`, `with` and `try` too (not inside functions or classes)."""
    import ast

    for st in body:
        yield st
        if isinstance(st, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try)):
            for field in ("body", "orelse", "finalbody"):
                yield from _module_statements(getattr(st, field, None) or [])
            for h in getattr(st, "handlers", None) or []:
                yield from _module_statements(h.body)


def _state_names(st: Any) -> set[str]:
    """The module-level names a statement builds or changes: the targets of
    an assignment (`X = ...`, `X[k] = ...`, `X.a = ...`, `X += ...`), and
    the object of a call made at import (`ORDER.append(f)`,
    `REGISTRY.update(...)`)."""
    import ast

    targets: list = []
    if isinstance(st, ast.Assign):
        targets = st.targets
    elif isinstance(st, (ast.AnnAssign, ast.AugAssign)):
        targets = [st.target]
    elif isinstance(st, (ast.For, ast.AsyncFor)):
        targets = [st.target]
    elif isinstance(st, (ast.With, ast.AsyncWith)):
        targets = [i.optional_vars for i in st.items if i.optional_vars is not None]
    elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
        cur = st.value.func
        while isinstance(cur, (ast.Attribute, ast.Subscript)):
            cur = cur.value
        return {cur.id} if isinstance(cur, ast.Name) and cur is not st.value.func else set()
    names = set()
    for t in targets:
        for n in ast.walk(t):
            if isinstance(n, ast.Name):
                names.add(n.id)
    return names


def _module_facts(src: str) -> tuple[dict, dict, dict] | None:
    """The facts of one module's source, or None if it does not parse:
    - defs: (name, first line) -> the facts of each function or lambda
      there (first line: the first decorator's, as the code object counts);
      a class there counts as None, so that two things on one line are
      ambiguous, as they are to the walk;
    - classes: name -> (first line, last line, digest) of each class
      statement of that name, methods left out of the digest;
    - assigns: name -> (digest, references) of the module-level statements
      that build or change it (`_state_names`), those in `if` and `for`
      blocks included: what its value is made from."""
    import ast

    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return None
    defs: dict[tuple[str, int], list] = {}
    classes: dict[str, list] = {}
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = min([n.lineno] + [d.lineno for d in n.decorator_list])
            if isinstance(n, ast.ClassDef):
                defs.setdefault((n.name, first), []).append(None)
                digest = _digest(_canon(n, skip=frozenset({"name"}), methods=False))
                classes.setdefault(n.name, []).append((n.lineno, n.end_lineno or n.lineno, digest))
            else:
                defs.setdefault((n.name, first), []).append(_function_facts(n))
        elif isinstance(n, ast.Lambda):
            defs.setdefault(("<lambda>", n.lineno), []).append(_function_facts(n))
    stmts: dict[str, list] = {}
    for st in _module_statements(tree.body):
        for name in _state_names(st):
            stmts.setdefault(name, []).append(st)
    assigns = {}
    for name, sts in stmts.items():
        # A block statement's own line, not its body (met on its own).
        texts = [_canon(_header(st)) for st in sts]
        assigns[name] = (_digest("\n".join(texts)), _refs([_header(st) for st in sts]))
    return defs, classes, assigns


def _header(st: Any) -> Any:
    """A statement without the statements it holds: a `for` or `with`
    line's own expressions (the statements of its body are met apart)."""
    import ast

    if isinstance(st, (ast.For, ast.AsyncFor)):
        return ast.Tuple(elts=[st.target, st.iter], ctx=ast.Load())
    if isinstance(st, (ast.With, ast.AsyncWith)):
        return ast.Tuple(elts=[i.context_expr for i in st.items], ctx=ast.Load())
    return st


# A file changed within this long of the stat that keys its facts is not
# kept: its next change could land in the same timestamp tick with the same
# size, and its stat would then vouch for old facts (git's "racy" rule, and
# the engine's `mtime_margin_ms`).
FACTS_MARGIN_NS = 2_000_000_000
# Modules kept in one cache file; beyond it the oldest entries go.
FACTS_MODULES_MAX = 10_000
# Bumped whenever what `_module_facts` returns changes shape or meaning.
FACTS_VERSION = 2
# A facts file opens with this and the BLAKE2b digest (24 bytes) of the rest.
_FACTS_MAGIC = b"highwater-recipe-facts\n"


class _Facts:
    """Module facts by file, kept in `path` between processes (marshal: no
    import; behind a digest, since marshal trusts what it reads). An entry
    is used only if the file's stat is the one it was read under; a cache
    that cannot be read is ignored, one that cannot be written is not kept. Either way the recipe is the
    same: the cache only spares reading and parsing unchanged modules."""

    def __init__(self, path: str | None):
        self.path = path
        self.stamp = (FACTS_VERSION, tuple(sys.version_info[:2]), sys.implementation.name)
        self.entries: dict[str, tuple] = {}
        self.dirty = False
        if path:
            try:
                with open(path, "rb") as f:
                    raw = f.read()
                # marshal trusts its input (a damaged file could crash the
                # interpreter), so it reads only bytes whose digest says a
                # plan wrote them.
                head, body = raw[: len(_FACTS_MAGIC) + 24], raw[len(_FACTS_MAGIC) + 24 :]
                if head != _FACTS_MAGIC + _blake2b(body, digest_size=24).digest():
                    raise ValueError("not a facts file, or damaged")
                data = marshal.loads(body)
                if (
                    isinstance(data, tuple)
                    and len(data) == 2
                    and data[0] == self.stamp
                    and isinstance(data[1], dict)
                ):
                    self.entries = data[1]
            except (OSError, EOFError, ValueError, TypeError):
                pass

    @staticmethod
    def key(path: str) -> tuple | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_dev)

    def get(self, module: types.ModuleType) -> tuple[dict, dict, dict] | None:
        f = getattr(module, "__file__", None)
        if isinstance(f, str) and f.endswith(".py"):
            f = os.path.abspath(f)
            key = self.key(f)
        else:
            key = None
        if key is not None:
            hit = self.entries.get(f)
            if isinstance(hit, tuple) and len(hit) == 2 and hit[0] == key:
                return hit[1]
        try:
            import inspect

            facts = _module_facts(inspect.getsource(module))
        except (OSError, TypeError):
            facts = None
        if key is not None and facts is not None and time.time_ns() - max(key[0], key[1]) > FACTS_MARGIN_NS:
            self.entries[f] = (key, facts)
            self.dirty = True
        return facts

    def save(self) -> None:
        if not (self.path and self.dirty):
            return
        entries = self.entries
        if len(entries) > FACTS_MODULES_MAX:
            entries = dict(list(entries.items())[-FACTS_MODULES_MAX:])
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            body = marshal.dumps((self.stamp, entries))
            with open(tmp, "wb") as f:
                f.write(_FACTS_MAGIC + _blake2b(body, digest_size=24).digest() + body)
            os.replace(tmp, self.path)
            self.dirty = False
        except (OSError, ValueError):
            try:
                os.unlink(tmp)
            except OSError:
                pass


_FACTS: dict[str | None, _Facts] = {}


def _facts_at(path: str | None) -> _Facts:
    """One cache per file per process: a pipeline computes its recipes at
    every plan and run."""
    if path not in _FACTS:
        _FACTS[path] = _Facts(path)
    return _FACTS[path]


def _unwrap(fn: Any) -> Any:
    """`inspect.unwrap`: through `__wrapped__`, as functools.wraps leaves it."""
    seen = {id(fn)}
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
        if id(fn) in seen:
            raise ValueError(f"wrapper loop when unwrapping {fn!r}")
        seen.add(id(fn))
    return fn


# Libraries that open files in their own C (or C++, Rust) code, past
# Python's `open` and so past the read hook (highwater.reads): a stage that
# reaches one lists it in `unresolved` (issue 48). Pandas, NumPy, PIL,
# json, csv open through Python and are seen.
OPENS_FILES_IN_C = {
    "pyarrow": "Arrow (Parquet, Feather, CSV, datasets)",
    "osgeo": "GDAL/OGR",
    "fiona": "GDAL/OGR (Fiona)",
    "pyogrio": "GDAL/OGR (pyogrio)",
    "rasterio": "GDAL (rasterio)",
    "h5py": "HDF5",
    "netCDF4": "netCDF",
    "sqlite3": "SQLite",
    "duckdb": "DuckDB",
    "polars": "Polars",
    "deltalake": "delta-rs",
    "lxml": "libxml2",
}


def _is_stdlib(modname: str) -> bool:
    top = modname.split(".")[0]
    return top in sys.stdlib_module_names or top == "builtins"


_DISTS: dict[str, list[str]] | None = None
# Per sys.path folder: its `.dist-info` folders by normalized name, and
# whether an egg claims the name (then importlib.metadata decides).
_INDEX: dict[str, dict[str, list[str]] | None] = {}
_BY_NAME: dict[str, list[str] | None] = {}


def _normalized(name: str) -> str:
    # The name rule of importlib.metadata's search (PEP 503, runs of `-_.`
    # as one `_`), in string methods rather than `re` or a loop per
    # character (it runs for every `.dist-info` folder of a venv).
    out = name.lower().replace("-", "_").replace(".", "_")
    while "__" in out:
        out = out.replace("__", "_")
    return out


def _listing(folder: str) -> list[str]:
    try:
        return sorted(os.listdir(folder or "."))
    except OSError:
        return []


def _index(folder: str) -> dict[str, list[str]] | None:
    """`folder`'s distributions by normalized name: `.dist-info` folders as
    they are, an egg as `None` (one listing per folder and process). `None`
    for a `sys.path` entry that is a file (a zip archive, which
    importlib.metadata reads inside)."""
    if folder in _INDEX:
        return _INDEX[folder]
    found: dict[str, list[str]] | None = None
    if not os.path.isfile(folder):
        found = {}
        for child in _listing(folder):
            low = child.lower()
            if low.endswith(".dist-info"):
                found.setdefault(_normalized(child[: -len(".dist-info")].partition("-")[0]), []).append(child)
            elif low.endswith(".egg-info") or low.endswith(".egg"):
                found.setdefault(_normalized(child[: low.rindex(".egg")].partition("-")[0]), []).append(None)
    _INDEX[folder] = found
    return found


def _read_name_version(dist_info: str) -> str | None:
    """`Name==Version` from a `.dist-info` folder's METADATA headers, as
    `importlib.metadata` reports them; `None` when they are not plain."""
    try:
        with open(os.path.join(dist_info, "METADATA"), encoding="utf-8") as fh:
            head: dict[str, str] = {}
            for line in fh:
                if not line.strip():
                    break
                if line[0] in " \t":
                    # A folded header: leave it to importlib.metadata.
                    return None
                key, _, value = line.partition(":")
                head.setdefault(key.strip().lower(), value.strip())
    except (OSError, UnicodeDecodeError):
        return None
    name, version = head.get("name"), head.get("version")
    return f"{name}=={version}" if name and version else None


def _distribution_by_name(top: str) -> list[str] | None:
    """The distribution named `top`, found as `importlib.metadata.distribution`
    finds it (the first `sys.path` folder holding a matching `.dist-info`)
    without importing `importlib.metadata`: that import alone was 35 ms of a
    40 ms no-change plan's recipe for a stage that uses highwater itself
    (issue 48, bench/python_interleaved.sh). `None`: ask importlib.metadata
    (an egg, two candidates in one folder, headers it must parse)."""
    if top in _BY_NAME:
        return _BY_NAME[top]
    want = _normalized(top)
    found: list[str] | None = []
    for folder in sys.path:
        if not isinstance(folder, str):
            found = None
            break
        index = _index(folder)
        if index is None:
            found = None
            break
        hits = index.get(want)
        if not hits:
            continue
        if len(hits) > 1 or hits[0] is None:
            found = None
        else:
            one = _read_name_version(os.path.join(folder, hits[0]))
            found = [one] if one else None
        break
    _BY_NAME[top] = found
    return found


def _distributions(top: str) -> list[str]:
    # Most distributions are named as the module they install; asking for
    # that one is cheap, and cheaper still without importing
    # importlib.metadata (see `_distribution_by_name`). The full map reads
    # every installed distribution's file list (160 ms in a venv with
    # Dagster), so it is read only for a module whose distribution is named
    # otherwise (yaml: PyYAML).
    by_name = _distribution_by_name(top)
    if by_name:
        return by_name
    import importlib.metadata

    global _DISTS
    if by_name is None:
        try:
            d = importlib.metadata.distribution(top)
            return [f"{d.metadata['Name']}=={d.version}"]
        except importlib.metadata.PackageNotFoundError:
            pass
    found = _declared_top_level(top)
    if found:
        return found
    if _DISTS is None:
        _DISTS = importlib.metadata.packages_distributions()
    out = []
    for d in sorted(set(_DISTS.get(top, []))):
        try:
            out.append(f"{d}=={importlib.metadata.version(d)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{d}==?")
    return out


def _declared_top_level(top: str) -> list[str]:
    """Distributions beside the module that declare it in `top_level.txt`
    (a small file most setuptools wheels carry): found without reading every
    distribution's file list."""
    mod = sys.modules.get(top)
    f = getattr(mod, "__file__", None)
    if not f:
        return []
    site = os.path.dirname(os.path.dirname(f)) if f.endswith("__init__.py") else os.path.dirname(f)
    out = []
    for n in _listing(site):
        if not n.endswith(".dist-info"):
            continue
        try:
            with open(os.path.join(site, n, "top_level.txt")) as fh:
                if top not in fh.read().split():
                    continue
        except OSError:
            continue
        found = _read_name_version(os.path.join(site, n))
        if found is None:
            import importlib.metadata

            d = importlib.metadata.Distribution.at(os.path.join(site, n))
            found = f"{d.metadata['Name']}=={d.version}"
        out.append(found)
    return sorted(out)


class _Walker:
    def __init__(self, roots: Iterable[str], ignore: Iterable[str], facts: _Facts):
        # The project's code: under any of the roots (the pipeline's data
        # root, the folder of the file that declares it), or any module
        # with a source file that is not installed (see `_in_project`).
        self.roots = [os.path.realpath(r) for r in roots]
        # Installed code is a library even when the venv lies in the project.
        self.excluded = {
            os.path.realpath(p)
            for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}
            if p
        }
        self.ignore = set(ignore)
        self.components: dict[str, str] = {}
        self.unresolved: list[str] = []
        self.c_readers: set[str] = set()
        self.seen: set[int] = set()
        self.queue: list[tuple[str, Any]] = []
        self.facts = facts
        self._module_facts: dict[str, tuple[dict, dict, dict] | None] = {}
        self._in_project: dict[str, bool] = {}
        # Method reachability (see `visit_class`): attribute names the
        # reachable code reads, methods waiting for their name to be read,
        # and classes that count whole.
        self.attrs: set[str] = set()
        self.pending: dict[str, list[tuple[str, Any]]] = {}
        self.whole: set[int] = set()
        self.classes: dict[int, tuple[str, type]] = {}

    # -- where things live ----------------------------------------------
    def in_project(self, modname: str | None) -> bool:
        if not modname:
            return False
        known = self._in_project.get(modname)
        if known is None:
            known = self._in_project[modname] = self._in_project_uncached(modname)
        return known

    def _in_project_uncached(self, modname: str) -> bool:
        """A module is the project's when its file lies under a root, or is
        a source file that no installation holds (outside the interpreter's
        prefixes and any site-packages): such code has no version to stand
        for it, so it is followed, never recorded as `unversioned`."""
        if _is_stdlib(modname):
            return False
        mod = sys.modules.get(modname)
        f = getattr(mod, "__file__", None)
        if not f:
            return False
        f = os.path.realpath(f)
        if any(f.startswith(r + os.sep) for r in self.roots):
            installed = any(
                f.startswith(e + os.sep) for e in self.excluded if not any(r.startswith(e + os.sep) for r in self.roots)
            )
            return not installed and "site-packages" not in f.split(os.sep)
        if any(f.startswith(e + os.sep) for e in self.excluded):
            return False
        parts = f.split(os.sep)
        return "site-packages" not in parts and "dist-packages" not in parts and f.endswith(".py")

    def library(self, modname: str | None) -> None:
        if not modname:
            return
        top = modname.split(".")[0]
        if top in OPENS_FILES_IN_C and top not in self.c_readers and not self.in_project(modname):
            # Never silent (issue 48): the read hook sees only what Python
            # opens, so a stage that reaches one of these is told.
            self.c_readers.add(top)
            self.unresolved.append(
                f"library {top}: files {OPENS_FILES_IN_C[top]} opens in C are not seen as "
                "dependencies (declare them in version=, or read them through Python's open)"
            )
        if _is_stdlib(modname) or self.in_project(modname):
            return
        dists = _distributions(top)
        self.components[f"library {top}"] = ",".join(dists) if dists else "unversioned"

    def module_facts(self, modname: str) -> tuple[dict, dict, dict] | None:
        """What the walk needs of a module's source (see `_module_facts`):
        one parse per module, not one `inspect.getsource` per function, and
        none for a module whose file is unchanged since a plan read it."""
        if modname not in self._module_facts:
            mod = sys.modules.get(modname)
            self._module_facts[modname] = self.facts.get(mod) if mod is not None else None
        return self._module_facts[modname]

    def def_facts(self, modname: str | None, name: str, first_line: int | None) -> tuple | None:
        if modname not in sys.modules or first_line is None:
            return None
        facts = self.module_facts(modname)
        found = facts[0].get((name, first_line), []) if facts else []
        return found[0] if len(found) == 1 else None

    # -- components -------------------------------------------------------
    def add(self, name: str, obj: Any) -> None:
        if name in self.ignore:
            return
        if id(obj) in self.seen and name in self.components:
            return
        self.seen.add(id(obj))
        if len(self.components) >= COMPONENTS_MAX:
            self.unresolved.append(f"{name}: more than {COMPONENTS_MAX} components; the walk stopped here")
            return
        self.queue.append((name, obj))

    def run(self, fn: Any, name: str) -> None:
        self.add(name, fn)
        while self.queue:
            name, obj = self.queue.pop()
            if name in self.components:
                continue
            if isinstance(obj, type):
                self.visit_class(name, obj)
            else:
                self.visit_function(name, obj)

    def function_facts(self, fn: types.FunctionType) -> tuple | None:
        found = self.def_facts(fn.__module__, fn.__name__, fn.__code__.co_firstlineno)
        if found is not None:
            return found
        # Not found in its module's source (defined by exec, or the module
        # changed on disk since it was imported): its own source, if any.
        # Rare, and not kept: no file stat vouches for it.
        try:
            import ast
            import inspect
            import textwrap

            src = textwrap.dedent(inspect.getsource(fn))
            tree = ast.parse(src)
        except (OSError, TypeError, SyntaxError):
            return None
        kinds = (ast.Lambda,) if fn.__name__ == "<lambda>" else (ast.FunctionDef, ast.AsyncFunctionDef)
        nodes = [
            n
            for n in ast.walk(tree)
            if isinstance(n, kinds) and getattr(n, "name", "<lambda>") == fn.__name__
        ]
        return _function_facts(nodes[0]) if len(nodes) == 1 else None

    def visit_function(self, name: str, fn: Any) -> None:
        fn = _unwrap(fn)
        if isinstance(fn, (staticmethod, classmethod)):
            fn = fn.__func__
        if not isinstance(fn, types.FunctionType):
            self.components[name] = _digest(repr(type(fn)))
            return
        found = self.function_facts(fn)
        if found is None:
            code = fn.__code__
            self.components[name] = _digest(
                repr((code.co_code, code.co_consts, code.co_names, code.co_varnames))
            )
            self.unresolved.append(
                f"{name}: its source could not be parsed alone; its bytecode stands for it"
            )
        else:
            digest, refs = found
            self.components[name] = digest
            self.references(name, fn.__module__, fn.__globals__, _closure(fn), _locals(fn), refs)

    def visit_class(self, name: str, cls: type) -> None:
        """A class: its statement without its methods (fields, defaults,
        decorators, members: what a dataclass, NamedTuple or Enum generates
        its methods from), its bases, and the methods the stage can reach:
        those whose name the reachable code reads as an attribute anywhere,
        the dunder methods (Python calls them), and every method when the
        class counts whole (see `whole_class`)."""
        self.classes[id(cls)] = (name, cls)
        digest = self.class_digest(name, cls)
        if digest is None:
            return
        self.components[name] = digest
        for base in cls.__mro__[1:]:
            self.value(name, base.__name__, base)
        if self.counts_whole(cls):
            self.whole.add(id(cls))
        for attr, f in _own_methods(cls):
            self.method(name, cls, attr, f)

    def class_digest(self, name: str, cls: type) -> str | None:
        # The class statement of its module whose lines hold its methods
        # (those written there: a dataclass's generated `__init__` has no
        # lines of the file).
        mod = sys.modules.get(cls.__module__)
        where = os.path.realpath(mod.__file__) if getattr(mod, "__file__", None) else None
        lines = [
            f.__code__.co_firstlineno
            for _, f in _methods(cls)
            if isinstance(f, types.FunctionType)
            and where is not None
            and os.path.realpath(f.__code__.co_filename) == where
        ]
        facts = self.module_facts(cls.__module__) if mod is not None else None
        candidates = facts[1].get(cls.__name__, []) if facts else []
        for first, end, d in candidates:
            if all(first <= ln <= end for ln in lines) and (lines or len(candidates) == 1):
                return d
        # Made by a call (`P = NamedTuple("P", ...)`, `Color = Enum(...)`):
        # the statement that made it.
        assigned = facts[2].get(cls.__name__) if facts else None
        if assigned is not None:
            digest, refs = assigned
            self.references(name, cls.__module__, vars(mod), {}, set(), refs)
            return digest
        self.components[name] = _digest(repr(sorted(vars(cls).keys())))
        self.unresolved.append(f"{name}: its source could not be read")
        return None

    def counts_whole(self, cls: type) -> bool:
        """A class counts whole when code outside the project may call its
        methods by name: it derives from a class other than `object` that
        is not the project's (an Enum, an Exception, a library's base)."""
        return id(cls) in self.whole or any(
            b is not object and not self.in_project(getattr(b, "__module__", None))
            for b in cls.__mro__[1:]
        )

    def method(self, cname: str, cls: type, attr: str, f: Any) -> None:
        mname = f"{cname}.{attr}"
        dunder = attr.startswith("__") and attr.endswith("__")
        if dunder or attr in self.attrs or id(cls) in self.whole:
            self.add(mname, f)
        else:
            self.pending.setdefault(attr, []).append((mname, f))

    def make_whole(self, cls: type) -> None:
        """A class handed on as a value (passed, stored, returned): every
        method of it, and of its project bases, counts."""
        for c in cls.__mro__:
            if c is object or id(c) in self.whole or not self.in_project(getattr(c, "__module__", None)):
                continue
            self.whole.add(id(c))
            known = self.classes.get(id(c))
            if known is not None:
                for attr, f in _own_methods(c):
                    self.add(f"{known[0]}.{attr}", f)

    def attribute_read(self, attr: str) -> None:
        if attr not in self.attrs:
            self.attrs.add(attr)
            for mname, f in self.pending.pop(attr, []):
                self.add(mname, f)

    # -- what code references ------------------------------------------
    def references(
        self,
        owner: str,
        modname: str,
        g: dict[str, Any],
        closure: dict[str, Any],
        local: set[str],
        refs: tuple,
    ) -> None:
        """Resolves the references `refs` of code in module `modname` whose
        globals are `g` (a function's, or the module's own for module-level
        statements)."""
        bound: tuple = ()
        for r in refs:
            kind, ident = r[0], r[1]
            if kind == "b":
                bound = ident
            elif kind == "m":
                self.attribute_read(ident)
            elif kind == "d":
                _, _, computed, line = r
                if computed and ident not in local and ident not in g:
                    self.unresolved.append(f"{owner}: {_DYNAMIC_CALLS[ident]} (line {line})")
            elif kind == "a":
                _, _, chain, line, opaque = r
                if ident not in local:
                    base = closure.get(ident, g.get(ident, _MISSING))
                    if isinstance(base, types.ModuleType):
                        if base.__name__.split(".")[0] == "importlib" and "import_module" in chain:
                            self.unresolved.append(f"{owner}: importlib.import_module (line {line})")
                        self.attribute(owner, base, list(chain), opaque)
            elif ident not in local:
                _, _, line, opaque = r
                if ident in closure:
                    self.closure_value(owner, f"{owner}.<closure {ident}>", closure[ident])
                elif ident in g:
                    value = g[ident]
                    if value is _import_module():
                        self.unresolved.append(f"{owner}: importlib.import_module (line {line})")
                    self.global_value(owner, modname, ident, value, opaque)
                elif not hasattr(builtins, ident) and ident not in bound:
                    self.unresolved.append(f"{owner}: name {ident!r} is not defined (line {line})")

    def attribute(self, owner: str, module: types.ModuleType, chain: list[str], opaque: bool) -> None:
        """`helpers.clean`, `pkg.sub.CONST`: resolved through the module."""
        obj: Any = module
        modname = module.__name__
        for i, attr in enumerate(chain):
            if not isinstance(obj, types.ModuleType):
                break
            nxt = getattr(obj, attr, _MISSING)
            if nxt is _MISSING:
                if self.in_project(obj.__name__):
                    self.unresolved.append(f"{owner}: {obj.__name__}.{attr} is not defined")
                return
            modname = obj.__name__
            if isinstance(nxt, types.ModuleType):
                obj = nxt
                continue
            # `helpers.Cleaner` handed on whole only when the chain ends here.
            self.global_value(owner, modname, attr, nxt, opaque and i == len(chain) - 1)
            return
        if isinstance(obj, types.ModuleType):
            self.library(obj.__name__)

    def global_value(self, owner: str, modname: str, name: str, value: Any, opaque: bool = False) -> None:
        if isinstance(value, types.ModuleType):
            self.library(value.__name__)
            return
        if isinstance(value, (types.FunctionType, type)):
            self.value(owner, name, value)
            if opaque and isinstance(value, type) and self.in_project(value.__module__):
                self.make_whole(value)
            return
        if isinstance(value, types.BuiltinFunctionType):
            self.library(getattr(value, "__module__", None))
            return
        if not self.in_project(modname):
            self.library(modname)
            return
        # A module-level value of the project: the statements that build
        # it, as written, and what they reference.
        cname = f"{modname}.{name}"
        if cname in self.components or cname in self.ignore:
            return
        facts = self.module_facts(modname)
        assigned = facts[2].get(name) if facts else None
        mod = sys.modules.get(modname)
        if assigned is not None and mod is not None:
            digest, refs = assigned
            self.components[cname] = digest
            self.references(cname, modname, vars(mod), {}, set(), refs)
            # Its class's methods, reachable through the instance.
            if not _is_plain(value):
                self.value(cname, type(value).__name__, type(value))
        else:
            self.components[cname] = _digest(self.value_text(owner, cname, value, 0, set()))

    def value(self, owner: str, name: str, value: Any) -> None:
        if isinstance(value, (types.FunctionType, type)):
            mod = getattr(value, "__module__", None)
            if value is object or not self.in_project(mod):
                self.library(mod)
                return
            if value.__name__ == "<lambda>":
                # A lambda is named by what holds it.
                cname = name if name.startswith(owner) else f"{mod}.{name}"
            else:
                cname = f"{mod}.{value.__qualname__}"
            self.add(cname, value)
            return
        self.library(getattr(type(value), "__module__", None))

    def closure_value(self, owner: str, name: str, value: Any) -> None:
        if isinstance(value, (types.FunctionType, type)):
            self.value(owner, name, value)
            return
        self.components[name] = _digest(self.value_text(owner, name, value, 0, set()))

    def value_text(self, owner: str, name: str, value: Any, depth: int, seen: set[int]) -> str:
        """A text that stands for a value held at run time (a closure
        variable, a value no statement of its module builds): its structure,
        never a repr holding an address; the code it holds followed as
        components. What has no stable form is listed in `unresolved`."""
        if _is_plain(value):
            return repr(value)
        if depth > VALUE_DEPTH_MAX or id(value) in seen:
            self.unresolved.append(f"{owner}: {name} nests deeper than {VALUE_DEPTH_MAX} (or in itself)")
            return "..."
        seen = seen | {id(value)}

        def sub(v: Any) -> str:
            return self.value_text(owner, name, v, depth + 1, seen)

        if isinstance(value, (list, tuple)):
            return f"{type(value).__name__}[{','.join(sub(v) for v in value)}]"
        if isinstance(value, (set, frozenset)):
            return f"{type(value).__name__}[{','.join(sorted(sub(v) for v in value))}]"
        if isinstance(value, dict):
            items = sorted(f"{sub(k)}:{sub(v)}" for k, v in value.items())
            return f"dict[{','.join(items)}]"
        if isinstance(value, types.ModuleType):
            self.library(value.__name__)
            return f"module {value.__name__}"
        if isinstance(value, (types.FunctionType, type)):
            self.value(owner, name, value)
            if isinstance(value, type):
                self.make_whole(value)
            return f"code {getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')}"
        if isinstance(value, types.MethodType):
            return f"method {sub(value.__func__)} of {sub(value.__self__)}"
        functools = sys.modules.get("functools")
        if functools is not None and isinstance(value, functools.partial):
            return f"partial {sub(value.func)} {sub(value.args)} {sub(value.keywords)}"
        if isinstance(value, types.BuiltinFunctionType):
            self.library(getattr(value, "__module__", None))
            return f"builtin {getattr(value, '__module__', '?')}.{value.__name__}"
        cls = type(value)
        self.value(owner, cls.__name__, cls)
        if self.in_project(cls.__module__):
            self.make_whole(cls)
        state = getattr(value, "__dict__", None)
        if isinstance(state, dict):
            return f"{cls.__module__}.{cls.__qualname__}{sub(state)}"
        try:
            text = repr(value)
        except Exception:  # noqa: BLE001 - a repr may raise anything
            text = " at 0x"
        if " at 0x" in text:
            self.unresolved.append(
                f"{owner}: {name} holds a {cls.__qualname__} whose state cannot be read "
                "(its repr holds an address); a change to it is not seen"
            )
            return f"{cls.__module__}.{cls.__qualname__}"
        return text


# Nesting followed in a value (`value_text`).
VALUE_DEPTH_MAX = 16


def _is_plain(value: Any) -> bool:
    return value is None or type(value) in (bool, int, float, complex, str, bytes)


def _own_methods(cls: type) -> list[tuple[str, Any]]:
    """`_methods` written in the class's own file: not those a decorator or
    metaclass generated (a dataclass's `__init__`, a NamedTuple's `_make`),
    which the class statement's digest stands for."""
    mod = sys.modules.get(cls.__module__)
    f = getattr(mod, "__file__", None)
    if not f:
        return []
    where = os.path.realpath(f)
    return [
        (a, m)
        for a, m in _methods(cls)
        if isinstance(m, types.FunctionType) and os.path.realpath(m.__code__.co_filename) == where
    ]


def _methods(cls: type) -> list[tuple[str, Any]]:
    """The functions a class's own body defines, by attribute name
    (properties' parts included)."""
    out = []
    for attr, v in vars(cls).items():
        f = v.__func__ if isinstance(v, (staticmethod, classmethod)) else v
        if isinstance(f, property):
            out.extend((attr, part) for part in (f.fget, f.fset, f.fdel) if part is not None)
        elif isinstance(f, types.FunctionType):
            out.append((attr, f))
    return out


def _closure(fn: types.FunctionType) -> dict[str, Any]:
    closure = {}
    if fn.__closure__:
        for var, cell in zip(fn.__code__.co_freevars, fn.__closure__):
            try:
                closure[var] = cell.cell_contents
            except ValueError:
                pass
    return closure


def _locals(fn: types.FunctionType) -> set[str]:
    return set(fn.__code__.co_varnames) | set(fn.__code__.co_cellvars)


def _import_module() -> Any:
    """`importlib.import_module` if it was imported (else nothing can be it)."""
    mod = sys.modules.get("importlib")
    return getattr(mod, "import_module", _MISSING) if mod is not None else _MISSING


_MISSING = object()


def compute(
    fn: Any,
    root: str,
    ignore: Iterable[str] = (),
    cache: str | None = None,
    code_root: str | None = None,
) -> Recipe:
    """The recipe of stage function `fn`, with the project at `root` and
    its code under `code_root` too (the folder of the pipeline's script).
    `cache`: the file that keeps module facts between processes (None: no
    file; modules are still read once per process and cache)."""
    facts = _facts_at(cache)
    main = _main_name()
    # `ignore=` may name the script's components either way.
    ignore = [_as_main(i, main) for i in ignore]
    w = _Walker([root] + ([code_root] if code_root else []), ignore, facts)
    fn = _unwrap(fn)
    w.run(fn, f"{fn.__module__}.{fn.__qualname__}")
    facts.save()
    w.components["python"] = f"{sys.version_info.major}.{sys.version_info.minor}"
    return Recipe(
        components=dict(sorted((_from_main(k, main), v) for k, v in w.components.items())),
        unresolved=sorted(set(w.unresolved)),
    )


def _main_name() -> str | None:
    """The name the running script has when it is imported: `pipeline` for
    `python pipeline.py` and `python -m pipeline` alike. A component of the
    script is named by it, not by `__main__`, so that the same stage run as
    a script, with `-m`, or imported by a driver (Dagster, Airflow, a test)
    has one recipe, and switching between them re-runs nothing."""
    mod = sys.modules.get("__main__")
    spec = getattr(mod, "__spec__", None)
    if spec is not None and getattr(spec, "name", None):
        return spec.name
    f = getattr(mod, "__file__", None)
    if isinstance(f, str) and f.endswith(".py"):
        return os.path.basename(f)[:-3]
    return None  # an interactive session, `python -c`: `__main__` it stays


def _from_main(name: str, main: str | None) -> str:
    if main and name.startswith("__main__."):
        return main + name[len("__main__") :]
    return name


def _as_main(name: str, main: str | None) -> str:
    if main and name.startswith(main + "."):
        return "__main__" + name[len(main) :]
    return name


def changed(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """The names of components that differ, are new, or are gone."""
    out = []
    for k in sorted(set(old) | set(new)):
        if k not in old:
            out.append(f"{k} (new)")
        elif k not in new:
            out.append(f"{k} (gone)")
        elif old[k] != new[k]:
            out.append(k)
    return out
