//! `pagamentos loadgen` against the real system: the contract's JSON as the last line, every
//! accepted transfer followed to its final status, latency counted from when a request was
//! due (a stall shows), `lost` and exit 1 when transfers never finish, clear errors on bad
//! input.

use crate::common;

use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;

use common::system::System;

fn loadgen(system: &System, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pagamentos"));
    command
        .arg("loadgen")
        .args(args)
        .env("KAFKA_BOOTSTRAP_SERVERS", &system.topics.args.bootstrap_servers)
        .env("PAGAMENTOS_TOPIC_PREFIX", &system.topics.args.topic_prefix)
        .env("LOADGEN_TRANSFERENCIAS_URL", format!("http://127.0.0.1:{}", system.ports[0]))
        .env("LOADGEN_LEDGER_URL", format!("http://127.0.0.1:{}", system.ports[1]))
        .env("PAGAMENTOS_API_TOKEN", common::API_TOKEN)
        .env("PAGAMENTOS_ADMIN_TOKEN", common::ADMIN_TOKEN)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// The last stdout line as JSON.
fn report(output: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|error| {
        panic!(
            "last line {last:?} is not JSON ({error}); stderr:\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn count(report: &Value, key: &str) -> u64 {
    report[key].as_u64().unwrap_or_else(|| panic!("{key} missing in {report}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_transfer_is_followed_to_its_final_status_and_reported_as_the_contract_says() {
    let system = System::new().await;
    let _all = system.start().await;
    let output =
        loadgen(&system, &["--rate", "50", "--duration", "3", "--accounts", "10", "--skew", "zipf:1.2"])
            .output()
            .await
            .expect("run loadgen");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "exit {:?}\n{stderr}", output.status);
    let report = report(&output);
    let mut keys: Vec<&str> = report.as_object().expect("object").keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["accepted", "latency_ms", "lost", "rejected", "sent", "settled", "throughput_per_s"]);
    // in the contract's order on the wire
    assert!(String::from_utf8_lossy(&output.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .starts_with(r#"{"sent":150,"accepted":150,"settled":"#));
    assert_eq!(count(&report, "sent"), 150, "{report}");
    assert_eq!(count(&report, "accepted"), 150, "{report}");
    assert_eq!(count(&report, "settled") + count(&report, "rejected"), 150, "{report}");
    assert_eq!(count(&report, "lost"), 0, "{report}");
    let latency = &report["latency_ms"];
    let (p50, p99, max) = (
        latency["p50"].as_f64().expect("p50"),
        latency["p99"].as_f64().expect("p99"),
        latency["max"].as_f64().expect("max"),
    );
    assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{latency}");
    assert!(report["throughput_per_s"].as_f64().expect("throughput") > 0.0);
    assert!(stderr.contains("loadgen:") && stderr.contains("sent 150"), "{stderr}");
    // the transfers really are in the system, final; and so is the probe sent before the load
    // (one cent between the first two accounts), which the report does not count
    let (code, verify) = system.verify().await;
    assert_eq!(code, 0, "{verify}");
    let one_cent: i64 = sqlx::query_scalar("SELECT count(*) FROM transferencia WHERE valor_centavos = 1")
        .fetch_one(&system.transfers_db.pool)
        .await
        .expect("count probes");
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM transferencia")
        .fetch_one(&system.transfers_db.pool)
        .await
        .expect("count transfers");
    assert!(one_cent >= 1, "the probe transfer");
    assert_eq!(total, 151, "150 counted and the probe");
}

/// Open loop: while the system is frozen, requests stay due; their latency counts from then, and
/// the schedule does not slow down to hide it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_is_counted_from_when_requests_were_due() {
    let system = System::new().await;
    let all = system.start().await;
    let pid = all.id().expect("pid").to_string();
    let run = loadgen(&system, &["--rate", "40", "--duration", "4", "--accounts", "10"])
        .spawn()
        .expect("start loadgen");
    // freeze it once load is flowing (a slow machine may take a while to start loadgen)
    testkit::eventually("loadgen's first transfers", testkit::PATIENCE, || async {
        let accepted: i64 = sqlx::query_scalar("SELECT count(*) FROM transferencia")
            .fetch_one(&system.transfers_db.pool)
            .await
            .expect("count transfers");
        (accepted >= 20).then_some(())
    })
    .await;
    assert!(Command::new("kill").args(["-STOP", &pid]).status().await.expect("kill -STOP").success());
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert!(Command::new("kill").args(["-CONT", &pid]).status().await.expect("kill -CONT").success());
    let output = run.wait_with_output().await.expect("loadgen");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report = report(&output);
    // every request was sent on schedule, frozen or not
    assert_eq!(count(&report, "sent"), 160, "{report}");
    assert_eq!(count(&report, "lost"), 0, "{report}");
    let max = report["latency_ms"]["max"].as_f64().expect("max");
    assert!(max >= 1_100.0, "a 1.2 s freeze must show in the latency: {report}");
    drop(all);
}

/// Without antifraud nothing is analysed, so nothing settles: every accepted transfer is lost,
/// and loadgen says so and exits 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_that_never_finish_are_reported_lost() {
    let system = System::new().await;
    let mut transfers = common::service(&system.topics, "transferencias");
    system.env(&mut transfers);
    let _transfers = transfers.spawn().expect("start transferencias");
    let mut ledger = common::service(&system.topics, "ledger");
    system.env(&mut ledger);
    let _ledger = ledger.spawn().expect("start ledger");
    for port in &system.ports[..2] {
        let url = format!("http://127.0.0.1:{port}/readyz");
        testkit::eventually(&format!("{url} ready"), testkit::PATIENCE, || async {
            system.http.get(&url).send().await.ok()?.status().is_success().then_some(())
        })
        .await;
    }
    let output =
        loadgen(&system, &["--rate", "20", "--duration", "1", "--accounts", "4", "--drain-timeout", "2"])
            .output()
            .await
            .expect("run loadgen");
    assert_eq!(output.status.code(), Some(1));
    let report = report(&output);
    assert_eq!(count(&report, "accepted"), 20, "{report}");
    assert_eq!(count(&report, "lost"), 20, "{report}");
    assert_eq!(count(&report, "settled") + count(&report, "rejected"), 0, "{report}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("LOST 20"), "{stderr}");
    // the probe could not finish either: said, and the load went on
    assert!(stderr.contains("was not final within 2 s; sending anyway"), "{stderr}");
}

#[tokio::test]
async fn bad_arguments_and_an_unreachable_api_get_clear_errors() {
    let system = System::new().await;
    for (args, expected) in [
        (vec!["--skew", "zipf:x"], "zipf exponent"),
        (vec!["--skew", "pareto"], "is not `uniform`, `zipf:S`, `hot-credit` or `hot-debit`"),
        (vec!["--accounts", "1"], "--accounts"),
        (vec!["--duration", "0"], "--duration"),
        (vec!["--transferencias-url", "localhost:8080"], "must be an http"),
    ] {
        let output = loadgen(&system, &args).output().await.expect("run");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    // the hot-debit account opens with everyone's money: a product past i64 is refused up front
    let huge = (i64::MAX / 10).to_string();
    let output =
        loadgen(&system, &["--skew", "hot-debit", "--accounts", "1000", "--opening-balance-cents", &huge])
            .output()
            .await
            .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--opening-balance-cents × --accounts"), "{stderr}");
    let output = loadgen(&system, &["--transferencias-url", "http://127.0.0.1:1", "--duration", "1"])
        .output()
        .await
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("could not reach http://127.0.0.1:1/readyz"), "{stderr}");
    assert!(output.stdout.is_empty());
}
