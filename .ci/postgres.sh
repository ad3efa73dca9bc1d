#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the SQL buffer's PostgreSQL tests (CI and local use).
#
#   eval "$(.ci/postgres.sh start)"   # prints the exports below; the cluster runs in the background
#   pytest trinity-core/tests/buffer  # the PostgreSQL variants run instead of skipping
#   .ci/postgres.sh stop              # stops it and deletes its directory
#
# `start` makes a cluster in a new temporary directory (initdb, trust authentication, fsync off:
# nothing in it outlives the tests), listening on 127.0.0.1 on a free port, and prints
#   export TRINITY_TEST_POSTGRES_URL=postgresql+psycopg://postgres@127.0.0.1:PORT/postgres
#   export TRINITY_POSTGRES_DIR=DIR
# `stop [DIR]` (default $TRINITY_POSTGRES_DIR) stops the server and removes DIR.
# Run as root (CI), the cluster belongs to the `postgres` user (initdb refuses root); run as
# anyone else, to that user. Needs PostgreSQL's server programs: Debian's `postgresql` package
# (found under /usr/lib/postgresql/<version>/bin) or initdb and pg_ctl on PATH.
set -euo pipefail

die() {
    echo "postgres.sh: $*" >&2
    exit 1
}

bindir() {
    local newest
    newest=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    if [[ -n "$newest" && -x "$newest/initdb" ]]; then
        echo "$newest"
    elif command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then
        dirname "$(command -v initdb)"
    else
        die "no PostgreSQL server programs (initdb, pg_ctl); on Debian: apt-get install postgresql"
    fi
}

# Run a command as the cluster's owner: `postgres` when we are root, else ourselves.
as_owner() {
    if [[ $(id -u) -eq 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
    local bin dir port
    bin=$(bindir)
    if [[ $(id -u) -eq 0 ]] && ! id postgres >/dev/null 2>&1; then
        die "running as root but there is no 'postgres' user to own the cluster"
    fi
    # As root, under /tmp: the `postgres` user must be able to reach the directory.
    local base=${TMPDIR:-/tmp}
    [[ $(id -u) -eq 0 ]] && base=/tmp
    dir=$(mktemp -d "$base/trinity-pg.XXXXXX")
    [[ $(id -u) -eq 0 ]] && chown postgres: "$dir"
    as_owner "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C --no-sync \
        >"$dir/initdb.log" 2>&1 || {
        cat "$dir/initdb.log" >&2
        die "initdb failed"
    }
    # A port another process takes between free_port and the server's bind fails the start:
    # try a few ports.
    local try
    for try in 1 2 3; do
        port=$(free_port)
        if as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start \
            -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c full_page_writes=off \
                -c max_connections=200" >/dev/null; then
            echo "export TRINITY_TEST_POSTGRES_URL=postgresql+psycopg://postgres@127.0.0.1:$port/postgres"
            echo "export TRINITY_POSTGRES_DIR=$dir"
            return
        fi
    done
    cat "$dir/server.log" >&2
    rm -rf "$dir"
    die "the server did not start (log above)"
}

stop() {
    local dir=${1:-${TRINITY_POSTGRES_DIR:-}}
    [[ -n "$dir" ]] || die "stop: which cluster? pass its directory or set TRINITY_POSTGRES_DIR"
    [[ -f "$dir/data/PG_VERSION" ]] || die "stop: $dir holds no cluster made by postgres.sh start"
    if [[ -f "$dir/data/postmaster.pid" ]]; then
        # immediate: the data is thrown away next, so nothing needs a clean shutdown checkpoint.
        as_owner "$(bindir)/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null || true
    fi
    rm -rf "$dir"
}

case "${1:-}" in
start) start ;;
stop) stop "${2:-}" ;;
*) die "usage: $0 start | stop [DIR]" ;;
esac
