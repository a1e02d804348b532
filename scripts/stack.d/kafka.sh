# shellcheck shell=bash
# scripts/stack.d/kafka.sh, sourced by scripts/stack: the plain Kafka broker, or the cluster of
# BROKERS nodes (`up`, `down`, `status`, `restart` with or without `kafka`), and the Kafka jars
# and Java it runs on (which secure.sh uses too). Needs common.sh; KAFKA_VERSION, BROKERS,
# NODE_ADDRESSES and NODE_NETNS come from scripts/stack.

KAFKA_LIBS=$CACHE/kafka-$KAFKA_VERSION/libs
KAFKA_DIR=$STATE/kafka
KAFKA_BROKER_PORT=${KAFKA_BROKER_PORT:-9092}
KAFKA_READY_SECONDS=${KAFKA_READY_SECONDS:-120}
# heap <= 1 GiB (issue #3); 512 MiB is enough for the test suite with the 32 MiB cleaner buffer
KAFKA_HEAP_OPTS=${KAFKA_HEAP_OPTS:--Xms256m -Xmx768m}
KAFKA_GC_OPTS=${KAFKA_GC_OPTS:--XX:+UseG1GC -XX:MaxGCPauseMillis=20}

require_java() {
  command -v java >/dev/null || die "java not found: Kafka $KAFKA_VERSION needs Java 17+ (apt-get install openjdk-17-jre-headless)"
  command -v mvn >/dev/null || die "mvn not found: the Kafka jars are resolved from Maven Central (apt-get install maven)"
  local major
  major=$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')
  major=${major%%.*}
  { [ -n "$major" ] && [ "$major" -ge 17 ]; } || die "Kafka $KAFKA_VERSION needs Java 17 or newer, found '${major:-unknown}'"
}

# ---------------------------------------------------------------------------------------------
# Kafka (jars from Maven Central, KRaft, one node or a cluster of BROKERS nodes)

# the cluster's state (its cluster.id): .stack/kafka for the single node (as always),
# .stack/kafka-cluster else; node n's state: that directory itself, or node-n inside it
# node n's address (KAFKA_NODE_ADDRESSES, remembered; 127.0.0.1 by default) and network
# namespace (KAFKA_NODE_NETNS, remembered; none by default)
nth() { local items; IFS=, read -r -a items <<< "$1"; echo "${items[$(($2 - 1))]:-}"; }
node_host() { local host; host=$(nth "$NODE_ADDRESSES" "$1"); echo "${host:-127.0.0.1}"; }
node_netns() { nth "$NODE_NETNS" "$1"; }
cluster_dir() { if [ "$BROKERS" -eq 1 ]; then echo "$KAFKA_DIR"; else echo "$STATE/kafka-cluster"; fi; }
node_dir() { if [ "$BROKERS" -eq 1 ]; then cluster_dir; else echo "$(cluster_dir)/node-$1"; fi; }
broker_port() { echo $((KAFKA_BROKER_PORT + 2 * ($1 - 1))); }
controller_port() { echo $(($(broker_port "$1") + 1)); }
nodes() { seq 1 "$BROKERS"; }
bootstrap() {
  local n list=
  for n in $(nodes); do list="$list${list:+,}$(node_host "$n"):$(broker_port "$n")"; done
  echo "$list"
}

