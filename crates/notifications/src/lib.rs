//! `pagamentos notificacoes`: every outcome event (`transferencias.liquidada`,
//! `transferencias.rejeitada`) becomes one webhook `POST`, retried without blocking anyone
//! through the retry topics (1 s, 2 s, 4 s: four attempts in all), then parked in
//! `<topic>-dlt` for an operator (`pagamentos dlt`). Reference article §7.
//!
//! # Layout
//! - [`webhook`]: the HTTP client, the signature and what each answer means.
//! - [`notifier`]: one attempt at one record.
//! - [`start`]: four consumers (group `notificacoes` on the outcome topics, and
//!   `notificacoes-retry-<ms>` on each retry topic) over [`kafka::retry_topic`], plus
//!   `/healthz`, `/readyz` and `/metrics` on port 8083.
//! - [`share_group`]: `NOTIFICACOES_CONSUMPTION=share-group`, the same attempts through a
//!   Kafka share group (KIP-932) instead of the retry topics; the only user of `krafka`.
//!
//! # Architecture invariant
//! No database: delivery is at least once (a crash after a POST and before the offset commit
//! posts again), and receivers dedupe by `Idempotency-Key` (the event id). A record waiting
//! for its retry pauses only its own partition.

#![forbid(unsafe_code)]

pub mod notifier;
pub mod share_group;
pub mod webhook;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use service::{Shell, Supervisor};

use contracts::topics;
use kafka::config::{consumer_config, OffsetCommit};
use kafka::producer::Producer;
use kafka::retry_topic::{Chain, StageOptions};
use kafka::{KafkaArgs, Profile, TopicArgs};

/// Options of `pagamentos notificacoes`.
#[derive(Clone, clap::Args)]
pub struct NotificationsArgs {
    /// Address of `/healthz`, `/readyz` and `/metrics` (`/metrics` elsewhere with
    /// `--metrics-listen`).
    #[arg(
        id = "notificacoes_listen",
        value_name = "LISTEN",
        long = "notificacoes-listen",
        env = "NOTIFICACOES_LISTEN",
        default_value = "0.0.0.0:8083"
    )]
    pub listen: SocketAddr,

    /// Where each outcome is POSTed; unset, notifications are only logged.
    #[arg(id = "notificacoes_webhook_url", value_name = "WEBHOOK_URL", long = "webhook-url", env = "NOTIFICACOES_WEBHOOK_URL", value_parser = parse_webhook_url)]
    pub webhook_url: Option<reqwest::Url>,

    /// Key of the webhook signatures (Standard Webhooks' `webhook-signature`, and
    /// `X-Signature`); `whsec_<base64>` is accepted. Required when a webhook URL is set, unless
    /// `--webhook-unsigned`.
    #[arg(
        id = "notificacoes_webhook_secret",
        value_name = "WEBHOOK_SECRET",
        long = "webhook-secret",
        env = "NOTIFICACOES_WEBHOOK_SECRET",
        hide_env_values = true
    )]
    pub webhook_secret: Option<String>,

    /// Send webhooks without signatures (receivers cannot tell ours from a forgery). Logged as
    /// a warning at start and reported on `/readyz`.
    #[arg(
        id = "notificacoes_webhook_unsigned",
        long = "webhook-unsigned",
        env = "NOTIFICACOES_WEBHOOK_UNSIGNED",
        default_value_t = false,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    pub webhook_unsigned: bool,

    /// A webhook call (connection included) that takes longer fails and is retried, in ms.
    #[arg(id = "notificacoes_webhook_timeout_ms", value_name = "WEBHOOK_TIMEOUT_MS", long = "webhook-timeout-ms", env = "NOTIFICACOES_WEBHOOK_TIMEOUT_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..=120_000))]
    pub webhook_timeout_ms: u64,

    /// Most webhook calls in flight per consumer (main and each retry topic); with
    /// `--consumption share-group`, the share group members of this process, each working on
    /// one record at a time (a call, or a retry waiting out its delay).
    #[arg(id = "notificacoes_concurrency", value_name = "CONCURRENCY", long = "webhook-concurrency", env = "NOTIFICACOES_WEBHOOK_CONCURRENCY", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1_024))]
    pub concurrency: u32,

    /// How outcome events are read: `retry-topics` (the contract's consumer groups and retry
    /// topics) or `share-group` (a Kafka share group, KIP-932: Kafka 4.2 or later; retries by
    /// redelivery, the same delays and dead letters).
    #[arg(id = "notificacoes_consumption", value_name = "CONSUMPTION", long = "consumption", env = "NOTIFICACOES_CONSUMPTION", value_enum, default_value_t = Consumption::RetryTopics)]
    pub consumption: Consumption,
}

