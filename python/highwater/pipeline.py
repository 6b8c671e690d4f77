"""`Pipeline` and the `stage` decorator (issue 22).

The state is the CLI's embedded default, `.highwater/state.db` under the
pipeline's root, so a Python pipeline and `highwater.toml` stages in the same
folder share one manifest.
"""

from __future__ import annotations

import os
import sys

from highwater import _core, recipe as _recipe
from highwater._records import Record
from highwater.errors import DeclarationError, HighwaterError, RunFailed

# Imported where they are used, not here: a no-change plan starts a Python
# process and imports this module (issue 22's plan benchmark counts the
# interpreter's start). Not the pool (multiprocessing, concurrent.futures: a
# third of that import), not `json` (its `re` pulls in `enum`: the engine
# takes and returns Python objects), not `dataclasses` or `inspect` (the
# records are plain classes), nor `typing` (2-4 ms). The hints name only
# what is here at no cost, so that `typing.get_type_hints` works (issue
# 48): `Callable` and `Iterable` from `_collections_abc`, the module behind
# `collections.abc` that `os` has already imported (`collections.abc`
# itself would import `collections`), and `object` where any value goes.
from _collections_abc import Callable, Iterable  # noqa: E402


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
    # "helpers.clean"; for reason "dependency": the file read that changed;
    # for "content" over landed windows (issue 49): the windows re-landed
    # with changed rows.
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
    """What `Pipeline.plan` found: `stages`, a dict of stage name to
    `StagePlan`. `is_empty()`: no item would run."""

    __slots__ = _fields = ("stages",)

    def is_empty(self) -> bool:
        return all(not s.changed for s in self.stages.values())


class Failed(Record):
    """One failed item of a run: its `input` and the `error` (the
    function's traceback, or why the item could not run)."""

    __slots__ = _fields = ("input", "error")


class StageResult(Record):
    """One stage's run: its `recipe` id, the counts (`discovered`,
    `unchanged`, `changed`, `new`, `processed`, `deleted`), the `failed`
    items, `blocked` (why an aggregate did not run, or None) and the
    `reasons` counted."""

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
    """What `Pipeline.run` did: `stages`, a dict of stage name to
    `StageResult`. `ok`: no item failed and no stage was blocked."""

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
        "in_process",
        "compare",
    )


def _name_ok(name: str) -> bool:
    """The CLI's rule for stage names (they become metric labels and file
    names beside the state)."""
    return bool(name) and all(c.isascii() and (c.isalnum() or c in "_-") for c in name)


def _check_importable(name: str, fn: Callable) -> None:
    """Refuses a stage function the worker processes could not import by
    name (they receive it pickled by reference), saying why and the fix."""
    qual = getattr(fn, "__qualname__", None) or repr(fn)
    why = None
    if not callable(fn):
        raise DeclarationError(f"stage {name!r}: {fn!r} is not a function")
    if "<locals>" in qual:
        why = "it is defined inside another function"
    elif getattr(fn, "__name__", None) == "<lambda>":
        why = "it is a lambda, which has no name to import it by"
    elif getattr(fn, "__module__", None) == "__main__" and not _main_has_file():
        why = "it is defined in an interactive session, a notebook or stdin, which has no file to import"
    if why is not None:
        raise DeclarationError(
            f"stage {name!r}: the worker processes cannot import {qual} ({why}). "
            "Define the function with `def` at the top level of a module file, "
            "or declare the stage with in_process=True to run its items in this process"
        )


def _main_has_file() -> bool:
    main = sys.modules.get("__main__")
    f = getattr(main, "__file__", None)
    return isinstance(f, str) and os.path.isfile(f)


def _check_picklable(stages: Iterable[_Stage]) -> None:
    """At run time, what declaration could not know (a function rebound
    after it was declared, say): each pooled stage's function pickles."""
    import pickle

    for s in stages:
        if s.in_process:
            continue
        try:
            pickle.dumps(s.fn)
        except Exception as e:  # noqa: BLE001 - pickle raises many kinds
            raise DeclarationError(
                f"stage {s.name!r}: its function cannot be sent to the worker processes ({e}). "
                "Define it with `def` at the top level of a module file, under its own name, "
                "or declare the stage with in_process=True"
            ) from None


