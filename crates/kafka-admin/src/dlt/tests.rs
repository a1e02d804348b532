//! Unit tests of the dead-letter tools: progress, destinations, headers, replayed records.

use std::collections::BTreeSet;

use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage, Timestamp};

use contracts::headers::TimestampType;
use kafka::producer::OutgoingRecord;

use super::*;

#[test]
fn progress_folds_singles_into_the_committed_offset() {
    let mut progress = Progress::default();
    progress.mark(3);
    progress.mark(5);
    progress.mark(6);
    assert_eq!(progress, Progress { next: 0, singles: [3, 5, 6].into() });
    assert!(progress.is_replayed(5) && !progress.is_replayed(4) && !progress.is_replayed(0));
    for offset in 0..3 {
        progress.mark(offset);
    }
    assert_eq!(progress, Progress { next: 4, singles: [5, 6].into() });
    progress.mark(4);
    assert_eq!(progress, Progress { next: 7, singles: BTreeSet::new() });
    progress.mark(2); // below next: nothing changes
    assert_eq!(progress.next, 7);
    progress.mark(9);
    progress.advance_to(8);
    assert_eq!(progress, Progress { next: 8, singles: [9].into() });
    progress.mark(8);
    assert_eq!(progress, Progress { next: 10, singles: BTreeSet::new() });
}

#[test]
fn metadata_round_trips_as_ranges() {
    let progress = Progress { next: 4, singles: [5, 9, 10, 11, 20].into() };
    assert_eq!(progress.metadata(), "replayed=5,9-11,20");
    assert_eq!(Progress::parse(4, &progress.metadata()), progress);
    assert_eq!(Progress::parse(10, "replayed=5,9-11,20"), Progress { next: 12, singles: [20].into() });
    assert_eq!(Progress::parse(7, ""), Progress { next: 7, singles: BTreeSet::new() });
    assert_eq!(Progress::parse(7, "garbage,1-x"), Progress { next: 7, singles: BTreeSet::new() });
    assert_eq!(Progress::default().metadata(), "replayed=");
}

#[test]
fn replay_goes_to_the_original_topic_with_a_marker() {
    let headers = OwnedHeaders::new()
        .insert(Header { key: "kafka_original-topic", value: Some(b"transferencias.liquidada") })
        .insert(Header { key: "traceparent", value: Some(b"00-abc-def-01") });
    let record = OwnedMessage::new(
        Some(b"{}".to_vec()),
        Some(b"CC-1".to_vec()),
        "transferencias.liquidada-dlt".into(),
        Timestamp::CreateTime(1),
        2,
        17,
        Some(headers),
    );
    assert_eq!(original_topic(&record).as_deref(), Some("transferencias.liquidada"));
    let out = replay_record("transferencias.liquidada-dlt", &record, "transferencias.liquidada");
    assert_eq!(out.topic, "transferencias.liquidada");
    assert_eq!(out.partition, None);
    assert_eq!(out.key.as_deref(), Some(&b"CC-1"[..]));
    assert_eq!(out.header_value("traceparent"), Some(&b"00-abc-def-01"[..]));
    assert_eq!(out.header_value(REPLAYED_FROM), Some(&b"transferencias.liquidada-dlt/2/17"[..]));

    let dlt_headers = OwnedHeaders::new()
        .insert(Header { key: "kafka_dlt-original-topic", value: Some(b"transferencias.analisada") });
    let blocking =
        OwnedMessage::new(None, None, "x-dlt".into(), Timestamp::NotAvailable, 1, 0, Some(dlt_headers));
    assert_eq!(original_topic(&blocking).as_deref(), Some("transferencias.analisada"));
    assert_eq!(replay_record("x-dlt", &blocking, "y").partition, Some(1));
    let bare = OwnedMessage::new(None, None, "x-dlt".into(), Timestamp::NotAvailable, 0, 0, None);
    assert_eq!(original_topic(&bare), None);
}

