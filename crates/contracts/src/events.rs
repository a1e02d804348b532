//! The four events of the transfer pipeline (`docs/reference/contract.md` §3, *Events*).
//!
//! JSON is camelCase with the article's Portuguese names; every reader ignores unknown fields
//! (serde's default) and takes ids and types from the payload, never from headers. The outcome
//! events may carry the transfer's accounts and amount for notifications; those fields are
//! optional because the article's Java producers do not send them.
//!
//! Accounts and currencies are [`AccountId`]s and [`Currency`]s: a request event
//! (`TransferenciaSolicitada`, `TransferenciaAnalisada`) whose `contaOrigem`, `contaDestino` or
//! `moeda` breaks the rules (an id that is not 1–32 of `[A-Za-z0-9_-]`, a code that is not an
//! active ISO 4217 one in capitals) fails to deserialise, with the rule in the error, like a
//! missing field does; each consumer dead-letters such a record as poison. On an outcome event
//! those fields are optional extras ([`OutcomeDetails`]): a malformed one is read as absent,
//! with a warning ([`MALFORMED_DETAIL`]), and the outcome itself is read.
//! Issuer accounts (`EMISSOR-…`) are well-formed ids: refusing them as a side of a transfer is
//! the ledger's business rule (`CONTA_INEXISTENTE`), not the wire's.

use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{AccountId, Amount, Currency, Timestamp};

/// `TransferenciaSolicitada`: a transfer was accepted by the API (published by the outbox).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransferRequested {
    #[serde(rename = "eventoId")]
    pub event_id: Uuid,
    #[serde(rename = "transferenciaId")]
    pub transfer_id: Uuid,
    #[serde(rename = "contaOrigem")]
    pub source_account: AccountId,
    #[serde(rename = "contaDestino")]
    pub destination_account: AccountId,
    #[serde(rename = "valorEmCentavos")]
    pub amount_cents: Amount,
    #[serde(rename = "moeda")]
    pub currency: Currency,
    /// Equals `transferencia.criada_em` of the row the event was written with.
    #[serde(rename = "criadaEm")]
    pub created_at: Timestamp,
}

/// `TransferenciaAnalisada`: antifraud let the transfer through with a risk score below 80.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferAnalysed {
    #[serde(rename = "eventoId")]
    pub event_id: Uuid,
    #[serde(rename = "transferenciaId")]
    pub transfer_id: Uuid,
    #[serde(rename = "contaOrigem")]
    pub source_account: AccountId,
    #[serde(rename = "contaDestino")]
    pub destination_account: AccountId,
    #[serde(rename = "valorEmCentavos")]
    pub amount_cents: Amount,
    #[serde(rename = "moeda")]
    pub currency: Currency,
    /// Risk score, 0–100.
    pub score: u8,
    #[serde(rename = "analisadaEm")]
    pub analysed_at: Timestamp,
}

/// `TransferenciaRejeitada`: antifraud blocked the transfer or the ledger refused it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferRejected {
    #[serde(rename = "eventoId")]
    pub event_id: Uuid,
    #[serde(rename = "transferenciaId")]
    pub transfer_id: Uuid,
    #[serde(rename = "motivo")]
    pub reason: RejectionReason,
    #[serde(rename = "rejeitadaEm")]
    pub rejected_at: Timestamp,
    #[serde(flatten)]
    pub details: OutcomeDetails,
}

/// `TransferenciaLiquidada`: the ledger moved the money.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferSettled {
    #[serde(rename = "eventoId")]
    pub event_id: Uuid,
    #[serde(rename = "transferenciaId")]
    pub transfer_id: Uuid,
    #[serde(rename = "liquidadaEm")]
    pub settled_at: Timestamp,
    #[serde(flatten)]
    pub details: OutcomeDetails,
}

