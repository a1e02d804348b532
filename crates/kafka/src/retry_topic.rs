//! Non-blocking retries through retry topics, as Spring Kafka's retry topics do them
//! (`CONTRACT.md` §3): a record whose attempt failed is forwarded to `<topic>-retry-<ms>` and
//! the consumer goes on with the next one, so one failing record never stalls the others.
//!
//! A [`Chain`] is a main stage (attempt 1 on the source topics) and one stage per delay
//! (attempt 2, 3, …), each a consumer group of its own. After the last attempt, or at once for
//! a failure that no retry can fix, the record goes to `<topic>-dlt`.
//!
//! A retry stage never processes a record before its `retry_topic-backoff-timestamp`. It waits
//! by **pausing only that record's partition** and holding the record (and any later ones of
//! that partition already received) in memory until it is due; every other partition and topic
//! keeps flowing. librdkafka resumes a paused partition from the position after the last record
//! handed to the application, so nothing held is fetched twice and nothing after it is skipped.
//! Held records are not committed: a crash or a revoked partition redelivers them.
//!
//! Offsets move only after a record was handled or forwarded and the broker acknowledged the
//! forward (`acks=all`).
//!
//! # Headers, as Spring Kafka 4.x writes and reads them
//! A forwarded record keeps every header it had. The `kafka_original-*` family and
//! `kafka_dlt-original-consumer-group` are written once, on the first hop, and kept. Every hop,
//! the one to `-dlt` included, **appends** one value of each `kafka_exception-*` header (the
//! cause type always among them) and of `retry_topic-original-timestamp`, `retry_topic-attempts`
//! (the attempt the record is on its way to: 2 on the first retry topic, one past the last
//! attempt made on `-dlt`) and `retry_topic-backoff-timestamp` (failure time + the
//! destination's delay; 0 for `-dlt`, so a dead letter re-driven to a retry topic is due at
//! once), as Spring's `retainAllRetryHeaderValues` (on by default) does: a record carries one
//! value per hop. Readers take the **last** value ([`crate::consumer::header`], Kafka's
//! `Headers.lastHeader`). A stage reads only the backoff timestamp; the attempt it makes is its
//! own (its place in the chain), not the header's.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::consumer::Consumer;
use rdkafka::message::{Headers, Message, OwnedMessage};
use rdkafka::TopicPartitionList;
use tokio_util::sync::CancellationToken;

use contracts::headers::{decode_big_integer, encode_big_integer, encode_int, encode_long, retry};
use contracts::topics::{dead_letter_topic, retry_topic};

use crate::consumer::{header, KafkaConsumer};
use crate::dead_letter::Failure;
use crate::producer::{OutgoingRecord, Producer};
use crate::Error;

/// What became of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Handled; nothing more to do.
    Done,
    /// Failed in a way a later attempt may fix: forward down the chain.
    Retry(Failure),
    /// Failed in a way no retry fixes: straight to `<topic>-dlt`.
    Reject(Failure),
}

/// One attempt at a record. Implementations must not panic on any input: a record they cannot
/// read is a [`Verdict::Reject`].
pub trait Attempt: Send + Sync + 'static {
    fn attempt(&self, record: &OwnedMessage) -> impl Future<Output = Verdict> + Send;
}

/// The delays of the retry topics, in order (the contract's 1 s, 2 s, 4 s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub delays_ms: Vec<u32>,
}

/// Where a failed record goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// The next retry topic; `attempt` is the attempt the record is on its way to.
    Retry {
        topic: String,
        attempt: u32,
        delay_ms: u32,
    },
    DeadLetter {
        topic: String,
    },
}

impl Chain {
    /// Attempts in all: the main one plus one per retry topic.
    pub fn attempts(&self) -> u32 {
        self.delays_ms.len() as u32 + 1
    }

    /// Where a record of `base` topic goes after attempt `failed` (1 = the main stage) failed.
    pub fn after_failure(&self, base: &str, failed: u32) -> Destination {
        match self.delays_ms.get(failed.saturating_sub(1) as usize) {
            Some(&delay_ms) => {
                Destination::Retry { topic: retry_topic(base, delay_ms), attempt: failed + 1, delay_ms }
            }
            None => Destination::DeadLetter { topic: dead_letter_topic(base) },
        }
    }