/// A letter of `dlt_topic` whose `header` names `original`.
fn naming(dlt_topic: &str, header: &str, original: &str) -> OwnedMessage {
    let headers = OwnedHeaders::new().insert(Header { key: header, value: Some(original.as_bytes()) });
    OwnedMessage::new(
        Some(br#"{"transferenciaId":"x"}"#.to_vec()),
        Some(b"SEC-A".to_vec()),
        dlt_topic.into(),
        Timestamp::CreateTime(1),
        0,
        3,
        Some(headers),
    )
}

fn elsewhere(source: &str, destination: &str) -> Refusal {
    Refusal::Elsewhere { origin: source.into(), destination: destination.into() }
}

const SETTLED_DLT: &str = "transferencias.liquidada-dlt";
const SETTLED: &str = "transferencias.liquidada";

#[test]
fn a_letter_whose_header_names_another_topic_is_refused() {
    // notificacoes may write transferencias.liquidada-dlt: an analysis addressed to the
    // ledger's input, in either family of headers
    for header in ["kafka_dlt-original-topic", "kafka_original-topic"] {
        let forged = naming(SETTLED_DLT, header, "transferencias.analisada");
        assert_eq!(
            replay_destination(SETTLED_DLT, &forged, None),
            Err(elsewhere(SETTLED, "transferencias.analisada")),
            "{header}"
        );
    }
    // lookalikes of the source and of its retry topics
    for destination in [
        "transferencias.solicitada",
        "transferencias.rejeitada",
        "transferencias.rejeitada-retry-1000",
        "transferencias.liquidada-dlt",
        "transferencias.liquidadaX",
        "transferencias.liquidada-retry-",
        "transferencias.liquidada-retry-0",
        "transferencias.liquidada-retry-01000",
        "transferencias.liquidada-retry-+1000",
        "transferencias.liquidada-retry--1000",
        "transferencias.liquidada-retry-1000x",
        "transferencias.liquidada-retry-1000-dlt",
        "transferencias.liquidada-retry-99999999999",
        "transferencias.liquidada-retry-1000.transferencias.analisada",
        "x.transferencias.liquidada",
        "transferencias.liquidada ",
    ] {
        let forged = naming(SETTLED_DLT, "kafka_dlt-original-topic", destination);
        assert_eq!(replay_destination(SETTLED_DLT, &forged, None), Err(elsewhere(SETTLED, destination)));
    }
    // no header and no --to: nowhere to go
    let bare = OwnedMessage::new(None, None, SETTLED_DLT.into(), Timestamp::NotAvailable, 0, 0, None);
    assert_eq!(replay_destination(SETTLED_DLT, &bare, None), Err(Refusal::NoOriginalTopic));
    let empty = naming(SETTLED_DLT, "kafka_original-topic", "");
    assert_eq!(replay_destination(SETTLED_DLT, &empty, None), Err(Refusal::NoOriginalTopic));
}

#[test]
fn to_elsewhere_is_refused_whatever_the_letter_says() {
    let legit = naming(SETTLED_DLT, "kafka_original-topic", SETTLED);
    for to in ["transferencias.analisada", "transferencias.solicitada", "transferencias.rejeitada-retry-1000"]
    {
        assert_eq!(replay_destination(SETTLED_DLT, &legit, Some(to)), Err(elsewhere(SETTLED, to)));
    }
    // --to overrides a forged header only towards the source's own topics
    let forged = naming(SETTLED_DLT, "kafka_dlt-original-topic", "transferencias.analisada");
    assert_eq!(
        replay_destination(SETTLED_DLT, &forged, Some("transferencias.liquidada-retry-1000")).as_deref(),
        Ok("transferencias.liquidada-retry-1000")
    );
    assert_eq!(replay_destination(SETTLED_DLT, &forged, Some(SETTLED)).as_deref(), Ok(SETTLED));
}

#[test]
fn the_source_and_its_retry_topics_are_allowed_and_nothing_else_of_the_plan() {
    let legit = |destination: &str| naming(SETTLED_DLT, "kafka_original-topic", destination);
    for destination in [
        SETTLED,
        "transferencias.liquidada-retry-1000",
        "transferencias.liquidada-retry-2000",
        "transferencias.liquidada-retry-4000",
    ] {
        assert_eq!(replay_destination(SETTLED_DLT, &legit(destination), None).as_deref(), Ok(destination));
    }
    // a blocking handler's letter of the ledger's input goes back to it
    let analysed =
        naming("transferencias.analisada-dlt", "kafka_dlt-original-topic", "transferencias.analisada");
    assert_eq!(
        replay_destination("transferencias.analisada-dlt", &analysed, None).as_deref(),
        Ok("transferencias.analisada")
    );
    // every pair of the topic plan, with and without a prefix
    for prefix in ["", "it-7."] {
        let plan = contracts::topics::plan(prefix);
        for dead_letters in &plan {
            let contracts::topics::TopicKind::DeadLetter { source } = &dead_letters.kind else {
                continue;
            };
            for other in &plan {
                let own = other.name == *source
                    || matches!(&other.kind, contracts::topics::TopicKind::Retry { source: of, .. } if of == source);
                assert_eq!(
                    check_destination(&dead_letters.name, &other.name).is_ok(),
                    own,
                    "{} → {}",
                    dead_letters.name,
                    other.name
                );
            }
        }
    }
}

#[test]
fn the_topic_prefix_is_part_of_both_names() {
    let dlt = "it-7.transferencias.liquidada-dlt";
    assert_eq!(source_of(dlt), Some("it-7.transferencias.liquidada"));
    assert_eq!(check_destination(dlt, "it-7.transferencias.liquidada"), Ok(()));
    assert_eq!(check_destination(dlt, "it-7.transferencias.liquidada-retry-1000"), Ok(()));
    // the unprefixed (production) topics, another prefix's, another topic behind the same
    for destination in [
        SETTLED,
        "transferencias.liquidada-retry-1000",
        "it-8.transferencias.liquidada",
        "it-7.transferencias.analisada",
    ] {
        assert_eq!(
            check_destination(dlt, destination),
            Err(elsewhere("it-7.transferencias.liquidada", destination))
        );
    }
    // and a letter of the production set cannot reach a prefixed one either
    assert_eq!(
        check_destination(SETTLED_DLT, "it-7.transferencias.liquidada"),
        Err(elsewhere(SETTLED, "it-7.transferencias.liquidada"))
    );
    // a topic that is no dead-letter topic has no source
    for topic in [SETTLED, "-dlt", ""] {
        assert_eq!(check_destination(topic, SETTLED), Err(Refusal::NoSource { dlt_topic: topic.into() }));
    }
}

fn letter(headers: &[(&str, &[u8])]) -> OwnedMessage {
    let headers = headers.iter().fold(OwnedHeaders::new(), |headers, (key, value)| {
        headers.insert(Header { key, value: Some(*value) })
    });
    OwnedMessage::new(
        Some(b"{}".to_vec()),
        None,
        "t-dlt".into(),
        Timestamp::CreateTime(9),
        0,
        4,
        Some(headers),
    )
}

#[test]
fn the_original_timestamp_type_is_read_in_both_spellings() {
    let at = 1_733_212_800_123i64.to_be_bytes();
    let old = letter(&[
        ("kafka_dlt-original-timestamp", &at),
        ("kafka_dlt-original-timestamp-type", b"CREATE_TIME"),
    ]);
    assert_eq!(original_timestamp(&old), Some((1_733_212_800_123, TimestampType::CreateTime)));
    let new =
        letter(&[("kafka_original-timestamp", &at), ("kafka_original-timestamp-type", b"LogAppendTime")]);
    assert_eq!(original_timestamp(&new), Some((1_733_212_800_123, TimestampType::LogAppendTime)));
    let unknown = letter(&[("kafka_original-timestamp", &at), ("kafka_original-timestamp-type", b"Later")]);
    assert_eq!(original_timestamp(&unknown), None);
    assert_eq!(Letter::new(old, false).original_timestamp.map(|(_, kind)| kind.as_str()), Some("CreateTime"));
}

#[test]
fn a_letter_with_a_value_per_hop_is_listed_by_its_last_and_replayed_with_all() {
    let record = letter(&[
        ("kafka_original-topic", b"transferencias.liquidada"),
        ("kafka_exception-message", b"first"),
        ("retry_topic-attempts", &[0, 0, 0, 2]),
        ("kafka_exception-message", b"last"),
        ("retry_topic-attempts", &[0, 0, 0, 3]),
    ]);
    let listed = Letter::new(record.clone(), false);
    assert_eq!(listed.exception_message.as_deref(), Some("last"));
    let out = replay_record("t-dlt", &record, "transferencias.liquidada-retry-1000");
    let names: Vec<&str> = out.headers.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "kafka_original-topic",
            "kafka_exception-message",
            "retry_topic-attempts",
            "kafka_exception-message",
            "retry_topic-attempts",
            REPLAYED_FROM
        ]
    );
    assert_eq!(out.header_values("retry_topic-attempts"), [&[0u8, 0, 0, 2][..], &[0, 0, 0, 3]]);
}

