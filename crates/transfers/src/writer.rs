//! How the API writes accepted transfers: one transaction per request (the `reference`
//! profile, as the article does), or a group commit (`fast`).
//!
//! Group commit: a few writer tasks take requests from one queue (a multi-consumer `flume`
//! channel); each takes what is waiting (up to [`MAX_BATCH`]) and writes it in one transaction with [`store::create_batch`], so
//! requests that arrive while a transaction is open share the next commit (one WAL flush)
//! instead of queueing for a connection each. A lone request is written at once: at low load a
//! batch holds one request and adds only a hop between tasks. Every request still gets its own
//! answer, sent after the commit; a batch whose transaction fails while the database is up is
//! retried one request per transaction, so a request that breaks the transaction fails alone.
//!
//! After a commit that wrote new transfers the writer wakes this process's outbox relay
//! ([`outbox::Waker`]), which publishes their events at once if it leads.

use std::sync::Arc;

use service::server::Handoff;
use sqlx::PgPool;
use tokio::sync::oneshot;

use crate::error::StoreError;
use crate::store::{self, Created, NewTransfer};

/// Most requests in one transaction.
pub const MAX_BATCH: usize = 128;
/// Writer tasks (each holds at most one connection at a time).
pub const WRITERS: usize = 4;

/// Writes transfers for the API. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Writer {
    pool: PgPool,
    /// `None`: each request in its own transaction, on the caller's task.
    queue: Option<flume::Sender<Job>>,
    relay: outbox::Waker,
}

#[derive(Debug)]
struct Job {
    transfer: NewTransfer,
    answer: oneshot::Sender<Result<Created, StoreError>>,
}

impl Writer {
    /// One transaction per request; `relay` is woken after each commit of a new transfer.
    pub fn direct(pool: PgPool, relay: outbox::Waker) -> Self {
        Self { pool, queue: None, relay }
    }

    /// Group commit with [`WRITERS`] tasks, spawned here; `relay` is woken after each commit
    /// that wrote a new transfer. They end when every clone of the writer is gone (the API's
    /// router dropped at shutdown, its requests answered).
    pub fn batched(pool: PgPool, relay: outbox::Waker) -> Self {
        let (queue, jobs) = flume::bounded(WRITERS * MAX_BATCH);
        for _ in 0..WRITERS {
            tokio::spawn(work(pool.clone(), jobs.clone(), relay.clone()));
        }
        Self { pool, queue: Some(queue), relay }
    }

    /// Creates `transfer` (see [`store::create`]). With the queue full (the database slower
    /// than the intake, or hung) the request is refused at once ([`StoreError::WriterBusy`]):
    /// waiting for room would only hold the client and its connection.
    pub async fn create(&self, transfer: NewTransfer) -> Result<Created, StoreError> {
        self.create_marking(transfer, &Handoff::default()).await
    }

    /// [`Self::create`], marking `handoff` at the moment the transfer may be written whatever
    /// becomes of the caller: queued for a writer task (which writes it even if the caller is
    /// dropped), or, one transaction per request, about to be written on the caller's task
    /// (dropped while its `COMMIT` is on the way, it may be committed). From then on, a request
    /// timeout answers that the outcome is unknown, never "retry later" (`service::server`).
    pub async fn create_marking(
        &self,
        transfer: NewTransfer,
        handoff: &Handoff,
    ) -> Result<Created, StoreError> {
        let Some(queue) = &self.queue else {
            handoff.mark();
            let created = store::create(&self.pool, &transfer).await;
            if let Ok(Created::New(_)) = created {
                self.relay.wake();
            }
            return created;
        };
        let (answer, answered) = oneshot::channel();
        queue.try_send(Job { transfer, answer }).map_err(|error| match error {
            flume::TrySendError::Full(_) => StoreError::WriterBusy,
            flume::TrySendError::Disconnected(_) => StoreError::WriterStopped,
        })?;
        handoff.mark();
        answered.await.map_err(|_| StoreError::WriterStopped)?
    }
}

/// One writer: waits for a request, takes what else is waiting (never waiting for more), writes
/// them, wakes the relay if that wrote a new transfer; ends when every sender is gone and the
/// queue is empty.
async fn work(pool: PgPool, jobs: flume::Receiver<Job>, relay: outbox::Waker) {
    while let Ok(first) = jobs.recv_async().await {
        let mut batch = vec![first];
        batch.extend(jobs.try_iter().take(MAX_BATCH - 1));
        metrics::histogram!("transfers_write_batch_rows").record(batch.len() as f64);
        let transfers: Vec<&NewTransfer> = batch.iter().map(|job| &job.transfer).collect();
        let answers = write_batch(&pool, &transfers).await;
        if answers.iter().any(|answer| matches!(answer, Ok(Created::New(_)))) {
            relay.wake();
        }
        for (job, answer) in batch.into_iter().zip(answers) {
            // the caller may have gone (client disconnected): its transfer stands
            let _ = job.answer.send(answer);
        }
    }
}

/// Writes `transfers` in one transaction ([`store::create_batch`]), one answer each, in order.
/// If that transaction fails while the database is up, each transfer is written again in a
/// transaction of its own: a request that breaks a transaction fails alone. If the database is
/// away, every request is answered with that (the first with the error itself). If the
/// connection broke during `COMMIT`, every request is told its outcome is unknown, and none is
/// written again: the batch may be committed.
pub async fn write_batch(pool: &PgPool, transfers: &[&NewTransfer]) -> Vec<Result<Created, StoreError>> {
    match store::create_batch(pool, transfers).await {
        Ok(answers) => answers,
        Err(StoreError::OutcomeUnknown(cause)) => {
            tracing::error!(size = transfers.len(), error = %telemetry::error_chain(cause.as_ref()), "the connection broke during COMMIT: the outcome of a batch of transfers is unknown");
            metrics::counter!("transfers_outcome_unknown_total").increment(transfers.len() as u64);
            transfers.iter().map(|_| Err(StoreError::OutcomeUnknown(cause.clone()))).collect()
        }
        Err(error) if transfers.len() == 1 => vec![Err(error)],
        Err(error) if error.is_unavailable() => {
            let cause = Arc::new(error);
            transfers.iter().map(|_| Err(StoreError::Unavailable(cause.clone()))).collect()
        }
        Err(error) => {
            tracing::warn!(size = transfers.len(), error = %telemetry::error_chain(&error), "a batch of transfers failed: writing them one by one");
            let mut answers = Vec::with_capacity(transfers.len());
            for transfer in transfers {
                answers.push(store::create(pool, transfer).await);
            }
            answers
        }
    }
}
