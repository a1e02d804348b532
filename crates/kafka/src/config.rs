//! Client settings: what every producer, consumer and admin client of pagamentos is built with.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use rdkafka::ClientConfig;
use telemetry::transport::Exposure;

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
    /// (`CONTRACT.md` §1, *Transport fails closed*): see [`plaintext_off_machine`]. Checked
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

/// The servers of `bootstrap_servers` (comma-separated `[proto://]host[:port]`, `[v6]:port`)
/// that `protocol` would reach in plaintext off the machine: none with TLS (`ssl`,
/// `sasl_ssl`, whose brokers' certificates librdkafka verifies against the host dialled);
/// else each one whose host is not a loopback address (`telemetry::transport::is_loopback`:
/// no name but `localhost` counts, nothing is resolved). SASL without TLS counts as plaintext:
/// the records, and with `PLAIN` the password, cross the network in the clear.
pub fn plaintext_off_machine(bootstrap_servers: &str, protocol: SecurityProtocol) -> Vec<String> {
    if protocol.uses_tls() {
        return Vec::new();
    }
    bootstrap_servers
        .split(',')
        .map(str::trim)
        .filter(|server| !server.is_empty())
        .filter(|server| !telemetry::transport::is_loopback(bootstrap_host(server)))
        .map(str::to_owned)
        .collect()
}

/// The host of one bootstrap server: `host`, `host:port`, `[v6]:port` or a bare IPv6 address,
/// after an optional `proto://` (which librdkafka accepts and checks against
/// `security.protocol`).
fn bootstrap_host(server: &str) -> &str {
    let server = server.split_once("://").map_or(server, |(_, rest)| rest);
    if server.starts_with('[') {
        // `[v6]` or `[v6]:port`: the brackets go to `is_loopback`, which takes them off
        return server.find(']').map_or(server, |end| &server[..=end]);
    }
    match server.matches(':').count() {
        1 => server.split_once(':').map_or(server, |(host, _port)| host),
        // a host alone, or an IPv6 address without brackets (and so without a port)
        _ => server,
    }
}

/// How every client reaches the brokers: TLS and SASL (CONTRACT §1, *Kafka security*).
///
/// `Debug` shows whether a password is set, never the password.
#[derive(Clone, Default, clap::Args)]
pub struct KafkaSecurity {
    /// `plaintext`, `ssl` (TLS), `sasl_plaintext` (SASL without TLS: test clusters only) or
    /// `sasl_ssl` (SASL over TLS, what production uses).
    #[arg(
        long = "kafka-security-protocol",
        env = "KAFKA_SECURITY_PROTOCOL",
        value_enum,
        ignore_case = true,
        default_value_t = SecurityProtocol::Plaintext
    )]
    pub protocol: SecurityProtocol,

    /// SASL mechanism, with `sasl_plaintext` or `sasl_ssl`.
    #[arg(
        long = "kafka-sasl-mechanism",
        env = "KAFKA_SASL_MECHANISM",
        value_enum,
        ignore_case = true,
        default_value_t = SaslMechanism::ScramSha512
    )]
    pub sasl_mechanism: SaslMechanism,

    /// SASL user of this service (required with `sasl_plaintext` and `sasl_ssl`).
    #[arg(
        long = "kafka-sasl-username",
        env = "KAFKA_SASL_USERNAME",
        required_if_eq_any = [("protocol", "sasl_plaintext"), ("protocol", "sasl_ssl")]
    )]
    pub sasl_username: Option<String>,

    /// SASL password (required with `sasl_plaintext` and `sasl_ssl`); give it through the
    /// environment, not the command line, which other users of the host can read.
    #[arg(
        long = "kafka-sasl-password",
        env = "KAFKA_SASL_PASSWORD",
        hide_env_values = true,
        required_if_eq_any = [("protocol", "sasl_plaintext"), ("protocol", "sasl_ssl")]
    )]
    pub sasl_password: Option<String>,

    /// PEM file of the CA(s) that signed the brokers' certificates (`ssl`, `sasl_ssl`); unset =
    /// the system's trust store. The broker's host name is verified against its certificate.
    #[arg(long = "kafka-ssl-ca-location", env = "KAFKA_SSL_CA_LOCATION")]
    pub ssl_ca_location: Option<PathBuf>,

    /// PEM client certificate, for brokers that require mutual TLS (with the key below).
    #[arg(
        long = "kafka-ssl-certificate-location",
        env = "KAFKA_SSL_CERTIFICATE_LOCATION",
        requires = "ssl_key_location"
    )]
    pub ssl_certificate_location: Option<PathBuf>,

    /// PEM private key of the client certificate.
    #[arg(
        long = "kafka-ssl-key-location",
        env = "KAFKA_SSL_KEY_LOCATION",
        requires = "ssl_certificate_location"
    )]
    pub ssl_key_location: Option<PathBuf>,

    /// Password of an encrypted client key.
    #[arg(long = "kafka-ssl-key-password", env = "KAFKA_SSL_KEY_PASSWORD", hide_env_values = true)]
    pub ssl_key_password: Option<String>,
}

