//! The relay's statements on `outbox_evento`, each its own short transaction: claim (step 1),
//! mark (step 3), release (step 4) and the lease's renewal; and the claimed row, [`PendingEvent`].

use std::time::Duration;

use sqlx::{FromRow, PgExecutor, Row};
use time::OffsetDateTime;
use uuid::Uuid;

use contracts::headers::{EVENT_ID, EVENT_TYPE, TRACEPARENT, TRACESTATE};
use kafka::producer::OutgoingRecord;

use crate::Error;

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
