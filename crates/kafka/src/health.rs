//! Kafka readiness for `/readyz`: a metadata request answered within the check's time.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use rdkafka::producer::Producer as _;

use crate::producer::Producer;

/// Ready when the broker answers a metadata request through `producer`'s connection.
#[derive(Debug, Clone)]
pub struct KafkaReady {
    producer: Producer,
}

impl KafkaReady {
    pub fn new(producer: Producer) -> Self {
        Self { producer }
    }
}

impl telemetry::health::ReadinessCheck for KafkaReady {
    fn name(&self) -> &'static str {
        "kafka"
    }

    fn check(&self) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
        let producer = self.producer.inner().clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                producer.client().fetch_metadata(None, Duration::from_millis(1500)).map(drop)
            })
            .await
            .map_err(|error| error.to_string())?
            .map_err(|error| error.to_string())
        })
    }
}
