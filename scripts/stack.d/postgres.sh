# shellcheck shell=bash
# scripts/stack.d/postgres.sh, sourced by scripts/stack: the shared PostgreSQL (`up`, `down`,
# `status`, `restart` with or without `postgres`). Needs common.sh.

PG_PORT=5432
# `pagamentos` (LOGIN, CREATEDB) is the tests' and the benchmark's role: they create and drop
# databases of their own. Each service database is owned by a role of the same name and
# password that can connect to nothing else of ours (issue #9: least privilege); the services
# run as its runtime role (below).
PG_ROLE=pagamentos
PG_PASSWORD=pagamentos
PG_DATABASES=(transferencias ledger)
# Databases whose service runs as a runtime role rather than as the owner (issue #25): the
# group role <db>_runtime (NOLOGIN) gets its privileges from the service's migrations; the
# login role <db>_app (password = name) is a member of it. Neither changes the schema; the
# ledger's may insert and read the books but not rewrite them, the transfers' removes no transfer.
PG_RUNTIME_DATABASES=(transferencias ledger)
PG_READY_SECONDS=${PG_READY_SECONDS:-60}

# ---------------------------------------------------------------------------------------------
# PostgreSQL (Debian's cluster, managed with pg_ctlcluster)

# shellcheck disable=SC2012 # the entries are Debian's PostgreSQL versions (15, 16, …): plain names
pg_version() { ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n 1; }

pg_is_ready() { pg_isready -q -h localhost -p "$PG_PORT" 2>/dev/null; }

pg_psql() { runuser -u postgres -- psql -p "$PG_PORT" -v ON_ERROR_STOP=1 -qAt "$@"; }

pg_configure() {
  local ver conf_dir conf new
  ver=$(pg_version)
  conf_dir=/etc/postgresql/$ver/main/conf.d
  mkdir -p "$conf_dir"
  conf=$conf_dir/pagamentos.conf
  # fsync and synchronous_commit stay on: this is a money system and benchmarks must measure
  # real durability. Sizes are for a 2-core, 24 GiB machine shared with Kafka and the services.
  # random_page_cost = 1.1 (SSD, data in memory; PostgreSQL's default 4 assumes spinning
  # disks): with 4, the relay's `UPDATE outbox_evento … WHERE id = ANY($1)` over a few hundred
  # ids scanned the whole table while it was young (~300 full scans in a 15 s flat-out load on
  # fresh databases, seen with auto_explain); with 1.1 it uses the primary key.
  new=$(cat <<EOF
# written by pagamentos scripts/stack
listen_addresses = 'localhost'
port = $PG_PORT
max_connections = 400
shared_buffers = 512MB
effective_cache_size = 4GB
random_page_cost = 1.1
work_mem = 8MB
maintenance_work_mem = 128MB
wal_buffers = 16MB
max_wal_size = 2GB
checkpoint_completion_target = 0.9
fsync = on
synchronous_commit = on
full_page_writes = on
log_min_duration_statement = 1000
EOF
)
  if [ ! -f "$conf" ] || [ "$(cat "$conf")" != "$new" ]; then
    printf '%s\n' "$new" > "$conf"
    PG_CONF_CHANGED=yes
  fi
}

# TLS (issue #25): PostgreSQL serves TLS with a server certificate for localhost and 127.0.0.1
# signed by a CA of the stack's own, so clients can use sslmode=verify-full with
# sslrootcert=$PG_TLS_CA_DIR/ca.crt. `ssl = on` only offers TLS: pg_hba.conf is not touched, so
# plain connections (the default URLs) keep working. The CA lives in the cache directory, not in
# .stack: the cluster is the machine's (Debian's 15/main), shared by every checkout, and every
# checkout must trust the same CA. The server's copy of its certificate and key lives with the
# cluster's configuration, where the postgres user can read it (owned by postgres, key 0600).
# Generated once and reused; a missing or expiring CA or certificate, or a certificate the CA
# did not sign, is made again. Applied by a configuration reload: no connection is dropped.
PG_TLS_CA_DIR=$CACHE/postgres-tls
PG_TLS_DAYS_LEFT_MIN=30

pg_tls_dir() { echo "/etc/postgresql/$(pg_version)/main/pagamentos-tls"; }

# a certificate that exists and is valid for PG_TLS_DAYS_LEFT_MIN more days
pg_tls_fresh() { [ -s "$1" ] && openssl x509 -in "$1" -noout -checkend $((PG_TLS_DAYS_LEFT_MIN * 86400)) >/dev/null 2>&1; }

