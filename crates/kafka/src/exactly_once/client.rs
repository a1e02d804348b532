//! [`Client`] over librdkafka: the project's consumer (its rebalance callback counts
//! revocations in [`crate::context::Revocations`]) and a [`TransactionalProducer`].
//!
//! librdkafka's blocking calls (committed offsets, watermarks, seeks) run on tokio's blocking
//! pool, as the transactional calls do ([`crate::transactional`]).

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::OwnedMessage;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::{Bounds, Client, Committed, Partition, Recovery, TxnError};
use crate::consumer::KafkaConsumer;
use crate::metadata::{offsets_at, End};
use crate::producer::OutgoingRecord;
use crate::transactional::{TransactionalProducer, CALL_TIMEOUT};
use crate::Error;

/// The consumer and the transactional producer of one exactly-once loop.
pub struct LibrdkafkaClient {
    consumer: Arc<KafkaConsumer>,
    producer_config: ClientConfig,
    producer: Option<TransactionalProducer>,
}

impl std::fmt::Debug for LibrdkafkaClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LibrdkafkaClient")
            .field("group", &self.consumer.context().group())
            .finish_non_exhaustive()
    }
}

impl LibrdkafkaClient {
    /// `consumer` must be subscribed with [`crate::config::OffsetCommit::InTransaction`];
    /// `producer_config` must carry the instance's stable `transactional.id`.
    pub fn new(consumer: Arc<KafkaConsumer>, producer_config: ClientConfig) -> Self {
        Self { consumer, producer_config, producer: None }
    }

    fn producer(&self) -> Result<&TransactionalProducer, TxnError> {
        self.producer.as_ref().ok_or_else(|| TxnError {
            recovery: Recovery::NewProducer,
            source: Error::Fatal("no transactional producer registered".into()),
        })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        operation: &'static str,
        call: impl FnOnce(&KafkaConsumer) -> Result<T, KafkaError> + Send + 'static,
    ) -> Result<T, Error> {
        let consumer = self.consumer.clone();
        tokio::task::spawn_blocking(move || call(&consumer))
            .await?
            .map_err(|source| Error::Consumer { operation, source })
    }
}

/// What a failed transactional call leaves the producer able to do, by librdkafka's own
/// classification of the error.
fn recovery(error: &Error) -> Recovery {
    match error {
        Error::TransactionStuck { .. } | Error::Transaction { fatal: true, .. } => Recovery::NewProducer,
        Error::Transaction { source: KafkaError::Transaction(error), .. } if error.txn_requires_abort() => {
            Recovery::Abort
        }
        Error::Transaction { source: KafkaError::Transaction(error), .. } if error.is_retriable() => {
            Recovery::Retry
        }
        _ => Recovery::Abort,
    }
}

fn txn(error: Error) -> TxnError {
    TxnError { recovery: recovery(&error), source: error }
}

/// One element of librdkafka's answer to a committed-offsets request: its own error (an
/// unstable offset commit it stopped waiting for, an authorization refusal) is kept, never
/// read as "nothing committed".
fn committed_of(
    element: &rdkafka::topic_partition_list::TopicPartitionListElem<'_>,
) -> (Partition, Committed) {
    let partition = Partition::new(element.topic(), element.partition());
    let offset = match element.error() {
        Err(source) => Err(Error::Consumer { operation: "committed", source }),
        Ok(()) => Ok(match element.offset() {
            Offset::Offset(offset) => Some(offset),
            _ => None,
        }),
    };
    (partition, offset)
}

fn list(positions: impl IntoIterator<Item = (Partition, Offset)>) -> Result<TopicPartitionList, KafkaError> {
    let mut list = TopicPartitionList::new();
    for (partition, offset) in positions {
        list.add_partition_offset(&partition.topic, partition.partition, offset)?;
    }
    Ok(list)
}

/// Lets go of a producer on the blocking pool: the last handle's drop destroys the librdkafka
/// client, which waits for its threads and outstanding requests (for a fenced producer that
/// can take long) and must not stall a runtime worker.
fn discard(producer: TransactionalProducer) {
    tokio::task::spawn_blocking(move || drop(producer));
}

impl Client for LibrdkafkaClient {
    fn group(&self) -> &str {
        self.consumer.context().group()
    }

