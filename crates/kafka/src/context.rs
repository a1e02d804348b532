//! The librdkafka client context shared by every client: its log lines go to `tracing` under
//! the `librdkafka` target, and consumer rebalances are logged.

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;

/// Context of every pagamentos Kafka client.
#[derive(Debug, Clone, Default)]
pub struct Context;

impl ClientContext for Context {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", facility, "{message}")
            }
            RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", facility, "{message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", facility, "{message}")
            }
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", facility, "{message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // librdkafka reports transient errors (a broker restart) here and recovers on its own
        tracing::warn!(target: "librdkafka", %error, reason, "kafka client error");
    }
}

impl ConsumerContext for Context {
    fn post_rebalance(&self, _consumer: &rdkafka::consumer::BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(partitions) => {
                tracing::info!(partitions = partitions.count(), "partitions assigned")
            }
            Rebalance::Revoke(partitions) => {
                tracing::info!(partitions = partitions.count(), "partitions revoked")
            }
            Rebalance::Error(error) => tracing::warn!(%error, "rebalance error"),
        }
    }
}
