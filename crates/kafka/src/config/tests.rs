//! Unit tests of the client settings: what each client is built with, and how the flags parse.

use std::time::Duration;

use rdkafka::ClientConfig;

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
    assert_eq!(plaintext_off_machine("PLAINTEXT://10.0.0.1:9092", Plaintext), ["PLAINTEXT://10.0.0.1:9092"]);
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
