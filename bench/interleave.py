"""Times commands interleaved (issue 48): round after round, each command
once, in turn, so that a busy machine's load falls on all of them alike
(hyperfine runs one command's runs together). Prints, per command, the
minimum and the median wall time, and the ratio of each median to the
last command's.

    python bench/interleave.py --rounds 20 --warmup 3 --cwd DIR -- \\
        'python pipeline.py plan' 'git status --porcelain'
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import time


def once(argv: list[str], cwd: str) -> float:
    """One run's wall time in seconds; a failed run stops the benchmark."""
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{shlex.join(argv)} exited {r.returncode}: {r.stderr.decode()[-2000:]}")
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--cwd", default=".")
    ap.add_argument("--per", type=int, default=0, help="also print (median - the last's median) / PER, in ms")
    ap.add_argument("commands", nargs="+")
    a = ap.parse_args()
    cmds = [shlex.split(c) for c in a.commands]
    for _ in range(a.warmup):
        for c in cmds:
            once(c, a.cwd)
    times: list[list[float]] = [[] for _ in cmds]
    for _ in range(a.rounds):
        for i, c in enumerate(cmds):
            times[i].append(once(c, a.cwd))
    peer = statistics.median(times[-1])
    for c, ts in zip(a.commands, times):
        med = statistics.median(ts)
        per = f", {(med - peer) * 1000 / a.per:+.3f} ms per item over the last" if a.per else ""
        print(f"{c}: min {min(ts) * 1000:.1f} ms, median {med * 1000:.1f} ms, {med / peer:.2f}x the last{per}")


if __name__ == "__main__":
    main()
