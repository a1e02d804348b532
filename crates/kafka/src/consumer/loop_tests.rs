//! The loop itself on tokio's paused clock, against an in-memory broker ([`Broker`]): records
//! not yet due, forwards, shutdowns and revocations, to the millisecond and without a broker.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage, Timestamp};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::io::{Io, Route};
use super::{consume, Forward, ForwardKind, Handler, LoopOptions, Verdict};
use crate::context::Revocations;
use crate::producer::{OutgoingRecord, Producer};
use crate::Error;

mod invariants;

type Key = (String, i32);

/// One topic `t` in memory: what librdkafka's consumer does that the loop relies on (paused
/// partitions deliver nothing and resume after the last record handed out, stores are refused
/// for partitions not assigned, a partition assigned again starts at its stored offset).
#[derive(Default)]
pub(super) struct Broker {
    state: Mutex<State>,
    changed: tokio::sync::Notify,
    pub(super) revocations: Revocations,
}

#[derive(Default)]
struct State {
    logs: BTreeMap<Key, Vec<OwnedMessage>>,
    assigned: BTreeSet<Key>,
    /// The next offset to hand out, per partition that handed out any.
    position: BTreeMap<Key, i64>,
    paused: BTreeSet<Key>,
    stored: BTreeMap<Key, i64>,
    published: Vec<(OutgoingRecord, Route, Instant)>,
    /// How many publishes are refused before they are acknowledged again.
    refuse_publishes: usize,
    /// A revocation keeps the partition's position (librdkafka's window between an unassign
    /// and the old fetcher's stop, when the partition is assigned again at once).
    revoke_keeps_position: bool,
}

fn key(partition: i32) -> Key {
    ("t".to_owned(), partition)
}

impl Broker {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("broker state")
    }

    /// Appends a record with `payload` to partition `partition` (assigned to the consumer).
    pub(super) fn produce(&self, partition: i32, payload: &str) {
        let mut state = self.lock();
        let log = state.logs.entry(key(partition)).or_default();
        let offset = log.len() as i64;
        log.push(OwnedMessage::new(
            Some(payload.as_bytes().to_vec()),
            None,
            "t".into(),
            Timestamp::CreateTime(0),
            partition,
            offset,
            None,
        ));
        state.assigned.insert(key(partition));
        drop(state);
        self.changed.notify_waiters();
    }

    /// A rebalance takes `partition` away (the context unpauses it and ticks the revocations).
    pub(super) fn revoke(&self, partition: i32) {
        let mut state = self.lock();
        state.assigned.remove(&key(partition));
        state.paused.remove(&key(partition));
        if !state.revoke_keeps_position {
            state.position.remove(&key(partition));
        }
        let mut revoked = TopicPartitionList::new();
        revoked.add_partition("t", partition);
        self.revocations.record(&revoked);
    }

    /// A rebalance gives `partition` back: fetched anew from its stored offset.
    pub(super) fn assign(&self, partition: i32) {
        self.lock().assigned.insert(key(partition));
        self.changed.notify_waiters();
    }

    pub(super) fn stored(&self, partition: i32) -> Option<i64> {
        self.lock().stored.get(&key(partition)).copied()
    }

    fn paused(&self, partition: i32) -> bool {
        self.lock().paused.contains(&key(partition))
    }

    fn published(&self) -> Vec<(OutgoingRecord, Route, Instant)> {
        self.lock().published.clone()
    }

    /// The next record of an assigned partition that is not paused.
    pub(super) fn take(&self) -> Option<OwnedMessage> {
        let mut state = self.lock();
        let State { logs, assigned, position, paused, stored, .. } = &mut *state;
        for (key, log) in logs.iter() {
            if !assigned.contains(key) || paused.contains(key) {
                continue;
            }
            let next = *position.get(key).unwrap_or(&stored.get(key).copied().unwrap_or(0));
            if let Some(record) = log.get(next as usize) {
                position.insert(key.clone(), next + 1);
                return Some(record.clone());
            }
        }
        None
    }
}

