//! How every client reaches the brokers: TLS and SASL settings ([`KafkaSecurity`]), and which
//! bootstrap servers a protocol would reach in plaintext off the machine.

use std::fmt;
use std::path::PathBuf;

use rdkafka::ClientConfig;

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
