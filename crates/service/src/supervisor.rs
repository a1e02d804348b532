//! The supervised service shell: every long-running task of a service is registered here by
//! name, and a task that ends unexpectedly stops the whole process, loudly.
//!
//! A service's `start` spawns its tasks with [`Supervisor::spawn`] (a task that returns `()`)
//! or [`Supervisor::spawn_fallible`] (one that returns a `Result`). A task that returns while
//! the process is not shutting down, returns an error, or panics has **stopped**: the
//! supervisor logs `task <name> stopped: <why>` at error level, `/readyz` answers `503` with
//! that line (see [`telemetry::health::Readiness::supervised_by`]), and the shutdown token is cancelled so
//! that every other task drains the work in hand as on SIGTERM (nothing half-done is
//! committed: the loops watch the token only at their safe points). [`Supervisor::drain`]
//! then reports [`Drained::Stopped`], which the binary turns into a non-zero exit status so an
//! orchestrator restarts the process. A SIGINT/SIGTERM ([`Supervisor::cancel_on_signal`]) is the
//! ordinary way out: the tasks return, none stopped, and the process exits 0.
//!
//! Knows nothing of what the tasks do: Kafka loops, relays and HTTP servers are all just named
//! futures.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long the tasks get to finish the work in hand after the shutdown began.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(30);

/// Registers a service's tasks, watches them, and shuts them all down together. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Supervisor {
    shutdown: CancellationToken,
    tracker: TaskTracker,
    stopped: Arc<Mutex<Vec<String>>>,
    /// Modes the whole process runs in against the defaults (`--insecure-transport`), one
    /// `warning:` line each on the `/readyz` of every service it runs.
    warnings: Arc<Mutex<Vec<String>>>,
}

/// How the tasks ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drained {
    /// Every task returned after the shutdown began: exit 0.
    Clean,
    /// These tasks stopped on their own (one `task <name> stopped: <why>` line each): exit
    /// non-zero.
    Stopped(Vec<String>),
    /// Some tasks were still running at the deadline.
    DeadlinePassed,
}

impl Default for Supervisor {
    fn default() -> Self {
        Self::new()
    }
}

impl Supervisor {
    pub fn new() -> Self {
        Self::from_parts(CancellationToken::new(), TaskTracker::new())
    }

    /// A supervisor over an existing token and tracker (tests that drive the shutdown
    /// themselves).
    pub fn from_parts(shutdown: CancellationToken, tracker: TaskTracker) -> Self {
        Self { shutdown, tracker, stopped: Arc::default(), warnings: Arc::default() }
    }

    /// The token every task watches at its safe points; cancelled by a signal, by
    /// [`Self::shut_down`] or by a task that stopped.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Begins an orderly shutdown.
    pub fn shut_down(&self) {
        self.shutdown.cancel();
    }

    /// `true` once the shutdown began.
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// Runs `task` as the critical task `name`; returning before the shutdown began, or
    /// panicking, stops the service.
    pub fn spawn<F>(&self, name: impl Into<String>, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.spawn_fallible(name, async move {
            task.await;
            Ok::<(), std::convert::Infallible>(())
        });
    }

    /// Runs `task` as the critical task `name`; an error (whenever it comes), a panic, or an
    /// `Ok` before the shutdown began stops the service.
    pub fn spawn_fallible<F, E>(&self, name: impl Into<String>, task: F)
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: std::error::Error + Send + Sync + 'static,
    {
        let name = name.into();
        let supervisor = self.clone();
        self.tracker.spawn(async move {
            let why = match AssertUnwindSafe(task).catch_unwind().await {
                Ok(Ok(())) if supervisor.is_shutting_down() => return,
                Ok(Ok(())) => "returned while the service was not shutting down".to_owned(),
                Ok(Err(error)) => telemetry::error_chain(&error),
                Err(panic) => format!("panicked: {}", panic_message(panic.as_ref())),
            };
            supervisor.stop(&name, &why);
        });
    }

    /// Records that task `name` stopped because of `why`, and shuts the service down.
    fn stop(&self, name: &str, why: &str) {
        let line = format!("task {name} stopped: {why}");
        tracing::error!(task = name, reason = why, "{line}; shutting down");
        metrics::counter!("supervisor_tasks_stopped_total", "task" => name.to_owned()).increment(1);
        self.stopped.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(line);
        self.shutdown.cancel();
    }