    async fn receive(&mut self) -> Result<OwnedMessage, Error> {
        let revocations = self.consumer.context().revocations.clone();
        loop {
            tokio::select! {
                biased;
                why = revocations.wait_refused() => {
                    tracing::error!(reason = why, "librdkafka refused a rebalance: the loop stops (a fresh member recovers)");
                    return Err(Error::Fatal(why.into()));
                }
                received = self.consumer.recv() => match received {
                    Ok(message) => return Ok(message.detach()),
                    Err(error) if matches!(error.rdkafka_error_code(), Some(rdkafka::types::RDKafkaErrorCode::Fatal)) => {
                        return Err(Error::Consumer { operation: "receive", source: error });
                    }
                    Err(error) => {
                        tracing::warn!(%error, "consumer error; continuing");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
    }

    fn rebalances(&self) -> u64 {
        self.consumer.context().revocations.now()
    }

    async fn begin(&mut self) -> Result<(), TxnError> {
        if self.producer.is_none() {
            self.renew().await.map_err(|source| TxnError { recovery: Recovery::NewProducer, source })?;
        }
        // begin fails only when the producer is in a state no abort leaves
        self.producer()?.begin().await.map_err(|source| TxnError { recovery: Recovery::NewProducer, source })
    }

    async fn send(&mut self, records: &[OutgoingRecord]) -> Result<(), TxnError> {
        let producer = self.producer()?;
        futures::future::try_join_all(records.iter().map(|record| producer.send(record)))
            .await
            .map(|_| ())
            .map_err(|source| TxnError { recovery: Recovery::Abort, source })
    }

    async fn send_offsets(&mut self, next: &[(Partition, i64)]) -> Result<(), TxnError> {
        // read right before sending: under KIP-848 the member epoch changes without a
        // rebalance callback, and stale metadata fences spuriously
        let group = self.consumer.group_metadata().ok_or_else(|| TxnError {
            recovery: Recovery::Abort,
            source: Error::Fatal("the consumer has no group metadata (not in a group yet)".into()),
        })?;
        let offsets =
            list(next.iter().map(|(partition, offset)| (partition.clone(), Offset::Offset(*offset))))
                .map_err(|source| TxnError {
                    recovery: Recovery::Abort,
                    source: Error::Consumer { operation: "offsets", source },
                })?;
        self.producer()?.send_offsets(offsets, group).await.map_err(txn)
    }

    async fn commit(&mut self) -> Result<(), TxnError> {
        self.producer()?.commit().await.map_err(txn)
    }

    async fn abort(&mut self) -> Result<(), TxnError> {
        let producer = self.producer()?;
        match producer.abort().await {
            Ok(()) => Ok(()),
            // a failed abort leaves nothing to retry it on: a new producer settles it
            Err(source) => Err(TxnError { recovery: Recovery::NewProducer, source }),
        }
    }

    async fn renew(&mut self) -> Result<(), Error> {
        if let Some(old) = self.producer.take() {
            discard(old);
        }
        let producer = TransactionalProducer::new(&self.producer_config)?;
        if let Err(error) = producer.init().await {
            discard(producer);
            return Err(error);
        }
        self.producer = Some(producer);
        Ok(())
    }

    fn assignment(&mut self) -> Result<Vec<Partition>, Error> {
        let assigned = self
            .consumer
            .assignment()
            .map_err(|source| Error::Consumer { operation: "assignment", source })?;
        Ok(assigned
            .elements()
            .iter()
            .map(|element| Partition::new(element.topic(), element.partition()))
            .collect())
    }

    async fn committed(&mut self, partitions: &[Partition]) -> Result<Vec<(Partition, Committed)>, Error> {
        let asked = list(partitions.iter().map(|partition| (partition.clone(), Offset::Invalid)))
            .map_err(|source| Error::Consumer { operation: "committed", source })?;
        // librdkafka asks with require_stable when isolation.level is read_committed (ours)
        let committed = self
            .blocking("committed", move |consumer| consumer.committed_offsets(asked, CALL_TIMEOUT))
            .await?;
        Ok(committed.elements().iter().map(committed_of).collect())
    }

    async fn bounds(&mut self, partitions: &[Partition]) -> Result<Vec<(Partition, Bounds)>, Error> {
        let asked: Vec<(String, i32)> =
            partitions.iter().map(|partition| (partition.topic.clone(), partition.partition)).collect();
        let (starts, ends) = self
            .blocking("bounds", move |consumer| {
                // one ListOffsets per partition leader for each bound, every partition at once
                let starts = offsets_at(consumer, &asked, End::Start, CALL_TIMEOUT)?;
                let ends = offsets_at(consumer, &asked, End::Last, CALL_TIMEOUT)?;
                Ok((starts, ends))
            })
            .await?;
        partitions
            .iter()
            .map(|partition| {
                let key = (partition.topic.clone(), partition.partition);
                match (starts.get(&key), ends.get(&key)) {
                    (Some(&start), Some(&end)) => Ok((partition.clone(), Bounds { start, end })),
                    _ => Err(Error::Fatal(format!("no log bounds returned for {partition}").into())),
                }
            })
            .collect()
    }

    async fn seek(&mut self, positions: &[(Partition, i64)]) -> Result<(), Error> {
        let to =
            list(positions.iter().map(|(partition, offset)| (partition.clone(), Offset::Offset(*offset))))
                .map_err(|source| Error::Consumer { operation: "seek", source })?;
        let sought =
            self.blocking("seek", move |consumer| consumer.seek_partitions(to, CALL_TIMEOUT)).await?;
        for element in sought.elements() {
            element.error().map_err(|source| Error::Consumer { operation: "seek", source })?;
        }
        Ok(())
    }
}
