//! Client settings: what every producer, consumer and admin client of pagamentos is built with.

use std::fmt;
use std::time::Duration;

use rdkafka::ClientConfig;

/// Where Kafka is and how groups rebalance; flattened into each command's arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct KafkaArgs {
    /// Kafka bootstrap servers, comma-separated host:port.
    #[arg(
        long = "kafka-bootstrap-servers",
        env = "KAFKA_BOOTSTRAP_SERVERS",
        default_value = "localhost:9092"
    )]
    pub bootstrap_servers: String,

    /// Consumer group protocol: `consumer` (KIP-848, the broker assigns partitions) or `classic`.
    #[arg(long = "kafka-group-protocol", env = "KAFKA_GROUP_PROTOCOL", value_enum, default_value_t = GroupProtocol::Consumer)]
    pub group_protocol: GroupProtocol,

    /// Prefix for every topic name and consumer group id (empty in production); lets several
    /// systems or tests share one cluster.
    #[arg(long = "topic-prefix", env = "PAGAMENTOS_TOPIC_PREFIX", default_value = "")]
    pub topic_prefix: String,
}

impl KafkaArgs {
    /// Connection to `bootstrap_servers` with the default group protocol and no prefix.
    pub fn new(bootstrap_servers: impl Into<String>) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.into(),
            group_protocol: GroupProtocol::Consumer,
            topic_prefix: String::new(),
        }
    }

    /// `name` behind the configured prefix.
    pub fn topic(&self, name: &str) -> String {
        format!("{}{name}", self.topic_prefix)
    }

    /// Consumer group `name` behind the same prefix, so isolated topic sets get isolated groups.
    pub fn group(&self, name: &str) -> String {
        format!("{}{name}", self.topic_prefix)
    }
}

/// How topics are laid out when `pagamentos topics` (or a service at start) creates them.
#[derive(Debug, Clone, clap::Args)]
pub struct TopicArgs {
    /// Partitions of every topic; `-dlt` and `-retry-*` topics get the same, so a dead letter
    /// can keep its original partition number.
    #[arg(long, env = "APP_KAFKA_PARTITIONS", default_value_t = 12, value_parser = clap::value_parser!(i32).range(1..=10_000))]
    pub partitions: i32,

    /// Replication factor (3 in production); `min.insync.replicas` is `min(2, replicas)`.
    #[arg(long, env = "APP_KAFKA_REPLICAS", default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=32_767))]
    pub replicas: i32,
}

impl TopicArgs {
    pub fn min_insync_replicas(&self) -> i32 {
        self.replicas.min(2)
    }
}

/// How each hop batches: `fast` is ours; `reference` reproduces the article's settings for
/// side-by-side benchmarks (relay polling every 200 ms with 100 rows and no wake-up, one Kafka
/// transaction per record, one database transaction per record, producer `linger.ms=5`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    Fast,
    Reference,
}

impl Profile {
    /// `linger.ms` of the plain producers (the relays, retry topics, dead letters); the
    /// article uses 5 ms. None in `fast`: a relay hands its producer a whole claimed batch at
    /// once, so there is nothing to wait for; librdkafka sends what is queued when its broker
    /// thread wakes. Interleaved runs on fresh databases against 1 ms, five rounds: 200/s p50
    /// lower in all five (median 25 vs 34 ms), flat out not lower (median 1 447 vs 1 229/s).
    pub fn linger(&self) -> Duration {
        match self {
            Self::Fast => Duration::ZERO,
            Self::Reference => Duration::from_millis(5),
        }
    }

    /// `linger.ms` of the antifraude's transactional producer: 1 ms in `fast`. With none, flat
    /// out was lower (median 1 270 vs 1 447/s with only the plain producers at none, same runs):
    /// its records go out as smaller requests inside the transaction.
    pub fn transaction_linger(&self) -> Duration {
        match self {
            Self::Fast => Duration::from_millis(1),
            Self::Reference => Duration::from_millis(5),
        }
    }
}

/// `group.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GroupProtocol {
    /// KIP-848: the group coordinator assigns partitions incrementally through heartbeats.
    Consumer,
    /// The pre-4.0 protocol, a fallback while librdkafka's KIP-848 support matures.
    Classic,
}

impl fmt::Display for GroupProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Consumer => "consumer",
            Self::Classic => "classic",
        })
    }
}

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