/// What our producers add to outcome events so notifications need no lookup. Readers must not
/// require any of it: a Java producer from the article sends none.
///
/// Each field is read leniently: one that is present but malformed (an account id or a `moeda`
/// breaking its rule, a `valorEmCentavos` that is not a positive integer) is read as absent, with a
/// warning naming the field and the rule broken, and the rest of the event is read as usual. A
/// settled or rejected transfer must not stay `PENDENTE` because of an extra it does not need.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutcomeDetails {
    #[serde(
        rename = "contaOrigem",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::source_account"
    )]
    pub source_account: Option<AccountId>,
    #[serde(
        rename = "contaDestino",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::destination_account"
    )]
    pub destination_account: Option<AccountId>,
    #[serde(
        rename = "valorEmCentavos",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::amount_cents"
    )]
    pub amount_cents: Option<Amount>,
    #[serde(
        rename = "moeda",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::currency"
    )]
    pub currency: Option<Currency>,
}

/// `deserialize_with` helpers of [`OutcomeDetails`]: an optional field that is malformed reads
/// as absent, with a warning.
mod lenient {
    use serde::{de::DeserializeOwned, Deserialize, Deserializer};

    use crate::{AccountId, Amount, Currency};

    /// The log message of a malformed optional field (`docs/operations.md` quotes it).
    pub const MALFORMED_DETAIL: &str = "malformed optional field of an outcome event read as absent";

    /// Reads `field` as a `T`; `null` is absent, and so is a value `T` refuses (warned about).
    fn read<'de, D, T>(deserializer: D, field: &'static str) -> Result<Option<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: DeserializeOwned,
    {
        // a malformed JSON document still fails here: only a well-formed value is forgiven
        let value = serde_json::Value::deserialize(deserializer)?;
        if value.is_null() {
            return Ok(None);
        }
        match T::deserialize(&value) {
            Ok(read) => Ok(Some(read)),
            Err(rule) => {
                tracing::warn!(field, %rule, "{MALFORMED_DETAIL}");
                Ok(None)
            }
        }
    }

    pub fn source_account<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<AccountId>, D::Error> {
        read(deserializer, "contaOrigem")
    }

    pub fn destination_account<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<AccountId>, D::Error> {
        read(deserializer, "contaDestino")
    }

    pub fn amount_cents<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Amount>, D::Error> {
        read(deserializer, "valorEmCentavos")
    }

    pub fn currency<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Currency>, D::Error> {
        read(deserializer, "moeda")
    }
}

pub use lenient::MALFORMED_DETAIL;

/// What an outcome topic carries: `transferencias.liquidada` a [`TransferSettled`],
/// `transferencias.rejeitada` a [`TransferRejected`] (read by the projection and notifications).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutcomeEvent {
    Settled(TransferSettled),
    Rejected(TransferRejected),
}

/// A record that is not the outcome event its topic carries.
#[derive(Debug, thiserror::Error)]
#[error("not a valid {expected} event")]
pub struct MalformedEvent {
    pub expected: &'static str,
    #[source]
    pub source: serde_json::Error,
}

impl OutcomeEvent {
    /// Reads `payload` from a settlements topic (`settled`) or a rejections topic.
    pub fn decode(settled: bool, payload: &[u8]) -> Result<Self, MalformedEvent> {
        if settled {
            serde_json::from_slice(payload)
                .map(Self::Settled)
                .map_err(|source| MalformedEvent { expected: EventType::TransferSettled.as_str(), source })
        } else {
            serde_json::from_slice(payload)
                .map(Self::Rejected)
                .map_err(|source| MalformedEvent { expected: EventType::TransferRejected.as_str(), source })
        }
    }

    pub fn event_type(&self) -> EventType {
        match self {
            Self::Settled(_) => EventType::TransferSettled,
            Self::Rejected(_) => EventType::TransferRejected,
        }
    }

    pub fn event_id(&self) -> Uuid {
        match self {
            Self::Settled(event) => event.event_id,
            Self::Rejected(event) => event.event_id,
        }
    }

    pub fn transfer_id(&self) -> Uuid {
        match self {
            Self::Settled(event) => event.transfer_id,
            Self::Rejected(event) => event.transfer_id,
        }
    }
}

/// `motivo` of a [`TransferRejected`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RejectionReason {
    /// Risk score ≥ 80.
    #[serde(rename = "BLOQUEADA_ANTIFRAUDE")]
    BlockedByAntifraud,
    /// One side of the transfer has no account in the ledger.
    #[serde(rename = "CONTA_INEXISTENTE")]
    AccountNotFound,
    /// An account's currency differs from the transfer's.
    #[serde(rename = "MOEDA_INCOMPATIVEL")]
    CurrencyMismatch,
    /// The source account's balance is below the amount.
    #[serde(rename = "SALDO_INSUFICIENTE")]
    InsufficientFunds,
}