impl fmt::Debug for KafkaSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hidden = |secret: &Option<String>| secret.as_ref().map(|_| "<redacted>");
        f.debug_struct("KafkaSecurity")
            .field("protocol", &self.protocol)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .field("sasl_password", &hidden(&self.sasl_password))
            .field("ssl_ca_location", &self.ssl_ca_location)
            .field("ssl_certificate_location", &self.ssl_certificate_location)
            .field("ssl_key_location", &self.ssl_key_location)
            .field("ssl_key_password", &hidden(&self.ssl_key_password))
            .finish()
    }
}

impl KafkaSecurity {
    /// SASL over TLS as `username`, trusting the CA in `ca_location`.
    pub fn sasl_ssl(
        username: impl Into<String>,
        password: impl Into<String>,
        ca_location: impl Into<PathBuf>,
    ) -> Self {
        Self {
            protocol: SecurityProtocol::SaslSsl,
            sasl_username: Some(username.into()),
            sasl_password: Some(password.into()),
            ssl_ca_location: Some(ca_location.into()),
            ..Self::default()
        }
    }

    /// The environment variables that give a child process these settings (`pagamentos` reads
    /// them as the fallbacks of its flags).
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let path = |path: &PathBuf| path.to_string_lossy().into_owned();
        let mut env = vec![
            ("KAFKA_SECURITY_PROTOCOL", self.protocol.to_string()),
            ("KAFKA_SASL_MECHANISM", self.sasl_mechanism.to_string()),
        ];
        let optional = [
            ("KAFKA_SASL_USERNAME", self.sasl_username.clone()),
            ("KAFKA_SASL_PASSWORD", self.sasl_password.clone()),
            ("KAFKA_SSL_CA_LOCATION", self.ssl_ca_location.as_ref().map(path)),
            ("KAFKA_SSL_CERTIFICATE_LOCATION", self.ssl_certificate_location.as_ref().map(path)),
            ("KAFKA_SSL_KEY_LOCATION", self.ssl_key_location.as_ref().map(path)),
            ("KAFKA_SSL_KEY_PASSWORD", self.ssl_key_password.clone()),
        ];
        env.extend(optional.into_iter().filter_map(|(name, value)| Some((name, value?))));
        env
    }

    /// Sets librdkafka's `security.protocol`, `sasl.*` and `ssl.*` properties on `config`.
    pub fn apply(&self, config: &mut ClientConfig) {
        config.set("security.protocol", self.protocol.to_string());
        if self.protocol.uses_sasl() {
            config.set("sasl.mechanisms", self.sasl_mechanism.to_string());
            if let Some(username) = &self.sasl_username {
                config.set("sasl.username", username);
            }
            if let Some(password) = &self.sasl_password {
                config.set("sasl.password", password);
            }
        }
        if self.protocol.uses_tls() {
            let path = |path: &PathBuf| path.to_string_lossy().into_owned();
            if let Some(ca) = &self.ssl_ca_location {
                config.set("ssl.ca.location", path(ca));
            }
            if let Some(certificate) = &self.ssl_certificate_location {
                config.set("ssl.certificate.location", path(certificate));
            }
            if let Some(key) = &self.ssl_key_location {
                config.set("ssl.key.location", path(key));
            }
            if let Some(password) = &self.ssl_key_password {
                config.set("ssl.key.password", password);
            }
        }
    }
}

