//! Non-blocking retries through retry topics, as Spring Kafka's retry topics do them
//! (`CONTRACT.md` §3): a record whose attempt failed is forwarded to `<topic>-retry-<ms>` and
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

    /// Counts the attempts running at once; offset 0 takes 100 ms, the others 10 ms; odd
    /// offsets fail.
    #[derive(Default)]
    struct Timed {
        running: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
    }

    impl Attempt for Timed {
        fn attempt(&self, record: &OwnedMessage) -> impl Future<Output = Verdict> + Send {
            use std::sync::atomic::Ordering::SeqCst;
            let offset = record.offset();
            async move {
                let now = self.running.fetch_add(1, SeqCst) + 1;
                self.most.fetch_max(now, SeqCst);
                tokio::time::sleep(Duration::from_millis(if offset == 0 { 100 } else { 10 })).await;
                self.running.fetch_sub(1, SeqCst);
                if offset % 2 == 1 {
                    Verdict::Retry(failure("503"))
                } else {
                    Verdict::Done
                }
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_run_at_most_concurrency_at_once_and_a_slow_one_holds_only_its_slot() {
        let attempt = Arc::new(Timed::default());
        let stage = chain().stages(&["t".into()], "g").remove(0);
        let mut handler = StageHandler { attempt: attempt.clone(), chain: chain(), stage, concurrency: 2 };
        let batch: Vec<OwnedMessage> = (0..5).map(|offset| record("t", 0, offset, None)).collect();
        let started = tokio::time::Instant::now();
        let verdicts = handler.handle(&batch, false).await.expect("infallible");
        // offset 0 holds one slot for 100 ms; the other slot runs offsets 1–4 one after the other
        assert_eq!(started.elapsed(), Duration::from_millis(100));
        assert_eq!(attempt.most.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(verdicts.len(), 5);
        for (offset, verdict) in verdicts.iter().enumerate() {
            match verdict {
                ConsumerVerdict::Done => assert_eq!(offset % 2, 0, "offset {offset}"),
                ConsumerVerdict::Forward(forward) => {
                    assert_eq!(offset % 2, 1, "offset {offset}");
                    assert_eq!(forward.record.topic, "t-retry-1000");
                }
                other => panic!("offset {offset}: {other:?}"),
            }
        }
    }
}