impl RejectionReason {
    pub const ALL: [RejectionReason; 4] =
        [Self::BlockedByAntifraud, Self::AccountNotFound, Self::CurrencyMismatch, Self::InsufficientFunds];

    /// The wire and database spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::BlockedByAntifraud => "BLOQUEADA_ANTIFRAUDE",
            Self::AccountNotFound => "CONTA_INEXISTENTE",
            Self::CurrencyMismatch => "MOEDA_INCOMPATIVEL",
            Self::InsufficientFunds => "SALDO_INSUFICIENTE",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|reason| reason.as_str() == text)
    }
}

impl fmt::Display for RejectionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `evento-tipo` header value and outbox `tipo` column of each event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    TransferRequested,
    TransferAnalysed,
    TransferRejected,
    TransferSettled,
}

impl EventType {
    pub const ALL: [EventType; 4] =
        [Self::TransferRequested, Self::TransferAnalysed, Self::TransferRejected, Self::TransferSettled];

    pub fn as_str(&self) -> &'static str {
        match self {
            Self::TransferRequested => "TransferenciaSolicitada",
            Self::TransferAnalysed => "TransferenciaAnalisada",
            Self::TransferRejected => "TransferenciaRejeitada",
            Self::TransferSettled => "TransferenciaLiquidada",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == text)
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn account(id: &str) -> AccountId {
        AccountId::parse(id).expect("a well-formed account id")
    }

    fn brl() -> Currency {
        Currency::parse("BRL").expect("an active currency")
    }

    fn amount(cents: i64) -> Amount {
        Amount::new(cents).expect("a positive amount")
    }

    fn at() -> Timestamp {
        Timestamp::parse("2026-12-03T10:15:30.123456Z").expect("valid")
    }

    #[test]
    fn transfer_requested_has_the_contract_field_names() {
        let event = TransferRequested {
            event_id: id(1),
            transfer_id: id(2),
            source_account: account("CC-001"),
            destination_account: account("CC-002"),
            amount_cents: amount(30_000),
            currency: brl(),
            created_at: at(),
        };
        let value = serde_json::to_value(&event).expect("serialize");
        assert_eq!(
            value,
            json!({
                "eventoId": "00000000-0000-0000-0000-000000000001",
                "transferenciaId": "00000000-0000-0000-0000-000000000002",
                "contaOrigem": "CC-001",
                "contaDestino": "CC-002",
                "valorEmCentavos": 30000,
                "moeda": "BRL",
                "criadaEm": "2026-12-03T10:15:30.123456Z"
            })
        );
        let back: TransferRequested = serde_json::from_value(value).expect("deserialize");
        assert_eq!(back, event);
    }

    #[test]
    fn transfer_analysed_has_the_contract_field_names() {
        let event = TransferAnalysed {
            event_id: id(1),
            transfer_id: id(2),
            source_account: account("CC-001"),
            destination_account: account("CC-002"),
            amount_cents: amount(30_000),
            currency: brl(),
            score: 10,
            analysed_at: at(),
        };
        let value = serde_json::to_value(&event).expect("serialize");
        assert_eq!(
            value,
            json!({
                "eventoId": "00000000-0000-0000-0000-000000000001",
                "transferenciaId": "00000000-0000-0000-0000-000000000002",
                "contaOrigem": "CC-001",
                "contaDestino": "CC-002",
                "valorEmCentavos": 30000,
                "moeda": "BRL",
                "score": 10,
                "analisadaEm": "2026-12-03T10:15:30.123456Z"
            })
        );
        let back: TransferAnalysed = serde_json::from_value(value).expect("deserialize");
        assert_eq!(back, event);
    }

