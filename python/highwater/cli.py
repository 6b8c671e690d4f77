"""The `highwater` console script: the CLI crate's entry point, run inside
the extension, so that `pip install highwater` puts the same command on PATH."""

import sys


def main() -> None:
    from highwater import _core

    sys.exit(_core.cli_main(["highwater", *sys.argv[1:]]))
