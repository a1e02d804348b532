//! The loop's own bookkeeping on the in-memory broker: the metrics it labels, what an idle
//! store may store, a refused rebalance, and the invariants `steps` asserts.

use super::*;
use crate::consumer::batch::Batch;
use crate::consumer::steps::Steps;
use crate::consumer::stored::StoredOffsets;

/// `pagamentos all` runs several consumers in one process: each batch's handling time is
/// labelled with its group, so they can be told apart (the benchmark splits its hops so).
#[test]
fn batch_handling_time_is_labelled_with_the_group() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let broker = Broker::default();
            broker.produce(0, "due=0");
            broker.produce(1, "due=0");
            let running = Running::start(broker);
            running.at(0).await;
            assert_eq!(running.handled().len(), 2);
            running.stop().await;
        })
    });
    let text = handle.render();
    let count = text
        .lines()
        .find_map(|line| line.strip_prefix("kafka_batch_handling_seconds_count{group=\"loop-tests\"} "))
        .unwrap_or_else(|| panic!("no batch handling time of the group in:\n{text}"));
    assert_ne!(count, "0", "{text}");
}

/// Fails its first batch as a whole (the database away), then calls every record done.
struct FailsOnce {
    failed: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("unavailable")]
struct Unavailable;

impl Handler for FailsOnce {
    type Error = Unavailable;

    async fn handle(&mut self, batch: &[OwnedMessage], _retrying: bool) -> Result<Vec<Verdict>, Unavailable> {
        if !self.failed {
            self.failed = true;
            return Err(Unavailable);
        }
        Ok(Verdict::all_done(batch))
    }
}

/// A partition revoked and assigned again at once, while its record waited for a retry: the
/// record is dropped (it is not this member's any more), and until a record of the partition
/// is taken again the consumer's position may still be the old one, past the dropped record.
/// The idle store must not store it: the record would be committed unhandled.
#[tokio::test(start_paused = true)]
async fn an_idle_store_does_not_store_a_position_from_before_a_revocation() {
    let broker = Arc::new(Broker::default());
    broker.lock().revoke_keeps_position = true;
    broker.produce(0, "a");
    broker.produce(1, "b");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (broker, shutdown) = (broker.clone(), shutdown.clone());
        async move {
            let options = LoopOptions { batch_wait_max: Duration::ZERO, ..LoopOptions::default() };
            consume(&*broker, &mut FailsOnce { failed: false }, &options, &shutdown).await
        }
    });
    let start = Instant::now();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // during the 500 ms backoff of the failed batch: partition 0 goes and comes back
    broker.revoke(0);
    broker.assign(0);
    tokio::time::sleep_until(start + Duration::from_secs(3)).await;
    assert_eq!(broker.stored(1), Some(1), "partition 1's record, handled, is stored");
    assert_eq!(broker.stored(0), None, "partition 0's dropped record was stored as handled");
    shutdown.cancel();
    run.await.expect("loop task").expect("loop");
}

/// librdkafka refused to apply a rebalance: the member would wait for ever, so the loop stops
/// with a fatal error (the service exits and comes back as a fresh member).
#[tokio::test(start_paused = true)]
async fn a_refused_rebalance_stops_the_loop() {
    let broker = Broker::default();
    broker.produce(0, "due=0");
    let running = Running::start(broker);
    running.at(100).await;
    assert_eq!(running.handled(), [(0, 0, 0)]);
    running.broker.revocations.refuse("incremental assign refused (test)".into());
    running.at(100).await;
    assert!(running.run.is_finished(), "the loop went on after a refused rebalance");
    let ended = running.run.await.expect("loop task");
    assert!(matches!(ended, Err(Error::Fatal(_))), "{ended:?}");
}

fn offset_list(offset: i64) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    list.add_partition_offset("t", 0, Offset::Offset(offset)).expect("an offset");
    list
}

#[test]
fn a_stored_offset_moves_back_only_after_its_partition_was_revoked() {
    let broker = Broker::default();
    broker.produce(0, "a");
    let mut stored = StoredOffsets::default();
    for offset in [5, 5, 7] {
        stored.store(&broker, &offset_list(offset));
    }
    assert_eq!(broker.stored(0), Some(7));
    // assigned again, the partition is fetched anew from its committed offset
    broker.revoke(0);
    broker.assign(0);
    stored.store(&broker, &offset_list(3));
    assert_eq!(broker.stored(0), Some(3));
}

#[test]
#[should_panic(expected = "stored offset of t/0 moved back from 7 to 6")]
fn a_stored_offset_moving_back_within_an_assignment_is_a_bug() {
    let broker = Broker::default();
    broker.produce(0, "a");
    let mut stored = StoredOffsets::default();
    stored.store(&broker, &offset_list(7));
    stored.store(&broker, &offset_list(6));
}

#[test]
fn a_record_in_the_batch_and_carried_at_once_is_caught_until_its_partition_is_revoked() {
    let broker = Broker::default();
    broker.produce(0, "a");
    let (options, shutdown) = (LoopOptions::default(), CancellationToken::new());
    let mut steps = Steps::new(&broker, &options, &shutdown);
    let record = broker.take().expect("a record");
    let tick = broker.revocations.now();
    let mut batch = Batch::default();
    batch.push((record.clone(), tick));
    assert!(steps.each_record_once(&batch));
    steps.carried.push((record, tick));
    assert!(!steps.each_record_once(&batch), "the same record in the batch and carried");
    // a copy taken before its partition was revoked is no one's: it no longer counts
    broker.revoke(0);
    assert!(steps.each_record_once(&batch));
}
