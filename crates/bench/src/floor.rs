//! The floor program (issue #47): the chain's unavoidable steps with no business logic, on the
//! same stack and in the same run as pagamentos, so that its latency is what this architecture
//! cannot go below on this host at that moment. Each message goes through:
//!
//! 1. a one-row PostgreSQL commit, then an `acks=all` idempotent produce to `floor.a` (the
//!    API's transaction and the relay's publish, without the outbox read between them);
//! 2. a consume of `floor.a` and one Kafka transaction per batch that produces to `floor.b`
//!    and commits the consumed offsets (antifraude, `read_committed`, without the scoring),
//!    through the services' own `kafka::transactional::TransactionalProducer`;
//! 3. a consume of `floor.b`, one commit of the batch's rows and an `acks=all` produce of each to
//!    `floor.c` (the ledger and its relay, without the settlement);
//! 4. a consume of `floor.c` (the load generator seeing the outcome).
//!
//! The clients are built as the services' are (`kafka::config`, the `fast` profile's linger);
//! latency counts from when a message was due on the open-loop schedule, as loadgen's does.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use futures::future::join_all;
use futures::FutureExt;
use kafka::config::{consumer_config, producer_config, transactional_producer_config, OffsetCommit, Profile};
use kafka::producer::{OutgoingRecord, Producer};
use kafka::rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use kafka::rdkafka::message::{BorrowedMessage, Message};
use kafka::rdkafka::{ClientConfig, Offset, TopicPartitionList};
use kafka::transactional::TransactionalProducer;
use kafka::KafkaArgs;
use loadgen::report::Latencies;
use loadgen::Report;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::{mpsc, Mutex};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::prom::Hop;
use crate::Args;

/// Most messages one step takes per batch.
const BATCH_MAX: usize = 500;
/// How long the messages of a measured load may take to come out of the chain after the last
/// was sent, before the missing ones count as lost.
const DRAIN: Duration = Duration::from_secs(30);

/// The floor's stages, running on fresh topics and a fresh database.
pub(crate) struct Floor {
    kafka: KafkaArgs,
    database: String,
    pool: PgPool,
    producer: Producer,
    topics: [String; 3],
    /// Messages seen at the end of the chain, and when.
    seen: Mutex<mpsc::UnboundedReceiver<Seen>>,
    stop: CancellationToken,
    stages: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

fn kafka_args(args: &Args, prefix: &str) -> KafkaArgs {
    KafkaArgs {
        topic_prefix: prefix.to_owned(),
        security: args.kafka_security.clone(),
        ..KafkaArgs::new(args.kafka_bootstrap_servers.clone())
    }
}

/// A client's settings as the services build them, without the statistics (nothing reads them).
fn quiet(mut config: ClientConfig) -> ClientConfig {
    config.set("statistics.interval.ms", "0");
    config
}

/// A message's payload: its id, then the wall-clock time (Unix nanoseconds, little-endian)
/// at which each stage took it, appended stage by stage: the floor's own per-step breakdown.
/// A consumer of `topic` in group `name` (behind the run's prefix), built as the services' are.
fn consumer(
    kafka: &KafkaArgs,
    name: &str,
    commit: OffsetCommit,
    topic: &str,
) -> anyhow::Result<StreamConsumer> {
    let consumer: StreamConsumer =
        quiet(consumer_config(kafka, &format!("bench-{name}"), &kafka.group(name), commit)).create()?;
    consumer.subscribe(&[topic])?;
    Ok(consumer)
}

fn uuid_of(message: &impl Message) -> Option<Uuid> {
    Uuid::from_slice(message.payload()?.get(..16)?).ok()
}

fn unix_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
}

/// `payload` with the current time appended.
fn stamped(payload: &[u8]) -> Vec<u8> {
    let mut stamped = payload.to_vec();
    stamped.extend_from_slice(&unix_nanos().to_le_bytes());
    stamped
}

/// The stamps of a payload, in stage order.
fn stamps(payload: &[u8]) -> Vec<u64> {
    payload
        .get(16..)
        .unwrap_or_default()
        .chunks_exact(8)
        .map(|chunk| u64::from_le_bytes(chunk.try_into().expect("chunks of 8")))
        .collect()
}

