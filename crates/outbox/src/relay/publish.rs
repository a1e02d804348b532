//! Step 2: the claimed rows sent to Kafka at once and the broker's answers awaited, by
//! [`publish`] alone or by the relay's cycle ([`Relay::deliver`]), which stops waiting at
//! shutdown; both through [`send_all`].

use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use kafka::producer::{Delivered, OutgoingRecord, Producer};

use super::{PendingEvent, Relay};

/// Step 2: publishes every event at once (enqueued in order, so each partition keeps it) and
/// returns the ids the broker acknowledged, in acceptance order. Waits for every answer: the
/// relay's cycle uses [`Relay::deliver`], which stops waiting at shutdown.
pub async fn publish(producer: &Producer, events: &[PendingEvent], database: &'static str) -> Vec<Uuid> {
    send_all(producer, events, database, &CancellationToken::new(), Duration::ZERO).await
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
    /// A row without an answer counts as not published (it may still reach the broker from the
    /// producer's queue: then it is published twice, never lost).
    pub(super) async fn deliver(&self, events: &[PendingEvent], shutdown: &CancellationToken) -> Vec<Uuid> {
        send_all(&self.producer, events, self.options.database, shutdown, self.options.shutdown_grace).await
    }
}

/// Sends every event at once and waits for the answers, at most `grace` more once `shutdown`
/// is cancelled; returns the acknowledged ids in acceptance order.
async fn send_all(
    producer: &Producer,
    events: &[PendingEvent],
    database: &'static str,
    shutdown: &CancellationToken,
    grace: Duration,
) -> Vec<Uuid> {
    let records: Vec<OutgoingRecord> = events.iter().map(PendingEvent::record).collect();
    // polled first in push order, so the records are enqueued in acceptance order
    let mut sends: FuturesUnordered<_> = records
        .iter()
        .enumerate()
        .map(|(index, record)| async move { (index, producer.send(record).await) })
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
                    acknowledged.push(index);
                }
            }
            _ = shutdown.cancelled(), if give_up_at.is_none() => {
                give_up_at = Some(tokio::time::Instant::now() + grace);
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
    acknowledged.sort_unstable();
    acknowledged.into_iter().map(|index| events[index].id).collect()
}
