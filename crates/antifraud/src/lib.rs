//! `pagamentos antifraude`: every `TransferenciaSolicitada` becomes exactly one committed
//! `TransferenciaAnalisada` or `TransferenciaRejeitada(BLOQUEADA_ANTIFRAUDE)`, through crashes
//! and rebalances (reference article §5).
//!
//! # Layout
//! - [`scoring`]: the deterministic risk score and its documented rules.
//! - [`analysis`]: what each record becomes: its analysed or rejected event, or its dead letter.
//! - [`start`]: wires [`kafka::exactly_once`]'s loop (outputs and consumed offsets in one Kafka
//!   transaction per batch), `/healthz`, `/readyz` and `/metrics` on port 8082.
//!
//! # Architecture invariant
//! Kafka to Kafka only: no database. Exactly-once comes from Kafka transactions with the
//! consumed offsets inside (KIP-447), `read_committed` readers and deterministic derived ids.

#![forbid(unsafe_code)]

pub mod analysis;
pub mod scoring;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use service::{Shell, Supervisor};

use contracts::topics;
use kafka::config::{consumer_config, transactional_producer_config, OffsetCommit};
use kafka::producer::Producer;
use kafka::Profile;

/// Options of `pagamentos antifraude`.
#[derive(Debug, Clone, clap::Args)]
pub struct AntifraudArgs {
    /// Address of `/healthz`, `/readyz` and `/metrics` (`/metrics` elsewhere with
    /// `--metrics-listen`).
    #[arg(
        id = "antifraude_listen",
        value_name = "LISTEN",
        long = "antifraude-listen",
        env = "ANTIFRAUDE_LISTEN",
        default_value = "0.0.0.0:8082"
    )]
    pub listen: SocketAddr,

    /// Transfers of this many cents or more score at least 80 and are blocked.
    #[arg(id = "antifraude_block_threshold_cents", value_name = "BLOCK_THRESHOLD_CENTS", long = "block-threshold-cents", env = "ANTIFRAUDE_BLOQUEIO_CENTAVOS", default_value_t = scoring::DEFAULT_BLOCK_THRESHOLD_CENTS, value_parser = contracts::Amount::parse)]
    pub block_threshold_cents: contracts::Amount,

    /// Prefix of the stable `transactional.id`; the instance id follows it.
    #[arg(
        id = "antifraude_transactional_id_prefix",
        value_name = "TRANSACTIONAL_ID_PREFIX",
        long = "transactional-id-prefix",
        env = "TRANSACTIONAL_ID_PREFIX",
        default_value = "tx-antifraude-"
    )]
    pub transactional_id_prefix: String,

    /// This instance's id (default: the host name): keep it stable across restarts so a new
    /// process fences its predecessor's unfinished transaction at once.
    #[arg(
        id = "antifraude_instance_id",
        value_name = "INSTANCE_ID",
        long = "instance-id",
        env = "PAGAMENTOS_INSTANCE_ID"
    )]
    pub instance_id: Option<String>,

    /// Most records in one transaction (`fast` profile; `reference` uses 1).
    #[arg(id = "antifraude_batch_records", value_name = "BATCH_RECORDS", long = "batch-records", env = "ANTIFRAUDE_BATCH_RECORDS", default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch_records: u32,

    /// How long a transaction keeps collecting records after the first, in milliseconds (0:
    /// only what was already fetched; records arriving during a commit form the next batch).
    #[arg(id = "antifraude_batch_wait_ms", value_name = "BATCH_WAIT_MS", long = "batch-wait-ms", env = "ANTIFRAUDE_BATCH_WAIT_MS", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1_000))]
    pub batch_wait_ms: u64,

    /// The Kafka client of the transactional loop: `librdkafka` (rdkafka; transactions v1) or
    /// `confluent` (Confluent's pure-Rust `confluent-kafka`; transactions v2 where the broker
    /// offers them; KIP-848 groups and a plaintext broker only). Under evaluation (issue #45,
    /// docs/architecture.md "Kafka clients"); without the lag gauges with `confluent`.
    #[arg(id = "antifraude_kafka_client", value_name = "CLIENT", long = "kafka-client", env = "ANTIFRAUDE_KAFKA_CLIENT", value_enum, default_value_t = TransactionalClient::Librdkafka)]
    pub kafka_client: TransactionalClient,
}