    /// The stages of this chain for `bases` (topic names as consumed, prefix included), each
    /// with its consumer group: `group` for the main stage, `group-retry-<ms>` for the others
    /// (as Spring suffixes retry groups).
    pub fn stages(&self, bases: &[String], group: &str) -> Vec<Stage> {
        let mut stages = vec![Stage {
            attempt: 1,
            group: group.to_owned(),
            sources: bases.iter().map(|base| (base.clone(), base.clone())).collect(),
            waits_for_backoff: false,
        }];
        for (index, &delay_ms) in self.delays_ms.iter().enumerate() {
            stages.push(Stage {
                attempt: index as u32 + 2,
                group: format!("{group}-retry-{delay_ms}"),
                sources: bases.iter().map(|base| (retry_topic(base, delay_ms), base.clone())).collect(),
                waits_for_backoff: true,
            });
        }
        stages
    }
}

/// One consumer of a chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// The attempt this stage makes (1 on the source topics).
    pub attempt: u32,
    pub group: String,
    /// (topic this stage consumes, the source topic it retries).
    pub sources: Vec<(String, String)>,
    /// Retry stages honour `retry_topic-backoff-timestamp`; the main stage does not.
    pub waits_for_backoff: bool,
}

impl Stage {
    pub fn topics(&self) -> Vec<&str> {
        self.sources.iter().map(|(topic, _)| topic.as_str()).collect()
    }

    fn base_of<'a>(&'a self, topic: &'a str) -> &'a str {
        self.sources.iter().find(|(consumed, _)| consumed == topic).map_or(topic, |(_, base)| base.as_str())
    }
}

const EXCEPTION_HEADERS: [&str; 4] = [
    retry::EXCEPTION_FQCN,
    retry::EXCEPTION_CAUSE_FQCN,
    retry::EXCEPTION_MESSAGE,
    retry::EXCEPTION_STACKTRACE,
];

/// Milliseconds since the epoch, now.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as i64)
}

/// The record `record` becomes when attempt `failed` of consumer group `group` failed with
/// `failure` and it goes to `destination`: same key, payload (byte for byte) and partition
/// number; every header of `record` kept, every value in order; the `kafka_original-*` family
/// and the consumer group added on the first hop only; one more value of each exception and
/// `retry_topic-*` header (see the module's *Headers*).
pub fn forwarded(
    record: &OwnedMessage,
    group: &str,
    failure: &Failure,
    failed: u32,
    destination: &Destination,
    now_ms: i64,
) -> OutgoingRecord {
    let mut headers: Vec<(String, Vec<u8>)> = record
        .headers()
        .map(|original| {
            original
                .iter()
                .map(|header| (header.key.to_owned(), header.value.unwrap_or_default().to_vec()))
                .collect()
        })
        .unwrap_or_default();
    let has = |headers: &[(String, Vec<u8>)], name: &str| headers.iter().any(|(key, _)| key == name);
    crate::dead_letter::push_exception(&mut headers, failure, &EXCEPTION_HEADERS);
    let (timestamp, timestamp_type) = crate::dead_letter::original_timestamp(record);
    if !has(&headers, retry::ORIGINAL_TOPIC) {
        headers.push((retry::ORIGINAL_TOPIC.into(), record.topic().as_bytes().to_vec()));
        headers.push((retry::ORIGINAL_PARTITION.into(), encode_int(record.partition()).to_vec()));
        headers.push((retry::ORIGINAL_OFFSET.into(), encode_long(record.offset()).to_vec()));
        headers.push((retry::ORIGINAL_TIMESTAMP.into(), encode_long(timestamp).to_vec()));
        headers.push((retry::ORIGINAL_TIMESTAMP_TYPE.into(), timestamp_type.as_bytes().to_vec()));
    }
    if !has(&headers, retry::ORIGINAL_CONSUMER_GROUP) {
        headers.push((retry::ORIGINAL_CONSUMER_GROUP.into(), group.as_bytes().to_vec()));
    }
    // Spring: the original record's timestamp, carried down the chain (its last value)
    let original_timestamp = header(record, retry::ORIGINAL_TIMESTAMP_RETRY)
        .and_then(|value| decode_big_integer(value).ok())
        .unwrap_or(if timestamp >= 0 { timestamp } else { now_ms });
    let (topic, delay_ms) = match destination {
        Destination::Retry { topic, delay_ms, .. } => (topic, i64::from(*delay_ms)),
        Destination::DeadLetter { topic } => (topic, 0), // Spring's DLT delay: due at once
    };
    let attempts = i32::try_from(failed.saturating_add(1)).unwrap_or(i32::MAX);
    headers.push((retry::ORIGINAL_TIMESTAMP_RETRY.into(), encode_big_integer(original_timestamp)));
    headers.push((retry::ATTEMPTS.into(), encode_int(attempts).to_vec()));
    headers.push((retry::BACKOFF_TIMESTAMP.into(), encode_big_integer(now_ms + delay_ms)));
    OutgoingRecord {
        topic: topic.clone(),
        partition: Some(record.partition()),
        key: record.key().map(<[u8]>::to_vec),
        payload: record.payload().unwrap_or_default().to_vec(),
        headers,
    }
}

