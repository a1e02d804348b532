//! The start skeleton every service runs on.
//!
//! A service's `start` takes its [`Settings`] and a [`Supervisor`], does what is its own first
//! (resolving its tokens, connecting and migrating its database), then [`Shell::begin`] (the
//! topics exist as the plan has them), builds its routes and [`Shell::readiness`], and
//! [`Shell::serve`]s them; then it spawns its own tasks through the shell, each named
//! `<service>/<task>`, and [`Shell::report_dead_letters`] for the topics it consumes.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use kafka::config::{KafkaArgs, Profile, TopicArgs};
use kafka::producer::Producer;
use telemetry::health::{MetricsRoute, Readiness, ReadinessCheck, ReadinessDetail};
use tokio_util::sync::CancellationToken;

use crate::supervisor::Supervisor;

/// Everything a running service is given: its own arguments and auth settings, and what every
/// service shares.
#[derive(Debug, Clone)]
pub struct Settings<Args, Auth> {
    pub args: Args,
    /// Bearer tokens (a service with an API) or who may read `/readyz`'s detail.
    pub auth: Auth,
    pub kafka: KafkaArgs,
    pub topics: TopicArgs,
    pub profile: Profile,
    /// `/metrics` on the service's port (the default), or on the process's own metrics listener.
    pub metrics: MetricsRoute,
    /// The producer to publish with when the process shares one between its services
    /// (`pagamentos all`); `None`: the service builds its own, named after itself.
    pub producer: Option<Producer>,
}

/// What can stop the shell's steps.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kafka(#[from] kafka::Error),
    #[error("cannot listen on {address}")]
    Bind {
        address: String,
        #[source]
        source: std::io::Error,
    },
}

/// A service being started on a supervisor.
#[derive(Debug)]
pub struct Shell<'a> {
    name: &'static str,
    supervisor: &'a Supervisor,
    kafka: KafkaArgs,
}

impl<'a> Shell<'a> {
    /// The start-up check every service makes before it serves: the topics exist with the
    /// plan's partitions and settings (created when allowed, else refused with what differs).
    pub async fn begin(
        name: &'static str,
        supervisor: &'a Supervisor,
        kafka: &KafkaArgs,
        topics: &TopicArgs,
    ) -> Result<Shell<'a>, Error> {
        kafka_admin::topics::ensure_at_start(kafka, topics).await?;
        Ok(Self { name, supervisor, kafka: kafka.clone() })
    }

    /// The token every task of the service watches.
    pub fn shutdown(&self) -> CancellationToken {
        self.supervisor.shutdown_token()
    }

    /// `/readyz`: ready when every one of `checks` passes and no critical task stopped; the
    /// detail (`warnings` first, then the process's) for whom `detail` names.
    pub fn readiness(
        &self,
        checks: Vec<Arc<dyn ReadinessCheck>>,
        detail: ReadinessDetail,
        warnings: Vec<String>,
    ) -> Readiness {
        Readiness::new(checks, detail).with_warnings(warnings).supervised_by(self.supervisor)
    }

    /// Serves `app` on `listen` as the critical task `<service>/http` (`label` names the
    /// listener in logs and metrics) and returns the bound address (port 0 picks a free one).
    /// Before `/readyz` can answer, `retries_total` of the `retried` topics and
    /// `dlt_mensagens_total` of the `dead_lettered` topics' DLTs are exported at 0 (the alerts
    /// need a series before its first increase); call it after the metrics recorder is
    /// installed (the health router installs it).
    pub async fn serve(
        &self,
        label: &'static str,
        listen: SocketAddr,
        app: Router,
        retried: &[String],
        dead_lettered: &[String],
    ) -> Result<SocketAddr, Error> {
        kafka::alerting::export_at_zero(retried, dead_lettered);
        let (bound, serve) = crate::server::bind(label, listen, app, self.shutdown().cancelled_owned())
            .await
            .map_err(|source| Error::Bind { address: listen.to_string(), source })?;
        self.spawn("http", serve);
        Ok(bound)
    }

    /// `<service>/dlt-gauges`: the dead letters retained on the DLT of each `consumed` topic.
    pub fn report_dead_letters(&self, consumed: &[String]) {
        let topics = consumed.iter().map(|topic| contracts::topics::dead_letter_topic(topic)).collect();
        self.spawn(
            "dlt-gauges",
            kafka_admin::dlt::report_retained(
                self.kafka.clone(),
                topics,
                kafka::lag::REFRESH_INTERVAL,
                self.shutdown(),
            ),
        );
    }

    /// Runs `future` as the critical task `<service>/<task>`.
    pub fn spawn(&self, task: &str, future: impl Future<Output = ()> + Send + 'static) {
        self.supervisor.spawn(format!("{}/{task}", self.name), future);
    }

    /// Runs `future` as the critical task `<service>/<task>`; an `Err` stops the process.
    pub fn spawn_fallible<E>(&self, task: &str, future: impl Future<Output = Result<(), E>> + Send + 'static)
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        self.supervisor.spawn_fallible(format!("{}/{task}", self.name), future);
    }
}

/// A service as the one dispatcher (`pagamentos <service>`) starts it: what is its own.
pub trait Service {
    /// Its name: in logs, task names (`<name>/<task>`), errors.
    const NAME: &'static str;
    /// The setting of its listen address, for the port-conflict refusal.
    const LISTEN_VARIABLE: &'static str;
    /// Its own options.
    type Args;
    /// Its auth settings: bearer tokens, or who may read `/readyz`'s detail.
    type Auth;
    type Error: std::error::Error + Send + Sync + 'static;

    /// The address it listens on, from its options.
    fn listen(args: &Self::Args) -> SocketAddr;

    /// Its databases' URLs, each with its setting's name, for the transport check at start
    /// (none by default).
    fn databases(_args: &Self::Args) -> Vec<(&'static str, &str)> {
        Vec::new()
    }

    /// Its name, listen setting and address, for the port-conflict refusal.
    fn listen_setting(args: &Self::Args) -> (&'static str, &'static str, SocketAddr) {
        (Self::NAME, Self::LISTEN_VARIABLE, Self::listen(args))
    }

    /// Starts its tasks on `supervisor`; returns the address it serves on.
    fn start(
        settings: Settings<Self::Args, Self::Auth>,
        supervisor: &Supervisor,
    ) -> impl Future<Output = Result<SocketAddr, Self::Error>>;
}
