# shellcheck shell=bash
# scripts/stack.d/pg-pair.sh, sourced by scripts/stack: `scripts/stack pg-pair …`. Needs
# common.sh and postgres.sh (pg_version, PG_ROLE, PG_PASSWORD, PG_READY_SECONDS).

# ---------------------------------------------------------------------------------------------
# A streaming pair for the failover tests: two more clusters of Debian's PostgreSQL binaries,
# a primary (node a, localhost:PG_PAIR_PORT) and its streaming standby (node b, PG_PAIR_PORT+1),
# data and logs in $PG_PAIR_DIR. They are plain pg_ctl clusters, not Debian's registered ones:
# the shared cluster on 5432 (pg_ctlcluster main) is never touched. Disposable: `down` removes them.
# The clusters run as the postgres user, which must reach their directory: a clone under a
# private directory (root's home is 0700 on Debian) is out of its reach, so the pair lives
# under /var/tmp, one directory per stack state directory (PG_PAIR_DIR names another).

PG_PAIR_PORT=${PG_PAIR_PORT:-5442}
PG_PAIR_DIR=${PG_PAIR_DIR:-/var/tmp/pagamentos-pg-pair/$(printf '%s' "$STATE" | sha256sum | cut -c1-16)}

pair_bin() { echo "/usr/lib/postgresql/$(pg_version)/bin"; }
pair_port() { if [ "$1" = a ]; then echo "$PG_PAIR_PORT"; else echo $((PG_PAIR_PORT + 1)); fi; }
# from /: the postgres user may not be able to enter the caller's working directory (a clone under a
# private directory), which initdb and psql complain about
pair_pg() { (cd / && runuser -u postgres -- "$(pair_bin)/$1" "${@:2}"); }
pair_running() { [ -f "$PG_PAIR_DIR/$1/postmaster.pid" ] && pair_pg pg_ctl -D "$PG_PAIR_DIR/$1" status >/dev/null 2>&1; }
pair_psql() {
  local node=$1
  shift
  (cd / && runuser -u postgres -- psql -h "$PG_PAIR_DIR/run" -p "$(pair_port "$node")" -v ON_ERROR_STOP=1 -qAt "$@")
}

# this node's own settings, kept apart from what pg_basebackup copies from the primary
pair_node_conf() {
  echo "port = $(pair_port "$1")" > "$PG_PAIR_DIR/$1/node.conf"
  chown postgres:postgres "$PG_PAIR_DIR/$1/node.conf"
}

pair_start() {
  local node=$1 deadline=$((SECONDS + PG_READY_SECONDS))
  pair_running "$node" && return 0
  log "starting pair node $node on localhost:$(pair_port "$node")"
  pair_pg pg_ctl -D "$PG_PAIR_DIR/$node" -l "$PG_PAIR_DIR/$node.log" -w -t "$PG_READY_SECONDS" start >/dev/null \
    || { tail -n 40 "$PG_PAIR_DIR/$node.log" >&2 || true; die "pair node $node did not start (log above)"; }
  until pg_isready -q -h localhost -p "$(pair_port "$node")"; do
    [ "$SECONDS" -lt "$deadline" ] || die "pair node $node not ready after ${PG_READY_SECONDS}s ($PG_PAIR_DIR/$node.log)"
    sleep 0.3
  done
}