/// `out` as the next stage receives it: its topic, a new offset and timestamp.
fn received(out: &OutgoingRecord, offset: i64, timestamp_ms: i64) -> OwnedMessage {
    OwnedMessage::new(
        Some(out.payload.clone()),
        out.key.clone(),
        out.topic.clone(),
        Timestamp::CreateTime(timestamp_ms),
        out.partition.unwrap_or(0), // a replay leaves it to the partitioner
        offset,
        Some(out.owned_headers()),
    )
}

#[test]
fn a_dead_letter_redriven_to_a_retry_topic_is_due_at_once() {
    use kafka::dead_letter::Failure;
    use kafka::retry_topic::{due_at_ms, forwarded, now_ms, Chain};

    let chain = Chain { delays_ms: vec![1000, 2000, 4000] };
    let failure = Failure {
        exception_fqcn: "notifications::webhook::Unavailable".into(),
        cause_fqcn: "http::status::StatusCode".into(),
        message: "503".into(),
        stacktrace: "503".into(),
    };
    let now = now_ms();
    let mut current = OwnedMessage::new(
        Some(br#"{"eventoId":"x"}"#.to_vec()),
        Some(b"CC-1".to_vec()),
        "t".into(),
        Timestamp::CreateTime(1_800_000_000_000),
        0,
        1,
        None,
    );
    for failed in 1..=4 {
        let out = forwarded(&current, "g", &failure, failed, &chain.after_failure("t", failed), now);
        current = received(&out, i64::from(failed), now);
    }
    assert_eq!(current.topic(), "t-dlt");
    // `pagamentos dlt replay --to t-retry-1000` copies every header, in order
    let replayed = replay_record("t-dlt", &current, "t-retry-1000");
    let on_retry = received(&replayed, 0, now + 10);
    let due = due_at_ms(&on_retry).expect("a backoff timestamp");
    assert!(due <= now, "due {} ms after it was dead-lettered", due - now);
    // the first value (1 s after the first failure) would hold it back
    assert_eq!(
        contracts::headers::decode_big_integer(replayed.header_values("retry_topic-backoff-timestamp")[0]),
        Ok(now + 1000)
    );
}

/// A letter whose payload was cut to fit its topic is not the record that failed: replaying it
/// would publish a truncated event. It is refused, naming where the whole record is.
#[test]
fn a_letter_with_a_cut_payload_is_refused_and_names_where_the_whole_record_is() {
    let cut = letter(&[
        (contracts::headers::dlt::ORIGINAL_TOPIC, SETTLED.as_bytes()),
        (contracts::headers::dlt::ORIGINAL_PARTITION, &contracts::headers::encode_int(3)),
        (contracts::headers::dlt::ORIGINAL_OFFSET, &contracts::headers::encode_long(77)),
        (contracts::headers::PAYLOAD_CUT_FROM, &contracts::headers::encode_long(1_000_000)),
    ]);
    let refusal = replay_destination(SETTLED_DLT, &cut, None).expect_err("refused");
    assert_eq!(
        refusal,
        Refusal::PayloadCut { original_bytes: 1_000_000, origin: format!("{SETTLED} partition 3 offset 77") }
    );
    assert!(replay_destination(SETTLED_DLT, &cut, Some(SETTLED)).is_err(), "--to does not bypass it");
}
