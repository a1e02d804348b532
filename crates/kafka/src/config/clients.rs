//! The librdkafka configuration of each kind of client (producers, the transactional
//! producer, consumers, readers, admin) and the timeouts every client shares.

use std::time::Duration;

use rdkafka::ClientConfig;

use super::{GroupProtocol, KafkaArgs};

/// How long a producer may keep a record before giving up on it (`delivery.timeout.ms`).
pub const DELIVERY_TIMEOUT: Duration = Duration::from_millis(120_000);
/// `transaction.timeout.ms`: a killed transactional instance blocks read_committed readers at
/// most this long.
pub const TRANSACTION_TIMEOUT: Duration = Duration::from_millis(10_000);

/// How often every client reports its statistics (`statistics.interval.ms`), and so how soon a
/// client left with no broker notices (`crate::rebootstrap`). Not more often: at 200
/// transfers/s, reports every second raised the end-to-end p99 and max (max 91–265 ms in four
/// runs, against 61–93 ms without statistics and 60–66 ms with reports every 10 s).
pub const STATISTICS_INTERVAL: Duration = Duration::from_millis(10_000);

/// `socket.timeout.ms`: how long any request may wait for its answer before the client gives
/// up on it, drops the connection (`socket.max.fails` 1) and refreshes its metadata from
/// another broker (librdkafka's default: 60 s). A broker cut off the network answers nothing,
/// and one cut from the other brokers only holds its clients' writes (it can replicate them to
/// no one) until the broker-side `request.timeout.ms`, 30 s, and then answers only "timed out",
/// which moves no client. The other brokers fence it and move its leaderships after
/// `broker.session.timeout.ms` (8-12 s into the cut): with 60 s every relay, consumer and
/// coordinator request stuck on it waited up to a minute before its client looked for the new
/// leader, and the pipeline stood still the whole cut (docs/operations.md, "One broker of three
/// cut off the network"). With 5 s the first time-out after the fencing moves the client:
/// settlements resumed 10-16 s into the cut (the fencing plus at most one time-out). The cost:
/// a request a healthy broker legitimately holds longer (an `acks=all` write waiting for a
/// follower that is about to leave the ISR) is abandoned and sent again on a new connection,
/// which the idempotent producer does with the same sequence numbers (the broker acknowledges
/// the copy it has instead of writing it twice). Below the transaction timeout, as librdkafka
/// requires of a transactional producer (without it, it would derive 9.9 s from that timeout).
pub const SOCKET_TIMEOUT: Duration = Duration::from_millis(5_000);
const _: () = assert!(SOCKET_TIMEOUT.as_millis() < TRANSACTION_TIMEOUT.as_millis());

/// `topic.metadata.refresh.interval.ms`: how often every client asks where its partitions'
/// leaders are, unprompted (librdkafka's default: 5 min). A node cut from the other brokers
/// only still answers its clients from its stale view: a consumer fetching from it gets no
/// error, only nothing new, and nothing but this refresh tells it the leadership moved (an
/// answer from the stale node is ignored once a newer leader epoch is known).
pub const METADATA_REFRESH_INTERVAL: Duration = Duration::from_millis(5_000);

/// `socket.connection.setup.timeout.ms`: a connection to a dead broker fails quickly enough to
/// report it.
pub const CONNECTION_SETUP_TIMEOUT: Duration = Duration::from_millis(10_000);

/// `reconnect.backoff.max.ms`: the longest pause between attempts to reach a broker.
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_millis(2_000);

/// `retry.backoff.ms` of a transactional producer: after a commit the coordinator answers the
/// next transaction's first request with CONCURRENT_TRANSACTIONS until its markers are written
/// (a few ms); the default 100 ms backoff put 10-50 ms on most transactions
/// (docs/architecture.md).
pub const TRANSACTION_RETRY_BACKOFF: Duration = Duration::from_millis(2);

