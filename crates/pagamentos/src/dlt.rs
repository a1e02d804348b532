//! `pagamentos dlt list|replay TOPIC`: inspect and re-drive dead letters of any `-dlt` topic
//! (`docs/reference/contract.md` §1, §3). The work is [`kafka_admin::dlt`]'s; this module parses, prints and
//! draws the progress bar.

use std::process::ExitCode;
use std::time::Duration;

use kafka::config::producer_config;
use kafka::producer::Producer;
use kafka::KafkaArgs;
use kafka_admin::dlt::{DeadLetterTopic, Letter, Selection};

#[derive(Debug, clap::Args)]
pub struct DltCommand {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, clap::Subcommand)]
enum Action {
    /// List dead letters not yet replayed: partition, offset, age, key, original topic and
    /// exception message.
    List {
        /// A dead-letter topic, e.g. `transferencias.liquidada-dlt` (the topic prefix, if
        /// configured, is added).
        topic: String,
        /// Also list dead letters replayed before (marked as such).
        #[arg(long)]
        include_replayed: bool,
        /// Show at most this many; the rest are counted.
        #[arg(long, default_value_t = 1_000)]
        limit: usize,
        /// One JSON array on stdout instead of a table.
        #[arg(long)]
        json: bool,

        #[command(flatten)]
        kafka: KafkaArgs,

        #[command(flatten)]
        transport: telemetry::transport::TransportArgs,
    },
    /// Re-publish dead letters to their original topic (from `kafka_dlt-original-topic` or
    /// `kafka_original-topic`) with a `pagamentos_dlt-replayed-from` header. Progress is kept
    /// in the consumer group `pagamentos-dlt-replay`, so a dead letter is never replayed twice
    /// by accident.
    ///
    /// A dead letter goes back only where it came from: the topic's source (its name without
    /// `-dlt`) or one of the source's retry topics (`<source>-retry-<ms>`). A letter whose
    /// header names any other topic is refused (printed and logged with its partition, offset
    /// and why; counted in `dlt_replay_refused_total`) and left in place, not marked replayed;
    /// `--all` replays the others and then exits 1. A `--to` elsewhere is refused before
    /// anything is sent (exit 1).
    #[command(group(clap::ArgGroup::new("selection").required(true).args(["offset", "all"])))]
    Replay {
        /// A dead-letter topic, e.g. `transferencias.liquidada-dlt`.
        topic: String,
        /// The partition of the one record to replay (with `--offset`).
        #[arg(long, requires = "offset")]
        partition: Option<i32>,
        /// The offset of the one record to replay (with `--partition`).
        #[arg(long, requires = "partition")]
        offset: Option<i64>,
        /// Every dead letter not replayed yet, oldest first per partition.
        #[arg(long, conflicts_with_all = ["partition", "offset"])]
        all: bool,
        /// Re-drive to this topic instead of the original (e.g. `…-retry-1000` to give
        /// notifications another round without the other consumers of the original topic):
        /// the source of the dead-letter topic or one of its retry topics, nothing else.
        #[arg(long)]
        to: Option<String>,
        /// Check and count what would be replayed; send and record nothing.
        #[arg(long)]
        dry_run: bool,

        #[command(flatten)]
        kafka: KafkaArgs,

        #[command(flatten)]
        transport: telemetry::transport::TransportArgs,
    },
}

