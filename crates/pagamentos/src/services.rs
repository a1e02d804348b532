//! The service subcommands: parse, start, wait for the signal, drain.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context as _;
use service::supervisor::{Drained, Supervisor};
use service::Service;

use kafka::config::producer_config;
use kafka::producer::Producer;
use kafka::{KafkaArgs, Profile, TopicArgs};

/// What every service takes besides its own options.
#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    #[command(flatten)]
    pub kafka: KafkaArgs,

    #[command(flatten)]
    pub topics: TopicArgs,

    /// `fast` (ours) or `reference` (the article's settings, for side-by-side benchmarks).
    #[arg(long, env = "PAGAMENTOS_PROFILE", value_enum, default_value_t = Profile::Fast)]
    pub profile: Profile,

    #[command(flatten)]
    pub replication: crate::replication::ReplicationArgs,

    /// `--insecure-transport`: see [`crate::transport`].
    #[command(flatten)]
    pub transport: telemetry::transport::TransportArgs,

    /// Serve `/metrics` on this address (IP:PORT) instead of on the service's port, which then
    /// answers `/metrics` with 404: e.g. an address only the monitoring network reaches, while
    /// the service's port is public. One listener for the whole process (in `all`, for the
    /// four services). Unset: `/metrics` on every service's port.
    #[arg(long, env = "PAGAMENTOS_METRICS_LISTEN", value_name = "ADDRESS", value_parser = parse_listen_address)]
    pub metrics_listen: Option<SocketAddr>,
}

/// A listen address: an IP address and a port, as `0.0.0.0:9100` or `[::1]:9100`.
fn parse_listen_address(text: &str) -> Result<SocketAddr, String> {
    text.trim().parse().map_err(|_| {
        format!("{text:?} is not a listen address: expected IP:PORT, e.g. 0.0.0.0:9100 or 127.0.0.1:9100")
    })
}