impl Io for Broker {
    async fn receive(&self) -> Result<OwnedMessage, Error> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(record) = self.take() {
                return Ok(record);
            }
            changed.await;
        }
    }

    fn revocations(&self) -> &Revocations {
        &self.revocations
    }

    fn group(&self) -> &str {
        "loop-tests"
    }

    fn pause(&self, topic: &str, partition: i32) -> bool {
        let key = (topic.to_owned(), partition);
        let mut state = self.lock();
        if !state.assigned.contains(&key) {
            return false;
        }
        state.paused.insert(key);
        true
    }

    fn resume(&self, partitions: &[(String, i32)]) {
        let mut state = self.lock();
        for key in partitions {
            state.paused.remove(key);
        }
        drop(state);
        self.changed.notify_waiters();
    }

    fn positions(&self) -> Vec<(String, i32, i64)> {
        let state = self.lock();
        state
            .position
            .iter()
            .filter(|(key, _)| state.assigned.contains(*key))
            .map(|((topic, partition), offset)| (topic.clone(), *partition, *offset))
            .collect()
    }

    fn store(&self, offsets: &TopicPartitionList) {
        let mut state = self.lock();
        for element in offsets.elements() {
            let key = (element.topic().to_owned(), element.partition());
            // librdkafka refuses to store for a partition that is not assigned
            if let (true, Offset::Offset(offset)) = (state.assigned.contains(&key), element.offset()) {
                state.stored.insert(key, offset);
            }
        }
    }

    async fn publish(&self, record: &OutgoingRecord, route: Route) -> Result<(), Error> {
        let mut state = self.lock();
        if state.refuse_publishes > 0 {
            state.refuse_publishes -= 1;
            let source = KafkaError::MessageProduction(RDKafkaErrorCode::BrokerTransportFailure);
            return Err(Error::Produce { topic: record.topic.clone(), source });
        }
        state.published.push((record.clone(), route, Instant::now()));
        Ok(())
    }
}

/// Handles records by their payload: `due=<ms>` is due that long after `start` (done from
/// then on), `forward` is forwarded to `out`, `revoke` is done but its partition is revoked
/// while it is handled, `fail=<n>` fails (a blocking retry) the first n times it is handled.
/// Records behind a not-due one of their partition are not touched.
struct Script {
    start: Instant,
    broker: Arc<Broker>,
    /// (partition, offset, when) of every record handled.
    handled: Arc<Mutex<Vec<(i32, i64, Duration)>>>,
    /// Failures so far per (partition, offset) of `fail=<n>` records.
    failed: BTreeMap<(i32, i64), u32>,
}

impl Handler for Script {
    type Error = Infallible;

    async fn handle(&mut self, batch: &[OwnedMessage], _retrying: bool) -> Result<Vec<Verdict>, Infallible> {
        let now = Instant::now();
        let mut waiting: BTreeMap<i32, Instant> = BTreeMap::new();
        let mut verdicts = Vec::new();
        for record in batch {
            if let Some(due) = waiting.get(&record.partition()) {
                verdicts.push(Verdict::NotBefore(*due));
                continue;
            }
            let payload = std::str::from_utf8(record.payload().unwrap_or_default()).expect("utf-8");
            if let Some(times) = payload.strip_prefix("fail=") {
                let failed = self.failed.entry((record.partition(), record.offset())).or_default();
                if *failed < times.parse::<u32>().expect("times") {
                    *failed += 1;
                    let error = std::io::Error::other("failed");
                    verdicts.push(Verdict::Retry(crate::dead_letter::Failure::new("Test", "Test", &error)));
                    return Ok(verdicts); // the records after it are handed again
                }
            }
            if let Some(ms) = payload.strip_prefix("due=") {
                let due = self.start + Duration::from_millis(ms.parse().expect("ms"));
                if now < due {
                    waiting.insert(record.partition(), due);
                    verdicts.push(Verdict::NotBefore(due));
                    continue;
                }
            }
            self.handled.lock().expect("handled").push((
                record.partition(),
                record.offset(),
                now - self.start,
            ));
            verdicts.push(match payload {
                "forward" | "revoke" => {
                    if payload == "revoke" {
                        self.broker.revoke(record.partition());
                    }
                    Verdict::Forward(Forward {
                        record: OutgoingRecord::new("out", "k", record.offset().to_string()),
                        kind: ForwardKind::Retry,
                        reason: "test".into(),
                    })
                }
                _ => Verdict::Done,
            });
        }
        Ok(verdicts)
    }
}

struct Running {
    start: Instant,
    broker: Arc<Broker>,
    handled: Arc<Mutex<Vec<(i32, i64, Duration)>>>,
    shutdown: CancellationToken,
    run: tokio::task::JoinHandle<Result<(), Error>>,
}

impl Running {
    /// The loop on `broker`, started now; forwards go out through a producer that is never
    /// used (the in-memory broker publishes them).
    fn start(broker: Broker) -> Self {
        let start = Instant::now();
        let broker = Arc::new(broker);
        let handled = Arc::new(Mutex::new(Vec::new()));
        let shutdown = CancellationToken::new();
        let mut handler =
            Script { start, broker: broker.clone(), handled: handled.clone(), failed: BTreeMap::new() };
        let options = LoopOptions {
            batch_wait_max: Duration::ZERO,
            forwards: Some(unused_producer()),
            ..LoopOptions::default()
        };
        let run = tokio::spawn({
            let (broker, shutdown) = (broker.clone(), shutdown.clone());
            async move { consume(&*broker, &mut handler, &options, &shutdown).await }
        });
        Self { start, broker, handled, shutdown, run }
    }

