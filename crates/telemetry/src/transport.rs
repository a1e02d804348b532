//! Transport fails closed off the machine (`docs/reference/contract.md` §1): a command refuses to start when
//! a connection to a host that is not a loopback address would be plaintext or unverified,
//! naming the setting, unless it was started with `--insecure-transport`, which it then logs as
//! a warning and reports on `/readyz` (as `--insecure-no-auth`).
//!
//! What counts as unprotected is decided next to where each connection is configured
//! (`kafka::KafkaArgs::transport_exposures`, `database::transport_exposures`); this module
//! holds what they share: which hosts are loopback, the opt-in, and the refusal. No name is
//! resolved: a host name other than `localhost` is not loopback, whatever DNS would say.

use std::net::IpAddr;

/// Whether `host` is a loopback address: `localhost` (any case), `127.0.0.0/8`, `::1` (also
/// in brackets, and `::ffff:127.x.y.z`). Anything else, every other host name included, is
/// not: no name is resolved at start.
pub fn is_loopback(host: &str) -> bool {
    let host = host.trim();
    let host = host.strip_prefix('[').and_then(|inner| inner.strip_suffix(']')).unwrap_or(host);
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(address)) => address.is_loopback(),
        Ok(IpAddr::V6(address)) => {
            address.is_loopback() || address.to_ipv4_mapped().is_some_and(|mapped| mapped.is_loopback())
        }
        Err(_) => false,
    }
}

/// A connection that would leave the machine unprotected: what the setting names, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exposure {
    /// The setting that names the host, as an environment variable (`KAFKA_BOOTSTRAP_SERVERS`,
    /// `LEDGER_DATABASE_URL`).
    pub setting: &'static str,
    /// The address as configured (`host:port`, no credentials).
    pub address: String,
    /// Why the connection would be unprotected and what would protect it, e.g.
    /// `KAFKA_SECURITY_PROTOCOL is plaintext (ssl or sasl_ssl needed)`.
    pub why: String,
}

impl std::fmt::Display for Exposure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} names {}, not a loopback address, and {}", self.setting, self.address, self.why)
    }
}

/// The opt-in, flattened into every command that connects to Kafka or PostgreSQL.
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct TransportArgs {
    /// Accept plaintext Kafka (`KAFKA_SECURITY_PROTOCOL` other than `ssl`/`sasl_ssl`) or
    /// PostgreSQL below `sslmode=verify-full` to a host that is not a loopback address
    /// (127.0.0.0/8, ::1, localhost; host names are not resolved). Without it such a setting
    /// is refused at start, naming it; with it, a warning is logged at start and reported on
    /// `/readyz`. For networks you trust to carry passwords and money in the clear only.
    #[arg(
        long,
        env = "PAGAMENTOS_INSECURE_TRANSPORT",
        default_value_t = false,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    pub insecure_transport: bool,
}

/// Refused: connections off the machine that would be unprotected, without the opt-in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "refusing to connect off the machine unprotected: {}. Use KAFKA_SECURITY_PROTOCOL=ssl or sasl_ssl \
     and sslmode=verify-full (with sslrootcert) in the database URLs, or start with \
     --insecure-transport (PAGAMENTOS_INSECURE_TRANSPORT=true) to accept it",
    list(.0)
)]
pub struct InsecureTransport(pub Vec<Exposure>);

fn list(exposures: &[Exposure]) -> String {
    exposures.iter().map(Exposure::to_string).collect::<Vec<_>>().join("; ")
}

/// What `/readyz` and the log say of a command started with `--insecure-transport`.
pub fn warning(exposures: &[Exposure]) -> String {
    if exposures.is_empty() {
        "insecure transport allowed (--insecure-transport): no connection uses it now (every host is \
         loopback or protected)"
            .to_owned()
    } else {
        format!("insecure transport allowed (--insecure-transport): {}", list(exposures))
    }
}

