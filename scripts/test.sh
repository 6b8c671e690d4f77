#!/usr/bin/env bash
# The whole test suite, as README.md gives it and as .ci/run calls it.
# Starts nothing that it does not also stop.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked "$@"
