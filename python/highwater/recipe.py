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

import ast
import builtins
import dataclasses
import inspect
import os
import sys
import types

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


@dataclasses.dataclass
class Recipe:
    components: dict[str, str]
    unresolved: list[str]

    def config(self) -> dict[str, Any]:
        # What goes into the recipe id. Not `unresolved`: its messages hold
        # line numbers, and moving a function must not re-run anything (the
        # AST of the function that holds the `getattr` is hashed already).
        return {"components": self.components}


def _digest(text: str) -> str:
    return _blake2b(text.encode(), digest_size=12).hexdigest()


_SKIP_FIELDS = {"lineno", "col_offset", "end_lineno", "end_col_offset", "type_comment", "kind"}
_WITH_DOCSTRING = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)


def _is_docstring(st: ast.AST) -> bool:
    return (
        isinstance(st, ast.Expr)
        and isinstance(st.value, ast.Constant)
        and isinstance(st.value.value, str)
    )


def _canon(node: Any, skip: frozenset = frozenset(), methods: bool = True) -> str:
    """A stable text of an AST: node type names and fields, no positions, no
    docstrings. `skip`: fields of this node left out (a function's own name
    and decorators: the component's name stands for them); `methods=False`:
    a class's methods left out (each is a component of its own). The tree is
    never changed: it is shared by every function of its module."""
    if isinstance(node, ast.AST):
        parts = [type(node).__name__]
        for name in node._fields:
            if name in _SKIP_FIELDS or name in skip:
                continue
            value = getattr(node, name, None)
            if name == "body" and isinstance(node, _WITH_DOCSTRING) and isinstance(value, list):
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
    def __init__(self, root: str, ignore: Iterable[str]):
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
        self._module_trees: dict[str, ast.Module | None] = {}
        self._index: dict[str, dict[tuple[str, int], list[ast.AST]]] = {}
        self._in_project: dict[str, bool] = {}
        self._assigns: dict[str, dict[str, list[str]]] = {}

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

    def module_tree(self, modname: str) -> ast.Module | None:
        if modname not in self._module_trees:
            tree = None
            try:
                src = inspect.getsource(sys.modules[modname])
                tree = ast.parse(src)
            except (OSError, TypeError, SyntaxError, KeyError):
                pass
            self._module_trees[modname] = tree
            # Definitions by the line their code object starts on (the first
            # decorator's), lambdas by their line: one parse per module, not
            # one `inspect.getsource` per function.
            index: dict[tuple[str, int], list[ast.AST]] = {}
            for n in ast.walk(tree) if tree else []:
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    first = min([n.lineno] + [d.lineno for d in n.decorator_list])
                    index.setdefault((n.name, first), []).append(n)
                elif isinstance(n, ast.Lambda):
                    index.setdefault(("<lambda>", n.lineno), []).append(n)
            self._index[modname] = index
        return self._module_trees[modname]

    def node_of(self, modname: str | None, name: str, first_line: int | None) -> ast.AST | None:
        if modname not in sys.modules or first_line is None:
            return None
        self.module_tree(modname)
        found = self._index.get(modname, {}).get((name, first_line), [])
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

    def function_node(self, fn: types.FunctionType) -> ast.AST | None:
        node = self.node_of(fn.__module__, fn.__name__, fn.__code__.co_firstlineno)
        if node is not None:
            return node
        # Not found in its module's source (defined by exec, or the module
        # changed on disk since it was imported): its own source, if any.
        try:
            import textwrap  # only for this rare fallback

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
        return nodes[0] if len(nodes) == 1 else None

    def visit_function(self, name: str, fn: Any) -> None:
        fn = inspect.unwrap(fn)
        if isinstance(fn, (staticmethod, classmethod)):
            fn = fn.__func__
        if not isinstance(fn, types.FunctionType):
            self.components[name] = _digest(repr(type(fn)))
            return
        node = self.function_node(fn)
        if node is None:
            code = fn.__code__
            self.components[name] = _digest(
                repr((code.co_code, code.co_consts, code.co_names, code.co_varnames))
            )
            self.unresolved.append(
                f"{name}: its source could not be parsed alone; its bytecode stands for it"
            )
        else:
            # The name is the component's name; the body is its recipe.
            self.components[name] = _digest(_canon(node, skip=frozenset({"name", "decorator_list"})))
            self.references(name, fn, node)

    def visit_class(self, name: str, cls: type) -> None:
        # The class statement of its module whose lines hold its methods.
        lines = [
            f.__code__.co_firstlineno
            for v in vars(cls).values()
            for f in [v.__func__ if isinstance(v, (staticmethod, classmethod)) else v]
            if isinstance(f, types.FunctionType)
        ]
        node = None
        tree = self.module_tree(cls.__module__) if cls.__module__ in sys.modules else None
        candidates = [
            n for n in (ast.walk(tree) if tree else []) if isinstance(n, ast.ClassDef) and n.name == cls.__name__
        ]
        for n in candidates:
            end = n.end_lineno or n.lineno
            if all(n.lineno <= ln <= end for ln in lines) and (lines or len(candidates) == 1):
                node = n
                break
        if node is None:
            self.components[name] = _digest(repr(sorted(vars(cls).keys())))
            self.unresolved.append(f"{name}: its source could not be read")
            return
        self.components[name] = _digest(_canon(node, skip=frozenset({"name"}), methods=False))
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
    def references(self, owner: str, fn: types.FunctionType, node: ast.AST) -> None:
        g = fn.__globals__
        closure = {}
        if fn.__closure__:
            for var, cell in zip(fn.__code__.co_freevars, fn.__closure__):
                try:
                    closure[var] = cell.cell_contents
                except ValueError:
                    pass
        local = set(fn.__code__.co_varnames) | set(fn.__code__.co_cellvars)
        for n in ast.walk(node):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
                what = _DYNAMIC_CALLS.get(n.func.id)
                if what and n.func.id not in local and n.func.id not in g:
                    computed = n.func.id not in ("getattr", "setattr") or not (
                        len(n.args) >= 2 and isinstance(n.args[1], ast.Constant)
                    )
                    if computed:
                        self.unresolved.append(f"{owner}: {what} (line {n.lineno})")
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load):
                chain = []
                cur: ast.AST = n
                while isinstance(cur, ast.Attribute):
                    chain.append(cur.attr)
                    cur = cur.value
                if isinstance(cur, ast.Name) and cur.id not in local:
                    base = closure.get(cur.id, g.get(cur.id, _MISSING))
                    if isinstance(base, types.ModuleType):
                        if base.__name__.split(".")[0] == "importlib" and "import_module" in chain:
                            self.unresolved.append(
                                f"{owner}: importlib.import_module (line {n.lineno})"
                            )
                        self.attribute(owner, base, list(reversed(chain)))
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in local:
                if n.id in closure:
                    self.value(owner, f"{owner}.<closure {n.id}>", closure[n.id], closure=True)
                elif n.id in g:
                    self.global_value(owner, fn.__module__, n.id, g[n.id])
                elif not hasattr(builtins, n.id):
                    self.unresolved.append(f"{owner}: name {n.id!r} is not defined")

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
        assigns = self.assignments(modname).get(name, [])
        if assigns:
            self.components[cname] = _digest("\n".join(assigns))
        else:
            try:
                self.components[cname] = _digest(repr(value))
            except Exception:  # noqa: BLE001 - a repr may raise anything
                self.unresolved.append(f"{owner}: {cname} has neither an assignment nor a repr")

    def assignments(self, modname: str) -> dict[str, list[str]]:
        """Module-level assignments by the names they bind, each as its
        canonical text; built once per module."""
        if modname not in self._assigns:
            out: dict[str, list[str]] = {}
            tree = self.module_tree(modname)
            for st in tree.body if tree else []:
                targets = []
                if isinstance(st, ast.Assign):
                    targets = st.targets
                elif isinstance(st, (ast.AnnAssign, ast.AugAssign)):
                    targets = [st.target]
                names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
                if names:
                    text = _canon(st)
                    for n in names:
                        out.setdefault(n, []).append(text)
            self._assigns[modname] = out
        return self._assigns[modname]

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


def compute(fn: Any, root: str, ignore: Iterable[str] = ()) -> Recipe:
    """The recipe of stage function `fn`, with the project at `root`."""
    w = _Walker(root, ignore)
    fn = inspect.unwrap(fn)
    w.run(fn, f"{fn.__module__}.{fn.__qualname__}")
    w.components["python"] = f"{sys.version_info.major}.{sys.version_info.minor}"
    return Recipe(
        components=dict(sorted(w.components.items())),
        unresolved=sorted(set(w.unresolved)),
    )


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
