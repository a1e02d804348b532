//! Unit tests of the retry topics: the chain, forwarded headers hop by hop, due times, and a
//! stage's concurrency.

use super::*;
use contracts::headers::{decode_int, decode_long, decode_text};
use rdkafka::message::{Header, OwnedHeaders, Timestamp};

fn chain() -> Chain {
    Chain { delays_ms: vec![1000, 2000, 4000] }
}

fn failure(message: &str) -> Failure {
    Failure {
        exception_fqcn: "notifications::webhook::Unavailable".into(),
        cause_fqcn: "http::status::StatusCode".into(),
        message: message.into(),
        stacktrace: message.into(),
    }
}

fn record(topic: &str, partition: i32, offset: i64, headers: Option<OwnedHeaders>) -> OwnedMessage {
    OwnedMessage::new(
        Some(br#"{"eventoId":"x"}"#.to_vec()),
        Some(b"CC-1".to_vec()),
        topic.into(),
        Timestamp::CreateTime(1_800_000_000_000),
        partition,
        offset,
        headers,
    )
}

fn value<'a>(record: &'a OutgoingRecord, name: &str) -> &'a [u8] {
    record.header_value(name).unwrap_or_else(|| panic!("header {name} missing"))
}

fn count(record: &OutgoingRecord, name: &str) -> usize {
    record.headers.iter().filter(|(key, _)| key == name).count()
}

#[test]
fn four_attempts_then_the_dead_letter_topic() {
    let chain = chain();
    assert_eq!(chain.attempts(), 4);
    let base = "transferencias.liquidada";
    assert_eq!(
        chain.after_failure(base, 1),
        Destination::Retry { topic: format!("{base}-retry-1000"), attempt: 2, delay_ms: 1000 }
    );
    assert_eq!(
        chain.after_failure(base, 3),
        Destination::Retry { topic: format!("{base}-retry-4000"), attempt: 4, delay_ms: 4000 }
    );
    assert_eq!(chain.after_failure(base, 4), Destination::DeadLetter { topic: format!("{base}-dlt") });
}

#[test]
fn stages_have_spring_group_names_and_map_back_to_the_source() {
    let stages = chain().stages(
        &["p.transferencias.liquidada".into(), "p.transferencias.rejeitada".into()],
        "p.notificacoes",
    );
    assert_eq!(stages.len(), 4);
    assert_eq!(stages[0].group, "p.notificacoes");
    assert!(!stages[0].waits_for_backoff);
    assert!(stages[1..].iter().all(|stage| stage.waits_for_backoff));
    assert_eq!(stages[2].group, "p.notificacoes-retry-2000");
    assert_eq!(stages[2].attempt, 3);
    assert_eq!(
        stages[2].topics(),
        vec!["p.transferencias.liquidada-retry-2000", "p.transferencias.rejeitada-retry-2000"]
    );
    assert_eq!(stages[2].base_of("p.transferencias.rejeitada-retry-2000"), "p.transferencias.rejeitada");
}