pg_tls() {
  command -v openssl >/dev/null || die "openssl not found (apt-get install openssl)"
  local dir conf new tmp
  dir=$(pg_tls_dir)
  mkdir -p "$PG_TLS_CA_DIR"
  if ! pg_tls_fresh "$PG_TLS_CA_DIR/ca.crt" || [ ! -s "$PG_TLS_CA_DIR/ca.key" ]; then
    log "generating the stack's PostgreSQL CA in $PG_TLS_CA_DIR"
    tmp=$(mktemp -d)
    (umask 077 && openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -days 3650 -subj "/CN=pagamentos stack PostgreSQL CA" \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
      -keyout "$tmp/ca.key" -out "$tmp/ca.crt" 2>"$tmp/err") \
      || { cat "$tmp/err" >&2; rm -rf "$tmp"; die "openssl could not make the PostgreSQL CA"; }
    chmod 600 "$tmp/ca.key"
    chmod 644 "$tmp/ca.crt"
    mv -f "$tmp/ca.key" "$PG_TLS_CA_DIR/ca.key"
    mv -f "$tmp/ca.crt" "$PG_TLS_CA_DIR/ca.crt"
    rm -rf "$tmp"
  fi
  mkdir -p "$dir"
  chown postgres:postgres "$dir"
  chmod 750 "$dir"
  if ! pg_tls_fresh "$dir/server.crt" || [ ! -s "$dir/server.key" ] ||
     ! openssl verify -CAfile "$PG_TLS_CA_DIR/ca.crt" "$dir/server.crt" >/dev/null 2>&1; then
    log "generating PostgreSQL's server certificate (localhost, 127.0.0.1, ::1) in $dir"
    tmp=$(mktemp -d)
    (umask 077 &&
      openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=localhost" \
        -keyout "$tmp/server.key" -out "$tmp/server.csr" &&
      printf '%s\n' 'subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1' \
        'basicConstraints=critical,CA:FALSE' 'keyUsage=critical,digitalSignature' \
        'extendedKeyUsage=serverAuth' > "$tmp/ext" &&
      openssl x509 -req -in "$tmp/server.csr" -CA "$PG_TLS_CA_DIR/ca.crt" -CAkey "$PG_TLS_CA_DIR/ca.key" \
        -set_serial "0x$(openssl rand -hex 16)" -days 825 -extfile "$tmp/ext" -out "$tmp/server.crt") \
      >"$tmp/err" 2>&1 || { cat "$tmp/err" >&2; rm -rf "$tmp"; die "openssl could not make PostgreSQL's server certificate"; }
    chown postgres:postgres "$tmp/server.key" "$tmp/server.crt"
    chmod 600 "$tmp/server.key"
    chmod 644 "$tmp/server.crt"
    # key first: a reload between the two moves finds a mismatched pair, refuses it and keeps
    # the previous one; the reload below then loads the new pair
    mv -f "$tmp/server.key" "$dir/server.key"
    mv -f "$tmp/server.crt" "$dir/server.crt"
    rm -rf "$tmp"
    PG_TLS_CHANGED=yes
  fi
  conf=/etc/postgresql/$(pg_version)/main/conf.d/pagamentos-tls.conf
  new=$(cat <<EOF
# written by pagamentos scripts/stack (pg_tls): TLS offered, not required (pg_hba.conf decides)
ssl = on
ssl_cert_file = '$dir/server.crt'
ssl_key_file = '$dir/server.key'
ssl_min_protocol_version = 'TLSv1.2'
EOF
)
  if [ ! -f "$conf" ] || [ "$(cat "$conf")" != "$new" ]; then
    printf '%s\n' "$new" > "$conf"
    PG_TLS_CHANGED=yes
  fi
}