/// The floor's steps, as the intervals between the stamps (the first from when the message
/// was due): what each costs at this rate on this host.
pub(crate) const STEPS: [&str; 4] =
    ["floor_commit", "floor_produce_consume", "floor_transaction_consume", "floor_commit_produce_consume"];

/// One step's intervals.
#[derive(Default)]
struct Step {
    latencies: Latencies,
    total_ms: f64,
}

/// What came out of the chain: the id, when (monotonic), and the payload's stamps plus the
/// end's own.
type Seen = (Uuid, Instant, Vec<u64>);

/// A load's messages not yet seen, and what the seen ones measured.
#[derive(Default)]
struct Tally {
    /// When each message in flight was due: monotonic, and on the wall clock for the stamps.
    due: HashMap<Uuid, (Instant, u64)>,
    latencies: Latencies,
    steps: [Step; 4],
    last_seen: Option<Instant>,
}

impl Tally {
    fn receive(&mut self, (id, at, stamps): Seen) {
        let Some((due, due_unix)) = self.due.remove(&id) else { return };
        self.latencies.record(at.saturating_duration_since(due));
        self.last_seen = Some(at);
        let mut from = due_unix;
        for (step, &to) in self.steps.iter_mut().zip(&stamps) {
            let interval = Duration::from_nanos(to.saturating_sub(from));
            step.latencies.record(interval);
            step.total_ms += interval.as_secs_f64() * 1_000.0;
            from = to;
        }
    }
}

impl Floor {
    /// Creates the database and topics of round `run` and starts stages 2 to 4.
    pub(crate) async fn start(args: &Args, run: &str) -> anyhow::Result<Self> {
        let prefix = format!("bench-{run}-floor.");
        let kafka = kafka_args(args, &prefix);
        let topics = ["floor.a", "floor.b", "floor.c"].map(|name| kafka.topic(name));
        let specs: Vec<contracts::topics::TopicSpec> = topics
            .iter()
            .map(|name| contracts::topics::TopicSpec {
                name: name.clone(),
                kind: contracts::topics::TopicKind::Event,
                retention_ms: 3_600_000,
            })
            .collect();
        // as many partitions as the system's topics (`APP_KAFKA_PARTITIONS`' default)
        let layout = kafka::config::TopicArgs { partitions: 12, replicas: 1 };
        kafka_admin::topics::ensure(&kafka, &layout, &specs)
            .await
            .map_err(|error| anyhow!("create the floor's topics: {error}"))?;

        let database = format!("bench_{run}_floor");
        let mut admin = PgConnection::connect(&args.database_url).await.context("connect to PostgreSQL")?;
        sqlx::query(&format!("CREATE DATABASE {database}")).execute(&mut admin).await?;
        let base = args.database_url.rsplit_once('/').map_or(args.database_url.as_str(), |(base, _)| base);
        let pool = PgPoolOptions::new().max_connections(16).connect(&format!("{base}/{database}")).await?;
        for table in ["floor_a", "floor_b"] {
            sqlx::query(&format!(
                "CREATE TABLE {table} (id uuid PRIMARY KEY, criado_em timestamptz NOT NULL DEFAULT now())"
            ))
            .execute(&pool)
            .await?;
        }

        let linger = Profile::Fast.linger();
        let producer = Producer::new(&quiet(producer_config(&kafka, "bench-floor-a", linger)))?;
        let stop = CancellationToken::new();
        let (seen_tx, seen_rx) = mpsc::unbounded_channel();

        // stage 2: the Kafka transaction, through the services' own transactional producer
        // (which waits out librdkafka's delivery reports before it commits: rdkafka's flush
        // would otherwise poll a fixed 100 ms)
        let transaction_consumer = consumer(&kafka, "floor-tx", OffsetCommit::InTransaction, &topics[0])?;
        let transactional = TransactionalProducer::new(&quiet(transactional_producer_config(
            &kafka,
            "bench-floor-tx",
            &format!("bench-floor-{run}"),
            Profile::Fast.transaction_linger(),
        )))?;
        transactional.init().await?;
        let transaction_stage = tokio::spawn(transaction_stage(
            transaction_consumer,
            transactional,
            topics[1].clone(),
            stop.clone(),
        ));

        // stage 3: commit and produce
        let settle = consumer(&kafka, "floor-commit", OffsetCommit::StoredAfterHandling, &topics[1])?;
        let settle_producer = Producer::new(&quiet(producer_config(&kafka, "bench-floor-c", linger)))?;
        let commit_stage = tokio::spawn(commit_stage(
            settle,
            settle_producer,
            pool.clone(),
            topics[2].clone(),
            stop.clone(),
        ));

        // stage 4: the end of the chain
        let end = consumer(&kafka, "floor-end", OffsetCommit::StoredAfterHandling, &topics[2])?;
        let end_stage = tokio::spawn(end_stage(end, seen_tx, stop.clone()));

        Ok(Self {
            kafka,
            database,
            pool,
            producer,
            topics,
            seen: Mutex::new(seen_rx),
            stop,
            stages: vec![transaction_stage, commit_stage, end_stage],
        })
    }

