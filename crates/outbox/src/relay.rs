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

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::future::join_all;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use sqlx::postgres::{PgConnectOptions, PgListener};
use sqlx::{ConnectOptions, Connection, FromRow, PgConnection, PgExecutor, PgPool, Row};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use contracts::headers::{EVENT_ID, EVENT_TYPE, TRACEPARENT, TRACESTATE};
use kafka::producer::{Delivered, OutgoingRecord, Producer};

use crate::{Error, NOTIFY_CHANNEL};

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

/// A claimed, not yet published row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PendingEvent {
    pub id: Uuid,
    #[sqlx(rename = "topico")]
    pub topic: String,
    #[sqlx(rename = "chave")]
    pub key: String,
    #[sqlx(rename = "tipo")]
    pub event_type: String,
    pub payload: String,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    #[sqlx(rename = "criado_em")]
    pub created_at: OffsetDateTime,
    /// The acceptance order (`sequencia`): drawn at insert, in insert order (`criado_em` is one
    /// value for every row of a transaction).
    #[sqlx(rename = "sequencia")]
    pub sequence: i64,
}

impl PendingEvent {
    /// The Kafka record: key `chave`, headers `evento-id`, `evento-tipo` and the trace context.
    pub fn record(&self) -> OutgoingRecord {
        let mut record = OutgoingRecord::new(&self.topic, self.key.as_bytes(), self.payload.as_bytes())
            .header(EVENT_ID, self.id.hyphenated().to_string())
            .header(EVENT_TYPE, self.event_type.as_bytes());
        let Some(traceparent) = &self.traceparent else { return record };
        // the relay's hop: a span in the row's trace, whose context the record carries on
        let span = tracing::info_span!("outbox.publish", event_id = %self.id, event_type = %self.event_type, topic = %self.topic);
        telemetry::context::continue_from(&span, Some(traceparent), self.tracestate.as_deref());
        let mut context = telemetry::context::inject(&span);
        let traceparent = context.remove("traceparent").unwrap_or_else(|| traceparent.clone());
        record = record.header(TRACEPARENT, traceparent.into_bytes());
        if let Some(tracestate) = context.remove("tracestate").or_else(|| self.tracestate.clone()) {
            record = record.header(TRACESTATE, tracestate.into_bytes());
        }
        record
    }
}

/// The rows of the id array `$ids` that `$owner` leases and that are still unpublished.
///
/// `(publicado_em IS NULL) IS TRUE` says `publicado_em IS NULL` in a form that does not let
/// the planner use the partial indexes on pending rows: with the queue table's statistics
/// (almost no row pending) it took a scan of every pending row for the cheapest way to find a
/// few ids, where the primary key finds them whatever the backlog.
macro_rules! held_by {
    ($ids:literal, $owner:literal) => {
        concat!("id = ANY(", $ids, ") AND reservado_por = ", $owner, " AND (publicado_em IS NULL) IS TRUE")
    };
}

/// Step 1: leases up to `limit` pending rows to `owner` until `now() + lease`, in acceptance
/// order (`sequencia`), in one statement (its own short transaction): rows whose lease is free,
/// expired or already `owner`'s (left by a cycle of this instance that lost its connection
/// before the mark or the release), `FOR UPDATE SKIP LOCKED`, and never a row behind an earlier
/// row of its key that another instance still leases (a dead relay's rows are published first
/// when their lease ends, so the key's order holds). The rows are returned in acceptance order.
pub async fn claim<'e>(
    executor: impl PgExecutor<'e>,
    owner: Uuid,
    limit: i64,
    lease: Duration,
) -> Result<Vec<PendingEvent>, Error> {
    // the one claim statement, with nothing to mark
    Ok(claim_and_mark(executor, owner, limit, lease, &[]).await?.1)
}