    /// One `task <name> stopped: <why>` line per task that stopped on its own.
    pub fn stopped(&self) -> Vec<String> {
        self.stopped.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Reports `warnings` (modes the process runs in against the defaults, already logged) on
    /// the `/readyz` of every service supervised by this, after each service's own.
    pub fn report_warnings(&self, warnings: impl IntoIterator<Item = String>) {
        self.warnings.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).extend(warnings);
    }

    /// The warnings [`Self::report_warnings`] was given.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Cancels the shutdown token on the first SIGINT (ctrl-c) or SIGTERM.
    pub fn cancel_on_signal(&self) {
        let token = self.shutdown.clone();
        tokio::spawn(async move {
            let interrupt = tokio::signal::ctrl_c();
            #[cfg(unix)]
            let terminate = async {
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(mut signal) => {
                        signal.recv().await;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "cannot listen for SIGTERM");
                        std::future::pending::<()>().await;
                    }
                }
            };
            #[cfg(not(unix))]
            let terminate = std::future::pending::<()>();
            tokio::select! {
                _ = token.cancelled() => return,
                _ = interrupt => tracing::info!("SIGINT: shutting down"),
                _ = terminate => tracing::info!("SIGTERM: shutting down"),
            }
            token.cancel();
        });
    }

    /// Waits for the shutdown to begin, then for every task, at most [`DRAIN_DEADLINE`].
    pub async fn drain(&self) -> Drained {
        self.drain_within(DRAIN_DEADLINE).await
    }

    /// [`Self::drain`] with another deadline.
    pub async fn drain_within(&self, deadline: Duration) -> Drained {
        self.shutdown.cancelled().await;
        self.tracker.close();
        let finished = tokio::time::timeout(deadline, self.tracker.wait()).await.is_ok();
        let stopped = self.stopped();
        if !finished {
            tracing::error!(?deadline, "tasks still running at the deadline; exiting anyway");
            return if stopped.is_empty() { Drained::DeadlinePassed } else { Drained::Stopped(stopped) };
        }
        if stopped.is_empty() {
            tracing::info!("all work drained; bye");
            Drained::Clean
        } else {
            tracing::error!(stopped = ?stopped, "drained after a task stopped; exiting with an error");
            Drained::Stopped(stopped)
        }
    }
}

impl telemetry::health::Supervision for Supervisor {
    fn stopped(&self) -> Vec<String> {
        Supervisor::stopped(self)
    }

    fn is_shutting_down(&self) -> bool {
        Supervisor::is_shutting_down(self)
    }

    fn warnings(&self) -> Vec<String> {
        Supervisor::warnings(self)
    }
}
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "(no message)".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("broker gone")]
    struct Gone;

    #[tokio::test]
    async fn a_task_that_fails_shuts_the_others_down_and_is_reported() {
        let supervisor = Supervisor::new();
        let token = supervisor.shutdown_token();
        supervisor.spawn("svc/loop", async move { token.cancelled().await });
        supervisor.spawn_fallible("svc/consumer", async { Err::<(), _>(Gone) });
        let drained = supervisor.drain_within(Duration::from_secs(5)).await;
        assert_eq!(drained, Drained::Stopped(vec!["task svc/consumer stopped: broker gone".to_owned()]));
    }

    #[tokio::test]
    async fn a_task_that_returns_early_or_panics_has_stopped() {
        let supervisor = Supervisor::new();
        supervisor.spawn("svc/relay", async {});
        assert!(matches!(supervisor.drain_within(Duration::from_secs(5)).await,
            Drained::Stopped(lines) if lines == ["task svc/relay stopped: returned while the service was not shutting down"]));

        let supervisor = Supervisor::new();
        supervisor.spawn("svc/api", async { panic!("index out of bounds") });
        assert!(matches!(supervisor.drain_within(Duration::from_secs(5)).await,
            Drained::Stopped(lines) if lines == ["task svc/api stopped: panicked: index out of bounds"]));
    }

    #[tokio::test]
    async fn an_ordinary_shutdown_is_clean() {
        let supervisor = Supervisor::new();
        for name in ["a", "b"] {
            let token = supervisor.shutdown_token();
            supervisor.spawn_fallible(name, async move {
                token.cancelled().await;
                Ok::<(), Gone>(())
            });
        }
        assert!(supervisor.stopped().is_empty());
        supervisor.shut_down();
        assert_eq!(supervisor.drain_within(Duration::from_secs(5)).await, Drained::Clean);
    }
}