/// The Kafka client under the transactional loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransactionalClient {
    Librdkafka,
    Confluent,
}

impl TransactionalClient {
    /// The client `ANTIFRAUDE_KAFKA_CLIENT` names (librdkafka when unset), for callers that
    /// build [`AntifraudArgs`] without clap (tests, examples). Panics on an unknown name.
    pub fn from_env() -> Self {
        use clap::ValueEnum as _;
        std::env::var("ANTIFRAUDE_KAFKA_CLIENT").map_or(Self::Librdkafka, |name| {
            Self::from_str(&name, true)
                .unwrap_or_else(|_| panic!("ANTIFRAUDE_KAFKA_CLIENT={name}: not librdkafka or confluent"))
        })
    }
}

/// Everything a running antifraud service needs; `auth` says who may read `/readyz`'s detail
/// (the admin token, or everyone with `--insecure-no-auth`).
pub type Settings = service::Settings<AntifraudArgs, telemetry::health::HealthAuthArgs>;

/// The host name, for the default instance id.
fn host_name() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "local".into())
}

/// How long the exactly-once loop may fail without committing before `/readyz` says so (a
/// broker restart's recovery takes seconds; an offset commit left open lasts for ever).
pub const STALL_BOUND: Duration = Duration::from_secs(60);

/// antifraude as `pagamentos antifraude` and `pagamentos all` start it.
#[derive(Debug, Clone, Copy)]
pub struct Antifraud;

impl service::Service for Antifraud {
    const NAME: &'static str = "antifraude";
    const LISTEN_VARIABLE: &'static str = "ANTIFRAUDE_LISTEN";
    type Args = AntifraudArgs;
    type Auth = telemetry::health::HealthAuthArgs;
    type Error = Error;

    fn listen(args: &AntifraudArgs) -> SocketAddr {
        args.listen
    }

    fn start(
        settings: Settings,
        supervisor: &Supervisor,
    ) -> impl std::future::Future<Output = Result<SocketAddr, Error>> {
        start(settings, supervisor)
    }
}

