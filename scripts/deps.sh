# Sourced by scripts/test.sh (and so by .ci/run): installs, from Debian's
# packages, what the tests need and this machine lacks, so the README's test
# command works on a fresh machine on its own.
# - postgresql: a real server for the ingestion tests (scripts/pg.sh starts
#   a throw-away cluster on loopback);
# - osmium-tool: the reference the OSM store is compared with;
# - gdal-bin: ogrinfo, an independent reader of the MBTiles files.
# Nothing is skipped when a package cannot be installed: the run fails.

deps_install() {
    local need=()
    ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
    command -v osmium >/dev/null 2>&1 || need+=(osmium-tool)
    command -v ogrinfo >/dev/null 2>&1 || need+=(gdal-bin)
    [ ${#need[@]} -eq 0 ] && return 0
    echo "installing what the tests need: ${need[*]}" >&2
    local sudo=()
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null 2>&1 || {
            echo "the tests need ${need[*]}; install them (apt-get install ${need[*]}) or run as root" >&2
            return 1
        }
        sudo=(sudo)
    fi
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${need[@]}" >/dev/null
}