    /// Stage 1 for one message: the one-row commit, then the produce.
    async fn send(pool: &PgPool, producer: &Producer, topic: &str, id: Uuid) -> anyhow::Result<()> {
        sqlx::query("INSERT INTO floor_a (id) VALUES ($1)").bind(id).execute(pool).await?;
        let key = id.hyphenated().to_string();
        let payload = stamped(id.as_bytes());
        producer.send(&OutgoingRecord::new(topic, key, payload)).await?;
        Ok(())
    }

    /// Waits until one message has gone through the whole chain (every consumer has its
    /// partitions), at most two minutes.
    pub(crate) async fn ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut seen = self.seen.lock().await;
        while Instant::now() < deadline {
            let probe = Uuid::new_v4();
            Self::send(&self.pool, &self.producer, &self.topics[0], probe).await?;
            let wait_until = Instant::now() + Duration::from_secs(5);
            while let Ok(Some((id, _, _))) =
                tokio::time::timeout(wait_until.saturating_duration_since(Instant::now()), seen.recv()).await
            {
                if id == probe {
                    return Ok(());
                }
            }
            self.check_stages()?;
        }
        anyhow::bail!("the floor's chain did not carry a message end to end within 120 s")
    }

    fn check_stages(&self) -> anyhow::Result<()> {
        if self.stages.iter().any(tokio::task::JoinHandle::is_finished) {
            anyhow::bail!("a stage of the floor's chain stopped (see the error when the floor stops)");
        }
        Ok(())
    }

    /// Sends `rate` messages a second for `seconds` on the open-loop schedule and measures each
    /// from when it was due to when it came out of the chain; also each step ([`STEPS`]).
    pub(crate) async fn load(
        &self,
        rate: u32,
        seconds: u64,
    ) -> anyhow::Result<(Report, BTreeMap<&'static str, Hop>)> {
        let mut seen = self.seen.lock().await;
        // what an earlier load left in flight does not count here
        while seen.try_recv().is_ok() {}
        let total = u64::from(rate) * seconds;
        let started = Instant::now();
        let started_unix = unix_nanos();
        let mut tally = Tally::default();
        let mut failures = 0u64;
        let sends = tokio_util::task::TaskTracker::new();
        let (failed_tx, mut failed_rx) = mpsc::unbounded_channel();
        for index in 0..total {
            let offset = Duration::from_secs_f64(index as f64 / f64::from(rate));
            let due = started + offset;
            // receive while waiting for the next message's time, so the queue stays short
            loop {
                tokio::select! {
                    biased;
                    Some(seen) = seen.recv() => tally.receive(seen),
                    () = tokio::time::sleep_until(due.into()) => break,
                }
            }
            let id = Uuid::new_v4();
            let due_unix = started_unix + u64::try_from(offset.as_nanos()).unwrap_or(u64::MAX);
            tally.due.insert(id, (due, due_unix));
            let (pool, producer, topic, failed) =
                (self.pool.clone(), self.producer.clone(), self.topics[0].clone(), failed_tx.clone());
            sends.spawn(async move {
                if let Err(error) = Self::send(&pool, &producer, &topic, id).await {
                    let _ = failed.send(format!("{error:#}"));
                }
            });
        }
        sends.close();
        let deadline = Instant::now() + DRAIN;
        while !tally.due.is_empty() && Instant::now() < deadline {
            match tokio::time::timeout(Duration::from_secs(1), seen.recv()).await {
                Ok(Some(seen)) => tally.receive(seen),
                Ok(None) => break,
                Err(_) => self.check_stages()?,
            }
        }
        sends.wait().await;
        while let Ok(error) = failed_rx.try_recv() {
            failures += 1;
            if failures == 1 {
                eprintln!("bench: floor: a send failed: {error}");
            }
        }
        let finals = tally.latencies.len();
        let seconds =
            tally.last_seen.map_or(0.0, |last| last.saturating_duration_since(started).as_secs_f64());
        let report = Report {
            sent: total,
            accepted: total - failures,
            settled: finals,
            rejected: 0,
            lost: tally.due.len() as u64,
            throughput_per_s: if seconds > 0.0 {
                (finals as f64 / seconds * 10.0).round() / 10.0
            } else {
                0.0
            },
            latency_ms: tally.latencies.summary(),
            conflicting: 0,
        };
        let steps = STEPS
            .iter()
            .zip(&tally.steps)
            .filter(|(_, step)| !step.latencies.is_empty())
            .map(|(name, step)| {
                let count = step.latencies.len();
                let round = |ms: f64| (ms * 100.0).round() / 100.0;
                let hop = Hop {
                    count,
                    mean_ms: round(step.total_ms / count as f64),
                    p50_ms: round(step.latencies.quantile_ms(0.5)),
                    p99_ms: round(step.latencies.quantile_ms(0.99)),
                };
                (*name, hop)
            })
            .collect();
        Ok((report, steps))
    }

    /// Stops the stages and removes the database and topics.
    pub(crate) async fn stop(mut self, args: &Args) -> anyhow::Result<()> {
        self.stop.cancel();
        let mut outcome = Ok(());
        for stage in self.stages.drain(..) {
            let result = stage.await.map_err(anyhow::Error::from).and_then(|result| result);
            if outcome.is_ok() {
                outcome = result;
            }
        }
        self.pool.close().await;
        let mut admin = PgConnection::connect(&args.database_url).await?;
        crate::system::drop_database(&mut admin, &self.database).await?;
        let names: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        kafka_admin::topics::delete(&self.kafka, &names)
            .await
            .map_err(|error| anyhow!("delete the floor's topics: {error}"))?;
        outcome.context("the floor's chain")
    }
}

