# Sourced by scripts/test.sh (and so by .ci/run): installs, from Debian's
# packages, what the tests need and this machine lacks, so the README's test
# command works on a fresh machine on its own.
# - postgresql: a real server for the ingestion tests (scripts/pg.sh starts
#   a throw-away cluster on loopback);
# - osmium-tool: the reference the OSM store is compared with;
# - gdal-bin: ogrinfo, an independent reader of the MBTiles files;
# - chromium: the browser the page and map tests drive (headless, WebGL on
#   SwiftShader);
# - pyosmium, websocket-client and moto[server] (PyPI, in a venv):
#   pyosmium-get-changes, the reference client the HTTP replication is
#   compared with; the DevTools client of the browser tests
#   (tests/browser/cdp.py); and moto, the S3-compatible server the
#   object-storage tests start on loopback (one request at a time, see
#   highwater_objects::testing) and bench/fleet.sh runs as moto_server;
#   deltalake and polars, the independent readers of the Delta tables
#   (tests/ingest_delta.rs, issue 21).
# Nothing is skipped when a package cannot be installed: the run fails.

deps_install() {
    local need=()
    ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
    command -v osmium >/dev/null 2>&1 || need+=(osmium-tool)
    command -v ogrinfo >/dev/null 2>&1 || need+=(gdal-bin)
    command -v chromium >/dev/null 2>&1 || need+=(chromium)
    python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
    deps_apt "${need[@]}" || return 1
    deps_pyosmium
}

# pyosmium and websocket-client in a venv of their own (PyPI wheels; no
# compiler needed).
deps_pyosmium() {
    local venv=${HIGHWATER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/highwater/venv}
    if [ ! -x "$venv/bin/pyosmium-get-changes" ] || [ ! -x "$venv/bin/moto_server" ] || ! "$venv/bin/python" -c 'import websocket, deltalake, polars, pmtiles' 2>/dev/null; then
        echo "installing pyosmium, websocket-client, moto[server], deltalake, polars and pmtiles into $venv" >&2
        python3 -m venv "$venv" && "$venv/bin/pip" install -q osmium websocket-client 'moto[server]==5.2.*' 'deltalake==1.6.*' pyarrow 'polars==2.1.*' 'pmtiles==3.8.*' || {
            echo "pyosmium, websocket-client, moto[server], deltalake, pyarrow or polars did not install from PyPI; the replication, browser, S3 and Delta tests need them" >&2
            return 1
        }
    fi
    export HIGHWATER_PYOSMIUM_GET_CHANGES="$venv/bin/pyosmium-get-changes"
    export HIGHWATER_MOTO_SERVER="$venv/bin/moto_server"
    export HIGHWATER_TEST_PYTHON="$venv/bin/python"
}

deps_apt() {
    [ $# -eq 0 ] && return 0
    local need=("$@")
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
