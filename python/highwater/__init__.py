"""highwater for Python (issues 22, 48): stages as Python functions over the
same engine as the `highwater` CLI, with a code recipe that sees the
functions a stage calls.

    import highwater as hw

    p = hw.Pipeline()            # the folder of this file

    @p.stage(inputs=["data/*.txt"], output="out/{stem}.txt")
    def tidy(input, output):
        output.write_text(input.read_text().strip())

    if __name__ == "__main__":
        p.run()                  # raises hw.RunFailed if an item failed
"""

from highwater import reads as _reads
from highwater.errors import DeclarationError, GuardError, HighwaterError, RunFailed
from highwater._core import ENGINE_VERSION as __version__
from highwater.pipeline import Pipeline, Plan, Result

# What the script reads at import from here on counts for every item of its
# stages (see highwater.reads).
_reads.watch()

__all__ = [
    "__version__",
    "Pipeline",
    "Plan",
    "Result",
    "HighwaterError",
    "GuardError",
    "DeclarationError",
    "RunFailed",
]
