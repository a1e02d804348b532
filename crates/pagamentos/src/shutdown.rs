//! Graceful shutdown in three steps (decide, tell, wait): SIGINT or SIGTERM cancels one token
//! every loop watches at its safe points; `main` then waits for the tracked tasks, with a
//! deadline.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long the tasks get to finish the work in hand after the signal.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(30);

/// Cancels `token` on the first SIGINT (ctrl-c) or SIGTERM.
pub fn cancel_on_signal(token: CancellationToken) {
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
            _ = interrupt => tracing::info!("SIGINT: shutting down"),
            _ = terminate => tracing::info!("SIGTERM: shutting down"),
        }
        token.cancel();
    });
}

/// Waits for every tracked task after `token` is cancelled; false if the deadline passed.
pub async fn drain(token: &CancellationToken, tracker: &TaskTracker) -> bool {
    token.cancelled().await;
    tracker.close();
    match tokio::time::timeout(DRAIN_DEADLINE, tracker.wait()).await {
        Ok(()) => {
            tracing::info!("all work drained; bye");
            true
        }
        Err(_) => {
            tracing::error!(deadline = ?DRAIN_DEADLINE, "tasks still running at the deadline; exiting anyway");
            false
        }
    }
}
