#!/usr/bin/env bash
# Throwaway PostgreSQL 15 and Redis for tests and development, under one folder.
#
#   scripts/services.sh start DIR   start both on free loopback ports; writes DIR/env
#   scripts/services.sh stop DIR    stop both (safe to repeat, or after a failed start)
#   scripts/services.sh pg-stop DIR / pg-start DIR
#   scripts/services.sh redis-stop DIR / redis-start DIR
#                                   stop one alone / start it again on its port (fault
#                                   tests: a restart under a live API; Redis comes back
#                                   empty, as it keeps nothing on disk)
#
# DIR/env holds `export RLAAS_TEST_DATABASE_URL=...` and `export RLAAS_TEST_REDIS_URL=...`.
# PostgreSQL refuses to run as root, so as root it runs as the `postgres` OS user
# (DIR and its parents must be reachable by that user: a folder under /tmp is).
# The cluster trusts connections on 127.0.0.1 only; it holds nothing worth a password.
set -euo pipefail

PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
PG_USER=rlaas
PG_DB=rlaas

usage() {
  echo "usage: $0 start|stop DIR" >&2
  exit 2
}

[ $# -eq 2 ] || usage
cmd=$1
dir=$2

as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start_postgres() {
  local pg=$dir/pg
  mkdir -p "$pg"
  if [ "$(id -u)" = 0 ]; then
    chown postgres: "$pg"
    if ! runuser -u postgres -- test -w "$pg"; then
      echo "services: $pg is not reachable by the postgres user; use a folder under /tmp" >&2
      return 1
    fi
  fi
  if [ ! -f "$pg/data/PG_VERSION" ]; then
    as_pg "$PG_BIN/initdb" -D "$pg/data" -U "$PG_USER" --auth=trust -E UTF8 --locale=C.UTF-8 \
      >"$pg/initdb.log" 2>&1 || { cat "$pg/initdb.log" >&2; return 1; }
  fi
  # A port found free can be taken before the server binds it: try a few.
  local port attempt
  for attempt in 1 2 3 4 5; do
    port=$(free_port)
    if as_pg "$PG_BIN/pg_ctl" -D "$pg/data" -l "$pg/server.log" -w -t 60 \
      -o "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c listen_addresses=127.0.0.1 -k $pg -p $port" \
      start >/dev/null; then
      break
    fi
    port=""
    echo "services: postgres did not start on attempt $attempt; retrying" >&2
  done
  if [ -z "$port" ]; then
    tail -n 20 "$pg/server.log" >&2 || true
    return 1
  fi
  as_pg "$PG_BIN/createdb" -h 127.0.0.1 -p "$port" -U "$PG_USER" -O "$PG_USER" "$PG_DB"
  echo "$port" >"$pg/port"
  PG_PORT=$port
}

restart_postgres() {
  local pg=$dir/pg
  as_pg "$PG_BIN/pg_ctl" -D "$pg/data" -l "$pg/server.log" -w -t 60 \
    -o "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c listen_addresses=127.0.0.1 -k $pg -p $(cat "$pg/port")" \
    start >/dev/null
}

start_redis() {
  local port attempt
  for attempt in 1 2 3 4 5; do
    port=${1:-$(free_port)}
    rm -f "$dir/redis.pid"
    redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no --daemonize yes \
      --dir "$dir" --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" >/dev/null
    local i
    for i in $(seq 50); do
      if redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; then
        REDIS_PORT=$port
        echo "$port" >"$dir/redis.port"
        return 0
      fi
      sleep 0.1
    done
    stop_redis
    echo "services: redis did not start on attempt $attempt; retrying" >&2
  done
  tail -n 20 "$dir/redis.log" >&2 || true
  return 1
}

stop_postgres() {
  local data=$dir/pg/data
  if [ -f "$data/postmaster.pid" ]; then
    as_pg "$PG_BIN/pg_ctl" -D "$data" -m fast -w -t 60 stop >/dev/null || true
  fi
}

stop_redis() {
  local pidfile=$dir/redis.pid pid i
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
    for i in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
  fi
  rm -f "$pidfile"
}

case $cmd in
  start)
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    # mktemp -d makes 0700 folders; the postgres user must be able to enter it.
    chmod 755 "$dir"
    trap 'echo "services: start failed; stopping what started" >&2; stop_redis; stop_postgres' ERR
    start_postgres
    start_redis
    trap - ERR
    {
      echo "export RLAAS_TEST_DATABASE_URL=postgresql+psycopg://$PG_USER@127.0.0.1:$PG_PORT/$PG_DB"
      echo "export RLAAS_TEST_REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0"
    } >"$dir/env"
    cat "$dir/env"
    ;;
  stop)
    [ -d "$dir" ] || exit 0
    dir=$(cd "$dir" && pwd)
    stop_redis
    stop_postgres
    rm -f "$dir/env"
    ;;
  pg-stop)
    dir=$(cd "$dir" && pwd)
    stop_postgres
    ;;
  pg-start)
    dir=$(cd "$dir" && pwd)
    restart_postgres
    ;;
  redis-stop)
    dir=$(cd "$dir" && pwd)
    stop_redis
    ;;
  redis-start)
    dir=$(cd "$dir" && pwd)
    start_redis "$(cat "$dir/redis.port")"
    ;;
  *)
    usage
    ;;
esac
