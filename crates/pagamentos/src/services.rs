//! The service subcommands: parse, start, wait for the signal, drain.

use std::process::ExitCode;

use telemetry::supervisor::{Drained, Supervisor};

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
}

#[derive(Debug, clap::Args)]
pub struct TransfersCommand {
    #[command(flatten)]
    transfers: transfers::TransfersArgs,

    #[command(flatten)]
    auth: web::AuthArgs,

    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Debug, clap::Args)]
pub struct AntifraudCommand {
    #[command(flatten)]
    antifraud: antifraud::AntifraudArgs,

    /// The admin token that shows `/readyz`'s detail.
    #[command(flatten)]
    auth: telemetry::health::HealthAuthArgs,

    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Debug, clap::Args)]
pub struct LedgerCommand {
    #[command(flatten)]
    ledger: ledger::LedgerArgs,

    #[command(flatten)]
    auth: web::AuthArgs,

    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Debug, clap::Args)]
pub struct NotificationsCommand {
    #[command(flatten)]
    notifications: notifications::NotificationsArgs,

    /// The admin token that shows `/readyz`'s detail.
    #[command(flatten)]
    auth: telemetry::health::HealthAuthArgs,

    #[command(flatten)]
    common: CommonArgs,
}

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
/// SIGINT/SIGTERM, or for a critical task to stop on its own, and drains. Exit 0 after an
/// ordinary shutdown; non-zero when a task stopped (`task <name> stopped: <why>`, also on
/// `/readyz` while the others drain), when the drain passed its deadline, or when the service
/// did not start.
async fn serve<F, E>(name: &str, start: impl FnOnce(Supervisor) -> F) -> anyhow::Result<ExitCode>
where
    F: std::future::Future<Output = Result<std::net::SocketAddr, E>>,
    E: std::error::Error + Send + Sync + 'static,
{
    let supervisor = Supervisor::new();
    supervisor.cancel_on_signal();
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

pub async fn transfers(command: TransfersCommand) -> anyhow::Result<ExitCode> {
    command.common.replication.check(&command.common.topics)?;
    let settings = transfers::Settings {
        args: command.transfers,
        auth: command.auth,
        kafka: command.common.kafka,
        topics: command.common.topics,
        profile: command.common.profile,
        metrics: telemetry::health::MetricsRoute::ServicePort,
    };
    serve("transferencias", |supervisor| async move { transfers::start(settings, &supervisor).await }).await
}

pub async fn antifraud(command: AntifraudCommand) -> anyhow::Result<ExitCode> {
    command.common.replication.check(&command.common.topics)?;
    let settings = antifraud::Settings {
        args: command.antifraud,
        auth: command.auth,
        kafka: command.common.kafka,
        topics: command.common.topics,
        profile: command.common.profile,
        metrics: telemetry::health::MetricsRoute::ServicePort,
    };
    serve("antifraude", |supervisor| async move { antifraud::start(settings, &supervisor).await }).await
}

pub async fn ledger(command: LedgerCommand) -> anyhow::Result<ExitCode> {
    command.common.replication.check(&command.common.topics)?;
    let settings = ledger::Settings {
        args: command.ledger,
        auth: command.auth,
        kafka: command.common.kafka,
        topics: command.common.topics,
        profile: command.common.profile,
        metrics: telemetry::health::MetricsRoute::ServicePort,
    };
    serve("ledger", |supervisor| async move { ledger::start(settings, &supervisor).await }).await
}

pub async fn notifications(command: NotificationsCommand) -> anyhow::Result<ExitCode> {
    command.common.replication.check(&command.common.topics)?;
    let settings = notifications::Settings {
        args: command.notifications,
        auth: command.auth,
        kafka: command.common.kafka,
        topics: command.common.topics,
        profile: command.common.profile,
        metrics: telemetry::health::MetricsRoute::ServicePort,
    };
    serve("notificacoes", |supervisor| async move { notifications::start(settings, &supervisor).await }).await
}

/// The four services in one process: one runtime, one telemetry set-up, one shutdown signal
/// that drains every loop; each service keeps its own port.
pub async fn all(command: AllCommand) -> anyhow::Result<ExitCode> {
    command.common.replication.check(&command.common.topics)?;
    let AllCommand {
        transfers: transfers_args,
        ledger: ledger_args,
        antifraud: antifraud_args,
        notifications: notifications_args,
        auth,
        common,
    } = command;
    serve("all", |supervisor| async move {
        let CommonArgs { kafka, topics, profile, .. } = common;
        let metrics = telemetry::health::MetricsRoute::ServicePort;
        // downstream first, so nothing the upstream services publish waits for a consumer
        let ledger = ledger::start(
            ledger::Settings {
                args: ledger_args,
                auth: auth.clone(),
                kafka: kafka.clone(),
                topics: topics.clone(),
                profile,
                metrics,
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
            },
            &supervisor,
        )
        .await
        .map_err(AllError::Antifraud)?;
        let transfers = transfers::start(
            transfers::Settings { args: transfers_args, auth, kafka, topics, profile, metrics },
            &supervisor,
        )
        .await
        .map_err(AllError::Transfers)?;
        tracing::info!(%transfers, %ledger, %antifraud, %notifications, ?profile, "pagamentos all started");
        Ok::<_, AllError>(transfers)
    })
    .await
}
