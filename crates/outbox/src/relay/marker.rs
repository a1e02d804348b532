//! Step 3 off the event's path: the marker, a task on a connection of its own that marks the
//! acknowledged rows published while the leader claims and publishes the next ones, and the
//! leader's side of it ([`Marker`]): the ids sent and not yet marked, which its claims leave
//! out.

use std::collections::HashSet;

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::Error;

use super::{mark, Progress};

/// Most ids one mark statement takes: what arrived while the previous mark ran is marked at
/// once, up to this.
const MARK_ROWS_MAX: usize = 10_000;

/// The leader's handle on its marker task. Dropped, it stops the task (marks not yet written
/// are lost: those rows are published again by the next leader).
#[derive(Debug)]
pub(super) struct Marker {
    acknowledged: Option<mpsc::UnboundedSender<Vec<Uuid>>>,
    marked: mpsc::UnboundedReceiver<Vec<Uuid>>,
    task: JoinHandle<Result<(), Error>>,
    /// Acknowledged, handed to the task, not yet reported marked.
    unmarked: HashSet<Uuid>,
}

impl Marker {
    /// Connects with `options` and starts the task.
    pub(super) async fn start(
        options: &PgConnectOptions,
        database: &'static str,
        progress: Progress,
    ) -> Result<Self, Error> {
        let connection = options.connect().await?;
        let (acknowledged, to_mark) = mpsc::unbounded_channel();
        let (report, marked) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(connection, to_mark, report, database, progress));
        Ok(Self { acknowledged: Some(acknowledged), marked, task, unmarked: HashSet::new() })
    }

    /// Hands `ids` (acknowledged by the broker) to the task.
    pub(super) fn send(&mut self, ids: Vec<Uuid>) {
        if ids.is_empty() {
            return;
        }
        self.unmarked.extend(&ids);
        if let Some(acknowledged) = &self.acknowledged {
            // a closed channel means the task ended: the next `collect` says why
            let _ = acknowledged.send(ids);
        }
    }

    /// The ids not yet reported marked (after [`Self::collect`]).
    pub(super) fn unmarked(&self) -> Vec<Uuid> {
        self.unmarked.iter().copied().collect()
    }

    pub(super) fn unmarked_rows(&self) -> usize {
        self.unmarked.len()
    }

    /// Takes in what the task has marked since the last call, without waiting; errs if the
    /// task failed (its connection is gone).
    pub(super) async fn collect(&mut self) -> Result<(), Error> {
        loop {
            match self.marked.try_recv() {
                Ok(ids) => self.forget(&ids),
                Err(mpsc::error::TryRecvError::Empty) => return Ok(()),
                Err(mpsc::error::TryRecvError::Disconnected) => return Err(self.failure().await),
            }
        }
    }

    /// Waits until fewer than `bound` ids are unmarked.
    pub(super) async fn wait_below(&mut self, bound: usize) -> Result<(), Error> {
        while self.unmarked.len() >= bound {
            match self.marked.recv().await {
                Some(ids) => self.forget(&ids),
                None => return Err(self.failure().await),
            }
        }
        Ok(())
    }

    /// Waits for the task to mark everything handed to it, then ends it.
    pub(super) async fn finish(mut self) -> Result<(), Error> {
        self.acknowledged = None;
        match (&mut self.task).await {
            Ok(result) => result,
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    }

    fn forget(&mut self, ids: &[Uuid]) {
        for id in ids {
            self.unmarked.remove(id);
        }
    }

    /// Why the task ended before it was asked to.
    async fn failure(&mut self) -> Error {
        match (&mut self.task).await {
            Ok(Err(error)) => error,
            Ok(Ok(())) => unreachable!("the marker task ends only when its leader lets it go"),
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    }
}

impl Drop for Marker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The task: marks whatever has arrived in one statement, reports the ids, and again, until the
/// leader closes the channel and everything is marked.
async fn run(
    mut connection: PgConnection,
    mut acknowledged: mpsc::UnboundedReceiver<Vec<Uuid>>,
    report: mpsc::UnboundedSender<Vec<Uuid>>,
    database: &'static str,
    progress: Progress,
) -> Result<(), Error> {
    while let Some(mut ids) = acknowledged.recv().await {
        while ids.len() < MARK_ROWS_MAX {
            match acknowledged.try_recv() {
                Ok(more) => ids.extend(more),
                Err(_) => break,
            }
        }
        let marked = mark(&mut connection, &ids).await?;
        progress.count_published(marked, database);
        if marked < ids.len() as u64 {
            tracing::info!(
                database,
                already_marked = ids.len() as u64 - marked,
                "outbox rows marked by another relay first: both published them (consumers deduplicate by eventoId)"
            );
        }
        // the leader may be gone (it stopped leading): the marks stand
        let _ = report.send(ids);
    }
    drop(connection.close().await);
    Ok(())
}
