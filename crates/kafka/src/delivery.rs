//! The librdkafka producer under [`crate::producer::Producer`] and
//! [`crate::transactional::TransactionalProducer`], with its delivery reports served by a thread
//! that sleeps until librdkafka queues one.
//!
//! rdkafka's `FutureProducer` serves them from a thread of its own that polls in rounds of
//! 100 ms, and every round ends in a busy loop: its poll keeps asking librdkafka to wait for
//! the time left in whole milliseconds, and once less than one millisecond is left that rounds
//! down to "do not wait", so the thread spins on the clock for the rest of the round (0.99 ms
//! in every 100, about 1 % of a core per producer, idle or not). The five producers of
//! `pagamentos all` burned 4.5 % of a core that way with nothing to do: three quarters of the
//! idle process.
//!
//! Here librdkafka calls back (`rd_kafka_queue_cb_event_enable`, from its own thread, under the
//! queue's lock) when an event lands on the producer's empty event queue; the callback only
//! wakes this producer's thread, which serves every event queued, one non-blocking poll each,
//! and sleeps again. A delivery report reaches its sender as soon as before, the thread costs
//! nothing between reports, and a wake-up missed for any reason is made up within
//! [`IDLE_CHECK`]. The queue and the callback are [`crate::ffi::ProducerEvents`]'s (this module
//! has no `unsafe` of its own).

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::client::Client;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::Message as _;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer as _, ProducerContext};
use rdkafka::ClientConfig;
use tokio::sync::oneshot;

use crate::context::Context;
use crate::ffi::{OnEvent, ProducerEvents};
use crate::producer::{Delivered, OutgoingRecord};

/// How long the delivery thread sleeps at most without a wake-up: a safety net only.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// How long a send waits before trying again when librdkafka's local queue is full
/// (`queue.buffering.max.messages`): the queue drains at the broker's pace.
const QUEUE_FULL_PAUSE: Duration = Duration::from_millis(10);

/// Where the delivery report of one record goes.
pub type DeliverySender = oneshot::Sender<Result<Delivered, KafkaError>>;

impl ProducerContext for Context {
    type DeliveryOpaque = Box<DeliverySender>;

    fn delivery(&self, result: &DeliveryResult<'_>, sender: Self::DeliveryOpaque) {
        let report = match result {
            Ok(message) => Ok(Delivered { partition: message.partition(), offset: message.offset() }),
            Err((error, _message)) => Err(error.clone()),
        };
        // the sender may have stopped waiting (a cancelled send): nothing to tell
        let _ = sender.send(report);
    }
}

/// A librdkafka producer ([`BaseProducer`] with [`Context`]) and the thread serving its events.
/// Cheap to clone: clones share the producer; the last one to go stops the thread and
/// destroys the producer (purging what it still holds, as rdkafka's drop does).
#[derive(Clone)]
pub struct ServedProducer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ServedProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedProducer").finish_non_exhaustive()
    }
}

struct Shared {
    /// The producer, its event queue (librdkafka's main queue) and the callback that wakes the
    /// thread; shared with the thread, so the last of the two to go releases them.
    events: Arc<ProducerEvents<Wake>>,
    thread: Option<JoinHandle<()>>,
}

struct Wake {
    state: Mutex<WakeState>,
    changed: Condvar,
    /// [`IDLE_CHECK`], or longer in tests that prove the wake-ups alone serve every report.
    idle_check: Duration,
}

#[derive(Default)]
struct WakeState {
    /// An event was queued since the thread last looked (a permit: a wake-up given while
    /// the thread is busy is not lost).
    queued: bool,
    stop: bool,
}

impl Wake {
    fn notify(&self, stop: bool) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.queued = true;
        state.stop |= stop;
        drop(state);
        self.changed.notify_one();
    }

    /// Waits for a wake-up (or `idle_check`); `false` once told to stop.
    fn wait(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (mut state, _timed_out) = self
            .changed
            .wait_timeout_while(state, self.idle_check, |state| !state.queued && !state.stop)
            .unwrap_or_else(PoisonError::into_inner);
        state.queued = false;
        !state.stop
    }
}

/// librdkafka's callback, from one of its threads and under the queue's lock, when an event
/// lands on the empty queue: it only wakes the thread (no librdkafka call, no panic:
/// `notify` takes a poisoned lock as it is).
impl OnEvent for Wake {
    fn queued(&self) {
        self.notify(false);
    }
}

impl ServedProducer {
    /// Creates the producer (through [`crate::context::create`]) and its delivery thread.
    pub fn new(config: &ClientConfig) -> KafkaResult<Self> {
        Self::with_idle_check(config, IDLE_CHECK)
    }

    fn with_idle_check(config: &ClientConfig, idle_check: Duration) -> KafkaResult<Self> {
        let producer: Arc<BaseProducer<Context>> = Arc::new(crate::context::create(config)?);
        let wake = Arc::new(Wake { state: Mutex::default(), changed: Condvar::new(), idle_check });
        // should the thread not start, dropping `events` switches the callback off again
        let events = Arc::new(ProducerEvents::new(producer, wake)?);
        let served = events.clone();
        let name = config.get("client.id").unwrap_or("producer");
        let thread = std::thread::Builder::new()
            .name(format!("kafka-dr-{name}").chars().take(15).collect())
            .spawn(move || serve(&served))
            .map_err(|error| KafkaError::ClientCreation(format!("delivery thread: {error}")))?;
        Ok(Self { shared: Arc::new(Shared { events, thread: Some(thread) }) })
    }

    /// The rdkafka producer, for what this type does not wrap (transactions, metadata).
    pub fn base(&self) -> &BaseProducer<Context> {
        self.shared.events.producer()
    }

