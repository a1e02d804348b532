//! Step 2: the claimed rows sent to Kafka at once and the broker's answers awaited, by
//! [`publish`] alone or by the relay's cycle, which stops waiting at shutdown.

use futures::future::join_all;
use futures::stream::{FuturesUnordered, StreamExt};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use kafka::producer::{Delivered, OutgoingRecord, Producer};

use super::{PendingEvent, Relay};

/// Step 2: publishes every event at once (enqueued in order, so each partition keeps it) and
/// returns the ids the broker acknowledged. Waits for every answer: the relay's cycle uses
/// [`Relay::deliver`], which stops waiting at shutdown.
pub async fn publish(producer: &Producer, events: &[PendingEvent], database: &'static str) -> Vec<Uuid> {
    let records: Vec<OutgoingRecord> = events.iter().map(PendingEvent::record).collect();
    let results = join_all(records.iter().map(|record| producer.send(record))).await;
    events
        .iter()
        .zip(results)
        .filter_map(|(event, result)| was_acknowledged(event, result, database).then_some(event.id))
        .collect()
}

/// Whether `result` acknowledged `event`; records its delivery time or logs the failure.
fn was_acknowledged(
    event: &PendingEvent,
    result: Result<Delivered, kafka::Error>,
    database: &'static str,
) -> bool {
    match result {
        Ok(_) => {
            let age = (OffsetDateTime::now_utc() - event.created_at).as_seconds_f64().max(0.0);
            metrics::histogram!("outbox_delivery_seconds", "database" => database).record(age);
            true
        }
        Err(error) => {
            tracing::warn!(
                error = %kafka::consumer::error_chain(&error),
                event_id = %event.id,
                topic = event.topic,
                "outbox event not published; it stays pending"
            );
            false
        }
    }
}

impl Relay {
    /// [`publish`] with at most `shutdown_grace` of waiting once `shutdown` is cancelled.
    /// Returns the acknowledged ids, in the order the answers came; a row without an answer
    /// counts as not published (it may still reach the broker from the producer's queue: then
    /// it is published twice, never lost).
    pub(super) async fn deliver(&self, events: &[PendingEvent], shutdown: &CancellationToken) -> Vec<Uuid> {
        let database = self.options.database;
        let records: Vec<OutgoingRecord> = events.iter().map(PendingEvent::record).collect();
        // polled first in push order, so the records are enqueued in acceptance order
        let mut sends: FuturesUnordered<_> = records
            .iter()
            .enumerate()
            .map(|(index, record)| async move { (index, self.producer.send(record).await) })
            .collect();
        let mut acknowledged = Vec::with_capacity(events.len());
        let mut answered = 0;
        let mut give_up_at: Option<tokio::time::Instant> = None;
        loop {
            let give_up = async {
                match give_up_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                next = sends.next() => {
                    let Some((index, result)) = next else { break };
                    answered += 1;
                    if was_acknowledged(&events[index], result, database) {
                        acknowledged.push(events[index].id);
                    }
                }
                _ = shutdown.cancelled(), if give_up_at.is_none() => {
                    give_up_at = Some(tokio::time::Instant::now() + self.options.shutdown_grace);
                }
                _ = give_up => {
                    tracing::warn!(
                        database,
                        unanswered = events.len() - answered,
                        "outbox relay stopping: rows the broker has not acknowledged stay pending"
                    );
                    break;
                }
            }
        }
        acknowledged
    }
}