pg_pair_up() {
  [ -n "$(pg_version)" ] || die "PostgreSQL server not installed"
  mkdir -p "$PG_PAIR_DIR/run"
  chmod 755 "$(dirname "$PG_PAIR_DIR")"
  chown postgres:postgres "$PG_PAIR_DIR" "$PG_PAIR_DIR/run"
  if [ ! -f "$PG_PAIR_DIR/a/PG_VERSION" ]; then
    log "creating pair node a (primary) in $PG_PAIR_DIR/a"
    rm -rf "$PG_PAIR_DIR/a"
    pair_pg initdb -D "$PG_PAIR_DIR/a" --auth-local=peer --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
    {
      echo "# written by pagamentos scripts/stack (pg-pair)"
      echo "listen_addresses = 'localhost'"
      echo "unix_socket_directories = '$PG_PAIR_DIR/run'"
      echo "max_connections = 200"
      echo "shared_buffers = 128MB"
      echo "wal_level = replica"
      echo "max_wal_senders = 5"
      echo "wal_keep_size = 256MB"
      echo "hot_standby = on"
      echo "fsync = on"
      echo "synchronous_commit = on"
      echo "include_if_exists = 'node.conf'"
    } >> "$PG_PAIR_DIR/a/postgresql.conf"
    pair_node_conf a
    pair_start a
    pair_psql a -c "CREATE ROLE $PG_ROLE LOGIN CREATEDB PASSWORD '$PG_PASSWORD'" >/dev/null
    # the group roles the services' migrations grant to (as `pg_runtime_role` makes them on the
    # shared cluster): an owner without CREATEROLE cannot create them, and the migration stops
    local group
    for group in ledger_runtime transferencias_runtime; do
      pair_psql a -c "CREATE ROLE $group NOLOGIN" >/dev/null
    done
  fi
  if pair_running b && [ "$(pair_psql b -c "SELECT pg_is_in_recovery()" 2>/dev/null)" = f ]; then
    die "the pair was failed over (node b is the primary): scripts/stack pg-pair down, then up, for a new pair"
  fi
  pair_start a
  if [ ! -f "$PG_PAIR_DIR/b/PG_VERSION" ]; then
    log "creating pair node b (streaming standby of a) with pg_basebackup"
    rm -rf "$PG_PAIR_DIR/b"
    pair_pg pg_basebackup -D "$PG_PAIR_DIR/b" -h "$PG_PAIR_DIR/run" -p "$(pair_port a)" -U postgres \
      -X stream -R -c fast >/dev/null || die "pg_basebackup from pair node a failed"
    pair_node_conf b
  fi
  pair_start b
  local deadline=$((SECONDS + PG_READY_SECONDS))
  until [ "$(pair_psql a -c "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'" 2>/dev/null)" = 1 ]; do
    [ "$SECONDS" -lt "$deadline" ] || die "pair node b is not streaming from a after ${PG_READY_SECONDS}s ($PG_PAIR_DIR/b.log)"
    sleep 0.3
  done
  # synchronous replication, as a money system runs it: a commit returns once the standby has
  # it, so a failover loses no acknowledged transaction (set after b streams: a commit on a
  # alone would wait for it; b, made before this, keeps none once promoted)
  pair_psql a -c "ALTER SYSTEM SET synchronous_standby_names = '*'" >/dev/null
  pair_psql a -c "SELECT pg_reload_conf()" >/dev/null
  log "PostgreSQL pair ready: primary localhost:$(pair_port a), streaming standby localhost:$(pair_port b) (role $PG_ROLE)"
}

# the postmaster of node $1 and every process it forked (backends, WAL sender/receiver, …)
pg_pair_pids() {
  local node=${1:-a} pid
  [ -f "$PG_PAIR_DIR/$node/postmaster.pid" ] || die "pair node $node is not running"
  pid=$(head -n 1 "$PG_PAIR_DIR/$node/postmaster.pid")
  kill -0 "$pid" 2>/dev/null || die "pair node $node is not running (stale postmaster.pid)"
  echo "$pid"
  ps -o pid= --ppid "$pid" | tr -d ' '
}

pg_pair_status() {
  local node rc=0 role
  for node in a b; do
    if pair_running "$node" && pg_isready -q -h localhost -p "$(pair_port "$node")"; then
      role=$(pair_psql "$node" -c "SELECT CASE WHEN pg_is_in_recovery() THEN 'standby' ELSE 'primary' END" 2>/dev/null || echo '?')
      echo "pg-pair node $node: up (localhost:$(pair_port "$node"), $role)"
    else
      echo "pg-pair node $node: down"
      rc=1
    fi
  done
  return $rc
}

pg_pair_down() {
  local node
  for node in a b; do
    if [ -f "$PG_PAIR_DIR/$node/postmaster.pid" ]; then
      # a node paused with SIGSTOP would never stop: let it run first
      pg_pair_pids "$node" 2>/dev/null | xargs -r kill -CONT 2>/dev/null || true
      pair_pg pg_ctl -D "$PG_PAIR_DIR/$node" stop -m immediate -w >/dev/null 2>&1 || true
    fi
  done
  rm -rf "$PG_PAIR_DIR"
  log "PostgreSQL pair stopped and removed"
}

