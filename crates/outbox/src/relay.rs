//! The outbox relay: one active instance per database, publishing pending rows in batches.
//!
//! Leadership is a PostgreSQL session advisory lock held on a dedicated connection: only the
//! holder publishes, so events of one key leave in acceptance order even with several service
//! instances; a standby retries the lock every second and takes over when the holder's
//! connection dies. Each cycle:
//!
//! 1. [`claim`] up to `batch_rows_max` pending rows in acceptance order (`sequencia`): one short
//!    statement leases them to this relay instance (`reservado_por`) until `now() + lease`
//!    (`reservado_ate`) and commits;
//! 2. publish them all at once with the idempotent producer and wait for every answer, renewing
//!    the lease meanwhile ([`renew`]);
//! 3. [`mark`] the acknowledged rows published, if this instance still holds them;
//! 4. [`release`] the rows whose send failed, so the next cycle retries them.
//!
//! When the next cycle starts at once (the batch was full, or a `NOTIFY` already announced new
//! rows), step 3 rides on its claim: one statement marks this cycle's rows and leases the
//! next ones ([`claim_and_mark`]), so a relay under steady load commits once per cycle instead
//! of twice. Before it waits, and before it stops, the relay marks what it published on its
//! own: no published row stays unmarked while the relay sleeps.
//!
//! No transaction stays open while Kafka answers: with the broker away for minutes no rows
//! stay locked, no transaction holds back vacuum, and shutdown waits at most `shutdown_grace`
//! for the broker (the rows without an answer are released, never marked).
//!
//! At least once: a crash between 2 and 3 (or before the next cycle's claim that marks them)
//! leaves the rows leased; when the lease ends another relay (or the restarted one) publishes
//! them again with the same `eventoId`. A lease that ends while its relay is still waiting
//! for the broker (the relay could not renew it: its database connection is gone) can also
//! publish a row twice; consumers deduplicate by business id. A claim never takes a row behind
//! an earlier, still leased row of its key, so a dead relay's rows go first once their lease
//! ends and the key's order holds.
//! Between cycles the relay sleeps until the insert trigger's `NOTIFY` (the `fast` profile) or
//! the poll interval (the fallback, and the only wake-up of the `reference` profile).
//!
//! # Layout
//! - here: [`RelayOptions`] and the [`Relay`]'s cycle (claim, deliver, release, mark) and cleanup.
//! - `statements`: the claimed row ([`PendingEvent`]) and the statements of steps 1, 3 and 4
//!   and of the lease's renewal.
//! - `publish`: step 2, the records sent and their answers awaited ([`publish`], and the
//!   relay's own `deliver`, which renews the lease meanwhile).
//! - `leader`: [`Relay::run`]: leadership through the advisory lock, and the loop of cycles.

use std::collections::HashSet;
use std::time::Duration;

use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use kafka::producer::Producer;

use crate::Error;

mod leader;
mod publish;
mod statements;

pub use publish::publish;
pub use statements::{claim, claim_and_mark, mark, release, renew, PendingEvent};

/// The advisory lock key every relay of a database competes for ("pagamentos-outbox").
pub const LOCK_KEY: i64 = 0x7061_6761_6d65_6e74;

/// How long a claim leases its rows by default.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// How long [`Relay::run`] gives a cycle's last database statements (mark, release) after
/// `shutdown_grace` before it stops anyway.
pub const SHUTDOWN_MARGIN: Duration = Duration::from_secs(5);

/// How a relay batches and wakes up.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// Label of the database in logs and metrics (`transferencias`, `ledger`).
    pub database: &'static str,
    /// Most rows claimed per cycle.
    pub batch_rows_max: i64,
    /// Longest sleep between cycles when nothing wakes the relay.
    pub poll_interval: Duration,
    /// Wake on the insert trigger's `NOTIFY`.
    pub listen: bool,
    /// How long published rows are kept before they are deleted.
    pub retention: Duration,
    /// How often published rows past `retention` are deleted.
    pub cleanup_interval: Duration,
    /// Rows deleted per statement, so cleanup never holds long locks.
    pub cleanup_rows_max: i64,
    /// Pause after a cycle in which some row could not be published (broker down).
    pub failure_backoff: Duration,
    /// Start the next cycle at once after a full batch (more rows are probably waiting)
    /// instead of sleeping `poll_interval`.
    pub drain_full_batches: bool,
    /// How long a claim holds its rows (`reservado_ate`); renewed every third of it while the
    /// broker has not answered, so it only runs out when the relay died or cannot reach the
    /// database. Rows of a dead relay wait this long before another relay takes them.
    pub lease: Duration,
    /// How long a cycle still waits for the broker's answers after shutdown; the rows without
    /// one are given back unpublished.
    pub shutdown_grace: Duration,
}