kafka_pid() {
  local pid dir
  dir=$(node_dir "$1")
  [ -f "$dir/broker.pid" ] || return 1
  pid=$(cat "$dir/broker.pid")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  # the pid may have been reused by an unrelated process after a reboot
  grep -q 'kafka.Kafka' "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

kafka_libs() {
  kafka_tools
  [ -f "$KAFKA_LIBS/.complete" ] && return 0
  require_java
  log "resolving Kafka $KAFKA_VERSION jars from Maven Central into $KAFKA_LIBS"
  local tmp=$KAFKA_LIBS.tmp.$$
  rm -rf "$tmp"
  mvn -B -ntp -q -Dstyle.color=never -f "$ROOT/stack/kafka/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$tmp" >&2 \
    || { rm -rf "$tmp"; die "mvn could not resolve the Kafka jars (output above)"; }
  ls "$tmp"/kafka_2.13-"$KAFKA_VERSION".jar >/dev/null 2>&1 || die "kafka_2.13-$KAFKA_VERSION.jar missing after mvn"
  ls "$tmp"/log4j-slf4j-impl-*.jar >/dev/null 2>&1 || die "no SLF4J binding among the jars: the broker would log nothing"
  rm -rf "$KAFKA_LIBS"
  mkdir -p "$(dirname "$KAFKA_LIBS")"
  mv "$tmp" "$KAFKA_LIBS"
  touch "$KAFKA_LIBS/.complete"
}

# kafka-tools (DumpLogSegments: the chaos suite decodes __consumer_offsets and the transaction
# log with it when a transfer is lost) in a directory of its own, so that adding it never
# changes the classpath of a broker already running from $KAFKA_LIBS
kafka_tools() {
  local dir=$CACHE/kafka-$KAFKA_VERSION/tools
  [ -f "$dir/.complete" ] && return 0
  require_java
  log "resolving kafka-tools $KAFKA_VERSION from Maven Central into $dir"
  local tmp=$dir.tmp.$$
  rm -rf "$tmp"
  mvn -B -ntp -q -Dstyle.color=never -f "$ROOT/stack/kafka/pom.xml" dependency:copy \
    -Dartifact="org.apache.kafka:kafka-tools:$KAFKA_VERSION" -DoutputDirectory="$tmp" >&2 \
    || { rm -rf "$tmp"; die "mvn could not resolve kafka-tools (output above)"; }
  rm -rf "$dir"
  mv "$tmp" "$dir"
  touch "$dir/.complete"
}

kafka_java_opts() {
  echo "$KAFKA_HEAP_OPTS $KAFKA_GC_OPTS -XX:+ExitOnOutOfMemoryError \
    -Djava.io.tmpdir=$(node_dir "$1")/tmp -Dlog4j2.configurationFile=$ROOT/stack/kafka/log4j2.xml"
}

kafka_configure() {
  local n=$1 m dir quorum format_mode voters='' replicas ids
  dir=$(node_dir "$n")
  mkdir -p "$dir/data" "$dir/tmp"
  if [ "$BROKERS" -eq 1 ]; then
    # a dynamic quorum of one (formatted with --standalone)
    quorum="controller.quorum.bootstrap.servers=$(node_host 1):$(controller_port 1)"
    format_mode=--standalone
  else
    # a static quorum of every node
    for m in $(nodes); do voters="$voters${voters:+,}$m@$(node_host "$m"):$(controller_port "$m")"; done
    quorum="controller.quorum.voters=$voters"
    format_mode=
  fi
  replicas=$((BROKERS < 3 ? BROKERS : 3))
  sed -e "s#@DATA_DIR@#$dir/data#" \
      -e "s#@NODE_ID@#$n#g" \
      -e "s#@HOST@#$(node_host "$n")#g" \
      -e "s#@QUORUM@#$quorum#" \
      -e "s#@BROKER_PORT@#$(broker_port "$n")#g" \
      -e "s#@CONTROLLER_PORT@#$(controller_port "$n")#g" \
      -e "s#@REPLICAS@#$replicas#g" \
      -e "s#@MIN_ISR@#$((replicas < 2 ? replicas : 2))#g" \
      "$ROOT/stack/kafka/server.properties.in" > "$dir/server.properties"
  # format once; `restart` and later `up`s keep the data (topics, offsets)
  if [ ! -f "$dir/data/meta.properties" ]; then
    ids=$(cluster_dir)/cluster.id
    [ -f "$ids" ] || java -Xmx256m -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool random-uuid | tail -n 1 > "$ids"
    log "formatting Kafka storage of node $n (cluster $(cat "$ids"))"
    # shellcheck disable=SC2086 # format_mode is empty or one option: nothing or one word
    java -Xmx256m -Dlog4j2.configurationFile="$ROOT/stack/kafka/log4j2.xml" -cp "$KAFKA_LIBS/*" \
      kafka.tools.StorageTool format -t "$(cat "$ids")" \
      -c "$dir/server.properties" $format_mode > "$dir/format.log" 2>&1 \
      || { cat "$dir/format.log" >&2; die "kafka storage format failed"; }
  fi
}

# every node registered and answering
kafka_ready() {
  java -Xmx128m -cp "$KAFKA_LIBS/*" "$ROOT/stack/kafka/Ready.java" "$(bootstrap)" "$BROKERS" >/dev/null 2>&1
}

# share groups (KIP-932, notificacoes' share-group mode) on: the share.version feature at 1 or
# more, upgraded if a cluster was formatted without it (stack/kafka/ShareGroups.java)
kafka_share_groups() {
  local out
  out=$(java -Xmx128m -cp "$KAFKA_LIBS/*" "$ROOT/stack/kafka/ShareGroups.java" "$(bootstrap)" 2>&1) \
    || die "Kafka without share groups: $out"
  case "$out" in *"->"*) log "$out" ;; esac
}

