//! The exactly-once hop: a batch of `TransferenciaSolicitada` records becomes, in one Kafka
//! transaction, one `TransferenciaAnalisada` or `TransferenciaRejeitada(BLOQUEADA_ANTIFRAUDE)`
//! per record (a dead letter for a record that is not a valid event) plus the consumed offsets.
//! `read_committed` readers see all of it or none of it.
//!
//! On any error the transaction is aborted and the batch retried in place by the consumer loop
//! (its position stays past the batch; the in-memory records are produced again with the same
//! derived ids). Before a retry the producer is registered anew and the group's committed
//! offsets are read, so records whose transaction did commit after all (a lost commit answer)
//! are not produced twice. Records of partitions revoked since they were received (a member
//! fenced while paused learns of it only when it polls) are dropped by the consumer loop before
//! every attempt, and those of partitions this instance no longer owns by the handler: their new
//! owner processes them from the last committed offset. A fatal producer error
//! (fenced by a newer instance with the same `transactional.id`) recreates the producer.

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka::consumer::{next_offsets, Handler, KafkaConsumer, Verdict};
use kafka::dead_letter::{dead_letter, Failure};
use kafka::producer::OutgoingRecord;
use kafka::rdkafka::consumer::Consumer;
use kafka::rdkafka::message::{Message, OwnedMessage};
use kafka::rdkafka::ClientConfig;
use kafka::transactional::TransactionalProducer;

use contracts::headers::{EVENT_ID, EVENT_TYPE};
use contracts::ids::{derived_event_id, ANALYSED_PREFIX, REJECTED_BY_ANTIFRAUD_PREFIX};
use contracts::{
    EventType, RejectionReason, Timestamp, TransferAnalysed, TransferRejected, TransferRequested,
};

use crate::scoring::Scorer;

/// The `kafka_dlt-exception-fqcn` of a record that is not a valid `TransferenciaSolicitada`:
/// [`MalformedEvent`]'s type path (a unit test holds them equal).
pub const MALFORMED_EVENT: &str = "antifraud::analysis::MalformedEvent";

/// A record that is not a valid `TransferenciaSolicitada`.
#[derive(Debug, thiserror::Error)]
pub enum MalformedEvent {
    #[error("not a valid TransferenciaSolicitada")]
    Json(#[source] serde_json::Error),
    #[error("not a valid TransferenciaSolicitada: valorEmCentavos must be greater than 0, got {0}")]
    Amount(i64),
}

impl MalformedEvent {
    /// `kafka_dlt-exception-cause-fqcn`: the underlying error's type, or this type where
    /// there is none.
    pub fn cause_fqcn(&self) -> &'static str {
        match self {
            Self::Json(_) => std::any::type_name::<serde_json::Error>(),
            Self::Amount(_) => std::any::type_name::<Self>(),
        }
    }
}

