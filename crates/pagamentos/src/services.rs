//! The service subcommands: parse, start, wait for the signal, drain.

use std::process::ExitCode;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use kafka::{KafkaArgs, Profile, TopicArgs};

use crate::shutdown;

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
}

#[derive(Debug, clap::Args)]
pub struct TransfersCommand {
    #[command(flatten)]
    transfers: transfers::TransfersArgs,

    #[command(flatten)]
    common: CommonArgs,
}

pub async fn transfers(command: TransfersCommand) -> anyhow::Result<ExitCode> {
    let token = CancellationToken::new();
    let tracker = TaskTracker::new();
    shutdown::cancel_on_signal(token.clone());
    let settings = transfers::Settings {
        args: command.transfers,
        kafka: command.common.kafka,
        topics: command.common.topics,
        profile: command.common.profile,
    };
    if let Err(error) = transfers::start(settings, token.clone(), &tracker).await {
        token.cancel();
        shutdown::drain(&token, &tracker).await;
        return Err(anyhow::Error::new(error).context("pagamentos transferencias did not start"));
    }
    Ok(if shutdown::drain(&token, &tracker).await { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
