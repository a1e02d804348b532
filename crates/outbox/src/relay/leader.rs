//! [`Relay::run`]: one active relay per database, through a PostgreSQL advisory lock held on a
//! dedicated connection, and the leader's loop of claims, publishes, cleanups and waits, its
//! marks handed to its marker.

use std::time::{Duration, Instant};

use futures::FutureExt;
use sqlx::postgres::{PgConnectOptions, PgListener};
use sqlx::{ConnectOptions, Connection, PgConnection};
use tokio_util::sync::CancellationToken;

use crate::{Error, Waker, NOTIFY_CHANNEL};

use super::marker::Marker;
use super::{claim, Relay, LOCK_KEY, SHUTDOWN_MARGIN};

/// Acknowledged rows the leader holds unmarked, in batches: past this it waits for its marker
/// before it claims again (memory, and the rows each claim reads to leave them out, stay
/// bounded when the marks fall behind).
const UNMARKED_BATCHES_MAX: usize = 4;

impl Relay {
    /// Runs until `shutdown`: waits for leadership, then publishes; a lost database connection
    /// drops leadership and the relay competes for it again. Returns at most `shutdown_grace`
    /// plus [`SHUTDOWN_MARGIN`] after `shutdown`, whatever the broker and the database do; by
    /// then every row the broker acknowledged is marked, unless the database did not answer
    /// (those rows are published again by the next leader).
    pub async fn run(self, shutdown: CancellationToken) {
        let database = self.options.database;
        let deadline = async {
            shutdown.cancelled().await;
            tokio::time::sleep(self.options.shutdown_grace + SHUTDOWN_MARGIN).await;
        };
        tokio::select! {
            () = self.compete(&shutdown) => {}
            () = deadline => tracing::warn!(
                database,
                "outbox relay stopped before its last marks were written: the next leader publishes those rows again"
            ),
        }
        self.progress.set_in_flight(0, database);
    }

    async fn compete(&self, shutdown: &CancellationToken) {
        let database = self.options.database;
        self.progress.set_in_flight(0, database);
        while !shutdown.is_cancelled() {
            let Some(mut leader) = self.become_leader(shutdown).await else { return };
            tracing::info!(database, "outbox relay active");
            let led = self.lead(&mut leader, shutdown).await;
            self.progress.set_in_flight(0, database);
            match led {
                Ok(()) => {
                    drop(leader.close().await);
                    return;
                }
                Err(error) => {
                    tracing::warn!(error = %kafka::consumer::error_chain(&error), database, "outbox relay lost its connection; competing again");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(self.options.failure_backoff) => {}
                    }
                }
            }
        }
    }

    /// Where new connections go *now*: after a failover the pool is pointed at the promoted
    /// server, and a copy taken before would keep knocking on the dead one for ever while the
    /// outbox fills.
    fn connect_options(&self) -> PgConnectOptions {
        (*self.pool.connect_options()).clone()
    }

    /// A dedicated connection holding the advisory lock (closing it releases the lock), or
    /// `None` at shutdown. Each attempt connects where the pool's new connections go now.
    async fn become_leader(&self, shutdown: &CancellationToken) -> Option<PgConnection> {
        let mut standby_logged = false;
        loop {
            let options = self.connect_options();
            let attempt = async {
                let mut connection = options.connect().await?;
                let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                    .bind(LOCK_KEY)
                    .fetch_one(&mut connection)
                    .await?;
                Ok::<_, sqlx::Error>(locked.then_some(connection))
            };
            match attempt.await {
                Ok(Some(connection)) => return Some(connection),
                Ok(None) if !standby_logged => {
                    tracing::info!(
                        database = self.options.database,
                        "another outbox relay is active; standing by"
                    );
                    standby_logged = true;
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(%error, database = self.options.database, "outbox relay cannot connect")
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// Leads until `shutdown` (then waits for the marker: `Ok`) or a database error.
    async fn lead(&self, leader: &mut PgConnection, shutdown: &CancellationToken) -> Result<(), Error> {
        let mut listener = if self.options.listen {
            let mut listener = PgListener::connect_with(&self.pool).await?;
            listener.listen(NOTIFY_CHANNEL).await?;
            Some(listener)
        } else {
            None
        };
        let waker = self.options.listen.then_some(&self.waker);
        let mut marker =
            Marker::start(&self.connect_options(), self.options.database, self.progress.clone()).await?;
        self.cycles(leader, &mut listener, waker, &mut marker, shutdown).await?;
        marker.finish().await
    }

    /// The leader's cycles until `shutdown`.
    async fn cycles(
        &self,
        leader: &mut PgConnection,
        listener: &mut Option<PgListener>,
        waker: Option<&Waker>,
        marker: &mut Marker,
        shutdown: &CancellationToken,
    ) -> Result<(), Error> {
        let (database, batch_rows_max) = (self.options.database, self.options.batch_rows_max);
        let unmarked_max = batch_rows_max as usize * UNMARKED_BATCHES_MAX;
        let mut last_cleanup = Instant::now();
        loop {
            if shutdown.is_cancelled() {
                return Ok(());
            }
            // the wake-ups that arrived so far announce rows this claim sees
            while announced(listener, waker)? {}
            marker.wait_below(unmarked_max).await?;
            marker.collect().await?;
            let events = claim(&mut *leader, batch_rows_max, &marker.unmarked()).await?;
            self.progress.set_in_flight(marker.unmarked_rows() + events.len(), database);
            let acknowledged =
                if events.is_empty() { Vec::new() } else { self.deliver(&events, shutdown).await };
            let failed = acknowledged.len() < events.len();
            marker.send(acknowledged);
            self.progress.set_in_flight(marker.unmarked_rows(), database);
            if last_cleanup.elapsed() >= self.options.cleanup_interval {
                let deleted = self.cleanup(leader).await?;
                if deleted > 0 {
                    tracing::debug!(deleted, database, "published outbox rows deleted");
                }
                last_cleanup = Instant::now();
            }
            if failed {
                // the rows whose send failed are taken again by the next claim
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(self.options.failure_backoff) => {}
                }
                continue;
            }
            if self.options.drain_full_batches && events.len() as i64 == batch_rows_max {
                continue; // a full batch: more are probably waiting
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                notification = wait_for_notification(listener) => { notification?; }
                () = woken(waker) => {}
                _ = tokio::time::sleep(self.options.poll_interval) => {}
            }
        }
    }
}

/// Whether a wake-up already arrived (a `NOTIFY`, or a local writer's), without waiting; each
/// call takes one.
fn announced(listener: &mut Option<PgListener>, waker: Option<&Waker>) -> Result<bool, Error> {
    if waker.is_some_and(Waker::take) {
        return Ok(true);
    }
    match listener.as_mut().and_then(|listener| listener.recv().now_or_never()) {
        Some(notification) => notification.map(|_| true).map_err(Error::from),
        None => Ok(false),
    }
}

async fn wait_for_notification(listener: &mut Option<PgListener>) -> Result<(), Error> {
    match listener {
        Some(listener) => {
            listener.recv().await?;
            Ok(())
        }
        None => std::future::pending().await,
    }
}

async fn woken(waker: Option<&Waker>) {
    match waker {
        Some(waker) => waker.woken().await,
        None => std::future::pending().await,
    }
}