/// How `notificacoes` reads the outcome topics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Consumption {
    /// Consumer groups `notificacoes` and `notificacoes-retry-<ms>`, retry topics, `-dlt`.
    #[default]
    RetryTopics,
    /// Share group `notificacoes-share` (KIP-932), retried by redelivery.
    ShareGroup,
}

impl std::fmt::Debug for NotificationsArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // by hand, so that the secret and the URL's credentials are never printed
        f.debug_struct("NotificationsArgs")
            .field("listen", &self.listen)
            .field("webhook_url", &self.webhook_url.as_ref().map(redacted))
            .field("webhook_secret", &self.webhook_secret.as_ref().map(|_| "***"))
            .field("webhook_unsigned", &self.webhook_unsigned)
            .field("webhook_timeout_ms", &self.webhook_timeout_ms)
            .field("concurrency", &self.concurrency)
            .field("consumption", &self.consumption)
            .finish()
    }
}

/// An absolute `http` or `https` URL.
fn parse_webhook_url(text: &str) -> Result<reqwest::Url, String> {
    let url = reqwest::Url::parse(text).map_err(|error| format!("not a URL: {error}"))?;
    match url.scheme() {
        "http" | "https" if url.host().is_some() => Ok(url),
        "http" | "https" => Err("the URL names no host".into()),
        scheme => Err(format!("scheme {scheme} is not http or https")),
    }
}

/// Everything a running notifications service needs; `auth` says who may read `/readyz`'s detail
/// (the admin token, or everyone with `--insecure-no-auth`).
pub type Settings = service::Settings<NotificationsArgs, telemetry::health::HealthAuthArgs>;

/// The settings of a test or a benchmark: an ephemeral health port, webhook `url` signed with
/// `secret` (5 s time-out, 16 at once, retry topics), `partitions` partitions on one replica, the
/// fast profile, no admin token (`/readyz` answers its status line only), `/metrics` on the
/// health port. Every field is public: a case changes what it is about.
pub fn settings_for_tests(
    kafka: KafkaArgs,
    url: reqwest::Url,
    secret: impl Into<String>,
    partitions: i32,
) -> Settings {
    Settings {
        args: NotificationsArgs {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            webhook_url: Some(url),
            webhook_secret: Some(secret.into()),
            webhook_unsigned: false,
            webhook_timeout_ms: 5_000,
            concurrency: 16,
            consumption: Consumption::RetryTopics,
        },
        auth: telemetry::health::HealthAuthArgs::default(),
        kafka,
        topics: TopicArgs { partitions, replicas: 1 },
        profile: Profile::Fast,
        metrics: telemetry::health::MetricsRoute::ServicePort,
        producer: None,
    }
}

/// The contract's chain: 1 s, 2 s, 4 s.
pub fn chain() -> Chain {
    Chain { delays_ms: topics::RETRY_DELAYS_MS.to_vec() }
}

/// notificacoes as `pagamentos notificacoes` and `pagamentos all` start it.
#[derive(Debug, Clone, Copy)]
pub struct Notifications;

impl service::Service for Notifications {
    const NAME: &'static str = "notificacoes";
    const LISTEN_VARIABLE: &'static str = "NOTIFICACOES_LISTEN";
    type Args = NotificationsArgs;
    type Auth = telemetry::health::HealthAuthArgs;
    type Error = Error;

    fn listen(args: &NotificationsArgs) -> SocketAddr {
        args.listen
    }

    fn start(
        settings: Settings,
        supervisor: &Supervisor,
    ) -> impl std::future::Future<Output = Result<SocketAddr, Error>> {
        start(settings, supervisor)
    }
}