pub async fn run(command: DltCommand) -> anyhow::Result<ExitCode> {
    let (Action::List { kafka, transport, .. } | Action::Replay { kafka, transport, .. }) = &command.action;
    crate::transport::check("dlt", transport, Some(kafka), &[])?;
    match command.action {
        Action::List { topic, include_replayed, limit, json, kafka, .. } => {
            let topic = dead_letter_topic(&kafka, &topic)?;
            let (letters, more) = tokio::task::spawn_blocking(move || {
                DeadLetterTopic::open(&kafka, &topic)?.list(include_replayed, limit)
            })
            .await??;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&letters.iter().map(letter_json).collect::<Vec<_>>())?
                );
            } else {
                print!("{}", table(&letters));
                if more > 0 {
                    println!("… and {more} more (raise --limit)");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Action::Replay { topic, partition, offset, all, to, dry_run, kafka, .. } => {
            let topic = dead_letter_topic(&kafka, &topic)?;
            let selection = match (partition, offset, all) {
                (Some(partition), Some(offset), false) => Selection::One { partition, offset },
                _ => Selection::All,
            };
            let to = to.map(|name| kafka.topic(&name));
            let producer = Producer::new(&producer_config(&kafka, "pagamentos-dlt", Duration::ZERO))?;
            let runtime = tokio::runtime::Handle::current();
            let source = topic.clone();
            let summary = tokio::task::spawn_blocking(move || {
                let bar = indicatif::ProgressBar::new(0);
                bar.set_style(
                    indicatif::ProgressStyle::with_template(
                        "{bar:40} {pos}/{len} dead letters replayed ({eta} left)",
                    )
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                );
                let result = DeadLetterTopic::open(&kafka, &source)?.replay(
                    &producer,
                    &runtime,
                    selection,
                    to.as_deref(),
                    dry_run,
                    |done, total| {
                        bar.set_length(total);
                        bar.set_position(done);
                    },
                );
                bar.finish_and_clear();
                if result.is_ok() {
                    // every replayed record was acknowledged one by one; nothing is queued
                    runtime.block_on(producer.flush(Duration::from_secs(10)))?;
                }
                Ok::<_, anyhow::Error>(result?)
            })
            .await??;
            if dry_run {
                println!(
                    "dry run: {} dead letters of {topic} would be replayed ({} replayed before, {} would be refused)",
                    summary.replayed,
                    summary.skipped,
                    summary.refused.len()
                );
            } else {
                println!("{topic}: {summary}");
            }
            for refused in &summary.refused {
                println!("{topic} {refused}; left in place, not replayed");
            }
            // a refused letter is an attempt to reach another topic, or a letter an operator
            // must look at: the replay is not a success
            Ok(if summary.refused.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
    }
}

/// `name` behind the prefix, refused unless it is a dead-letter topic.
fn dead_letter_topic(kafka: &KafkaArgs, name: &str) -> anyhow::Result<String> {
    if !name.ends_with(contracts::topics::DEAD_LETTER_SUFFIX) {
        anyhow::bail!("{name} is not a dead-letter topic (its name must end in -dlt)");
    }
    Ok(kafka.topic(name))
}

fn age(letter: &Letter) -> String {
    let Some(at) = letter.timestamp_ms else { return "?".into() };
    let seconds = (kafka::retry_topic::now_ms() - at).max(0) / 1000;
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3_600 => format!("{}m", seconds / 60),
        3_600..86_400 => format!("{}h", seconds / 3_600),
        _ => format!("{}d", seconds / 86_400),
    }
}

fn table(letters: &[Letter]) -> String {
    let mut out = format!(
        "{:<9} {:<10} {:<5} {:<34} {:<32} EXCEPTION\n",
        "PARTITION", "OFFSET", "AGE", "KEY", "ORIGINAL TOPIC"
    );
    for letter in letters {
        let mut message = letter.exception_message.clone().unwrap_or_default().replace('\n', " ");
        if letter.replayed {
            message = format!("(replayed) {message}");
        }
        out.push_str(&format!(
            "{:<9} {:<10} {:<5} {:<34} {:<32} {}\n",
            letter.partition,
            letter.offset,
            age(letter),
            letter.key.as_deref().unwrap_or("-"),
            letter.original_topic.as_deref().unwrap_or("-"),
            message
        ));
    }
    if letters.is_empty() {
        out.push_str("(no dead letters)\n");
    }
    out
}

fn letter_json(letter: &Letter) -> serde_json::Value {
    serde_json::json!({
        "partition": letter.partition,
        "offset": letter.offset,
        "key": letter.key,
        "originalTopic": letter.original_topic,
        "exceptionMessage": letter.exception_message,
        "originalTimestampMs": letter.original_timestamp.map(|(at, _)| at),
        "originalTimestampType": letter.original_timestamp.map(|(_, kind)| kind.as_str()),
        "timestampMs": letter.timestamp_ms,
        "ageSeconds": letter.timestamp_ms.map(|at| (kafka::retry_topic::now_ms() - at).max(0) / 1000),
        "replayed": letter.replayed,
    })
}