/// Why a batch is retried.
#[derive(Debug, thiserror::Error)]
pub enum AnalysisError {
    #[error(transparent)]
    Kafka(#[from] kafka::Error),
    #[error("the consumer has no group metadata (not in a group yet)")]
    NoGroupMetadata,
    #[error("an output event could not be encoded")]
    Encode(#[source] serde_json::Error),
}

/// Output topics, behind the configured prefix.
#[derive(Debug, Clone)]
pub struct Topics {
    pub analysed: String,
    pub rejected: String,
}

/// The batch handler.
pub struct Analyser {
    consumer: Arc<KafkaConsumer>,
    producer_config: ClientConfig,
    producer: Option<TransactionalProducer>,
    /// The last attempt failed: its transaction may still have committed (a commit whose
    /// answer was lost), so the retry first learns what really is committed.
    retrying: bool,
    /// Per input partition, the offset the last attempt sent in its transaction (none if it
    /// failed before sending them): after a failure, the group's committed offset vouches for
    /// records only if it is this one.
    sent: BTreeMap<(String, i32), i64>,
    /// Per input partition, the offset after the last record committed here and the
    /// revocation tick of that commit: the next batch of the partition should start there.
    frontier: BTreeMap<(String, i32), (i64, u64)>,
    topics: Topics,
    scorer: Scorer,
    group: String,
}

impl std::fmt::Debug for Analyser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Analyser")
            .field("topics", &self.topics)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl Analyser {
    /// `producer_config` must carry the instance's stable `transactional.id`.
    pub fn new(
        consumer: Arc<KafkaConsumer>,
        producer_config: ClientConfig,
        topics: Topics,
        scorer: Scorer,
        group: String,
    ) -> Self {
        Self {
            consumer,
            producer_config,
            producer: None,
            retrying: false,
            sent: BTreeMap::new(),
            frontier: BTreeMap::new(),
            topics,
            scorer,
            group,
        }
    }

    /// Treats the next batch as a retry of a failed attempt, as after a commit whose answer was
    /// lost (the commit may or may not have happened). Tests use it to reach that state, which
    /// a real broker produces only by chance.
    #[doc(hidden)]
    pub fn assume_last_attempt_failed(&mut self) {
        self.retrying = true;
    }

    /// Creates and registers the producer before the first batch: registering a
    /// `transactional.id` (finding the coordinator, fencing older instances, settling what they
    /// left open) took up to 0.5 s after a restart, which the first records would otherwise
    /// wait for. A failure is left for the first batch to retry.
    pub async fn prepare(&mut self) {
        if let Err(error) = self.producer().await {
            tracing::warn!(error = %kafka::consumer::error_chain(&error), "transactional producer not registered yet; the first batch retries");
        }
    }

    /// The producer, created and registered (fencing older instances) on first use or after a
    /// fatal error.
    async fn producer(&mut self) -> Result<TransactionalProducer, AnalysisError> {
        if let Some(producer) = &self.producer {
            return Ok(producer.clone());
        }
        let producer = TransactionalProducer::new(&self.producer_config)?;
        producer.init().await?;
        self.producer = Some(producer.clone());
        Ok(producer)
    }

    /// The output record for `input`: the analysed or rejected event, or its dead letter.
    pub fn output(&self, input: &OwnedMessage) -> Result<OutgoingRecord, AnalysisError> {
        let event = match decode(input) {
            Ok(event) => event,
            Err(error) => {
                let failure = Failure::new(MALFORMED_EVENT, error.cause_fqcn(), &error);
                tracing::warn!(topic = input.topic(), partition = input.partition(), offset = input.offset(), error = %telemetry::error_chain(&error), "poison record to the dead-letter topic");
                return Ok(dead_letter(input, &self.group, &failure));
            }
        };
        let score = self.scorer.score(&event);
        let (topic, id, kind, payload) = if self.scorer.blocks(score) {
            let id = derived_event_id(REJECTED_BY_ANTIFRAUD_PREFIX, event.transfer_id);
            let rejected = TransferRejected {
                event_id: id,
                transfer_id: event.transfer_id,
                reason: RejectionReason::BlockedByAntifraud,
                rejected_at: Timestamp::now(),
                details: contracts::events::OutcomeDetails {
                    source_account: Some(event.source_account.clone()),
                    destination_account: Some(event.destination_account.clone()),
                    amount_cents: Some(event.amount_cents),
                    currency: Some(event.currency.clone()),
                },
            };
            let payload = serde_json::to_vec(&rejected).map_err(AnalysisError::Encode)?;
            (&self.topics.rejected, id, EventType::TransferRejected, payload)
        } else {
            let id = derived_event_id(ANALYSED_PREFIX, event.transfer_id);
            let analysed = TransferAnalysed {
                event_id: id,
                transfer_id: event.transfer_id,
                source_account: event.source_account.clone(),
                destination_account: event.destination_account.clone(),
                amount_cents: event.amount_cents,
                currency: event.currency.clone(),
                score,
                analysed_at: Timestamp::now(),
            };
            let payload = serde_json::to_vec(&analysed).map_err(AnalysisError::Encode)?;
            (&self.topics.analysed, id, EventType::TransferAnalysed, payload)
        };
        let mut record =
            OutgoingRecord::new(topic.as_str(), event.source_account.as_str().as_bytes(), payload)
                .header(EVENT_ID, id.hyphenated().to_string())
                .header(EVENT_TYPE, kind.as_str());
        let span = tracing::info_span!("analyse", transfer_id = %event.transfer_id, score);
        kafka::trace::continue_from(&span, input);
        kafka::trace::inject(&span, &mut record);
        Ok(record)
    }

    /// One transaction for `records`; returns the committed outputs' topics.
    async fn transact(&mut self, records: &[&OwnedMessage]) -> Result<Vec<String>, AnalysisError> {
        self.sent.clear();
        let outputs = records.iter().map(|record| self.output(record)).collect::<Result<Vec<_>, _>>()?;
        let producer = self.producer().await?;
        producer.begin().await?;
        let consumer = self.consumer.clone();
        let sent = &mut self.sent;
        let result = async {
            // the offsets first: until the coordinator has completed the previous transaction
            // (its markers written) it answers CONCURRENT_TRANSACTIONS, and AddOffsetsToTxn is
            // retried after `retry.backoff.ms` (2 ms) where the records' AddPartitionsToTxn
            // waits librdkafka's fixed 20 ms (6-10 % of transactions at 200/s did). Sent at the
            // same time, the two requests refuse each other the same way.
            // The group is read right before sending: under KIP-848 the member epoch can change
            // silently. The broker checks that epoch, not which partitions the member owned when
            // it read the records: the consumer loop has dropped those of partitions revoked since
            let group = consumer.group_metadata().ok_or(AnalysisError::NoGroupMetadata)?;
            let offsets = next_offsets(records.iter().copied());
            for element in offsets.elements() {
                if let kafka::rdkafka::Offset::Offset(offset) = element.offset() {
                    sent.insert((element.topic().to_owned(), element.partition()), offset);
                }
            }
            producer.send_offsets(offsets, group).await?;
            futures::future::try_join_all(outputs.iter().map(|output| producer.send(output))).await?;
            producer.commit().await?;
            Ok::<_, AnalysisError>(())
        }
        .await;
        let committed_topics = outputs.iter().map(|output| output.topic.clone()).collect();
        if let Err(error) = &result {
            let kafka_error = match error {
                AnalysisError::Kafka(error) => Some(error),
                _ => None,
            };
            // a stuck call blocks every other transactional call of this producer: no abort
            if !matches!(kafka_error, Some(kafka::Error::TransactionStuck { .. })) {
                if let Err(abort) = producer.abort().await {
                    tracing::warn!(error = %kafka::consumer::error_chain(&abort), "abort failed; recreating the producer");
                    self.producer = None;
                }
            }
            if kafka_error.is_some_and(kafka::Error::needs_new_producer) {
                self.producer = None;
            }
        }
        if self.producer.is_none() {
            discard(producer);
        }
        result.map(|()| committed_topics)
    }
}

/// Lets go of a producer that is being replaced, on the blocking pool: the last handle's drop
/// destroys the librdkafka client, which waits for its threads and outstanding requests (for
/// a fenced transactional producer that can take long), and must not stall a runtime worker or
/// the loop that replaces it.
fn discard(producer: TransactionalProducer) {
    tokio::task::spawn_blocking(move || drop(producer));
}

impl Analyser {
    /// After a failed attempt: a new producer registers the `transactional.id` again, which
    /// completes or aborts whatever the last transaction left open; only then do the group's
    /// committed offsets tell which records of the batch are already done, and those are
    /// dropped. Retrying them would commit their outputs a second time.
    ///
    /// A committed offset vouches for the records below it only if it is the one the failed
    /// attempt sent (its transaction did commit): any other value past them is not this
    /// instance's doing, and a record taken as done on it that nobody analysed would be lost
    /// for good. Those records are analysed again (said at WARN): a second analysis carries the
    /// same derived event id, and where the offset is someone else's (this member fenced), the
    /// broker refuses the transaction.
    async fn not_yet_committed<'a>(
        &mut self,
        records: Vec<&'a OwnedMessage>,
    ) -> Result<Vec<&'a OwnedMessage>, AnalysisError> {
        if let Some(old) = self.producer.take() {
            discard(old);
        }
        self.producer().await?;
        let consumer = self.consumer.clone();
        let partitions = next_offsets(records.iter().copied());
        let committed = tokio::task::spawn_blocking(move || {
            consumer.committed_offsets(partitions, kafka::transactional::CALL_TIMEOUT)
        })
        .await
        .map_err(kafka::Error::from)?
        .map_err(|source| kafka::Error::Consumer { operation: "committed_offsets", source })?;
        let mut vouched = BTreeMap::new();
        for element in committed.elements() {
            let kafka::rdkafka::Offset::Offset(offset) = element.offset() else { continue };
            let key = (element.topic().to_owned(), element.partition());
            let sent = self.sent.get(&key).copied();
            if sent == Some(offset) {
                // the failed attempt's transaction did commit: the partition goes on from there
                self.frontier.insert(key.clone(), (offset, self.consumer.context().revocations.now()));
                vouched.insert(key, offset);
            } else if records.iter().any(|record| {
                record.topic() == key.0 && record.partition() == key.1 && record.offset() < offset
            }) {
                tracing::warn!(
                    topic = key.0,
                    partition = key.1,
                    committed = offset,
                    sent,
                    "the group's committed offset is past records of the batch but is not what the failed attempt sent: they are analysed again"
                );
            }
        }
        Ok(records
            .into_iter()
            .filter(|record| {
                vouched
                    .get(&(record.topic().to_owned(), record.partition()))
                    .is_none_or(|next| record.offset() >= *next)
            })
            .collect())
    }
}

