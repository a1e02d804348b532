//! The librdkafka client context shared by every client: its log lines go to `tracing` under
//! the `librdkafka` target, consumer rebalances are logged and counted in [`Revocations`], and
//! its statistics are watched for a client left with no broker ([`crate::rebootstrap`]).
//! Create clients with [`create`], which binds the context to its client.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rdkafka::admin::AdminClient;
use rdkafka::client::{Client, ClientContext};
use rdkafka::config::{FromClientConfigAndContext, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::producer::{BaseProducer, Producer as _};
use rdkafka::types::RDKafka;
use rdkafka::{ClientConfig, TopicPartitionList};

use crate::rebootstrap::Rebootstrap;

/// Context of every pagamentos Kafka client.
#[derive(Debug, Default)]
pub struct Context {
    /// The consumer's partition revocations (empty for other clients).
    pub revocations: Arc<Revocations>,
    /// Bound to one client by [`create`]; never shared with another.
    rebootstrap: Arc<Rebootstrap>,
    /// The last time a broker refused this client (authentication, TLS), librdkafka's words:
    /// behind a "broker transport failure" it is the reason an operator needs.
    refusal: Arc<Mutex<Option<String>>>,
    /// The consumer's `group.id` as configured (empty for other clients): the `group` label of
    /// what the consumer runtime measures, read from the one place that sets it.
    group: Arc<str>,
}

/// A clone shares the revocations, not the binding: a client created with a clone of another
/// client's context must not add brokers to that other client.
impl Clone for Context {
    fn clone(&self) -> Self {
        Self {
            revocations: self.revocations.clone(),
            rebootstrap: Arc::default(),
            refusal: Arc::default(),
            group: self.group.clone(),
        }
    }
}

impl Context {
    /// Why a broker last refused this client (failed SASL authentication, a TLS handshake or
    /// certificate error), if one did.
    pub fn refusal(&self) -> Option<String> {
        self.refusal.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The consumer group this client was configured with (`group.id`); empty when none.
    pub fn group(&self) -> &str {
        &self.group
    }
}

/// A librdkafka client type built on [`Context`].
pub trait KafkaClient: FromClientConfigAndContext<Context> {
    /// rdkafka's client under it, which owns the `rd_kafka_t`.
    fn rd_client(&self) -> &Client<Context>;

    /// The client's `rd_kafka_t`.
    fn native_ptr(&self) -> *mut RDKafka {
        self.rd_client().native_ptr()
    }
}

impl KafkaClient for StreamConsumer<Context> {
    fn rd_client(&self) -> &Client<Context> {
        self.client()
    }
}

impl KafkaClient for BaseConsumer<Context> {
    fn rd_client(&self) -> &Client<Context> {
        self.client()
    }
}

impl KafkaClient for BaseProducer<Context> {
    fn rd_client(&self) -> &Client<Context> {
        self.client()
    }
}

impl KafkaClient for AdminClient<Context> {
    fn rd_client(&self) -> &Client<Context> {
        self.inner()
    }
}

/// Creates a client from `config` with a context of its own, bound to it: statistics every
/// [`crate::config::STATISTICS_INTERVAL`] ([`crate::config`] sets it) let a client that lost
/// every broker add its bootstrap servers again ([`crate::rebootstrap`]).
pub fn create<T: KafkaClient>(config: &ClientConfig) -> KafkaResult<T> {
    let context = Context { group: config.get("group.id").unwrap_or_default().into(), ..Context::default() };
    let rebootstrap = context.rebootstrap.clone();
    let client: T = config.create_with_context(context)?;
    rebootstrap.bind(
        client.native_ptr(),
        config.get("client.id").unwrap_or("rdkafka"),
        config.get("bootstrap.servers").unwrap_or_default(),
    );
    Ok(client)
}

/// When a consumer's partitions were revoked (or lost), on a clock that ticks once per
/// revocation. A record taken at tick `t` whose partition was revoked after `t` is no longer
/// the consumer's to handle, even if the partition came back since: a fenced member (a
/// process paused past the session timeout) learns of it only when it polls again, by then
/// the partition's new owner may have handled the record, and a partition assigned again is
/// fetched anew from its committed offset. Handling such a record anyway would do its work
/// twice, and in a Kafka transaction it would commit its outputs twice: the broker checks the
/// member's epoch, not which partitions the member owned when it read the record.
#[derive(Debug, Default)]
pub struct Revocations {
    clock: AtomicU64,
    /// topic → partition → tick of its last revocation
    last: Mutex<HashMap<String, HashMap<i32, u64>>>,
    /// Why librdkafka refused to apply a rebalance, if it did: the member then waits for an
    /// answer it will never get (no more fetching, no heartbeat acknowledgement), so the
    /// consumer loop stops with [`crate::Error::Fatal`] and the service is restarted as a fresh
    /// member.
    refused: Mutex<Option<String>>,
    refused_changed: tokio::sync::Notify,
    /// topic → partition → tick at which the consumer loop last took a record of it
    taken: Mutex<HashMap<String, HashMap<i32, u64>>>,
}

impl Revocations {
    /// The current tick: taken with each record as it is received.
    pub fn now(&self) -> u64 {
        self.clock.load(Ordering::Acquire)
    }

    /// Whether `topic`/`partition` was revoked after tick `taken`.
    pub fn revoked_since(&self, topic: &str, partition: i32, taken: u64) -> bool {
        if self.now() == taken {
            return false; // the fast path: no revocation at all since
        }
        let last = self.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        last.get(topic)
            .and_then(|partitions| partitions.get(&partition))
            .is_some_and(|revoked| *revoked > taken)
    }

    /// Notes that a record of `topic`/`partition` was taken at `tick` (the consumer loop does).
    pub(crate) fn taken(&self, topic: &str, partition: i32, tick: u64) {
        let mut taken = self.taken.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match taken.get_mut(topic) {
            Some(partitions) => {
                partitions.insert(partition, tick);
            }
            None => {
                taken.entry(topic.to_owned()).or_default().insert(partition, tick);
            }
        }
    }

    /// Whether a record of `topic`/`partition` was taken after its last revocation (or it was
    /// never revoked): only then does the consumer's position of it come from the current
    /// assignment.
    pub fn taken_since_revoked(&self, topic: &str, partition: i32) -> bool {
        let revoked = {
            let last = self.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            last.get(topic).and_then(|partitions| partitions.get(&partition)).copied()
        };
        let Some(revoked) = revoked else { return true };
        let taken = self.taken.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        taken
            .get(topic)
            .and_then(|partitions| partitions.get(&partition))
            .is_some_and(|tick| *tick >= revoked)
    }

    /// Records that librdkafka refused to apply a rebalance (the rebalance callback does; tests
    /// may).
    pub fn refuse(&self, why: String) {
        *self.refused.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(why);
        self.refused_changed.notify_waiters();
    }

    /// Why librdkafka refused a rebalance, if it did.
    pub fn refused(&self) -> Option<String> {
        self.refused.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Waits until a rebalance is refused ([`Self::refuse`]); cancel-safe.
    pub async fn wait_refused(&self) -> String {
        loop {
            let changed = self.refused_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(why) = self.refused() {
                return why;
            }
            changed.await;
        }
    }

    /// Records a revocation of `partitions` (the rebalance callback does; tests may).
    pub fn record(&self, partitions: &TopicPartitionList) {
        let mut last = self.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let tick = self.clock.fetch_add(1, Ordering::AcqRel) + 1;
        for element in partitions.elements() {
            last.entry(element.topic().to_owned()).or_default().insert(element.partition(), tick);
        }
    }
}

impl ClientContext for Context {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        // an admin client's error events wait on a queue nobody polls; its log lines do not
        if is_refusal_message(message) {
            *self.refusal.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                Some(message.to_owned());
        }
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", facility, "{message}")
            }
            RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", facility, "{message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", facility, "{message}")
            }
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", facility, "{message}"),
        }
    }

    fn stats_raw(&self, statistics: &[u8]) {
        self.rebootstrap.check(statistics);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // librdkafka reports transient errors (a broker restart) here and recovers on its own
        tracing::warn!(target: "librdkafka", %error, reason, "kafka client error");
        if is_refusal(&error) {
            *self.refusal.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(reason.to_owned());
        }
    }
}

