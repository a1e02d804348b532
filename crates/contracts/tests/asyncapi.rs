//! `docs/asyncapi.yaml` stays in step with the code: every topic of the plan is a channel,
//! every event's fields are its message's properties (the required ones exactly those a Java
//! producer from the article sends), and every header name we write is described.

use std::collections::BTreeSet;
use std::path::PathBuf;

use contracts::events::OutcomeDetails;
use contracts::headers::{dlt, retry};
use contracts::{
    AccountId, Currency, RejectionReason, Timestamp, TransferAnalysed, TransferRejected, TransferRequested,
    TransferSettled,
};
use uuid::Uuid;

fn document() -> String {
    let package = std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR (run under cargo test)");
    std::fs::read_to_string(PathBuf::from(package).join("../../docs/reference/asyncapi.yaml"))
        .expect("docs/reference/asyncapi.yaml")
}

/// The lines of `components.messages.<name>` (indented 4), up to the next message.
fn message_section<'a>(document: &'a str, name: &str) -> Vec<&'a str> {
    let start = document.find("\ncomponents:\n").expect("components");
    let lines: Vec<&str> = document[start..].lines().collect();
    let header = format!("    {name}:");
    let from =
        lines.iter().position(|line| *line == header).unwrap_or_else(|| panic!("message {name} missing"));
    lines[from + 1..]
        .iter()
        .take_while(|line| line.starts_with("      ") || line.is_empty())
        .copied()
        .collect()
}

/// Property names (`          <name>:`) and the `required` list of a message section.
fn properties(section: &[&str]) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut properties = BTreeSet::new();
    let mut required = BTreeSet::new();
    for line in section {
        if let Some(list) = line.trim().strip_prefix("required: [") {
            required.extend(list.trim_end_matches(']').split(',').map(|name| name.trim().to_owned()));
        } else if line.starts_with("          ") && !line.starts_with("           ") {
            if let Some((name, _)) = line.trim().split_once(':') {
                properties.insert(name.to_owned());
            }
        }
    }
    (properties, required)
}

fn keys(value: serde_json::Value) -> BTreeSet<String> {
    value.as_object().expect("object").keys().cloned().collect()
}

fn at() -> Timestamp {
    Timestamp::parse("2026-12-04T10:00:00Z").expect("timestamp")
}

fn account(id: &str) -> AccountId {
    AccountId::parse(id).expect("a well-formed account id")
}

fn brl() -> Currency {
    Currency::parse("BRL").expect("an active currency")
}

fn details(full: bool) -> OutcomeDetails {
    if !full {
        return OutcomeDetails::default();
    }
    OutcomeDetails {
        source_account: Some(account("CC-1")),
        destination_account: Some(account("CC-2")),
        amount_cents: Some(contracts::Amount::ONE_CENT),
        currency: Some(brl()),
    }
}

#[test]
fn every_event_field_is_described_and_required_as_the_article_sends_it() {
    let document = document();
    let id = Uuid::nil();
    let requested = TransferRequested {
        event_id: id,
        transfer_id: id,
        source_account: account("CC-1"),
        destination_account: account("CC-2"),
        amount_cents: contracts::Amount::ONE_CENT,
        currency: brl(),
        created_at: at(),
    };
    let analysed = TransferAnalysed {
        event_id: id,
        transfer_id: id,
        source_account: account("CC-1"),
        destination_account: account("CC-2"),
        amount_cents: contracts::Amount::ONE_CENT,
        currency: brl(),
        score: 10,
        analysed_at: at(),
    };
    let rejected = |full| TransferRejected {
        event_id: id,
        transfer_id: id,
        reason: RejectionReason::InsufficientFunds,
        rejected_at: at(),
        details: details(full),
    };
    let settled =
        |full| TransferSettled { event_id: id, transfer_id: id, settled_at: at(), details: details(full) };
    let cases = [
        (
            "TransferenciaSolicitada",
            keys(serde_json::to_value(&requested).expect("json")),
            keys(serde_json::to_value(&requested).expect("json")),
        ),
        (
            "TransferenciaAnalisada",
            keys(serde_json::to_value(&analysed).expect("json")),
            keys(serde_json::to_value(&analysed).expect("json")),
        ),
        (
            "TransferenciaRejeitada",
            keys(serde_json::to_value(rejected(true)).expect("json")),
            keys(serde_json::to_value(rejected(false)).expect("json")),
        ),
        (
            "TransferenciaLiquidada",
            keys(serde_json::to_value(settled(true)).expect("json")),
            keys(serde_json::to_value(settled(false)).expect("json")),
        ),
    ];
    for (message, all_fields, article_fields) in cases {
        let (described, required) = properties(&message_section(&document, message));
        assert_eq!(described, all_fields, "{message}: properties differ from the event's fields");
        assert_eq!(required, article_fields, "{message}: required differs from what every producer sends");
    }
    // every rejection reason is in the enum
    for reason in RejectionReason::ALL {
        assert!(document.contains(reason.as_str()), "{} missing", reason.as_str());
    }
}

#[test]
fn every_topic_of_the_plan_is_a_channel_and_nothing_else_is() {
    let document = document();
    let addresses: BTreeSet<String> = document
        .lines()
        .filter_map(|line| line.trim().strip_prefix("address: "))
        .map(str::to_owned)
        .collect();
    let planned: BTreeSet<String> = contracts::topics::plan("").into_iter().map(|spec| spec.name).collect();
    assert_eq!(addresses, planned);
}

#[test]
fn every_header_we_write_is_described() {
    let document = document();
    let names = [
        contracts::headers::EVENT_ID,
        contracts::headers::EVENT_TYPE,
        contracts::headers::TRACEPARENT,
        contracts::headers::TRACESTATE,
        dlt::ORIGINAL_TOPIC,
        dlt::ORIGINAL_PARTITION,
        dlt::ORIGINAL_OFFSET,
        dlt::ORIGINAL_TIMESTAMP,
        dlt::ORIGINAL_TIMESTAMP_TYPE,
        dlt::ORIGINAL_CONSUMER_GROUP,
        dlt::EXCEPTION_FQCN,
        dlt::EXCEPTION_CAUSE_FQCN,
        dlt::EXCEPTION_MESSAGE,
        dlt::EXCEPTION_STACKTRACE,
        retry::ORIGINAL_TOPIC,
        retry::ORIGINAL_PARTITION,
        retry::ORIGINAL_OFFSET,
        retry::ORIGINAL_TIMESTAMP,
        retry::ORIGINAL_TIMESTAMP_TYPE,
        retry::EXCEPTION_FQCN,
        retry::EXCEPTION_CAUSE_FQCN,
        retry::EXCEPTION_MESSAGE,
        retry::EXCEPTION_STACKTRACE,
        retry::ATTEMPTS,
        retry::BACKOFF_TIMESTAMP,
        retry::ORIGINAL_TIMESTAMP_RETRY,
        "pagamentos_dlt-replayed-from",
    ];
    for name in names {
        assert!(document.contains(&format!("        {name}:")), "header {name} not described");
    }
}
