//! What pagamentos' integration tests share, so each test reads as its scenario and runs in
//! parallel with the others against the one local stack (`scripts/stack up`).
//!
//! # Layout
//! - [`TestDatabase`]: a database of the test's own, migrated, dropped afterwards.
//! - [`TestTopics`]: topics of the test's own (a unique prefix), deleted afterwards.
//! - [`unique`]: unique names for group ids, transactional ids, prefixes.
//! - [`eventually`]: poll a condition with a deadline instead of sleeping; [`PATIENCE`], the
//!   deadline for what must happen.
//! - [`receive`]: the next records of a consumer, with a deadline.
//! - Absence without a quiet time window: [`records_written`] (a topic's end offsets; each
//!   partition's end under either isolation level: [`partition_ends`]),
//!   [`read_to_end`] (every committed record), [`consumed`] and [`notifications_consumed`] (a
//!   group has committed everything written so far, so whatever it would write for it is
//!   written), [`outbox_published`] (no outbox row left to publish, so every event it would
//!   send is sent). [`committed`] measures a consumer's progress.
//! - [`feed_requests`]: a stream of `TransferenciaSolicitada` for fault tests.
//! - [`stack`]: `scripts/stack restart …` for the tests that take the stack away.
//! - [`webhook`]: a scripted local HTTP receiver for notification tests.
//! - [`otlp`]: an OTLP/HTTP (JSON) receiver for trace tests.
//! - [`secure`]: users, CA and ACLs of the secure broker (`scripts/stack secure up`).
//!
//! The stack's addresses come from `KAFKA_BOOTSTRAP_SERVERS` and `PAGAMENTOS_TEST_DATABASE_URL`
//! (defaults: the local stack). Tests fail, never skip, when the stack is down.
//!
//! # Architecture invariant
//! Only ever a dev-dependency.

#![forbid(unsafe_code)]

pub mod otlp;
pub mod secure;
pub mod webhook;

use std::future::Future;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Executor, PgConnection, PgPool};

/// Kafka of the local stack.
pub fn bootstrap_servers() -> String {
    std::env::var("KAFKA_BOOTSTRAP_SERVERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// Connection settings for the local stack; `KAFKA_GROUP_PROTOCOL=classic` runs the suite
/// with the classic group protocol instead of KIP-848.
pub fn kafka_args() -> kafka::KafkaArgs {
    let mut args = kafka::KafkaArgs::new(bootstrap_servers());
    if std::env::var("KAFKA_GROUP_PROTOCOL").as_deref() == Ok("classic") {
        args.group_protocol = kafka::GroupProtocol::Classic;
    }
    args
}

/// A database URL of the local stack whose role may create databases.
pub fn admin_database_url() -> String {
    std::env::var("PAGAMENTOS_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://pagamentos:pagamentos@localhost:5432/postgres".into())
}

/// `prefix` plus a short random suffix: group ids, transactional ids, topic prefixes.
pub fn unique(prefix: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}-{}", &id[..12])
}

/// Logs through the test harness (shown only for failing tests) at `RUST_LOG` (default
/// `info`), with the OpenTelemetry layer so spans have trace context as in the services.
pub fn init_logs() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(telemetry::logging::DEFAULT_FILTER));
    let result = tracing_subscriber::registry()
        .with(filter)
        .with(telemetry::logging::otel_layer("test"))
        .with(tracing_subscriber::fmt::layer().with_test_writer())
        .try_init();
    // the first test of the binary installed it already
    drop(result);
}