    pub fn client(&self) -> &Client<Context> {
        self.base().client()
    }

    /// Queues `record` and waits for its delivery report: where the broker stored it, or
    /// why it could not. A full local queue is waited out, never turned into an error.
    pub async fn send(&self, record: &OutgoingRecord) -> Result<Delivered, KafkaError> {
        let (sender, report) = oneshot::channel();
        let mut base = BaseRecord::with_opaque_to(&record.topic, Box::new(sender))
            .payload(record.payload.as_slice())
            .headers(record.owned_headers());
        if let Some(key) = &record.key {
            base = base.key(key.as_slice());
        }
        if let Some(partition) = record.partition {
            base = base.partition(partition);
        }
        loop {
            match self.base().send(base) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                    base = returned;
                    tokio::time::sleep(QUEUE_FULL_PAUSE).await;
                }
                Err((error, _returned)) => return Err(error),
            }
        }
        // librdkafka reports every record it took, even one purged when the producer is
        // destroyed; a sender dropped without a report would be a bug, not a delivery
        report.await.unwrap_or_else(|_| Err(KafkaError::MessageProduction(RDKafkaErrorCode::Fail)))
    }
}

/// The delivery thread: every event queued is served (one non-blocking poll each: rdkafka's
/// poll with no time left takes one event and returns), then it sleeps until the next.
fn serve(events: &ProducerEvents<Wake>) {
    while events.on_event().wait() {
        while events.len() > 0 {
            events.producer().poll(Duration::ZERO);
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.events.on_event().notify(true);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("a producer's delivery thread panicked");
            }
        }
        // `events` goes next, its last holder now that the thread is joined: the callback is
        // switched off, the queue released, then the producer: rdkafka's drop purges what is
        // still queued or in flight and serves those reports (every waiting send learns it
        // failed) before destroying it
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::mocking::MockCluster;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    use super::*;
    use crate::config::producer_config;
    use crate::KafkaArgs;

    /// With no safety net to speak of: a report the wake-ups miss hangs its send.
    fn producer(
        cluster: &MockCluster<'_, rdkafka::producer::DefaultProducerContext>,
        client_id: &str,
    ) -> ServedProducer {
        let args = KafkaArgs::new(cluster.bootstrap_servers());
        let config = producer_config(&args, client_id, Duration::ZERO);
        ServedProducer::with_idle_check(&config, Duration::from_secs(3600)).expect("producer")
    }

    /// Far longer than a mock cluster takes on any machine: past it, a report was left unserved.
    async fn served<T>(send: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(60), send).await.expect("a delivery report was never served")
    }

    fn threads_named(name: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .expect("/proc/self/task")
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim_end() == name)
            .count()
    }

    /// Thousands of reports arrive in bursts while the thread is busy serving earlier ones:
    /// each must reach its own sender (a report left on the queue would hang its send).
    #[tokio::test]
    async fn every_report_reaches_its_own_sender() {
        let cluster = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("pagamentos", 3, 1).expect("topic");
        let producer = producer(&cluster, "reports");
        let records: Vec<OutgoingRecord> = (0..3000)
            .map(|n| {
                let mut record = OutgoingRecord::new("pagamentos", format!("CC-{n}"), format!("{n}"));
                record.partition = Some(n % 3);
                record
            })
            .collect();
        let delivered =
            served(futures::future::join_all(records.iter().map(|record| producer.send(record)))).await;
        let mut offsets = [Vec::new(), Vec::new(), Vec::new()];
        for (record, delivered) in records.iter().zip(delivered) {
            let delivered = delivered.expect("delivered");
            assert_eq!(Some(delivered.partition), record.partition, "the report of its own record");
            offsets[delivered.partition as usize].push(delivered.offset);
        }
        for offsets in &mut offsets {
            offsets.sort_unstable();
            assert_eq!(
                *offsets,
                (0..1000).collect::<Vec<i64>>(),
                "one report per record, each its own offset"
            );
        }
        // after a quiet spell the next report still wakes the thread
        let late = OutgoingRecord::new("pagamentos", "CC-late", "late");
        served(producer.send(&late)).await.expect("delivered after the burst");
    }

    #[tokio::test]
    async fn a_record_the_broker_refuses_fails_its_send() {
        let cluster = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("pagamentos", 1, 1).expect("topic");
        let producer = producer(&cluster, "refused");
        cluster.request_errors(
            RDKafkaApiKey::Produce,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED],
        );
        let error = served(producer.send(&OutgoingRecord::new("pagamentos", "CC-001", "{}")))
            .await
            .expect_err("a refused record is not delivered");
        assert_eq!(error.rdkafka_error_code(), Some(RDKafkaErrorCode::TopicAuthorizationFailed), "{error}");
    }

    #[tokio::test]
    async fn the_last_clone_to_go_stops_the_delivery_thread() {
        let cluster = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("pagamentos", 1, 1).expect("topic");
        let producer = producer(&cluster, "lastclone");
        // a thread names itself once it runs
        let started = std::time::Instant::now();
        while threads_named("kafka-dr-lastcl") == 0 && started.elapsed() < Duration::from_secs(60) {
            tokio::task::yield_now().await;
        }
        assert_eq!(threads_named("kafka-dr-lastcl"), 1, "one delivery thread per producer");
        let clone = producer.clone();
        assert_eq!(threads_named("kafka-dr-lastcl"), 1, "clones share it");
        served(clone.send(&OutgoingRecord::new("pagamentos", "CC-001", "{}"))).await.expect("delivered");
        drop(producer);
        assert_eq!(threads_named("kafka-dr-lastcl"), 1, "a clone still uses it");
        drop(clone);
        assert_eq!(threads_named("kafka-dr-lastcl"), 0, "joined when the last clone went");
    }
}
