"""The process pool that runs a stage's items (issue 22).

The engine's worker threads each call `Runner.dispatch` for one item; it
hands the item to a pool of spawned processes and waits for the answer. The
wait releases the GIL, so the engine's threads, and its own work (hashing,
committing), go on meanwhile. Spawn, not fork: forking a process that has
Rust threads can deadlock (cpython gh-90622).

A worker that dies mid-item (killed, out of memory) breaks the pool: every
item it held fails with that message and is retried at the next run (its
temp output is never renamed into place), and a new pool serves the rest.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import pathlib
import threading
import traceback
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable


def _run_item(
    fn: Callable,
    input: str | None,
    inputs: list[str],
    output: str,
    window: tuple[str, str] | None = None,
) -> str | None:
    """In the worker: run one item; None, or the traceback as text."""
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


class Runner:
    def __init__(
        self,
        functions: dict[str, Callable],
        jobs: int,
        in_process: bool = False,
        windows: set[str] = frozenset(),
    ):
        self.functions = functions
        # Stages over landed windows: their items' relpath is START/END.
        self.windows = windows
        self.jobs = jobs
        self.in_process = in_process
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _get_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    max_workers=self.jobs, mp_context=multiprocessing.get_context("spawn")
                )
            return self._pool

    def _replace_broken(self, broken: concurrent.futures.ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is broken:
                self._pool = None
        broken.shutdown(wait=False, cancel_futures=True)

    def dispatch(
        self, stage: str, input: str | None, inputs: list[str], output: str, relpath: str
    ) -> str | None:
        fn = self.functions[stage]
        window = tuple(relpath.split("/", 1)) if stage in self.windows else None
        if self.in_process:
            return _run_item(fn, input, inputs, output, window)
        pool = self._get_pool()
        try:
            return pool.submit(_run_item, fn, input, inputs, output, window).result()
        except BrokenProcessPool as e:
            self._replace_broken(pool)
            return (
                f"the worker process running this item died ({e}); "
                "its output was not published and the item runs again at the next run"
            )
        except BaseException:  # noqa: BLE001 - pickling errors and the like
            return traceback.format_exc()

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


__all__ = ["Runner", "_run_item", "Any"]