impl ConsumerContext for Context {
    /// rust-rdkafka's default applies a rebalance with `incremental_assign`/`incremental_unassign`
    /// and ignores their answer. Both are all-or-nothing in librdkafka: a revocation naming one
    /// partition that is not assigned any more unassigns none of them, an assignment naming
    /// one partition already held assigns none, and the member then waits for ever for an
    /// answer (nothing fetched, the rebalance never acknowledged) while the loop would go on
    /// as if nothing happened. Here each call names only what it can apply
    /// ([`RebalancePlan`]), a partition assigned again while held is revoked first (fetched
    /// anew from its committed offset, its records in hand dropped), and a refusal is logged at
    /// ERROR and stops the consumer loop ([`Revocations::refuse`]): a fresh member recovers.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: rdkafka::types::RDKafkaRespErr,
        partitions: &mut TopicPartitionList,
    ) {
        use rdkafka::consumer::RebalanceProtocol;
        use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
        let rebalance = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => Rebalance::Assign(partitions),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => Rebalance::Revoke(partitions),
            other => Rebalance::Error(KafkaError::Rebalance(RDKafkaErrorCode::from(other))),
        };
        self.pre_rebalance(consumer, &rebalance);
        if !matches!(consumer.rebalance_protocol(), RebalanceProtocol::Cooperative) {
            // the classic protocol before a first assignment, or an eager assignor: whole
            // assignments, as rust-rdkafka applies them
            let applied = match &rebalance {
                Rebalance::Assign(partitions) => consumer.assign(partitions),
                _ => consumer.unassign(),
            };
            if let Err(error) = applied {
                tracing::error!(%error, "rebalance refused: the member is stuck; its consumer loop stops");
                self.revocations.refuse(format!("rebalance refused: {error}"));
            }
        } else {
            let assign = matches!(rebalance, Rebalance::Assign(_));
            if let Rebalance::Error(error) = &rebalance {
                // as rust-rdkafka does: the list is unassigned (what of it is held)
                tracing::warn!(%error, partitions = partitions.count(), "rebalance error: its partitions are unassigned");
                self.revocations.record(partitions);
            }
            // unknown (the client is closing): the list as it came, as rust-rdkafka applies it
            let assigned = consumer.assignment().map(|list| keys(&list)).unwrap_or_else(|error| {
                tracing::debug!(%error, "assignment unknown during a rebalance");
                if assign {
                    Vec::new()
                } else {
                    keys(partitions)
                }
            });
            let unassign = |partitions: &[PartitionKey]| {
                if let Err(error) = consumer.incremental_unassign(&list(partitions)) {
                    tracing::error!(%error, ?partitions, "incremental unassign refused: the member is stuck; its consumer loop stops");
                    self.revocations
                        .refuse(format!("incremental unassign of {partitions:?} refused: {error}"));
                }
            };
            match RebalancePlan::new(assign, &keys(partitions), &assigned) {
                RebalancePlan::Revoke { unassign: held, not_assigned } => {
                    if !not_assigned.is_empty() {
                        tracing::warn!(partitions = ?not_assigned, "revoked partitions this member did not hold");
                    }
                    // called even with nothing to name: librdkafka waits for the application's
                    // answer to each rebalance before it goes on
                    unassign(&held);
                }
                RebalancePlan::Assign { again, assign } => {
                    if !again.is_empty() {
                        tracing::warn!(
                            partitions = ?again,
                            "partitions assigned again while held: revoked first, fetched anew from their committed offsets"
                        );
                        // the application's pause outlives an unassign and assign (see pre_rebalance)
                        if let Err(error) = rdkafka::consumer::Consumer::resume(consumer, &list(&again)) {
                            tracing::debug!(%error, "partitions assigned again not resumed");
                        }
                        self.revocations.record(&list(&again));
                        unassign(&again);
                    }
                    if let Err(error) = consumer.incremental_assign(&list(&assign)) {
                        tracing::error!(%error, partitions = ?assign, "incremental assign refused: the member is stuck; its consumer loop stops");
                        self.revocations.refuse(format!("incremental assign of {assign:?} refused: {error}"));
                    }
                }
            }
        }
        self.post_rebalance(consumer, &rebalance);
    }

    fn pre_rebalance(&self, consumer: &rdkafka::consumer::BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(partitions) = rebalance {
            // librdkafka keeps an application's pause through revocation and reassignment: a
            // partition a loop paused and then lost would never be fetched again once it came
            // back. Unpaused as it goes (resuming it at assignment instead would disturb the
            // lookup of its committed offset).
            if let Err(error) = rdkafka::consumer::Consumer::resume(consumer, partitions) {
                tracing::debug!(%error, "revoked partitions not resumed");
            }
            // before librdkafka applies it: a record received from now on was fetched afterwards
            self.revocations.record(partitions);
        }
    }

    fn post_rebalance(&self, _consumer: &rdkafka::consumer::BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(partitions) => {
                tracing::info!(partitions = partitions.count(), "partitions assigned")
            }
            Rebalance::Revoke(partitions) => {
                tracing::info!(partitions = partitions.count(), "partitions revoked")
            }
            Rebalance::Error(error) => tracing::warn!(%error, "rebalance error"),
        }
    }
}