/// Makes sure the topics exist, then spawns the four stage consumers, the lag and
/// dead-letter gauges and the health routes on `supervisor`, each a named critical task.
/// Returns the health address.
pub async fn start(settings: Settings, supervisor: &Supervisor) -> Result<SocketAddr, Error> {
    let Settings { args, auth, kafka, topics: topic_args, profile, metrics, producer } = settings;
    // before anything else: who may read /readyz's detail (refused with both a token and
    // --insecure-no-auth), and a webhook nobody can authenticate is sent only when asked for
    let detail = auth.resolve("notificacoes")?;
    let mut warnings = Vec::new();
    let webhook = match &args.webhook_url {
        Some(url) => {
            let secret = signing(&args)?;
            if secret.is_none() {
                tracing::warn!(webhook = %redacted(url), "{UNSIGNED_WARNING}");
                warnings.push(UNSIGNED_WARNING.to_owned());
            }
            Some(webhook::Webhook::new(webhook::WebhookSettings {
                url: url.clone(),
                secret,
                timeout: Duration::from_millis(args.webhook_timeout_ms),
                pool_idle_per_host: args.concurrency as usize,
            })?)
        }
        None => {
            tracing::warn!("NOTIFICACOES_WEBHOOK_URL not set: notifications are logged, not sent");
            None
        }
    };
    let shell = Shell::begin("notificacoes", supervisor, &kafka, &topic_args).await?;
    let shutdown = shell.shutdown();
    let bases: Vec<String> = topics::RETRIED_TOPICS.iter().map(|topic| kafka.topic(topic)).collect();
    let consumed: Vec<String> = chain()
        .stages(&bases, "")
        .iter()
        .flat_map(|stage| stage.topics().into_iter().map(str::to_owned))
        .collect();
    let notifier = Arc::new(notifier::Notifier::new(webhook, kafka.topic(topics::SETTLED)));
    let producer = Producer::shared_or_own(producer, &kafka, "notificacoes", profile.linger())?;
    let chain = chain();
    let stages = match args.consumption {
        Consumption::RetryTopics => chain.stages(&bases, &kafka.group(topics::groups::NOTIFICATIONS)),
        Consumption::ShareGroup => Vec::new(), // no retry-topic stage: the share group's members below
    };
    let options = StageOptions { concurrency: args.concurrency as usize, ..StageOptions::default() };

    let checks: Vec<Arc<dyn telemetry::health::ReadinessCheck>> =
        vec![Arc::new(kafka::health::KafkaReady::new(producer.clone(), bases[0].clone()))];
    warnings.extend(auth.warnings());
    let readiness = shell.readiness(checks, detail, warnings);
    let app = telemetry::health::router(readiness, metrics);
    let bound = shell.serve("notificacoes health", args.listen, app, &consumed, &bases).await?;

    for stage in stages {
        let name = match stage.attempt {
            1 => "main".to_owned(),
            attempt => format!("retry-{}", chain.delays_ms[attempt as usize - 2]),
        };
        let consumer = kafka::consumer::subscribe(
            &consumer_config(&kafka, "notificacoes", &stage.group, OffsetCommit::StoredAfterHandling),
            &stage.topics(),
        )?;
        shell.spawn(
            &format!("{name}-lag-gauges"),
            kafka::lag::report(consumer.clone(), stage.group.clone(), shutdown.clone()),
        );
        let run = kafka::retry_topic::run(
            consumer,
            notifier.clone(),
            producer.clone(),
            chain.clone(),
            stage,
            options.clone(),
            shutdown.clone(),
        );
        shell.spawn_fallible(&name, run);
    }
    if args.consumption == Consumption::ShareGroup {
        let settings = share_group::ShareGroupSettings {
            kafka: kafka.clone(),
            topics: bases.clone(),
            notifier: notifier.clone(),
            producer: producer.clone(),
            chain: chain.clone(),
            members: args.concurrency as usize,
        };
        share_group::start(settings, supervisor).await?;
    }
    shell.report_dead_letters(&bases);
    tracing::info!(webhook = ?args.webhook_url.as_ref().map(redacted), "notificacoes started");
    Ok(bound)
}

/// What `/readyz` and the start-up log say of `--webhook-unsigned`.
pub const UNSIGNED_WARNING: &str =
    "webhooks are sent unsigned (NOTIFICACOES_WEBHOOK_UNSIGNED): receivers cannot tell them from forgeries";

