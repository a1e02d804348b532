//! The wire contract of pagamentos (`docs/reference/contract.md` §3): what travels on Kafka, byte for byte.
//!
//! A service written from the reference article in Java/Spring and ours must be able to replace
//! each other on the same topics, so everything here follows the article's Portuguese wire
//! names exactly while the Rust names stay English.
//!
//! # Layout
//! - [`domain`]: the domain's values: [`Cents`] (checked arithmetic only), [`Amount`] (at
//!   least 1 cent), [`AccountId`], [`Currency`], [`EntryKind`], [`TransferStatus`], [`Outcome`],
//!   and the field rules both APIs apply.
//! - [`events`]: the four event payloads (camelCase JSON, unknown fields ignored).
//! - [`time`]: [`Timestamp`], RFC 3339 UTC with at most microsecond precision.
//! - [`ids`]: Java's `UUID.nameUUIDFromBytes` and the derived event ids built on it.
//! - [`topics`]: topic names, the dead-letter and retry topics derived from them, and the plan of
//!   every topic the system owns.
//! - [`headers`]: header names and Spring Kafka's binary header encodings.
//! - `schema` (feature `openapi`): the values' OpenAPI schemas, from the same rules their
//!   parsers apply, for the APIs' documents.
//!
//! # Architecture invariant
//! This crate knows nothing of Kafka clients, databases or HTTP: it depends on serde and a few
//! value crates only, so every other crate can use it.

#![forbid(unsafe_code)]

pub mod domain;
pub mod events;
pub mod headers;
pub mod ids;
pub mod money;
#[cfg(feature = "openapi")]
pub mod schema;
pub mod time;
pub mod topics;

pub use domain::{AccountId, Amount, Cents, Currency, EntryKind, Outcome, TransferStatus};
pub use events::{
    EventType, MalformedEvent, OutcomeEvent, RejectionReason, TransferAnalysed, TransferRejected,
    TransferRequested, TransferSettled,
};
pub use time::Timestamp;
