# Sourced by scripts/test.sh and bench/ingest.sh: starts a throw-away
# PostgreSQL cluster on loopback and exports HIGHWATER_TEST_PG_URL. The
# cluster is stopped and removed when the calling shell exits.
# Needs Debian's postgresql package (.ci/run installs it).

pg_start() {
    local bin
    bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
        echo "PostgreSQL is not installed; the tests need a real server. Install it: apt-get install postgresql" >&2
        return 1
    fi
    PG_BIN=$bin
    PG_DIR=$(mktemp -d /tmp/highwater-pg.XXXXXX)
    local port
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    if [ "$(id -u)" = 0 ]; then
        chown postgres "$PG_DIR"
        PG_AS=(runuser -u postgres --)
    else
        PG_AS=()
    fi
    "${PG_AS[@]}" "$PG_BIN/initdb" -D "$PG_DIR/data" -U postgres --auth=trust -E UTF8 >"$PG_DIR/initdb.log" 2>&1 \
        || { cat "$PG_DIR/initdb.log" >&2; return 1; }
    "${PG_AS[@]}" "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $PG_DIR -c fsync=off -c max_connections=200" start >/dev/null \
        || { cat "$PG_DIR/server.log" >&2; return 1; }
    trap pg_stop EXIT
    export HIGHWATER_TEST_PG_URL="host=127.0.0.1 port=$port user=postgres dbname=postgres"
    export PGHOST=127.0.0.1 PGPORT=$port PGUSER=postgres PGDATABASE=postgres
    echo "PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$port" >&2
}

pg_stop() {
    if [ -n "${PG_DIR:-}" ] && [ -d "$PG_DIR/data" ]; then
        "${PG_AS[@]}" "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate stop >/dev/null 2>&1 || true
        rm -rf "$PG_DIR"
    fi
}
