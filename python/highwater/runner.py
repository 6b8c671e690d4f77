"""The process pool that runs a stage's items (issue 22).

The engine's worker threads each call `Runner.dispatch` for one item; it
hands the item to a pool of spawned processes and waits for the answer. The
wait releases the GIL, so the engine's threads, and its own work (hashing,
committing), go on meanwhile. Spawn, not fork: forking a process that has
Rust threads can deadlock (cpython gh-90622).

A worker that dies mid-item (killed, out of memory) breaks the pool: every
item it held fails with that message and is retried at the next run (its
temp output is never renamed into place), and a new pool serves the rest.

Ctrl-C (issue 48): the workers ignore SIGINT, which a terminal sends to the
whole process group, so that the items they run finish and are recorded;
the caller stops the engine from starting more (`Pipeline.run`). A second
Ctrl-C kills the workers (`Runner.kill`): their items fail as interrupted.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import pathlib
import signal
import threading
import traceback
from concurrent.futures.process import BrokenProcessPool
from typing import Callable

from highwater import reads

# Said when the first pool's workers died before any of them ran an item:
# almost always a script that starts a run at import, in every worker.
_DIED_AT_START = (
    "the worker processes died as they started, before running any item. "
    "If the script that declares the pipeline calls run() (or plan()) at "
    "module level, the workers run it again as they import the script: put "
    'that call under `if __name__ == "__main__":`. The workers\' own error '
    "is printed above."
)


def _start_worker(import_reads: list[str], root: str) -> None:
    """In each worker as it starts: a Ctrl-C is the parent's to handle; the
    working folder is the pipeline's root, wherever the script was started
    (relative paths in a stage's function mean the same files every run);
    what the worker opens is watched (see `highwater.reads`).
    `import_reads`: what the parent read as it imported the pipeline's
    modules, part of every item's reads."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.chdir(root)
    reads.watch()
    reads.add_import_reads(import_reads)


def _call(
    fn: Callable,
    input: str | None,
    inputs: list[str],
    output: str,
    window: tuple[str, str] | None = None,
) -> str | None:
    """Runs one item's function; None, or the traceback as text."""
    try:
        out = pathlib.Path(output)
        if window is not None:
            # A stage over landed windows (issue 49): its data files, the
            # output and the item's (start, end), RFC 3339.
            fn([pathlib.Path(p) for p in inputs], out, window)
        elif input is None:
            fn([pathlib.Path(p) for p in inputs], out)
        else:
            fn(pathlib.Path(input), out)
        return None
    except BaseException:  # noqa: BLE001 - every failure is the item's, recorded
        return traceback.format_exc()


def _run_item(
    fn: Callable,
    input: str | None,
    inputs: list[str],
    output: str,
    window: tuple[str, str] | None = None,
) -> tuple[str | None, list[str], list[str]]:
    """In the worker: runs one item. Returns (None or the traceback as
    text, the paths it read, the paths it wrote)."""
    reads.begin_item()
    error = _call(fn, input, inputs, output, window)
    read, written = reads.end_item()
    return (error, read, written)


def _run_item_here(
    fn: Callable,
    input: str | None,
    inputs: list[str],
    output: str,
    window: tuple[str, str] | None = None,
) -> str | None:
    """In this process (`in_process`): its opens cannot be told from those
    of the engine's other threads, so no reads are reported."""
    return _call(fn, input, inputs, output, window)


class Runner:
    """Runs items for the engine: in a pool of spawned processes, or in this
    process for the stages named in `in_process` (every stage if True)."""

    def __init__(
        self,
        functions: dict[str, Callable],
        jobs: int,
        in_process: bool | set[str] = False,
        root: str = ".",
        windows: set[str] = frozenset(),
    ) -> None:
        self.functions = functions
        self.root = root
        # Stages over landed windows: their items' relpath is START/END.
        self.windows = windows
        self.jobs = jobs
        self.in_process = set(functions) if in_process is True else set(in_process or ())
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        # Whether a worker of the first pool ever started; see `_get_pool`.
        self._started = False
        # Set when the run cannot go on (the workers cannot start); the
        # pipeline raises it after the engine returns.
        self.fatal: str | None = None
        self.killed = False
        self.on_fatal: Callable[[], None] | None = None

    def _get_pool(self) -> concurrent.futures.ProcessPoolExecutor | None:
        """The pool, started on first use; None when its workers cannot start."""
        with self._lock:
            if self._pool is None and self.fatal is None:
                pool = concurrent.futures.ProcessPoolExecutor(
                    max_workers=self.jobs,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start_worker,
                    initargs=(reads.import_reads(), self.root),
                )
                if not self._started:
                    # The first pool runs nothing before one worker has
                    # started: workers that die as they import the script
                    # are then told apart from an item that kills its own.
                    try:
                        pool.submit(int).result()
                    except BrokenProcessPool:
                        pool.shutdown(wait=False, cancel_futures=True)
                        self.fatal = _DIED_AT_START
                        if self.on_fatal is not None:
                            self.on_fatal()
                        return None
                    self._started = True
                self._pool = pool
            return self._pool

    def _replace_broken(self, broken: concurrent.futures.ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is broken:
                self._pool = None
        broken.shutdown(wait=False, cancel_futures=True)

    def dispatch(
        self, stage: str, input: str | None, inputs: list[str], output: str, relpath: str
    ) -> str | None:
        """Runs one item; None, or the error as text (the engine records it)."""
        fn = self.functions[stage]
        window = tuple(relpath.split("/", 1)) if stage in self.windows else None
        if stage in self.in_process:
            return _run_item_here(fn, input, inputs, output, window)
        if self.killed:
            return "interrupted (a second Ctrl-C) before this item started; it runs at the next run"
        pool = self._get_pool()
        if pool is None:
            return f"not run: {self.fatal}"
        try:
            return pool.submit(_run_item, fn, input, inputs, output, window).result()
        except BrokenProcessPool as e:
            self._replace_broken(pool)
            return self._died(e)
        except BaseException:  # noqa: BLE001 - pickling errors and the like
            return traceback.format_exc()

    def _died(self, e: BaseException) -> str:
        if self.killed:
            return (
                "interrupted: its worker process was killed by a second Ctrl-C; "
                "its output was not published and the item runs again at the next run"
            )
        return (
            f"the worker process running this item died ({e}); "
            "its output was not published and the item runs again at the next run"
        )

    def kill(self) -> None:
        """Kills the worker processes (a second Ctrl-C): the items they run
        fail, unpublished, and run again at the next run."""
        self.killed = True
        with self._lock:
            pool = self._pool
        if pool is None:
            return
        # The executor keeps its processes by pid; nothing public lists them.
        for proc in list(getattr(pool, "_processes", {}).values()):
            try:
                proc.kill()
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        """Waits for the pool's workers to exit."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


__all__ = ["Runner", "_run_item"]
