//! What the share-group mode needs from `krafka` besides the consumer loop: a connection with
//! the same security settings every other client of pagamentos uses (`kafka::KafkaSecurity`,
//! librdkafka's `security.protocol`, `sasl.*`, `ssl.*`), the share group's own configuration
//! (set through the admin API when the service starts), and each record as the `rdkafka`
//! message the notifier and the dead-letter code already take.

use std::time::Duration;

use krafka::admin::{ConfigOp, ConfigResource, IncrementalAlterConfigsOptions};
use krafka::auth::{AuthConfig, TlsConfig};
use krafka::{ConsumerRecord, Kafka};

use kafka::rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};
use kafka::{KafkaArgs, KafkaSecurity, SaslMechanism, SecurityProtocol};

use super::Error;

/// How long a broker may take to answer a request: krafka's default, 30 s, kept. The rdkafka
/// clients use 5 s (`kafka::config::SOCKET_TIMEOUT`) so that a broker cut off the network costs
/// seconds; the share group under such a cut was not measured with a shorter one.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Connecting to a broker, as the other clients (`kafka::config`: 15 s to fail at start).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// A connection to the cluster of `args`, as `client_id`, with `args`' security settings.
pub(crate) async fn connect(args: &KafkaArgs, client_id: &str) -> Result<Kafka, Error> {
    Kafka::builder(args.bootstrap_servers.clone())
        .client_id(client_id)
        .security(auth(&args.security)?)
        .request_timeout(REQUEST_TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT)
        .connect()
        .await
        .map_err(|source| Error::Connect { bootstrap: args.bootstrap_servers.clone(), source })
}

/// `security` in krafka's terms. Every setting of `kafka::KafkaSecurity` has a counterpart,
/// so nothing is refused; the trust store without `KAFKA_SSL_CA_LOCATION` is the system's, as
/// librdkafka's, and the broker's host name is verified against its certificate.
pub(crate) fn auth(security: &KafkaSecurity) -> Result<AuthConfig, Error> {
    let credentials = || -> Result<(String, String), Error> {
        match (&security.sasl_username, &security.sasl_password) {
            (Some(username), Some(password)) => Ok((username.clone(), password.clone())),
            _ => Err(Error::Security(
                "KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD are required with a SASL security protocol"
                    .into(),
            )),
        }
    };
    let sasl = |(username, password): (String, String)| match security.sasl_mechanism {
        SaslMechanism::ScramSha512 => AuthConfig::sasl_scram_sha512(username, password),
        SaslMechanism::ScramSha256 => AuthConfig::sasl_scram_sha256(username, password),
        SaslMechanism::Plain => AuthConfig::sasl_plain(username, password),
    };
    Ok(match security.protocol {
        SecurityProtocol::Plaintext => AuthConfig::plaintext(),
        SecurityProtocol::SaslPlaintext => sasl(credentials()?),
        SecurityProtocol::Ssl => AuthConfig::ssl(tls(security)?),
        SecurityProtocol::SaslSsl => sasl(credentials()?).with_tls(tls(security)?),
    })
}

fn tls(security: &KafkaSecurity) -> Result<TlsConfig, Error> {
    let path = |path: &std::path::PathBuf| path.to_string_lossy().into_owned();
    let mut tls = match &security.ssl_ca_location {
        // only this CA, as librdkafka's ssl.ca.location
        Some(ca) => TlsConfig::new().with_ca_cert(path(ca)),
        None => TlsConfig::new().with_native_roots(),
    };
    match (&security.ssl_certificate_location, &security.ssl_key_location) {
        (Some(certificate), Some(key)) => tls = tls.with_client_cert(path(certificate), path(key)),
        (None, None) => {}
        _ => {
            return Err(Error::Security(
                "KAFKA_SSL_CERTIFICATE_LOCATION and KAFKA_SSL_KEY_LOCATION go together".into(),
            ))
        }
    }
    if let Some(password) = &security.ssl_key_password {
        tls = tls.with_client_key_password(password.clone());
    }
    Ok(tls)
}

/// Sets the share group's configuration (KIP-932 group configs): every record is delivered
/// at most `delivery_count_limit` times, and a group without a start offset for a partition
/// starts from its beginning (`auto.offset.reset=earliest`, as every consumer of the
/// contract; a share group's default is `latest`).
pub(crate) async fn configure_group(
    kafka: &Kafka,
    group: &str,
    delivery_count_limit: u32,
) -> Result<(), Error> {
    let settings = vec![
        ConfigOp::set("share.delivery.count.limit", delivery_count_limit.to_string()),
        ConfigOp::set("share.auto.offset.reset", "earliest"),
    ];
    let results = kafka
        .admin()
        .incremental_alter_configs(
            [(ConfigResource::group(group), settings)],
            IncrementalAlterConfigsOptions::default(),
        )
        .await
        .map_err(|source| Error::GroupConfig { group: group.to_owned(), source })?;
    for (_, result) in results {
        result.map_err(|source| Error::GroupConfig { group: group.to_owned(), source })?;
    }
    Ok(())
}