impl Analyser {
    /// Says at ERROR when a partition's records in `records` do not start where this
    /// instance's last commit of it ended although the partition was not revoked since: the
    /// offsets between were committed by the next transaction without being analysed. The
    /// request topic is written by an idempotent, non-transactional producer (the outbox
    /// relay), so its offsets have no gaps of their own; a producer writing it in transactions
    /// would leave one offset per commit marker, said here too.
    fn check_frontier(&self, records: &[&OwnedMessage]) {
        for gap in gaps(&self.frontier, &self.consumer.context().revocations, records) {
            tracing::error!(
                topic = gap.topic,
                partition = gap.partition,
                expected = gap.expected,
                first = gap.first,
                "a batch does not start where the last commit of its partition ended: the offsets between are passed over unanalysed (or are transaction markers)"
            );
        }
    }
}

/// Where a partition's records in a batch start past the offset its last commit ended at.
#[derive(Debug, PartialEq, Eq)]
struct Gap {
    topic: String,
    partition: i32,
    expected: i64,
    first: i64,
}

/// The partitions of `records` that start past their `frontier`, among those not revoked since.
fn gaps(
    frontier: &BTreeMap<(String, i32), (i64, u64)>,
    revocations: &kafka::context::Revocations,
    records: &[&OwnedMessage],
) -> Vec<Gap> {
    let mut first: BTreeMap<(&str, i32), i64> = BTreeMap::new();
    for record in records {
        let entry = first.entry((record.topic(), record.partition())).or_insert(record.offset());
        *entry = (*entry).min(record.offset());
    }
    first
        .into_iter()
        .filter_map(|((topic, partition), offset)| {
            let (expected, tick) = frontier.get(&(topic.to_owned(), partition))?;
            (offset > *expected && !revocations.revoked_since(topic, partition, *tick)).then(|| Gap {
                topic: topic.to_owned(),
                partition,
                expected: *expected,
                first: offset,
            })
        })
        .collect()
}

