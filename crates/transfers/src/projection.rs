//! The status projection (group `transferencias-projecao`): outcome events from
//! `transferencias.liquidada` and `transferencias.rejeitada` set each transfer's final status.
//!
//! Idempotent and order-proof: only a `PENDENTE` transfer changes, so a duplicated or late
//! event never overwrites a final status. An event for a transfer this database does not know
//! is logged and counted (`projection_unknown_transfers_total`), not retried forever.
//! A record that is not a valid event goes to `<topic>-dlt` at once.

use kafka::rdkafka::message::{Message, OwnedMessage};

use contracts::{MalformedEvent, OutcomeEvent};
use kafka::consumer::{Handler, Verdict};
use kafka::dead_letter::{DeadLetterPublisher, Failure};
use sqlx::PgPool;

use crate::error::StoreError;
use crate::store::{self, Outcome};
use contracts::Outcome as Decided;

/// The `kafka_dlt-exception-fqcn` of an unreadable outcome event: the type path of
/// [`contracts::MalformedEvent`] (a unit test holds them equal).
pub const MALFORMED_EVENT: &str = "contracts::events::MalformedEvent";

/// Why a batch must be retried.
#[derive(Debug, thiserror::Error)]
pub enum ProjectionError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("dead letter not published")]
    DeadLetter(#[from] kafka::Error),
}

/// The projection's batch handler.
#[derive(Debug)]
pub struct Projection {
    pool: PgPool,
    settled_topic: String,
    dead_letters: DeadLetterPublisher,
}

impl Projection {
    pub fn new(pool: PgPool, settled_topic: String, dead_letters: DeadLetterPublisher) -> Self {
        Self { pool, settled_topic, dead_letters }
    }

    fn decode(&self, record: &OwnedMessage) -> Result<Outcome, MalformedEvent> {
        let payload = record.payload().unwrap_or_default();
        Ok(match OutcomeEvent::decode(record.topic() == self.settled_topic, payload)? {
            OutcomeEvent::Settled(event) => {
                Outcome { transfer_id: event.transfer_id, decided: Decided::Settled }
            }
            OutcomeEvent::Rejected(event) => {
                Outcome { transfer_id: event.transfer_id, decided: Decided::Rejected(event.reason) }
            }
        })
    }
}

impl Handler for Projection {
    type Error = ProjectionError;

    async fn handle(
        &mut self,
        batch: &[OwnedMessage],
        _retrying: bool,
    ) -> Result<Vec<Verdict>, ProjectionError> {
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut poison = Vec::new();
        for record in batch {
            match self.decode(record) {
                Ok(outcome) => {
                    // the projection's hop in the transfer's trace
                    let span = tracing::info_span!("project", transfer_id = %outcome.transfer_id, topic = record.topic());
                    kafka::trace::continue_from(&span, record);
                    span.in_scope(|| tracing::debug!(status = outcome.decided.result(), "outcome read"));
                    outcomes.push(outcome)
                }
                Err(error) => poison.push((record, error)),
            }
        }
        if !outcomes.is_empty() {
            let projected = store::project(&self.pool, &outcomes).await?;
            for (transfer_id, status) in &projected.updated {
                let status = status.as_str();
                metrics::counter!("transferencias_total", "resultado" => status).increment(1);
                tracing::debug!(%transfer_id, status, "transfer status projected");
            }
            for transfer_id in &projected.unknown {
                metrics::counter!("projection_unknown_transfers_total").increment(1);
                tracing::warn!(%transfer_id, "outcome for an unknown transfer ignored");
            }
        }
        for (record, error) in poison {
            // the cause named from the error held, as Spring names the cause's class
            let failure = Failure::new(MALFORMED_EVENT, std::any::type_name_of_val(&error.source), &error);
            self.dead_letters.publish(record, &failure).await?;
        }
        Ok(Verdict::all_done(batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dead_letter_exception_names_a_type_that_exists() {
        assert_eq!(MALFORMED_EVENT, std::any::type_name::<MalformedEvent>());
    }
}
