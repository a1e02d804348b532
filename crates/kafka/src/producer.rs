//! The idempotent producer every service publishes with, and the record it takes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::Producer as _;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;

use crate::delivery::ServedProducer;
use crate::Error;

/// A record to publish, owning its bytes so it can wait in a retry or a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingRecord {
    pub topic: String,
    /// `None`: the partitioner decides from the key (murmur2, as Java).
    pub partition: Option<i32>,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
}

impl OutgoingRecord {
    pub fn new(topic: impl Into<String>, key: impl Into<Vec<u8>>, payload: impl Into<Vec<u8>>) -> Self {
        Self {
            topic: topic.into(),
            partition: None,
            key: Some(key.into()),
            payload: payload.into(),
            headers: Vec::new(),
        }
    }

    pub fn header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The value of the last header called `name` (as `Headers.lastHeader`: the newest of
    /// the values a retry record collects hop by hop).
    pub fn header_value(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().rev().find(|(key, _)| key == name).map(|(_, value)| value.as_slice())
    }

    /// Every value of the headers called `name`, oldest first.
    pub fn header_values(&self, name: &str) -> Vec<&[u8]> {
        self.headers.iter().filter(|(key, _)| key == name).map(|(_, value)| value.as_slice()).collect()
    }

    /// The headers as librdkafka carries them, in order (what a consumer of the record sees).
    pub fn owned_headers(&self) -> OwnedHeaders {
        self.headers
            .iter()
            .fold(OwnedHeaders::new_with_capacity(self.headers.len()), |headers, (key, value)| {
                headers.insert(Header { key, value: Some(value) })
            })
    }
}

/// Where the broker stored a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub partition: i32,
    pub offset: i64,
}

/// `acks=all`, idempotent producer (see [`crate::config::producer_config`]). Cheap to clone:
/// clones share one librdkafka producer.
///
/// It heals itself from a fatal error. An idempotent producer that loses track of its
/// sequence numbers (after a broker restart: `UNKNOWN_PRODUCER_ID` it cannot retry safely, a
/// sequence desynchronisation) stops for good: every later send fails and it never connects to
/// a broker again, so `/readyz` would say "BrokerTransportFailure" until the process restarts.
/// The send that sees such an error fails as usual (its caller retries it: an outbox row stays
/// pending, a consumer batch is retried) and the producer is replaced by a new one with the
/// same configuration, a new producer id. Counted in `kafka_producer_recreated_total{client}`.
#[derive(Clone)]
pub struct Producer {
    shared: Arc<Shared>,
}

struct Shared {
    config: ClientConfig,
    client_id: String,
    current: Mutex<ServedProducer>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer").field("client_id", &self.shared.client_id).finish_non_exhaustive()
    }
}

impl Producer {
    pub fn new(config: &ClientConfig) -> Result<Self, Error> {
        let current = ServedProducer::new(config).map_err(Error::Config)?;
        let client_id = config.get("client.id").unwrap_or("rdkafka").to_owned();
        Ok(Self {
            shared: Arc::new(Shared { config: config.clone(), client_id, current: Mutex::new(current) }),
        })
    }

    /// `shared`, the producer a process hands all its services (`pagamentos all`), or else a
    /// service's own, named `client_id`.
    pub fn shared_or_own(
        shared: Option<Producer>,
        args: &crate::KafkaArgs,
        client_id: &str,
        linger: Duration,
    ) -> Result<Self, Error> {
        match shared {
            Some(shared) => Ok(shared),
            None => Self::new(&crate::config::producer_config(args, client_id, linger)),
        }
    }

    /// Publishes `record` and waits for the broker's acknowledgement (all in-sync replicas).
    /// A full local queue is waited out, never turned into an error.
    pub async fn send(&self, record: &OutgoingRecord) -> Result<Delivered, Error> {
        let producer = self.inner();
        match producer.send(record).await {
            Ok(delivered) => Ok(delivered),
            Err(source) => {
                if let Some((code, reason)) = producer.client().fatal_error() {
                    self.replace(&producer, code, &reason);
                }
                Err(Error::Produce { topic: record.topic.clone(), source })
            }
        }
    }

    /// Replaces `failed` by a new producer, unless another send already did.
    fn replace(&self, failed: &ServedProducer, code: RDKafkaErrorCode, reason: &str) {
        let mut current = self.shared.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.client().native_ptr() != failed.client().native_ptr() {
            return;
        }
        match ServedProducer::new(&self.shared.config) {
            Ok(fresh) => {
                let old = std::mem::replace(&mut *current, fresh);
                drop(current);
                tracing::warn!(client = %self.shared.client_id, ?code, reason, "producer hit a fatal error: replaced by a new one");
                metrics::counter!("kafka_producer_recreated_total", "client" => self.shared.client_id.clone()).increment(1);
                // destroying a producer joins its delivery thread, purges and flushes (up to
                // 500 ms)
                match tokio::runtime::Handle::try_current() {
                    Ok(runtime) => drop(runtime.spawn_blocking(move || drop(old))),
                    Err(_) => drop(old),
                }
            }
            Err(error) => {
                tracing::error!(client = %self.shared.client_id, %error, "producer hit a fatal error and could not be replaced");
            }
        }
    }

    /// Waits until every queued record was acknowledged or `timeout` passed.
    pub async fn flush(&self, timeout: Duration) -> Result<(), Error> {
        let inner = self.inner();
        tokio::task::spawn_blocking(move || inner.base().flush(timeout))
            .await?
            .map_err(|source| Error::Produce { topic: "(flush)".into(), source })
    }

    /// The librdkafka producer in use now (a cheap handle; a fatal error replaces it).
    pub fn inner(&self) -> ServedProducer {
        self.shared.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::mocking::MockCluster;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    use super::*;
    use crate::config::producer_config;
    use crate::KafkaArgs;

    /// librdkafka's mock cluster: a broker that answers a sequence error on demand.
    #[tokio::test]
    async fn a_producer_stopped_by_a_fatal_error_is_replaced_and_publishes_again() {
        let cluster = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("pagamentos", 1, 1).expect("topic");
        let producer = Producer::new(&producer_config(
            &KafkaArgs::new(cluster.bootstrap_servers()),
            "test",
            Duration::ZERO,
        ))
        .expect("producer");
        let record = OutgoingRecord::new("pagamentos", "CC-001", "{}");
        producer.send(&record).await.expect("a healthy producer publishes");
        let first = producer.inner();

        // the head-of-line request refused for its sequence: librdkafka stops the idempotent
        // producer for good (it can no longer promise order or once-ness)
        cluster.request_errors(
            RDKafkaApiKey::Produce,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER],
        );
        producer.send(&record).await.expect_err("the send that meets the fatal error fails");
        assert!(first.client().fatal_error().is_some(), "librdkafka stopped the first producer");

        let second = producer.inner();
        assert_ne!(second.client().native_ptr(), first.client().native_ptr(), "replaced");
        assert!(second.client().fatal_error().is_none());
        producer.send(&record).await.expect("the new producer publishes");
        // clones share the replacement
        let clone = producer.clone();
        assert_eq!(clone.inner().client().native_ptr(), second.client().native_ptr());
    }
}
