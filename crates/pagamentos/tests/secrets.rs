//! Secrets never reach the logs: `pagamentos all` at `RUST_LOG=debug`, given both bearer
//! tokens, a webhook secret and a webhook URL with credentials and a query token, moves a
//! transfer end to end (API, antifraude, ledger, webhook delivered), and its whole log is then
//! searched for every one of them.

use crate::common;

use std::process::Stdio;

use common::system::System;
use testkit::webhook::Receiver;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_given_to_a_service_appears_in_its_debug_log() {
    let system = System::new().await;
    let (receiver, url) = Receiver::start().await;
    let url_password = testkit::unique("url-password");
    let url_token = testkit::unique("query-token");
    let webhook_url = url.replacen("http://", &format!("http://hook-user:{url_password}@"), 1)
        + &format!("?token={url_token}");
    let log_path = std::env::temp_dir().join(format!("{}.log", testkit::unique("secrets")));
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut all = system
        .start_configured(|command| {
            command
                .env("RUST_LOG", "debug")
                .env("NOTIFICACOES_WEBHOOK_URL", &webhook_url)
                .stderr(Stdio::from(log));
        })
        .await;

    system.open_account("SECRET-A", 10_000).await;
    system.open_account("SECRET-B", 0).await;
    let id = system.transfer("SECRET-A", "SECRET-B", 2_500).await.expect("accepted");
    assert_eq!(system.final_status(&id).await.0, "LIQUIDADA");
    testkit::eventually("the webhook delivered", testkit::PATIENCE, || async {
        (!receiver.calls().is_empty()).then_some(())
    })
    .await;
    all.kill().await.expect("stop pagamentos all");

    let text = std::fs::read_to_string(&log_path).expect("read the log");
    let _ = std::fs::remove_file(&log_path);
    assert!(text.contains("pagamentos all started"), "the log was captured: {} bytes", text.len());
    assert!(text.contains("(credentials and query hidden)"), "the webhook's address is logged, redacted");
    for secret in [common::API_TOKEN, common::ADMIN_TOKEN, common::WEBHOOK_SECRET, &url_password, &url_token]
    {
        let lines: Vec<&str> = text.lines().filter(|line| line.contains(secret)).take(3).collect();
        assert!(lines.is_empty(), "{secret} is in the log:\n{}", lines.join("\n"));
    }
}
