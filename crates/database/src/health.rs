//! PostgreSQL readiness for `/readyz`, shared by the services that own a database.

use std::future::Future;
use std::pin::Pin;

use sqlx::PgPool;

/// Ready when `SELECT 1` succeeds on the pool.
#[derive(Debug, Clone)]
pub struct DatabaseReady {
    pool: PgPool,
}

impl DatabaseReady {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

impl telemetry::health::ReadinessCheck for DatabaseReady {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn check(&self) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
        Box::pin(async move {
            sqlx::query("SELECT 1").execute(&self.pool).await.map(drop).map_err(|error| error.to_string())
        })
    }
}