/// Steps 3 and 1 in one statement and one commit: marks published the rows of `acknowledged`
/// that `owner` still holds (as [`mark`]) and leases the next batch as [`claim`] describes,
/// never taking back a row of `acknowledged` (this statement's claim does not see its own
/// marks). With nothing acknowledged it is [`claim`]'s statement.
/// Returns how many it marked and the leased rows in acceptance order. The relay uses it when
/// the next cycle starts at once (a full batch, or rows already announced): a cycle then costs
/// one commit instead of two.
pub async fn claim_and_mark<'e>(
    executor: impl PgExecutor<'e>,
    owner: Uuid,
    limit: i64,
    lease: Duration,
    acknowledged: &[Uuid],
) -> Result<(u64, Vec<PendingEvent>), Error> {
    // every part of a WITH runs once, to completion, on one snapshot; the outer join returns
    // one row even when nothing is leased, to carry the count of marked rows
    // `alheio`: per key, the first pending row another instance still leases, read once (one
    // pass over the pending rows). Written as a per-candidate `NOT EXISTS` over the pending
    // rows, the check was planned as a nested loop that scanned every pending row for every
    // candidate: the statistics of a queue table say almost no row is pending (they are taken
    // while it is drained), so a backlog is never expected, and a claim of 1 000 rows behind a
    // backlog of 20 000 took 7.2 s instead of 30 ms (docs/benchmarks.md, #28)
    let rows = sqlx::query(concat!(
        "WITH marcado AS ( \
           UPDATE outbox_evento SET publicado_em = clock_timestamp() \
           WHERE ",
        held_by!("$4", "$2"),
        " RETURNING 1), \
         alheio AS MATERIALIZED ( \
           SELECT topico, chave, min(sequencia) AS primeira FROM outbox_evento \
           WHERE publicado_em IS NULL AND reservado_ate > now() AND reservado_por <> $2 \
           GROUP BY topico, chave), \
         candidato AS ( \
           SELECT id FROM outbox_evento AS e \
           WHERE publicado_em IS NULL AND id <> ALL($4) \
             AND (reservado_ate IS NULL OR reservado_ate <= now() OR reservado_por = $2) \
             AND NOT EXISTS (SELECT 1 FROM alheio \
                             WHERE alheio.topico = e.topico AND alheio.chave = e.chave \
                               AND alheio.primeira < e.sequencia) \
           ORDER BY sequencia LIMIT $1 FOR UPDATE SKIP LOCKED), \
         reservado AS ( \
           UPDATE outbox_evento AS e SET reservado_por = $2, reservado_ate = now() + make_interval(secs => $3) \
           FROM candidato WHERE e.id = candidato.id \
           RETURNING e.id, e.topico, e.chave, e.tipo, e.payload, e.traceparent, e.tracestate, e.criado_em, e.sequencia) \
         SELECT (SELECT count(*) FROM marcado) AS marcados, reservado.* \
         FROM (VALUES (1)) AS uma LEFT JOIN reservado ON true"
    ))
    .bind(limit)
    .bind(owner)
    .bind(lease.as_secs_f64())
    .bind(acknowledged)
    .fetch_all(executor)
    .await?;
    let mut marked = 0;
    let mut events = Vec::with_capacity(rows.len());
    for row in &rows {
        marked = row.try_get::<i64, _>("marcados")? as u64;
        if row.try_get::<Option<Uuid>, _>("id")?.is_some() {
            events.push(PendingEvent::from_row(row)?);
        }
    }
    events.sort_unstable_by_key(|event| event.sequence);
    Ok((marked, events))
}

/// Extends `owner`'s lease on the unpublished rows of `ids` to `now() + lease`; returns how many
/// it still held.
pub async fn renew<'e>(
    executor: impl PgExecutor<'e>,
    owner: Uuid,
    ids: &[Uuid],
    lease: Duration,
) -> Result<u64, Error> {
    if ids.is_empty() {
        return Ok(0);
    }
    Ok(sqlx::query(concat!(
        "UPDATE outbox_evento SET reservado_ate = now() + make_interval(secs => $3) WHERE ",
        held_by!("$1", "$2")
    ))
    .bind(ids)
    .bind(owner)
    .bind(lease.as_secs_f64())
    .execute(executor)
    .await?
    .rows_affected())
}

