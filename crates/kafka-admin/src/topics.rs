//! Creates or verifies every topic of the plan (`pagamentos topics`, and services at start).
//!
//! Idempotent: a missing topic is created with the configured partitions, replication factor,
//! `min.insync.replicas` and retention; an existing one is compared with the configuration and
//! every difference is reported (never silently accepted: fewer partitions than asked would
//! break the "dead letter keeps its partition" rule, and another retention would lose data).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::types::RDKafkaErrorCode;

use contracts::topics::TopicSpec;

use kafka::config::{admin_config, KafkaArgs, TopicArgs};
use kafka::context::Context;
use kafka::Error;

/// How long the first metadata request may take before the broker counts as unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// What happened to one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Created,
    /// Existed with exactly the configured layout.
    Verified,
    /// Existed, but differs from the configuration in each listed way.
    Differs(Vec<String>),
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicStatus {
    pub name: String,
    pub outcome: Outcome,
}

/// What [`ensure`] did, topic by topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub topics: Vec<TopicStatus>,
}

impl Report {
    /// True when every topic now matches the configuration.
    pub fn is_consistent(&self) -> bool {
        self.topics.iter().all(|status| !matches!(status.outcome, Outcome::Differs(_)))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for status in &self.topics {
            match &status.outcome {
                Outcome::Created => writeln!(f, "created   {}", status.name)?,
                Outcome::Verified => writeln!(f, "ok        {}", status.name)?,
                Outcome::Differs(differences) => {
                    writeln!(f, "DIFFERS   {}: {}", status.name, differences.join("; "))?
                }
            }
        }
        Ok(())
    }
}

type Admin = AdminClient<Context>;

fn connect(args: &KafkaArgs) -> Result<Arc<Admin>, Error> {
    let admin: Admin =
        kafka::context::create(&admin_config(args, "pagamentos-admin")).map_err(Error::Config)?;
    Ok(Arc::new(admin))
}

/// Layout of every existing topic: name → (partitions, replication factor).
async fn existing_topics(
    admin: &Arc<Admin>,
    bootstrap: &str,
) -> Result<HashMap<String, (usize, usize)>, Error> {
    let client = admin.clone();
    let metadata = tokio::task::spawn_blocking(move || client.inner().fetch_metadata(None, CONNECT_TIMEOUT))
        .await?
        .map_err(|source| unreachable(admin, bootstrap, source))?;
    Ok(metadata
        .topics()
        .iter()
        .map(|topic| {
            let replicas = topic.partitions().first().map_or(0, |partition| partition.replicas().len());
            (topic.name().to_owned(), (topic.partitions().len(), replicas))
        })
        .collect())
}

fn options() -> AdminOptions {
    AdminOptions::new().request_timeout(Some(CONNECT_TIMEOUT)).operation_timeout(Some(CONNECT_TIMEOUT))
}

/// Creates what is missing of `specs` and verifies the rest against `settings`.
pub async fn ensure(args: &KafkaArgs, settings: &TopicArgs, specs: &[TopicSpec]) -> Result<Report, Error> {
    let admin = connect(args)?;
    let existing = existing_topics(&admin, &args.bootstrap_servers).await?;
    let min_insync = settings.min_insync_replicas().to_string();

    let retention: Vec<String> = specs.iter().map(|spec| spec.retention_ms.to_string()).collect();
    let missing: Vec<NewTopic<'_>> = specs
        .iter()
        .zip(&retention)
        .filter(|(spec, _)| !existing.contains_key(&spec.name))
        .map(|(spec, retention_ms)| {
            NewTopic::new(&spec.name, settings.partitions, TopicReplication::Fixed(settings.replicas))
                .set("min.insync.replicas", &min_insync)
                .set("retention.ms", retention_ms)
        })
        .collect();
    let mut created = Vec::new();
    let mut raced = Vec::new();
    if !missing.is_empty() {
        let results = admin
            .create_topics(&missing, &options())
            .await
            .map_err(|source| Error::Admin { operation: "create_topics", source })?;
        for result in results {
            match result {
                Ok(name) => created.push(name),
                // another process created it between our metadata request and ours: verify it
                Err((name, RDKafkaErrorCode::TopicAlreadyExists)) => raced.push(name),
                Err((name, code)) => {
                    return Err(Error::Admin {
                        operation: "create_topics",
                        source: rdkafka::error::KafkaError::AdminOp(code),
                    })
                    .inspect_err(|_| tracing::error!(topic = name, %code, "topic not created"));
                }
            }
        }
    }
    // CreateTopics answers once the controller has the topics; the broker learns of them a
    // moment later, and a client that asks it in between is told they do not exist
    let mut fresh: Vec<String> = created.iter().chain(&raced).cloned().collect();
    fresh.sort();
    await_leaders(&admin, &args.bootstrap_servers, &fresh).await?;
    let existing =
        if raced.is_empty() { existing } else { existing_topics(&admin, &args.bootstrap_servers).await? };

    let to_verify: Vec<&TopicSpec> = specs.iter().filter(|spec| !created.contains(&spec.name)).collect();
    let configs = if to_verify.is_empty() {
        Vec::new()
    } else {
        let resources: Vec<ResourceSpecifier<'_>> =
            to_verify.iter().map(|spec| ResourceSpecifier::Topic(&spec.name)).collect();
        admin
            .describe_configs(&resources, &options())
            .await
            .map_err(|source| Error::Admin { operation: "describe_configs", source })?
    };

    let mut report = Report::default();
    for spec in specs {
        if created.contains(&spec.name) {
            report.topics.push(TopicStatus { name: spec.name.clone(), outcome: Outcome::Created });
        }
    }
    for (spec, config) in to_verify.iter().zip(configs) {
        let mut differences = Vec::new();
        let (partitions, replicas) = existing.get(&spec.name).copied().unwrap_or((0, 0));
        if partitions != settings.partitions as usize {
            differences.push(format!("{partitions} partitions, configured {}", settings.partitions));
        }
        if replicas != settings.replicas as usize {
            differences.push(format!("replication factor {replicas}, configured {}", settings.replicas));
        }
        match config {
            Ok(resource) => {
                let value = |name: &str| resource.get(name).and_then(|entry| entry.value.clone());
                let actual_min_insync = value("min.insync.replicas").unwrap_or_default();
                if actual_min_insync != min_insync {
                    differences
                        .push(format!("min.insync.replicas {actual_min_insync}, configured {min_insync}"));
                }
                let actual_retention = value("retention.ms").unwrap_or_default();
                if actual_retention != spec.retention_ms.to_string() {
                    differences
                        .push(format!("retention.ms {actual_retention}, configured {}", spec.retention_ms));
                }
            }
            Err(code) => differences.push(format!("configuration unreadable: {code}")),
        }
        let outcome = if differences.is_empty() { Outcome::Verified } else { Outcome::Differs(differences) };
        report.topics.push(TopicStatus { name: spec.name.clone(), outcome });
    }
    Ok(report)
}

