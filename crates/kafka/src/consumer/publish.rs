//! The loop's own outputs (dead letters and forwards), published until the broker acknowledged
//! each ([`publish_all`]).

use rdkafka::message::{Message, OwnedMessage};
use tokio_util::sync::CancellationToken;

use super::batch::Batch;
use super::error_chain;
use super::held::Held;
use super::io::{Io, Route};
use super::verdict::{ForwardKind, LoopOptions};
use super::wait::{wait_polling, Paused};
use crate::dead_letter::Failure;
use crate::producer::OutgoingRecord;
use crate::Error;

/// A record the loop publishes for a record it handled, which counts as handled only once the
/// broker acknowledged it.
pub(super) struct Output<'a> {
    pub(super) source: &'a OwnedMessage,
    /// The [`Revocations`] tick at which `source` was taken.
    pub(super) taken: u64,
    /// The forward, or `None` for a dead letter (written by the publisher from `failure`).
    pub(super) record: Option<OutgoingRecord>,
    pub(super) route: Route,
    pub(super) kind: ForwardKind,
    pub(super) failure: Option<Failure>,
    pub(super) reason: String,
}

impl Output<'_> {
    /// Logs and counts the output once acknowledged.
    pub(super) fn acknowledged(&self, topic: &str) {
        let source = self.source;
        let reason = self.failure.as_ref().map_or(self.reason.as_str(), |failure| failure.message.as_str());
        match self.kind {
            ForwardKind::Retry => {
                metrics::counter!("retries_total", "topic" => source.topic().to_owned()).increment(1);
                tracing::info!(
                    topic = source.topic(),
                    partition = source.partition(),
                    offset = source.offset(),
                    retry_topic = topic,
                    reason,
                    "attempt failed; forwarded to retry topic"
                );
            }
            ForwardKind::DeadLetter => {
                metrics::counter!("dlt_mensagens_total", "topic" => topic.to_owned()).increment(1);
                tracing::warn!(
                    dead_letter_topic = topic,
                    topic = source.topic(),
                    partition = source.partition(),
                    offset = source.offset(),
                    reason,
                    "record sent to dead-letter topic"
                );
            }
        }
    }
}

/// Publishes `outputs` (all at once) until the broker acknowledged each, backing off (and
/// polling, paused) between tries; the outputs of a partition revoked meanwhile are dropped.
/// `false` when `shutdown` came first.
pub(super) async fn publish_all(
    io: &impl Io,
    outputs: &[Output<'_>],
    options: &LoopOptions,
    shutdown: &CancellationToken,
    carried: &mut Batch,
    paused: &mut Paused,
    held: &mut Held,
) -> Result<bool, Error> {
    let records: Vec<OutgoingRecord> = outputs
        .iter()
        .map(|output| match (&output.record, &output.failure, &options.dead_letters) {
            (Some(record), _, _) => record.clone(),
            (None, Some(failure), Some(publisher)) => publisher.letter(output.source, failure),
            _ => unreachable!("`sort` made sure of a publisher for every dead letter"),
        })
        .collect();
    let revocations = io.revocations();
    let mut pending: Vec<usize> = (0..outputs.len()).collect();
    let mut attempt = 0u32;
    while !pending.is_empty() {
        // the consumer was polled during the last wait: a partition revoked meanwhile is
        // someone else's, who publishes its outputs
        let before = pending.len();
        pending.retain(|&index| {
            let output = &outputs[index];
            !revocations.revoked_since(output.source.topic(), output.source.partition(), output.taken)
        });
        if pending.len() < before {
            tracing::info!(
                dropped = before - pending.len(),
                "outputs of partitions revoked while they waited dropped"
            );
            if pending.is_empty() {
                break;
            }
        }
        let sent = futures::future::join_all(
            pending.iter().map(|&index| io.publish(&records[index], outputs[index].route)),
        )
        .await;
        let mut failed = Vec::new();
        for (index, result) in pending.into_iter().zip(sent) {
            match result {
                Ok(()) => outputs[index].acknowledged(&records[index].topic),
                Err(Error::Fatal(error)) => return Err(Error::Fatal(error)),
                Err(error) => {
                    tracing::warn!(error = %error_chain(&error), topic = records[index].topic, "output not published; retrying");
                    failed.push(index);
                }
            }
        }
        pending = failed;
        if !pending.is_empty() {
            attempt += 1;
            let delay = options.backoff.delay(attempt);
            tracing::warn!(
                unpublished = pending.len(),
                attempt,
                retry_in_ms = delay.as_millis() as u64,
                "outputs not published; retrying"
            );
            paused.pause_consumed(io);
            if wait_polling(io, delay, shutdown, carried, paused, held).await? {
                return Ok(false);
            }
        }
    }
    Ok(true)
}
