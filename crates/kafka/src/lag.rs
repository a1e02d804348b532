//! `kafka_consumer_lag{group, topic, partition}`: records of the group's assigned partitions
//! not yet committed, from the committed offset and the end of each partition. Exactly 0 once
//! the group has drained its input: the consumer loop commits past transaction markers when idle.
//!
//! Each refresh asks the group coordinator for the committed offsets (one `OffsetFetch`) and
//! each partition leader for the ends of all its partitions at once (one `ListOffsets` per
//! leader, [`crate::metadata::offsets_at`]), and the starts only of partitions the group has
//! never committed on.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::Consumer;
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
    let assignment = consumer.assignment()?;
    if assignment.count() == 0 {
        return Ok(Vec::new());
    }
    let committed = consumer.committed_offsets(assignment.clone(), REQUEST_TIMEOUT)?;
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

/// Refreshes the gauge for `group` until `shutdown`.
pub async fn report(consumer: Arc<KafkaConsumer>, group: String, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(REFRESH_INTERVAL) => {}
        }
        let handle = consumer.clone();
        match tokio::task::spawn_blocking(move || measure(&handle)).await {
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
            Ok(Err(error)) => tracing::debug!(%error, group, "consumer lag not measured"),
            Err(error) => tracing::warn!(%error, "lag measurement panicked"),
        }
    }
}