/// `record` as the `rdkafka` message the notifier and `kafka::retry_topic::forwarded` take:
/// the same topic, partition, offset, key, payload, timestamp (and its type) and every header
/// in order.
pub(crate) fn to_message(record: &ConsumerRecord) -> OwnedMessage {
    let timestamp = match record.timestamp_type {
        krafka::TimestampType::LogAppendTime => Timestamp::LogAppendTime(record.timestamp),
        _ => Timestamp::CreateTime(record.timestamp),
    };
    let headers = (!record.headers.is_empty()).then(|| {
        record.headers.iter().fold(
            OwnedHeaders::new_with_capacity(record.headers.len()),
            |headers, (key, value)| {
                headers.insert(Header { key: key.as_str(), value: value.as_ref().map(|value| &value[..]) })
            },
        )
    });
    OwnedMessage::new(
        record.value.as_ref().map(|value| value.to_vec()),
        record.key.as_ref().map(|key| key.to_vec()),
        record.topic.to_string(),
        timestamp,
        record.partition,
        record.offset,
        headers,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka::rdkafka::message::{Headers, Message};

    #[test]
    fn a_record_keeps_everything_the_dead_letter_needs() {
        let mut record = ConsumerRecord::new(
            "p.transferencias.liquidada",
            2,
            41,
            Some(bytes_of("CC-1")),
            Some(bytes_of("{\"eventoId\":\"x\"}")),
        );
        record.timestamp = 1_800_000_000_000;
        record.headers = vec![
            ("traceparent".into(), Some(bytes_of("00-abc-def-01"))),
            ("retry_topic-attempts".into(), Some(bytes_of("\0\0\0\x02"))),
            ("retry_topic-attempts".into(), Some(bytes_of("\0\0\0\x03"))),
            ("empty".into(), None),
        ];
        let message = to_message(&record);
        assert_eq!(message.topic(), "p.transferencias.liquidada");
        assert_eq!((message.partition(), message.offset()), (2, 41));
        assert_eq!(message.key(), Some(&b"CC-1"[..]));
        assert_eq!(message.payload(), Some(&b"{\"eventoId\":\"x\"}"[..]));
        assert_eq!(message.timestamp(), Timestamp::CreateTime(1_800_000_000_000));
        let headers = message.headers().expect("headers");
        let all: Vec<(&str, Option<&[u8]>)> =
            headers.iter().map(|header| (header.key, header.value)).collect();
        assert_eq!(
            all,
            [
                ("traceparent", Some(&b"00-abc-def-01"[..])),
                ("retry_topic-attempts", Some(&b"\0\0\0\x02"[..])),
                ("retry_topic-attempts", Some(&b"\0\0\0\x03"[..])),
                ("empty", None),
            ]
        );
        // the last value is the one readers take
        assert_eq!(kafka::consumer::header(&message, "retry_topic-attempts"), Some(&b"\0\0\0\x03"[..]));

        record.timestamp_type = krafka::TimestampType::LogAppendTime;
        assert_eq!(to_message(&record).timestamp(), Timestamp::LogAppendTime(1_800_000_000_000));
    }

    fn bytes_of<B: From<Vec<u8>>>(text: &str) -> B {
        B::from(text.as_bytes().to_vec())
    }

    #[test]
    fn every_security_setting_has_a_krafka_counterpart() {
        let plain = auth(&KafkaSecurity::default()).expect("plaintext");
        assert_eq!(plain.security_protocol(), &krafka::auth::SecurityProtocol::Plaintext);

        let secure = KafkaSecurity::sasl_ssl("notificacoes", "pw", "/etc/kafka/ca.pem");
        let config = auth(&secure).expect("sasl_ssl");
        assert_eq!(config.security_protocol(), &krafka::auth::SecurityProtocol::SaslSsl);
        assert_eq!(config.sasl_mechanism(), Some(&krafka::auth::SaslMechanism::ScramSha512));
        assert_eq!(config.tls_config().and_then(TlsConfig::ca_cert_path), Some("/etc/kafka/ca.pem"));

        let sha256 = KafkaSecurity {
            protocol: SecurityProtocol::SaslPlaintext,
            sasl_mechanism: SaslMechanism::ScramSha256,
            ..secure.clone()
        };
        let config = auth(&sha256).expect("sasl_plaintext");
        assert_eq!(config.security_protocol(), &krafka::auth::SecurityProtocol::SaslPlaintext);
        assert_eq!(config.sasl_mechanism(), Some(&krafka::auth::SaslMechanism::ScramSha256));

        let mutual = KafkaSecurity {
            protocol: SecurityProtocol::Ssl,
            ssl_ca_location: None,
            ssl_certificate_location: Some("/c.pem".into()),
            ssl_key_location: Some("/k.pem".into()),
            ..KafkaSecurity::default()
        };
        let config = auth(&mutual).expect("ssl");
        let tls = config.tls_config().expect("tls");
        assert!(tls.use_native_roots(), "no CA given: the system's trust store");
        assert_eq!(tls.client_cert_path(), Some("/c.pem"));
        assert_eq!(tls.client_key_path(), Some("/k.pem"));

        let no_password = KafkaSecurity { sasl_password: None, ..secure };
        assert!(matches!(auth(&no_password), Err(Error::Security(_))));
    }
}