    #[test]
    fn outcome_events_read_the_article_shape_and_write_ours() {
        // exactly what the article's Java ledger writes: no accounts, no amount
        let article = json!({
            "eventoId": "00000000-0000-0000-0000-000000000001",
            "transferenciaId": "00000000-0000-0000-0000-000000000002",
            "motivo": "SALDO_INSUFICIENTE",
            "rejeitadaEm": "2026-12-03T10:15:30.123456Z"
        });
        let rejected: TransferRejected = serde_json::from_value(article.clone()).expect("deserialize");
        assert_eq!(rejected.reason, RejectionReason::InsufficientFunds);
        assert_eq!(rejected.details, OutcomeDetails::default());
        assert_eq!(serde_json::to_value(&rejected).expect("serialize"), article);

        let settled = TransferSettled {
            event_id: id(1),
            transfer_id: id(2),
            settled_at: at(),
            details: OutcomeDetails {
                source_account: Some(account("CC-001")),
                destination_account: Some(account("CC-002")),
                amount_cents: Some(amount(500)),
                currency: Some(brl()),
            },
        };
        let value = serde_json::to_value(&settled).expect("serialize");
        assert_eq!(
            value,
            json!({
                "eventoId": "00000000-0000-0000-0000-000000000001",
                "transferenciaId": "00000000-0000-0000-0000-000000000002",
                "liquidadaEm": "2026-12-03T10:15:30.123456Z",
                "contaOrigem": "CC-001",
                "contaDestino": "CC-002",
                "valorEmCentavos": 500,
                "moeda": "BRL"
            })
        );
        assert_eq!(serde_json::from_value::<TransferSettled>(value).expect("deserialize"), settled);
    }

    #[test]
    fn every_rejection_reason_round_trips() {
        for reason in RejectionReason::ALL {
            let json = serde_json::to_value(reason).expect("serialize");
            assert_eq!(json, Value::String(reason.as_str().into()));
            assert_eq!(serde_json::from_value::<RejectionReason>(json).expect("deserialize"), reason);
            assert_eq!(RejectionReason::parse(reason.as_str()), Some(reason));
        }
        assert!(serde_json::from_value::<RejectionReason>(json!("OUTRO")).is_err());
    }

    #[test]
    fn unknown_fields_are_ignored_and_missing_ones_refused() {
        let with_extra = json!({
            "eventoId": "00000000-0000-0000-0000-000000000001",
            "transferenciaId": "00000000-0000-0000-0000-000000000002",
            "liquidadaEm": "2026-12-03T10:15:30Z",
            "canal": "pix"
        });
        assert!(serde_json::from_value::<TransferSettled>(with_extra).is_ok());

        let missing_amount = json!({
            "eventoId": "00000000-0000-0000-0000-000000000001",
            "transferenciaId": "00000000-0000-0000-0000-000000000002",
            "contaOrigem": "A", "contaDestino": "B", "moeda": "BRL",
            "criadaEm": "2026-12-03T10:15:30Z"
        });
        let error = serde_json::from_value::<TransferRequested>(missing_amount).expect_err("must fail");
        assert!(error.to_string().contains("valorEmCentavos"), "{error}");

        let wrong_type = json!({
            "eventoId": "00000000-0000-0000-0000-000000000001",
            "transferenciaId": "00000000-0000-0000-0000-000000000002",
            "contaOrigem": "A", "contaDestino": "B", "moeda": "BRL",
            "valorEmCentavos": "100", "criadaEm": "2026-12-03T10:15:30Z"
        });
        assert!(serde_json::from_value::<TransferRequested>(wrong_type).is_err());
    }

