//! pagamentos' integration tests, one binary (`--test integration`): each file a module, so a test
//! is named `<file>::<test>` (what `.config/nextest.toml`'s groups and `scripts/test`'s filters
//! select by); `common` holds what they share, the chaos harness included.

mod antifraud_crash;
mod api_clients;
mod chaos;
mod cli;
mod common;
mod database_faults;
mod database_roles;
mod deploy;
mod health;
mod kafka_security;
mod ledger_crash;
mod loadgen;
mod loss_diagnosis;
mod notifications;
mod partition;
mod postgres_tls;
mod prometheus;
mod republish;
mod request_timeout;
mod run_script;
mod schemathesis;
mod secrets;
mod share_group_faults;
mod spring_headers;
mod supervision;
mod system;
mod transport;
mod verify;