/// Step 2: publishes every event at once (enqueued in order, so each partition keeps it) and
/// returns the ids the broker acknowledged. Waits for every answer: the relay's cycle uses
/// [`Relay::deliver`], which renews the lease meanwhile and stops waiting at shutdown.
pub async fn publish(producer: &Producer, events: &[PendingEvent], database: &'static str) -> Vec<Uuid> {
    let records: Vec<OutgoingRecord> = events.iter().map(PendingEvent::record).collect();
    let results = join_all(records.iter().map(|record| producer.send(record))).await;
    events
        .iter()
        .zip(results)
        .filter_map(|(event, result)| was_acknowledged(event, result, database).then_some(event.id))
        .collect()
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

/// Step 3: marks published the rows of `ids` that `owner` still holds (a row whose lease ended
/// and that another relay took is left to that relay, which publishes it again); returns how
/// many it marked. Only acknowledged rows may be passed here.
pub async fn mark<'e>(executor: impl PgExecutor<'e>, owner: Uuid, ids: &[Uuid]) -> Result<u64, Error> {
    if ids.is_empty() {
        return Ok(0);
    }
    // clock_timestamp(), not now(): the moment of the mark, not of the transaction's start
    Ok(sqlx::query(concat!(
        "UPDATE outbox_evento SET publicado_em = clock_timestamp() WHERE ",
        held_by!("$1", "$2")
    ))
    .bind(ids)
    .bind(owner)
    .execute(executor)
    .await?
    .rows_affected())
}

/// Step 4: gives back `owner`'s lease on the unpublished rows of `ids` (their send failed or
/// was given up at shutdown), so the next cycle, of this relay or another, takes them at once.
pub async fn release<'e>(executor: impl PgExecutor<'e>, owner: Uuid, ids: &[Uuid]) -> Result<u64, Error> {
    if ids.is_empty() {
        return Ok(0);
    }
    Ok(sqlx::query(concat!(
        "UPDATE outbox_evento SET reservado_por = NULL, reservado_ate = NULL WHERE ",
        held_by!("$1", "$2")
    ))
    .bind(ids)
    .bind(owner)
    .execute(executor)
    .await?
    .rows_affected())
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

    /// [`publish`] with the lease renewed every third of its length while answers are missing,
    /// and at most `shutdown_grace` of waiting once `shutdown` is cancelled. Returns the
    /// acknowledged ids; a row without an answer counts as not published (it may still reach
    /// the broker from the producer's queue: then it is published twice, never lost).
    async fn deliver(
        &self,
        connection: &mut PgConnection,
        events: &[PendingEvent],
        shutdown: &CancellationToken,
    ) -> Vec<Uuid> {
        let (owner, database, lease) = (self.instance, self.options.database, self.options.lease);
        let records: Vec<OutgoingRecord> = events.iter().map(PendingEvent::record).collect();
        // polled first in push order, so the records are enqueued in acceptance order
        let mut sends: FuturesUnordered<_> = records
            .iter()
            .enumerate()
            .map(|(index, record)| async move { (index, self.producer.send(record).await) })
            .collect();
        let mut acknowledged = Vec::with_capacity(events.len());
        let mut answered = vec![false; events.len()];
        let mut renewal = tokio::time::interval_at(tokio::time::Instant::now() + lease / 3, lease / 3);
        renewal.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
                    answered[index] = true;
                    if was_acknowledged(&events[index], result, database) {
                        acknowledged.push(events[index].id);
                    }
                }
                _ = shutdown.cancelled(), if give_up_at.is_none() => {
                    give_up_at = Some(tokio::time::Instant::now() + self.options.shutdown_grace);
                }
                _ = give_up => {
                    tracing::warn!(
                        database,
                        unanswered = answered.iter().filter(|answered| !**answered).count(),
                        "outbox relay stopping: rows the broker has not acknowledged stay pending and are released"
                    );
                    break;
                }
                _ = renewal.tick() => {
                    let waiting: Vec<Uuid> =
                        events.iter().zip(&answered).filter(|(_, answered)| !**answered).map(|(event, _)| event.id).collect();
                    if let Err(error) = renew(&mut *connection, owner, &waiting, lease).await {
                        tracing::warn!(
                            error = %kafka::consumer::error_chain(&error),
                            database,
                            "outbox lease not renewed: if it ends before the broker answers, another relay may publish the rows again"
                        );
                    }
                }
            }
        }
        acknowledged
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