/// Serves `app` on a free local port for the rest of the test; returns its address.
pub async fn serve_locally(app: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind a local port");
    let address = listener.local_addr().expect("local address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("local server") });
    address
}

/// How long a test waits for something that must happen (a consumer group to settle, a service
/// to start, a record to cross the pipeline) before it fails. Generous, for a slow and busy
/// machine; it costs nothing when the condition comes true early.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// Polls `condition` every 50 ms until it returns `Some`, or panics naming `what` after
/// `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut condition: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = condition().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The next `count` records of `consumer`, or a panic naming how many came within
/// [`PATIENCE`].
pub async fn receive(
    consumer: &kafka::consumer::KafkaConsumer,
    count: usize,
) -> Vec<kafka::rdkafka::message::OwnedMessage> {
    let mut received = Vec::new();
    let within = tokio::time::timeout(PATIENCE, async {
        while received.len() < count {
            received.push(consumer.recv().await.expect("receive").detach());
        }
    })
    .await;
    assert!(within.is_ok(), "only {} of {count} records within {PATIENCE:?}", received.len());
    received
}

/// A migrated database of the test's own, dropped when this value is dropped.
#[derive(Debug)]
pub struct TestDatabase {
    pub name: String,
    pub url: String,
    pub pool: PgPool,
}

impl TestDatabase {
    /// Creates `test_<random>` and applies `migrator` to it.
    pub async fn create(migrator: &sqlx::migrate::Migrator) -> Self {
        let database = Self::empty().await;
        migrator.run(&database.pool).await.expect("migrate test database");
        database
    }

    /// Creates `test_<random>` with no tables.
    pub async fn empty() -> Self {
        let admin_url = admin_database_url();
        let name = unique("test").replace('-', "_");
        let mut admin = PgConnection::connect(&admin_url).await.unwrap_or_else(|error| {
            panic!("connect to {admin_url} (is `scripts/stack up` running?): {error}")
        });
        admin.execute(format!(r#"CREATE DATABASE "{name}""#).as_str()).await.expect("create test database");
        let options: PgConnectOptions = admin_url.parse().expect("admin database url");
        let options = options.database(&name);
        let url = options.to_url_lossy().to_string();
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .expect("connect to test database");
        Self { name, url, pool }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        let admin_url = admin_database_url();
        // Drop cannot await; a thread of its own can block on a small runtime
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async {
                let mut admin = PgConnection::connect(&admin_url).await?;
                admin.execute(format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#).as_str()).await?;
                Ok::<_, anyhow::Error>(())
            })
        })
        .join();
        if let Ok(Err(error)) = dropped {
            eprintln!("could not drop test database {}: {error}", self.name);
        }
    }
}

/// Topics of the test's own: the given base names behind a unique prefix, with few partitions
/// (hundreds of tests × 12 partitions would exhaust one broker). Deleted on drop.
#[derive(Debug)]
pub struct TestTopics {
    pub args: kafka::KafkaArgs,
    pub names: Vec<String>,
}

impl TestTopics {
    /// Creates the whole topic plan of the contract behind a fresh prefix.
    pub async fn plan(partitions: i32) -> Self {
        Self::plan_on(kafka_args(), partitions, 1).await
    }

    /// [`Self::plan`] on the cluster `args` names, each topic with `replicas` replicas.
    pub async fn plan_on(mut args: kafka::KafkaArgs, partitions: i32, replicas: i32) -> Self {
        args.topic_prefix = format!("{}.", unique("t"));
        let specs = contracts::topics::plan(&args.topic_prefix);
        let settings = kafka::TopicArgs { partitions, replicas };
        let report = kafka_admin::topics::ensure(&args, &settings, &specs).await.expect("create test topics");
        assert!(report.is_consistent(), "{report}");
        Self { names: specs.into_iter().map(|spec| spec.name).collect(), args }
    }

    /// Creates `bases` (and nothing else) behind a fresh prefix.
    pub async fn create(bases: &[&str], partitions: i32) -> Self {
        let mut args = kafka_args();
        args.topic_prefix = format!("{}.", unique("t"));
        let specs: Vec<contracts::topics::TopicSpec> = bases
            .iter()
            .map(|base| contracts::topics::TopicSpec {
                name: args.topic(base),
                kind: contracts::topics::TopicKind::Event,
                retention_ms: contracts::topics::EVENT_RETENTION_MS,
            })
            .collect();
        let settings = kafka::TopicArgs { partitions, replicas: 1 };
        let report = kafka_admin::topics::ensure(&args, &settings, &specs).await.expect("create test topics");
        assert!(report.is_consistent(), "{report}");
        Self { names: specs.into_iter().map(|spec| spec.name).collect(), args }
    }

    /// The test's name for contract topic `name`.
    pub fn topic(&self, name: &str) -> String {
        self.args.topic(name)
    }
}

impl Drop for TestTopics {
    fn drop(&mut self) {
        let args = self.args.clone();
        let names = std::mem::take(&mut self.names);
        let deleted = std::thread::spawn(move || {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            futures::executor::block_on(kafka_admin::topics::delete(&args, &names))
        })
        .join();
        if let Ok(Err(error)) = deleted {
            eprintln!("could not delete test topics: {error}");
        }
    }
}

/// A `TransferenciaSolicitada` payload for `transfer_id` from account `source` (any amount: a
/// test of poison records sends one ≤ 0).
pub fn transfer_requested(
    transfer_id: uuid::Uuid,
    source: &str,
    amount_cents: contracts::Cents,
) -> serde_json::Value {
    serde_json::json!({
        "eventoId": uuid::Uuid::new_v4(), "transferenciaId": transfer_id, "contaOrigem": source,
        "contaDestino": "CC-999", "valorEmCentavos": amount_cents, "moeda": "BRL",
        "criadaEm": "2026-12-03T10:00:00Z"
    })
}

/// Publishes one request per id to the test's `transferencias.solicitada` over 100 keys,
/// pausing `pause` after every 50, so a stream lasts long enough for faults to land in it.
pub fn feed_requests(
    topics: &TestTopics,
    ids: Vec<uuid::Uuid>,
    pause: Duration,
) -> tokio::task::JoinHandle<()> {
    let input = topics.topic(contracts::topics::REQUESTED);
    let config = kafka::config::producer_config(&topics.args, "test-feed", Duration::ZERO);
    let producer = kafka::producer::Producer::new(&config).expect("producer");
    tokio::spawn(async move {
        for (n, id) in ids.iter().enumerate() {
            let key = format!("CC-{:03}", n % 100);
            let event = transfer_requested(*id, &key, contracts::Cents::new(100 + n as i64));
            // a send during a broker outage waits for the broker (delivery timeout 120 s)
            let record = kafka::producer::OutgoingRecord::new(&input, key, event.to_string());
            producer.send(&record).await.expect("feed");
            if n % 50 == 49 {
                tokio::time::sleep(pause).await;
            }
        }
    })
}

/// Runs this checkout's `scripts/stack` with `args` (e.g. `["restart", "kafka"]`) on the
/// blocking pool, so the services under test keep running meanwhile; panics unless it
/// succeeds. The checkout is found at run time from `CARGO_MANIFEST_DIR`, which `cargo test`
/// sets to the test's package: a build shared by several clones (one `CARGO_TARGET_DIR`) may
/// reuse a test binary compiled in another clone, whose compile-time path would be that one's.
pub async fn stack(args: &[&str]) {
    let package = std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR (run under cargo test)");
    let script = std::path::PathBuf::from(package).join("../../scripts/stack");
    let owned: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
    let status = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&script).args(&owned).status().expect("run scripts/stack")
    })
    .await
    .expect("scripts/stack task");
    assert!(status.success(), "scripts/stack {args:?} failed");
}