pg_up() {
  [ -n "$(pg_version)" ] || die "PostgreSQL server not installed"
  local ver
  ver=$(pg_version)
  if ! pg_lsclusters -h 2>/dev/null | awk '{print $1" "$2}' | grep -qx "$ver main"; then
    log "creating PostgreSQL $ver cluster 'main'"
    pg_createcluster "$ver" main >/dev/null
  fi
  PG_CONF_CHANGED=
  PG_TLS_CHANGED=
  pg_configure
  pg_tls
  local status
  status=$(pg_lsclusters -h | awk -v v="$ver" '$1==v && $2=="main" {print $4}')
  if [ "$status" = online ] && [ -n "$PG_CONF_CHANGED" ]; then
    log "PostgreSQL configuration changed: restarting"
    pg_ctlcluster "$ver" main restart
  elif [ "$status" = online ] && [ -n "$PG_TLS_CHANGED" ]; then
    # the ssl settings take effect on a reload, which drops no connection
    log "PostgreSQL TLS configuration changed: reloading"
    pg_ctlcluster "$ver" main reload
  elif [ "$status" != online ]; then
    # a crashed cluster leaves postmaster.pid behind; pg_ctl copes with a stale one
    log "starting PostgreSQL $ver"
    pg_ctlcluster "$ver" main start || {
      tail -n 40 "/var/log/postgresql/postgresql-$ver-main.log" >&2 || true
      die "PostgreSQL did not start (log above)"
    }
  fi
  local deadline=$((SECONDS + PG_READY_SECONDS))
  until pg_is_ready; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 40 "/var/log/postgresql/postgresql-$ver-main.log" >&2 || true
      die "PostgreSQL not ready on localhost:$PG_PORT after ${PG_READY_SECONDS}s (log above)"
    fi
    sleep 0.3
  done
  pg_psql <<EOF
DO \$\$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_ROLE') THEN
    CREATE ROLE $PG_ROLE LOGIN CREATEDB PASSWORD '$PG_PASSWORD';
  END IF;
END
\$\$;
EOF
  local db
  for db in "${PG_DATABASES[@]}"; do
    pg_service_database "$db"
  done
  for db in "${PG_RUNTIME_DATABASES[@]}"; do
    pg_runtime_role "$db"
  done
  log "PostgreSQL $ver ready on localhost:$PG_PORT (databases ${PG_DATABASES[*]}, each owned by" \
    "the role of its name, run as ${PG_RUNTIME_DATABASES[*]/%/_app}; role $PG_ROLE for tests; TLS: sslmode=verify-full&sslrootcert=$PG_TLS_CA_DIR/ca.crt)"
}

# The service database $1, owned by the role $1 (password $1) which may connect only to it.
# Idempotent; it also hands over a database and its objects created by an older stack under
# the shared role (object by object: REASSIGN OWNED would also give away every test database).
pg_service_database() {
  local db=$1 role=$1
  pg_psql <<EOF
DO \$\$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$role') THEN
    CREATE ROLE $role LOGIN PASSWORD '$role';
  END IF;
END
\$\$;
ALTER ROLE $role LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
EOF
  if [ -z "$(pg_psql -c "SELECT 1 FROM pg_database WHERE datname = '$db'")" ]; then
    pg_psql -c "CREATE DATABASE $db OWNER $role" >/dev/null
  fi
  pg_psql <<EOF
ALTER DATABASE $db OWNER TO $role;
REVOKE ALL ON DATABASE $db FROM PUBLIC;
GRANT CONNECT, TEMPORARY ON DATABASE $db TO $role;
EOF
  pg_psql -d "$db" <<EOF
DO \$\$
DECLARE
  object text;
BEGIN
  FOR object IN
    SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND c.relowner <> '$role'::regrole
  LOOP
    EXECUTE format('ALTER TABLE %s OWNER TO $role', object);  -- with its indexes and sequences
  END LOOP;
  FOR object IN
    SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public' AND c.relkind = 'S' AND c.relowner <> '$role'::regrole
      AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                      AND d.objid = c.oid AND d.deptype IN ('a', 'i'))
  LOOP
    EXECUTE format('ALTER SEQUENCE %s OWNER TO $role', object);
  END LOOP;
  FOR object IN
    SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = 'public' AND p.proowner <> '$role'::regrole
  LOOP
    EXECUTE format('ALTER ROUTINE %s OWNER TO $role', object);
  END LOOP;
END
\$\$;
EOF
}

# The runtime roles of the service database $1: the group role $1_runtime (NOLOGIN), to which
# the service's migrations grant what it may do, and the login role $1_app (password $1_app), a
# member of it, which the service runs as (its default URL) and which may connect only to $1.
# The owner $1 keeps the schema and runs `pagamentos migrate`. Idempotent.
pg_runtime_role() {
  local db=$1 group=$1_runtime login=$1_app
  pg_psql <<EOF
DO \$\$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$group') THEN
    CREATE ROLE $group NOLOGIN;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$login') THEN
    CREATE ROLE $login LOGIN PASSWORD '$login';
  END IF;
END
\$\$;
ALTER ROLE $group NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
ALTER ROLE $login LOGIN INHERIT NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
GRANT $group TO $login;
GRANT CONNECT ON DATABASE $db TO $group;
EOF
}

pg_down() {
  local ver
  ver=$(pg_version)
  [ -n "$ver" ] || return 0
  if pg_lsclusters -h 2>/dev/null | awk -v v="$ver" '$1==v && $2=="main" {print $4}' | grep -q online; then
    log "stopping PostgreSQL $ver"
    pg_ctlcluster "$ver" main stop -m fast
  fi
}

pg_status() {
  if pg_is_ready; then echo "postgres: up (localhost:$PG_PORT)"; else echo "postgres: down"; return 1; fi
}
