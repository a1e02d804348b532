//! Unit tests of the share-group mode: retry spacing, the members gauge, fatal errors.

use std::sync::Arc;
use std::time::Duration;

use krafka::{KrafkaError, ProtocolErrorKind};

use kafka::producer::Producer;
use kafka::KafkaArgs;

use super::error::is_fatal;
use super::*;
use crate::notifier::Notifier;

#[test]
fn retries_are_spaced_as_the_contract_chain() {
    let shared = Shared {
        kafka: KafkaArgs::new("127.0.0.1:1"),
        group: GROUP.into(),
        topics: Vec::new(),
        notifier: Arc::new(Notifier::new(None, "t".into())),
        producer: Producer::new(&kafka::config::producer_config(
            &KafkaArgs::new("127.0.0.1:1"),
            "test",
            Duration::ZERO,
        ))
        .expect("producer"),
        chain: crate::chain(),
        assigned: Members::new(GROUP),
    };
    assert_eq!(shared.chain.attempts(), 4);
    let delays: Vec<u64> = (1..=5).map(|delivery| shared.delay_after(delivery).as_millis() as u64).collect();
    assert_eq!(delays, [1000, 2000, 4000, 4000, 4000]);
}

/// Tests run many services in one process, and the test of two instances two in one
/// group: each group counts its own members, summed over the services that have them.
#[test]
fn members_with_partitions_are_counted_per_group_over_the_process() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        let (one, other, second) = (Members::new("g-one"), Members::new("g-other"), Members::new("g-one"));
        one.update(false, true);
        one.update(false, true);
        let fresh = Members::new("g-other"); // a service starting later counts from its own 0
        other.update(false, true);
        second.update(false, true);
        one.update(true, false);
        one.update(true, true); // no change
        drop(fresh);
    });
    let text = handle.render();
    for expected in [
        "notifications_members_with_partitions{group=\"g-one\"} 2\n",
        "notifications_members_with_partitions{group=\"g-other\"} 1\n",
    ] {
        assert!(text.contains(expected), "{expected} missing from:\n{text}");
    }
}

#[test]
fn only_what_no_retry_fixes_is_fatal() {
    assert!(is_fatal(&KrafkaError::config("bad")));
    assert!(is_fatal(&KrafkaError::protocol_kind(ProtocolErrorKind::UnknownApiVersion, "no share groups")));
    assert!(is_fatal(&KrafkaError::broker(krafka::error::ErrorCode::GroupAuthorizationFailed, "acl")));
    assert!(!is_fatal(&KrafkaError::timeout("poll")));
    assert!(!is_fatal(&KrafkaError::broker(krafka::error::ErrorCode::CoordinatorNotAvailable, "moving")));
    assert!(!is_fatal(&KrafkaError::network(std::io::Error::other("refused"))));
}
