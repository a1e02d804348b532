//! Dead letters not yet replayed: counted per topic, and the `dlt_mensagens_retidas` gauge
//! services refresh in the background.

use std::time::Duration;

use kafka::config::KafkaArgs;
use kafka::metadata::End;

use super::{kafka, DeadLetterTopic, DltError, REQUEST_TIMEOUT};

impl DeadLetterTopic {
    /// Dead letters not yet replayed, per partition summed (the `dlt_mensagens_retidas`
    /// gauge). Counts offsets, so on a topic written inside Kafka transactions the commit
    /// markers count too until replayed past; exactly 0 when nothing is left.
    ///
    /// Asks for every partition's start and end at once (two `ListOffsets`, not two per
    /// partition: every service refreshes the gauge every few seconds).
    pub fn retained(&self) -> Result<u64, DltError> {
        let partitions: Vec<(String, i32)> =
            self.partitions.iter().map(|&partition| (self.topic.clone(), partition)).collect();
        let offsets_at = |end| {
            kafka::metadata::offsets_at(&self.consumer, &partitions, end, REQUEST_TIMEOUT)
                .map_err(kafka("watermarks"))
        };
        let (starts, ends) = (offsets_at(End::Start)?, offsets_at(End::Last)?);
        let mut total = 0u64;
        for (partition, progress) in self.progress()? {
            let key = (self.topic.clone(), partition);
            let (low, high) = match (starts.get(&key), ends.get(&key)) {
                (Some(&low), Some(&high)) => (low, high),
                _ => return Err(DltError::UnknownPartition { topic: self.topic.clone(), partition }),
            };
            let from = progress.next.max(low);
            let singles = progress.singles.range(from..high).count() as i64;
            total += (high - from - singles).max(0) as u64;
        }
        Ok(total)
    }
}

/// Refreshes `dlt_mensagens_retidas{topic}` for `topics` every `interval` until `shutdown`.
pub async fn report_retained(
    args: KafkaArgs,
    topics: Vec<String>,
    interval: Duration,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut opened: Vec<DeadLetterTopic> = Vec::new();
    loop {
        let task_args = args.clone();
        let task_topics = topics.clone();
        let mut handles = std::mem::take(&mut opened);
        let measured = tokio::task::spawn_blocking(move || {
            if handles.is_empty() {
                for topic in &task_topics {
                    match DeadLetterTopic::open(&task_args, topic) {
                        Ok(handle) => handles.push(handle),
                        Err(error) => tracing::debug!(error = %kafka::consumer::error_chain(&error), topic, "dead-letter topic not opened"),
                    }
                }
            }
            let counts: Vec<(String, Option<u64>)> =
                handles.iter().map(|handle| (handle.topic.clone(), handle.retained().ok())).collect();
            (handles, counts)
        })
        .await;
        if let Ok((handles, counts)) = measured {
            // a topic that failed to open is tried again next time
            opened = if handles.len() == topics.len() { handles } else { Vec::new() };
            for (topic, count) in counts {
                if let Some(count) = count {
                    metrics::gauge!("dlt_mensagens_retidas", "topic" => topic).set(count as f64);
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}
