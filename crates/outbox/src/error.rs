//! Errors of the outbox.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("outbox database error")]
    Database(#[from] sqlx::Error),
    #[error("outbox publish failed")]
    Kafka(#[from] kafka::Error),
}