impl RelayOptions {
    /// Ours: large batches, woken at once by `NOTIFY`, a slow fallback poll.
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
            lease: DEFAULT_LEASE,
            shutdown_grace: Duration::from_secs(5),
        }
    }

    /// The reference article's relay: `@Scheduled(fixedDelay = 200)` (a 200 ms pause after
    /// every cycle, full or not), 100 rows, no `NOTIFY`.
    pub fn reference(database: &'static str) -> Self {
        Self {
            batch_rows_max: 100,
            poll_interval: Duration::from_millis(200),
            listen: false,
            drain_full_batches: false,
            ..Self::fast(database)
        }
    }
}

/// What one cycle did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cycle {
    pub claimed: usize,
    pub published: usize,
}

/// The relay of one database.
#[derive(Debug, Clone)]
pub struct Relay {
    pool: PgPool,
    producer: Producer,
    options: RelayOptions,
    /// This instance's name on the rows it leases (`reservado_por`).
    instance: Uuid,
}

impl Relay {
    pub fn new(pool: PgPool, producer: Producer, options: RelayOptions) -> Self {
        assert!(options.batch_rows_max > 0, "a batch holds at least one row");
        assert!(options.lease >= Duration::from_secs(1), "a lease lasts at least a second");
        Self { pool, producer, options, instance: Uuid::new_v4() }
    }

    /// The id this relay leases rows under (`outbox_evento.reservado_por`).
    pub fn instance(&self) -> Uuid {
        self.instance
    }

    /// One lease-publish-mark cycle on `connection`, each database step a short statement of
    /// its own: no transaction stays open while Kafka answers. After `shutdown` the cycle waits
    /// at most `shutdown_grace` more for the broker, then gives the unanswered rows back.
    pub async fn cycle(
        &self,
        connection: &mut PgConnection,
        shutdown: &CancellationToken,
    ) -> Result<Cycle, Error> {
        let mut acknowledged = Vec::new();
        let cycle = self.cycle_deferring_mark(connection, shutdown, &mut acknowledged).await?;
        self.mark_acknowledged(connection, &mut acknowledged).await?;
        Ok(cycle)
    }

    /// A cycle whose mark is left to the caller: its claim marks the previous cycle's
    /// `acknowledged` rows in the same statement ([`claim_and_mark`]), and on return
    /// `acknowledged` holds this cycle's, published but not yet marked. The caller marks them
    /// with the next cycle's claim, or alone ([`Self::mark_acknowledged`]) before the relay
    /// waits or stops: rows never stay unmarked while the relay sleeps.
    async fn cycle_deferring_mark(
        &self,
        connection: &mut PgConnection,
        shutdown: &CancellationToken,
        acknowledged: &mut Vec<Uuid>,
    ) -> Result<Cycle, Error> {
        let owner = self.instance;
        let (marked, events) = claim_and_mark(
            &mut *connection,
            owner,
            self.options.batch_rows_max,
            self.options.lease,
            acknowledged,
        )
        .await?;
        self.count_marked(acknowledged.len(), marked);
        acknowledged.clear();
        if events.is_empty() {
            return Ok(Cycle::default());
        }
        *acknowledged = self.deliver(connection, &events, shutdown).await;
        let acknowledged_set: HashSet<&Uuid> = acknowledged.iter().collect();
        let unpublished: Vec<Uuid> =
            events.iter().map(|event| event.id).filter(|id| !acknowledged_set.contains(id)).collect();
        release(&mut *connection, owner, &unpublished).await?;
        Ok(Cycle { claimed: events.len(), published: acknowledged.len() })
    }

    /// Marks the `acknowledged` rows published on their own ([`mark`]) and empties the list.
    async fn mark_acknowledged(
        &self,
        connection: &mut PgConnection,
        acknowledged: &mut Vec<Uuid>,
    ) -> Result<(), Error> {
        let marked = mark(&mut *connection, self.instance, acknowledged).await?;
        self.count_marked(acknowledged.len(), marked);
        acknowledged.clear();
        Ok(())
    }

    fn count_marked(&self, acknowledged: usize, marked: u64) {
        let database = self.options.database;
        if marked < acknowledged as u64 {
            tracing::warn!(
                database,
                lost = acknowledged as u64 - marked,
                "outbox lease ended before the broker answered and another relay took the rows: they are published again (consumers deduplicate by eventoId)"
            );
        }
        metrics::counter!("outbox_published_total", "database" => database).increment(marked);
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
