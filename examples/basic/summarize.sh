#!/bin/sh
# Counts the words of all inputs. $1 is the (temporary) output path, the rest
# are the inputs, one argument each, so names with spaces are safe.
set -eu
out="$1"
shift
cat "$@" | wc -w > "$out"
