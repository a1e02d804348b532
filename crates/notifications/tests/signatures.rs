//! Webhook signatures checked by someone else's code: the deliveries notificacoes really sends
//! are verified with the Standard Webhooks reference library (`standardwebhooks` from PyPI,
//! which `scripts/test` installs into a virtualenv of its own), which must also refuse the same
//! deliveries with a tampered body, a stale timestamp or another secret.

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use kafka::producer::{OutgoingRecord, Producer};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use contracts::topics;
use testkit::webhook::Receiver;
use testkit::TestTopics;

/// The virtualenv's Python: `STANDARDWEBHOOKS_PYTHON`, else where `scripts/test` installs it.
fn python() -> PathBuf {
    if let Some(path) = std::env::var_os("STANDARDWEBHOOKS_PYTHON") {
        return path.into();
    }
    let cache = std::env::var_os("PAGAMENTOS_CACHE_DIR").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache").join("pagamentos")
    });
    let path = cache.join("standardwebhooks-1.1.0").join("bin").join("python");
    assert!(
        path.exists(),
        "{} not found: scripts/test installs the standardwebhooks virtualenv (or set STANDARDWEBHOOKS_PYTHON)",
        path.display()
    );
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_verify_with_the_standard_webhooks_reference_library() {
    testkit::init_logs();
    let topics = TestTopics::plan(1).await;
    let (receiver, url) = Receiver::start().await;
    let key: Vec<u8> = Uuid::new_v4().as_bytes().iter().chain(Uuid::new_v4().as_bytes()).copied().collect();
    let secret = format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode(key));
    let mut settings =
        notifications::settings_for_tests(topics.args.clone(), url.parse().expect("url"), secret.clone(), 1);
    settings.args.concurrency = 4;
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    notifications::start(
        settings,
        &service::supervisor::Supervisor::from_parts(shutdown.clone(), tracker.clone()),
    )
    .await
    .expect("start");

    let producer = Producer::new(&kafka::config::producer_config(&topics.args, "test", Duration::ZERO))
        .expect("producer");
    let events = [Uuid::new_v4(), Uuid::new_v4()];
    let payloads = [
        json!({"eventoId": events[0], "transferenciaId": Uuid::new_v4(), "liquidadaEm": "2026-12-05T10:00:00Z"}),
        // not ASCII: the signature covers the body's bytes as sent
        json!({"eventoId": events[1], "transferenciaId": Uuid::new_v4(), "motivo": "SALDO_INSUFICIENTE",
            "rejeitadaEm": "2026-12-05T10:00:00Z", "nota": "transferência"}),
    ];
    for (topic, payload) in [topics::SETTLED, topics::REJECTED].into_iter().zip(&payloads) {
        let record = OutgoingRecord::new(topics.topic(topic), "CC-001", payload.to_string());
        producer.send(&record).await.expect("publish");
    }
    let calls = testkit::eventually("both deliveries", Duration::from_secs(60), || async {
        let calls: Vec<_> =
            events.iter().filter_map(|event| receiver.calls_for(event).into_iter().next()).collect();
        (calls.len() == events.len()).then_some(calls)
    })
    .await;
    shutdown.cancel();

    let mut deliveries = Vec::new();
    for (call, event) in calls.iter().zip(events) {
        assert_eq!(
            call.webhook_id.as_deref(),
            Some(event.to_string().as_str()),
            "webhook-id is the event id"
        );
        let body = String::from_utf8(call.body.to_vec()).expect("UTF-8 body");
        assert_eq!(
            call.signature.as_deref(),
            Some(notifications::webhook::signature(&secret, body.as_bytes()).as_str()),
            "X-Signature stays for receivers written before Standard Webhooks"
        );
        let header =
            |value: &Option<String>, name: &str| value.clone().unwrap_or_else(|| panic!("{name} missing"));
        deliveries.push(json!({
            "headers": {
                "webhook-id": header(&call.webhook_id, "webhook-id"),
                "webhook-timestamp": header(&call.webhook_timestamp, "webhook-timestamp"),
                "webhook-signature": header(&call.webhook_signature, "webhook-signature"),
            },
            "body": body,
        }));
    }
    let file = std::env::temp_dir().join(format!("{}.json", testkit::unique("webhooks")));
    std::fs::write(&file, serde_json::to_vec(&deliveries).expect("json")).expect("write deliveries");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/verify_webhooks.py");
    let output = tokio::process::Command::new(python())
        .arg(&script)
        .arg(&file)
        .arg(&secret)
        .output()
        .await
        .expect("run the verifier");
    let _ = std::fs::remove_file(&file);
    let report =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "the reference library refused our webhooks:\n{report}");
    assert!(report.contains("2 deliveries, 0 failures"), "{report}");
    tracker.close();
    tokio::time::timeout(Duration::from_secs(30), tracker.wait()).await.expect("drained");
}
