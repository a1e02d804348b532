//! The transfers crate's integration tests, one binary (`--test integration`): each file a module,
//! so a test is named `<file>::<test>` (what `.config/nextest.toml`'s groups and `scripts/test`'s
//! filters select by).

mod api;
mod broker_outage;
mod common;
mod hostile_http;
mod outbox_order;
mod outcome_unknown;
mod projection;
mod unknown_status;
mod writer;
