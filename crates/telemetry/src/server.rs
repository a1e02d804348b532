//! Serving a service's router: bind, then serve until shutdown, draining open requests.

use std::future::Future;
use std::net::SocketAddr;

use axum::Router;

/// Binds `address` (port 0 picks a free one) and returns the bound address with the future
/// that serves `app` until `shutdown` resolves, for the caller to spawn on its task tracker.
/// `name` labels the log line if serving fails.
pub async fn bind(
    name: &'static str,
    address: SocketAddr,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, impl Future<Output = ()> + Send + 'static)> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    tracing::info!(address = %bound, name, "listening");
    let serve = async move {
        if let Err(error) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
            tracing::error!(%error, name, "HTTP server stopped");
        }
    };
    Ok((bound, serve))
}