    #[test]
    fn an_invalid_account_or_currency_is_refused_with_the_rule_broken() {
        let requested = json!({
            "eventoId": "00000000-0000-0000-0000-000000000001",
            "transferenciaId": "00000000-0000-0000-0000-000000000002",
            "contaOrigem": "CC-001", "contaDestino": "CC-002", "moeda": "BRL",
            "valorEmCentavos": 100, "criadaEm": "2026-12-03T10:15:30Z"
        });
        assert!(serde_json::from_value::<TransferRequested>(requested.clone()).is_ok());
        let broken = |field: &str, value: Value| {
            let mut event = requested.clone();
            event[field] = value;
            serde_json::from_value::<TransferRequested>(event).expect_err("must fail").to_string()
        };
        assert!(broken("contaOrigem", json!("CC 001")).contains("may contain only letters"));
        assert!(broken("contaDestino", json!("")).contains("must be 1 to 32 characters"));
        assert!(broken("contaDestino", json!("C".repeat(33))).contains("must be 1 to 32 characters"));
        assert!(broken("moeda", json!("XYZ")).contains("not an active ISO 4217"));
        assert!(broken("moeda", json!("brl")).contains("not an active ISO 4217"));
        assert!(broken("valorEmCentavos", json!(0)).contains("greater than 0 cents, got 0"));
        assert!(broken("valorEmCentavos", json!(-100)).contains("greater than 0 cents, got -100"));
        let analysed = |value: Value| {
            let mut event = requested.clone();
            event["valorEmCentavos"] = value;
            event["score"] = json!(10);
            event["analisadaEm"] = json!("2026-12-03T10:15:30Z");
            serde_json::from_value::<TransferAnalysed>(event)
        };
        assert!(analysed(json!(1)).is_ok());
        assert!(analysed(json!(0)).expect_err("zero").to_string().contains("greater than 0 cents"));
        // an issuer account is well-formed: the ledger's rules reject it, not the wire
        let issuer: TransferRequested = serde_json::from_value({
            let mut event = requested.clone();
            event["contaOrigem"] = json!("EMISSOR-BRL");
            event
        })
        .expect("an issuer account is a well-formed id");
        assert!(issuer.source_account.is_issuer());
    }

    #[test]
    fn a_malformed_optional_detail_of_an_outcome_event_is_read_as_absent() {
        let malformed = |mut event: Value| {
            event["contaOrigem"] = json!("CC 001");
            event["contaDestino"] = json!("CC-002");
            event["valorEmCentavos"] = json!(500);
            event["moeda"] = json!("XYZ");
            event.to_string().into_bytes()
        };
        let kept = OutcomeDetails {
            source_account: None,
            destination_account: Some(account("CC-002")),
            amount_cents: Some(amount(500)),
            currency: None,
        };
        let settled = malformed(json!({
            "eventoId": "00000000-0000-0000-0000-000000000001",
            "transferenciaId": "00000000-0000-0000-0000-000000000002",
            "liquidadaEm": "2026-12-03T10:15:30Z"
        }));
        let Ok(OutcomeEvent::Settled(event)) = OutcomeEvent::decode(true, &settled) else {
            panic!("a settled event with malformed details must be read");
        };
        assert_eq!(
            (event.transfer_id, event.settled_at),
            (id(2), Timestamp::parse("2026-12-03T10:15:30Z").expect("valid"))
        );
        assert_eq!(event.details, kept);

        let rejected = malformed(json!({
            "eventoId": "00000000-0000-0000-0000-000000000001",
            "transferenciaId": "00000000-0000-0000-0000-000000000002",
            "motivo": "SALDO_INSUFICIENTE",
            "rejeitadaEm": "2026-12-03T10:15:30Z"
        }));
        let Ok(OutcomeEvent::Rejected(event)) = OutcomeEvent::decode(false, &rejected) else {
            panic!("a rejected event with malformed details must be read");
        };
        assert_eq!((event.transfer_id, event.reason), (id(2), RejectionReason::InsufficientFunds));
        assert_eq!(event.details, kept);

        // an amount of the wrong type, one that is not positive and an explicit null are absent too
        for refused in [json!("500"), json!(0), json!(-500)] {
            let mut odd: Value = serde_json::from_slice(&settled).expect("json");
            odd["valorEmCentavos"] = refused;
            odd["contaDestino"] = Value::Null;
            let event: TransferSettled = serde_json::from_value(odd).expect("read");
            assert_eq!(event.details, OutcomeDetails::default());
        }

        // what the outcome needs is still required
        let mut missing: Value = serde_json::from_slice(&settled).expect("json");
        missing.as_object_mut().expect("object").remove("transferenciaId");
        assert!(OutcomeEvent::decode(true, missing.to_string().as_bytes()).is_err());
    }

    #[test]
    fn event_type_names() {
        assert_eq!(EventType::TransferRequested.as_str(), "TransferenciaSolicitada");
        assert_eq!(EventType::TransferAnalysed.as_str(), "TransferenciaAnalisada");
        assert_eq!(EventType::TransferRejected.as_str(), "TransferenciaRejeitada");
        assert_eq!(EventType::TransferSettled.as_str(), "TransferenciaLiquidada");
        for kind in EventType::ALL {
            assert_eq!(EventType::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(EventType::parse("Outro"), None);
    }
}
