# highwater's observer (issue 47): tells the tracer which folder listings
# Python's import system makes, so that a name no import can match (a new
# `notes.txt`) does not re-run the command, while a new `helpers.py` does.
# It changes nothing else: each `os.listdir` and `os.scandir` is announced
# by a stat of a path that never exists, then the next sitecustomize on
# sys.path, if any, is imported as Python itself would have.
import sys


def _highwater_install():
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    mark = os.path.join(here, "listing")
    stat = os.stat
    fsencode = os.fsencode
    abspath = os.path.abspath
    getframe = sys._getframe
    # The module FileFinder's `_fill_cache` lives in, frozen or not.
    importers = ("_frozen_importlib_external", "importlib._bootstrap_external")

    def announce(kind):
        try:
            stat(mark + "/" + kind)
        except (OSError, ValueError):
            pass

    def hook(event, args):
        if event == "os.listdir":
            kind = "u"
            try:
                caller = getframe(1).f_globals.get("__name__")
                path = args[0]
                if caller in importers and isinstance(path, (str, bytes)):
                    kind = "i" + fsencode(abspath(path)).hex()
            except Exception:
                kind = "u"
            # A path too long to announce is announced as a user's listing:
            # the whole listing counts, which is never less safe.
            announce(kind if len(kind) < 3800 else "u")
        elif event == "os.scandir":
            announce("u")

    if hasattr(sys, "addaudithook"):
        sys.addaudithook(hook)

    # The next sitecustomize, as site.py would have imported it.
    # importlib re-registers whatever is under the name once this module
    # has run: the next one if there is one, else this one.
    saved = sys.path[:]
    this = sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if abspath(p or ".") != here]
    try:
        import sitecustomize  # noqa: F401
    except ImportError as e:
        if e.name != "sitecustomize":
            raise
        sys.modules["sitecustomize"] = this
    finally:
        sys.path[:] = saved


_highwater_install()
del _highwater_install