def _not_bootstrapping() -> None:
    """Refuses a run started while a spawned worker imports the script
    (the script has no `if __name__ == "__main__":` guard)."""
    mp = sys.modules.get("multiprocessing")
    if mp is not None and getattr(mp.current_process(), "_inheriting", False):
        raise HighwaterError(
            "run() was called while a worker process was importing the script that "
            "declares the pipeline: the script runs at import. Put the call under "
            '`if __name__ == "__main__":` so that only the command you start runs it'
        )


def _resolve_root(root: str | os.PathLike | None, caller_file: str | None) -> str:
    """The pipeline's root: the folder of the file that creates the
    Pipeline, or `root` taken relative to that folder (issue 48: never the
    current folder, which depends on where the script is started from).
    Without a file (a notebook, stdin), the current folder."""
    base = os.path.dirname(os.path.abspath(caller_file)) if caller_file else os.getcwd()
    path = base if root is None else os.path.join(base, os.fspath(root))
    path = os.path.normpath(os.path.abspath(path))
    if not os.path.isdir(path):
        raise HighwaterError(
            f"the pipeline's root {path} is not a folder (root={root!r}, taken relative to "
            f"{base}, the folder of {caller_file or 'the current session'}). Create it, or "
            "pass the folder that holds the stages' inputs"
        )
    return path


