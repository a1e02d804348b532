//! Client settings: what every producer, consumer and admin client of pagamentos is built with.
//!
//! # Layout
//! - here: the command-line settings ([`KafkaArgs`], [`TopicArgs`], [`Profile`], [`GroupProtocol`]).
//! - `security`: how clients reach the brokers ([`KafkaSecurity`]: TLS, SASL), and which
//!   bootstrap servers would be reached in plaintext off the machine.
//! - `clients`: the librdkafka configuration of each kind of client ([`producer_config`],
//!   [`consumer_config`], …) and the timeouts they share.

use std::fmt;
use std::time::Duration;

use telemetry::transport::Exposure;

mod clients;
mod security;

pub use clients::{
    admin_config, base_consumer_settings, consumer_config, producer_config, transactional_producer_config,
    OffsetCommit, CONNECTION_SETUP_TIMEOUT, DELIVERY_TIMEOUT, METADATA_REFRESH_INTERVAL,
    RECONNECT_BACKOFF_MAX, SOCKET_TIMEOUT, STATISTICS_INTERVAL, TRANSACTION_RETRY_BACKOFF,
    TRANSACTION_TIMEOUT,
};
pub use security::{plaintext_off_machine, KafkaSecurity, SaslMechanism, SecurityProtocol};

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

    #[command(flatten)]
    pub security: KafkaSecurity,
}

impl KafkaArgs {
    /// Connection to `bootstrap_servers` with the default group protocol and no prefix.
    pub fn new(bootstrap_servers: impl Into<String>) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.into(),
            group_protocol: GroupProtocol::Consumer,
            topic_prefix: String::new(),
            security: KafkaSecurity::default(),
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

    /// The bootstrap servers every client would reach in plaintext off the machine
    /// (`docs/reference/contract.md` §1, *Transport fails closed*): see [`plaintext_off_machine`]. Checked
    /// where each command starts, before any client exists.
    pub fn transport_exposures(&self) -> Vec<Exposure> {
        let protocol = self.security.protocol;
        plaintext_off_machine(&self.bootstrap_servers, protocol)
            .into_iter()
            .map(|address| Exposure {
                setting: "KAFKA_BOOTSTRAP_SERVERS",
                address,
                why: format!("KAFKA_SECURITY_PROTOCOL is {protocol} (ssl or sasl_ssl needed)"),
            })
            .collect()
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

    /// `linger.ms` of antifraude's transactional producer on confluent-kafka (issue #45): none
    /// in `fast`. The Java client's accumulator holds a batch for the whole linger before its
    /// sender takes it, where librdkafka's transactional sends took as long with 1 ms as with
    /// none: at 200/s the produce step's p50 was 2.9 ms with 1 ms and 0.66 ms with none
    /// (librdkafka 1.8 ms either way; `client_bench`, docs/architecture.md "Kafka clients").
    pub fn confluent_transaction_linger(&self) -> Duration {
        match self {
            Self::Fast => Duration::ZERO,
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

#[cfg(test)]
mod tests;
