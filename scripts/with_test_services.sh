#!/usr/bin/env bash
# Run a command (the test suite) with a PostgreSQL and a Redis it can use:
#   scripts/with_test_services.sh COMMAND [ARG...]
#
# DATABASE_URL and REDIS_URL, when set, are used as they are. Each one that is not set gets a
# throwaway server of its own: a PostgreSQL cluster made with initdb in a temporary directory and
# a redis-server that keeps nothing on disk, both on free loopback ports, stopped (and their
# files removed) when the command ends. Their binaries are Debian's packages `postgresql` and
# `redis-server`: as root on Debian they are installed here (as `make test` installs chromium);
# elsewhere this says the one command to run and stops.
set -euo pipefail

log() { printf '[test-services] %s\n' "$*" >&2; }
die() { printf '[test-services] %s\n' "$*" >&2; exit 1; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

install_debian() {  # install_debian PACKAGE... (root on Debian only)
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing Debian's $* for the tests"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    die "the tests need $*: run 'sudo apt-get install $*' (or set DATABASE_URL / REDIS_URL), then make test again"
  fi
}

pg_bin() {  # the directory of initdb and pg_ctl, or nothing
  local dir
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && { echo "$dir"; return; }
  done
  if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
    dirname "$(command -v initdb)"
  fi
}

workdir=$(mktemp -d /tmp/switchyard-test-services.XXXXXX)
chmod 755 "$workdir"
pg_started="" redis_pid=""
as_pg=()

cleanup() {
  if [ -n "$pg_started" ]; then
    "${as_pg[@]}" "$PG_BIN/pg_ctl" -D "$workdir/pg" -m immediate stop >/dev/null 2>&1 || true
  fi
  if [ -n "$redis_pid" ]; then
    kill "$redis_pid" 2>/dev/null || true
    wait "$redis_pid" 2>/dev/null || true
  fi
  rm -rf "$workdir"
}
trap cleanup EXIT INT TERM

if [ -z "${DATABASE_URL:-}" ]; then
  PG_BIN=$(pg_bin)
  if [ -z "$PG_BIN" ]; then
    install_debian postgresql
    PG_BIN=$(pg_bin)
    [ -n "$PG_BIN" ] || die "initdb not found after installing postgresql"
  fi
  # initdb refuses to run as root: the cluster belongs to the postgres user then.
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql postgres
    as_pg=(runuser -u postgres --)
    chown postgres "$workdir"
  fi
  port=$(free_port)
  "${as_pg[@]}" "$PG_BIN/initdb" -D "$workdir/pg" -U postgres --auth=trust --encoding=UTF8 --no-sync >"$workdir/initdb.log" 2>&1 ||
    { cat "$workdir/initdb.log" >&2; die "initdb failed"; }
  # fsync off: a throwaway cluster needs no durability, and the suite creates many databases.
  "${as_pg[@]}" "$PG_BIN/pg_ctl" -D "$workdir/pg" -l "$workdir/pg.log" -w -t 60 \
    -o "-p $port -c listen_addresses=127.0.0.1 -k $workdir/pg -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" \
    start >/dev/null || { cat "$workdir/pg.log" >&2; die "PostgreSQL did not start"; }
  pg_started=1
  export DATABASE_URL="postgres://postgres@127.0.0.1:$port/switchyard"
  "$PG_BIN/createdb" -h 127.0.0.1 -p "$port" -U postgres switchyard
  log "started a throwaway PostgreSQL: $DATABASE_URL"
fi

if [ -z "${REDIS_URL:-}" ]; then
  command -v redis-server >/dev/null 2>&1 || install_debian redis-server
  port=$(free_port)
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$workdir" \
    --logfile "$workdir/redis.log" &
  redis_pid=$!
  for _ in $(seq 1 100); do
    redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break
    sleep 0.1
  done
  redis-cli -p "$port" ping 2>/dev/null | grep -q PONG || { cat "$workdir/redis.log" >&2; die "Redis did not start"; }
  export REDIS_URL="redis://127.0.0.1:$port/0"
  log "started a throwaway Redis: $REDIS_URL"
fi

"$@"
