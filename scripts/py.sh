#!/usr/bin/env bash
# The Python package (issue 22), as scripts/test.sh runs it: builds the
# extension from this checkout into the venv scripts/deps.sh made
# (`maturin develop`, the same engine crates as the CLI), installs what its
# tests need (pytest, joblib, dagster; Airflow in a venv of its own), and
# runs python/tests. A failed build, a failed install or a failed test
# fails the run; nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${HIGHWATER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/highwater/venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
if ! "$venv/bin/python" -c 'import maturin, pytest, joblib, dagster' 2>/dev/null; then
    echo "installing maturin, pytest, joblib and dagster into $venv" >&2
    "$venv/bin/pip" install -q 'maturin>=1.16,<2' pytest joblib dagster || {
        echo "maturin, pytest, joblib or dagster did not install from PyPI; the Python tests need them" >&2
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
VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" "$venv/bin/maturin" develop --quiet ${HIGHWATER_PY_RELEASE:+--release}
echo "python extension built into $venv in $(( $(date +%s) - start )) s" >&2
# pytest's own closing line is the count; exit 5 (no tests) fails too.
"$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests "$@"
