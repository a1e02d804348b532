//! [`Client`] over Confluent's pure-Rust client (`confluent-kafka`, a translation of the Java
//! client): a KIP-848 consumer and a transactional `KafkaProducer`, which speaks version 2 of
//! the transaction protocol (KIP-890) to a broker that offers it. Under evaluation against
//! [`super::LibrdkafkaClient`] (issue #45, docs/architecture.md "Kafka clients").
//!
//! What the Java client's model gives the loop, read in the crate's source (1.0.0):
//! - rebalance callbacks run only inside `poll` (`process_background_events`, on the caller's
//!   task), and a KIP-848 member keeps a partition to be revoked until its callback has run:
//!   partitions cannot move to another member while the loop holds a batch without polling;
//! - `poll` is cancel-safe: a dropped call returns nothing and moves no position;
//! - `committed` asks with `require_stable` (KIP-447) whatever the isolation level;
//! - after a timed-out `commit_transaction` the same call may be made again and resumes.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use confluent_kafka::common::header::{Header as _, RecordHeader, RecordHeaders};
use confluent_kafka::common::serialization::{ByteArrayDeserializer, ByteArraySerializer};
use confluent_kafka::common::TopicPartition;
use confluent_kafka::consumer::{
    Consumer as _, ConsumerConfig, ConsumerRebalanceListener, ConsumerRecord, KafkaConsumer,
    OffsetAndMetadata,
};
use confluent_kafka::producer::{KafkaProducer, Producer as _, ProducerConfig, ProducerRecord};
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};

use super::{Bounds, Client, Committed, Partition, Recovery, TxnError};
use crate::config::{
    GroupProtocol, KafkaArgs, SecurityProtocol, CONNECTION_SETUP_TIMEOUT, METADATA_REFRESH_INTERVAL,
    RECONNECT_BACKOFF_MAX, SOCKET_TIMEOUT, TRANSACTION_RETRY_BACKOFF, TRANSACTION_TIMEOUT,
};
use crate::producer::OutgoingRecord;
use crate::Error;

type Bytes = Vec<u8>;

/// How long one `poll` waits for records before the loop polls again.
const POLL_TIMEOUT: Duration = Duration::from_millis(500);

/// The properties (Java's names) of the consumer and the transactional producer of one
/// exactly-once loop, with the settings [`crate::config`] gives librdkafka's.
#[derive(Debug, Clone)]
pub struct ConfluentConfig {
    pub consumer: HashMap<String, String>,
    pub producer: HashMap<String, String>,
}

impl ConfluentConfig {
    /// Refuses what the client cannot do here: the classic group protocol (it has only
    /// KIP-848) and any transport but plaintext (the evaluation runs on the local stack).
    pub fn new(
        args: &KafkaArgs,
        client_id: &str,
        group_id: &str,
        transactional_id: &str,
        linger: Duration,
    ) -> Result<Self, Error> {
        if args.group_protocol == GroupProtocol::Classic {
            return Err(Error::Fatal(
                "confluent-kafka speaks only the KIP-848 consumer group protocol: set KAFKA_GROUP_PROTOCOL=consumer".into(),
            ));
        }
        if args.security.protocol != SecurityProtocol::Plaintext {
            return Err(Error::Fatal(
                "the confluent-kafka client is evaluated on a plaintext broker only: set KAFKA_SECURITY_PROTOCOL=plaintext or use the librdkafka client".into(),
            ));
        }
        let common = |map: &mut HashMap<String, String>| {
            let mut set = |key: &str, value: String| {
                map.insert(key.to_owned(), value);
            };
            set("bootstrap.servers", args.bootstrap_servers.clone());
            set("client.id", client_id.to_owned());
            set("socket.connection.setup.timeout.ms", CONNECTION_SETUP_TIMEOUT.as_millis().to_string());
            set("reconnect.backoff.max.ms", RECONNECT_BACKOFF_MAX.as_millis().to_string());
            // librdkafka's socket.timeout.ms and topic.metadata.refresh.interval.ms (config.rs
            // says why)
            set("request.timeout.ms", SOCKET_TIMEOUT.as_millis().to_string());
            set("metadata.max.age.ms", METADATA_REFRESH_INTERVAL.as_millis().to_string());
        };
        let mut consumer = HashMap::new();
        common(&mut consumer);
        for (key, value) in [
            ("group.id", group_id),
            ("group.protocol", "consumer"),
            ("auto.offset.reset", "earliest"),
            ("isolation.level", "read_committed"),
            ("enable.auto.commit", "false"),
        ] {
            consumer.insert(key.to_owned(), value.to_owned());
        }
        let mut producer = HashMap::new();
        common(&mut producer);
        for (key, value) in [
            ("transactional.id", transactional_id.to_owned()),
            ("transaction.timeout.ms", TRANSACTION_TIMEOUT.as_millis().to_string()),
            ("delivery.timeout.ms", TRANSACTION_TIMEOUT.as_millis().to_string()),
            ("acks", "all".to_owned()),
            ("enable.idempotence", "true".to_owned()),
            ("compression.type", "zstd".to_owned()),
            ("linger.ms", linger.as_millis().to_string()),
            // the client's default is librdkafka's CRC-32; Java's murmur2 puts a key on the
            // partition every other producer of the contract puts it on
            ("partitioner.type", ProducerConfig::MURMUR2_RANDOM_PARTITIONER.to_owned()),
            ("retry.backoff.ms", TRANSACTION_RETRY_BACKOFF.as_millis().to_string()),
        ] {
            producer.insert(key.to_owned(), value);
        }
        Ok(Self { consumer, producer })
    }
}