/// How far `topic` has been written, as the broker has it now: the sum of its partitions'
/// read_committed ends ([`partition_ends`]). Taken before and after a command that must write
/// nothing, it proves the absence without waiting: whatever the command wrote was acknowledged
/// before it exited. These are offsets, not records: a Kafka transaction's commit marker takes
/// one too, and an open transaction holds the end at its first record until it ends.
pub async fn records_written(args: &kafka::KafkaArgs, topic: &str) -> i64 {
    let ends = partition_ends(args, topic, "read_committed", Duration::from_secs(30))
        .await
        .unwrap_or_else(|error| panic!("{error}"));
    assert!(!ends.is_empty(), "{topic} does not exist");
    ends.into_iter().map(|(_, end)| end).sum()
}

/// Each partition of `topic` with its end as a reader of `isolation` (`isolation.level`) sees
/// it: under `read_committed` the last stable offset (before the first record of the oldest
/// transaction still open), under `read_uncommitted` the high watermark. A transient error of
/// a busy broker (e.g. NotLeaderForPartition) is asked again until `patience` has passed.
pub async fn partition_ends(
    args: &kafka::KafkaArgs,
    topic: &str,
    isolation: &str,
    patience: Duration,
) -> Result<Vec<(i32, i64)>, String> {
    use kafka::rdkafka::consumer::{BaseConsumer, Consumer};
    let mut config = kafka::config::base_consumer_settings(args, "test-watermarks");
    config.set("isolation.level", isolation).set("group.id", unique("watermarks"));
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer<kafka::context::Context> =
            kafka::context::create(&config).map_err(|error| format!("watermark reader: {error}"))?;
        let partitions = kafka::metadata::partitions(consumer.client(), &topic, patience)
            .map_err(|error| format!("metadata of {topic}: {error}"))?;
        let end = |partition: i32| {
            let deadline = std::time::Instant::now() + patience;
            loop {
                match consumer.fetch_watermarks(&topic, partition, patience) {
                    Ok((_, end)) => return Ok((partition, end)),
                    Err(error) if std::time::Instant::now() < deadline => {
                        eprintln!("watermarks of {topic}/{partition}: {error}; asking again");
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    Err(error) => return Err(format!("watermarks of {topic}/{partition}: {error}")),
                }
            }
        };
        partitions.into_iter().map(end).collect()
    })
    .await
    .map_err(|error| format!("watermark task: {error}"))?
}