/// When `record` may be processed: its last `retry_topic-backoff-timestamp` (epoch ms; the
/// newest hop's), or now when it has none or an unreadable one.
pub fn due_at_ms(record: &OwnedMessage) -> Option<i64> {
    header(record, retry::BACKOFF_TIMESTAMP).and_then(|value| decode_big_integer(value).ok())
}

/// Limits of a stage's loop.
#[derive(Debug, Clone)]
pub struct StageOptions {
    /// Most records taken from the consumer at once.
    pub batch_records_max: usize,
    /// How long to keep filling a batch after its first record.
    pub batch_wait_max: Duration,
    /// Most attempts running at once.
    pub concurrency: usize,
    /// Pause between tries to forward records while the broker refuses them.
    pub forward_backoff: Duration,
}

impl Default for StageOptions {
    fn default() -> Self {
        Self {
            batch_records_max: 256,
            batch_wait_max: Duration::from_millis(5),
            concurrency: 64,
            forward_backoff: Duration::from_millis(500),
        }
    }
}

type PartitionKey = (String, i32);

/// Runs `stage` of `chain` on `consumer` (subscribed to the stage's topics) until `shutdown`;
/// forwards failures with `producer`. Returns after committing what was handled.
pub async fn run<A: Attempt>(
    consumer: Arc<KafkaConsumer>,
    attempt: Arc<A>,
    producer: Producer,
    chain: Chain,
    stage: Stage,
    options: StageOptions,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let mut runner = StageRunner {
        consumer: consumer.clone(),
        attempt,
        producer,
        chain,
        stage,
        options,
        held: BTreeMap::new(),
    };
    let result = runner.consume(&shutdown).await;
    crate::consumer::commit_stored(consumer).await?;
    result
}

struct StageRunner<A> {
    consumer: Arc<KafkaConsumer>,
    attempt: Arc<A>,
    producer: Producer,
    chain: Chain,
    stage: Stage,
    options: StageOptions,
    /// Paused partitions and the records received for them that are not due yet, in offset
    /// order.
    held: BTreeMap<PartitionKey, VecDeque<OwnedMessage>>,
}

