"""`Pipeline` and the `stage` decorator (issue 22).

The state is the CLI's embedded default, `.highwater/state.db` under the
pipeline's root, so a Python pipeline and `highwater.toml` stages in the same
folder share one manifest.
"""

from __future__ import annotations

import os

from highwater import _core, recipe as _recipe
from highwater._records import Record

# Imported where they are used, not here: a no-change plan starts a Python
# process and imports this module (issue 22's plan benchmark counts the
# interpreter's start). Not the pool (multiprocessing, concurrent.futures: a
# third of that import), not `json` (its `re` pulls in `enum`: the engine
# takes and returns Python objects), not `dataclasses` or `inspect` (the
# records are plain classes), nor `typing` (2-4 ms): with the annotations
# future, `Any`, `Callable` and `Iterable` in the hints are never evaluated.


def _where(fn: Callable, root: str) -> str:
    """`file.py:function`, the file relative to the project root when inside it."""
    code = getattr(fn, "__code__", None)
    f = code.co_filename if code is not None else ""
    if f.startswith("<"):  # `<string>`, `<stdin>`: no file
        f = ""
    if f and os.path.abspath(f).startswith(root + os.sep):
        f = os.path.relpath(f, root)
    return f"{f or fn.__module__}:{fn.__qualname__}"


class Item(Record):
    """One changed item of a plan."""

    # `detail`, for reason "recipe": the components that changed, e.g.
    # "helpers.clean"; for "content" over landed windows (issue 49): the
    # windows re-landed with changed rows.
    __slots__ = _fields = ("input", "output", "reason", "detail")
    _defaults = {"detail": None}


class StagePlan(Record):
    """One stage's plan. `unresolved`: what the code recipe could not follow
    statically (getattr by a computed name, importlib, ...); changes there
    are not seen. `layout`: inputs compared as data (`compare=`) whose bytes
    changed and whose data did not; they are counted as unchanged."""

    __slots__ = _fields = (
        "name",
        "recipe",
        "total",
        "unchanged",
        "counts",
        "changed",
        "unresolved",
        "components",
        "layout",
    )


class Plan(Record):
    __slots__ = _fields = ("stages",)

    def is_empty(self) -> bool:
        return all(not s.changed for s in self.stages.values())


class Failed(Record):
    __slots__ = _fields = ("input", "error")


class StageResult(Record):
    __slots__ = _fields = (
        "name",
        "recipe",
        "discovered",
        "unchanged",
        "changed",
        "new",
        "processed",
        "deleted",
        "failed",
        "blocked",
        "reasons",
        "layout",
    )


class Result(Record):
    __slots__ = _fields = ("stages",)

    @property
    def ok(self) -> bool:
        return all(not s.failed and not s.blocked for s in self.stages.values())


class _Stage(Record):
    __slots__ = _fields = (
        "name",
        "fn",
        "inputs",
        "output",
        "version",
        "ignore",
        "guard",
        "guard_items_min",
        "on_delete",
        "compare",
    )