/// A partition: topic and number.
type PartitionKey = (String, i32);

fn keys(list: &TopicPartitionList) -> Vec<PartitionKey> {
    list.elements().iter().map(|element| (element.topic().to_owned(), element.partition())).collect()
}

fn list(keys: &[PartitionKey]) -> TopicPartitionList {
    let mut list = TopicPartitionList::with_capacity(keys.len());
    for (topic, partition) in keys {
        list.add_partition(topic, *partition);
    }
    list
}

/// How one cooperative rebalance is applied, given what the consumer holds.
#[derive(Debug, PartialEq, Eq)]
enum RebalancePlan {
    /// `incremental_unassign(unassign)`, called even when empty; `not_assigned` (revoked but
    /// not held) is left out of it, which would refuse them all.
    Revoke { unassign: Vec<PartitionKey>, not_assigned: Vec<PartitionKey> },
    /// `incremental_assign(assign)`, after `incremental_unassign(again)` when some of it is held
    /// already: those are recorded as revoked, so that they are fetched anew from their
    /// committed offsets and the records in hand are dropped.
    Assign { again: Vec<PartitionKey>, assign: Vec<PartitionKey> },
}

impl RebalancePlan {
    fn new(assign: bool, partitions: &[PartitionKey], held: &[PartitionKey]) -> Self {
        let (in_held, not_in_held): (Vec<_>, Vec<_>) =
            partitions.iter().cloned().partition(|partition| held.contains(partition));
        if assign {
            Self::Assign { again: in_held, assign: partitions.to_vec() }
        } else {
            Self::Revoke { unassign: in_held, not_assigned: not_in_held }
        }
    }
}

