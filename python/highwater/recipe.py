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
#   ("a", base, chain, line)     an attribute load `base.a.b` (chain a, b);
#   ("n", name)                  a name load.
# What each name means is decided when the recipe is computed, never here.


def _function_facts(node: Any) -> tuple[str, tuple]:
    import ast

    refs: list[tuple] = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _DYNAMIC_CALLS:
            computed = n.func.id not in ("getattr", "setattr") or not (
                len(n.args) >= 2 and isinstance(n.args[1], ast.Constant)
            )
            refs.append(("d", n.func.id, computed, n.lineno))
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load):
            chain = []
            cur: Any = n
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name):
                refs.append(("a", cur.id, tuple(reversed(chain)), n.lineno))
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            refs.append(("n", n.id))
    # The name is the component's name; the body is its recipe.
    return _digest(_canon(node, skip=frozenset({"name", "decorator_list"}))), tuple(refs)


def _module_facts(src: str) -> tuple[dict, dict, dict] | None:
    """The facts of one module's source, or None if it does not parse:
    - defs: (name, first line) -> the facts of each function or lambda
      there (first line: the first decorator's, as the code object counts);
      a class there counts as None, so that two things on one line are
      ambiguous, as they are to the walk;
    - classes: name -> (first line, last line, digest) of each class
      statement of that name, methods left out of the digest;
    - assigns: name -> the digest of the module-level assignments to it."""
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
    texts: dict[str, list[str]] = {}
    for st in tree.body:
        targets = []
        if isinstance(st, ast.Assign):
            targets = st.targets
        elif isinstance(st, (ast.AnnAssign, ast.AugAssign)):
            targets = [st.target]
        names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        if names:
            text = _canon(st)
            for name in names:
                texts.setdefault(name, []).append(text)
    assigns = {name: _digest("\n".join(t)) for name, t in texts.items()}
    return defs, classes, assigns


# A file changed within this long of the stat that keys its facts is not
# kept: its next change could land in the same timestamp tick with the same
# size, and its stat would then vouch for old facts (git's "racy" rule, and
# the engine's `mtime_margin_ms`).
FACTS_MARGIN_NS = 2_000_000_000
# Modules kept in one cache file; beyond it the oldest entries go.
FACTS_MODULES_MAX = 10_000
# Bumped whenever what `_module_facts` returns changes shape or meaning.
FACTS_VERSION = 1
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


def _is_stdlib(modname: str) -> bool:
    top = modname.split(".")[0]
    return top in sys.stdlib_module_names or top == "builtins"


_DISTS: dict[str, list[str]] | None = None


def _distributions(top: str) -> list[str]:
    # Imported here: most stages use no library, and importing it is a
    # quarter of this package's import.
    import importlib.metadata

    global _DISTS
    # Most distributions are named as the module they install; asking for
    # that one is cheap. The full map reads every installed distribution's
    # file list (160 ms in a venv with Dagster), so it is read only for a
    # module whose distribution is named otherwise (yaml: PyYAML).
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
    try:
        names = os.listdir(site)
    except OSError:
        return []
    for n in names:
        if not n.endswith(".dist-info"):
            continue
        try:
            with open(os.path.join(site, n, "top_level.txt")) as fh:
                if top not in fh.read().split():
                    continue
        except OSError:
            continue
        import importlib.metadata

        d = importlib.metadata.Distribution.at(os.path.join(site, n))
        out.append(f"{d.metadata['Name']}=={d.version}")
    return sorted(out)