kafka_start_node() {
  local n=$1 dir pid port host netns in_netns=()
  dir=$(node_dir "$n")
  port=$(broker_port "$n")
  host=$(node_host "$n")
  netns=$(node_netns "$n")
  if pid=$(kafka_pid "$n"); then
    return 0
  fi
  rm -f "$dir/broker.pid"
  if port_open "$port" "$host"; then
    die "port $host:$port is taken by a process this script did not start (another Kafka layout? scripts/stack down kafka [--brokers N]); stop it first"
  fi
  kafka_configure "$n"
  if [ -n "$netns" ]; then
    [ -e "/var/run/netns/$netns" ] || die "KAFKA_NODE_NETNS: network namespace '$netns' of node $n does not exist (ip netns add $netns)"
    # `ip netns exec` execs the command: $! below is still the broker's pid
    in_netns=(ip netns exec "$netns")
  fi
  log "starting Kafka $KAFKA_VERSION (KRaft) node $n on $host:$port${netns:+ in network namespace $netns}"
  [ -f "$dir/broker.log" ] && mv -f "$dir/broker.log" "$dir/broker.log.1"
  # many partitions in parallel tests mean many open segment files
  ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
  # shellcheck disable=SC2046 # the Java options are a list of words (KAFKA_HEAP_OPTS, KAFKA_GC_OPTS)
  setsid nohup "${in_netns[@]}" java $(kafka_java_opts "$n") -cp "$KAFKA_LIBS/*" kafka.Kafka "$dir/server.properties" \
    > "$dir/broker.log" 2>&1 < /dev/null &
  echo $! > "$dir/broker.pid"
}

kafka_up() {
  require_java
  kafka_libs
  local n pid
  if [ "$BROKERS" -eq 1 ] && pid=$(kafka_pid 1) && port_open "$KAFKA_BROKER_PORT" "$(node_host 1)" && kafka_ready; then
    log "Kafka already running (pid $pid) on $(node_host 1):$KAFKA_BROKER_PORT"
    return 0
  fi
  echo "$BROKERS" > "$STATE/kafka.brokers"
  if [ -n "$NODE_ADDRESSES" ]; then echo "$NODE_ADDRESSES" > "$STATE/kafka.addresses"; fi
  if [ -n "$NODE_NETNS" ]; then
    command -v ip >/dev/null || apt_install iproute2
    echo "$NODE_NETNS" > "$STATE/kafka.netns"
  fi
  # every node first (a quorum of three elects a leader only once two are up), then wait
  for n in $(nodes); do kafka_start_node "$n"; done
  local started=$SECONDS deadline=$((SECONDS + KAFKA_READY_SECONDS))
  for n in $(nodes); do
    local dir
    dir=$(node_dir "$n")
    pid=$(cat "$dir/broker.pid")
    until grep -q "Kafka Server started" "$dir/broker.log" 2>/dev/null && port_open "$(broker_port "$n")" "$(node_host "$n")"; do
      if ! kill -0 "$pid" 2>/dev/null; then
        tail -n 60 "$dir/broker.log" >&2 || true
        rm -f "$dir/broker.pid"
        die "Kafka node $n exited during start-up (log above, $dir/broker.log)"
      fi
      if [ "$SECONDS" -ge "$deadline" ]; then
        tail -n 60 "$dir/broker.log" >&2 || true
        die "Kafka node $n not ready after ${KAFKA_READY_SECONDS}s (log above, $dir/broker.log)"
      fi
      sleep 0.5
    done
  done
  until kafka_ready; do
    [ "$SECONDS" -lt "$deadline" ] || die "Kafka not ready after ${KAFKA_READY_SECONDS}s ($(node_dir 1)/broker.log)"
    sleep 0.5
  done
  kafka_share_groups
  if [ "$BROKERS" -eq 1 ]; then
    log "Kafka ready on $(node_host 1):$KAFKA_BROKER_PORT (pid $(cat "$KAFKA_DIR/broker.pid"), $((SECONDS - started))s)"
  else
    log "Kafka cluster of $BROKERS ready on $(bootstrap) ($((SECONDS - started))s)"
  fi
}

kafka_down() {
  local n pid dir pids=()
  # SIGTERM runs Kafka's shutdown hook (controlled shutdown, clean log close). Every node at
  # once: a node stopped after the others would wait for a controller quorum that is gone.
  for n in $(nodes); do
    dir=$(node_dir "$n")
    if pid=$(kafka_pid "$n"); then
      log "stopping Kafka node $n (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
    rm -f "$dir/broker.pid"
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then
      log "Kafka pid $pid did not stop within 60s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.5
    fi
  done
}

kafka_status() {
  local n pid rc=0
  for n in $(nodes); do
    if pid=$(kafka_pid "$n") && port_open "$(broker_port "$n")" "$(node_host "$n")"; then
      echo "kafka: up ($(node_host "$n"):$(broker_port "$n"), node $n, pid $pid)"
    else
      echo "kafka: down (node $n)"; rc=1
    fi
  done
  return $rc
}
