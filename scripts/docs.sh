#!/usr/bin/env bash
# Builds the book under docs/ (issue 51), as scripts/test.sh (and so CI)
# does after the tests. mdBook is not among Debian's packages, so it is
# installed once from crates.io (`cargo install --locked`, a pinned version,
# without its `serve` and `watch` features, which a build does not use) into
# a cache folder, and reused from there. The book's examples, config keys
# and internal links are checked by crates/highwater/tests/docs_book.rs in
# `cargo test`; here mdBook fails on a page missing from SUMMARY.md or an
# include that does not resolve. The HTML lands in docs/book/ (ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
MDBOOK_VERSION=0.4.52
root=${HIGHWATER_MDBOOK_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/highwater/mdbook-$MDBOOK_VERSION}
if [ "$("$root/bin/mdbook" --version 2>/dev/null)" != "mdbook v$MDBOOK_VERSION" ]; then
    echo "installing mdBook $MDBOOK_VERSION from crates.io into $root" >&2
    cargo install mdbook --locked --version "=$MDBOOK_VERSION" \
        --no-default-features --features search --root "$root" || {
        echo "mdBook $MDBOOK_VERSION did not install from crates.io; the book cannot be built" >&2
        exit 1
    }
fi
"$root/bin/mdbook" build docs
