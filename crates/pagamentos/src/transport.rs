//! Transport fails closed off the machine (`docs/reference/contract.md` §1): every command that connects to
//! Kafka or PostgreSQL checks, where it starts and before anything connects, that no
//! connection to a host that is not a loopback address would be plaintext (Kafka without
//! `ssl`/`sasl_ssl`) or unverified (PostgreSQL below `sslmode=verify-full`), and refuses to
//! start naming the setting, unless started with `--insecure-transport`
//! ([`telemetry::transport::TransportArgs`]). The rules are the connections' own
//! ([`kafka::KafkaArgs::transport_exposures`], [`::database::transport_exposures`]); `loadgen`
//! talks HTTP only and has no check.

use kafka::KafkaArgs;
use telemetry::transport::TransportArgs;

/// The check of `command`, which connects to the Kafka of `kafka` (if any) and to each database
/// of `databases` (setting name, URL): `Err` naming every unprotected connection off the
/// machine without the opt-in; with it, the warnings to report on `/readyz` (already logged).
pub fn check(
    command: &str,
    transport: &TransportArgs,
    kafka: Option<&KafkaArgs>,
    databases: &[(&'static str, &str)],
) -> anyhow::Result<Vec<String>> {
    let mut exposures = kafka.map(KafkaArgs::transport_exposures).unwrap_or_default();
    for (setting, url) in databases {
        exposures.extend(::database::transport_exposures(setting, url)?);
    }
    Ok(transport.check(command, exposures)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFUSE: TransportArgs = TransportArgs { insecure_transport: false };
    const ALLOW: TransportArgs = TransportArgs { insecure_transport: true };

    #[test]
    fn kafka_and_every_database_are_checked_together() {
        let local = KafkaArgs::new("localhost:9092");
        let remote = KafkaArgs::new("10.255.255.1:9092");
        let local_db = "postgres://ledger_app:pw@localhost:5432/ledger";
        let remote_db = "postgres://ledger_app:pw@db.internal:5432/ledger?sslmode=require";
        let verified_db = "postgres://ledger_app:pw@db.internal:5432/ledger?sslmode=verify-full";

        assert!(check("ledger", &REFUSE, Some(&local), &[("LEDGER_DATABASE_URL", local_db)])
            .expect("loopback needs no opt-in")
            .is_empty());
        assert!(check("verify", &REFUSE, None, &[("LEDGER_DATABASE_URL", verified_db)])
            .expect("verify-full needs no opt-in")
            .is_empty());

        let refusal = check(
            "all",
            &REFUSE,
            Some(&remote),
            &[("TRANSFERENCIAS_DATABASE_URL", local_db), ("LEDGER_DATABASE_URL", remote_db)],
        )
        .expect_err("refused")
        .to_string();
        assert!(refusal.contains("KAFKA_BOOTSTRAP_SERVERS names 10.255.255.1:9092"), "{refusal}");
        assert!(refusal.contains("LEDGER_DATABASE_URL names db.internal:5432"), "{refusal}");
        assert!(!refusal.contains("TRANSFERENCIAS_DATABASE_URL"), "{refusal}");
        assert!(!refusal.contains("pw"), "no password in the refusal: {refusal}");

        let warnings =
            check("all", &ALLOW, Some(&remote), &[("LEDGER_DATABASE_URL", remote_db)]).expect("opted in");
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].contains("KAFKA_BOOTSTRAP_SERVERS") && warnings[0].contains("LEDGER_DATABASE_URL")
        );

        let error =
            check("verify", &ALLOW, None, &[("LEDGER_DATABASE_URL", "not a url")]).expect_err("bad URL");
        assert!(error.to_string().contains("LEDGER_DATABASE_URL"), "{error}");
    }
}
