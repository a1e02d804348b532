//! The secure broker of `scripts/stack secure up`: SASL_SSL with SCRAM-SHA-512, its own CA, one
//! user per service and least-privilege ACLs. Tests that use it are `#[ignore]`d (the plain
//! stack does not run it) and `scripts/test` runs them after `scripts/stack secure up`; without
//! the secure broker they fail, saying how to start it.
//!
//! Its state (CA, passwords) is read from `.stack/kafka-secure` of this checkout (or of
//! `PAGAMENTOS_STACK_DIR`), its address from `KAFKA_SECURE_BOOTSTRAP_SERVERS` (default
//! `127.0.0.1:9392`, the script's `KAFKA_SECURE_PORT`).

use std::path::PathBuf;

use kafka::{KafkaArgs, KafkaSecurity};

/// The super user: the broker's own, and the tests' for creating and deleting topics.
pub const SUPER_USER: &str = "kafka-admin";

/// Where `scripts/stack secure up` keeps the secure broker's state.
pub fn state_dir() -> PathBuf {
    let stack = match std::env::var_os("PAGAMENTOS_STACK_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let package =
                std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR (run under cargo test)");
            PathBuf::from(package).join("../../.stack")
        }
    };
    stack.join("kafka-secure")
}

/// The secure broker's address.
pub fn bootstrap_servers() -> String {
    std::env::var("KAFKA_SECURE_BOOTSTRAP_SERVERS").unwrap_or_else(|_| "127.0.0.1:9392".into())
}

/// The PEM file of the CA that signed the secure broker's certificate.
pub fn ca_location() -> PathBuf {
    state_dir().join("tls/ca.pem")
}

/// The SCRAM password of `user` (`transferencias`, `antifraude`, `ledger`, `notificacoes`,
/// `operador` or [`SUPER_USER`]).
pub fn password(user: &str) -> String {
    let path = state_dir().join("users").join(format!("{user}.password"));
    match std::fs::read_to_string(&path) {
        Ok(password) => password.trim().to_owned(),
        Err(error) => panic!(
            "no password for {user} at {} ({error}): start the secure broker with `scripts/stack secure up`",
            path.display()
        ),
    }
}

/// SASL_SSL as `user`, trusting the stack's CA.
pub fn security(user: &str) -> KafkaSecurity {
    KafkaSecurity::sasl_ssl(user, password(user), ca_location())
}

/// Connection settings of `user` on the secure broker (group protocol as [`crate::kafka_args`]).
pub fn args(user: &str) -> KafkaArgs {
    let mut args = crate::kafka_args();
    args.bootstrap_servers = bootstrap_servers();
    args.security = security(user);
    args
}

/// Grants every service its ACLs for the topics, groups and transactional ids behind `prefix`
/// (`scripts/stack secure acls PREFIX`): the production ACLs, moved to the test's names.
pub async fn grant(prefix: &str) {
    crate::stack(&["secure", "acls", prefix]).await;
}

/// The contract's topic plan behind a fresh prefix on the secure broker, created by the super
/// user (deleted by it on drop), and the services' ACLs for that prefix.
pub async fn topics(partitions: i32) -> crate::TestTopics {
    let topics = crate::TestTopics::plan_on(args(SUPER_USER), partitions, 1).await;
    grant(&topics.args.topic_prefix).await;
    topics
}
