//! `pagamentos topics`: creates or verifies every topic of the contract (fewer than 3 replicas
//! only with `--allow-under-replicated`, see [`crate::replication`]).

use std::process::ExitCode;

use kafka::{KafkaArgs, TopicArgs};

use crate::replication::ReplicationArgs;

#[derive(Debug, clap::Args)]
pub struct TopicsCommand {
    #[command(flatten)]
    kafka: KafkaArgs,

    #[command(flatten)]
    topics: TopicArgs,

    #[command(flatten)]
    replication: ReplicationArgs,

    #[command(flatten)]
    transport: telemetry::transport::TransportArgs,
}

pub async fn run(args: TopicsCommand) -> anyhow::Result<ExitCode> {
    args.replication.check(&args.topics)?;
    crate::transport::check("topics", &args.transport, Some(&args.kafka), &[])?;
    let specs = contracts::topics::plan(&args.kafka.topic_prefix);
    let report = kafka_admin::topics::ensure(&args.kafka, &args.topics, &specs).await?;
    print!("{report}");
    if report.is_consistent() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "error: existing topics differ from the configuration ({} partitions, replication {}, \
             min.insync.replicas {}); fix them or the configuration",
            args.topics.partitions,
            args.topics.replicas,
            args.topics.min_insync_replicas()
        );
        Ok(ExitCode::FAILURE)
    }
}