class Pipeline:
    """A set of stages over one project folder and one state store.

    `root`: the project folder, which the stages' input globs and output
    templates are relative to. By default the folder of the file that
    creates the Pipeline; a relative `root` is taken from that folder too,
    never from the current folder, so a script behaves the same wherever it
    is started from. `state`: the state store's path relative to the root
    (`[state] path` in highwater.toml; default `.highwater/state.db`).
    `config`: a highwater.toml (relative to the root) whose `[sources]`
    stages over landed windows read (issue 49); its stages are not this
    pipeline's."""

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        state: str | None = None,
        config: str | None = None,
    ) -> None:
        caller = sys._getframe(1).f_globals.get("__file__")
        caller = caller if isinstance(caller, str) else None
        self.root = _resolve_root(root, caller)
        # The project's code: under the folder of the file that declares
        # the pipeline as well as under the root (issue 48).
        self.code_root = os.path.dirname(os.path.abspath(caller)) if caller else self.root
        # Relative to root, as `[state] path` in highwater.toml.
        self.state = state
        # The highwater.toml whose [sources] stages over windows read
        # (relative to root); its stages are not this pipeline's.
        self.config = config
        self._stages: dict[str, _Stage] = {}

    def __repr__(self) -> str:
        return f"Pipeline(root={self.root!r}, stages={sorted(self._stages)!r})"

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
        in_process: bool = False,
        compare: str | dict[str, str] | None = None,
    ) -> Callable[[Callable], Callable]:
        """Declares `fn(input, output)` (each a pathlib.Path) as a stage.

        `version=` replaces the code recipe with that string; `ignore=` drops
        the named components (and what only they reach) from it.
        `in_process=True` runs its items in the calling process, on the
        engine's threads, rather than in the pool of worker processes: for a
        function the workers cannot import (a lambda, one defined in a
        notebook). `compare=` is highwater.toml's `compare`: "bytes" (the
        default), "data" (a GeoPackage, Parquet, gzip or zip input whose
        bytes changed but whose data did not re-runs nothing), or a dict of
        glob -> mode.

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
            n = name or getattr(fn, "__name__", None) or "stage"
            if not _name_ok(n):
                raise DeclarationError(
                    f"stage name {n!r}: use only letters, digits, `_` and `-` (pass name=)"
                )
            if not in_process:
                _check_importable(n, fn)
            if n in self._stages and self._stages[n].fn is not fn:
                raise DeclarationError(f"stage {n!r} is declared twice; give one of them name=")
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
                in_process,
                compare,
            )
            # The function itself: the pool pickles it by reference.
            return fn

        return deco

    # -- recipes ------------------------------------------------------------
    def recipes(self) -> dict[str, _recipe.Recipe]:
        """Each stage's code recipe (components and what was unresolved)."""
        from highwater import reads

        reads.freeze()
        out = {}
        for s in self._stages.values():
            if s.version is not None:
                out[s.name] = _recipe.Recipe(components={"version": s.version}, unresolved=[])
            else:
                out[s.name] = _recipe.compute(
                    s.fn, self.root, s.ignore, self._facts_path(), self.code_root
                )
        return out

    def _declarations(self, recipes: dict[str, _recipe.Recipe]) -> list[dict[str, object]]:
        decl = []
        for s in self._stages.values():
            d: dict[str, object] = {
                "name": s.name,
                "inputs": s.inputs,
                "output": s.output,
                "on_delete": s.on_delete,
                "recipe": recipes[s.name].config(),
                # Shown by `highwater status` and `serve` beside the
                # highwater.toml stages of the same state.
                "declared_in": f"python:{_where(s.fn, self.root)}",
                # The worker reports what each item opened (highwater.reads).
                "reports_reads": not s.in_process,
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

    def _ledger(self) -> dict[str, object]:
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
        """What a run would do, changing nothing: per stage (or only
        `stage`), the items that changed, each with its reason and detail
        (the code components or the file read that changed), the counts,
        and what the code recipe could not follow (`unresolved`)."""
        recipes, raw = self._plan_raw(stage)
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
                    detail
                    if c["reason"] == "recipe"
                    else (c.get("detail") or c.get("dependency")),
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

    def _plan_raw(self, stage: str | None = None) -> tuple[dict[str, _recipe.Recipe], dict]:
        """The recipes and the engine's plan as it answers (each changed
        item with its digests now: highwater.dagster's data version)."""
        recipes = self.recipes()
        return recipes, _core.plan(self.root, self.state, self._declarations(recipes), stage)

    def run(
        self,
        stage: str | None = None,
        jobs: int | None = None,
        force: bool = False,
        in_process: bool = False,
        raise_on_failure: bool = True,
        items: Iterable[str] | None = None,
    ) -> Result:
        """Runs the changed items; a failing function fails its item only.

        Raises `RunFailed` (holding the `Result`) when an item failed or a
        stage was blocked, unless `raise_on_failure=False`; `GuardError`
        when the guard refuses (pass `force=True`). Ctrl-C stops it from
        starting more items, lets the running ones finish (a second Ctrl-C
        kills them), records what finished and raises KeyboardInterrupt.
        `in_process=True` runs every item in this process, on the engine's
        threads (for debugging; the default is spawned worker
        processes). `items` runs only those of the changed items (their
        inputs, as the plan names them: a Dagster partition); the stage's
        other changes stay pending for a later run."""
        from highwater.runner import Runner

        _not_bootstrapping()
        jobs = jobs or os.cpu_count() or 1
        recipes = self.recipes()
        _check_picklable(self._stages.values())
        pooled_off = {n for n, s in self._stages.items() if s.in_process}
        runner = Runner(
            {n: s.fn for n, s in self._stages.items()},
            jobs,
            True if in_process else pooled_off,
            self.root,
            windows={n for n, s in self._stages.items() if isinstance(s.inputs, dict)},
        )
        decl = self._declarations(recipes)
        raw, interrupted = _run_engine(
            lambda cancel: _core.run(
                self.root,
                self.state,
                decl,
                runner.dispatch,
                jobs,
                force,
                stage,
                cancel,
                None if items is None else sorted(set(items)),
            ),
            runner,
        )
        result = _result(raw)
        _log(result)
        if runner.fatal is not None:
            raise HighwaterError(runner.fatal)
        if interrupted:
            raise KeyboardInterrupt(
                "highwater: interrupted; what finished is recorded, the rest runs at the next run"
            )
        if raise_on_failure and not result.ok:
            raise RunFailed(_failure_message(result), result)
        return result

    def status(self) -> dict[str, object]:
        """`highwater status --json` of these stages."""
        recipes = self.recipes()
        return _core.status(self.root, self.state, self._declarations(recipes))

    def recipe_ids(self) -> dict[str, str]:
        """Each stage's recipe id, as the engine records it."""
        recipes = self.recipes()
        return _core.recipe_ids(self.root, self.state, self._declarations(recipes))

    def deps(self, stage: str) -> list[dict[str, object]]:
        """The files each item of one stage read when it last ran, and
        whether each changed since (as `highwater deps STAGE --json`)."""
        recipes = self.recipes()
        return _core.deps(self.root, self.state, self._declarations(recipes), stage)

    def entries(self, stage: str) -> list[dict[str, object]]:
        """The manifest entries of one stage (as `highwater export --json`)."""
        recipes = self.recipes()
        v = _core.export(self.root, self.state, self._declarations(recipes))
        return [e for e in v["entries"] if e["stage"] == stage]


def _run_engine(call: Callable[[object], object], runner: object) -> tuple[object, bool]:
    """Runs `call(cancel)` (the engine) in a thread of its own while this
    thread waits, so that a Ctrl-C reaches Python at once: the first stops
    the engine from starting anything more, the second kills the running
    items' workers. Returns the engine's answer and whether it was
    interrupted. Off the main thread (no signals there) it runs inline."""
    import threading

    cancel = _core.Cancel()
    runner.on_fatal = cancel.set
    if threading.current_thread() is not threading.main_thread():
        try:
            return call(cancel), False
        finally:
            runner.close()
    box: dict[str, object] = {}
    # An Event, not Thread.join: a join that a Ctrl-C interrupts marks the
    # thread as ended in Python 3.11 while it still runs (bpo-45274's fix).
    done = threading.Event()

    def target() -> None:
        try:
            box["raw"] = call(cancel)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=target, name="highwater-run", daemon=True).start()
    interrupts = 0
    while not done.is_set():
        try:
            done.wait(0.5)
        except KeyboardInterrupt:
            interrupts += 1
            if interrupts == 1:
                cancel.set()
                print(
                    "highwater: stopping; no new item starts, the running ones finish "
                    "(Ctrl-C again to kill them)",
                    file=sys.stderr,
                )
            else:
                runner.kill()
    runner.close()
    if "error" in box:
        raise box["error"]
    return box["raw"], interrupts > 0


