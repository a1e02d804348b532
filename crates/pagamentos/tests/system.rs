//! The whole system as `pagamentos all` runs it, end to end on the real stack: transfers reach
//! their final status through all four services, the books stay provably balanced, and a
//! SIGTERM under load loses and doubles nothing.

use crate::common;

use common::system::System;

use std::time::Duration;

use serde_json::{json, Value};
use tokio::process::{Child, Command};

async fn terminate(child: &mut Child) -> std::process::ExitStatus {
    let pid = child.id().expect("pid").to_string();
    let status = Command::new("kill").args(["-TERM", &pid]).status().await.expect("kill -TERM");
    assert!(status.success());
    tokio::time::timeout(Duration::from_secs(40), child.wait())
        .await
        .expect("exits within the drain deadline")
        .expect("wait")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_and_both_kinds_of_rejection_end_to_end() {
    let system = System::new().await;
    let mut all = system.start().await;
    system.open_account("E2E-A", 20_000_000).await;
    system.open_account("E2E-B", 0).await;

    let settled = system.transfer("E2E-A", "E2E-B", 12_345).await.expect("accepted");
    let blocked = system.transfer("E2E-A", "E2E-B", 15_000_000).await.expect("accepted");
    let short = system.transfer("E2E-B", "E2E-A", 5_000_000).await.expect("accepted");

    assert_eq!(system.final_status(&settled).await, ("LIQUIDADA".to_owned(), Value::Null));
    assert_eq!(system.final_status(&blocked).await, ("REJEITADA".to_owned(), json!("BLOQUEADA_ANTIFRAUDE")));
    assert_eq!(system.final_status(&short).await, ("REJEITADA".to_owned(), json!("SALDO_INSUFICIENTE")));
    assert_eq!(system.balance("E2E-A").await, 20_000_000 - 12_345);
    assert_eq!(system.balance("E2E-B").await, 12_345);

    let status = terminate(&mut all).await;
    assert!(status.success(), "pagamentos all exited with {status}");
    let (code, report) = system.verify().await;
    assert_eq!(code, 0, "{report}");
}

/// The names of `pid`'s threads (Linux: `/proc/<pid>/task/*/comm`).
fn thread_names(pid: u32) -> Vec<String> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("/proc/<pid>/task");
    tasks
        .map(|task| {
            let path = task.expect("task").path().join("comm");
            std::fs::read_to_string(path).expect("comm").trim().to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_services_of_one_process_publish_through_one_producer() {
    let system = System::new().await;
    let mut all = system.start().await;
    system.open_account("ONE-A", 1_000_000).await;
    system.open_account("ONE-B", 0).await;
    let settled = system.transfer("ONE-A", "ONE-B", 2_500).await.expect("accepted");
    // both relays published through it: the request, then the outcome
    assert_eq!(system.final_status(&settled).await, ("LIQUIDADA".to_owned(), Value::Null));

    // each producer serves its delivery reports on a thread named after its client id
    // (`kafka::delivery`, cut to Linux's 15 characters): `pagamentos` is the shared one,
    // `antifraude` the transactional one; a service building its own would add its name
    let names = thread_names(all.id().expect("pid"));
    let count = |name: &str| names.iter().filter(|thread| thread.as_str() == name).count();
    assert_eq!(count("kafka-dr-pagame"), 1, "{names:?}");
    for own in ["kafka-dr-transf", "kafka-dr-ledger", "kafka-dr-notifi"] {
        assert_eq!(count(own), 0, "{names:?}");
    }
    assert!(count("kafka-dr-antifr") <= 1, "only the transactional producer is antifraude's own: {names:?}");

    let status = terminate(&mut all).await;
    assert!(status.success(), "pagamentos all exited with {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_loses_and_doubles_nothing() {
    let system = System::new().await;
    let mut all = system.start().await;
    const ACCOUNTS: usize = 20;
    const OPENING: i64 = 1_000_000;
    for n in 0..ACCOUNTS {
        system.open_account(&format!("LOAD-{n:02}"), OPENING).await;
    }

    // 600 transfers at about 150/s; SIGTERM lands in the middle, then the system restarts
    let sender = {
        let http = system.http.clone();
        let url = system.api("/transferencias");
        tokio::spawn(async move {
            let mut accepted = Vec::new();
            let mut refused = 0;
            for n in 0..600usize {
                let body = json!({"contaOrigem": format!("LOAD-{:02}", n % ACCOUNTS),
                    "contaDestino": format!("LOAD-{:02}", (n * 7 + 3) % ACCOUNTS), "valorEmCentavos": 100 + n as i64, "moeda": "BRL"});
                if n % ACCOUNTS == (n * 7 + 3) % ACCOUNTS {
                    continue; // same account on both sides: not a transfer
                }
                let key = format!("load-{n}");
                match http.post(&url).header("Idempotency-Key", key).json(&body).send().await {
                    Ok(response) if response.status() == 202 => {
                        let body: Value = response.json().await.expect("body");
                        accepted.push(body["id"].as_str().expect("id").to_owned());
                    }
                    _ => refused += 1,
                }
                tokio::time::sleep(Duration::from_millis(6)).await;
            }
            (accepted, refused)
        })
    };
    // SIGTERM once the load is flowing: it lands in the middle of it
    testkit::eventually("150 transfers accepted", testkit::PATIENCE, || async {
        let accepted: i64 = sqlx::query_scalar("SELECT count(*) FROM transferencia")
            .fetch_one(&system.transfers_db.pool)
            .await
            .ok()?;
        (accepted >= 150).then_some(())
    })
    .await;
    let status = terminate(&mut all).await;
    assert!(status.success(), "pagamentos all exited with {status} after SIGTERM");
    let mut all = system.start().await;
    let (accepted, refused) = sender.await.expect("sender");
    assert!(accepted.len() > 100, "only {} accepted", accepted.len());

    let mut settled = 0;
    for id in &accepted {
        if system.final_status(id).await.0 == "LIQUIDADA" {
            settled += 1;
        }
    }
    let mut total = 0;
    for n in 0..ACCOUNTS {
        total += system.balance(&format!("LOAD-{n:02}")).await;
    }
    assert_eq!(total, OPENING * ACCOUNTS as i64, "money was created or destroyed");
    let (code, report) = system.verify().await;
    assert_eq!(code, 0, "{report}");
    eprintln!(
        "{} transfers accepted ({} refused while the system restarted), {} settled, all final; verify clean",
        accepted.len(),
        refused,
        settled
    );
    assert!(terminate(&mut all).await.success());
}

/// The trace id inside a W3C `traceparent` (`00-<trace>-<span>-<flags>`).
fn trace_id_of(traceparent: &[u8]) -> String {
    String::from_utf8_lossy(traceparent).split('-').nth(1).unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_follows_a_transfer_through_every_hop() {
    use kafka::rdkafka::message::Message;

    let system = System::new().await;
    let (collector, endpoint) = testkit::otlp::Collector::start().await;
    let mut all = system
        .start_with(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ])
        .await;
    system.open_account("TRACE-A", 1_000_000).await;
    system.open_account("TRACE-B", 0).await;
    // an incoming trace is continued, not replaced
    let incoming_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let response = system
        .http
        .post(system.api("/transferencias"))
        .header("Idempotency-Key", "trace-1")
        .header("traceparent", format!("00-{incoming_trace}-00f067aa0ba902b7-01"))
        .json(&json!({"contaOrigem": "TRACE-A", "contaDestino": "TRACE-B", "valorEmCentavos": 500, "moeda": "BRL"}))
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), 202);
    let id = response.json::<Value>().await.expect("body")["id"].as_str().expect("id").to_owned();
    assert_eq!(system.final_status(&id).await.0, "LIQUIDADA");

    // every hop exported a span of that one trace, naming the transfer where it knows it
    let hops = ["outbox.publish", "analyse", "settle", "project", "notifications.deliver"];
    let deadline = tokio::time::Instant::now() + testkit::PATIENCE;
    let spans = loop {
        let spans: Vec<_> =
            collector.spans().into_iter().filter(|span| span.trace_id == incoming_trace).collect();
        if hops.iter().all(|hop| spans.iter().any(|span| span.name == *hop)) {
            break spans;
        }
        if tokio::time::Instant::now() > deadline {
            let all: Vec<(String, String)> =
                collector.spans().into_iter().map(|span| (span.name, span.trace_id)).collect();
            panic!("not every hop in trace {incoming_trace}; spans exported: {all:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let names: Vec<&str> = spans.iter().map(|span| span.name.as_str()).collect();
    assert!(names.contains(&"create"), "no span of the HTTP request: {names:?}");
    for hop in ["create", "analyse", "settle", "project", "notifications.deliver"] {
        let span = spans.iter().find(|span| span.name == hop).expect("hop");
        assert_eq!(span.attributes.get("transfer_id"), Some(&id), "{hop} names the transfer");
    }
    // outbox rows of both databases were published in the trace: the request and the outcome
    assert!(spans.iter().filter(|span| span.name == "outbox.publish").count() >= 2, "{names:?}");
    // every span but the request's has its parent in the trace, which continues the caller's
    let ids: Vec<&str> = spans.iter().map(|span| span.span_id.as_str()).collect();
    assert!(names.contains(&"http.request"), "{names:?}");
    let root = spans.iter().find(|span| span.name == "http.request").expect("request span");
    assert_eq!(root.parent_span_id, "00f067aa0ba902b7", "the request's span continues the caller's");
    for span in spans.iter().filter(|span| span.name != "http.request") {
        assert!(ids.contains(&span.parent_span_id.as_str()), "{} has a parent outside the trace", span.name);
    }

    // and every event of the transfer carries the trace on Kafka
    let reader = kafka::consumer::subscribe(
        &kafka::config::consumer_config(
            &system.topics.args,
            "test",
            &testkit::unique("trace-reader"),
            kafka::config::OffsetCommit::StoredAfterHandling,
        ),
        &[
            &system.topics.topic(contracts::topics::REQUESTED),
            &system.topics.topic(contracts::topics::ANALYSED),
            &system.topics.topic(contracts::topics::SETTLED),
        ],
    )
    .expect("reader");
    let mut seen = std::collections::HashMap::new();
    tokio::time::timeout(testkit::PATIENCE, async {
        while seen.len() < 3 {
            let record = reader.recv().await.expect("receive");
            let payload: Value =
                serde_json::from_slice(record.payload().unwrap_or_default()).unwrap_or_default();
            if payload["transferenciaId"] == id.as_str() {
                let traceparent =
                    kafka::consumer::header(&record, "traceparent").expect("traceparent").to_vec();
                seen.insert(record.topic().to_owned(), trace_id_of(&traceparent));
            }
        }
    })
    .await
    .expect("the transfer's three events");
    assert!(seen.values().all(|trace| trace == incoming_trace), "{seen:?}");
    let name_of =
        |id: &str| spans.iter().find(|span| span.span_id == id).map_or("(caller)", |span| span.name.as_str());
    let edges: Vec<String> =
        spans.iter().map(|span| format!("{} <- {}", span.name, name_of(&span.parent_span_id))).collect();
    eprintln!("one trace {incoming_trace}: {} spans: {edges:?}", spans.len());
    assert!(terminate(&mut all).await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counters_alerts_read_are_served_at_zero_before_any_failure() {
    let system = System::new().await;
    let mut all = system.start().await;
    let topic = |name: &str| system.topics.topic(name);
    let mut expected = Vec::new();
    for consumed in [
        contracts::topics::REQUESTED,
        contracts::topics::ANALYSED,
        contracts::topics::SETTLED,
        contracts::topics::REJECTED,
    ] {
        expected.push(format!("retries_total{{topic=\"{}\"}} 0", topic(consumed)));
        expected.push(format!("dlt_mensagens_total{{topic=\"{}-dlt\"}} 0", topic(consumed)));
    }
    for base in [contracts::topics::SETTLED, contracts::topics::REJECTED] {
        for delay in contracts::topics::RETRY_DELAYS_MS {
            expected.push(format!("retries_total{{topic=\"{}-retry-{delay}\"}} 0", topic(base)));
        }
    }
    // ready means started: every service registered its counters before it answered /readyz
    let text = system
        .http
        .get(format!("http://127.0.0.1:{}/metrics", system.ports[0]))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let missing: Vec<&String> =
        expected.iter().filter(|line| !text.lines().any(|served| served == line.as_str())).collect();
    assert!(missing.is_empty(), "not served at 0 from the start: {missing:?}");
    assert!(terminate(&mut all).await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_contract_metric_is_served_after_traffic() {
    use kafka::producer::{OutgoingRecord, Producer};
    use testkit::webhook::{Receiver, Reply};

    let system = System::new().await;
    // the webhook fails every call: notifications go through the retry topics
    let (receiver, url) = Receiver::start().await;
    receiver.answer_by_default(Reply::Status(503));
    let mut all = system.start_with(&[("NOTIFICACOES_WEBHOOK_URL", url.as_str())]).await;
    system.open_account("METRIC-A", 100_000).await;
    system.open_account("METRIC-B", 0).await;
    let id = system.transfer("METRIC-A", "METRIC-B", 700).await.expect("accepted");
    assert_eq!(system.final_status(&id).await.0, "LIQUIDADA");
    // and a poison record for antifraud's dead-letter topic
    let producer =
        Producer::new(&kafka::config::producer_config(&system.topics.args, "test", Duration::ZERO))
            .expect("producer");
    let poison =
        OutgoingRecord::new(system.topics.topic(contracts::topics::REQUESTED), "METRIC-A", "{not json");
    producer.send(&poison).await.expect("poison");

    let requested = system.topics.topic(contracts::topics::REQUESTED);
    let settled = system.topics.topic(contracts::topics::SETTLED);
    let expected = [
        "outbox_pendentes{database=\"transferencias\"}".to_owned(),
        "outbox_pendentes{database=\"ledger\"}".to_owned(),
        "outbox_oldest_pending_seconds{database=\"transferencias\"}".to_owned(),
        format!(
            "kafka_consumer_lag{{group=\"{}antifraude\",topic=\"{requested}\"",
            system.topics.args.topic_prefix
        ),
        format!("kafka_consumer_lag{{group=\"{}ledger\"", system.topics.args.topic_prefix),
        format!("kafka_consumer_lag{{group=\"{}transferencias-projecao\"", system.topics.args.topic_prefix),
        format!("kafka_consumer_lag{{group=\"{}notificacoes\"", system.topics.args.topic_prefix),
        format!("dlt_mensagens_total{{topic=\"{requested}-dlt\"}} 1"),
        format!("dlt_mensagens_retidas{{topic=\"{requested}-dlt\"}}"),
        format!("dlt_mensagens_retidas{{topic=\"{settled}-dlt\"}}"),
        format!("retries_total{{topic=\"{settled}\"}}"),
        "transferencias_total{resultado=\"LIQUIDADA\"} 1".to_owned(),
        "http_server_request_duration_seconds_bucket".to_owned(),
        // per consumer group: `pagamentos all` runs them all in one process
        format!(
            "kafka_batch_handling_seconds_bucket{{group=\"{}antifraude\",",
            system.topics.args.topic_prefix
        ),
        format!("kafka_batch_handling_seconds_bucket{{group=\"{}ledger\",", system.topics.args.topic_prefix),
        format!(
            "kafka_batch_handling_seconds_bucket{{group=\"{}transferencias-projecao\",",
            system.topics.args.topic_prefix
        ),
        format!(
            "kafka_batch_handling_seconds_bucket{{group=\"{}notificacoes\",",
            system.topics.args.topic_prefix
        ),
        format!(
            "kafka_batch_handling_seconds_bucket{{group=\"{}notificacoes-retry-1000\",",
            system.topics.args.topic_prefix
        ),
        "antifraud_transaction_seconds_bucket".to_owned(),
        "ledger_settlement_seconds_bucket".to_owned(),
        "outbox_delivery_seconds_bucket".to_owned(),
        "notifications_webhook_seconds_bucket".to_owned(),
    ];
    let url = format!("http://127.0.0.1:{}/metrics", system.ports[0]);
    let missing = testkit::eventually("every contract metric", testkit::PATIENCE, || async {
        let text = system.http.get(&url).send().await.ok()?.text().await.ok()?;
        let missing: Vec<&String> = expected.iter().filter(|name| !text.contains(name.as_str())).collect();
        missing.is_empty().then_some(missing)
    })
    .await;
    assert!(missing.is_empty());
    for port in &system.ports[1..] {
        let text = system
            .http
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        assert!(text.contains("kafka_consumer_lag"), "port {port} serves the metrics");
    }
    assert!(!receiver.calls().is_empty());
    assert!(terminate(&mut all).await.success());
}