/// The secret webhooks are signed with: `None` only when the operator asked for unsigned ones.
fn signing(args: &NotificationsArgs) -> Result<Option<webhook::WebhookSecret>, Error> {
    let secret = args.webhook_secret.as_deref().filter(|secret| !secret.is_empty());
    match (secret, args.webhook_unsigned) {
        (Some(_), true) => Err(Error::Signing(
            "NOTIFICACOES_WEBHOOK_SECRET and NOTIFICACOES_WEBHOOK_UNSIGNED=true were both given; choose one"
                .into(),
        )),
        (Some(secret), false) => webhook::WebhookSecret::parse(secret)
            .map(Some)
            .map_err(|error| Error::Signing(format!("NOTIFICACOES_WEBHOOK_SECRET: {error}"))),
        (None, true) => Ok(None),
        (None, false) => Err(Error::Signing(
            "a webhook URL is set but no NOTIFICACOES_WEBHOOK_SECRET to sign with (set one, or \
             NOTIFICACOES_WEBHOOK_UNSIGNED=true to send unsigned webhooks)"
                .into(),
        )),
    }
}

/// `url` without what may be a secret (user info, query, fragment): safe to log.
pub fn redacted(url: &reqwest::Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    let hidden = url.query().is_some() || !url.username().is_empty() || url.password().is_some();
    shown.set_query(None);
    shown.set_fragment(None);
    if hidden {
        format!("{shown} (credentials and query hidden)")
    } else {
        shown.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_urls_must_be_http_with_a_host() {
        assert!(parse_webhook_url("http://localhost:9000/hooks").is_ok());
        assert!(parse_webhook_url("https://example.com/").is_ok());
        assert!(parse_webhook_url("ftp://example.com/").expect_err("ftp").contains("not http or https"));
        assert!(parse_webhook_url("localhost:9000").is_err());
        assert!(parse_webhook_url("not a url").expect_err("garbage").contains("not a URL"));
    }

    fn args(url: &str, secret: Option<&str>, unsigned: bool) -> NotificationsArgs {
        NotificationsArgs {
            listen: "127.0.0.1:0".parse().expect("address"),
            webhook_url: Some(parse_webhook_url(url).expect("url")),
            webhook_secret: secret.map(str::to_owned),
            webhook_unsigned: unsigned,
            webhook_timeout_ms: 1_000,
            concurrency: 1,
            consumption: Consumption::RetryTopics,
        }
    }

    #[test]
    fn webhooks_are_signed_unless_the_operator_says_otherwise() {
        let url = "http://localhost:9000/hooks";
        assert!(matches!(signing(&args(url, Some("s3cret"), false)), Ok(Some(_))));
        assert!(matches!(signing(&args(url, None, true)), Ok(None)));
        for (secret, unsigned, says) in [
            (None, false, "no NOTIFICACOES_WEBHOOK_SECRET"),
            (Some(""), false, "no NOTIFICACOES_WEBHOOK_SECRET"),
            (Some("s3cret"), true, "choose one"),
            (Some("whsec_!!"), false, "base64"),
        ] {
            let error = signing(&args(url, secret, unsigned)).expect_err("refused").to_string();
            assert!(error.contains(says), "{secret:?}/{unsigned}: {error}");
        }
    }

    #[test]
    fn logged_urls_hide_credentials_and_queries() {
        let url =
            parse_webhook_url("https://user:pa55@hooks.example.com:8443/in?token=t0k3n#x").expect("url");
        let shown = redacted(&url);
        assert_eq!(shown, "https://hooks.example.com:8443/in (credentials and query hidden)");
        assert_eq!(redacted(&parse_webhook_url("http://h/p").expect("url")), "http://h/p");
    }
}

/// What can stop the service from starting.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kafka(#[from] kafka::Error),
    #[error(transparent)]
    Auth(#[from] telemetry::health::HealthAuthError),
    #[error(transparent)]
    Webhook(#[from] webhook::ClientBuildError),
    #[error(transparent)]
    ShareGroup(#[from] share_group::Error),
    #[error("cannot sign webhooks: {0}")]
    Signing(String),
    #[error(transparent)]
    Shell(#[from] service::Error),
}
