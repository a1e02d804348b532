//! The transactional producer: records and consumed offsets committed atomically (KIP-447).
//!
//! librdkafka's transactional calls block their thread for up to the timeout, so each runs on
//! tokio's blocking pool: on 2 cores a blocked runtime worker halves the service.

use std::time::Duration;

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, Producer as _};
use rdkafka::{ClientConfig, TopicPartitionList};

use crate::context::Context;
use crate::delivery::ServedProducer;
use crate::producer::{Delivered, OutgoingRecord};
use crate::Error;

/// How long one transactional call may block.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a transactional call is waited for before it is declared stuck
/// ([`Error::TransactionStuck`]): its own timeout and a margin.
pub const STUCK_AFTER: Duration = Duration::from_secs(35);

// a call given CALL_TIMEOUT must be able to time out on its own before it counts as stuck
const _: () = assert!(CALL_TIMEOUT.as_millis() < STUCK_AFTER.as_millis());

/// Waits until librdkafka counts nothing outstanding (`rd_kafka_outq_len`), at most `timeout`;
/// returns what is left of `timeout`.
///
/// rdkafka's `commit_transaction` flushes first, and its flush, finding anything outstanding,
/// polls for a fixed 100 ms (its poll runs to the deadline even after an event). A delivery
/// report whose future has already woken the caller still counts until librdkafka has freed it,
/// so committing right after the last acknowledgement took that 100 ms on ~2 % of
/// transactions (measured at 200 transfers/s). Outstanding reports clear within microseconds:
/// waiting for them here leaves the flush nothing to wait for.
fn drained(producer: &BaseProducer<Context>, timeout: Duration) -> Duration {
    let deadline = std::time::Instant::now() + timeout;
    let mut pause = Duration::from_micros(50);
    while producer.in_flight_count() > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
    deadline.saturating_duration_since(std::time::Instant::now())
}

/// A producer with a `transactional.id`. Create it, then [`init`](Self::init) once; a fenced
/// or otherwise fatal error means: drop it and create a new one.
#[derive(Clone)]
pub struct TransactionalProducer {
    inner: ServedProducer,
}

impl std::fmt::Debug for TransactionalProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionalProducer").finish_non_exhaustive()
    }
}

fn transaction_error(operation: &'static str, source: KafkaError) -> Error {
    let fatal = match &source {
        KafkaError::Transaction(error) => error.is_fatal(),
        _ => false,
    } || matches!(
        source.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
        )
    );
    Error::Transaction { operation, fatal, source }
}

impl TransactionalProducer {
    /// Creates the client; `config` must carry a `transactional.id`.
    pub fn new(config: &ClientConfig) -> Result<Self, Error> {
        let inner = ServedProducer::new(config).map_err(Error::Config)?;
        Ok(Self { inner })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        operation: &'static str,
        call: impl FnOnce(&BaseProducer<Context>) -> Result<T, KafkaError> + Send + 'static,
    ) -> Result<T, Error> {
        let inner = self.inner.clone();
        // the blocking thread of a stuck call stays blocked until the producer is fenced or
        // destroyed; the caller is free to recreate the producer meanwhile
        match tokio::time::timeout(STUCK_AFTER, tokio::task::spawn_blocking(move || call(inner.base()))).await
        {
            Ok(joined) => joined?.map_err(|source| transaction_error(operation, source)),
            Err(_elapsed) => Err(Error::TransactionStuck { operation, waited: STUCK_AFTER }),
        }
    }

    /// Registers the `transactional.id` with the coordinator, fencing any older instance with
    /// the same id and aborting its open transaction.
    pub async fn init(&self) -> Result<(), Error> {
        self.blocking("init", |producer| producer.init_transactions(CALL_TIMEOUT)).await
    }

    pub async fn begin(&self) -> Result<(), Error> {
        self.blocking("begin", |producer| producer.begin_transaction()).await
    }

    /// Sends `record` inside the open transaction and waits for its acknowledgement.
    pub async fn send(&self, record: &OutgoingRecord) -> Result<Delivered, Error> {
        self.inner.send(record).await.map_err(|source| Error::Produce { topic: record.topic.clone(), source })
    }

    /// Adds the consumed `offsets` (next offset to read, per partition) to the transaction.
    /// `group` must be read from the consumer right before this call: under KIP-848 the member
    /// epoch changes without a rebalance callback, and stale metadata fences spuriously.
    pub async fn send_offsets(
        &self,
        offsets: TopicPartitionList,
        group: ConsumerGroupMetadata,
    ) -> Result<(), Error> {
        self.blocking("send_offsets", move |producer| {
            producer.send_offsets_to_transaction(&offsets, &group, CALL_TIMEOUT)
        })
        .await
    }

    /// Commits the open transaction once every record sent in it is acknowledged; the wait
    /// and the commit share one [`CALL_TIMEOUT`], so the call still ends before [`STUCK_AFTER`].
    pub async fn commit(&self) -> Result<(), Error> {
        self.blocking("commit", |producer| {
            let left = drained(producer, CALL_TIMEOUT);
            producer.commit_transaction(left)
        })
        .await
    }

    pub async fn abort(&self) -> Result<(), Error> {
        self.blocking("abort", |producer| producer.abort_transaction(CALL_TIMEOUT)).await
    }
}