/// Records of `all` that are not in `kept` leave the batch without being in a transaction: safe
/// only if no later transaction of this consumer commits past them (their partition is someone
/// else's, or the committed offset is there because their outputs were committed). Said at WARN
/// with where they are, so a gap in antifraude's outputs can be traced to the decision.
fn log_left_out<R: std::borrow::Borrow<OwnedMessage>>(all: &[R], kept: &[&OwnedMessage], why: &'static str) {
    if all.len() == kept.len() {
        return;
    }
    let mut ranges: std::collections::BTreeMap<(String, i32), (i64, i64, usize)> = Default::default();
    for record in all.iter().map(std::borrow::Borrow::borrow) {
        let is_kept = kept.iter().any(|other| {
            other.partition() == record.partition()
                && other.offset() == record.offset()
                && other.topic() == record.topic()
        });
        if !is_kept {
            let range = ranges.entry((record.topic().to_owned(), record.partition())).or_insert((
                record.offset(),
                record.offset(),
                0,
            ));
            range.0 = range.0.min(record.offset());
            range.1 = range.1.max(record.offset());
            range.2 += 1;
        }
    }
    for ((topic, partition), (first, last, count)) in ranges {
        tracing::warn!(topic, partition, first, last, count, "{why}");
    }
}

fn decode(input: &OwnedMessage) -> Result<TransferRequested, MalformedEvent> {
    let event: TransferRequested =
        serde_json::from_slice(input.payload().unwrap_or_default()).map_err(MalformedEvent::Json)?;
    if !event.amount_cents.is_positive() {
        return Err(MalformedEvent::Amount(event.amount_cents.get()));
    }
    Ok(event)
}

