//! The ledger crate's integration tests, one binary (`--test integration`): each file a module, so
//! a test is named `<file>::<test>` (what `.config/nextest.toml`'s groups and `scripts/test`'s
//! filters select by).

mod api;
mod common;
mod hostile_records;
mod model;
mod readiness;
mod republish;
mod retries;
mod settlement;
mod verify;
