//! Hostile records on `transferencias.analisada`: arbitrary bytes, truncated and oversized
//! events, fields of the wrong type or out of range, unknown fields, garbage trace headers.
//! The decoder never panics; it either refuses the record (which the settler dead-letters at
//! once) or yields a transfer the books can take: a positive amount between two accounts.

use kafka::rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};
use proptest::prelude::*;
use serde_json::{json, Value};

fn record(payload: Option<Vec<u8>>, traceparent: Option<Vec<u8>>) -> OwnedMessage {
    let headers = traceparent.map(|value| {
        OwnedHeaders::new()
            .insert(Header { key: "traceparent", value: Some(&value) })
            .insert(Header { key: "evento-tipo", value: Some(&b"\xff\xfeNoSuchEvent"[..]) })
    });
    OwnedMessage::new(
        payload,
        None,
        "t.transferencias.analisada".into(),
        Timestamp::NotAvailable,
        0,
        0,
        headers,
    )
}

fn valid() -> Value {
    json!({
        "eventoId": "5f1e8a8e-0b7a-4a8e-9a55-0f1f5e0c2a11",
        "transferenciaId": "0b0e5f2a-7a4c-4b1e-8d55-3b9e9e3f2c10",
        "contaOrigem": "CC-001",
        "contaDestino": "CC-002",
        "valorEmCentavos": 30000,
        "moeda": "BRL",
        "score": 10,
        "analisadaEm": "2026-12-04T10:00:00.123456Z"
    })
}

fn anything() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(Value::from(u64::MAX)),
        any::<f64>().prop_map(Value::from),
        "\\PC{0,40}".prop_map(Value::from),
        Just(json!([1, "two"])),
        Just(json!({"deep": {"er": []}})),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(
        payload in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..400)),
        traceparent in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..80)),
    ) {
        prop_assert!(ledger::settler::decode(&record(payload, traceparent)).is_err());
    }

    #[test]
    fn a_field_replaced_removed_or_added_is_refused_or_sane(
        field in prop_oneof![
            Just("eventoId"), Just("transferenciaId"), Just("contaOrigem"), Just("contaDestino"),
            Just("valorEmCentavos"), Just("moeda"), Just("score"), Just("analisadaEm"), Just("campoDesconhecido"),
        ],
        value in proptest::option::of(anything()),
        cut in proptest::option::of(0usize..200),
        padding in proptest::option::of(0usize..200_000),
    ) {
        let mut event = valid();
        match value {
            Some(value) => { event[field] = value; }
            None => { event.as_object_mut().expect("object").remove(field); }
        }
        if let Some(padding) = padding {
            event["campoDesconhecido"] = Value::from("x".repeat(padding)); // oversized, unknown field
        }
        let mut payload = serde_json::to_vec(&event).expect("json");
        if let Some(cut) = cut {
            payload.truncate(cut.min(payload.len().saturating_sub(1))); // truncated mid-record
        }
        if let Ok(request) = ledger::settler::decode(&record(Some(payload), Some(b"00-garbage".to_vec()))) {
            prop_assert!(request.transfer.amount_cents.get() > 0);
            prop_assert_ne!(request.transfer.source, request.transfer.destination);
        }
    }
}

#[test]
fn the_valid_event_decodes() {
    let request = ledger::settler::decode(&record(Some(serde_json::to_vec(&valid()).expect("json")), None))
        .expect("a valid event decodes");
    assert_eq!(request.transfer.amount_cents.get(), 30_000);
}