#[test]
fn first_hop_writes_the_original_family_and_the_retry_headers() {
    let source = record("transferencias.liquidada", 5, 42, None);
    let destination = chain().after_failure("transferencias.liquidada", 1);
    let now = 1_900_000_000_000;
    let out = forwarded(&source, "notificacoes", &failure("503"), 1, &destination, now);
    assert_eq!(out.topic, "transferencias.liquidada-retry-1000");
    assert_eq!(out.partition, Some(5));
    assert_eq!(out.key.as_deref(), Some(&b"CC-1"[..]));
    assert_eq!(out.payload, br#"{"eventoId":"x"}"#);
    assert_eq!(decode_text(value(&out, "kafka_original-topic")), Ok("transferencias.liquidada"));
    assert_eq!(decode_int(value(&out, "kafka_original-partition")), Ok(5));
    assert_eq!(decode_long(value(&out, "kafka_original-offset")), Ok(42));
    assert_eq!(decode_long(value(&out, "kafka_original-timestamp")), Ok(1_800_000_000_000));
    assert_eq!(value(&out, "kafka_original-timestamp-type"), b"CreateTime");
    assert_eq!(value(&out, "kafka_dlt-original-consumer-group"), b"notificacoes");
    assert_eq!(value(&out, "kafka_exception-message"), b"503");
    assert_eq!(decode_int(value(&out, "retry_topic-attempts")), Ok(2));
    assert_eq!(decode_big_integer(value(&out, "retry_topic-backoff-timestamp")), Ok(now + 1000));
    assert_eq!(value(&out, "retry_topic-backoff-timestamp").len(), 6);
    assert_eq!(decode_big_integer(value(&out, "retry_topic-original-timestamp")), Ok(1_800_000_000_000));
}

/// `out` as the next stage receives it: `topic`, a new offset and timestamp.
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

fn ints(record: &OutgoingRecord, name: &str) -> Vec<i32> {
    record.header_values(name).into_iter().map(|value| decode_int(value).expect("int")).collect()
}

fn big_integers(record: &OutgoingRecord, name: &str) -> Vec<i64> {
    record.header_values(name).into_iter().map(|value| decode_big_integer(value).expect("big")).collect()
}

#[test]
fn every_hop_appends_the_retry_and_exception_headers_and_keeps_the_original_once() {
    let base = "transferencias.liquidada";
    let failed_at = [1_900_000_000_000, 1_900_000_001_010, 1_900_000_003_020, 1_900_000_007_030];
    let groups =
        ["notificacoes", "notificacoes-retry-1000", "notificacoes-retry-2000", "notificacoes-retry-4000"];
    let mut current = record(base, 5, 42, None);
    let mut hops = Vec::new();
    for (index, (&now, group)) in failed_at.iter().zip(groups).enumerate() {
        let failed = index as u32 + 1;
        let destination = chain().after_failure(base, failed);
        let out = forwarded(&current, group, &failure(&format!("503 #{failed}")), failed, &destination, now);
        current = received(&out, 100 + index as i64, now + 5);
        hops.push(out);
    }
    let topics: Vec<&str> = hops.iter().map(|hop| hop.topic.as_str()).collect();
    assert_eq!(
        topics,
        [
            "transferencias.liquidada-retry-1000",
            "transferencias.liquidada-retry-2000",
            "transferencias.liquidada-retry-4000",
            "transferencias.liquidada-dlt"
        ]
    );
    // attempts: one value a hop, the last the attempt the record is on its way to; on
    // -dlt one past the fourth and last attempt, as Spring writes it
    assert_eq!(ints(&hops[0], "retry_topic-attempts"), [2]);
    assert_eq!(ints(&hops[1], "retry_topic-attempts"), [2, 3]);
    assert_eq!(ints(&hops[2], "retry_topic-attempts"), [2, 3, 4]);
    assert_eq!(ints(&hops[3], "retry_topic-attempts"), [2, 3, 4, 5]);
    // backoff: failure time + the destination's delay; + 0 for -dlt
    assert_eq!(
        big_integers(&hops[3], "retry_topic-backoff-timestamp"),
        [1_900_000_001_000, 1_900_000_003_010, 1_900_000_007_020, 1_900_000_007_030]
    );
    assert_eq!(big_integers(&hops[3], "retry_topic-original-timestamp"), [1_800_000_000_000; 4]);
    // the literal bytes of the last values on -dlt
    assert_eq!(hops[3].header_value("retry_topic-attempts"), Some(&[0u8, 0, 0, 5][..]));
    assert_eq!(
        hops[3].header_value("retry_topic-backoff-timestamp"),
        Some(&encode_big_integer(1_900_000_007_030)[..])
    );
    assert_eq!(hops[3].header_value("retry_topic-backoff-timestamp").map(<[u8]>::len), Some(6));
    // exception headers: one value a hop, the cause type included
    for name in EXCEPTION_HEADERS {
        assert_eq!(count(&hops[1], name), 2, "{name}");
        assert_eq!(count(&hops[3], name), 4, "{name}");
    }
    assert_eq!(value(&hops[3], "kafka_exception-message"), b"503 #4");
    assert_eq!(hops[3].header_values("kafka_exception-message")[0], b"503 #1");
    assert_eq!(value(&hops[3], "kafka_exception-cause-fqcn"), b"http::status::StatusCode");
    // the original family and the group: once, from the first hop
    for name in [
        "kafka_original-topic",
        "kafka_original-partition",
        "kafka_original-offset",
        "kafka_original-timestamp",
        "kafka_original-timestamp-type",
        "kafka_dlt-original-consumer-group",
    ] {
        assert_eq!(count(&hops[3], name), 1, "{name}");
    }
    assert_eq!(decode_long(value(&hops[3], "kafka_original-offset")), Ok(42));
    assert_eq!(value(&hops[3], "kafka_original-timestamp-type"), b"CreateTime");
    assert_eq!(value(&hops[3], "kafka_dlt-original-consumer-group"), b"notificacoes");
    assert!(hops.iter().all(|hop| hop.partition == Some(5)));
}

#[test]
fn a_failure_no_retry_fixes_goes_to_the_dead_letter_topic_one_attempt_on() {
    let first = forwarded(
        &record("t", 0, 1, None),
        "g",
        &failure("503"),
        1,
        &chain().after_failure("t", 1),
        1_900_000_000_000,
    );
    // attempt 2 answers 400: straight to -dlt, attempts 3, backoff = now
    let reject = Destination::DeadLetter { topic: "t-dlt".into() };
    let out = forwarded(
        &received(&first, 9, 1_900_000_001_005),
        "g-retry-1000",
        &failure("400"),
        2,
        &reject,
        1_900_000_001_020,
    );
    assert_eq!(out.topic, "t-dlt");
    assert_eq!(ints(&out, "retry_topic-attempts"), [2, 3]);
    assert_eq!(big_integers(&out, "retry_topic-backoff-timestamp"), [1_900_000_001_000, 1_900_000_001_020]);
    // rejected by the main stage: attempts 2 and a backoff timestamp
    let at_once = forwarded(&record("t", 0, 1, None), "g", &failure("400"), 1, &reject, 1_900_000_000_000);
    assert_eq!(ints(&at_once, "retry_topic-attempts"), [2]);
    assert_eq!(big_integers(&at_once, "retry_topic-backoff-timestamp"), [1_900_000_000_000]);
}

#[test]
fn due_time_comes_from_the_backoff_header() {
    let headers = OwnedHeaders::new().insert(Header {
        key: "retry_topic-backoff-timestamp",
        value: Some(&encode_big_integer(1_900_000_001_000)),
    });
    assert_eq!(due_at_ms(&record("t-retry-1000", 0, 0, Some(headers))), Some(1_900_000_001_000));
    assert_eq!(due_at_ms(&record("t-retry-1000", 0, 0, None)), None);
    let garbage = OwnedHeaders::new()
        .insert(Header { key: "retry_topic-backoff-timestamp", value: Some(&[1u8; 9][..]) });
    assert_eq!(due_at_ms(&record("t-retry-1000", 0, 0, Some(garbage))), None);
    // two hops' values: the last one decides (Spring's lastHeader)
    let two = OwnedHeaders::new()
        .insert(Header {
            key: "retry_topic-backoff-timestamp",
            value: Some(&encode_big_integer(1_900_000_001_000)),
        })
        .insert(Header {
            key: "retry_topic-backoff-timestamp",
            value: Some(&encode_big_integer(1_900_000_003_000)),
        });
    assert_eq!(due_at_ms(&record("t-retry-2000", 0, 0, Some(two))), Some(1_900_000_003_000));
}

/// Counts the attempts running at once; offset 0 takes 100 ms, the others 10 ms; odd
/// offsets fail.
#[derive(Default)]
struct Timed {
    running: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

impl Attempt for Timed {
    fn attempt(&self, record: &OwnedMessage) -> impl Future<Output = Verdict> + Send {
        use std::sync::atomic::Ordering::SeqCst;
        let offset = record.offset();
        async move {
            let now = self.running.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            tokio::time::sleep(Duration::from_millis(if offset == 0 { 100 } else { 10 })).await;
            self.running.fetch_sub(1, SeqCst);
            if offset % 2 == 1 {
                Verdict::Retry(failure("503"))
            } else {
                Verdict::Done
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn attempts_run_at_most_concurrency_at_once_and_a_slow_one_holds_only_its_slot() {
    let attempt = Arc::new(Timed::default());
    let stage = chain().stages(&["t".into()], "g").remove(0);
    let mut handler = StageHandler { attempt: attempt.clone(), chain: chain(), stage, concurrency: 2 };
    let batch: Vec<OwnedMessage> = (0..5).map(|offset| record("t", 0, offset, None)).collect();
    let started = tokio::time::Instant::now();
    let verdicts = handler.handle(&batch, false).await.expect("infallible");
    // offset 0 holds one slot for 100 ms; the other slot runs offsets 1–4 one after the other
    assert_eq!(started.elapsed(), Duration::from_millis(100));
    assert_eq!(attempt.most.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(verdicts.len(), 5);
    for (offset, verdict) in verdicts.iter().enumerate() {
        match verdict {
            ConsumerVerdict::Done => assert_eq!(offset % 2, 0, "offset {offset}"),
            ConsumerVerdict::Forward(forward) => {
                assert_eq!(offset % 2, 1, "offset {offset}");
                assert_eq!(forward.record.topic, "t-retry-1000");
            }
            other => panic!("offset {offset}: {other:?}"),
        }
    }
}
