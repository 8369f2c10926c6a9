#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the PostgreSQL journal's tests, on 127.0.0.1 only.
#
#   .ci/postgres.sh start DIR   initdb a cluster in DIR (created if missing), start it on a free
#                               port of 127.0.0.1, create the database polyloop_test, and print
#                               its DSN on stdout (nothing else goes to stdout):
#                               POLYLOOP_TEST_PG_DSN="$(.ci/postgres.sh start "$DIR")"
#   .ci/postgres.sh stop DIR    stop that cluster (a no-op when it is not running)
#
# When no PostgreSQL server binaries are found, `start` installs Debian's `postgresql` package
# with apt-get (after apt-get update), unless POLYLOOP_PG_NO_INSTALL=1 (then it fails, exit 3).
# PostgreSQL refuses to run as root: as root, the cluster belongs to the `postgres` user and
# every server command runs through runuser. Diagnostics go to stderr; the server log is
# DIR/server.log.
#
# The cluster is for tests only: it runs with fsync=off and full_page_writes=off (the tests
# kill clients, never the server, so every commit they rely on is still there; an OS crash
# could lose it). Never keep data in it.
set -euo pipefail

die() { echo "postgres.sh: $1" >&2; exit "${2:-1}"; }

find_bindir() {
    local d
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(readlink -f "$(command -v initdb)")"
        return 0
    fi
    # Debian keeps the server binaries off PATH, one folder per major version: take the newest.
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
            echo "$d"
            return 0
        fi
    done
    return 1
}

as_owner() {  # run a server command as the cluster's owner, from a folder that user may enter
    if [ "$(id -u)" = 0 ]; then
        (cd / && runuser -u postgres -- "$@")
    else
        (cd / && "$@")
    fi
}

free_port() {
    python3 - <<'EOF'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
EOF
}

start() {
    local dir=$1 bindir port data log
    if ! bindir=$(find_bindir); then
        if [ "${POLYLOOP_PG_NO_INSTALL:-0}" = 1 ]; then
            die "PostgreSQL is not installed (no initdb); .ci/postgres.sh installs it when allowed" 3
        fi
        [ "$(id -u)" = 0 ] || die "PostgreSQL is not installed and installing it needs root"
        echo "postgres.sh: installing PostgreSQL (apt-get)..." >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q >&2
        apt-get install -y -q --no-install-recommends postgresql >&2
        # The package starts a system cluster on port 5432; ours is separate and needs none.
        bindir=$(find_bindir) || die "initdb still not found after installing postgresql"
    fi
    if [ "$(id -u)" = 0 ]; then
        id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql postgres
    fi
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    data="$dir/data"
    log="$dir/server.log"
    if [ "$(id -u)" = 0 ]; then
        chown postgres: "$dir"
        chmod 0755 "$dir"
        # every folder above DIR must be enterable by postgres (mktemp -d makes 0700 ones)
        local up=$dir
        while [ "$up" != / ]; do
            up=$(dirname "$up")
            runuser -u postgres -- test -x "$up" || die "$up is not enterable by postgres"
        done
    fi
    if [ ! -f "$data/PG_VERSION" ]; then
        as_owner "$bindir/initdb" -A trust -U postgres -E UTF8 --no-locale -D "$data" \
            >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
    fi
    local tries=0
    while :; do
        port=$(free_port)
        if as_owner "$bindir/pg_ctl" -D "$data" -l "$log" -w -t 60 \
            -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=200 \
                -c fsync=off -c full_page_writes=off" \
            start >&2; then
            break
        fi
        tries=$((tries + 1))
        [ "$tries" -lt 3 ] || { tail -n 20 "$log" >&2 || true; die "the server did not start"; }
    done
    echo "$port" >"$dir/port"
    as_owner "$bindir/psql" -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres \
        -c "CREATE DATABASE polyloop_test" >&2
    echo "postgresql://postgres@127.0.0.1:$port/polyloop_test"
}

stop() {
    local dir=$1 bindir
    [ -f "$dir/data/postmaster.pid" ] || return 0
    bindir=$(find_bindir) || return 0
    as_owner "$bindir/pg_ctl" -D "$dir/data" -m immediate -w stop >&2 || true
}

case "${1:-}" in
    start) [ $# = 2 ] || die "usage: $0 start DIR"; start "$2" ;;
    stop) [ $# = 2 ] || die "usage: $0 stop DIR"; stop "$2" ;;
    *) die "usage: $0 start DIR | stop DIR" 2 ;;
esac
