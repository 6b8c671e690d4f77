"""The files a Python stage's function reads (issue 48), seen by audit
hooks (PEP 578) in the worker process that runs it.

Every `open` event counts: `open()`, `io.open`, `os.open`, `pathlib`'s
reads and writes, and libraries that open files through Python (pandas,
json, csv, PIL's `Image.open`...). A file opened for reading is a read; for
writing, appending or updating, a write (never a dependency). Files of code
(`.py`, `.pyc`, `.so`) are left out: code is the code recipe's, which sees
exactly which functions a stage reaches, where a file-level dependency
would re-run every item at any edit of the file.

Not seen: files opened by C code without Python (GDAL, Arrow's and Parquet
readers, SQLite, HDF5, netCDF), subprocesses the function starts, directory
listings, and reads of a stage declared `in_process=True` (its opens cannot
be told from those of the engine's other threads).

Reads made while the pipeline's modules are imported count for every item:
in the worker (its imports of the parent's script and the stages'
modules), and for the script itself, which a spawned worker imports
before any hook can be installed, in the parent, from `import highwater`
on. Only the project's own reads count there (see `_by_project_code`):
not those of a library or a host that imports the pipeline, such as
Airflow reading its configuration.
"""

from __future__ import annotations

import os
import sys

# Files of code, left to the code recipe.
CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyd", ".so")

_watching = False
# Set in the parent at its first plan or run: what it reads from then on
# (the recipe's own reads of module sources and metadata) is no import.
_frozen = False
# Reads while no item runs (imports), and per item.
_outside: set[str] = set()
_item: set[str] | None = None
_written: set[str] = set()


def _hook(event: str, args: tuple) -> None:
    if event != "open":
        return
    path, mode, flags = args
    if isinstance(path, int) or path is None:
        return
    try:
        path = os.fsdecode(os.fspath(path))
    except TypeError:
        return
    if path.endswith(CODE_SUFFIXES):
        return
    if mode is None and not os.path.isabs(path) and _walks_a_tree(sys._getframe(1).f_code):
        return
    if mode is not None:
        writes = any(c in mode for c in "wax+")
    else:
        writes = (flags or 0) & os.O_ACCMODE != os.O_RDONLY
    path = os.path.abspath(path)
    if writes:
        if _item is not None:
            _written.add(path)
    elif _item is not None:
        _item.add(path)
    elif not _frozen and (_in_worker or _by_project_code()):
        _outside.add(path)


def _walks_a_tree(caller) -> bool:
    """Whether `os.open` was called by the standard library's tree walkers
    (`shutil.rmtree`, `os.fwalk`), which open folders relative to a folder's
    descriptor to list or delete them. The event does not carry that
    descriptor, so their names would resolve against the working folder:
    a script that removed a 2,000-folder cache before `run()` gave every
    item 2,000 dependencies on absent files at the root, and the run took
    six times as long (issue 48, bench/python_interleaved.sh). Those opens
    read no file's contents either way."""
    name = caller.co_name
    return (name == "rmtree" or name.startswith("_rmtree")) and caller.co_filename == _SHUTIL or (
        name in ("fwalk", "_fwalk") and caller.co_filename == _OS
    )


def _by_project_code() -> bool:
    """Whether a read made outside any item (while modules are imported)
    is the project's: the innermost caller outside the standard library
    is the project's own code (`json.load(open("config.json"))` or a
    `pathlib` read at a module's top level, or in a function it calls),
    not an installed library reading its own configuration or data as it
    is imported or called (Airflow reading `airflow.cfg`, Dagster its
    instance), nor this package. A project's module-level read made
    through a library (`pandas.read_csv` at import) is therefore not an
    import read; the same call inside the stage's function is an item's
    read and counts."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if name.startswith("<frozen ") or (name.startswith(_STDLIB) and not _installed(name)):
            f = f.f_back
            continue
        return not (_installed(name) or name.startswith(_HERE))
    return False


def _installed(filename: str) -> bool:
    parts = filename.split(os.sep)
    return "site-packages" in parts or "dist-packages" in parts


# The standard library's folder, and this package's.
_STDLIB = os.path.dirname(os.__file__) + os.sep
_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_SHUTIL = _STDLIB + "shutil.py"
_OS = os.__file__
_in_worker = False


def watch() -> None:
    """Installs the hook, once per process (a hook cannot be removed)."""
    global _watching
    if not _watching:
        _watching = True
        sys.addaudithook(_hook)


def freeze() -> None:
    """Ends the import reads of this process (its first plan or run)."""
    global _frozen
    _frozen = True


def import_reads() -> list[str]:
    """What this process read outside any item (the pipeline's imports)."""
    return sorted(_outside)


def add_import_reads(paths: list[str]) -> None:
    """In a worker: the parent script's import reads; from now on every
    read outside an item is one (the worker's imports)."""
    global _in_worker
    _in_worker = True
    _outside.update(paths)


def begin_item() -> None:
    global _item
    _item = set()
    _written.clear()


def end_item() -> tuple[list[str], list[str]]:
    """The item's reads (imports' included) and writes."""
    global _item
    read = (_item or set()) | _outside
    _item = None
    written = set(_written)
    _written.clear()
    return sorted(read - written), sorted(written)
