#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the tests: installs Debian's postgresql when its binaries are
# missing, initialises a cluster in a temporary directory, starts it on 127.0.0.1 and a port of
# its own (5433 unless AUTOPUSH_TEST_POSTGRES_PORT says otherwise), with a user and a database
# `autopush` (password `autopush`). Prints the DSN as its last line:
#   AUTOPUSH_TEST_POSTGRES_DSN=postgres://autopush:autopush@127.0.0.1:5433/autopush
# `eval "$(.ci/postgres.sh)"` exports it. Running it again while that cluster runs just prints it.
# `.ci/postgres.sh stop` stops the cluster. Root runs the server as the `postgres` user.
#
# Replication, for the failover lane: with AUTOPUSH_TEST_POSTGRES_PRIMARY_PORT set, a new cluster
# is a streaming-replication standby of the cluster on that port (a `pg_basebackup` of it, named
# `standby` to it; the test makes replication synchronous once it streams). `kill` stops a cluster
# the way a crash does (`pg_ctl stop -m immediate`), `promote` makes a standby the primary.
set -euo pipefail
port=${AUTOPUSH_TEST_POSTGRES_PORT:-5433}
primary_port=${AUTOPUSH_TEST_POSTGRES_PRIMARY_PORT:-}
# Under /tmp, not $TMPDIR: the server runs as another user, which must reach it.
dir=${AUTOPUSH_TEST_POSTGRES_DIR:-/tmp/autopush-postgres-$port}
dsn="postgres://autopush:autopush@127.0.0.1:$port/autopush"

bindir() {
  local pg_ctl
  pg_ctl=$(ls -d /usr/lib/postgresql/*/bin/pg_ctl 2>/dev/null | sort -V | tail -1 || true)
  [ -n "$pg_ctl" ] && dirname "$pg_ctl"
}

# The lock's descriptor (9) is closed for the commands run: a server started with it open would
# hold the lock for as long as it runs.
as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@" 9>&-; else "$@" 9>&-; fi
}

bin=$(bindir || true)
# One caller at a time sets the cluster up (test files start it in parallel).
exec 9>"$dir.lock"
flock 9
case "${1:-}" in
  stop) [ -n "$bin" ] && [ -f "$dir/postmaster.pid" ] && as_owner "$bin/pg_ctl" -D "$dir" -m fast stop >&2; exit 0 ;;
  kill) as_owner "$bin/pg_ctl" -D "$dir" -m immediate stop >&2; exit 0 ;;
  promote) as_owner "$bin/pg_ctl" -D "$dir" -w -t 60 promote >&2; exit 0 ;;
esac

if [ -z "$bin" ]; then
  if [ "$(id -u)" != 0 ]; then echo "postgresql is not installed (apt-get install postgresql, as root)" >&2; exit 1; fi
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  bin=$(bindir)
fi

if ! [ -f "$dir/PG_VERSION" ] && [ -n "$primary_port" ]; then
  mkdir -p "$dir"
  [ "$(id -u)" = 0 ] && chown postgres: "$dir"
  chmod 700 "$dir"
  as_owner env PGPASSWORD=autopush "$bin/pg_basebackup" -h 127.0.0.1 -p "$primary_port" -U autopush -D "$dir" -X stream -c fast >&2
  as_owner touch "$dir/standby.signal"
  echo "primary_conninfo = 'host=127.0.0.1 port=$primary_port user=autopush password=autopush application_name=standby'" |
    as_owner tee -a "$dir/postgresql.auto.conf" >/dev/null
fi

if ! [ -f "$dir/PG_VERSION" ]; then
  mkdir -p "$dir"
  [ "$(id -u)" = 0 ] && chown postgres: "$dir"
  chmod 700 "$dir"
  pwfile=$(mktemp -p /tmp)
  echo autopush >"$pwfile"
  [ "$(id -u)" = 0 ] && chown postgres: "$pwfile"
  as_owner "$bin/initdb" -D "$dir" -U autopush --pwfile="$pwfile" -A scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
  rm -f "$pwfile"
fi

if ! as_owner "$bin/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
  as_owner "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir -c max_connections=200 -c fsync=off" start >&2
  if ! PGPASSWORD=autopush "$bin/psql" -h 127.0.0.1 -p "$port" -U autopush -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'autopush'" | grep -q 1; then
    PGPASSWORD=autopush "$bin/psql" -h 127.0.0.1 -p "$port" -U autopush -d postgres -qc "CREATE DATABASE autopush" >&2
  fi
fi
echo "AUTOPUSH_TEST_POSTGRES_DSN=$dsn"