/// Makes sure the topics exist, then spawns the transactional consumer loop and the health
/// routes on `supervisor`, each a named critical task. Returns the health address.
pub async fn start(settings: Settings, supervisor: &Supervisor) -> Result<SocketAddr, Error> {
    let Settings { args, auth, kafka, topics: topic_args, profile, metrics, producer } = settings;
    let detail = auth.resolve("antifraude")?;
    let shell = Shell::begin("antifraude", supervisor, &kafka, &topic_args).await?;
    let shutdown = shell.shutdown();
    let instance = args.instance_id.clone().unwrap_or_else(host_name);
    let transactional_id = format!("{}{instance}", args.transactional_id_prefix);
    let group = kafka.group(topics::groups::ANTIFRAUD);
    let input = kafka.topic(topics::REQUESTED);
    let client = match args.kafka_client {
        TransactionalClient::Librdkafka => {
            let config = consumer_config(&kafka, "antifraude", &group, OffsetCommit::InTransaction);
            let consumer = kafka::consumer::subscribe(&config, &[&input])?;
            // the gauge's committed offsets must not wait for a transaction left open
            let offsets = kafka::lag::offsets_reader(&config).map_err(kafka::Error::Config)?;
            let client = kafka::exactly_once::LibrdkafkaClient::new(
                consumer.clone(),
                transactional_producer_config(
                    &kafka,
                    "antifraude",
                    &transactional_id,
                    profile.transaction_linger(),
                ),
            );
            shell.spawn(
                "lag-gauges",
                kafka::lag::report_with(consumer, offsets, group.clone(), shutdown.clone()),
            );
            Loop::Librdkafka(client)
        }
        TransactionalClient::Confluent => {
            let config = kafka::exactly_once::ConfluentConfig::new(
                &kafka,
                "antifraude",
                &group,
                &transactional_id,
                profile.confluent_transaction_linger(),
            )?;
            Loop::Confluent(Box::new(
                kafka::exactly_once::ConfluentClient::subscribe(&config, &[&input]).await?,
            ))
        }
    };
    let analyser = analysis::Analyser::new(
        analysis::Topics { analysed: kafka.topic(topics::ANALYSED), rejected: kafka.topic(topics::REJECTED) },
        scoring::Scorer { block_threshold_cents: args.block_threshold_cents },
        group.clone(),
    );
    let options = kafka::exactly_once::Options {
        // the article commits one transaction per record
        batch_records_max: if profile == Profile::Reference { 1 } else { args.batch_records as usize },
        batch_wait_max: Duration::from_millis(args.batch_wait_ms),
        ..kafka::exactly_once::Options::default()
    };
    let liveness = options.liveness.clone();
    tracing::info!(transactional_id, group, client = ?args.kafka_client, "antifraude starting");

    let probe = Producer::shared_or_own(producer, &kafka, "antifraude-health", profile.linger())?;
    let checks: Vec<Arc<dyn telemetry::health::ReadinessCheck>> = vec![
        Arc::new(kafka::health::KafkaReady::new(probe, input.clone())),
        // no payment passes antifraude while its loop cannot commit: say so on /readyz
        Arc::new(kafka::exactly_once::Stalled { liveness, bound: STALL_BOUND }),
    ];
    let readiness = shell.readiness(checks, detail, auth.warnings());
    let app = telemetry::health::router(readiness, metrics);
    let inputs = std::slice::from_ref(&input);
    let bound = shell.serve("antifraude health", args.listen, app, inputs, inputs).await?;
    shell.report_dead_letters(inputs);
    shell.spawn_fallible("analysis", async move {
        match client {
            Loop::Librdkafka(mut client) => {
                kafka::exactly_once::run(&mut client, &analyser, &options, &shutdown).await
            }
            Loop::Confluent(mut client) => {
                let ran = kafka::exactly_once::run(client.as_mut(), &analyser, &options, &shutdown).await;
                client.close().await;
                ran
            }
        }
    });
    Ok(bound)
}

/// The loop's client, by [`TransactionalClient`].
enum Loop {
    Librdkafka(kafka::exactly_once::LibrdkafkaClient),
    // boxed: its consumer is 1.7 KiB inline, librdkafka's a few pointers
    Confluent(Box<kafka::exactly_once::ConfluentClient>),
}

/// What can stop the service from starting.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kafka(#[from] kafka::Error),
    #[error(transparent)]
    Auth(#[from] telemetry::health::HealthAuthError),
    #[error(transparent)]
    Shell(#[from] service::Error),
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Command {
        #[command(flatten)]
        args: AntifraudArgs,
    }

    #[test]
    fn a_block_threshold_below_one_cent_is_refused_with_the_rule() {
        let parsed =
            Command::try_parse_from(["antifraude", "--block-threshold-cents", "2500"]).expect("valid");
        assert_eq!(parsed.args.block_threshold_cents, contracts::Amount::constant(2_500));
        for bad in ["0", "-5"] {
            let error = Command::try_parse_from(["antifraude", &format!("--block-threshold-cents={bad}")])
                .expect_err("refused")
                .to_string();
            assert!(error.contains("must be at least 1"), "{error}");
        }
        let error = Command::try_parse_from(["antifraude", "--block-threshold-cents", "1e6"])
            .expect_err("refused")
            .to_string();
        assert!(error.contains("not a whole number of cents"), "{error}");
    }
}