impl<A: Attempt> StageRunner<A> {
    async fn consume(&mut self, shutdown: &CancellationToken) -> Result<(), Error> {
        loop {
            let wake = self.next_due().map(instant_of);
            let ready = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                _ = sleep_until_opt(wake), if wake.is_some() => self.take_due(),
                // only the first record is raced: once one is taken, the batch is filled to
                // the end (a dropped half-filled batch would lose the records it holds)
                first = crate::consumer::receive(&self.consumer) => {
                    let batch = crate::consumer::fill(&self.consumer, first?, self.options.batch_records_max, self.options.batch_wait_max).await?;
                    self.sort(batch)
                }
            };
            if ready.is_empty() {
                continue;
            }
            if !self.process(ready, shutdown).await {
                return Ok(()); // shut down before the forwards were acknowledged: redelivered
            }
        }
    }

    /// The earliest backoff timestamp among held records.
    fn next_due(&self) -> Option<i64> {
        self.held
            .values()
            .filter_map(|queue| queue.front())
            .map(|record| due_at_ms(record).unwrap_or(0))
            .min()
    }

    /// Splits a fresh batch into records to process now and records to hold (pausing their
    /// partitions).
    fn sort(&mut self, batch: Vec<OwnedMessage>) -> Vec<OwnedMessage> {
        let now = now_ms();
        let mut ready = Vec::with_capacity(batch.len());
        let mut to_pause = Vec::new();
        for record in batch {
            let key = (record.topic().to_owned(), record.partition());
            if let Some(queue) = self.held.get_mut(&key) {
                // a partition re-assigned after a rebalance starts again from its committed
                // offset, unpaused: a record already held is not held twice, and the
                // partition is paused again
                if queue.back().is_none_or(|last| last.offset() < record.offset()) {
                    queue.push_back(record);
                }
                if !to_pause.contains(&key) {
                    to_pause.push(key);
                }
                continue;
            }
            let due = if self.stage.waits_for_backoff { due_at_ms(&record) } else { None };
            match due {
                Some(due) if due > now => {
                    tracing::debug!(
                        topic = key.0,
                        partition = key.1,
                        offset = record.offset(),
                        wait_ms = due - now,
                        "record not due; partition paused"
                    );
                    to_pause.push(key.clone());
                    self.held.insert(key, VecDeque::from([record]));
                }
                _ => ready.push(record),
            }
        }
        if !to_pause.is_empty() {
            self.set_paused(&to_pause, true);
        }
        ready
    }

    /// Takes the held records that are due now, resuming every partition left with none.
    fn take_due(&mut self) -> Vec<OwnedMessage> {
        let now = now_ms();
        let assigned = self.consumer.assignment().ok();
        let mut ready = Vec::new();
        let mut to_resume = Vec::new();
        self.held.retain(|key, queue| {
            // a revoked partition's records are its new owner's: redelivered from the commit
            if let Some(assigned) = &assigned {
                if assigned.find_partition(&key.0, key.1).is_none() {
                    to_resume.push(key.clone()); // harmless if it is gone, needed if it came back
                    return false;
                }
            }
            while queue.front().is_some_and(|record| due_at_ms(record).unwrap_or(0) <= now) {
                ready.extend(queue.pop_front());
            }
            if queue.is_empty() {
                to_resume.push(key.clone());
                false
            } else {
                true
            }
        });
        if !to_resume.is_empty() {
            self.set_paused(&to_resume, false);
        }
        ready
    }

    fn set_paused(&self, partitions: &[PartitionKey], pause: bool) {
        let mut list = TopicPartitionList::with_capacity(partitions.len());
        for (topic, partition) in partitions {
            list.add_partition(topic, *partition);
        }
        let result = if pause { self.consumer.pause(&list) } else { self.consumer.resume(&list) };
        if let Err(error) = result {
            // revoked meanwhile: nothing to pause or resume any more
            tracing::info!(%error, pause, "pause/resume refused");
        }
    }

    /// Attempts every record of `ready`, forwards the failures, then stores the offsets.
    /// Returns false when shutdown came before the forwards were acknowledged.
    async fn process(&mut self, ready: Vec<OwnedMessage>, shutdown: &CancellationToken) -> bool {
        let limit = tokio::sync::Semaphore::new(self.options.concurrency.max(1));
        let attempt = &*self.attempt;
        let verdicts: Vec<Verdict> =
            futures::future::join_all(ready.iter().map(|record| attempt_limited(attempt, &limit, record)))
                .await;
        let now = now_ms();
        let mut forwards = Vec::new();
        for (record, verdict) in ready.iter().zip(verdicts) {
            let base = self.stage.base_of(record.topic()).to_owned();
            let (failure, destination) = match verdict {
                Verdict::Done => continue,
                Verdict::Retry(failure) => (failure, self.chain.after_failure(&base, self.stage.attempt)),
                Verdict::Reject(failure) => {
                    (failure, Destination::DeadLetter { topic: dead_letter_topic(&base) })
                }
            };
            forwards.push((record, failure, destination));
        }
        let records: Vec<OutgoingRecord> = forwards
            .iter()
            .map(|(record, failure, destination)| {
                forwarded(record, &self.stage.group, failure, self.stage.attempt, destination, now)
            })
            .collect();
        if !self.send_all(&records, shutdown).await {
            return false;
        }
        for ((record, failure, destination), _) in forwards.iter().zip(&records) {
            match destination {
                Destination::Retry { topic, attempt, .. } => {
                    metrics::counter!("retries_total", "topic" => record.topic().to_owned()).increment(1);
                    tracing::info!(
                        topic = record.topic(),
                        partition = record.partition(),
                        offset = record.offset(),
                        retry_topic = topic,
                        attempt,
                        reason = failure.message,
                        "attempt failed; forwarded to retry topic"
                    );
                }
                Destination::DeadLetter { topic } => {
                    metrics::counter!("dlt_mensagens_total", "topic" => topic.clone()).increment(1);
                    tracing::warn!(
                        topic = record.topic(),
                        partition = record.partition(),
                        offset = record.offset(),
                        dead_letter_topic = topic,
                        reason = failure.message,
                        "record sent to dead-letter topic"
                    );
                }
            }
        }
        crate::consumer::store_offsets(&self.consumer, &ready);
        true
    }

    /// Sends `records` until the broker acknowledged every one, or shutdown.
    async fn send_all(&self, records: &[OutgoingRecord], shutdown: &CancellationToken) -> bool {
        let mut pending: Vec<&OutgoingRecord> = records.iter().collect();
        while !pending.is_empty() {
            let results =
                futures::future::join_all(pending.iter().map(|record| self.producer.send(record))).await;
            let mut failed = Vec::new();
            for (record, result) in pending.into_iter().zip(results) {
                if let Err(error) = result {
                    tracing::warn!(error = %crate::consumer::error_chain(&error), topic = record.topic, "forward failed; retrying");
                    failed.push(record);
                }
            }
            pending = failed;
            if !pending.is_empty() {
                tokio::select! {
                    _ = shutdown.cancelled() => return false,
                    _ = tokio::time::sleep(self.options.forward_backoff) => {}
                }
            }
        }
        true
    }
}