impl Handler for Analyser {
    type Error = AnalysisError;

    async fn handle(
        &mut self,
        batch: &[OwnedMessage],
        _retrying: bool,
    ) -> Result<Vec<Verdict>, AnalysisError> {
        // a retried batch may hold partitions that were revoked meanwhile: their new owner
        // starts from the last committed offset, so they are not ours to produce any more
        let assignment = self.consumer.assignment().ok();
        let owned: Vec<&OwnedMessage> = batch
            .iter()
            .filter(|record| {
                assignment.as_ref().is_none_or(|assigned| {
                    assigned.find_partition(record.topic(), record.partition()).is_some()
                })
            })
            .collect();
        log_left_out(batch, &owned, "records of partitions not assigned any more: left to their new owner");
        let owned = if self.retrying {
            let kept = self.not_yet_committed(owned.clone()).await?;
            log_left_out(
                &owned,
                &kept,
                "records the group's committed offsets already passed: taken as done",
            );
            kept
        } else {
            owned
        };
        if owned.is_empty() {
            self.retrying = false;
            return Ok(Verdict::all_done(batch));
        }
        self.check_frontier(&owned);
        let started = std::time::Instant::now();
        self.retrying = true;
        let committed = self.transact(&owned).await?;
        self.retrying = false;
        let tick = self.consumer.context().revocations.now();
        for (key, offset) in &self.sent {
            self.frontier.insert(key.clone(), (*offset, tick));
        }
        metrics::histogram!("antifraud_transaction_seconds").record(started.elapsed().as_secs_f64());
        for topic in committed {
            let outcome = if topic == self.topics.analysed {
                "analysed"
            } else if topic == self.topics.rejected {
                "blocked"
            } else {
                metrics::counter!("dlt_mensagens_total", "topic" => topic).increment(1);
                "dlt"
            };
            metrics::counter!("antifraud_records_total", "outcome" => outcome).increment(1);
        }
        // records of revoked partitions included: in a transaction nothing is stored for them
        Ok(Verdict::all_done(batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(partition: i32, offset: i64) -> OwnedMessage {
        OwnedMessage::new(
            None,
            None,
            "t".into(),
            kafka::rdkafka::Timestamp::NotAvailable,
            partition,
            offset,
            None,
        )
    }

    #[test]
    fn a_batch_that_starts_past_the_last_commit_of_its_partition_is_a_gap() {
        let revocations = kafka::context::Revocations::default();
        let tick = revocations.now();
        let frontier: BTreeMap<_, _> =
            [(("t".to_owned(), 0), (10, tick)), (("t".to_owned(), 1), (5, tick))].into_iter().collect();
        let (a, b, c, d) = (record(0, 10), record(0, 11), record(1, 7), record(2, 40));
        // partition 0 goes on where it ended; 1 skips 5 and 6; 2 has no commit here yet
        assert_eq!(
            gaps(&frontier, &revocations, &[&c, &a, &b, &d]),
            [Gap { topic: "t".into(), partition: 1, expected: 5, first: 7 }]
        );
        // revoked since: fetched anew from the group's committed offset, not this frontier
        let mut revoked = kafka::rdkafka::TopicPartitionList::new();
        revoked.add_partition("t", 1);
        revocations.record(&revoked);
        assert_eq!(gaps(&frontier, &revocations, &[&c]), []);
    }

    #[test]
    fn the_dead_letter_exception_names_a_type_that_exists() {
        assert_eq!(MALFORMED_EVENT, std::any::type_name::<MalformedEvent>());
        assert_eq!(MalformedEvent::Amount(0).cause_fqcn(), MALFORMED_EVENT);
    }
}
