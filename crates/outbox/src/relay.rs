//! The outbox relay: one active instance per database, publishing pending rows in batches.
//!
//! Leadership is a PostgreSQL session advisory lock held on a dedicated connection: only the
//! holder publishes, so events of one key leave in acceptance order even with several service
//! instances; a standby retries the lock every second and takes over when the holder's
//! connection dies. Each cycle of the leader:
//!
//! 1. [`claim`] up to `batch_rows_max` pending rows in acceptance order (`sequencia`), leaving
//!    out the rows it has sent and not yet seen marked: a plain indexed read, no row lock, no
//!    write, no commit;
//! 2. publish them all at once with the idempotent producer and wait for every answer;
//! 3. hand the acknowledged ids to its marker, a task on a second connection that [`mark`]s
//!    them published, one `UPDATE` for whatever has arrived, and tells the leader which ids are
//!    marked so it stops leaving them out of its claims. The next claim does not wait for the
//!    mark.
//!
//! A row whose send failed is not left out, so the next claim (after `failure_backoff`) takes
//! it again. Before the relay stops it waits for its marker: every row the broker acknowledged
//! is marked when [`Relay::run`] returns (unless the database is away).
//!
//! No transaction stays open while Kafka answers, and the event's path holds no lock and
//! commits nothing: with the broker away for minutes no rows stay locked, no transaction holds
//! back vacuum, and shutdown waits at most `shutdown_grace` for the broker (the rows without an
//! answer stay pending, never marked).
//!
//! At least once: a leader that dies (or loses its connection) between the broker's
//! acknowledgement and the mark leaves the rows pending; the next leader, or this one when it
//! leads again, publishes them again at once with the same `eventoId`, before the later rows of
//! their key (its claim reads every pending row in `sequencia` order). Consumers deduplicate by
//! it.
//!
//! Between cycles the relay sleeps until a wake-up or the poll interval (the fallback, and the
//! only wake-up of the `reference` profile). Two things wake it (the `fast` profile): a local
//! writer's [`crate::Waker`], called after its commit, and the insert trigger's `NOTIFY`, which
//! any writer of the table fires (a Java service's too) and which reaches the leader in whichever
//! process it runs.
//!
//! # Layout
//! - here: [`RelayOptions`], the [`Relay`]'s one-shot [`Relay::cycle`], cleanup, and
//!   [`Progress`].
//! - `statements`: the claimed row ([`PendingEvent`]) and the statements of steps 1 and 3.
//! - `publish`: step 2, the records sent and their answers awaited ([`publish`], and the
//!   relay's own `deliver`, which stops waiting at shutdown).
//! - `marker`: step 3 off the path, the marker task.
//! - `leader`: [`Relay::run`]: leadership through the advisory lock, and the leader's loop.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;

use kafka::config::Profile;
use kafka::producer::Producer;

use crate::{Error, Waker};

mod leader;
mod marker;
mod publish;
mod statements;

pub use publish::publish;
pub use statements::{claim, mark, PendingEvent};

/// The advisory lock key every relay of a database competes for ("pagamentos-outbox").
pub const LOCK_KEY: i64 = 0x7061_6761_6d65_6e74;

/// How long [`Relay::run`] gives its last marks after `shutdown_grace` before it stops anyway.
pub const SHUTDOWN_MARGIN: Duration = Duration::from_secs(5);

/// How a relay batches and wakes up.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// Label of the database in logs and metrics (`transferencias`, `ledger`).
    pub database: &'static str,
    /// Most rows claimed per cycle. The leader also holds at most four batches' worth of
    /// acknowledged rows not yet marked: past that, it waits for its marker before it claims.
    pub batch_rows_max: i64,
    /// Longest sleep between cycles when nothing wakes the relay.
    pub poll_interval: Duration,
    /// Wake on the insert trigger's `NOTIFY` and on local writers' [`Waker`].
    pub listen: bool,
    /// How long published rows are kept before they are deleted.
    pub retention: Duration,
    /// How often published rows past `retention` are deleted.
    pub cleanup_interval: Duration,
    /// Rows deleted per statement, so cleanup never holds long locks.
    pub cleanup_rows_max: i64,
    /// Pause after a cycle in which some row could not be published (broker down); wake-ups do
    /// not cut it short.
    pub failure_backoff: Duration,
    /// Start the next cycle at once after a full batch (more rows are probably waiting)
    /// instead of sleeping `poll_interval`.
    pub drain_full_batches: bool,
    /// How long a cycle still waits for the broker's answers after shutdown; the rows without
    /// one stay pending.
    pub shutdown_grace: Duration,
}