/// One attempt, once `limit` has room for it.
async fn attempt_limited<A: Attempt>(
    attempt: &A,
    limit: &tokio::sync::Semaphore,
    record: &OwnedMessage,
) -> Verdict {
    // the semaphore lives as long as the batch and is never closed
    let _permit = limit.acquire().await.ok();
    attempt.attempt(record).await
}

/// The tokio instant of epoch-ms `due`.
fn instant_of(due: i64) -> tokio::time::Instant {
    let wait = (due - now_ms()).max(0) as u64;
    tokio::time::Instant::now() + Duration::from_millis(wait)
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use contracts::headers::{decode_int, decode_long, decode_text};
    use rdkafka::message::{Header, OwnedHeaders, Timestamp};

    fn chain() -> Chain {
        Chain { delays_ms: vec![1000, 2000, 4000] }
    }

    fn failure(message: &str) -> Failure {
        Failure {
            exception_fqcn: "notifications::webhook::Unavailable".into(),
            cause_fqcn: "http::status::StatusCode".into(),
            message: message.into(),
            stacktrace: message.into(),
        }
    }

    fn record(topic: &str, partition: i32, offset: i64, headers: Option<OwnedHeaders>) -> OwnedMessage {
        OwnedMessage::new(
            Some(br#"{"eventoId":"x"}"#.to_vec()),
            Some(b"CC-1".to_vec()),
            topic.into(),
            Timestamp::CreateTime(1_800_000_000_000),
            partition,
            offset,
            headers,
        )
    }

    fn value<'a>(record: &'a OutgoingRecord, name: &str) -> &'a [u8] {
        record.header_value(name).unwrap_or_else(|| panic!("header {name} missing"))
    }

    fn count(record: &OutgoingRecord, name: &str) -> usize {
        record.headers.iter().filter(|(key, _)| key == name).count()
    }

    #[test]
    fn four_attempts_then_the_dead_letter_topic() {
        let chain = chain();
        assert_eq!(chain.attempts(), 4);
        let base = "transferencias.liquidada";
        assert_eq!(
            chain.after_failure(base, 1),
            Destination::Retry { topic: format!("{base}-retry-1000"), attempt: 2, delay_ms: 1000 }
        );
        assert_eq!(
            chain.after_failure(base, 3),
            Destination::Retry { topic: format!("{base}-retry-4000"), attempt: 4, delay_ms: 4000 }
        );
        assert_eq!(chain.after_failure(base, 4), Destination::DeadLetter { topic: format!("{base}-dlt") });
    }

    #[test]
    fn stages_have_spring_group_names_and_map_back_to_the_source() {
        let stages = chain().stages(
            &["p.transferencias.liquidada".into(), "p.transferencias.rejeitada".into()],
            "p.notificacoes",
        );
        assert_eq!(stages.len(), 4);
        assert_eq!(stages[0].group, "p.notificacoes");
        assert!(!stages[0].waits_for_backoff);
        assert!(stages[1..].iter().all(|stage| stage.waits_for_backoff));
        assert_eq!(stages[2].group, "p.notificacoes-retry-2000");
        assert_eq!(stages[2].attempt, 3);
        assert_eq!(
            stages[2].topics(),
            vec!["p.transferencias.liquidada-retry-2000", "p.transferencias.rejeitada-retry-2000"]
        );
        assert_eq!(stages[2].base_of("p.transferencias.rejeitada-retry-2000"), "p.transferencias.rejeitada");
    }

    #[test]
    fn first_hop_writes_the_original_family_and_the_retry_headers() {
        let source = record("transferencias.liquidada", 5, 42, None);
        let destination = chain().after_failure("transferencias.liquidada", 1);
        let now = 1_900_000_000_000;
        let out = forwarded(&source, "notificacoes", &failure("503"), 1, &destination, now);
        assert_eq!(out.topic, "transferencias.liquidada-retry-1000");
        assert_eq!(out.partition, Some(5));
        assert_eq!(out.key.as_deref(), Some(&b"CC-1"[..]));
        assert_eq!(out.payload, br#"{"eventoId":"x"}"#);
        assert_eq!(decode_text(value(&out, "kafka_original-topic")), Ok("transferencias.liquidada"));
        assert_eq!(decode_int(value(&out, "kafka_original-partition")), Ok(5));
        assert_eq!(decode_long(value(&out, "kafka_original-offset")), Ok(42));
        assert_eq!(decode_long(value(&out, "kafka_original-timestamp")), Ok(1_800_000_000_000));
        assert_eq!(value(&out, "kafka_original-timestamp-type"), b"CreateTime");
        assert_eq!(value(&out, "kafka_dlt-original-consumer-group"), b"notificacoes");
        assert_eq!(value(&out, "kafka_exception-message"), b"503");
        assert_eq!(decode_int(value(&out, "retry_topic-attempts")), Ok(2));
        assert_eq!(decode_big_integer(value(&out, "retry_topic-backoff-timestamp")), Ok(now + 1000));
        assert_eq!(value(&out, "retry_topic-backoff-timestamp").len(), 6);
        assert_eq!(decode_big_integer(value(&out, "retry_topic-original-timestamp")), Ok(1_800_000_000_000));
    }

    /// `out` as the next stage receives it: `topic`, a new offset and timestamp.
    fn received(out: &OutgoingRecord, offset: i64, timestamp_ms: i64) -> OwnedMessage {
        OwnedMessage::new(
            Some(out.payload.clone()),
            out.key.clone(),
            out.topic.clone(),
            Timestamp::CreateTime(timestamp_ms),
            out.partition.unwrap_or(0), // a replay leaves it to the partitioner
            offset,
            Some(out.owned_headers()),
        )
    }

    fn ints(record: &OutgoingRecord, name: &str) -> Vec<i32> {
        record.header_values(name).into_iter().map(|value| decode_int(value).expect("int")).collect()
    }

    fn big_integers(record: &OutgoingRecord, name: &str) -> Vec<i64> {
        record.header_values(name).into_iter().map(|value| decode_big_integer(value).expect("big")).collect()
    }

    #[test]
    fn every_hop_appends_the_retry_and_exception_headers_and_keeps_the_original_once() {
        let base = "transferencias.liquidada";
        let failed_at = [1_900_000_000_000, 1_900_000_001_010, 1_900_000_003_020, 1_900_000_007_030];
        let groups =
            ["notificacoes", "notificacoes-retry-1000", "notificacoes-retry-2000", "notificacoes-retry-4000"];
        let mut current = record(base, 5, 42, None);
        let mut hops = Vec::new();
        for (index, (&now, group)) in failed_at.iter().zip(groups).enumerate() {
            let failed = index as u32 + 1;
            let destination = chain().after_failure(base, failed);
            let out =
                forwarded(&current, group, &failure(&format!("503 #{failed}")), failed, &destination, now);
            current = received(&out, 100 + index as i64, now + 5);
            hops.push(out);
        }
        let topics: Vec<&str> = hops.iter().map(|hop| hop.topic.as_str()).collect();
        assert_eq!(
            topics,
            [
                "transferencias.liquidada-retry-1000",
                "transferencias.liquidada-retry-2000",
                "transferencias.liquidada-retry-4000",
                "transferencias.liquidada-dlt"
            ]
        );
        // attempts: one value a hop, the last the attempt the record is on its way to; on
        // -dlt one past the fourth and last attempt, as Spring writes it
        assert_eq!(ints(&hops[0], "retry_topic-attempts"), [2]);
        assert_eq!(ints(&hops[1], "retry_topic-attempts"), [2, 3]);
        assert_eq!(ints(&hops[2], "retry_topic-attempts"), [2, 3, 4]);
        assert_eq!(ints(&hops[3], "retry_topic-attempts"), [2, 3, 4, 5]);
        // backoff: failure time + the destination's delay; + 0 for -dlt
        assert_eq!(
            big_integers(&hops[3], "retry_topic-backoff-timestamp"),
            [1_900_000_001_000, 1_900_000_003_010, 1_900_000_007_020, 1_900_000_007_030]
        );
        assert_eq!(big_integers(&hops[3], "retry_topic-original-timestamp"), [1_800_000_000_000; 4]);
        // the literal bytes of the last values on -dlt
        assert_eq!(hops[3].header_value("retry_topic-attempts"), Some(&[0u8, 0, 0, 5][..]));
        assert_eq!(
            hops[3].header_value("retry_topic-backoff-timestamp"),
            Some(&encode_big_integer(1_900_000_007_030)[..])
        );
        assert_eq!(hops[3].header_value("retry_topic-backoff-timestamp").map(<[u8]>::len), Some(6));
        // exception headers: one value a hop, the cause type included
        for name in EXCEPTION_HEADERS {
            assert_eq!(count(&hops[1], name), 2, "{name}");
            assert_eq!(count(&hops[3], name), 4, "{name}");
        }
        assert_eq!(value(&hops[3], "kafka_exception-message"), b"503 #4");
        assert_eq!(hops[3].header_values("kafka_exception-message")[0], b"503 #1");
        assert_eq!(value(&hops[3], "kafka_exception-cause-fqcn"), b"http::status::StatusCode");
        // the original family and the group: once, from the first hop
        for name in [
            "kafka_original-topic",
            "kafka_original-partition",
            "kafka_original-offset",
            "kafka_original-timestamp",
            "kafka_original-timestamp-type",
            "kafka_dlt-original-consumer-group",
        ] {
            assert_eq!(count(&hops[3], name), 1, "{name}");
        }
        assert_eq!(decode_long(value(&hops[3], "kafka_original-offset")), Ok(42));
        assert_eq!(value(&hops[3], "kafka_original-timestamp-type"), b"CreateTime");
        assert_eq!(value(&hops[3], "kafka_dlt-original-consumer-group"), b"notificacoes");
        assert!(hops.iter().all(|hop| hop.partition == Some(5)));
    }

    #[test]
    fn a_failure_no_retry_fixes_goes_to_the_dead_letter_topic_one_attempt_on() {
        let first = forwarded(
            &record("t", 0, 1, None),
            "g",
            &failure("503"),
            1,
            &chain().after_failure("t", 1),
            1_900_000_000_000,
        );
        // attempt 2 answers 400: straight to -dlt, attempts 3, backoff = now
        let reject = Destination::DeadLetter { topic: "t-dlt".into() };
        let out = forwarded(
            &received(&first, 9, 1_900_000_001_005),
            "g-retry-1000",
            &failure("400"),
            2,
            &reject,
            1_900_000_001_020,
        );
        assert_eq!(out.topic, "t-dlt");
        assert_eq!(ints(&out, "retry_topic-attempts"), [2, 3]);
        assert_eq!(
            big_integers(&out, "retry_topic-backoff-timestamp"),
            [1_900_000_001_000, 1_900_000_001_020]
        );
        // rejected by the main stage: attempts 2 and a backoff timestamp
        let at_once =
            forwarded(&record("t", 0, 1, None), "g", &failure("400"), 1, &reject, 1_900_000_000_000);
        assert_eq!(ints(&at_once, "retry_topic-attempts"), [2]);
        assert_eq!(big_integers(&at_once, "retry_topic-backoff-timestamp"), [1_900_000_000_000]);
    }

    #[test]
    fn a_dead_letter_redriven_to_a_retry_topic_is_due_at_once() {
        let now = now_ms();
        let mut current = record("t", 0, 1, None);
        for failed in 1..=4 {
            let out =
                forwarded(&current, "g", &failure("503"), failed, &chain().after_failure("t", failed), now);
            current = received(&out, i64::from(failed), now);
        }
        assert_eq!(current.topic(), "t-dlt");
        // `pagamentos dlt replay --to t-retry-1000` copies every header, in order
        let replayed = crate::dlt::replay_record("t-dlt", &current, "t-retry-1000");
        let on_retry = received(&replayed, 0, now + 10);
        let due = due_at_ms(&on_retry).expect("a backoff timestamp");
        assert!(due <= now, "due {} ms after it was dead-lettered", due - now);
        // the first value (1 s after the first failure) would hold it back
        assert_eq!(
            decode_big_integer(replayed.header_values("retry_topic-backoff-timestamp")[0]),
            Ok(now + 1000)
        );
    }

    #[test]
    fn due_time_comes_from_the_backoff_header() {
        let headers = OwnedHeaders::new().insert(Header {
            key: "retry_topic-backoff-timestamp",
            value: Some(&encode_big_integer(1_900_000_001_000)),
        });
        assert_eq!(due_at_ms(&record("t-retry-1000", 0, 0, Some(headers))), Some(1_900_000_001_000));
        assert_eq!(due_at_ms(&record("t-retry-1000", 0, 0, None)), None);
        let garbage = OwnedHeaders::new()
            .insert(Header { key: "retry_topic-backoff-timestamp", value: Some(&[1u8; 9][..]) });
        assert_eq!(due_at_ms(&record("t-retry-1000", 0, 0, Some(garbage))), None);
        // two hops' values: the last one decides (Spring's lastHeader)
        let two = OwnedHeaders::new()
            .insert(Header {
                key: "retry_topic-backoff-timestamp",
                value: Some(&encode_big_integer(1_900_000_001_000)),
            })
            .insert(Header {
                key: "retry_topic-backoff-timestamp",
                value: Some(&encode_big_integer(1_900_000_003_000)),
            });
        assert_eq!(due_at_ms(&record("t-retry-2000", 0, 0, Some(two))), Some(1_900_000_003_000));
    }
}