    /// Lets the clock run to `ms` after the start (the loop does all it can at each instant).
    async fn at(&self, ms: u64) {
        tokio::time::sleep_until(self.start + Duration::from_millis(ms)).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    fn handled(&self) -> Vec<(i32, i64, u64)> {
        let handled = self.handled.lock().expect("handled");
        handled.iter().map(|(partition, offset, at)| (*partition, *offset, at.as_millis() as u64)).collect()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.run.await.expect("loop task").expect("loop");
    }
}

fn unused_producer() -> Producer {
    let config =
        crate::config::producer_config(&crate::KafkaArgs::new("127.0.0.1:1"), "test", Duration::ZERO);
    Producer::new(&config).expect("producer")
}

#[tokio::test(start_paused = true)]
async fn a_record_not_due_waits_with_only_its_partition_paused() {
    let broker = Broker::default();
    broker.produce(0, "due=4000");
    broker.produce(0, "due=0");
    broker.produce(1, "due=0");
    let running = Running::start(broker);
    running.at(0).await;
    assert_eq!(running.handled(), [(1, 0, 0)], "partition 1 flows at once");
    assert!(running.broker.paused(0), "the partition of the record not due is paused");
    assert!(!running.broker.paused(1));

    // the consumer keeps being polled: partition 1 goes on while partition 0 waits
    running.at(1_000).await;
    running.broker.produce(1, "due=0");
    running.broker.produce(0, "due=0");
    running.at(1_000).await;
    assert_eq!(running.handled(), [(1, 0, 0), (1, 1, 1_000)]);
    running.at(3_999).await;
    assert_eq!(running.handled().len(), 2, "a record handled before it was due");
    assert_eq!(running.broker.stored(0), None, "offsets of held records stored (the idle store?)");
    assert_eq!(running.broker.stored(1), Some(2));

    // due: it and the records behind it, in order, at that instant; then the partition resumes
    running.at(4_000).await;
    assert_eq!(running.handled()[2..], [(0, 0, 4_000), (0, 1, 4_000), (0, 2, 4_000)]);
    assert!(!running.broker.paused(0));
    assert_eq!(running.broker.stored(0), Some(3));
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_while_records_are_held_stores_nothing_of_them() {
    let broker = Broker::default();
    broker.produce(0, "due=0");
    broker.produce(0, "due=10000");
    broker.produce(1, "due=0");
    let running = Running::start(broker);
    running.at(1_000).await;
    let broker = running.broker.clone();
    let stopped_at = Instant::now();
    running.stop().await;
    assert_eq!(stopped_at.elapsed(), Duration::ZERO, "the shutdown waited for the held record");
    assert_eq!(broker.stored(0), Some(1), "the record before the held one is stored, not the held one");
    assert_eq!(broker.stored(1), Some(1));
}

#[tokio::test(start_paused = true)]
async fn a_forward_counts_as_handled_only_once_the_broker_acknowledged_it() {
    let broker = Broker::default();
    broker.lock().refuse_publishes = 2;
    broker.produce(0, "forward");
    let running = Running::start(broker);
    running.at(0).await;
    assert_eq!(running.handled(), [(0, 0, 0)]);
    assert_eq!(running.broker.stored(0), None, "stored before the forward was acknowledged");
    // refused twice: retried after 500 ms, then 1 s, polling meanwhile
    running.at(100).await;
    running.broker.produce(1, "due=0");
    running.at(1_499).await;
    assert!(running.broker.published().is_empty());
    assert_eq!(running.broker.stored(0), None, "stored before the forward was acknowledged");
    assert_eq!(running.handled().len(), 1, "handled a record while a forward was unacknowledged");
    running.at(1_500).await;
    let published = running.broker.published();
    assert_eq!(published.len(), 1);
    assert_eq!((published[0].0.topic.as_str(), published[0].1), ("out", Route::Forwards));
    assert_eq!(published[0].2 - running.start, Duration::from_millis(1_500));
    assert_eq!(running.broker.stored(0), Some(1));
    // the record taken during the wait comes next
    assert_eq!(running.handled(), [(0, 0, 0), (1, 0, 1_500)]);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_before_a_forward_was_acknowledged_stores_nothing() {
    let broker = Broker::default();
    broker.lock().refuse_publishes = usize::MAX;
    broker.produce(0, "forward");
    let running = Running::start(broker);
    running.at(2_000).await;
    let broker = running.broker.clone();
    running.stop().await;
    assert!(broker.published().is_empty());
    assert_eq!(broker.stored(0), None);
}

#[tokio::test(start_paused = true)]
async fn held_records_of_a_revoked_partition_are_not_handled_here() {
    let broker = Broker::default();
    broker.produce(0, "due=4000");
    let running = Running::start(broker);
    running.at(1_000).await;
    // a rebalance gives the partition to another member, which handles the record
    running.broker.revoke(0);
    running.at(5_000).await;
    assert!(
        running.handled().is_empty(),
        "a record of a revoked partition was handled: {:?}",
        running.handled()
    );
    assert_eq!(running.broker.stored(0), None);
    // it comes back: fetched anew from the committed offset, due by now
    running.broker.assign(0);
    running.at(5_000).await;
    assert_eq!(running.handled(), [(0, 0, 5_000)]);
    assert_eq!(running.broker.stored(0), Some(1));
    running.stop().await;
}

/// A record in its retries is dropped when its partition is revoked: the record handed first
/// after it starts its own retries from the first, not from where the dropped one had got to
/// (with that count it would be dead-lettered after one retry; here, with no dead-letter
/// publisher, the loop would stop).
#[tokio::test(start_paused = true)]
async fn a_record_first_after_a_revoked_one_in_its_retries_gets_all_its_own_retries() {
    let broker = Broker::default();
    broker.produce(0, "fail=99");
    broker.produce(1, "fail=2");
    let running = Running::start(broker);
    // partition 0's record fails at 0, then its retries at 0.5, 1.5, 3.5 and 7.5 s; the fifth
    // would come at 15.5 s
    running.at(10_000).await;
    assert!(running.handled().is_empty());
    running.broker.revoke(0);
    // at 15.5 s partition 1's record fails (1st), its retries at 16 s (fails) and 17 s
    running.at(17_000).await;
    assert_eq!(running.handled(), [(1, 0, 17_000)], "handled after two retries of its own");
    assert_eq!(running.broker.stored(1), Some(1));
    assert_eq!(running.broker.stored(0), None);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_partition_revoked_while_its_records_were_handled_gets_nothing_published_or_stored() {
    let broker = Broker::default();
    broker.produce(0, "revoke");
    broker.produce(1, "forward");
    let running = Running::start(broker);
    running.at(1_000).await;
    assert_eq!(running.handled(), [(0, 0, 0), (1, 0, 0)]);
    let published = running.broker.published();
    assert_eq!(published.len(), 1, "the forward of the revoked partition's record was published");
    assert_eq!(published[0].0.payload, b"0", "partition 1's forward");
    assert_eq!(running.broker.stored(0), None);
    assert_eq!(running.broker.stored(1), Some(1));
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_partition_revoked_while_its_forward_waits_for_the_broker_gets_nothing_published_or_stored() {
    let broker = Broker::default();
    broker.lock().refuse_publishes = 2; // the first try of both forwards
    broker.produce(0, "forward");
    broker.produce(1, "forward");
    let running = Running::start(broker);
    running.at(100).await;
    // served while the loop polls during its backoff: partition 0 goes to another member
    running.broker.revoke(0);
    running.at(1_000).await;
    let published: Vec<Vec<u8>> =
        running.broker.published().into_iter().map(|(record, ..)| record.payload).collect();
    assert_eq!(published, [b"0".to_vec()], "only partition 1's forward (its record's offset is 0 too)");
    assert_eq!(running.broker.published()[0].2 - running.start, Duration::from_millis(500));
    assert_eq!(running.broker.stored(0), None);
    assert_eq!(running.broker.stored(1), Some(1));
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_partition_revoked_and_assigned_back_while_its_forward_waits_loses_nothing() {
    let broker = Broker::default();
    broker.lock().refuse_publishes = 1;
    broker.produce(0, "forward");
    let running = Running::start(broker);
    // revoked and assigned back during the backoff: fetched anew from its committed offset
    running.at(100).await;
    running.broker.revoke(0);
    running.broker.assign(0);
    running.at(2_000).await;
    // the first copy's forward is dropped; the copy fetched again is handled and forwarded
    assert_eq!(running.handled(), [(0, 0, 0), (0, 0, 500)]);
    let published = running.broker.published();
    assert_eq!(published.len(), 1, "forwarded {} times", published.len());
    assert_eq!(published[0].2 - running.start, Duration::from_millis(500));
    assert_eq!(running.broker.stored(0), Some(1));
    running.stop().await;
}
