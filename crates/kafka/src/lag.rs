//! `kafka_consumer_lag{group, topic, partition}`: records of the group's assigned partitions
//! not yet committed, from the committed offset and the high watermark. Exactly 0 once the
//! group has drained its input: the consumer loop commits past transaction markers when idle.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::Offset;
use tokio_util::sync::CancellationToken;

use crate::consumer::KafkaConsumer;

/// How often the gauge is refreshed.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Lag per assigned partition: (topic, partition, records).
pub fn measure(consumer: &KafkaConsumer) -> Result<Vec<(String, i32, i64)>, rdkafka::error::KafkaError> {
    let assignment = consumer.assignment()?;
    let committed = consumer.committed_offsets(assignment, REQUEST_TIMEOUT)?;
    let mut lags = Vec::with_capacity(committed.count());
    for element in committed.elements() {
        let (low, high) = consumer.fetch_watermarks(element.topic(), element.partition(), REQUEST_TIMEOUT)?;
        let from = match element.offset() {
            Offset::Offset(offset) => offset,
            _ => low,
        };
        lags.push((element.topic().to_owned(), element.partition(), (high - from).max(0)));
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