/// An error that means the broker will not have this client as configured (credentials, TLS
/// trust): no retry helps, unlike a broker that is down.
fn is_refusal(error: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode;
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::Authentication
                | RDKafkaErrorCode::SSL
                | RDKafkaErrorCode::SaslAuthenticationFailed
        )
    )
}

/// Takes the events waiting on `client`'s main queue without blocking and hands its errors to
/// the context (so [`Context::refusal`] knows a refusal) and its log lines to `tracing`. An
/// admin client's main queue is polled by nobody (rdkafka's admin thread polls the queue of
/// its requests): without this, "Authentication failed" would never reach the operator.
pub fn drain_main_queue<T: KafkaClient>(client: &T, context: &Context) {
    use crate::ffi::{EventKind, MainQueue};
    let Some(queue) = MainQueue::of(client.rd_client()) else { return };
    while let Some(event) = queue.poll_now() {
        match event.kind() {
            EventKind::Error { code, reason } => context.error(KafkaError::Global(code), &reason),
            EventKind::Log { level, message } => {
                match level {
                    ..=3 => tracing::error!(target: "librdkafka", "{message}"),
                    4 => tracing::warn!(target: "librdkafka", "{message}"),
                    5 | 6 => tracing::info!(target: "librdkafka", "{message}"),
                    _ => tracing::debug!(target: "librdkafka", "{message}"),
                }
                if is_refusal_message(&message) {
                    *context.refusal.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                        Some(message);
                }
            }
            EventKind::Other => {}
        }
    }
}