/// The offsets after `messages`, per partition.
fn next_offsets<'a>(
    messages: impl Iterator<Item = &'a BorrowedMessage<'a>>,
) -> anyhow::Result<TopicPartitionList> {
    let mut next: HashMap<(String, i32), i64> = HashMap::new();
    for message in messages {
        let slot = next.entry((message.topic().to_owned(), message.partition())).or_default();
        *slot = (*slot).max(message.offset() + 1);
    }
    let mut list = TopicPartitionList::new();
    for ((topic, partition), offset) in next {
        list.add_partition_offset(&topic, partition, Offset::Offset(offset))?;
    }
    Ok(list)
}

/// The next batch: a record waited for, then what else is already there (up to
/// [`BATCH_MAX`]); `None` once `stop` is cancelled.
async fn next_batch<'c>(
    consumer: &'c StreamConsumer,
    stop: &CancellationToken,
) -> anyhow::Result<Option<Vec<BorrowedMessage<'c>>>> {
    let first = tokio::select! {
        _ = stop.cancelled() => return Ok(None),
        message = consumer.recv() => message?,
    };
    let mut batch = vec![first];
    while batch.len() < BATCH_MAX {
        match consumer.recv().now_or_never() {
            Some(message) => batch.push(message?),
            None => break,
        }
    }
    Ok(Some(batch))
}