/// Counts the rebalances that take partitions away, and remembers which (run inside `poll`).
#[derive(Debug, Default)]
struct Rebalances {
    tick: AtomicU64,
    taken: Mutex<Vec<Partition>>,
}

impl Rebalances {
    fn taken_away(&self, partitions: &[TopicPartition]) {
        if partitions.is_empty() {
            return;
        }
        let mut taken = self.taken.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        taken.extend(partitions.iter().map(partition_of));
        self.tick.fetch_add(1, Ordering::SeqCst);
    }
}

#[derive(Debug)]
struct Listener(Arc<Rebalances>);

#[async_trait::async_trait]
impl ConsumerRebalanceListener for Listener {
    async fn on_partitions_revoked(
        &self,
        partitions: &[TopicPartition],
    ) -> Result<(), confluent_kafka::common::Error> {
        tracing::info!(partitions = ?partitions, "partitions revoked");
        self.0.taken_away(partitions);
        Ok(())
    }

    async fn on_partitions_assigned(
        &self,
        partitions: &[TopicPartition],
    ) -> Result<(), confluent_kafka::common::Error> {
        tracing::info!(partitions = ?partitions, "partitions assigned");
        Ok(())
    }

    async fn on_partitions_lost(
        &self,
        partitions: &[TopicPartition],
    ) -> Result<(), confluent_kafka::common::Error> {
        tracing::warn!(partitions = ?partitions, "partitions lost");
        self.0.taken_away(partitions);
        Ok(())
    }
}

/// The consumer and the transactional producer of one exactly-once loop, on confluent-kafka.
pub struct ConfluentClient {
    group: String,
    consumer: KafkaConsumer<Bytes, Bytes>,
    /// Records `poll` returned that the loop has not taken yet.
    buffered: VecDeque<OwnedMessage>,
    rebalances: Arc<Rebalances>,
    producer_config: HashMap<String, String>,
    producer: Option<KafkaProducer<Bytes, Bytes>>,
}

impl std::fmt::Debug for ConfluentClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfluentClient").field("group", &self.group).finish_non_exhaustive()
    }
}

fn call(operation: &'static str) -> impl FnOnce(confluent_kafka::common::Error) -> Error {
    move |source| Error::Confluent { operation, source }
}

/// What a failed transactional call leaves the producer able to do, by the Java client's
/// contract (`KafkaProducer#commitTransaction`'s documentation): a timeout may be retried with
/// the same call; a fenced producer, an epoch or sequence it lost, an authorization or a
/// version it lacks, or a producer in a state no call leaves, cannot go on; anything else is
/// aborted.
fn recovery(error: &confluent_kafka::common::Error) -> Recovery {
    if error.is_producer_fenced_error()
        || error.is_invalid_producer_epoch_error()
        || error.is_out_of_order_sequence_error()
        || error.is_application_recoverable_error()
        || error.is_authorization_error()
        || error.is_authentication_error()
        || error.is_unsupported_version_error()
        || error.is_local_illegal_state_error()
    {
        Recovery::NewProducer
    } else if error.is_timeout_error() {
        Recovery::Retry
    } else {
        Recovery::Abort
    }
}

fn txn(operation: &'static str) -> impl FnOnce(confluent_kafka::common::Error) -> TxnError {
    move |source| TxnError { recovery: recovery(&source), source: Error::Confluent { operation, source } }
}

