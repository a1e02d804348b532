//! Errors of the outbox. How a database failure's kind is told apart is `database::failure`'s.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("outbox database error")]
    Database(#[from] sqlx::Error),
    #[error("outbox publish failed")]
    Kafka(#[from] kafka::Error),
}
