//! What the loop asks of Kafka, behind a seam: [`KafkaIo`] (a librdkafka consumer and the
//! producers of the loop's outputs) in production, an in-memory broker in the unit tests, so
//! they run the loop itself on tokio's paused clock.

use std::future::Future;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::OwnedMessage;
use rdkafka::{Offset, TopicPartitionList};

use crate::context::Revocations;
use crate::producer::{OutgoingRecord, Producer};
use crate::Error;

use super::KafkaConsumer;

/// Which producer publishes an output of the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// [`super::LoopOptions::dead_letters`]'s.
    DeadLetters,
    /// [`super::LoopOptions::forwards`].
    Forwards,
}

/// The consumer and producers under the loop.
pub(crate) trait Io: Sync {
    /// The next record; transient client errors are logged and waited out. Cancel-safe: a
    /// record is taken from the consumer only when this returns it.
    fn receive(&self) -> impl Future<Output = Result<OwnedMessage, Error>> + Send;

    /// The consumer's revocation clock ([`Revocations`]).
    fn revocations(&self) -> &Revocations;

    /// The consumer's group id: the `group` label of `kafka_batch_handling_seconds`.
    fn group(&self) -> &str;

    /// Pauses one partition; `false` when refused (revoked meanwhile).
    fn pause(&self, topic: &str, partition: i32) -> bool;

    /// Resumes `partitions`.
    fn resume(&self, partitions: &[(String, i32)]);

    /// Per assigned partition that has handed out records: the offset after the last one.
    fn positions(&self) -> Vec<(String, i32, i64)>;

    /// Stores `offsets` for the next commit (librdkafka commits stored offsets in the
    /// background). A partition revoked meanwhile is refused, which is right: its records are
    /// its new owner's.
    fn store(&self, offsets: &TopicPartitionList);

    /// Publishes `record` through `route` and waits for the broker's acknowledgement.
    fn publish(
        &self,
        record: &OutgoingRecord,
        route: Route,
    ) -> impl Future<Output = Result<(), Error>> + Send;
}

/// A librdkafka consumer and the producers of the loop's outputs.
pub(crate) struct KafkaIo<'a> {
    pub consumer: &'a KafkaConsumer,
    pub dead_letters: Option<&'a Producer>,
    pub forwards: Option<&'a Producer>,
}

impl Io for KafkaIo<'_> {
    async fn receive(&self) -> Result<OwnedMessage, Error> {
        loop {
            match self.consumer.recv().await {
                Ok(message) => return Ok(message.detach()),
                Err(error) if is_fatal(&error) => {
                    return Err(Error::Consumer { operation: "receive", source: error })
                }
                Err(error) => {
                    tracing::warn!(%error, "consumer error; continuing");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn revocations(&self) -> &Revocations {
        &self.consumer.context().revocations
    }

    fn group(&self) -> &str {
        self.consumer.context().group()
    }

    fn pause(&self, topic: &str, partition: i32) -> bool {
        let mut list = TopicPartitionList::with_capacity(1);
        list.add_partition(topic, partition);
        match self.consumer.pause(&list) {
            Ok(()) => true,
            Err(error) => {
                tracing::info!(%error, topic, partition, "pause refused (revoked meanwhile?)");
                false
            }
        }
    }

    fn resume(&self, partitions: &[(String, i32)]) {
        if partitions.is_empty() {
            return;
        }
        let mut list = TopicPartitionList::with_capacity(partitions.len());
        for (topic, partition) in partitions {
            list.add_partition(topic, *partition);
        }
        if let Err(error) = self.consumer.resume(&list) {
            tracing::info!(%error, "resume refused");
        }
    }

    fn positions(&self) -> Vec<(String, i32, i64)> {
        let Ok(position) = self.consumer.position() else { return Vec::new() };
        position
            .elements()
            .iter()
            .filter_map(|element| match element.offset() {
                Offset::Offset(offset) => Some((element.topic().to_owned(), element.partition(), offset)),
                _ => None,
            })
            .collect()
    }

    fn store(&self, offsets: &TopicPartitionList) {
        if offsets.count() == 0 {
            return;
        }
        if let Err(error) = self.consumer.store_offsets(offsets) {
            tracing::info!(%error, "offsets not stored (partitions revoked?)");
        }
    }

    async fn publish(&self, record: &OutgoingRecord, route: Route) -> Result<(), Error> {
        let producer = match route {
            Route::DeadLetters => self.dead_letters,
            Route::Forwards => self.forwards,
        };
        // the loop checks for the producer before it publishes anything
        let producer = producer.ok_or_else(|| Error::Fatal(format!("no producer for {route:?}").into()))?;
        producer.send(record).await.map(|_| ())
    }
}

fn is_fatal(error: &KafkaError) -> bool {
    matches!(error.rdkafka_error_code(), Some(rdkafka::types::RDKafkaErrorCode::Fatal))
}
