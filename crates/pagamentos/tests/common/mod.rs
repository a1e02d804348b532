//! What the tests that run the real binary share.

pub mod chaos;
pub mod system;

use std::process::Stdio;

use tokio::process::Command;

use testkit::TestTopics;

/// The bearer tokens every service the tests start is given (auth fails closed: a service with
/// an API refuses to start without both).
pub const API_TOKEN: &str = "test-api-token";
pub const ADMIN_TOKEN: &str = "test-admin-token";
/// The key notificacoes signs its webhooks with (it refuses to start without one).
pub const WEBHOOK_SECRET: &str = "test-webhook-secret";

/// `pagamentos <subcommand>` on the test's topics (3 partitions) and group protocol, with the
/// test tokens and webhook secret, fewer than 3 replicas allowed, killed when dropped; the
/// caller adds the service's own settings and spawns it. Its warnings and errors are appended
/// to `<CARGO_TARGET_TMPDIR>/<topic prefix><subcommand>.log` (the prefix is in the test's
/// failure messages): a failed test leaves what the service said.
pub fn service(topics: &TestTopics, subcommand: &str) -> Command {
    let log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{}{}.log",
        topics.args.topic_prefix,
        subcommand.replace(' ', "-")
    ));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .unwrap_or_else(|error| panic!("service log {}: {error}", log.display()));
    let mut command = Command::new(env!("CARGO_BIN_EXE_pagamentos"));
    command
        .arg(subcommand)
        .env("KAFKA_BOOTSTRAP_SERVERS", &topics.args.bootstrap_servers)
        .env("KAFKA_GROUP_PROTOCOL", topics.args.group_protocol.to_string())
        .env("PAGAMENTOS_TOPIC_PREFIX", &topics.args.topic_prefix)
        .env("APP_KAFKA_PARTITIONS", "3")
        // the tests' topics have the replicas the test chose, 1 on the local stack
        .env("PAGAMENTOS_ALLOW_UNDER_REPLICATED", "true")
        .env("PAGAMENTOS_API_TOKEN", API_TOKEN)
        .env("PAGAMENTOS_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("NOTIFICACOES_WEBHOOK_SECRET", WEBHOOK_SECRET)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true);
    // the chaos suite's cluster in network namespaces (10.202.n.2) is on this machine but not
    // on loopback: its plaintext brokers need the opt-in (docs/reference/contract.md §1, tests/transport.rs)
    let security = topics.args.security.protocol;
    if !kafka::config::plaintext_off_machine(&topics.args.bootstrap_servers, security).is_empty() {
        command.env("PAGAMENTOS_INSECURE_TRANSPORT", "true");
    }
    command
}