fn base(args: &KafkaArgs, client_id: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &args.bootstrap_servers)
        .set("client.id", client_id)
        // fail a metadata/produce request to a dead broker quickly enough to report it
        .set("socket.connection.setup.timeout.ms", "10000")
        .set("reconnect.backoff.max.ms", "2000")
        // re-bootstrap after 10 s of unanswered Metadata requests instead of librdkafka's 5 min.
        // It does not rescue a client that a Metadata answer naming no broker left with none
        // (librdkafka 2.12 drops every broker an answer leaves out, and starts this timer only
        // when it sends a request, which needs a broker): the statistics below do
        .set("metadata.recovery.rebootstrap.trigger.ms", "10000")
        // read by `crate::rebootstrap`: a client with no broker left adds its bootstrap servers
        .set("statistics.interval.ms", STATISTICS_INTERVAL.as_millis().to_string());
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
        // after a commit the coordinator answers the next transaction's first request with
        // CONCURRENT_TRANSACTIONS until its markers are written (a few ms); the default 100 ms
        // backoff put 10-50 ms on most transactions (docs/architecture.md). It applies to
        // AddOffsetsToTxn; librdkafka retries AddPartitionsToTxn after a fixed 20 ms
        .set("retry.backoff.ms", "2");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn producers_follow_the_contract() {
        let args = KafkaArgs::new("localhost:9092");
        let config = producer_config(&args, "test", Duration::from_millis(5));
        assert_eq!(config.get("acks"), Some("all"));
        assert_eq!(config.get("enable.idempotence"), Some("true"));
        assert_eq!(config.get("compression.type"), Some("zstd"));
        assert_eq!(config.get("delivery.timeout.ms"), Some("120000"));
        assert_eq!(config.get("partitioner"), Some("murmur2_random"));
        assert_eq!(config.get("linger.ms"), Some("5"));
        // read by `crate::rebootstrap`
        assert_eq!(config.get("statistics.interval.ms"), Some("10000"));
        assert_eq!(admin_config(&args, "test").get("statistics.interval.ms"), Some("0"));

        let tx = transactional_producer_config(&args, "test", "tx-antifraude-a", Duration::ZERO);
        assert_eq!(tx.get("transactional.id"), Some("tx-antifraude-a"));
        assert_eq!(tx.get("transaction.timeout.ms"), Some("10000"));
        assert_eq!(tx.get("delivery.timeout.ms"), Some("10000"));
        assert_eq!(tx.get("partitioner"), Some("murmur2_random"));
    }

    #[test]
    fn the_reference_profile_lingers_as_the_article_does() {
        for linger in [Profile::Reference.linger(), Profile::Reference.transaction_linger()] {
            assert_eq!(linger, Duration::from_millis(5));
        }
        assert_eq!(Profile::Fast.linger(), Duration::ZERO);
        assert!(Profile::Fast.transaction_linger() < Profile::Reference.transaction_linger());
    }

    #[test]
    fn consumers_never_move_offsets_on_their_own() {
        let mut args = KafkaArgs::new("localhost:9092");
        let config = consumer_config(&args, "test", "ledger", OffsetCommit::StoredAfterHandling);
        assert_eq!(config.get("isolation.level"), Some("read_committed"));
        assert_eq!(config.get("auto.offset.reset"), Some("earliest"));
        assert_eq!(config.get("enable.auto.offset.store"), Some("false"));
        assert_eq!(config.get("group.protocol"), Some("consumer"));
        assert_eq!(config.get("session.timeout.ms"), None);

        let tx = consumer_config(&args, "test", "antifraude", OffsetCommit::InTransaction);
        assert_eq!(tx.get("enable.auto.commit"), Some("false"));

        args.group_protocol = GroupProtocol::Classic;
        let classic = consumer_config(&args, "test", "ledger", OffsetCommit::StoredAfterHandling);
        assert_eq!(classic.get("group.protocol"), Some("classic"));
        assert_eq!(classic.get("session.timeout.ms"), Some("10000"));
    }

    #[test]
    fn min_insync_is_at_most_two() {
        let topics = |replicas| TopicArgs { partitions: 12, replicas };
        assert_eq!(topics(1).min_insync_replicas(), 1);
        assert_eq!(topics(2).min_insync_replicas(), 2);
        assert_eq!(topics(3).min_insync_replicas(), 2);
    }
}
