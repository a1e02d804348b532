//! Errors of the Kafka runtime.

use rdkafka::error::KafkaError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A client could not be created from its configuration (a bad setting).
    #[error("invalid Kafka client configuration")]
    Config(#[source] KafkaError),
    /// The broker did not answer.
    #[error("Kafka at {bootstrap} unreachable")]
    Unreachable {
        bootstrap: String,
        #[source]
        source: KafkaError,
    },
    /// The broker answered and refused this client: failed SASL authentication, a TLS
    /// handshake or certificate error. A setting to fix, not an outage to wait out.
    #[error("Kafka at {bootstrap} refused the connection: {reason}")]
    Refused { bootstrap: String, reason: String },
    /// A record was not acknowledged by the broker.
    #[error("produce to {topic} failed")]
    Produce {
        topic: String,
        #[source]
        source: KafkaError,
    },
    /// A transactional call failed; `fatal` means the producer must be recreated.
    #[error("transaction {operation} failed")]
    Transaction {
        operation: &'static str,
        fatal: bool,
        #[source]
        source: KafkaError,
    },
    /// A transactional call did not return in `waited`, although it was given a shorter
    /// timeout: librdkafka waits for some transactional operations without bound (e.g.
    /// `send_offsets_to_transaction` while the group coordinator moves after a broker dies).
    /// The producer must be abandoned and a new one registered, which fences it.
    #[error("transaction {operation} still blocked after {waited:?}; the producer is abandoned")]
    TransactionStuck { operation: &'static str, waited: std::time::Duration },
    /// Receiving from or committing for a consumer failed.
    #[error("consumer {operation} failed")]
    Consumer {
        operation: &'static str,
        #[source]
        source: KafkaError,
    },
    /// The group's committed offsets of some partitions could not be read (the offsets of a
    /// transaction still open, `UNSTABLE_OFFSET_COMMIT`; an authorization refusal): never
    /// taken as "nothing committed". Names each partition and its error.
    #[error("committed offsets unreadable: {0}")]
    CommittedUnreadable(String),
    /// An admin request (topics) failed.
    #[error("admin request {operation} failed")]
    Admin {
        operation: &'static str,
        #[source]
        source: KafkaError,
    },
    /// Topics were created but the broker's metadata did not show a leader for every partition
    /// in time: a client started now would be told they do not exist.
    #[error("topics created but without a leader after {waited:?}: {}", topics.join(", "))]
    NoLeader { topics: Vec<String>, waited: std::time::Duration },
    /// A handler met an error that no retry can fix and that is no record's fault (see
    /// [`crate::consumer::Handler::is_fatal`]): the loop stopped.
    #[error("the handler failed fatally")]
    Fatal(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A call of Confluent's Rust client (`confluent-kafka`, under evaluation, issue #45) failed.
    #[error("Kafka {operation} failed (confluent-kafka)")]
    Confluent {
        operation: &'static str,
        #[source]
        source: confluent_kafka::common::Error,
    },
    /// A blocking librdkafka call running off the runtime panicked or was cancelled.
    #[error("blocking Kafka call did not complete")]
    Blocking(#[from] tokio::task::JoinError),
}

impl Error {
    /// The transactional producer that returned this error cannot go on: drop it and register
    /// a new one (which fences it).
    pub fn needs_new_producer(&self) -> bool {
        matches!(self, Self::Transaction { fatal: true, .. } | Self::TransactionStuck { .. })
    }
}