impl RelayOptions {
    /// Ours: large batches, woken at once by local writers and `NOTIFY`, a slow fallback poll.
    pub fn fast(database: &'static str) -> Self {
        Self {
            database,
            batch_rows_max: 1000,
            poll_interval: Duration::from_secs(1),
            listen: true,
            retention: Duration::from_secs(24 * 60 * 60),
            cleanup_interval: Duration::from_secs(60),
            cleanup_rows_max: 1000,
            failure_backoff: Duration::from_secs(1),
            drain_full_batches: true,
            shutdown_grace: Duration::from_secs(5),
        }
    }

    /// The reference article's relay: `@Scheduled(fixedDelay = 200)` (a 200 ms pause after
    /// every cycle, full or not), 100 rows, no wake-ups.
    pub fn reference(database: &'static str) -> Self {
        Self {
            batch_rows_max: 100,
            poll_interval: Duration::from_millis(200),
            listen: false,
            drain_full_batches: false,
            ..Self::fast(database)
        }
    }

    /// [`Self::fast`] or [`Self::reference`], as `profile` says.
    pub fn of(profile: Profile, database: &'static str) -> Self {
        match profile {
            Profile::Fast => Self::fast(database),
            Profile::Reference => Self::reference(database),
        }
    }
}

/// What one cycle did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cycle {
    pub claimed: usize,
    pub published: usize,
}

/// What a relay instance holds and has done, readable while it runs. Cheap to clone; clones
/// share the values.
#[derive(Debug, Clone, Default)]
pub struct Progress(Arc<Counts>);

#[derive(Debug, Default)]
struct Counts {
    in_flight: AtomicI64,
    published: AtomicU64,
}

impl Progress {
    /// Rows this instance has claimed and not yet seen marked: sent and waiting for the
    /// broker's answer, or acknowledged and waiting for their mark (`outbox_in_flight_rows`).
    /// 0 while it is not the leader.
    pub fn in_flight(&self) -> i64 {
        self.0.in_flight.load(Ordering::Relaxed)
    }

    /// Rows this instance has marked published since it started.
    pub fn published(&self) -> u64 {
        self.0.published.load(Ordering::Relaxed)
    }

    fn set_in_flight(&self, rows: usize, database: &'static str) {
        self.0.in_flight.store(rows as i64, Ordering::Relaxed);
        metrics::gauge!("outbox_in_flight_rows", "database" => database).set(rows as f64);
    }

    fn count_published(&self, rows: u64, database: &'static str) {
        self.0.published.fetch_add(rows, Ordering::Relaxed);
        metrics::counter!("outbox_published_total", "database" => database).increment(rows);
    }
}

/// The relay of one database.
#[derive(Debug, Clone)]
pub struct Relay {
    pool: PgPool,
    producer: Producer,
    options: RelayOptions,
    waker: Waker,
    progress: Progress,
}

impl Relay {
    pub fn new(pool: PgPool, producer: Producer, options: RelayOptions) -> Self {
        assert!(options.batch_rows_max > 0, "a batch holds at least one row");
        Self { pool, producer, options, waker: Waker::default(), progress: Progress::default() }
    }

    /// The handle local writers wake this relay with after their commit (ignored unless
    /// `listen`).
    pub fn waker(&self) -> Waker {
        self.waker.clone()
    }

    /// What this relay holds and has done.
    pub fn progress(&self) -> Progress {
        self.progress.clone()
    }

    /// One claim-publish-mark cycle on `connection`, outside leadership, the mark written on
    /// `connection` before it returns: a claim of every pending row (nothing left out), then
    /// at most `shutdown_grace` of waiting for the broker after `shutdown`. [`Relay::run`] is
    /// the relay itself; this is one step of it, for tools and tests.
    pub async fn cycle(
        &self,
        connection: &mut PgConnection,
        shutdown: &CancellationToken,
    ) -> Result<Cycle, Error> {
        let events = claim(&mut *connection, self.options.batch_rows_max, &[]).await?;
        if events.is_empty() {
            return Ok(Cycle::default());
        }
        let acknowledged = self.deliver(&events, shutdown).await;
        let marked = mark(&mut *connection, &acknowledged).await?;
        self.progress.count_published(marked, self.options.database);
        Ok(Cycle { claimed: events.len(), published: acknowledged.len() })
    }

    /// Deletes published rows older than the retention, a small batch at a time.
    pub async fn cleanup(&self, connection: &mut PgConnection) -> Result<u64, Error> {
        let retention_seconds = self.options.retention.as_secs_f64();
        let mut deleted = 0;
        loop {
            let rows = sqlx::query(
                "DELETE FROM outbox_evento WHERE id IN (SELECT id FROM outbox_evento \
                 WHERE publicado_em < now() - make_interval(secs => $1) LIMIT $2)",
            )
            .bind(retention_seconds)
            .bind(self.options.cleanup_rows_max)
            .execute(&mut *connection)
            .await?
            .rows_affected();
            deleted += rows;
            if rows < self.options.cleanup_rows_max as u64 {
                return Ok(deleted);
            }
        }
    }
}
