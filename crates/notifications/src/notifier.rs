//! One attempt at notifying one outcome event: read it, POST it (or log it when no webhook
//! is configured), and say what the retry chain should do with it.

use kafka::dead_letter::Failure;
use kafka::rdkafka::message::{Message, OwnedMessage};
use kafka::retry_topic::{Attempt, Verdict};
use tracing::Instrument;

use contracts::{EventType, MalformedEvent, OutcomeEvent};

use crate::webhook::{Answer, Notification, Webhook};

/// The `kafka_exception-fqcn` of a record that is not the event its topic carries: the type
/// path of [`contracts::MalformedEvent`] (a unit test holds them equal).
pub const MALFORMED_EVENT: &str = "contracts::events::MalformedEvent";

/// What a notification is about, read from the payload (never from headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub event_type: EventType,
    pub event_id: uuid::Uuid,
    pub transfer_id: uuid::Uuid,
}

/// Notifies outcomes of `settled_topic` (and its retry topics) as settlements, everything else
/// as rejections.
#[derive(Debug, Clone)]
pub struct Notifier {
    webhook: Option<Webhook>,
    settled_topic: String,
}

impl Notifier {
    /// `webhook: None` logs each notification instead of sending it.
    pub fn new(webhook: Option<Webhook>, settled_topic: String) -> Self {
        Self { webhook, settled_topic }
    }

    fn is_settled(&self, topic: &str) -> bool {
        topic == self.settled_topic
            || topic.strip_prefix(self.settled_topic.as_str()).is_some_and(|rest| rest.starts_with("-retry-"))
    }

    /// Reads the outcome event of `record`.
    pub fn decode(&self, record: &OwnedMessage) -> Result<Outcome, MalformedEvent> {
        let event =
            OutcomeEvent::decode(self.is_settled(record.topic()), record.payload().unwrap_or_default())?;
        Ok(Outcome {
            event_type: event.event_type(),
            event_id: event.event_id(),
            transfer_id: event.transfer_id(),
        })
    }
}

impl Attempt for Notifier {
    async fn attempt(&self, record: &OwnedMessage) -> Verdict {
        let outcome = match self.decode(record) {
            Ok(outcome) => outcome,
            Err(error) => {
                // the cause named from the error held, as Spring names the cause's class
                let cause = std::any::type_name_of_val(&error.source);
                return Verdict::Reject(Failure::new(MALFORMED_EVENT, cause, &error));
            }
        };
        let span = tracing::info_span!(
            "notifications.deliver",
            transfer_id = %outcome.transfer_id,
            event_id = %outcome.event_id,
            event_type = outcome.event_type.as_str(),
            topic = record.topic(),
        );
        kafka::trace::continue_from(&span, record);
        let Some(webhook) = &self.webhook else {
            span.in_scope(|| tracing::info!("notification (no NOTIFICACOES_WEBHOOK_URL: logged only)"));
            metrics::counter!("notifications_webhook_total", "outcome" => "logged").increment(1);
            return Verdict::Done;
        };
        let trace: Vec<(String, String)> = telemetry::context::inject(&span).into_iter().collect();
        let notification = Notification {
            event_id: outcome.event_id,
            event_type: outcome.event_type.as_str(),
            body: record.payload().unwrap_or_default(),
            trace: &trace,
        };
        match webhook.deliver(&notification).instrument(span.clone()).await {
            Answer::Delivered(status) => {
                span.in_scope(|| tracing::debug!(%status, "notification delivered"));
                Verdict::Done
            }
            Answer::Transient(error) => {
                Verdict::Retry(Failure::new(error.fqcn(), error.cause_fqcn(), &error))
            }
            Answer::Permanent(error) => {
                Verdict::Reject(Failure::new(error.fqcn(), error.cause_fqcn(), &error))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka::rdkafka::message::Timestamp;

    fn record(topic: &str, payload: &str) -> OwnedMessage {
        OwnedMessage::new(
            Some(payload.as_bytes().to_vec()),
            None,
            topic.into(),
            Timestamp::CreateTime(0),
            0,
            0,
            None,
        )
    }

    #[test]
    fn the_topic_decides_the_event_type() {
        let notifier = Notifier::new(None, "p.transferencias.liquidada".into());
        let settled = r#"{"eventoId":"00000000-0000-0000-0000-000000000001","transferenciaId":"00000000-0000-0000-0000-000000000002","liquidadaEm":"2026-12-04T10:00:00Z"}"#;
        for topic in ["p.transferencias.liquidada", "p.transferencias.liquidada-retry-2000"] {
            let outcome = notifier.decode(&record(topic, settled)).expect("settled");
            assert_eq!(outcome.event_type, EventType::TransferSettled);
            assert_eq!(outcome.event_id, uuid::Uuid::from_u128(1));
        }
        let rejected = r#"{"eventoId":"00000000-0000-0000-0000-000000000003","transferenciaId":"00000000-0000-0000-0000-000000000002","motivo":"SALDO_INSUFICIENTE","rejeitadaEm":"2026-12-04T10:00:00Z"}"#;
        let outcome =
            notifier.decode(&record("p.transferencias.rejeitada-retry-1000", rejected)).expect("rejected");
        assert_eq!(outcome.event_type, EventType::TransferRejected);
        // a settlement on the rejected topic is not a rejection
        assert!(notifier.decode(&record("p.transferencias.rejeitada", settled)).is_err());
        assert!(notifier.decode(&record("p.transferencias.liquidada", "{")).is_err());
        assert!(notifier.decode(&record("p.transferencias.liquidadax", settled)).is_err());
    }

    #[tokio::test]
    async fn malformed_records_are_rejected_at_once_and_log_only_mode_delivers() {
        let notifier = Notifier::new(None, "t.liquidada".into());
        match notifier.attempt(&record("t.liquidada", "not json")).await {
            Verdict::Reject(failure) => {
                assert_eq!(MALFORMED_EVENT, std::any::type_name::<MalformedEvent>());
                assert_eq!(failure.exception_fqcn, MALFORMED_EVENT);
                assert_eq!(failure.cause_fqcn, "serde_json::error::Error");
                assert_eq!(failure.cause_fqcn, std::any::type_name::<serde_json::Error>());
                assert!(failure.message.contains("TransferenciaLiquidada"), "{}", failure.message);
            }
            other => panic!("expected a rejection, got {other:?}"),
        }
        let settled = r#"{"eventoId":"00000000-0000-0000-0000-000000000001","transferenciaId":"00000000-0000-0000-0000-000000000002","liquidadaEm":"2026-12-04T10:00:00Z"}"#;
        assert_eq!(notifier.attempt(&record("t.liquidada", settled)).await, Verdict::Done);
    }
}
