//! `kafka_consumer_lag{group, topic, partition}`: records of the group's assigned partitions
//! not yet committed, from the committed offset and the end of each partition. Exactly 0 once
//! the group has drained its input: the consumer loop commits past transaction markers when idle.
//!
//! Each refresh asks the group coordinator for the committed offsets (one `OffsetFetch`; for an
//! exactly-once group through a reader that does not wait for offsets of transactions still
//! open, [`offsets_reader`], or one transaction left open would stop the gauge too) and
//! each partition leader for the ends of all its partitions at once (one `ListOffsets` per
//! leader, [`crate::metadata::offsets_at`]), and the starts only of partitions the group has
//! never committed on.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::Offset;
use tokio_util::sync::CancellationToken;

use crate::consumer::KafkaConsumer;
use crate::metadata::{offsets_at, End};

/// How often the gauge is refreshed.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Lag per assigned partition: (topic, partition, records). The end is the consumer's
/// isolation level's (a `read_committed` consumer's last stable offset).
pub fn measure(consumer: &KafkaConsumer) -> Result<Vec<(String, i32, i64)>, KafkaError> {
    measure_with(consumer, consumer)
}

/// As [`measure`], the committed offsets read by `offsets` (see [`offsets_reader`]).
pub fn measure_with<R: Consumer<X>, X: rdkafka::consumer::ConsumerContext>(
    consumer: &KafkaConsumer,
    offsets: &R,
) -> Result<Vec<(String, i32, i64)>, KafkaError> {
    let assignment = consumer.assignment()?;
    if assignment.count() == 0 {
        return Ok(Vec::new());
    }
    let committed = offsets.committed_offsets(assignment.clone(), REQUEST_TIMEOUT)?;
    let key = |element: &rdkafka::topic_partition_list::TopicPartitionListElem<'_>| {
        (element.topic().to_owned(), element.partition())
    };
    let assigned: Vec<_> = assignment.elements().iter().map(key).collect();
    let ends = offsets_at(consumer, &assigned, End::Last, REQUEST_TIMEOUT)?;
    let never_committed: Vec<_> = committed
        .elements()
        .iter()
        .filter(|element| !matches!(element.offset(), Offset::Offset(_)))
        .map(key)
        .collect();
    let starts = offsets_at(consumer, &never_committed, End::Start, REQUEST_TIMEOUT)?;
    let mut lags = Vec::with_capacity(committed.count());
    for element in committed.elements() {
        let key = key(&element);
        let from = match element.offset() {
            Offset::Offset(offset) => Some(offset),
            _ => starts.get(&key).copied(),
        };
        if let (Some(from), Some(&end)) = (from, ends.get(&key)) {
            lags.push((key.0, key.1, (end - from).max(0)));
        }
    }
    Ok(lags)
}

/// A client that reads `config`'s group's committed offsets without waiting for offsets of
/// transactions still open: librdkafka asks the coordinator with `require_stable` exactly when
/// its `isolation.level` is `read_committed`, and then gets `UNSTABLE_OFFSET_COMMIT` for as long
/// as a transaction with offsets stays open (the gauge then timed out and said nothing). It never
/// subscribes, so it never joins the group.
pub fn offsets_reader(config: &rdkafka::ClientConfig) -> Result<Arc<BaseConsumer>, KafkaError> {
    let mut config = config.clone();
    config.set("isolation.level", "read_uncommitted");
    Ok(Arc::new(config.create()?))
}

/// Refreshes the gauge for `group` until `shutdown`.
pub async fn report(consumer: Arc<KafkaConsumer>, group: String, shutdown: CancellationToken) {
    report_with(consumer.clone(), consumer, group, shutdown).await;
}

/// As [`report`], the committed offsets read by `offsets` (an [`offsets_reader`]).
pub async fn report_with<R, X>(
    consumer: Arc<KafkaConsumer>,
    offsets: Arc<R>,
    group: String,
    shutdown: CancellationToken,
) where
    R: Consumer<X> + Send + Sync + 'static,
    X: rdkafka::consumer::ConsumerContext,
{
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(REFRESH_INTERVAL) => {}
        }
        let handle = consumer.clone();
        let reader = offsets.clone();
        match tokio::task::spawn_blocking(move || measure_with(&handle, reader.as_ref())).await {
            Ok(Ok(lags)) => {
                for (topic, partition, lag) in lags {
                    metrics::gauge!(
                        "kafka_consumer_lag",
                        "group" => group.clone(),
                        "topic" => topic,
                        "partition" => partition.to_string(),
                    )
                    .set(lag as f64);
                }
            }
            Ok(Err(error)) => tracing::warn!(%error, group, "consumer lag not measured"),
            Err(error) => tracing::warn!(%error, "lag measurement panicked"),
        }
    }
}
