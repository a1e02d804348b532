//! Kafka readiness for `/readyz`: a metadata request for the topic the service depends on,
//! answered within the check's time. One topic, not the whole cluster: a cluster-wide request
//! grows with every topic on the broker and, right after a broker restart with many
//! partitions, can outlast the check's timeout while the service works fine.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::producer::Producer;

/// Ready when the broker answers a metadata request for `topic` through `producer`'s
/// connection.
#[derive(Debug, Clone)]
pub struct KafkaReady {
    producer: Producer,
    topic: String,
}

impl KafkaReady {
    pub fn new(producer: Producer, topic: impl Into<String>) -> Self {
        Self { producer, topic: topic.into() }
    }
}

impl telemetry::health::ReadinessCheck for KafkaReady {
    fn name(&self) -> &'static str {
        "kafka"
    }

    fn check(&self) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
        let producer = self.producer.inner();
        let topic = self.topic.clone();
        Box::pin(async move {
            // a producer stopped by a fatal error connects to no broker again: say why (the
            // next send replaces it, see `Producer`)
            if let Some((code, reason)) = producer.client().fatal_error() {
                return Err(format!("producer stopped by a fatal error ({code:?}): {reason}"));
            }
            tokio::task::spawn_blocking(move || {
                producer.client().fetch_metadata(Some(&topic), Duration::from_millis(1500)).map(drop)
            })
            .await
            .map_err(|error| error.to_string())?
            .map_err(|error| error.to_string())
        })
    }
}