/// Every committed record of `topic` (read_committed), read to the end of each partition as
/// librdkafka reports it: under read_committed that end is the last stable offset, so a
/// transaction still open on the partition (a producer killed mid-transaction, until the broker
/// aborts it) ends the reading at its first record, and what follows it is not read: like
/// every read_committed reader, this one sees only what precedes the oldest open transaction.
/// No quiet time window decides that the reading is over; a partition that neither delivers
/// nor ends in 120 s fails the test.
pub async fn read_to_end(args: &kafka::KafkaArgs, topic: &str) -> Vec<kafka::rdkafka::message::OwnedMessage> {
    read_to_end_as(args, topic, "read_committed", Duration::from_secs(120))
        .await
        .unwrap_or_else(|error| panic!("{error}"))
}

/// [`read_to_end`] with `isolation` as `isolation.level` (under read_uncommitted the end is the
/// high watermark: open and aborted transactions' records are read too) and `patience` for
/// each record or end; what [`read_to_end`] panics on is an `Err` here.
pub async fn read_to_end_as(
    args: &kafka::KafkaArgs,
    topic: &str,
    isolation: &str,
    patience: Duration,
) -> Result<Vec<kafka::rdkafka::message::OwnedMessage>, String> {
    use kafka::rdkafka::consumer::Consumer;
    use kafka::rdkafka::error::KafkaError;
    use kafka::rdkafka::{Offset, TopicPartitionList};
    let mut config = kafka::config::base_consumer_settings(args, "test-reader");
    config
        .set("group.id", unique("reader"))
        .set("isolation.level", isolation)
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true");
    let reader: kafka::consumer::KafkaConsumer =
        kafka::context::create(&config).map_err(|error| format!("reader: {error}"))?;
    let partitions = kafka::metadata::partitions(reader.client(), topic, Duration::from_secs(30))
        .map_err(|error| format!("metadata: {error}"))?;
    if partitions.is_empty() {
        return Err(format!("{topic} does not exist"));
    }
    let mut assignment = TopicPartitionList::new();
    for partition in &partitions {
        assignment
            .add_partition_offset(topic, *partition, Offset::Beginning)
            .map_err(|error| error.to_string())?;
    }
    reader.assign(&assignment).map_err(|error| format!("assign: {error}"))?;
    let mut open: std::collections::HashSet<i32> = partitions.into_iter().collect();
    let mut records = Vec::new();
    while !open.is_empty() {
        let received = tokio::time::timeout(patience, reader.recv()).await.map_err(|_| {
            format!("{topic}: no record nor end of partition in {} s; open: {open:?}", patience.as_secs())
        })?;
        match received {
            Ok(record) => records.push(record.detach()),
            // (one reader per topic: the event names the partition only)
            Err(KafkaError::PartitionEOF(partition)) => {
                open.remove(&partition);
            }
            Err(error) => return Err(format!("reading {topic}: {error}")),
        }
    }
    Ok(records)
}

/// A client that reads a group's committed offsets and the topics' ends.
type OffsetReader = kafka::rdkafka::consumer::BaseConsumer<kafka::context::Context>;

/// A reader of consumer group `group`'s committed offsets: it asks, and never joins the group.
fn offset_reader(args: &kafka::KafkaArgs, group: &str) -> std::sync::Arc<OffsetReader> {
    let mut config = kafka::config::base_consumer_settings(args, "test-offsets");
    config.set("group.id", group).set("enable.auto.commit", "false");
    std::sync::Arc::new(kafka::context::create(&config).expect("offset reader"))
}