/// Waits until the broker's metadata shows every one of `names` with a leader for each of its
/// partitions, for at most [`CONNECT_TIMEOUT`].
async fn await_leaders(admin: &Arc<Admin>, bootstrap: &str, names: &[String]) -> Result<(), Error> {
    let started = tokio::time::Instant::now();
    loop {
        let client = admin.clone();
        let metadata =
            tokio::task::spawn_blocking(move || client.inner().fetch_metadata(None, CONNECT_TIMEOUT))
                .await?
                .map_err(|source| unreachable(admin, bootstrap, source))?;
        let ready = |name: &String| {
            metadata.topics().iter().any(|topic| {
                topic.name() == name
                    && topic.error().is_none()
                    && !topic.partitions().is_empty()
                    && topic
                        .partitions()
                        .iter()
                        .all(|partition| partition.error().is_none() && partition.leader() >= 0)
            })
        };
        let waiting: Vec<String> = names.iter().filter(|name| !ready(name)).cloned().collect();
        if waiting.is_empty() {
            return Ok(());
        }
        if started.elapsed() >= CONNECT_TIMEOUT {
            return Err(Error::NoLeader { topics: waiting, waited: started.elapsed() });
        }
        // polling the broker's metadata, not waiting for time to pass: the loop ends on the
        // condition (or the deadline), the pause only spaces the requests
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Deletes `names` (tests clean up after themselves with it). Unknown topics are ignored.
pub async fn delete(args: &KafkaArgs, names: &[&str]) -> Result<(), Error> {
    if names.is_empty() {
        return Ok(());
    }
    let admin = connect(args)?;
    let results = admin
        .delete_topics(names, &options())
        .await
        .map_err(|source| Error::Admin { operation: "delete_topics", source })?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((_, code)) => {
                return Err(Error::Admin {
                    operation: "delete_topics",
                    source: rdkafka::error::KafkaError::AdminOp(code),
                })
            }
        }
    }
    Ok(())
}

/// What a service does at start: create what is missing of the whole plan (behind the
/// configured prefix) and warn about differences instead of refusing to start, since
/// `pagamentos topics` is where differences are an error.
pub async fn ensure_at_start(args: &KafkaArgs, settings: &TopicArgs) -> Result<(), Error> {
    let report = ensure(args, settings, &contracts::topics::plan(&args.topic_prefix)).await?;
    if !report.is_consistent() {
        tracing::warn!(report = %report, "existing topics differ from the configuration");
    }
    Ok(())
}

/// Why the first metadata request failed: the broker's refusal when it refused this client
/// (a wrong password, an untrusted certificate), else the broker counts as unreachable.
fn unreachable(admin: &Admin, bootstrap: &str, source: rdkafka::error::KafkaError) -> Error {
    kafka::context::drain_main_queue(admin, admin.inner().context());
    match admin.inner().context().refusal() {
        Some(reason) => Error::Refused { bootstrap: bootstrap.to_owned(), reason },
        None => Error::Unreachable { bootstrap: bootstrap.to_owned(), source },
    }
}