class _Walker:
    def __init__(self, root: str, ignore: Iterable[str], facts: _Facts):
        self.root = os.path.realpath(root)
        # Installed code is a library even when the venv lies in the project.
        self.excluded = {
            os.path.realpath(p)
            for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}
            if p
        }
        self.ignore = set(ignore)
        self.components: dict[str, str] = {}
        self.unresolved: list[str] = []
        self.seen: set[int] = set()
        self.queue: list[tuple[str, Any]] = []
        self.facts = facts
        self._module_facts: dict[str, tuple[dict, dict, dict] | None] = {}
        self._in_project: dict[str, bool] = {}

    # -- where things live ----------------------------------------------
    def in_project(self, modname: str | None) -> bool:
        if not modname:
            return False
        known = self._in_project.get(modname)
        if known is None:
            known = self._in_project[modname] = self._in_project_uncached(modname)
        return known

    def _in_project_uncached(self, modname: str) -> bool:
        mod = sys.modules.get(modname)
        f = getattr(mod, "__file__", None)
        if not f:
            return False
        f = os.path.realpath(f)
        if any(f.startswith(e + os.sep) for e in self.excluded if not self.root.startswith(e + os.sep)):
            return False
        if "site-packages" in f.split(os.sep):
            return False
        return f.startswith(self.root + os.sep)

    def library(self, modname: str | None) -> None:
        if not modname or _is_stdlib(modname) or self.in_project(modname):
            return
        top = modname.split(".")[0]
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
            self.references(name, fn, refs)

    def visit_class(self, name: str, cls: type) -> None:
        # The class statement of its module whose lines hold its methods.
        lines = [
            f.__code__.co_firstlineno
            for v in vars(cls).values()
            for f in [v.__func__ if isinstance(v, (staticmethod, classmethod)) else v]
            if isinstance(f, types.FunctionType)
        ]
        digest = None
        facts = self.module_facts(cls.__module__) if cls.__module__ in sys.modules else None
        candidates = facts[1].get(cls.__name__, []) if facts else []
        for first, end, d in candidates:
            if all(first <= ln <= end for ln in lines) and (lines or len(candidates) == 1):
                digest = d
                break
        if digest is None:
            self.components[name] = _digest(repr(sorted(vars(cls).keys())))
            self.unresolved.append(f"{name}: its source could not be read")
            return
        self.components[name] = digest
        for base in cls.__mro__[1:]:
            self.value(name, base.__name__, base)
        for attr, v in vars(cls).items():
            f = v.__func__ if isinstance(v, (staticmethod, classmethod)) else v
            if isinstance(f, property):
                for part in (f.fget, f.fset, f.fdel):
                    if part is not None:
                        self.add(f"{name}.{attr}", part)
            elif isinstance(f, types.FunctionType):
                self.add(f"{name}.{attr}", f)

    # -- what a function references ------------------------------------
    def references(self, owner: str, fn: types.FunctionType, refs: tuple) -> None:
        g = fn.__globals__
        closure = {}
        if fn.__closure__:
            for var, cell in zip(fn.__code__.co_freevars, fn.__closure__):
                try:
                    closure[var] = cell.cell_contents
                except ValueError:
                    pass
        local = set(fn.__code__.co_varnames) | set(fn.__code__.co_cellvars)
        for r in refs:
            kind, ident = r[0], r[1]
            if kind == "d":
                _, _, computed, line = r
                if computed and ident not in local and ident not in g:
                    self.unresolved.append(f"{owner}: {_DYNAMIC_CALLS[ident]} (line {line})")
            elif kind == "a":
                _, _, chain, line = r
                if ident not in local:
                    base = closure.get(ident, g.get(ident, _MISSING))
                    if isinstance(base, types.ModuleType):
                        if base.__name__.split(".")[0] == "importlib" and "import_module" in chain:
                            self.unresolved.append(f"{owner}: importlib.import_module (line {line})")
                        self.attribute(owner, base, list(chain))
            elif ident not in local:
                if ident in closure:
                    self.value(owner, f"{owner}.<closure {ident}>", closure[ident], closure=True)
                elif ident in g:
                    self.global_value(owner, fn.__module__, ident, g[ident])
                elif not hasattr(builtins, ident):
                    self.unresolved.append(f"{owner}: name {ident!r} is not defined")

    def attribute(self, owner: str, module: types.ModuleType, chain: list[str]) -> None:
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
            self.global_value(owner, modname, attr, nxt)
            return
        if isinstance(obj, types.ModuleType):
            self.library(obj.__name__)

    def global_value(self, owner: str, modname: str, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType):
            self.library(value.__name__)
            return
        if isinstance(value, (types.FunctionType, type)):
            self.value(owner, name, value)
            return
        if isinstance(value, types.BuiltinFunctionType):
            self.library(getattr(value, "__module__", None))
            return
        if not self.in_project(modname):
            self.library(modname)
            return
        # A module-level value of the project: its assignment, as written.
        cname = f"{modname}.{name}"
        if cname in self.components or cname in self.ignore:
            return
        facts = self.module_facts(modname)
        assigned = facts[2].get(name) if facts else None
        if assigned is not None:
            self.components[cname] = assigned
        else:
            try:
                self.components[cname] = _digest(repr(value))
            except Exception:  # noqa: BLE001 - a repr may raise anything
                self.unresolved.append(f"{owner}: {cname} has neither an assignment nor a repr")

    def value(self, owner: str, name: str, value: Any, closure: bool = False) -> None:
        if isinstance(value, (types.FunctionType, type)):
            mod = getattr(value, "__module__", None)
            if value is object or not self.in_project(mod):
                self.library(mod)
                return
            qual = value.__qualname__
            if value.__name__ == "<lambda>":
                # A lambda is named by what holds it.
                qual = name if closure else name
                cname = qual if closure else f"{mod}.{name}"
            else:
                cname = f"{mod}.{qual}"
            self.add(cname, value)
            return
        if closure:
            try:
                self.components[name] = _digest(repr(value))
            except Exception:  # noqa: BLE001
                self.unresolved.append(f"{owner}: closure variable {name} has no repr")
            return
        self.library(getattr(type(value), "__module__", None))


_MISSING = object()


def compute(fn: Any, root: str, ignore: Iterable[str] = (), cache: str | None = None) -> Recipe:
    """The recipe of stage function `fn`, with the project at `root`.
    `cache`: the file that keeps module facts between processes (None: no
    file; modules are still read once per process and cache)."""
    facts = _facts_at(cache)
    main = _main_name()
    # `ignore=` may name the script's components either way.
    ignore = [_as_main(i, main) for i in ignore]
    w = _Walker(root, ignore, facts)
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
