//! Non-blocking retries through retry topics, as Spring Kafka's retry topics do them
//! (`docs/reference/contract.md` §3): a record whose attempt failed is forwarded to `<topic>-retry-<ms>` and
//! the consumer goes on with the next one, so one failing record never stalls the others.
//!
//! A [`Chain`] is a main stage (attempt 1 on the source topics) and one stage per delay
//! (attempt 2, 3, …), each a consumer group of its own. After the last attempt, or at once for
//! a failure that no retry can fix, the record goes to `<topic>-dlt`.
//!
//! Each stage is a [`Handler`] on the one consumer runtime ([`crate::consumer`]), which owns
//! polling, pausing, revocations, offsets and shutdown. A retry stage never processes a record
//! before its `retry_topic-backoff-timestamp` (the last value): it answers
//! [`ConsumerVerdict::NotBefore`] for it, and the runtime holds it, and the rest of its
//! partition, **pausing only that partition** until it is due; every other partition and
//! topic keeps flowing and the consumer keeps being polled. Held records are not committed: a
//! shutdown, a crash or a revoked partition redelivers them. The records that are due are
//! attempted concurrently; each failure becomes a [`ConsumerVerdict::Forward`] to the next
//! retry topic or to `-dlt`, and the runtime stores its offset only after the broker
//! acknowledged the forward (`acks=all`).
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

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use rdkafka::message::{Headers, Message, OwnedMessage};
use tokio_util::sync::CancellationToken;

use contracts::headers::{decode_big_integer, encode_big_integer, encode_int, encode_long, retry};
use contracts::topics::{dead_letter_topic, retry_topic};

use crate::consumer::{
    header, Backoff, Forward, ForwardKind, Handler, KafkaConsumer, LoopOptions, Verdict as ConsumerVerdict,
};
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

/// Limits of a stage.
#[derive(Debug, Clone)]
pub struct StageOptions {
    /// Most records taken from the consumer at once.
    pub batch_records_max: usize,
    /// How long to keep filling a batch after its first record.
    pub batch_wait_max: Duration,
    /// Most attempts running at once.
    pub concurrency: usize,
    /// Pauses between tries to forward records while the broker refuses them.
    pub forward_backoff: Backoff,
}

impl Default for StageOptions {
    fn default() -> Self {
        Self {
            batch_records_max: 256,
            batch_wait_max: Duration::from_millis(5),
            concurrency: 64,
            forward_backoff: Backoff::default(),
        }
    }
}

/// Runs `stage` of `chain` on `consumer` (subscribed to the stage's topics) until `shutdown`,
/// on the one consumer runtime ([`crate::consumer::run`]); forwards failures with `producer`.
/// Returns after committing what was handled.
pub async fn run<A: Attempt>(
    consumer: Arc<KafkaConsumer>,
    attempt: Arc<A>,
    producer: Producer,
    chain: Chain,
    stage: Stage,
    options: StageOptions,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let loop_options = LoopOptions {
        batch_records_max: options.batch_records_max,
        batch_wait_max: options.batch_wait_max,
        backoff: options.forward_backoff,
        forwards: Some(producer),
        ..LoopOptions::default()
    };
    let handler = StageHandler { attempt, chain, stage, concurrency: options.concurrency.max(1) };
    crate::consumer::run(consumer, handler, loop_options, shutdown).await
}

/// One stage as a [`Handler`]: a record not due yet is [`ConsumerVerdict::NotBefore`] (the
/// runtime holds it with only its partition paused), the others are attempted concurrently
/// and each failure becomes a [`ConsumerVerdict::Forward`] down the chain (the runtime stores
/// the offset once the broker acknowledged the forward).
struct StageHandler<A> {
    attempt: Arc<A>,
    chain: Chain,
    stage: Stage,
    /// Most attempts running at once.
    concurrency: usize,
}

impl<A: Attempt> Handler for StageHandler<A> {
    type Error = std::convert::Infallible;

    async fn handle(
        &mut self,
        batch: &[OwnedMessage],
        _retrying: bool,
    ) -> Result<Vec<ConsumerVerdict>, Self::Error> {
        let (now, now_instant) = (now_ms(), tokio::time::Instant::now());
        let mut verdicts: Vec<Option<ConsumerVerdict>> = vec![None; batch.len()];
        // partitions whose next record is not due: the rest of the partition waits behind it
        let mut waiting: Vec<((&str, i32), tokio::time::Instant)> = Vec::new();
        let mut due_now = Vec::with_capacity(batch.len());
        for (index, record) in batch.iter().enumerate() {
            let key = (record.topic(), record.partition());
            if let Some((_, at)) = waiting.iter().find(|(waiting, _)| *waiting == key) {
                verdicts[index] = Some(ConsumerVerdict::NotBefore(*at));
                continue;
            }
            let due = if self.stage.waits_for_backoff { due_at_ms(record) } else { None };
            match due {
                Some(due) if due > now => {
                    // never earlier than the wall clock reaches `due` (`now` is rounded down)
                    let at = now_instant + Duration::from_millis((due - now) as u64);
                    waiting.push((key, at));
                    verdicts[index] = Some(ConsumerVerdict::NotBefore(at));
                }
                _ => due_now.push(index),
            }
        }
        let attempt = &*self.attempt;
        // at most `concurrency` attempts at once, each slot refilled as soon as any one ends
        let outcomes: Vec<(usize, Verdict)> = futures::stream::iter(due_now)
            .map(|index| async move { (index, attempt.attempt(&batch[index]).await) })
            .buffer_unordered(self.concurrency)
            .collect()
            .await;
        let failed_at = now_ms();
        for (index, outcome) in outcomes {
            let record = &batch[index];
            let base = self.stage.base_of(record.topic());
            let (failure, destination) = match outcome {
                Verdict::Done => {
                    verdicts[index] = Some(ConsumerVerdict::Done);
                    continue;
                }
                Verdict::Retry(failure) => (failure, self.chain.after_failure(base, self.stage.attempt)),
                Verdict::Reject(failure) => {
                    (failure, Destination::DeadLetter { topic: dead_letter_topic(base) })
                }
            };
            let kind = match destination {
                Destination::Retry { .. } => ForwardKind::Retry,
                Destination::DeadLetter { .. } => ForwardKind::DeadLetter,
            };
            let forward =
                forwarded(record, &self.stage.group, &failure, self.stage.attempt, &destination, failed_at);
            verdicts[index] =
                Some(ConsumerVerdict::Forward(Forward { record: forward, kind, reason: failure.message }));
        }
        Ok(verdicts.into_iter().map(|verdict| verdict.expect("a verdict for every record")).collect())
    }
}
#[cfg(test)]
mod tests;