/// `batch` for `output`: each record's key, and its payload with this stage's stamp added.
fn forwarded(batch: &[BorrowedMessage<'_>], output: &str) -> Vec<OutgoingRecord> {
    batch
        .iter()
        .map(|message| {
            OutgoingRecord::new(
                output,
                message.key().unwrap_or_default(),
                stamped(message.payload().unwrap_or_default()),
            )
        })
        .collect()
}

/// Stage 2: per batch of what is there, one Kafka transaction that produces each message to
/// `output` and commits the consumed offsets.
async fn transaction_stage(
    consumer: StreamConsumer,
    producer: TransactionalProducer,
    output: String,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    loop {
        let Some(batch) = next_batch(&consumer, &stop).await? else { return Ok(()) };
        let records = forwarded(&batch, &output);
        producer.begin().await?;
        for result in join_all(records.iter().map(|record| producer.send(record))).await {
            result?;
        }
        let offsets = next_offsets(batch.iter())?;
        let group = consumer.group_metadata().ok_or_else(|| anyhow!("no group metadata"))?;
        producer.send_offsets(offsets, group).await?;
        producer.commit().await?;
    }
}

/// Stage 3: per batch, one commit of its rows, then an `acks=all` produce of each to `output`,
/// then the offsets stored (librdkafka commits them in the background, as the services').
async fn commit_stage(
    consumer: StreamConsumer,
    producer: Producer,
    pool: PgPool,
    output: String,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    loop {
        let Some(batch) = next_batch(&consumer, &stop).await? else { break };
        // stamped as taken, before the commit: the commit is the last step's
        let records = forwarded(&batch, &output);
        let ids: Vec<Uuid> = batch.iter().filter_map(uuid_of).collect();
        sqlx::query("INSERT INTO floor_b (id) SELECT unnest($1::uuid[]) ON CONFLICT DO NOTHING")
            .bind(&ids)
            .execute(&pool)
            .await?;
        for result in join_all(records.iter().map(|record| producer.send(record))).await {
            result?;
        }
        for message in &batch {
            consumer.store_offset_from_message(message)?;
        }
    }
    consumer.commit_consumer_state(CommitMode::Sync).ok();
    Ok(())
}

/// Stage 4: tells the measurer which message came out of the chain, and when.
async fn end_stage(
    consumer: StreamConsumer,
    seen: mpsc::UnboundedSender<Seen>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    loop {
        let message = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            message = consumer.recv() => message?,
        };
        let (at, now) = (Instant::now(), unix_nanos());
        if let Some(id) = uuid_of(&message) {
            let mut stamps = stamps(message.payload().unwrap_or_default());
            stamps.push(now);
            if seen.send((id, at, stamps)).is_err() {
                return Ok(());
            }
        }
        consumer.store_offset_from_message(&message)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stage_s_stamp_follows_the_id_and_the_steps_are_the_intervals_between_them() {
        let id = Uuid::new_v4();
        let once = stamped(id.as_bytes());
        let twice = stamped(&once);
        assert_eq!(Uuid::from_slice(&twice[..16]).ok(), Some(id));
        let [first, second] = stamps(&twice)[..] else { panic!("two stamps") };
        assert!(first > 0 && second >= first);

        let due = Instant::now();
        let mut tally = Tally::default();
        tally.due.insert(id, (due, 1_000_000));
        // due at 1 ms; then stamps at 3, 4, 10 and 12 ms (Unix nanoseconds)
        tally.receive((
            id,
            due + Duration::from_millis(11),
            vec![3_000_000, 4_000_000, 10_000_000, 12_000_000],
        ));
        let means: Vec<f64> = tally.steps.iter().map(|step| step.total_ms).collect();
        assert_eq!(means, [2.0, 1.0, 6.0, 2.0]);
        assert!(tally.due.is_empty());
        assert_eq!(tally.latencies.len(), 1);
        // a message of an earlier load is not counted
        tally.receive((Uuid::new_v4(), due, vec![1, 2, 3, 4]));
        assert_eq!(tally.latencies.len(), 1);
    }
}
