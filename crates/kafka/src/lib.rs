//! Kafka runtime of pagamentos, over `rdkafka` (librdkafka).
//!
//! Every service talks to Kafka through this crate, so the contract's client settings
//! (`docs/reference/contract.md` §3, *Producers* and *Consumers*) are decided once, here.
//!
//! # Layout
//! - [`config`]: connection settings (`KafkaArgs`, flags with env fallbacks) and the client
//!   configurations for producers, transactional producers, consumers and the admin client.
//! - [`context`]: librdkafka's own log lines routed to `tracing`; [`context::create`] makes
//!   every client, watched for a client left with no broker (`rebootstrap`).
//! - [`producer`]: the idempotent `acks=all` producer and [`producer::OutgoingRecord`].
//! - [`delivery`]: the librdkafka producer under both producers, its delivery reports served
//!   by a thread that sleeps until there is one.
//! - [`transactional`]: the transactional producer, its blocking calls kept off the runtime.
//! - [`consumer`]: the one consumer loop: batches to a handler, a verdict per record, offsets
//!   stored only after the work (and any forward or dead letter) is durable, blocking retries
//!   with backoff, records held until due with only their partition paused, graceful shutdown.
//! - [`exactly_once`]: consume, transform and produce in one Kafka transaction per batch,
//!   the canonical way: on any failure or rebalance every record in hand is discarded and the
//!   partitions rewound to the group's committed offsets; behind a seam over the client.
//! - [`dead_letter`]: dead letters with Spring Kafka's `kafka_dlt-*` headers.
//! - [`retry_topic`]: non-blocking retries through retry topics (Spring's `retry_topic-*` and
//!   `kafka_original-*` headers), waiting by pausing only the partition of a record not due.
//! - [`trace`]: W3C trace context to and from record headers.
//! - [`metadata`]: the partitions of a topic, for clients that assign themselves.
//! - [`health`]: Kafka readiness for `/readyz`.
//! - [`lag`]: `kafka_consumer_lag` per group and partition.
//! - [`alerting`]: the counters alerts read (`retries_total`, `dlt_mensagens_total`), at 0
//!   from the start.
//!
//! - `ffi` and `rebootstrap` (private): the calls into librdkafka that rdkafka does not wrap,
//!   the only `unsafe` code of the workspace (denied at this crate's root, allowed on these two
//!   modules alone, forbidden in every other crate), each block with the invariant it relies
//!   on.
//!
//! Operators' tooling (creating the topics, listing and replaying dead letters) is
//! `kafka-admin`'s, built on this crate.
//!
//! # Architecture invariant
//! Knows no service and no database. Handlers decide what a record means; this crate only
//! decides when an offset may move: never before the handler said the work is durable.

#![deny(unsafe_code)]

pub mod alerting;
pub mod config;
pub mod consumer;
pub mod context;
pub mod dead_letter;
pub mod delivery;
pub mod error;
pub mod exactly_once;
// queue and event handles, the producer's wake-up callback: invariants in the module's docs
#[allow(unsafe_code)]
mod ffi;
pub mod health;
pub mod lag;
pub mod metadata;
pub mod producer;
// one call, `rd_kafka_brokers_add`, on the client a context is bound to
#[allow(unsafe_code)]
mod rebootstrap;
pub mod retry_topic;
pub mod trace;
pub mod transactional;

pub use config::{
    GroupProtocol, KafkaArgs, KafkaSecurity, Profile, SaslMechanism, SecurityProtocol, TopicArgs,
};
pub use error::Error;
pub use rdkafka;