impl TransportArgs {
    /// `Err` naming every one of `exposures` without the opt-in; with it, the warning to report
    /// on `/readyz` (also logged here, naming `command`). Nothing to report without the opt-in
    /// and nothing exposed.
    pub fn check(&self, command: &str, exposures: Vec<Exposure>) -> Result<Vec<String>, InsecureTransport> {
        if !self.insecure_transport {
            return if exposures.is_empty() { Ok(Vec::new()) } else { Err(InsecureTransport(exposures)) };
        }
        let warning = warning(&exposures);
        tracing::warn!(command, "{warning}");
        Ok(vec![warning])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_localhost_127_slash_8_and_ipv6_one() {
        for host in [
            "localhost",
            "LocalHost",
            "127.0.0.1",
            "127.0.0.53",
            "127.255.255.254",
            "::1",
            "[::1]",
            "0:0:0:0:0:0:0:1",
            "::ffff:127.0.0.1",
            " 127.0.0.1 ",
        ] {
            assert!(is_loopback(host), "{host}");
        }
    }

    #[test]
    fn every_other_host_is_off_the_machine_and_no_name_is_resolved() {
        for host in [
            "10.255.255.1",
            "192.168.0.10",
            "128.0.0.1",
            // the unspecified address is not loopback (even where a connection to it stays local)
            "0.0.0.0",
            "::",
            "[::]",
            "::2",
            "fe80::1",
            "::ffff:10.0.0.1",
            // names other than localhost, however they would resolve
            "kafka.internal",
            "localhost.localdomain",
            "localhost.",
            "my-localhost",
            "127.0.0.1.nip.io",
            "",
            "[::1",
            "::1%lo",
        ] {
            assert!(!is_loopback(host), "{host}");
        }
    }

    fn exposure(setting: &'static str, address: &str) -> Exposure {
        Exposure { setting, address: address.into(), why: "it is plaintext".into() }
    }

    #[test]
    fn without_the_opt_in_an_exposure_is_refused_naming_every_setting() {
        let refuse = TransportArgs { insecure_transport: false };
        assert_eq!(refuse.check("test", Vec::new()), Ok(Vec::new()), "nothing exposed: nothing to say");
        let exposures = vec![
            exposure("KAFKA_BOOTSTRAP_SERVERS", "10.0.0.1:9092"),
            exposure("LEDGER_DATABASE_URL", "db:5432"),
        ];
        let refusal = refuse.check("test", exposures.clone()).expect_err("refused");
        assert_eq!(refusal, InsecureTransport(exposures));
        let text = refusal.to_string();
        for part in [
            "KAFKA_BOOTSTRAP_SERVERS names 10.0.0.1:9092, not a loopback address, and it is plaintext",
            "LEDGER_DATABASE_URL names db:5432",
            "--insecure-transport (PAGAMENTOS_INSECURE_TRANSPORT=true)",
        ] {
            assert!(text.contains(part), "{part} not in {text}");
        }
    }

    #[test]
    fn with_the_opt_in_it_is_a_warning_whether_used_or_not() {
        let allow = TransportArgs { insecure_transport: true };
        let warnings =
            allow.check("test", vec![exposure("KAFKA_BOOTSTRAP_SERVERS", "10.0.0.1:9092")]).expect("allowed");
        assert_eq!(
            warnings,
            ["insecure transport allowed (--insecure-transport): KAFKA_BOOTSTRAP_SERVERS names 10.0.0.1:9092, \
              not a loopback address, and it is plaintext"]
        );
        let unused = allow.check("test", Vec::new()).expect("allowed");
        assert_eq!(unused.len(), 1);
        assert!(unused[0].starts_with("insecure transport allowed (--insecure-transport): no connection"));
    }

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        transport: TransportArgs,
    }

    #[test]
    fn the_opt_in_is_a_flag_or_an_explicit_bool() {
        use clap::Parser;
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("pagamentos").chain(args.iter().copied()))
                .map(|cli| cli.transport.insecure_transport)
        };
        assert_eq!(parse(&[]).ok(), Some(false));
        assert_eq!(parse(&["--insecure-transport"]).ok(), Some(true));
        assert_eq!(parse(&["--insecure-transport=false"]).ok(), Some(false));
        assert!(parse(&["--insecure-transport=maybe"]).is_err());
    }
}
