#!/usr/bin/env bash
# The Python package (issue 22), as scripts/test.sh runs it: builds the
# extension from this checkout into the venv scripts/deps.sh made
# (`pip install .`, the same engine crates as the CLI), installs what its
# tests need (pytest, joblib, dagster; Airflow in a venv of its own), and
# runs python/tests. A failed build, a failed install or a failed test
# fails the run; nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${HIGHWATER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/highwater/venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# ziglang: the zig linker from PyPI (a binary inside a registry package),
# which links the extension against glibc 2.28 for the manylinux_2_28 wheel.
if ! "$venv/bin/python" -c 'import maturin, pytest, hypothesis, joblib, dagster, ziglang' 2>/dev/null; then
    echo "installing maturin, ziglang, pytest, hypothesis, joblib and dagster into $venv" >&2
    "$venv/bin/pip" install -q 'maturin>=1.16,<2' 'ziglang==0.17.*' pytest 'hypothesis>=6.100,<7' joblib dagster || {
        echo "maturin, ziglang, pytest, hypothesis, joblib or dagster did not install from PyPI; the Python tests need them" >&2
        exit 1
    }
fi
# Airflow in a venv of its own: its pins and Dagster's need not agree.
airflow_venv="$venv-airflow"
if ! "$airflow_venv/bin/python" -c 'import airflow.sdk' 2>/dev/null; then
    echo "installing apache-airflow into $airflow_venv" >&2
    python3 -m venv "$airflow_venv" && "$airflow_venv/bin/pip" install -q apache-airflow || {
        echo "apache-airflow did not install from PyPI; the Airflow test needs it" >&2
        exit 1
    }
fi
export HIGHWATER_TEST_AIRFLOW_PYTHON="$airflow_venv/bin/python"
start=$(date +%s)
# The wheel a user installs (issue 48): manylinux_2_28, so that `pip
# install` needs no Rust and no C compiler on any x86-64 Linux of 2018 on.
# maturin builds it over the same engine crates the tests compiled (same
# profile, same target folder: only the extension crate is compiled again),
# and only the extension's final link goes through zig targeting glibc 2.28
# (scripts/zig-cc-glibc-2.28); maturin checks the symbols the result needs
# before it tags the wheel. (`maturin build --zig` compiles every crate
# again for an explicit target: over 70 minutes on this CI's two cores.)
# The tests install THAT wheel and run with no cargo on PATH;
# test_the_wheel.py also installs it into a fresh venv. They build the dev
# profile (half the compile time of release on two cores);
# HIGHWATER_PY_RELEASE=1 builds release, as a published wheel is.
if [ -n "${HIGHWATER_PY_RELEASE:-}" ]; then profile=release; else profile=dev; fi
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" HIGHWATER_ZIG_PYTHON="$venv/bin/python" \
    "$venv/bin/maturin" build --quiet --profile "$profile" --compatibility manylinux_2_28 \
    --out "$wheels" -- -C "linker=$PWD/scripts/zig-cc-glibc-2.28" || {
    echo "maturin build --compatibility manylinux_2_28 failed (see above); the Python tests need the wheel built from this checkout" >&2
    exit 1
}
wheel=$(echo "$wheels"/*.whl)
[ -f "$wheel" ] || { echo "maturin built no wheel into $wheels" >&2; exit 1; }
export HIGHWATER_WHEEL="$wheel"
# The same wheel into both venvs: the Airflow test imports highwater from its
# own venv, as an Airflow user's worker does, not from python/ by path (the
# source tree holds no extension).
for v in "$venv" "$airflow_venv"; do
    "$v/bin/pip" install --quiet --no-deps --force-reinstall "$wheel" || {
        echo "installing the wheel built from this checkout into $v failed (see above)" >&2
        exit 1
    }
done
# A stale extension left in python/ by an earlier `maturin develop` would
# shadow nothing (python/ is not on the tests' path), but say which one runs.
"$venv/bin/python" -c 'import highwater._core as c, sys; print("testing", c.__file__, file=sys.stderr)'
echo "python package built (manylinux_2_28) and installed into $venv and $airflow_venv in $(( $(date +%s) - start )) s ($profile)" >&2
# pytest's own closing line is the count; exit 5 (no tests) fails too.
# With no cargo or rustc on PATH: the suite runs what a user without Rust
# has (test_the_wheel.py checks it).
nocargo=$(printf '%s\n' "$PATH" | tr ':' '\n' | while read -r d; do
    if [ -n "$d" ] && [ ! -x "$d/cargo" ] && [ ! -x "$d/rustc" ]; then printf '%s:' "$d"; fi
done)
PATH="${nocargo%:}" "$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests "$@"