/// librdkafka's words for a broker that refused this client (its log lines carry no code).
fn is_refusal_message(message: &str) -> bool {
    ["SASL authentication error", "SSL handshake failed", "Authentication failed"]
        .iter()
        .any(|words| message.contains(words))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_binds_the_client_s_own_context() {
        let mut config = crate::config::base_consumer_settings(&crate::KafkaArgs::new("127.0.0.1:1"), "test");
        config.set("group.id", "test-group");
        let consumer: BaseConsumer<Context> = create(&config).expect("consumer");
        assert!(consumer.context().rebootstrap.is_bound());
        assert_eq!(consumer.context().group(), "test-group", "the group id the runtime labels with");
    }

    #[test]
    fn a_clone_of_a_context_is_never_bound_to_the_original_client() {
        let context = Context::default();
        // never dereferenced: only a statistics callback of a bound client would use it
        context.rebootstrap.bind(std::ptr::null_mut(), "test", "localhost:9092");
        assert!(context.rebootstrap.is_bound());
        let clone = context.clone();
        assert!(!clone.rebootstrap.is_bound(), "a client made with the clone has its own binding");
        assert!(Arc::ptr_eq(&clone.revocations, &context.revocations), "revocations are shared");
    }

    #[test]
    fn a_client_without_bootstrap_servers_has_nothing_to_add_again() {
        let context = Context::default();
        context.rebootstrap.bind(std::ptr::null_mut(), "test", " ");
        assert!(!context.rebootstrap.is_bound());
    }

    fn partitions(numbers: &[i32]) -> Vec<PartitionKey> {
        numbers.iter().map(|number| ("t".to_owned(), *number)).collect()
    }

    #[test]
    fn a_revocation_unassigns_only_what_is_held() {
        // librdkafka refuses the whole unassign if one partition is not held
        let plan = RebalancePlan::new(false, &partitions(&[0, 1, 2]), &partitions(&[1, 2, 3]));
        assert_eq!(
            plan,
            RebalancePlan::Revoke { unassign: partitions(&[1, 2]), not_assigned: partitions(&[0]) }
        );
        let nothing_held = RebalancePlan::new(false, &partitions(&[0]), &[]);
        assert_eq!(
            nothing_held,
            RebalancePlan::Revoke { unassign: vec![], not_assigned: partitions(&[0]) },
            "still called, with nothing"
        );
    }

    #[test]
    fn a_partition_assigned_while_held_is_revoked_and_assigned_anew() {
        // librdkafka refuses the whole assign if one partition is already held; and a held
        // partition's fetch position is not reset by a second assign
        let plan = RebalancePlan::new(true, &partitions(&[1, 4]), &partitions(&[1, 2]));
        assert_eq!(plan, RebalancePlan::Assign { again: partitions(&[1]), assign: partitions(&[1, 4]) });
        let plain = RebalancePlan::new(true, &partitions(&[3]), &partitions(&[1]));
        assert_eq!(plain, RebalancePlan::Assign { again: vec![], assign: partitions(&[3]) });
    }

    #[test]
    fn a_record_is_stale_only_if_its_partition_was_revoked_after_it_was_taken() {
        let revocations = Revocations::default();
        let before = revocations.now();
        let mut revoked = TopicPartitionList::new();
        revoked.add_partition("a", 1);
        revocations.record(&revoked);
        let after = revocations.now();
        assert!(revocations.revoked_since("a", 1, before));
        assert!(!revocations.revoked_since("a", 0, before), "another partition");
        assert!(!revocations.revoked_since("b", 1, before), "another topic");
        assert!(!revocations.revoked_since("a", 1, after), "taken after the revocation");
        revocations.record(&revoked);
        assert!(revocations.revoked_since("a", 1, after), "revoked again");
    }
}
