//! Recovery of a client that librdkafka has left with no broker to ask.
//!
//! librdkafka 2.12 drops every broker that a Metadata answer leaves out, the configured
//! bootstrap servers included (`rd_kafka_metadata_decommission_unavailable_brokers`). A cluster
//! whose last node is shutting down answers for a few milliseconds with no broker at all (a
//! one-node cluster in controlled shutdown does, docs/stack.md); a client that asks then keeps
//! only its logical brokers (group and transaction coordinators). Its own re-bootstrap
//! (`metadata.recovery.rebootstrap.trigger.ms`) cannot help: the timer starts when a Metadata
//! request is sent, which needs a broker. Such a client is stranded for good: a producer fails
//! every send with a transport error, a consumer keeps its assignment and fetches nothing.
//!
//! Every client's statistics (`statistics.interval.ms`) list its brokers with their `source`.
//! When none is `configured` or `learned`, [`Rebootstrap::check`] adds the bootstrap servers
//! again (`rd_kafka_brokers_add`, what librdkafka's own re-bootstrap does): the client connects,
//! asks for metadata, learns the cluster's brokers and carries on where it stopped. Counted in
//! `kafka_client_rebootstrap_total{client}`.

use std::ffi::CString;
use std::sync::OnceLock;

use rdkafka::types::RDKafka;
use serde::Deserialize;

/// A client's handle on itself, set once right after the client is created
/// ([`crate::context::create`]).
#[derive(Debug, Default)]
pub(crate) struct Rebootstrap {
    bound: OnceLock<Bound>,
}

#[derive(Debug)]
struct Bound {
    /// The client's `rd_kafka_t`, as an address: only dereferenced by librdkafka, from
    /// [`Rebootstrap::check`], which runs inside that client's own poll.
    client: usize,
    client_id: String,
    bootstrap: CString,
}

/// The part of librdkafka's statistics this module reads.
#[derive(Debug, Deserialize)]
struct Statistics {
    #[serde(default)]
    brokers: std::collections::HashMap<String, Broker>,
}

#[derive(Debug, Deserialize)]
struct Broker {
    /// `configured` (a bootstrap server), `learned` (from metadata), `logical` (a coordinator
    /// connection) or `internal`.
    source: String,
}

/// Whether statistics `json` show a client with no broker it could ask for metadata. `None`
/// when they cannot be read.
pub(crate) fn stranded(json: &[u8]) -> Option<bool> {
    let statistics: Statistics = serde_json::from_slice(json).ok()?;
    Some(
        !statistics.brokers.values().any(|broker| matches!(broker.source.as_str(), "configured" | "learned")),
    )
}

impl Rebootstrap {
    /// Whether [`bind`](Self::bind) has bound this to a client.
    #[cfg(test)]
    pub(crate) fn is_bound(&self) -> bool {
        self.bound.get().is_some()
    }

    /// Binds to `client`, the client whose context holds this. Without bootstrap servers there
    /// is nothing to add again, and librdkafka already warns that the client cannot connect.
    pub(crate) fn bind(&self, client: *mut RDKafka, client_id: &str, bootstrap: &str) {
        if bootstrap.trim().is_empty() {
            return;
        }
        let Ok(bootstrap) = CString::new(bootstrap) else {
            return; // a NUL in the server list: librdkafka would have refused the config already
        };
        let bound = Bound { client: client as usize, client_id: client_id.to_owned(), bootstrap };
        if self.bound.set(bound).is_err() {
            tracing::error!(
                client_id,
                "a client context was bound twice: re-bootstrap left to the first client"
            );
        }
    }

    /// Reads a client's statistics; adds its bootstrap servers again if it has no broker left.
    /// Called by librdkafka's statistics callback, inside a poll of the client this context
    /// belongs to.
    pub(crate) fn check(&self, json: &[u8]) {
        let Some(bound) = self.bound.get() else {
            return;
        };
        match stranded(json) {
            Some(true) => {}
            Some(false) => return,
            None => {
                tracing::debug!(client_id = bound.client_id, "librdkafka statistics not readable");
                return;
            }
        }
        // SAFETY: `bound.client` is the `rd_kafka_t` of the client that owns this context:
        // `context::create` binds a fresh context to the client it was just given to, a context
        // is bound once, and a clone of a context is never bound (`Context`'s `Clone`). This runs
        // in that client's statistics callback, during its own poll, so the client is alive and
        // not being destroyed. `rd_kafka_brokers_add` may be called from any thread at any time
        // (it takes the client's lock) and copies the NUL-terminated list it is given. (The
        // module is allowed `unsafe` for this call alone, in `lib.rs`.)
        let added = unsafe {
            rdkafka::bindings::rd_kafka_brokers_add(bound.client as *mut RDKafka, bound.bootstrap.as_ptr())
        };
        tracing::warn!(
            client_id = bound.client_id,
            bootstrap = ?bound.bootstrap,
            added,
            "kafka client had no broker left (a Metadata answer named none): bootstrap servers added again"
        );
        metrics::counter!("kafka_client_rebootstrap_total", "client" => bound.client_id.clone()).increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_with_only_logical_brokers_is_stranded() {
        let stranded_consumer = br#"{"name":"c#consumer-1","type":"consumer","brokers":{
            "GroupCoordinator":{"name":"GroupCoordinator","nodeid":-1,"source":"logical","state":"UP"}
        },"topics":{}}"#;
        assert_eq!(stranded(stranded_consumer), Some(true));
        assert_eq!(stranded(br#"{"name":"p","brokers":{}}"#), Some(true), "a producer with no broker");
        assert_eq!(stranded(br#"{"name":"p"}"#), Some(true), "no broker list at all");
    }

    #[test]
    fn a_client_with_a_configured_or_learned_broker_is_not_stranded() {
        let learned = br#"{"brokers":{
            "GroupCoordinator":{"source":"logical","state":"UP"},
            "127.0.0.1:9092/1":{"source":"learned","state":"DOWN","nodeid":1}
        }}"#;
        assert_eq!(stranded(learned), Some(false), "a learned broker that is down still reconnects");
        let bootstrapping =
            br#"{"brokers":{"127.0.0.1:9092/bootstrap":{"source":"configured","state":"INIT"}}}"#;
        assert_eq!(stranded(bootstrapping), Some(false));
    }

    #[test]
    fn unreadable_statistics_are_not_taken_for_a_stranded_client() {
        assert_eq!(stranded(b"not json"), None);
    }
}
