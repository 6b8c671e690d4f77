#!/usr/bin/env bash
# The whole test suite, as README.md gives it and as .ci/run calls it.
# Installs what is missing (scripts/deps.sh), starts a throw-away PostgreSQL
# cluster on loopback for the tests that need a real server, and stops it
# afterwards. Without PostgreSQL it fails: no test skips silently.
set -euo pipefail
cd "$(dirname "$0")/.."
# A one-shot build gains nothing from incremental artefacts, which cost GBs.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# shellcheck source=scripts/deps.sh
. scripts/deps.sh
deps_install
# shellcheck source=scripts/pg.sh
. scripts/pg.sh
pg_start
cargo test --workspace --locked "$@"
# The book (docs/), whose examples the tests above ran (issue 51).
bash scripts/docs.sh
# The Python package and its tests, built from this checkout (issue 22).
bash scripts/py.sh
