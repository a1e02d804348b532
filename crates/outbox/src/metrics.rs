//! The backlog gauges (`docs/reference/contract.md` §5): `outbox_pendentes` (unpublished rows) and
//! `outbox_oldest_pending_seconds` (age of the oldest), labelled with the database. Ours,
//! `outbox_in_flight_rows` (what the leader has claimed and not yet seen marked) and
//! `outbox_published_total`, come from the relay itself ([`crate::relay::Progress`]).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// How often the gauges are refreshed: one indexed query each time (the partial index on
/// pending rows keeps it cheap however large the published history is).
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// The current backlog: (rows, age of the oldest in seconds).
pub async fn backlog(pool: &PgPool) -> Result<(i64, f64), sqlx::Error> {
    sqlx::query_as(
        "SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(criado_em))::float8, 0) \
         FROM outbox_evento WHERE publicado_em IS NULL",
    )
    .fetch_one(pool)
    .await
}

/// The unpublished rows as last measured by [`run`] (0 until then), for whoever sheds load on
/// it: the transfers API answers `503` past a bound instead of letting the outbox grow without
/// limit while Kafka is away. Cheap to clone; clones share the value.
#[derive(Debug, Clone, Default)]
pub struct Backlog(Arc<AtomicI64>);

impl Backlog {
    pub fn rows(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }

    pub fn set(&self, rows: i64) {
        self.0.store(rows, Ordering::Relaxed)
    }
}

/// Refreshes the gauges and `measured` until `shutdown`.
pub async fn run(pool: PgPool, database: &'static str, measured: Backlog, shutdown: CancellationToken) {
    let mut interval = tokio::time::interval(REFRESH_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            _ = interval.tick() => {}
        }
        match backlog(&pool).await {
            Ok((rows, oldest_seconds)) => {
                measured.set(rows);
                ::metrics::gauge!("outbox_pendentes", "database" => database).set(rows as f64);
                ::metrics::gauge!("outbox_oldest_pending_seconds", "database" => database)
                    .set(oldest_seconds);
            }
            Err(error) => tracing::warn!(%error, database, "outbox backlog unreadable"),
        }
    }
}
