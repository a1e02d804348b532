# shellcheck shell=bash
# scripts/stack.d/secure.sh, sourced by scripts/stack: `scripts/stack secure …`. Needs common.sh
# and kafka.sh (require_java, kafka_libs, KAFKA_LIBS, KAFKA_HEAP_OPTS, KAFKA_GC_OPTS).

# The secure broker (scripts/stack secure up|down|status|acls): a second single-node KRaft broker
# next to the plain one (which it never touches), on its own ports and state: SASL_SSL with
# SCRAM-SHA-512 users per service on KAFKA_SECURE_PORT (default 9392), its controller on mutual
# TLS on the next port, StandardAuthorizer with least-privilege ACLs. Its CA, certificates,
# passwords and one env file per user (KAFKA_* settings for pagamentos) live in
# .stack/kafka-secure/, readable only by their owner.

KAFKA_SECURE_PORT=${KAFKA_SECURE_PORT:-9392}
SECURE_DIR=$STATE/kafka-secure
SECURE_TLS=$SECURE_DIR/tls
SECURE_USERS=(transferencias antifraude ledger notificacoes operador)

secure_pid() {
  local pid
  [ -f "$SECURE_DIR/broker.pid" ] || return 1
  pid=$(cat "$SECURE_DIR/broker.pid")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  grep -q 'kafka.Kafka' "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

# a random secret, generated once and kept in $1
secure_secret() {
  [ -s "$1" ] || (umask 077 && openssl rand -hex 24 > "$1")
  cat "$1"
}

# the CA and the broker's certificate (PKCS12 keystore, truststore), once
secure_tls() {
  [ -f "$SECURE_TLS/.complete" ] && return 0
  log "generating the secure broker's CA and certificate in $SECURE_TLS"
  rm -rf "$SECURE_TLS"
  mkdir -p "$SECURE_TLS"
  chmod 700 "$SECURE_TLS"
  local store
  store=$(secure_secret "$SECURE_TLS/store.password")
  (
    cd "$SECURE_TLS"
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 3650 \
      -subj "/CN=pagamentos local CA" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout broker.key -out broker.csr -subj "/CN=kafka-broker" 2>/dev/null
    printf '%s\n' "subjectAltName=IP:127.0.0.1,DNS:localhost" "extendedKeyUsage=serverAuth,clientAuth" \
      "keyUsage=critical,digitalSignature,keyEncipherment" > broker.ext
    openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out broker.pem \
      -days 825 -extfile broker.ext 2>/dev/null
    openssl pkcs12 -export -in broker.pem -inkey broker.key -certfile ca.pem -name kafka-broker \
      -out broker.p12 -passout "pass:$store"
    keytool -importcert -noprompt -alias pagamentos-ca -file ca.pem -keystore truststore.p12 \
      -storetype PKCS12 -storepass "$store" >/dev/null 2>&1
    chmod 644 ca.pem
  ) || die "could not generate the secure broker's certificates"
  touch "$SECURE_TLS/.complete"
}

# the client settings of each user: an env file for pagamentos, and the super user's
# properties for the Java admin helper
secure_client_files() {
  local user password
  for user in "${SECURE_USERS[@]}"; do
    password=$(secure_secret "$SECURE_DIR/users/$user.password")
    (umask 077 && printf '%s\n' \
      "KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:$KAFKA_SECURE_PORT" \
      "KAFKA_SECURITY_PROTOCOL=sasl_ssl" \
      "KAFKA_SASL_MECHANISM=SCRAM-SHA-512" \
      "KAFKA_SASL_USERNAME=$user" \
      "KAFKA_SASL_PASSWORD=$password" \
      "KAFKA_SSL_CA_LOCATION=$SECURE_TLS/ca.pem" > "$SECURE_DIR/$user.env")
  done
  (umask 077 && printf '%s\n' \
    "bootstrap.servers=127.0.0.1:$KAFKA_SECURE_PORT" \
    "security.protocol=SASL_SSL" \
    "sasl.mechanism=SCRAM-SHA-512" \
    "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"kafka-admin\" password=\"$(cat "$SECURE_DIR/users/kafka-admin.password")\";" \
    "ssl.truststore.type=PEM" \
    "ssl.truststore.location=$SECURE_TLS/ca.pem" > "$SECURE_DIR/admin.properties")
}

secure_java() {
  java -Xmx128m -Dlog4j2.configurationFile="$ROOT/stack/kafka/log4j2.xml" -cp "$KAFKA_LIBS/*" \
    "$ROOT/stack/kafka/Secure.java" "$@"
}

secure_configure() {
  mkdir -p "$SECURE_DIR/data" "$SECURE_DIR/tmp" "$SECURE_DIR/users"
  chmod 700 "$SECURE_DIR" "$SECURE_DIR/users"
  secure_tls
  local admin store
  admin=$(secure_secret "$SECURE_DIR/users/kafka-admin.password")
  store=$(cat "$SECURE_TLS/store.password")
  (umask 077 && sed -e "s#@DATA_DIR@#$SECURE_DIR/data#" \
      -e "s#@TLS_DIR@#$SECURE_TLS#g" \
      -e "s#@BROKER_PORT@#$KAFKA_SECURE_PORT#g" \
      -e "s#@CONTROLLER_PORT@#$((KAFKA_SECURE_PORT + 1))#g" \
      -e "s#@STORE_PASSWORD@#$store#g" \
      -e "s#@ADMIN_PASSWORD@#$admin#g" \
      "$ROOT/stack/kafka/secure.properties.in" > "$SECURE_DIR/server.properties")
  secure_client_files
  if [ ! -f "$SECURE_DIR/data/meta.properties" ]; then
    local id
    id=$(java -Xmx256m -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool random-uuid | tail -n 1)
    log "formatting the secure broker's storage (cluster $id, super user kafka-admin)"
    java -Xmx256m -Dlog4j2.configurationFile="$ROOT/stack/kafka/log4j2.xml" -cp "$KAFKA_LIBS/*" \
      kafka.tools.StorageTool format -t "$id" -c "$SECURE_DIR/server.properties" --standalone \
      --add-scram "SCRAM-SHA-512=[name=kafka-admin,password=$admin]" > "$SECURE_DIR/format.log" 2>&1 \
      || { cat "$SECURE_DIR/format.log" >&2; die "secure broker storage format failed"; }
  fi
}

secure_up() {
  apt_install openssl
  require_java
  kafka_libs
  local pid port=$KAFKA_SECURE_PORT
  if ! pid=$(secure_pid); then
    rm -f "$SECURE_DIR/broker.pid"
    port_open "$port" && die "port $port is taken by a process this script did not start; stop it or set KAFKA_SECURE_PORT"
    port_open $((port + 1)) && die "port $((port + 1)) is taken by a process this script did not start; stop it or set KAFKA_SECURE_PORT"
    secure_configure
    log "starting the secure Kafka broker (SASL_SSL) on 127.0.0.1:$port"
    [ -f "$SECURE_DIR/broker.log" ] && mv -f "$SECURE_DIR/broker.log" "$SECURE_DIR/broker.log.1"
    ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    # shellcheck disable=SC2086 # KAFKA_HEAP_OPTS and KAFKA_GC_OPTS are lists of options
    setsid nohup java $KAFKA_HEAP_OPTS $KAFKA_GC_OPTS -XX:+ExitOnOutOfMemoryError \
      -Djava.io.tmpdir="$SECURE_DIR/tmp" -Dlog4j2.configurationFile="$ROOT/stack/kafka/log4j2-secure.xml" \
      -cp "$KAFKA_LIBS/*" kafka.Kafka "$SECURE_DIR/server.properties" \
      > "$SECURE_DIR/broker.log" 2>&1 < /dev/null &
    pid=$!
    echo "$pid" > "$SECURE_DIR/broker.pid"
  else
    secure_configure
  fi
  local started=$SECONDS deadline=$((SECONDS + KAFKA_READY_SECONDS))
  until grep -q "Kafka Server started" "$SECURE_DIR/broker.log" 2>/dev/null && port_open "$port" \
      && secure_java ready "$SECURE_DIR/admin.properties" >/dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 60 "$SECURE_DIR/broker.log" >&2 || true
      rm -f "$SECURE_DIR/broker.pid"
      die "the secure Kafka broker exited during start-up (log above, $SECURE_DIR/broker.log)"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 60 "$SECURE_DIR/broker.log" >&2 || true
      die "the secure Kafka broker is not ready after ${KAFKA_READY_SECONDS}s (log above)"
    fi
    sleep 0.5
  done
  local users=() user
  for user in "${SECURE_USERS[@]}"; do users+=("$user=$(cat "$SECURE_DIR/users/$user.password")"); done
  secure_java users "$SECURE_DIR/admin.properties" "${users[@]}" >/dev/null \
    || die "could not create the SCRAM users (output above)"
  secure_acls ""
  log "secure Kafka ready on 127.0.0.1:$port (SASL_SSL, SCRAM-SHA-512; pid $pid, $((SECONDS - started))s)." \
    "Users ${SECURE_USERS[*]}: settings in $SECURE_DIR/<user>.env, CA $SECURE_TLS/ca.pem"
}

# the services' ACLs for the topics, groups and transactional ids behind prefix $1 ("" = the
# production names); the tests call it with a prefix of their own
secure_acls() {
  secure_pid >/dev/null || die "the secure broker is not running (scripts/stack secure up)"
  secure_java acls "$SECURE_DIR/admin.properties" "$1" >&2 || die "could not create the ACLs (output above)"
}

secure_down() {
  local pid
  if pid=$(secure_pid); then
    log "stopping the secure Kafka broker (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then
      log "secure Kafka pid $pid did not stop within 60s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$SECURE_DIR/broker.pid"
}

secure_status() {
  local pid
  if pid=$(secure_pid) && port_open "$KAFKA_SECURE_PORT"; then
    echo "kafka (secure): up (127.0.0.1:$KAFKA_SECURE_PORT SASL_SSL, pid $pid)"
  else
    echo "kafka (secure): down"; return 1
  fi
}

