//! A record's acquisition lock, renewed every half lock (KIP-1222) while a member works on it.

use std::future::Future;
use std::time::Duration;

use krafka::share_consumer::ShareConsumer;
use krafka::{ConsumerRecord, ProtocolErrorKind};
use tokio::time::Instant;

/// Renewals of a record's lock when the broker has not said how long it lasts (it does in
/// every fetch answer from Kafka 4.2 on); the broker's smallest default lock is 15 s.
const DEFAULT_LOCK: Duration = Duration::from_secs(15);

/// Keeps a record's acquisition lock while the member works on it: renews it every half
/// lock (KIP-1222) from when it was polled, across every step of its handling.
pub(super) struct Lease<'a> {
    consumer: &'a ShareConsumer,
    record: &'a ConsumerRecord,
    every: Duration,
    next: Instant,
    /// False once the broker said it cannot renew (older than Kafka 4.2).
    renewable: bool,
}

impl<'a> Lease<'a> {
    pub(super) fn new(consumer: &'a ShareConsumer, record: &'a ConsumerRecord) -> Self {
        // the lock started when the broker built the fetch answer, a little before now
        let every = consumer.acquisition_lock_timeout().unwrap_or(DEFAULT_LOCK) / 2;
        Self { consumer, record, every, next: Instant::now() + every, renewable: true }
    }

    pub(super) async fn hold<F: Future>(&mut self, work: F) -> F::Output {
        tokio::pin!(work);
        loop {
            tokio::select! {
                output = &mut work => return output,
                _ = tokio::time::sleep_until(self.next), if self.renewable => self.renew(),
            }
        }
    }

    fn renew(&mut self) {
        self.next = Instant::now() + self.every;
        match self.consumer.renew(self.record) {
            Ok(()) => tracing::debug!(offset = self.record.offset, "acquisition lock renewed"),
            Err(error) => {
                if error.protocol_error_kind() == Some(ProtocolErrorKind::UnknownApiVersion) {
                    self.renewable = false;
                }
                tracing::warn!(
                    topic = &*self.record.topic,
                    partition = self.record.partition,
                    offset = self.record.offset,
                    error = %error,
                    "acquisition lock not renewed: the record may be handed to another member when it ends"
                );
            }
        }
    }
}
