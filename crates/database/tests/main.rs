//! The database crate's integration tests, one binary (`--test integration`): each file a module,
//! so a test is named `<file>::<test>` (what `.config/nextest.toml`'s groups and `scripts/test`'s
//! filters select by).

mod session;
