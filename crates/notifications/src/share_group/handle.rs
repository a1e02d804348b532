//! One attempt at a record and its settlement: accepted, released for a retry after the
//! contract's delay, or dead-lettered and rejected.

use std::time::Duration;

use krafka::share_consumer::ShareConsumer;
use krafka::ConsumerRecord;
use tokio_util::sync::CancellationToken;

use contracts::topics::dead_letter_topic;
use kafka::dead_letter::Failure;
use kafka::retry_topic::{Attempt, Destination, Verdict};

use super::lease::Lease;
use super::{connection, wait, Backoff, Shared};

/// How a record is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settle {
    Accept,
    Release,
    Reject,
}

impl Shared {
    /// One attempt at `record`, then its acknowledgement (see the module's documentation).
    pub(super) async fn handle(
        &self,
        member: usize,
        consumer: &ShareConsumer,
        record: &ConsumerRecord,
        shutdown: &CancellationToken,
    ) {
        let message = connection::to_message(record);
        let delivery = record.delivery_count.map_or(1, |count| u32::try_from(count.max(1)).unwrap_or(1));
        // for the log lines below (the notifier's own span names it too)
        let event = self.notifier.decode(&message).ok().map(|outcome| outcome.event_id);
        tracing::debug!(
            member,
            topic = &*record.topic,
            partition = record.partition,
            offset = record.offset,
            delivery,
            event_id = ?event,
            "record acquired"
        );
        let mut lease = Lease::new(consumer, record);
        let verdict = lease.hold(self.notifier.attempt(&message)).await;
        let settle = match verdict {
            Verdict::Done => Settle::Accept,
            Verdict::Retry(failure) if delivery < self.chain.attempts() => {
                let delay = self.delay_after(delivery);
                metrics::counter!("retries_total", "topic" => record.topic.to_string()).increment(1);
                tracing::info!(
                    member,
                    topic = &*record.topic,
                    partition = record.partition,
                    offset = record.offset,
                    delivery,
                    event_id = ?event,
                    delay_ms = delay.as_millis() as u64,
                    reason = failure.message,
                    "attempt failed; released for redelivery after its delay"
                );
                // on shutdown: released at once, redelivered to whoever is still running
                lease.hold(wait(delay, shutdown)).await;
                Settle::Release
            }
            Verdict::Retry(failure) | Verdict::Reject(failure) => {
                if self.dead_letter(&mut lease, &message, &failure, delivery, shutdown).await {
                    Settle::Reject
                } else {
                    Settle::Release // shut down before the dead letter was written: redelivered
                }
            }
        };
        let settled = match settle {
            Settle::Accept => consumer.ack(record),
            Settle::Release => consumer.release(record),
            Settle::Reject => consumer.reject(record),
        };
        if let Err(error) = settled {
            // the member lost the record meanwhile (its assignment changed): the broker hands
            // it out again when its lock ends, so it is repeated, never lost
            tracing::warn!(
                topic = &*record.topic,
                partition = record.partition,
                offset = record.offset,
                event_id = ?event,
                ?settle,
                error = %error,
                "acknowledgement refused"
            );
        } else if settle == Settle::Release {
            // Sent and applied now, not with the next fetch: the broker runs a fetch's
            // acknowledgements and its acquisition side by side, so a release riding on it is
            // seen only by the fetch after (up to the 500 ms a fetch waits for records): the
            // first retry came 1.5 s after its failure instead of 1 s.
            if let Err(error) = consumer.commit().await {
                tracing::info!(error = %error, "release not confirmed; it goes with the next fetch");
            }
        }
    }

    /// The contract's delay after failed attempt `delivery` (1 s after the first, 2 s, 4 s).
    pub(super) fn delay_after(&self, delivery: u32) -> Duration {
        let delays = &self.chain.delays_ms;
        let index = (delivery.saturating_sub(1) as usize).min(delays.len().saturating_sub(1));
        Duration::from_millis(u64::from(delays.get(index).copied().unwrap_or(0)))
    }

    /// Writes `message`'s dead letter to `<topic>-dlt` and waits for the broker's
    /// acknowledgement, trying again while Kafka refuses it; false if `shutdown` came first.
    async fn dead_letter(
        &self,
        lease: &mut Lease<'_>,
        message: &kafka::rdkafka::message::OwnedMessage,
        failure: &Failure,
        delivery: u32,
        shutdown: &CancellationToken,
    ) -> bool {
        use kafka::rdkafka::message::Message as _;
        let topic = dead_letter_topic(message.topic());
        let destination = Destination::DeadLetter { topic: topic.clone() };
        let letter = kafka::retry_topic::forwarded(
            message,
            &self.group,
            failure,
            delivery,
            &destination,
            kafka::retry_topic::now_ms(),
        );
        let mut backoff = Backoff::default();
        loop {
            let sent = lease
                .hold(async {
                    tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => None,
                        sent = self.producer.send(&letter) => Some(sent),
                    }
                })
                .await;
            match sent {
                None => return false,
                Some(Ok(_)) => break,
                Some(Err(error)) => {
                    tracing::warn!(error = %telemetry::error_chain(&error), topic, "dead letter not written; retrying");
                    if !lease.hold(backoff.wait(shutdown)).await {
                        return false;
                    }
                }
            }
        }
        metrics::counter!("dlt_mensagens_total", "topic" => topic.clone()).increment(1);
        tracing::warn!(
            topic = message.topic(),
            partition = message.partition(),
            offset = message.offset(),
            delivery,
            dead_letter_topic = topic,
            reason = failure.message,
            "record sent to dead-letter topic"
        );
        true
    }
}
