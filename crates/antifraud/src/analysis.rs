//! The exactly-once hop: each `TransferenciaSolicitada` record becomes, in the Kafka
//! transaction of its batch, one `TransferenciaAnalisada` or
//! `TransferenciaRejeitada(BLOQUEADA_ANTIFRAUDE)` (a dead letter for a record that is not a
//! valid event), committed together with the consumed offsets. `read_committed` readers see
//! all of it or none of it.
//!
//! The transactions, failures and rebalances are [`kafka::exactly_once`]'s: on any failure the
//! batch is discarded and the partitions rewound to the group's committed offsets, so a
//! record is analysed again only if its transaction did not commit. [`Analyser`] only decides
//! what a record becomes, deterministically (derived event ids), and counts what committed.

use std::time::Duration;

use kafka::dead_letter::{dead_letter, Failure};
use kafka::exactly_once::Transform;
use kafka::producer::OutgoingRecord;
use kafka::rdkafka::message::{Message, OwnedMessage};

use contracts::headers::{EVENT_ID, EVENT_TYPE};
use contracts::ids::{derived_event_id, ANALYSED_PREFIX, REJECTED_BY_ANTIFRAUD_PREFIX};
use contracts::{
    EventType, RejectionReason, Timestamp, TransferAnalysed, TransferRejected, TransferRequested,
};

use crate::scoring::Scorer;

/// The `kafka_dlt-exception-fqcn` of a record that is not a valid `TransferenciaSolicitada`:
/// [`MalformedEvent`]'s type path (a unit test holds them equal).
pub const MALFORMED_EVENT: &str = "antifraud::analysis::MalformedEvent";

/// A record that is not a valid `TransferenciaSolicitada`.
#[derive(Debug, thiserror::Error)]
pub enum MalformedEvent {
    /// Not the event's JSON, or a field that breaks its rule (a `valorEmCentavos` that is not
    /// at least 1 is refused by [`contracts::Amount`] here).
    #[error("not a valid TransferenciaSolicitada")]
    Json(#[source] serde_json::Error),
}

impl MalformedEvent {
    /// `kafka_dlt-exception-cause-fqcn`: the underlying error's type, or this type where
    /// there is none.
    pub fn cause_fqcn(&self) -> &'static str {
        match self {
            Self::Json(_) => std::any::type_name::<serde_json::Error>(),
        }
    }
}

/// Why a record has no output: no record's fault (the loop stops).
#[derive(Debug, thiserror::Error)]
pub enum AnalysisError {
    #[error("an output event could not be encoded")]
    Encode(#[source] serde_json::Error),
}

/// Output topics, behind the configured prefix.
#[derive(Debug, Clone)]
pub struct Topics {
    pub analysed: String,
    pub rejected: String,
}

/// What each record becomes.
pub struct Analyser {
    topics: Topics,
    scorer: Scorer,
    group: String,
}

impl std::fmt::Debug for Analyser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Analyser")
            .field("topics", &self.topics)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl Analyser {
    pub fn new(topics: Topics, scorer: Scorer, group: String) -> Self {
        Self { topics, scorer, group }
    }

    /// The output record for `input`: the analysed or rejected event, or its dead letter.
    pub fn output(&self, input: &OwnedMessage) -> Result<OutgoingRecord, AnalysisError> {
        let event = match decode(input) {
            Ok(event) => event,
            Err(error) => {
                let failure = Failure::new(MALFORMED_EVENT, error.cause_fqcn(), &error);
                tracing::warn!(topic = input.topic(), partition = input.partition(), offset = input.offset(), error = %telemetry::error_chain(&error), "poison record to the dead-letter topic");
                return Ok(dead_letter(input, &self.group, &failure));
            }
        };
        let score = self.scorer.score(&event);
        let (topic, id, kind, payload) = if self.scorer.blocks(score) {
            let id = derived_event_id(REJECTED_BY_ANTIFRAUD_PREFIX, event.transfer_id);
            let rejected = TransferRejected {
                event_id: id,
                transfer_id: event.transfer_id,
                reason: RejectionReason::BlockedByAntifraud,
                rejected_at: Timestamp::now(),
                details: contracts::events::OutcomeDetails {
                    source_account: Some(event.source_account.clone()),
                    destination_account: Some(event.destination_account.clone()),
                    amount_cents: Some(event.amount_cents),
                    currency: Some(event.currency.clone()),
                },
            };
            let payload = serde_json::to_vec(&rejected).map_err(AnalysisError::Encode)?;
            (&self.topics.rejected, id, EventType::TransferRejected, payload)
        } else {
            let id = derived_event_id(ANALYSED_PREFIX, event.transfer_id);
            let analysed = TransferAnalysed {
                event_id: id,
                transfer_id: event.transfer_id,
                source_account: event.source_account.clone(),
                destination_account: event.destination_account.clone(),
                amount_cents: event.amount_cents,
                currency: event.currency.clone(),
                score,
                analysed_at: Timestamp::now(),
            };
            let payload = serde_json::to_vec(&analysed).map_err(AnalysisError::Encode)?;
            (&self.topics.analysed, id, EventType::TransferAnalysed, payload)
        };
        let mut record =
            OutgoingRecord::new(topic.as_str(), event.source_account.as_str().as_bytes(), payload)
                .header(EVENT_ID, id.hyphenated().to_string())
                .header(EVENT_TYPE, kind.as_str());
        let span = tracing::info_span!("analyse", transfer_id = %event.transfer_id, score);
        kafka::trace::continue_from(&span, input);
        kafka::trace::inject(&span, &mut record);
        Ok(record)
    }
}

fn decode(input: &OwnedMessage) -> Result<TransferRequested, MalformedEvent> {
    serde_json::from_slice(input.payload().unwrap_or_default()).map_err(MalformedEvent::Json)
}

impl Transform for Analyser {
    type Error = AnalysisError;

    fn output(&self, record: &OwnedMessage) -> Result<OutgoingRecord, AnalysisError> {
        Analyser::output(self, record)
    }

    fn committed(&self, outputs: &[OutgoingRecord], took: Duration) {
        metrics::histogram!("antifraud_transaction_seconds").record(took.as_secs_f64());
        for output in outputs {
            let outcome = if output.topic == self.topics.analysed {
                "analysed"
            } else if output.topic == self.topics.rejected {
                "blocked"
            } else {
                metrics::counter!("dlt_mensagens_total", "topic" => output.topic.clone()).increment(1);
                "dlt"
            };
            metrics::counter!("antifraud_records_total", "outcome" => outcome).increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dead_letter_exception_names_a_type_that_exists() {
        assert_eq!(MALFORMED_EVENT, std::any::type_name::<MalformedEvent>());
        let zero = br#"{"eventoId":"00000000-0000-0000-0000-000000000001","transferenciaId":"00000000-0000-0000-0000-000000000002","contaOrigem":"CC-1","contaDestino":"CC-2","valorEmCentavos":0,"moeda":"BRL","criadaEm":"2026-12-03T10:15:30Z"}"#;
        let refused = serde_json::from_slice::<TransferRequested>(zero).expect_err("a zero amount");
        let malformed = MalformedEvent::Json(refused);
        assert_eq!(malformed.cause_fqcn(), std::any::type_name::<serde_json::Error>());
        let message = format!("{}: {}", malformed, std::error::Error::source(&malformed).expect("cause"));
        assert!(message.contains("greater than 0 cents, got 0"), "{message}");
    }
}