/// The record as librdkafka's owned message, the type the loop's [`super::Transform`] reads.
fn owned(record: ConsumerRecord<Bytes, Bytes>) -> OwnedMessage {
    let mut headers = OwnedHeaders::new_with_capacity(record.headers().into_iter().count());
    for header in record.headers() {
        headers = headers.insert(Header { key: header.key(), value: header.value() });
    }
    let timestamp = match record.timestamp_type() {
        confluent_kafka::common::record::TimestampType::CreateTime => {
            Timestamp::CreateTime(record.timestamp())
        }
        confluent_kafka::common::record::TimestampType::LogAppendTime => {
            Timestamp::LogAppendTime(record.timestamp())
        }
        _ => Timestamp::NotAvailable,
    };
    OwnedMessage::new(
        record.value().cloned(),
        record.key().cloned(),
        record.topic().to_owned(),
        timestamp,
        record.partition(),
        record.offset(),
        Some(headers),
    )
}

fn topic_partition(partition: &Partition) -> TopicPartition {
    TopicPartition::new(partition.topic.as_str(), partition.partition)
}

fn partition_of(tp: &TopicPartition) -> Partition {
    Partition::new(tp.topic(), tp.partition())
}

/// An error of `poll` that no later poll recovers from.
fn fatal_to_poll(error: &confluent_kafka::common::Error) -> bool {
    error.is_authentication_error()
        || error.is_authorization_error()
        || error.is_invalid_configuration_error()
        || error.is_local_illegal_state_error()
        || error.is_local_unsupported_operation_error()
}

impl ConfluentClient {
    /// Creates the consumer, subscribed to `topics` with the rebalance listener; the producer
    /// is registered by the loop's first `renew`.
    pub async fn subscribe(config: &ConfluentConfig, topics: &[&str]) -> Result<Self, Error> {
        let group = config.consumer.get("group.id").cloned().unwrap_or_default();
        let consumer_config = ConsumerConfig::new(&config.consumer).map_err(call("consumer config"))?;
        // validated now, so a bad setting stops the service at start and not at each renewal
        ProducerConfig::new(&config.producer).map_err(call("producer config"))?;
        let mut consumer =
            KafkaConsumer::new(consumer_config, ByteArrayDeserializer::new(), ByteArrayDeserializer::new())
                .map_err(call("consumer"))?;
        let rebalances = Arc::new(Rebalances::default());
        consumer
            .subscribe_with_topics_listener(
                topics.iter().map(|topic| (*topic).to_owned()).collect(),
                Arc::new(Listener(rebalances.clone())),
            )
            .await
            .map_err(call("subscribe"))?;
        Ok(Self {
            group,
            consumer,
            buffered: VecDeque::new(),
            rebalances,
            producer_config: config.producer.clone(),
            producer: None,
        })
    }

    fn producer(&self) -> Result<&KafkaProducer<Bytes, Bytes>, TxnError> {
        self.producer.as_ref().ok_or_else(|| TxnError {
            recovery: Recovery::NewProducer,
            source: Error::Fatal("no transactional producer registered".into()),
        })
    }

    /// Drops buffered records of partitions a rebalance took away since they were polled.
    fn forget_taken(&mut self) {
        let taken = std::mem::take(
            &mut *self.rebalances.taken.lock().unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        if !taken.is_empty() {
            self.buffered.retain(|record| !taken.contains(&Partition::of(record)));
        }
    }

    /// Closes the consumer (leaves the group) and the producer.
    pub async fn close(mut self) {
        if let Some(producer) = self.producer.take() {
            discard(producer);
        }
        if let Err(error) = self.consumer.close().await {
            tracing::warn!(%error, "closing the consumer failed");
        }
    }
}

/// Closes a producer in the background: closing a fenced producer waits for its requests.
fn discard(producer: KafkaProducer<Bytes, Bytes>) {
    tokio::spawn(async move {
        if let Err(error) = producer.close_with_timeout(Duration::ZERO).await {
            tracing::debug!(%error, "closing a transactional producer failed");
        }
    });
}

impl Client for ConfluentClient {
    fn group(&self) -> &str {
        &self.group
    }