/// `security.protocol`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SecurityProtocol {
    #[default]
    #[value(name = "plaintext")]
    Plaintext,
    #[value(name = "ssl")]
    Ssl,
    #[value(name = "sasl_plaintext")]
    SaslPlaintext,
    #[value(name = "sasl_ssl")]
    SaslSsl,
}

impl SecurityProtocol {
    pub fn uses_sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }

    pub fn uses_tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }
}

impl fmt::Display for SecurityProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Plaintext => "plaintext",
            Self::Ssl => "ssl",
            Self::SaslPlaintext => "sasl_plaintext",
            Self::SaslSsl => "sasl_ssl",
        })
    }
}

/// `sasl.mechanisms`: the SCRAM variants and PLAIN (which sends the password itself, so only
/// over TLS).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SaslMechanism {
    #[default]
    #[value(name = "SCRAM-SHA-512")]
    ScramSha512,
    #[value(name = "SCRAM-SHA-256")]
    ScramSha256,
    #[value(name = "PLAIN")]
    Plain,
}

impl fmt::Display for SaslMechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ScramSha512 => "SCRAM-SHA-512",
            Self::ScramSha256 => "SCRAM-SHA-256",
            Self::Plain => "PLAIN",
        })
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

    /// Every kind of client this module builds.
    fn every_client(args: &KafkaArgs) -> Vec<(&'static str, ClientConfig)> {
        vec![
            ("producer", producer_config(args, "test", Duration::ZERO)),
            ("transactional", transactional_producer_config(args, "test", "tx-a", Duration::ZERO)),
            ("consumer", consumer_config(args, "test", "group", OffsetCommit::StoredAfterHandling)),
            ("dead-letter reader", base_consumer_settings(args, "test")),
            ("admin", admin_config(args, "test")),
        ]
    }

    #[test]
    fn a_silent_broker_costs_every_client_seconds_not_a_minute() {
        let args = KafkaArgs::new("localhost:9092");
        for (kind, config) in every_client(&args) {
            assert_eq!(config.get("socket.timeout.ms"), Some("5000"), "{kind}");
            assert_eq!(config.get("topic.metadata.refresh.interval.ms"), Some("5000"), "{kind}");
            // one disconnect per timed-out request (librdkafka's default, kept): the connection
            // to a silent broker is dropped at the first time-out, which triggers the refresh
            assert_eq!(config.get("socket.max.fails"), None, "{kind}");
        }
        // librdkafka refuses a transactional producer whose requests may outlive its
        // transaction (socket.timeout.ms above transaction.timeout.ms + 100): it is created
        let tx = transactional_producer_config(&args, "test", "tx-a", Duration::ZERO);
        assert_eq!(tx.get("transaction.timeout.ms"), Some("10000"));
        tx.create::<rdkafka::producer::BaseProducer>().expect("librdkafka takes the transactional settings");
        consumer_config(&args, "test", "group", OffsetCommit::StoredAfterHandling)
            .create::<rdkafka::consumer::BaseConsumer>()
            .expect("librdkafka takes the consumer settings");
    }

    #[test]
    fn sasl_over_tls_reaches_every_client() {
        let mut args = KafkaArgs::new("localhost:9094");
        args.security = KafkaSecurity::sasl_ssl("ledger", "s3cret", "/etc/kafka/ca.pem");
        for (kind, config) in every_client(&args) {
            assert_eq!(config.get("security.protocol"), Some("sasl_ssl"), "{kind}");
            assert_eq!(config.get("sasl.mechanisms"), Some("SCRAM-SHA-512"), "{kind}");
            assert_eq!(config.get("sasl.username"), Some("ledger"), "{kind}");
            assert_eq!(config.get("sasl.password"), Some("s3cret"), "{kind}");
            assert_eq!(config.get("ssl.ca.location"), Some("/etc/kafka/ca.pem"), "{kind}");
            // librdkafka's default: the broker's certificate must name the host we dialled
            assert_eq!(config.get("ssl.endpoint.identification.algorithm"), None, "{kind}");
        }
    }

    #[test]
    fn plaintext_by_default_and_tls_settings_only_with_tls() {
        for (kind, config) in every_client(&KafkaArgs::new("localhost:9092")) {
            assert_eq!(config.get("security.protocol"), Some("plaintext"), "{kind}");
            assert_eq!(config.get("sasl.mechanisms"), None, "{kind}");
            assert_eq!(config.get("ssl.ca.location"), None, "{kind}");
        }
        let mut args = KafkaArgs::new("localhost:9093");
        args.security = KafkaSecurity {
            protocol: SecurityProtocol::Ssl,
            ssl_ca_location: Some("ca.pem".into()),
            ssl_certificate_location: Some("client.pem".into()),
            ssl_key_location: Some("client.key".into()),
            ssl_key_password: Some("key-pass".into()),
            ..KafkaSecurity::default()
        };
        let config = producer_config(&args, "test", Duration::ZERO);
        assert_eq!(config.get("security.protocol"), Some("ssl"));
        assert_eq!(config.get("ssl.certificate.location"), Some("client.pem"));
        assert_eq!(config.get("ssl.key.location"), Some("client.key"));
        assert_eq!(config.get("ssl.key.password"), Some("key-pass"));
        assert_eq!(config.get("sasl.mechanisms"), None);
    }

    #[test]
    fn debug_never_shows_a_password() {
        let mut args = KafkaArgs::new("localhost:9094");
        args.security = KafkaSecurity::sasl_ssl("ledger", "s3cret-sasl", "ca.pem");
        args.security.ssl_key_password = Some("s3cret-key".into());
        let shown = format!("{args:?}");
        assert!(shown.contains("ledger") && shown.contains("<redacted>"), "{shown}");
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        kafka: KafkaArgs,
    }

    fn parse(args: &[&str]) -> Result<KafkaArgs, String> {
        use clap::Parser;
        Cli::try_parse_from(std::iter::once("pagamentos").chain(args.iter().copied()))
            .map(|cli| cli.kafka)
            .map_err(|error| error.to_string())
    }

    #[test]
    fn sasl_without_credentials_is_refused_at_start() {
        for protocol in ["sasl_ssl", "SASL_SSL", "sasl_plaintext"] {
            let error = parse(&["--kafka-security-protocol", protocol]).expect_err(protocol);
            assert!(error.contains("--kafka-sasl-username"), "{protocol}: {error}");
            assert!(error.contains("--kafka-sasl-password"), "{protocol}: {error}");
            let error = parse(&["--kafka-security-protocol", protocol, "--kafka-sasl-username", "u"])
                .expect_err(protocol);
            assert!(error.contains("--kafka-sasl-password"), "{protocol}: {error}");
        }
        let args = parse(&[
            "--kafka-security-protocol",
            "SASL_SSL",
            "--kafka-sasl-mechanism",
            "scram-sha-256",
            "--kafka-sasl-username",
            "antifraude",
            "--kafka-sasl-password",
            "p",
        ])
        .expect("complete SASL settings");
        assert_eq!(args.security.protocol, SecurityProtocol::SaslSsl);
        assert_eq!(args.security.sasl_mechanism, SaslMechanism::ScramSha256);
        // TLS alone, or nothing, needs no credentials
        assert_eq!(
            parse(&["--kafka-security-protocol", "ssl"]).expect("ssl").security.protocol,
            SecurityProtocol::Ssl
        );
        assert_eq!(parse(&[]).expect("defaults").security.sasl_mechanism, SaslMechanism::ScramSha512);
        assert!(parse(&["--kafka-security-protocol", "tls"]).is_err());
    }

    #[test]
    fn a_client_certificate_needs_its_key() {
        let error = parse(&["--kafka-security-protocol", "ssl", "--kafka-ssl-certificate-location", "c.pem"])
            .expect_err("certificate without key");
        assert!(error.contains("--kafka-ssl-key-location"), "{error}");
    }

    #[test]
    fn child_processes_get_the_same_settings() {
        let security = KafkaSecurity::sasl_ssl("ledger", "p", "/ca.pem");
        let env = security.to_env();
        let get = |name: &str| env.iter().find(|(key, _)| *key == name).map(|(_, value)| value.as_str());
        assert_eq!(get("KAFKA_SECURITY_PROTOCOL"), Some("sasl_ssl"));
        assert_eq!(get("KAFKA_SASL_MECHANISM"), Some("SCRAM-SHA-512"));
        assert_eq!(get("KAFKA_SASL_USERNAME"), Some("ledger"));
        assert_eq!(get("KAFKA_SASL_PASSWORD"), Some("p"));
        assert_eq!(get("KAFKA_SSL_CA_LOCATION"), Some("/ca.pem"));
        assert_eq!(get("KAFKA_SSL_KEY_LOCATION"), None);
    }

    #[test]
    fn plaintext_is_refused_off_the_machine_only() {
        use SecurityProtocol::*;
        let loopback = "localhost:9092,127.0.0.1:9093,127.0.0.53:9094,[::1]:9095,::1,LOCALHOST";
        let off = "10.255.255.1:9092";
        for protocol in [Plaintext, SaslPlaintext] {
            assert_eq!(plaintext_off_machine(loopback, protocol), Vec::<String>::new(), "{protocol}");
            assert_eq!(plaintext_off_machine(off, protocol), [off], "{protocol}");
            // one server off the machine in a list is enough, and only it is named
            assert_eq!(
                plaintext_off_machine(" localhost:9092 , kafka-2.internal:9092,[fe80::1]:9092,", protocol),
                ["kafka-2.internal:9092", "[fe80::1]:9092"],
                "{protocol}"
            );
        }
        for protocol in [Ssl, SaslSsl] {
            for servers in [loopback, off, "kafka.internal:9093,10.0.0.1:9093"] {
                assert!(plaintext_off_machine(servers, protocol).is_empty(), "{protocol} {servers}");
            }
        }
        // no name but localhost counts, however it would resolve; nor the unspecified address
        for host in ["localhost.localdomain:9092", "vm:9092", "0.0.0.0:9092", "[::]:9092", "kafka"] {
            assert_eq!(plaintext_off_machine(host, Plaintext), [host]);
        }
        assert!(plaintext_off_machine("PLAINTEXT://127.0.0.1:9092", Plaintext).is_empty());
        assert_eq!(
            plaintext_off_machine("PLAINTEXT://10.0.0.1:9092", Plaintext),
            ["PLAINTEXT://10.0.0.1:9092"]
        );
    }

    #[test]
    fn the_exposure_names_the_setting_and_the_protocol() {
        let mut args = KafkaArgs::new("127.0.0.1:9092,10.255.255.1:9092");
        args.security.protocol = SecurityProtocol::SaslPlaintext;
        let exposures = args.transport_exposures();
        assert_eq!(exposures.len(), 1);
        assert_eq!(
            exposures[0].to_string(),
            "KAFKA_BOOTSTRAP_SERVERS names 10.255.255.1:9092, not a loopback address, and \
             KAFKA_SECURITY_PROTOCOL is sasl_plaintext (ssl or sasl_ssl needed)"
        );
        args.security = KafkaSecurity::sasl_ssl("ledger", "p", "ca.pem");
        assert!(args.transport_exposures().is_empty());
        assert!(KafkaArgs::new("localhost:9092").transport_exposures().is_empty(), "the default");
    }

    #[test]
    fn min_insync_is_at_most_two() {
        let topics = |replicas| TopicArgs { partitions: 12, replicas };
        assert_eq!(topics(1).min_insync_replicas(), 1);
        assert_eq!(topics(2).min_insync_replicas(), 2);
        assert_eq!(topics(3).min_insync_replicas(), 2);
    }
}