impl CommonArgs {
    /// The checks every service starts with, before anything connects: the replication floor,
    /// then the transport to Kafka and to `databases` (setting, URL). The warnings to report
    /// on `/readyz` (`--insecure-transport`), or why the service must not start.
    fn check(&self, service: &str, databases: &[(&'static str, &str)]) -> anyhow::Result<Vec<String>> {
        self.replication.check(&self.topics)?;
        crate::transport::check(service, &self.transport, Some(&self.kafka), databases)
    }

    /// Where the services serve `/metrics`.
    fn metrics_route(&self) -> telemetry::health::MetricsRoute {
        match self.metrics_listen {
            Some(_) => telemetry::health::MetricsRoute::OwnListener,
            None => telemetry::health::MetricsRoute::ServicePort,
        }
    }
}

/// Whether two listen addresses would take the same port: the same port (not 0, which picks
/// a free one) on the same IP, or on the unspecified address (`0.0.0.0`, `::`), which takes it
/// on every IP.
fn same_port(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// The metrics listener's address, when it would take the port of one of `services` (name,
/// listen setting, address): the refusal to print.
fn metrics_listen_conflict(
    metrics: Option<SocketAddr>,
    services: &[(&str, &str, SocketAddr)],
) -> Option<String> {
    let metrics = metrics?;
    let (service, variable, address) =
        services.iter().find(|(_, _, address)| same_port(metrics, *address))?;
    Some(format!(
        "PAGAMENTOS_METRICS_LISTEN (--metrics-listen) {metrics} takes the port of {service}'s {variable} \
         {address}: give /metrics a port of its own"
    ))
}

/// `pagamentos <service>`: the service's own options, its auth settings and the common ones.
#[derive(Debug, clap::Args)]
pub struct ServiceCommand<Args: clap::Args, Auth: clap::Args> {
    #[command(flatten)]
    args: Args,

    /// Bearer tokens (an API), or the admin token that shows `/readyz`'s detail.
    #[command(flatten)]
    auth: Auth,

    #[command(flatten)]
    common: CommonArgs,
}

pub type TransfersCommand = ServiceCommand<transfers::TransfersArgs, web::AuthArgs>;
pub type AntifraudCommand = ServiceCommand<antifraud::AntifraudArgs, telemetry::health::HealthAuthArgs>;
pub type LedgerCommand = ServiceCommand<ledger::LedgerArgs, web::AuthArgs>;
pub type NotificationsCommand =
    ServiceCommand<notifications::NotificationsArgs, telemetry::health::HealthAuthArgs>;

/// `pagamentos all`: every service's options, one set of common ones.
#[derive(Debug, clap::Args)]
pub struct AllCommand {
    #[command(flatten)]
    transfers: transfers::TransfersArgs,

    #[command(flatten)]
    ledger: ledger::LedgerArgs,

    #[command(flatten)]
    antifraud: antifraud::AntifraudArgs,

    #[command(flatten)]
    notifications: notifications::NotificationsArgs,

    /// One set of tokens for both APIs.
    #[command(flatten)]
    auth: web::AuthArgs,

    #[command(flatten)]
    common: CommonArgs,
}

/// Which service of `pagamentos all` did not start.
#[derive(Debug, thiserror::Error)]
enum AllError {
    #[error("the producer the services share could not be created")]
    Producer(#[source] kafka::Error),
    #[error("transferencias did not start")]
    Transfers(#[source] transfers::Error),
    #[error("ledger did not start")]
    Ledger(#[source] ledger::Error),
    #[error("antifraude did not start")]
    Antifraud(#[source] antifraud::Error),
    #[error("notificacoes did not start")]
    Notifications(#[source] notifications::Error),
}

/// The one service shell: starts a service with `start` on a [`Supervisor`], then waits for
/// SIGINT/SIGTERM, or for a critical task to stop on its own, and drains. With
/// `metrics_listen`, `/metrics` is served there first, by the task `metrics/http`. Exit 0
/// after an ordinary shutdown; 2 when the metrics listener would take a port of `listens`
/// (each service's name, listen setting and address); non-zero when a task stopped (`task
/// <name> stopped: <why>`, also on `/readyz` while the others drain), when the drain passed
/// its deadline, or when the service did not start. `warnings` (the process's, e.g.
/// `--insecure-transport`) are reported on every service's `/readyz`.
async fn serve<F, E>(
    name: &str,
    metrics_listen: Option<SocketAddr>,
    listens: &[(&str, &str, SocketAddr)],
    warnings: Vec<String>,
    start: impl FnOnce(Supervisor) -> F,
) -> anyhow::Result<ExitCode>
where
    F: std::future::Future<Output = Result<SocketAddr, E>>,
    E: std::error::Error + Send + Sync + 'static,
{
    if let Some(conflict) = metrics_listen_conflict(metrics_listen, listens) {
        eprintln!("error: {conflict}");
        return Ok(ExitCode::from(2));
    }
    let supervisor = Supervisor::new();
    supervisor.report_warnings(warnings);
    supervisor.cancel_on_signal();
    if let Some(address) = metrics_listen {
        let app = telemetry::health::metrics_router(telemetry::metrics::install());
        let shutdown = supervisor.shutdown_token().cancelled_owned();
        let (_, serve_metrics) =
            service::server::bind("metrics", address, app, shutdown).await.with_context(|| {
                format!(
                    "pagamentos {name} did not start: cannot listen on {address} (PAGAMENTOS_METRICS_LISTEN)"
                )
            })?;
        supervisor.spawn("metrics/http", serve_metrics);
    }
    if let Err(error) = start(supervisor.clone()).await {
        supervisor.shut_down();
        supervisor.drain().await;
        return Err(anyhow::Error::new(error).context(format!("pagamentos {name} did not start")));
    }
    match supervisor.drain().await {
        Drained::Clean => Ok(ExitCode::SUCCESS),
        Drained::Stopped(stopped) => {
            for line in &stopped {
                eprintln!("error: pagamentos {name}: {line}");
            }
            Ok(ExitCode::FAILURE)
        }
        Drained::DeadlinePassed => Ok(ExitCode::FAILURE),
    }
}

/// `pagamentos <service>`: the checks every service starts with, then the service `S` on the
/// one shell ([`serve`]).
pub async fn run<S>(command: ServiceCommand<S::Args, S::Auth>) -> anyhow::Result<ExitCode>
where
    S: Service,
    S::Args: clap::Args,
    S::Auth: clap::Args,
{
    let ServiceCommand { args, auth, common } = command;
    let warnings = common.check(S::NAME, &S::databases(&args))?;
    let metrics_listen = common.metrics_listen;
    let listens = [S::listen_setting(&args)];
    let settings = service::Settings {
        metrics: common.metrics_route(),
        args,
        auth,
        kafka: common.kafka,
        topics: common.topics,
        profile: common.profile,
        producer: None,
    };
    serve(S::NAME, metrics_listen, &listens, warnings, |supervisor| async move {
        S::start(settings, &supervisor).await
    })
    .await
}

/// The four services in one process: one runtime, one telemetry set-up, one shutdown signal
/// that drains every loop; each service keeps its own port.
pub async fn all(command: AllCommand) -> anyhow::Result<ExitCode> {
    let databases =
        [transfers::Transfers::databases(&command.transfers), ledger::Ledger::databases(&command.ledger)];
    let warnings = command.common.check("all", &databases.concat())?;
    let AllCommand {
        transfers: transfers_args,
        ledger: ledger_args,
        antifraud: antifraud_args,
        notifications: notifications_args,
        auth,
        common,
    } = command;
    let metrics_listen = common.metrics_listen;
    let metrics = common.metrics_route();
    let listens = [
        transfers::Transfers::listen_setting(&transfers_args),
        ledger::Ledger::listen_setting(&ledger_args),
        antifraud::Antifraud::listen_setting(&antifraud_args),
        notifications::Notifications::listen_setting(&notifications_args),
    ];
    serve("all", metrics_listen, &listens, warnings, |supervisor| async move {
        let CommonArgs { kafka, topics, profile, .. } = common;
        // one idempotent producer for the four services: one set of librdkafka threads and
        // connections instead of four (antifraude's transactional producer stays its own)
        let producer = Producer::new(&producer_config(&kafka, "pagamentos", profile.linger()))
            .map_err(AllError::Producer)?;
        // downstream first, so nothing the upstream services publish waits for a consumer
        let ledger = ledger::start(
            ledger::Settings {
                args: ledger_args,
                auth: auth.clone(),
                kafka: kafka.clone(),
                topics: topics.clone(),
                profile,
                metrics,
                producer: Some(producer.clone()),
            },
            &supervisor,
        )
        .await
        .map_err(AllError::Ledger)?;
        let notifications = notifications::start(
            notifications::Settings {
                args: notifications_args,
                auth: auth.health(),
                kafka: kafka.clone(),
                topics: topics.clone(),
                profile,
                metrics,
                producer: Some(producer.clone()),
            },
            &supervisor,
        )
        .await
        .map_err(AllError::Notifications)?;
        let antifraud = antifraud::start(
            antifraud::Settings {
                args: antifraud_args,
                auth: auth.health(),
                kafka: kafka.clone(),
                topics: topics.clone(),
                profile,
                metrics,
                producer: Some(producer.clone()),
            },
            &supervisor,
        )
        .await
        .map_err(AllError::Antifraud)?;
        let transfers = transfers::start(
            transfers::Settings {
                args: transfers_args,
                auth,
                kafka,
                topics,
                profile,
                metrics,
                producer: Some(producer),
            },
            &supervisor,
        )
        .await
        .map_err(AllError::Transfers)?;
        tracing::info!(%transfers, %ledger, %antifraud, %notifications, ?profile, "pagamentos all started");
        Ok::<_, AllError>(transfers)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(text: &str) -> SocketAddr {
        text.parse().expect("address")
    }

    #[test]
    fn the_metrics_listener_may_not_take_a_service_port() {
        let services = [
            ("transferencias", "TRANSFERENCIAS_LISTEN", address("0.0.0.0:8080")),
            ("ledger", "LEDGER_LISTEN", address("127.0.0.1:8081")),
            ("antifraude", "ANTIFRAUDE_LISTEN", address("127.0.0.1:0")),
        ];
        for taken in ["0.0.0.0:8080", "127.0.0.1:8080", "[::]:8081", "127.0.0.1:8081"] {
            let refusal = metrics_listen_conflict(Some(address(taken)), &services);
            assert!(
                refusal.as_deref().is_some_and(|text| text.contains("PAGAMENTOS_METRICS_LISTEN")),
                "{taken}"
            );
        }
        let refusal = metrics_listen_conflict(Some(address("127.0.0.1:8081")), &services).expect("refused");
        assert!(refusal.contains("ledger's LEDGER_LISTEN 127.0.0.1:8081"), "{refusal}");
        for free in ["0.0.0.0:9100", "127.0.0.2:8081", "127.0.0.1:0"] {
            assert_eq!(metrics_listen_conflict(Some(address(free)), &services), None, "{free}");
        }
        assert_eq!(metrics_listen_conflict(None, &services), None);
    }

    #[test]
    fn a_listen_address_is_an_ip_and_a_port() {
        assert_eq!(parse_listen_address("0.0.0.0:9100"), Ok(address("0.0.0.0:9100")));
        assert_eq!(parse_listen_address("[::1]:9100"), Ok(address("[::1]:9100")));
        for bad in ["9100", "localhost:9100", "0.0.0.0", "0.0.0.0:99999", ""] {
            let error = parse_listen_address(bad).expect_err(bad);
            assert!(error.contains("expected IP:PORT"), "{error}");
        }
    }
}