class Pipeline:
    def __init__(
        self,
        root: str | os.PathLike = ".",
        state: str | None = None,
        config: str | None = None,
    ):
        self.root = os.path.abspath(os.fspath(root))
        # Relative to root, as `[state] path` in highwater.toml.
        self.state = state
        # The highwater.toml whose [sources] stages over windows read
        # (relative to root); its stages are not this pipeline's.
        self.config = config
        self._stages: dict[str, _Stage] = {}

    # -- declaring ----------------------------------------------------------
    def stage(
        self,
        inputs: Iterable[str] | dict[str, str],
        output: str,
        name: str | None = None,
        version: str | None = None,
        ignore: Iterable[str] = (),
        guard: float | None = None,
        guard_items_min: int | None = None,
        on_delete: str = "remove",
        compare: str | dict[str, Any] | None = None,
    ) -> Callable[[Callable], Callable]:
        """Declares `fn(input, output)` (each a pathlib.Path) as a stage.

        `version=` replaces the code recipe with that string; `ignore=` drops
        the named components (and what only they reach) from it. `compare=`
        is highwater.toml's `compare`: "bytes" (the default), "data" (a
        GeoPackage, Parquet, gzip or zip input whose bytes changed but whose
        data did not re-runs nothing), or a dict of glob -> mode.

        `inputs={"source": "orders", "by": "day"}` makes the items a
        source's landed windows (issue 49; the source is read from
        `Pipeline(config=...)`): `fn(files, output, window)` gets the
        window's current data files, the output and `(start, end)`."""
        if isinstance(inputs, str):
            inputs = [inputs]
        if isinstance(inputs, dict) and self.config is None:
            raise ValueError(
                "a stage over a source's windows reads the source from a config: "
                'give Pipeline(config="highwater.toml")'
            )

        def deco(fn: Callable) -> Callable:
            n = name or fn.__name__
            if "<locals>" in getattr(fn, "__qualname__", "<locals>"):
                # The worker processes import the function by its name.
                raise ValueError(
                    f"stage {n!r}: {getattr(fn, '__qualname__', fn)!r} is not defined at module "
                    "level; define stage functions at the top of a module so that the worker "
                    "processes can import them"
                )
            if n in self._stages and self._stages[n].fn is not fn:
                raise ValueError(f"stage {n!r} is declared twice; give one of them name=")
            self._stages[n] = _Stage(
                n,
                fn,
                dict(inputs) if isinstance(inputs, dict) else list(inputs),
                output,
                version,
                list(ignore),
                guard,
                guard_items_min,
                on_delete,
                compare,
            )
            # The function itself: the pool pickles it by reference.
            return fn

        return deco

    # -- recipes ------------------------------------------------------------
    def recipes(self) -> dict[str, _recipe.Recipe]:
        out = {}
        for s in self._stages.values():
            if s.version is not None:
                out[s.name] = _recipe.Recipe(components={"version": s.version}, unresolved=[])
            else:
                out[s.name] = _recipe.compute(s.fn, self.root, s.ignore, self._facts_path())
        return out

    def _declarations(self, recipes: dict[str, _recipe.Recipe]) -> list[dict[str, Any]]:
        decl = []
        for s in self._stages.values():
            d: dict[str, Any] = {
                "name": s.name,
                "inputs": s.inputs,
                "output": s.output,
                "on_delete": s.on_delete,
                "recipe": recipes[s.name].config(),
                # Shown by `highwater status` and `serve` beside the
                # highwater.toml stages of the same state.
                "declared_in": f"python:{_where(s.fn, self.root)}",
            }
            if isinstance(s.inputs, dict):
                d["sources_from"] = self.config
            if s.guard is not None:
                d["guard"] = s.guard
            if s.guard_items_min is not None:
                d["guard_items_min"] = s.guard_items_min
            if s.compare is not None:
                d["compare"] = s.compare
            decl.append(d)
        return decl

    def _state_dir(self) -> str:
        state = self.state or ".highwater/state.db"
        return os.path.dirname(os.path.join(self.root, state))

    def _facts_path(self) -> str:
        # What the code recipe's walk read from each module's source, by
        # the file's stat (a cache: see recipe._Facts).
        return os.path.join(self._state_dir(), "python-recipe-facts")

    # -- the file earlier versions kept the components in (read only) -------
    def _ledger_path(self) -> str:
        return os.path.join(self._state_dir(), "python-recipes.json")

    def _ledger(self) -> dict[str, Any]:
        import json  # a state this old is rare

        try:
            with open(self._ledger_path()) as f:
                return json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            # Only the detail is lost: the recipe id itself is in the state.
            return {}

    # -- plan and run -------------------------------------------------------
    def plan(self, stage: str | None = None) -> Plan:
        recipes = self.recipes()
        raw = _core.plan(self.root, self.state, self._declarations(recipes), stage)
        stages = {}
        for s in raw["stages"]:
            name = s["name"]
            comps = recipes[name].components
            detail = None
            # Only an item re-run for its recipe has a detail to name (and
            # only then does the engine send the last run's recipe).
            if any(c["reason"] == "recipe" for c in s["changed"]):
                # The recipe of the stage's last run, as the state store
                # keeps it (shared with the CLI and the fleet; SQLite or
                # PostgreSQL).
                last = s.get("last_recipe") or {}
                old = (last.get("config") or {}).get("components")
                last_id = last.get("id")
                if old is None:
                    # A state whose last run predates that record: the file
                    # earlier versions kept beside the state.
                    led = self._ledger().get(name, {})
                    last_id = led.get("last")
                    old = led.get("recipes", {}).get(last_id)
                if old is not None and last_id != s["recipe"]:
                    detail = ", ".join(_recipe.changed(old, comps)) or None
            items = [
                Item(
                    c["input"],
                    c["output"],
                    c["reason"],
                    detail if c["reason"] == "recipe" else c.get("detail"),
                )
                for c in s["changed"]
            ]
            stages[name] = StagePlan(
                name,
                s["recipe"],
                s["total"],
                s["unchanged"],
                s["counts"],
                items,
                recipes[name].unresolved,
                comps,
                [c["input"] for c in s.get("layout", [])],
            )
        return Plan(stages)

    def run(
        self,
        stage: str | None = None,
        jobs: int | None = None,
        force: bool = False,
        in_process: bool = False,
    ) -> Result:
        """Runs the changed items; a failing function fails its item only.

        `in_process=True` runs items in this process, on the engine's threads
        (for debugging; the default is a pool of spawned processes)."""
        from highwater.runner import Runner

        jobs = jobs or os.cpu_count() or 1
        recipes = self.recipes()
        runner = Runner(
            {n: s.fn for n, s in self._stages.items()},
            jobs,
            in_process,
            windows={n for n, s in self._stages.items() if isinstance(s.inputs, dict)},
        )
        try:
            raw = _core.run(
                self.root,
                self.state,
                self._declarations(recipes),
                runner.dispatch,
                jobs,
                force,
                stage,
            )
        finally:
            runner.close()
        out = {}
        for s in raw["stages"]:
            out[s["name"]] = StageResult(
                name=s["name"],
                recipe=raw["recipes"][s["name"]],
                discovered=s["discovered"],
                unchanged=s["unchanged"],
                changed=s["changed"],
                new=s["new"],
                processed=s["processed"],
                deleted=s["deleted"],
                failed=[Failed(f["input"], f["error"]) for f in s["failed"]],
                blocked=s.get("blocked"),
                reasons=s["reasons"],
                layout=s.get("layout", []),
            )
        return Result(out)

    def status(self) -> dict[str, Any]:
        """`highwater status --json` of these stages."""
        recipes = self.recipes()
        return _core.status(self.root, self.state, self._declarations(recipes))

    def recipe_ids(self) -> dict[str, str]:
        recipes = self.recipes()
        return _core.recipe_ids(self.root, self.state, self._declarations(recipes))

    def entries(self, stage: str) -> list[dict[str, Any]]:
        """The manifest entries of one stage (as `highwater export --json`)."""
        recipes = self.recipes()
        v = _core.export(self.root, self.state, self._declarations(recipes))
        return [e for e in v["entries"] if e["stage"] == stage]
