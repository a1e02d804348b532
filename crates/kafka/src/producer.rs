//! The idempotent producer every service publishes with, and the record it takes.

use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::ClientConfig;

use crate::context::Context;
use crate::Error;

/// A record to publish, owning its bytes so it can wait in a retry or a batch.
#[derive(Debug, Clone)]
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

    /// The value of the first header called `name`.
    pub fn header_value(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_slice())
    }

    pub(crate) fn owned_headers(&self) -> OwnedHeaders {
        self.headers
            .iter()
            .fold(OwnedHeaders::new_with_capacity(self.headers.len()), |headers, (key, value)| {
                headers.insert(Header { key, value: Some(value) })
            })
    }

    pub(crate) fn as_future_record<'a>(&'a self, headers: OwnedHeaders) -> FutureRecord<'a, [u8], [u8]> {
        let mut record = FutureRecord::to(&self.topic).payload(self.payload.as_slice()).headers(headers);
        if let Some(key) = &self.key {
            record = record.key(key.as_slice());
        }
        if let Some(partition) = self.partition {
            record = record.partition(partition);
        }
        record
    }
}

/// Where the broker stored a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub partition: i32,
    pub offset: i64,
}

/// `acks=all`, idempotent producer (see [`crate::config::producer_config`]). Cheap to clone.
#[derive(Clone)]
pub struct Producer {
    inner: FutureProducer<Context>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer").finish_non_exhaustive()
    }
}

impl Producer {
    pub fn new(config: &ClientConfig) -> Result<Self, Error> {
        let inner = config.create_with_context(Context::default()).map_err(Error::Config)?;
        Ok(Self { inner })
    }

    /// Publishes `record` and waits for the broker's acknowledgement (all in-sync replicas).
    /// A full local queue is waited out, never turned into an error.
    pub async fn send(&self, record: &OutgoingRecord) -> Result<Delivered, Error> {
        let result = self
            .inner
            .send(record.as_future_record(record.owned_headers()), rdkafka::util::Timeout::Never)
            .await;
        match result {
            Ok(delivery) => Ok(Delivered { partition: delivery.partition, offset: delivery.offset }),
            Err((source, _message)) => Err(Error::Produce { topic: record.topic.clone(), source }),
        }
    }

    /// Waits until every queued record was acknowledged or `timeout` passed.
    pub async fn flush(&self, timeout: Duration) -> Result<(), Error> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || inner.flush(timeout))
            .await?
            .map_err(|source| Error::Produce { topic: "(flush)".into(), source })
    }

    pub fn inner(&self) -> &FutureProducer<Context> {
        &self.inner
    }
}