/// (topic, partition, the group's committed offset (0 when none), the partition's end) for every
/// partition of `topics`; `Err` on a broker's (transient) error.
async fn group_progress(
    reader: &std::sync::Arc<OffsetReader>,
    topics: &[String],
) -> Result<Vec<(String, i32, i64, i64)>, String> {
    use kafka::rdkafka::consumer::Consumer;
    use kafka::rdkafka::{Offset, TopicPartitionList};
    let (reader, topics) = (reader.clone(), topics.to_vec());
    tokio::task::spawn_blocking(move || {
        let timeout = Duration::from_secs(10);
        let mut ends = Vec::new();
        let mut partitions = TopicPartitionList::new();
        for topic in &topics {
            let ids = kafka::metadata::partitions(reader.client(), topic, timeout)
                .map_err(|error| error.to_string())?;
            assert!(!ids.is_empty(), "{topic} does not exist");
            for partition in ids {
                let (_, high) =
                    reader.fetch_watermarks(topic, partition, timeout).map_err(|error| error.to_string())?;
                partitions.add_partition(topic, partition);
                ends.push((topic.clone(), partition, high));
            }
        }
        let committed = reader.committed_offsets(partitions, timeout).map_err(|error| error.to_string())?;
        Ok(ends
            .into_iter()
            .map(|(topic, partition, high)| {
                let at = match committed.find_partition(&topic, partition).map(|element| element.offset()) {
                    Some(Offset::Offset(offset)) => offset,
                    _ => 0, // nothing committed yet
                };
                (topic, partition, at, high)
            })
            .collect())
    })
    .await
    .expect("offset task")
}

/// How many records of `topic` consumer group `group` has committed (the sum of its committed
/// offsets), as the broker has it now: a measure of a consumer's progress that counts each
/// input once, whatever it wrote for it.
pub async fn committed(args: &kafka::KafkaArgs, group: &str, topic: &str) -> i64 {
    let reader = offset_reader(args, group);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match group_progress(&reader, &[topic.to_owned()]).await {
            Ok(progress) => return progress.iter().map(|(_, _, at, _)| at).sum(),
            // a busy broker may answer a transient error: ask again
            Err(error) => {
                assert!(tokio::time::Instant::now() < deadline, "offsets of {group} on {topic}: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Waits (up to [`PATIENCE`]) until consumer group `group` has committed every record written
/// so far to each of `topics`: its committed offset on every partition has reached the
/// partition's end, read anew on every poll. The consumer loops commit a record only once
/// everything they do for it is done and acknowledged (its dead letter or its forward to a
/// retry topic written, its transaction committed), so after this whatever the group would write
/// for those records is written, and a topic it did not write to proves the absence. The group
/// is only asked for its offsets, never joined.
pub async fn consumed(args: &kafka::KafkaArgs, group: &str, topics: &[String]) {
    let reader = offset_reader(args, group);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        // what is still behind, or the broker's transient error (asked again)
        let behind = match group_progress(&reader, topics).await {
            Ok(progress) => progress
                .into_iter()
                .filter(|(_, _, at, high)| at < high)
                .map(|(topic, partition, at, high)| format!("{topic}/{partition} at {at} of {high}"))
                .collect::<Vec<_>>()
                .join(", "),
            Err(error) => error,
        };
        if behind.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "group {group} did not commit everything written to {topics:?} in {PATIENCE:?}: {behind}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// [`consumed`] for every stage of `pagamentos notificacoes`, in the order of its chain: the
/// outcome topics, then each retry topic. Once it returns, every webhook call and every forward
/// the service makes for the outcomes written so far is done, its dead letters included.
pub async fn notifications_consumed(args: &kafka::KafkaArgs) {
    use contracts::topics::{groups, retry_topic, RETRIED_TOPICS, RETRY_DELAYS_MS};
    let main: Vec<String> = RETRIED_TOPICS.iter().map(|base| args.topic(base)).collect();
    consumed(args, &args.group(groups::NOTIFICATIONS), &main).await;
    for delay_ms in RETRY_DELAYS_MS {
        let retries: Vec<String> =
            RETRIED_TOPICS.iter().map(|base| args.topic(&retry_topic(base, delay_ms))).collect();
        consumed(args, &args.group(&groups::notifications_retry(delay_ms)), &retries).await;
    }
}

/// Waits (up to [`PATIENCE`]) until the outbox of the database `pool` has no row left to
/// publish: every event written so far has been acknowledged by the broker (the relay marks a
/// row only then), so a topic that lacks an event of it after this never gets it from that row.
pub async fn outbox_published(pool: &sqlx::PgPool) {
    eventually("every outbox row published", PATIENCE, || async {
        let pending: i64 =
            sqlx::query_scalar("SELECT count(*) FROM outbox_evento WHERE publicado_em IS NULL")
                .fetch_one(pool)
                .await
                .ok()?;
        (pending == 0).then_some(())
    })
    .await;
}
