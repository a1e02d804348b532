//! The outbox relay: one active instance per database, publishing pending rows in batches.
//!
//! Leadership is a PostgreSQL session advisory lock held on a dedicated connection: only the
//! holder publishes, so events of one key leave in commit order even with several service
//! instances; a standby retries the lock every second and takes over when the holder's
//! connection dies. Each cycle, in one database transaction:
//!
//! 1. [`claim`] up to `batch_rows_max` pending rows, oldest first, `FOR UPDATE SKIP LOCKED`;
//! 2. [`publish`] them all at once with the idempotent producer and wait for every ack;
//! 3. [`mark`] the acknowledged rows published (a failed row stays pending and is retried);
//! 4. commit.
//!
//! A crash between 2 and 4 publishes the batch again with the same `eventoId`s: at least once.
//! Between cycles the relay sleeps until the insert trigger's `NOTIFY` (the `fast` profile) or
//! the poll interval (the fallback, and the only wake-up of the `reference` profile).

use std::time::{Duration, Instant};

use futures::future::join_all;
use sqlx::postgres::{PgConnectOptions, PgListener};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool, Postgres, Transaction};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use contracts::headers::{EVENT_ID, EVENT_TYPE, TRACEPARENT, TRACESTATE};
use kafka::producer::{OutgoingRecord, Producer};

use crate::{Error, NOTIFY_CHANNEL};

/// The advisory lock key every relay of a database competes for ("pagamentos-outbox").
pub const LOCK_KEY: i64 = 0x7061_6761_6d65_6e74;

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
    pub topico: String,
    pub chave: String,
    pub tipo: String,
    pub payload: String,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    pub criado_em: OffsetDateTime,
    /// The acceptance order: drawn at insert, in insert order (`criado_em` is one value for
    /// every row of a transaction).
    pub sequencia: i64,
}

impl PendingEvent {
    /// The Kafka record: key `chave`, headers `evento-id`, `evento-tipo` and the trace context.
    pub fn record(&self) -> OutgoingRecord {
        let mut record = OutgoingRecord::new(&self.topico, self.chave.as_bytes(), self.payload.as_bytes())
            .header(EVENT_ID, self.id.hyphenated().to_string())
            .header(EVENT_TYPE, self.tipo.as_bytes());
        let Some(traceparent) = &self.traceparent else { return record };
        // the relay's hop: a span in the row's trace, whose context the record carries on
        let span = tracing::info_span!("outbox.publish", evento_id = %self.id, evento_tipo = %self.tipo, topic = %self.topico);
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

/// Step 1: locks up to `limit` pending rows in acceptance order (`sequencia`), skipping rows
/// another transaction holds.
pub async fn claim(tx: &mut Transaction<'_, Postgres>, limit: i64) -> Result<Vec<PendingEvent>, Error> {
    Ok(sqlx::query_as(
        "SELECT id, topico, chave, tipo, payload, traceparent, tracestate, criado_em, sequencia \
         FROM outbox_evento WHERE publicado_em IS NULL \
         ORDER BY sequencia LIMIT $1 FOR UPDATE SKIP LOCKED",
    )
    .bind(limit)
    .fetch_all(&mut **tx)
    .await?)
}

/// Step 2: publishes every event at once (enqueued in order, so each partition keeps it) and
/// returns the ids the broker acknowledged.
pub async fn publish(producer: &Producer, events: &[PendingEvent], database: &'static str) -> Vec<Uuid> {
    let records: Vec<OutgoingRecord> = events.iter().map(PendingEvent::record).collect();
    let results = join_all(records.iter().map(|record| producer.send(record))).await;
    let acknowledged_at = OffsetDateTime::now_utc();
    let mut acknowledged = Vec::with_capacity(events.len());
    for (event, result) in events.iter().zip(results) {
        match result {
            Ok(_) => {
                acknowledged.push(event.id);
                let age = (acknowledged_at - event.criado_em).as_seconds_f64().max(0.0);
                metrics::histogram!("outbox_delivery_seconds", "database" => database).record(age);
            }
            Err(error) => tracing::warn!(
                error = %kafka::consumer::error_chain(&error),
                evento_id = %event.id,
                topic = event.topico,
                "outbox event not published; it stays pending"
            ),
        }
    }
    acknowledged
}

/// Step 3: marks `ids` published.
pub async fn mark(tx: &mut Transaction<'_, Postgres>, ids: &[Uuid]) -> Result<(), Error> {
    if !ids.is_empty() {
        // clock_timestamp(), not now(): the moment of the mark, not of the transaction's start
        sqlx::query("UPDATE outbox_evento SET publicado_em = clock_timestamp() WHERE id = ANY($1)")
            .bind(ids)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
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
}

impl Relay {
    pub fn new(pool: PgPool, producer: Producer, options: RelayOptions) -> Self {
        assert!(options.batch_rows_max > 0, "a batch holds at least one row");
        Self { pool, producer, options }
    }

    /// One claim-publish-mark cycle on `connection`.
    pub async fn cycle(&self, connection: &mut PgConnection) -> Result<Cycle, Error> {
        let mut tx = connection.begin().await?;
        let events = claim(&mut tx, self.options.batch_rows_max).await?;
        if events.is_empty() {
            tx.commit().await?;
            return Ok(Cycle::default());
        }
        let acknowledged = publish(&self.producer, &events, self.options.database).await;
        mark(&mut tx, &acknowledged).await?;
        tx.commit().await?;
        metrics::counter!("outbox_publicados_total", "database" => self.options.database)
            .increment(acknowledged.len() as u64);
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

    /// Runs until `shutdown`: waits for leadership, then publishes; a lost database connection
    /// drops leadership and the relay competes for it again.
    pub async fn run(self, shutdown: CancellationToken) {
        let database = self.options.database;
        while !shutdown.is_cancelled() {
            let Some(mut leader) = self.become_leader(&shutdown).await else { return };
            tracing::info!(database, "outbox relay active");
            match self.lead(&mut leader, &shutdown).await {
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
    /// `None` at shutdown.
    async fn become_leader(&self, shutdown: &CancellationToken) -> Option<PgConnection> {
        let options: PgConnectOptions = (*self.pool.connect_options()).clone();
        let mut standby_logged = false;
        loop {
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
        loop {
            if shutdown.is_cancelled() {
                return Ok(());
            }
            let cycle = self.cycle(leader).await?;
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
                continue; // a full batch: more are probably waiting
            } else {
                self.options.poll_interval
            };
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                notification = wait_for_notification(&mut listener) => { notification?; }
                _ = tokio::time::sleep(pause) => {}
            }
        }
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
