//! The transactional outbox (reference article §4): an event is written to `outbox_evento` in
//! the same database transaction as the business row it announces, and a relay publishes it to
//! Kafka afterwards. No distributed transaction, no dual write: if the business row committed,
//! the event will be published; if it rolled back, the event never existed.
//!
//! # Layout
//! - [`insert`]: add an event to the caller's transaction; [`Waker`]: wake this process's relay
//!   after the commit.
//! - [`relay`]: the relay loop: one active relay per database (an advisory lock) reads pending
//!   rows in acceptance order (a plain indexed read: no lock, no write), publishes them with the
//!   idempotent producer, and marks the acknowledged ones published on a second connection, off
//!   the event's path.
//! - [`metrics`]: `outbox_pendentes`, `outbox_oldest_pending_seconds` (the relay itself reports
//!   `outbox_in_flight_rows` and `outbox_published_total`).
//! - [`migrations`]: `outbox_evento`'s migrations, merged into each service's migrator.
//!
//! # Architecture invariant
//! Knows the `outbox_evento` table and nothing else of a service's schema. It owns the table's
//! migrations ([`migrations`]), which every service's migrator carries: the article's columns
//! plus `traceparent`/`tracestate`, the acceptance order `sequencia` and its partial index on
//! pending rows, and the `NOTIFY outbox_evento` insert trigger (see [`NOTIFY_CHANNEL`]).
//!
//! # Guarantees
//! At least once: a relay that dies (or stops leading) after the broker's acknowledgement and
//! before the mark leaves the row pending, and the next leader publishes it again at once with
//! the same `eventoId` (consumers deduplicate by it); a row is never lost, and never marked
//! published without the broker's acknowledgement.
//! Per-key order holds for events committed one after the other, because only the relay that
//! holds the database's advisory lock publishes, in `sequencia` order, and the idempotent
//! producer keeps each partition's order across retries.

#![forbid(unsafe_code)]

pub mod error;
pub mod metrics;
pub mod migrations;
pub mod relay;

use std::sync::Arc;

pub use error::Error;
use futures::FutureExt;
use sqlx::PgConnection;
use tokio::sync::Notify;
use uuid::Uuid;

/// The channel the `outbox_evento` insert trigger notifies, so any writer (ours or a Java
/// service on the same table) wakes the relay at once.
pub const NOTIFY_CHANNEL: &str = "outbox_evento";

/// Wakes the relay of this process at once: a local writer calls [`Waker::wake`] after it
/// committed outbox rows, so the relay does not wait for the `NOTIFY` to come back through
/// PostgreSQL (which still wakes whichever relay leads, in any process, for any writer).
/// Wake-ups are not counted: many before the relay looks are one cycle, and one during a cycle
/// makes the next cycle start at once. Cheap to clone; clones wake the same relay
/// ([`relay::Relay::waker`]).
#[derive(Debug, Clone, Default)]
pub struct Waker(Arc<Notify>);

impl Waker {
    /// Announces rows committed just now.
    pub fn wake(&self) {
        self.0.notify_one();
    }

    /// Waits for a wake-up (takes it at once if one arrived since the last): what the relay does
    /// between cycles.
    pub async fn woken(&self) {
        self.0.notified().await;
    }

    /// Takes a wake-up that already arrived, without waiting.
    fn take(&self) -> bool {
        self.0.notified().now_or_never().is_some()
    }
}

/// An event to publish.
#[derive(Debug, Clone)]
pub struct NewEvent<'a> {
    /// The event's `eventoId`: the row's primary key.
    pub id: Uuid,
    pub topic: &'a str,
    /// The record key (`contaOrigem` for every pagamentos event).
    pub key: &'a str,
    /// `evento-tipo`, e.g. `TransferenciaSolicitada`.
    pub event_type: &'a str,
    /// The JSON payload.
    pub payload: &'a str,
    /// W3C trace context of the span that wrote the event.
    pub traceparent: Option<&'a str>,
    pub tracestate: Option<&'a str>,
}

/// Writes `event` in the caller's open transaction.
pub async fn insert(connection: &mut PgConnection, event: &NewEvent<'_>) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO outbox_evento (id, topico, chave, tipo, payload, traceparent, tracestate) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(event.id)
    .bind(event.topic)
    .bind(event.key)
    .bind(event.event_type)
    .bind(event.payload)
    .bind(event.traceparent)
    .bind(event.tracestate)
    .execute(connection)
    .await?;
    Ok(())
}

/// Writes `events` in the caller's open transaction with one statement (`UNNEST`), in order.
pub async fn insert_many(connection: &mut PgConnection, events: &[NewEvent<'_>]) -> Result<(), Error> {
    if events.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = events.iter().map(|event| event.id).collect();
    // `sequencia` orders the relay: drawn as the rows are inserted, in input order (`ORDER BY
    // ordem`); criado_em also increases in input order, for the humans reading the table
    sqlx::query(
        "INSERT INTO outbox_evento (id, topico, chave, tipo, payload, traceparent, tracestate, criado_em) \
         SELECT id, topico, chave, tipo, payload, traceparent, tracestate, \
                clock_timestamp() + (ordem - 1) * interval '1 microsecond' \
         FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[]) \
              WITH ORDINALITY AS novo(id, topico, chave, tipo, payload, traceparent, tracestate, ordem) \
         ORDER BY ordem",
    )
    .bind(ids)
    .bind(events.iter().map(|event| event.topic).collect::<Vec<_>>())
    .bind(events.iter().map(|event| event.key).collect::<Vec<_>>())
    .bind(events.iter().map(|event| event.event_type).collect::<Vec<_>>())
    .bind(events.iter().map(|event| event.payload).collect::<Vec<_>>())
    .bind(events.iter().map(|event| event.traceparent).collect::<Vec<_>>())
    .bind(events.iter().map(|event| event.tracestate).collect::<Vec<_>>())
    .execute(connection)
    .await?;
    Ok(())
}
