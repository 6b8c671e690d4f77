#!/bin/sh
# Upper-cases one file. $1 is the input, $2 the (temporary) output path that
# highwater renames into place when this script exits 0.
set -eu
tr 'a-z' 'A-Z' < "$1" > "$2"