    async fn receive(&mut self) -> Result<OwnedMessage, Error> {
        loop {
            self.forget_taken();
            if let Some(record) = self.buffered.pop_front() {
                return Ok(record);
            }
            // cancel-safe (the crate's documentation of `poll`): a dropped call moves no
            // position, its records are fetched again
            match self.consumer.poll(POLL_TIMEOUT).await {
                Ok(records) => self.buffered.extend(records.into_iter().map(owned)),
                Err(error) if fatal_to_poll(&error) => {
                    return Err(Error::Confluent { operation: "poll", source: error });
                }
                Err(error) => {
                    tracing::warn!(%error, "consumer error; continuing");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn rebalances(&self) -> u64 {
        self.rebalances.tick.load(Ordering::SeqCst)
    }

    async fn begin(&mut self) -> Result<(), TxnError> {
        if self.producer.is_none() {
            self.renew().await.map_err(|source| TxnError { recovery: Recovery::NewProducer, source })?;
        }
        self.producer()?.begin_transaction().map_err(|source| TxnError {
            recovery: Recovery::NewProducer,
            source: Error::Confluent { operation: "begin", source },
        })
    }

    async fn send(&mut self, records: &[OutgoingRecord]) -> Result<(), TxnError> {
        let producer = self.producer()?;
        let mut acknowledgements = Vec::with_capacity(records.len());
        for record in records {
            let headers: RecordHeaders = record
                .headers
                .iter()
                .map(|(name, value)| RecordHeader::new(name.clone(), Some(value.clone())))
                .collect();
            let outgoing = ProducerRecord::with_partition_key_headers(
                record.topic.clone(),
                record.partition,
                record.key.as_deref(),
                Some(record.payload.as_slice()),
                headers,
            )
            .map_err(|error| TxnError { recovery: Recovery::Abort, source: Error::Fatal(Box::new(error)) })?;
            // the byte-slice path: key and value copied once, into the batch
            acknowledgements.push(producer.send(outgoing, None).await.map_err(txn("send"))?);
        }
        for acknowledgement in acknowledgements {
            acknowledgement.get().await.map_err(txn("send"))?;
        }
        Ok(())
    }

    async fn send_offsets(&mut self, next: &[(Partition, i64)]) -> Result<(), TxnError> {
        let mut offsets = HashMap::with_capacity(next.len());
        for (partition, offset) in next {
            let offset = OffsetAndMetadata::new(*offset).map_err(txn("send_offsets"))?;
            offsets.insert(topic_partition(partition), offset);
        }
        // read right before sending: the member epoch moves with the group
        let group = self.consumer.group_metadata();
        self.producer()?
            .send_offsets_to_transaction(offsets, group.as_ref())
            .await
            .map_err(txn("send_offsets"))
    }

    async fn commit(&mut self) -> Result<(), TxnError> {
        self.producer()?.commit_transaction().await.map_err(txn("commit"))
    }

    async fn abort(&mut self) -> Result<(), TxnError> {
        match self.producer()?.abort_transaction().await {
            Ok(()) => Ok(()),
            Err(source) => Err(TxnError {
                recovery: Recovery::NewProducer,
                source: Error::Confluent { operation: "abort", source },
            }),
        }
    }

    async fn renew(&mut self) -> Result<(), Error> {
        if let Some(old) = self.producer.take() {
            discard(old);
        }
        let config = ProducerConfig::new(&self.producer_config).map_err(call("producer config"))?;
        let producer = KafkaProducer::new(config, ByteArraySerializer::new(), ByteArraySerializer::new())
            .map_err(call("producer"))?;
        if let Err(source) = producer.init_transactions().await {
            discard(producer);
            return Err(Error::Confluent { operation: "init", source });
        }
        self.producer = Some(producer);
        Ok(())
    }

    fn assignment(&mut self) -> Result<Vec<Partition>, Error> {
        Ok(self.consumer.assignment().iter().map(partition_of).collect())
    }

    async fn committed(&mut self, partitions: &[Partition]) -> Result<Vec<(Partition, Committed)>, Error> {
        let asked: Vec<TopicPartition> = partitions.iter().map(topic_partition).collect();
        // the Java client's committed() answers for every partition or fails as a whole
        let committed = self.consumer.committed(&asked).await.map_err(call("committed"))?;
        Ok(partitions
            .iter()
            .map(|partition| {
                let offset = committed
                    .get(&topic_partition(partition))
                    .and_then(|offset| offset.as_ref().map(OffsetAndMetadata::offset));
                (partition.clone(), Ok(offset))
            })
            .collect())
    }

    async fn bounds(&mut self, partitions: &[Partition]) -> Result<Vec<(Partition, Bounds)>, Error> {
        let asked: Vec<TopicPartition> = partitions.iter().map(topic_partition).collect();
        let starts = self.consumer.beginning_offsets(&asked).await.map_err(call("log_start"))?;
        // the consumer's isolation level's end: read_committed, the last stable offset
        let ends = self.consumer.end_offsets(&asked).await.map_err(call("log_end"))?;
        partitions
            .iter()
            .map(|partition| {
                let key = topic_partition(partition);
                match (starts.get(&key), ends.get(&key)) {
                    (Some(&start), Some(&end)) => Ok((partition.clone(), Bounds { start, end })),
                    _ => Err(Error::Fatal(format!("no log bounds returned for {partition}").into())),
                }
            })
            .collect()
    }

    async fn seek(&mut self, positions: &[(Partition, i64)]) -> Result<(), Error> {
        // the records already polled are from before the seek
        self.buffered.clear();
        for (partition, offset) in positions {
            self.consumer
                .seek_with_offset(topic_partition(partition), *offset)
                .await
                .map_err(call("seek"))?;
        }
        Ok(())
    }
}
