//! The backlog gauges (`CONTRACT.md` §5): `outbox_pendentes` (unpublished rows) and
//! `outbox_oldest_pending_seconds` (age of the oldest), labelled with the database.

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

/// Refreshes the gauges until `shutdown`.
pub async fn run(pool: PgPool, database: &'static str, shutdown: CancellationToken) {
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
                ::metrics::gauge!("outbox_pendentes", "database" => database).set(rows as f64);
                ::metrics::gauge!("outbox_oldest_pending_seconds", "database" => database)
                    .set(oldest_seconds);
            }
            Err(error) => tracing::warn!(%error, database, "outbox backlog unreadable"),
        }
    }
}