def _result(raw: dict[str, object]) -> Result:
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


def _log(result: Result) -> None:
    """Each stage's outcome to the `highwater` logger: a line per stage
    (INFO), a line per failed item (WARNING, the error's last line)."""
    import logging

    log = logging.getLogger("highwater")
    for s in result.stages.values():
        log.info(
            "stage %s: %d processed, %d unchanged, %d deleted, %d failed",
            s.name, s.processed, s.unchanged, s.deleted, len(s.failed),
        )
        for f in s.failed:
            last = f.error.strip().splitlines()[-1] if f.error.strip() else "failed"
            log.warning("stage %s: %s failed: %s", s.name, f.input, last)
        if s.blocked:
            log.warning("stage %s: blocked: %s", s.name, s.blocked)


# Failed items named in RunFailed's message; the rest are counted.
FAILED_NAMED_MAX = 5


def _failure_message(result: Result) -> str:
    """What RunFailed says: per stage the failed items (the first few by
    name), the blocked stages, and the first failure's error in full."""
    lines = []
    first = None
    for s in result.stages.values():
        if s.failed:
            names = ", ".join(f.input for f in s.failed[:FAILED_NAMED_MAX])
            more = len(s.failed) - FAILED_NAMED_MAX
            lines.append(
                f"stage {s.name}: {len(s.failed)} item(s) failed ({names}"
                + (f", and {more} more" if more > 0 else "")
                + ")"
            )
            first = first or s.failed[0]
        if s.blocked:
            lines.append(f"stage {s.name}: blocked: {s.blocked}")
    text = "highwater: " + "; ".join(lines) + ". Failed items run again at the next run."
    if first is not None:
        text += f"\nThe first, {first.input}:\n{first.error.rstrip()}"
    return text
