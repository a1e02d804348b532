//! [`Relay::run`]: one active relay per database, through a PostgreSQL advisory lock held on a
//! dedicated connection, and the leader's loop of cycles, cleanups and waits.

use std::time::{Duration, Instant};

use futures::FutureExt;
use sqlx::postgres::{PgConnectOptions, PgListener};
use sqlx::{ConnectOptions, Connection, PgConnection};
use tokio_util::sync::CancellationToken;

use crate::{Error, NOTIFY_CHANNEL};

use super::{Relay, LOCK_KEY, SHUTDOWN_MARGIN};

impl Relay {
    /// Runs until `shutdown`: waits for leadership, then publishes; a lost database connection
    /// drops leadership and the relay competes for it again. Returns at most `shutdown_grace`
    /// plus [`SHUTDOWN_MARGIN`] after `shutdown`, whatever the broker and the database do: a
    /// cycle cut short leaves its rows leased until their lease ends, never marked.
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
                "outbox relay stopped in the middle of a cycle: its leased rows are published when the lease ends"
            ),
        }
    }

    async fn compete(&self, shutdown: &CancellationToken) {
        let database = self.options.database;
        while !shutdown.is_cancelled() {
            let Some(mut leader) = self.become_leader(shutdown).await else { return };
            tracing::info!(database, instance = %self.instance, "outbox relay active");
            match self.lead(&mut leader, shutdown).await {
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

    /// A dedicated connection holding the advisory lock (closing it releases the lock), or
    /// `None` at shutdown. Each attempt connects where the pool's new connections go *now*:
    /// after a failover the pool is pointed at the promoted server, and a copy taken before
    /// would keep knocking on the dead one for ever while the outbox fills.
    async fn become_leader(&self, shutdown: &CancellationToken) -> Option<PgConnection> {
        let mut standby_logged = false;
        loop {
            let options: PgConnectOptions = (*self.pool.connect_options()).clone();
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

    async fn lead(&self, leader: &mut PgConnection, shutdown: &CancellationToken) -> Result<(), Error> {
        let mut listener = if self.options.listen {
            let mut listener = PgListener::connect_with(&self.pool).await?;
            listener.listen(NOTIFY_CHANNEL).await?;
            Some(listener)
        } else {
            None
        };
        let mut last_cleanup = Instant::now();
        // published rows whose mark rides on the next cycle's claim
        let mut acknowledged = Vec::new();
        loop {
            if shutdown.is_cancelled() {
                self.mark_acknowledged(leader, &mut acknowledged).await?;
                return Ok(());
            }
            let cycle = self.cycle_deferring_mark(leader, shutdown, &mut acknowledged).await?;
            if last_cleanup.elapsed() >= self.options.cleanup_interval {
                let deleted = self.cleanup(leader).await?;
                if deleted > 0 {
                    tracing::debug!(
                        deleted,
                        database = self.options.database,
                        "published outbox rows deleted"
                    );
                }
                last_cleanup = Instant::now();
            }
            let pause = if cycle.published < cycle.claimed {
                self.options.failure_backoff
            } else if self.options.drain_full_batches && cycle.claimed as i64 == self.options.batch_rows_max {
                continue; // a full batch: more are probably waiting, and the next claim marks
            } else if announced(&mut listener)? {
                continue; // rows were committed meanwhile: the next claim takes them and marks
            } else {
                self.options.poll_interval
            };
            self.mark_acknowledged(leader, &mut acknowledged).await?;
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                notification = wait_for_notification(&mut listener) => { notification?; }
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }
}

/// Whether a `NOTIFY` already arrived (rows committed since the last wait), without waiting.
fn announced(listener: &mut Option<PgListener>) -> Result<bool, Error> {
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
