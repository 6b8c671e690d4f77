"""The worker processes that run a stage's items (issue 22).

The engine's worker threads each call `Runner.dispatch` for one item; it
hands the item to a spawned process of its own over a pipe and waits for
the answer. The wait releases the GIL, so the engine's threads, and its
own work (hashing, committing), go on meanwhile. Spawn, not fork: forking
a process that has Rust threads can deadlock (cpython gh-90622).

One process per engine thread, each reached through its own pipe, rather
than `concurrent.futures.ProcessPoolExecutor`: the executor passes every
item through a queue-management thread and a feeder thread, four thread
hand-offs a round trip: a pipe per worker took 0.16-0.45 ms per item off a
one-job run of 2,000 trivial items (+0.96-1.31 ms over the plain loop
before, +0.77-0.90 after; issue 48, bench/python_interleaved.sh's work.py).

A worker that dies mid-item (killed, out of memory) fails the item it held
with that message (its temp output is never renamed into place; it runs
again at the next run), and a new process serves the next item.

Ctrl-C (issue 48): the workers ignore SIGINT, which a terminal sends to the
whole process group, so that the items they run finish and are recorded;
the caller stops the engine from starting more (`Pipeline.run`). A second
Ctrl-C kills the workers (`Runner.kill`): their items fail as interrupted.
"""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import signal
import threading
import traceback
from typing import Callable

from highwater import reads

# Said when the first worker died before it could run an item:
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


def _serve(conn, import_reads: list[str], root: str) -> None:
    """A worker's life: set up (`_start_worker`), answer the parent's ping,
    then run each item the pipe brings until it brings None or closes."""
    _start_worker(import_reads, root)
    conn.send("ready")
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        conn.send(_run_item(*job))


class _Worker:
    """One spawned process and the pipe to it, used by one engine thread at
    a time."""

    def __init__(self, ctx, import_reads: list[str], root: str) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, import_reads, root), daemon=True)
        self.proc.start()
        child.close()
        # EOFError here: it died as it started (importing the script); its
        # pipe and process are let go before the caller hears of it.
        try:
            if self.conn.recv() != "ready":
                raise EOFError("the worker answered its start with something else")
        except BaseException:
            self.stop(wait=False)
            raise

    def call(self, job: tuple) -> tuple[str | None, list[str], list[str]]:
        # Pickled whole before anything is written: an unpicklable job
        # raises here and leaves the pipe clean.
        self.conn.send(job)
        return self.conn.recv()

    def stop(self, wait: bool) -> None:
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        if wait:
            self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


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
    """Runs items for the engine: in spawned processes, one per engine thread
    at work, or in this process for the stages named in `in_process` (every
    stage if True)."""

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
        self._ctx = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        # Workers waiting for an item, and every live one (for `kill`).
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        # Whether a worker ever started; see `_take`.
        self._started = False
        # Set when the run cannot go on (the workers cannot start); the
        # pipeline raises it after the engine returns.
        self.fatal: str | None = None
        self.killed = False
        self.on_fatal: Callable[[], None] | None = None

    def _take(self) -> _Worker | None:
        """An idle worker, or a new one; None when workers cannot start."""
        with self._lock:
            if self.fatal is not None:
                return None
            if self._idle:
                return self._idle.pop()
        try:
            w = _Worker(self._ctx, reads.import_reads(), self.root)
        except (EOFError, OSError):
            with self._lock:
                started = self._started
            if started:
                raise
            # No worker ever started: workers that die as they import the
            # script, told apart from an item that kills its own.
            self.fatal = _DIED_AT_START
            if self.on_fatal is not None:
                self.on_fatal()
            return None
        with self._lock:
            self._started = True
            self._all.add(w)
            if self.killed:
                w.proc.kill()
        return w

    def _give_back(self, w: _Worker) -> None:
        with self._lock:
            self._idle.append(w)

    def _discard(self, w: _Worker) -> None:
        with self._lock:
            self._all.discard(w)
        w.stop(wait=False)

    def dispatch(
        self, stage: str, input: str | None, inputs: list[str], output: str, relpath: str
    ) -> str | tuple[str | None, list[str], list[str]] | None:
        """Runs one item: None or the error as text, with the paths its
        function read and wrote when it ran in a worker (the engine records
        them)."""
        fn = self.functions[stage]
        window = tuple(relpath.split("/", 1)) if stage in self.windows else None
        if stage in self.in_process:
            return _run_item_here(fn, input, inputs, output, window)
        if self.killed:
            return "interrupted (a second Ctrl-C) before this item started; it runs at the next run"
        try:
            w = self._take()
        except (EOFError, OSError) as e:
            return self._died(e)
        if w is None:
            return f"not run: {self.fatal}"
        try:
            answer = w.call((fn, input, inputs, output, window))
        except (EOFError, OSError) as e:
            self._discard(w)
            return self._died(e)
        except BaseException:  # noqa: BLE001 - pickling errors and the like
            self._give_back(w)
            return traceback.format_exc()
        self._give_back(w)
        # (None or the traceback, the paths it read, the paths it wrote).
        return answer

    def _died(self, e: BaseException) -> str:
        if self.killed:
            return (
                "interrupted: its worker process was killed by a second Ctrl-C; "
                "its output was not published and the item runs again at the next run"
            )
        return (
            f"the worker process running this item died ({type(e).__name__}: {e}); "
            "its output was not published and the item runs again at the next run"
        )

    def kill(self) -> None:
        """Kills the worker processes (a second Ctrl-C): the items they run
        fail, unpublished, and run again at the next run."""
        self.killed = True
        with self._lock:
            workers = list(self._all)
        for w in workers:
            try:
                w.proc.kill()
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        """Stops the workers and waits for them to exit."""
        with self._lock:
            workers, self._all, self._idle = list(self._all), set(), []
        for w in workers:
            w.stop(wait=True)


__all__ = ["Runner", "_run_item"]
