//! Both HTTP APIs fuzzed from their own `/openapi.json` by Schemathesis (issue #9): examples,
//! boundary values, random and stateful sequences (open an account, deposit, transfer, read
//! it back) against `pagamentos all` with both bearer tokens set. Every check Schemathesis has
//! must pass (no 5xx, status codes, content types, headers and bodies as documented, requests
//! without the token refused, invalid data refused) but one: `positive_data_acceptance`, which
//! expects every schema-valid request to be accepted, while these APIs rightly refuse some
//! that JSON Schema cannot rule out (a transfer to its own source account, an inactive ISO 4217
//! code, `679.0` cents, an `Idempotency-Key` or `depositoId` reused with another body: 400 or
//! 422 with a problem document). Afterwards the process must still be running and ready, and
//! `pagamentos verify` must find the books balanced after everything the fuzzer paid in.
//!
//! Each API is fuzzed twice: with the admin token (every route, every account) and with an API
//! client's token (`pagamentos clients`, issue #46) bound to `CC-001`, so the client's answers
//! are held to the documents too: a debit from another account `403`, another's transfer or
//! account `404`, the admin routes `403`.
//!
//! Ignored by plain `cargo test`: it needs Schemathesis, which `scripts/test` installs from PyPI
//! (into `~/.cache/pagamentos`) and names in `SCHEMATHESIS`. `PAGAMENTOS_SCHEMATHESIS_SECONDS`
//! (default 40) is each run's time budget (four runs: two APIs, two tokens).

use crate::common;

use std::process::Stdio;

use serde_json::json;
use tokio::process::Command;

use common::system::System;
use common::ADMIN_TOKEN;

/// Runs Schemathesis on the API at `port` with the bearer `token`; its report, and whether it
/// passed.
async fn schemathesis(port: u16, token: &str, seconds: u64) -> (bool, String) {
    let program = std::env::var("SCHEMATHESIS").unwrap_or_else(|_| "schemathesis".into());
    let output = Command::new(&program)
        .args(["run", &format!("http://127.0.0.1:{port}/openapi.json")])
        .args(["--checks", "all", "--exclude-checks", "positive_data_acceptance"])
        // one worker: with two, Hypothesis's lambda-source cache raced ("AST constructor
        // recursion depth mismatch", a runtime error in Schemathesis 4.32.5, not a finding)
        .args(["--max-time", &seconds.to_string(), "--workers", "1"])
        .args(["--header", &format!("Authorization: Bearer {token}")])
        .args(["--request-timeout", "10", "--generation-database", "none"])
        .env("NO_COLOR", "1")
        // it keeps a `.schemathesis` cache in its working directory: not in the work tree
        .current_dir(env!("CARGO_TARGET_TMPDIR"))
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {program}: {e} (scripts/test installs Schemathesis and sets \
                 SCHEMATHESIS; or `pip install schemathesis` and put it on PATH)"
            )
        });
    let report =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    // a runtime error's traceback can quote whole source files: keep the report readable
    let report = report
        .lines()
        .take(400)
        .map(|line| match line.char_indices().nth(300) {
            Some((cut, _)) => format!("{}…", &line[..cut]),
            None => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    (output.status.success(), report)
}

#[tokio::test]
#[ignore = "needs Schemathesis; scripts/test installs it and runs this test"]
async fn both_apis_hold_to_their_openapi_documents_under_schemathesis() {
    let seconds: u64 = std::env::var("PAGAMENTOS_SCHEMATHESIS_SECONDS")
        .ok()
        .map(|s| s.parse().expect("PAGAMENTOS_SCHEMATHESIS_SECONDS: seconds"))
        .unwrap_or(40);
    let system = System::new().await;
    let mut all = system.start().await;
    // the documents' examples name CC-001 and CC-002: with them funded, the fuzzer's transfers
    // can be accepted and settled, not only refused
    for account in ["CC-001", "CC-002"] {
        let response = system
            .http
            .post(system.ledger("/contas"))
            .json(&json!({"id": account, "moeda": "BRL", "saldoInicialCentavos": 1_000_000}))
            .send()
            .await
            .expect("POST /contas");
        assert_eq!(response.status(), 201, "{}", response.text().await.unwrap_or_default());
    }

    // an API client that may debit and read CC-001 only
    let client = system.create_client("schemathesis", "CC-001").await;

    let mut failed = Vec::new();
    for (name, port, token) in [
        ("transferencias", system.ports[0], ADMIN_TOKEN),
        ("ledger", system.ports[1], ADMIN_TOKEN),
        ("transferencias as an API client", system.ports[0], client.as_str()),
        ("ledger as an API client", system.ports[1], client.as_str()),
    ] {
        let (passed, report) = schemathesis(port, token, seconds).await;
        // the summary (test cases, seed) shows in the log either way
        let tail: Vec<&str> = report.lines().rev().take(12).collect();
        println!("schemathesis on {name}:\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
        if !passed {
            failed.push(format!("--- {name} ---\n{report}"));
        }
    }
    assert!(failed.is_empty(), "Schemathesis found problems:\n{}", failed.join("\n"));

    assert!(all.try_wait().expect("status").is_none(), "pagamentos all exited under the fuzzer");
    for port in system.ports {
        let url = format!("http://127.0.0.1:{port}/readyz");
        let response = system.http.get(&url).send().await.expect("readyz");
        assert!(response.status().is_success(), "{url}: {}", response.status());
    }
    // what the fuzzer moved settles, and the books stay balanced
    system.all_decided().await;
    let (code, report) = system.verify().await;
    assert_eq!(code, 0, "pagamentos verify after the fuzzer:\n{report}");
    all.kill().await.expect("stop pagamentos all");
}
