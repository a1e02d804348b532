//! One member of the share group: joins it, polls one record at a time and hands it to
//! [`Shared::handle`], and leaves at shutdown.

use std::sync::Arc;
use std::time::Duration;

use krafka::share_consumer::{AcknowledgementCommit, AcknowledgementMode, AcquireMode, ShareConsumer};
use tokio_util::sync::CancellationToken;

use super::error::is_fatal;
use super::{connection, Backoff, Error, Shared};

/// How long one poll waits for a record.
const POLL_TIMEOUT: Duration = Duration::from_secs(1);
/// Leaving the group at shutdown: the last acknowledgements and the leave heartbeat.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// One member: joins, works one record at a time until `shutdown`, leaves.
pub(super) async fn member(
    shared: Arc<Shared>,
    index: usize,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let Some(consumer) = join(&shared, index, &shutdown).await? else {
        return Ok(()); // shut down before it joined
    };
    let mut assigned = false;
    let result = consume(&shared, index, &consumer, &mut assigned, &shutdown).await;
    shared.assigned.update(assigned, false);
    // sends what is acknowledged, the broker releases anything still held, then leave
    let options = krafka::CloseOptions::new().timeout(CLOSE_TIMEOUT);
    if let Err(error) = consumer.close_with(options).await {
        tracing::info!(member = index, error = %error, "share group member left uncleanly");
    }
    result
}

/// A member of the group, subscribed to the outcome topics; `None` if `shutdown` came first.
/// Kafka being away is waited out; what no retry fixes is an error.
async fn join(
    shared: &Shared,
    index: usize,
    shutdown: &CancellationToken,
) -> Result<Option<ShareConsumer>, Error> {
    let mut backoff = Backoff::default();
    loop {
        let attempt = async {
            let kafka = connection::connect(&shared.kafka, "notificacoes").await?;
            let consumer = kafka
                .share_consumer(shared.group.clone())
                .acknowledgement_mode(AcknowledgementMode::Explicit)
                .acquire_mode(AcquireMode::RecordLimit)
                .max_poll_records(1)
                .batch_size(1)
                .metrics_push(false)
                .acknowledgement_commit_callback(count_failed_acknowledgements)
                .build()
                .await
                .map_err(|source| Error::Join { group: shared.group.clone(), source })?;
            consumer
                .subscribe(&shared.topics)
                .await
                .map_err(|source| Error::Join { group: shared.group.clone(), source })?;
            Ok::<_, Error>(consumer)
        };
        let joined = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(None),
            joined = attempt => joined,
        };
        match joined {
            Ok(consumer) => return Ok(Some(consumer)),
            Err(error) if error.is_fatal() => return Err(error),
            Err(error) => {
                tracing::warn!(member = index, error = %telemetry::error_chain(&error), "share group member could not join; retrying");
                if !backoff.wait(shutdown).await {
                    return Ok(None);
                }
            }
        }
    }
}

/// Polls one record at a time and settles it, until `shutdown`.
async fn consume(
    shared: &Shared,
    index: usize,
    consumer: &ShareConsumer,
    assigned: &mut bool,
    shutdown: &CancellationToken,
) -> Result<(), Error> {
    let mut backoff = Backoff::default();
    loop {
        let now = !consumer.assignment().is_empty();
        shared.assigned.update(*assigned, now);
        *assigned = now;
        let polled = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(()),
            // cancel safe: a dropped poll returns nothing and acquires nothing for us
            polled = consumer.poll(POLL_TIMEOUT) => polled,
        };
        let records = match polled {
            Ok(records) => {
                backoff = Backoff::default();
                records
            }
            Err(source) if is_fatal(&source) => {
                return Err(Error::Consume { group: shared.group.clone(), source })
            }
            Err(error) => {
                tracing::warn!(error = %error, group = shared.group, "share group poll failed; retrying");
                if !backoff.wait(shutdown).await {
                    return Ok(());
                }
                continue;
            }
        };
        // one record with the record limit; should the broker hand out more, none waits on another
        futures::future::join_all(
            records.iter().map(|record| shared.handle(index, consumer, record, shutdown)),
        )
        .await;
    }
}

/// The broker's answer to acknowledgements it did not apply (a record whose lock ended is
/// answered `INVALID_RECORD_STATE`: it went, or goes, to another member). Counted and logged:
/// such a record is delivered again, which receivers absorb by `Idempotency-Key`.
fn count_failed_acknowledgements(commit: &AcknowledgementCommit) {
    if let Err(error) = &commit.result {
        metrics::counter!("notifications_acknowledgement_failures_total").increment(1);
        tracing::warn!(
            topic = commit.topic,
            partition = commit.partition,
            offsets = ?commit.offsets,
            error = %error,
            "share group acknowledgement failed"
        );
    }
}