fn base(args: &KafkaArgs, client_id: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &args.bootstrap_servers)
        .set("client.id", client_id)
        // fail a metadata/produce request to a dead broker quickly enough to report it
        .set("socket.connection.setup.timeout.ms", CONNECTION_SETUP_TIMEOUT.as_millis().to_string())
        .set("reconnect.backoff.max.ms", RECONNECT_BACKOFF_MAX.as_millis().to_string())
        // a silent broker costs seconds, not a minute (the constants say why). A timed-out
        // request is retried: a produce request by the idempotent producer with the same
        // sequence numbers; a fetch or an offset commit as the next one (auto-commit commits
        // the stored offsets again); a timed-out transactional request fails its transaction,
        // which is aborted and its batch retried, as on any error (antifraude reads the
        // committed offsets first, so a commit whose answer was lost is not produced twice)
        .set("socket.timeout.ms", SOCKET_TIMEOUT.as_millis().to_string())
        .set("topic.metadata.refresh.interval.ms", METADATA_REFRESH_INTERVAL.as_millis().to_string())
        // re-bootstrap after 10 s of unanswered Metadata requests instead of librdkafka's 5 min.
        // It does not rescue a client that a Metadata answer naming no broker left with none
        // (librdkafka 2.12 drops every broker an answer leaves out, and starts this timer only
        // when it sends a request, which needs a broker): the statistics below do
        .set("metadata.recovery.rebootstrap.trigger.ms", "10000")
        // read by `crate::rebootstrap`: a client with no broker left adds its bootstrap servers
        .set("statistics.interval.ms", STATISTICS_INTERVAL.as_millis().to_string());
    // every client of every command: producers, consumers, the transactional producer, admin
    args.security.apply(&mut config);
    config
}

/// The contract's producer: `acks=all`, idempotent, zstd, Java's partitioner.
///
/// `linger` trades latency at low load for batching at high load.
pub fn producer_config(args: &KafkaArgs, client_id: &str, linger: Duration) -> ClientConfig {
    let mut config = base(args, client_id);
    config
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("compression.type", "zstd")
        .set("delivery.timeout.ms", DELIVERY_TIMEOUT.as_millis().to_string())
        .set("linger.ms", linger.as_millis().to_string())
        // Java's default partitioner: the same key lands on the same partition whichever
        // language produced it (librdkafka's default, consistent_random, would not)
        .set("partitioner", "murmur2_random");
    config
}

/// A transactional producer with a stable `transactional.id` per instance (KIP-447 fencing).
pub fn transactional_producer_config(
    args: &KafkaArgs,
    client_id: &str,
    transactional_id: &str,
    linger: Duration,
) -> ClientConfig {
    let mut config = producer_config(args, client_id, linger);
    config
        .set("transactional.id", transactional_id)
        .set("transaction.timeout.ms", TRANSACTION_TIMEOUT.as_millis().to_string())
        // librdkafka refuses a delivery timeout longer than the transaction timeout (a record
        // must be delivered or failed before its transaction can time out)
        .set("delivery.timeout.ms", TRANSACTION_TIMEOUT.as_millis().to_string())
        // librdkafka applies it to AddOffsetsToTxn; it retries AddPartitionsToTxn after a
        // fixed 20 ms
        .set("retry.backoff.ms", TRANSACTION_RETRY_BACKOFF.as_millis().to_string());
    config
}

/// Who commits a consumer's offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetCommit {
    /// The consumer loop stores an offset once its handler succeeded, and librdkafka commits
    /// stored offsets in the background and at close.
    StoredAfterHandling,
    /// Offsets travel inside a Kafka transaction; nothing is committed by the consumer.
    InTransaction,
}

/// A consumer that writes somewhere: `read_committed`, `earliest`, no offset moves on its own.
pub fn consumer_config(
    args: &KafkaArgs,
    client_id: &str,
    group_id: &str,
    commit: OffsetCommit,
) -> ClientConfig {
    let mut config = base(args, client_id);
    config
        .set("group.id", group_id)
        .set("group.protocol", args.group_protocol.to_string())
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        // only offsets the loop stored explicitly, after the handler's work is durable
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false");
    match commit {
        OffsetCommit::StoredAfterHandling => {
            config.set("enable.auto.commit", "true").set("auto.commit.interval.ms", "500")
        }
        OffsetCommit::InTransaction => config.set("enable.auto.commit", "false"),
    };
    if args.group_protocol == GroupProtocol::Classic {
        // with KIP-848 these are the broker's to set (group.consumer.*), and librdkafka refuses
        // them; the classic protocol still takes them from the client
        config
            .set("session.timeout.ms", "10000")
            .set("heartbeat.interval.ms", "1000")
            .set("partition.assignment.strategy", "cooperative-sticky");
    }
    config
}

/// A reader outside any consumer loop (the dead-letter tools): `read_committed`, from the
/// earliest retained record; the caller sets the group and how offsets move.
pub fn base_consumer_settings(args: &KafkaArgs, client_id: &str) -> ClientConfig {
    let mut config = base(args, client_id);
    config.set("isolation.level", "read_committed").set("auto.offset.reset", "earliest");
    config
}

/// The admin client (topics): short-lived, and rdkafka polls only its admin queue, so it takes
/// no statistics (they would pile up unread on its main queue).
pub fn admin_config(args: &KafkaArgs, client_id: &str) -> ClientConfig {
    let mut config = base(args, client_id);
    config.set("statistics.interval.ms", "0");
    config
}
