//! Serving a service's router: bind, then serve until shutdown, draining open requests.
//!
//! The HTTP edge is bounded, so a slow or hostile client cannot hold a service's resources:
//! a client that has not sent a request's whole head within [`Limits::header_read_timeout`]
//! is disconnected (slowloris), and past [`Limits::max_connections`] open connections a new
//! one is answered `503` with a problem document and `Retry-After` and closed at once, counted
//! in `http_server_connections_refused_total`, instead of waiting unseen in the kernel's
//! backlog. A request not answered within [`Limits::request_timeout`] (30 s by default,
//! `PAGAMENTOS_HTTP_REQUEST_TIMEOUT_MS`) is abandoned (its handler dropped, an open database
//! transaction rolled back) and answered `503` `/problems/timeout` with `Retry-After`,
//! counted in `http_server_requests_timed_out_total`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;

/// Bounds of one HTTP listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest time a client may take to send a request's line and headers.
    pub header_read_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
    /// Longest time a request may take to be answered, from its head read to its response.
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 1_024,
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// Environment variable of [`Limits::request_timeout`], in milliseconds.
pub const REQUEST_TIMEOUT_VARIABLE: &str = "PAGAMENTOS_HTTP_REQUEST_TIMEOUT_MS";

impl Limits {
    /// The defaults, with the request timeout from [`REQUEST_TIMEOUT_VARIABLE`] when set;
    /// `Err` naming the variable when it is not a positive number of milliseconds.
    pub fn from_env() -> std::io::Result<Self> {
        let mut limits = Self::default();
        if let Ok(text) = std::env::var(REQUEST_TIMEOUT_VARIABLE) {
            let millis = text.trim().parse::<u64>().ok().filter(|millis| *millis > 0).ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{REQUEST_TIMEOUT_VARIABLE}={text:?}: a positive number of milliseconds"),
                )
            })?;
            limits.request_timeout = Duration::from_millis(millis);
        }
        Ok(limits)
    }
}

/// What a request past [`Limits::request_timeout`] is answered (as problem+json).
fn timed_out(name: &'static str, limit: Duration) -> axum::response::Response {
    metrics::counter!("http_server_requests_timed_out_total", "server" => name).increment(1);
    tracing::warn!(name, limit_ms = limit.as_millis() as u64, "request timed out; abandoned");
    // by hand: no JSON library in this crate, and nothing in it needs escaping
    let body = format!(
        "{{\"type\":\"/problems/timeout\",\"title\":\"Request timeout\",\"status\":503,\"detail\":\"the request \
         was not answered within {} ms and was abandoned; it may or may not have taken effect: look the result \
         up, or retry (with the same Idempotency-Key where there is one)\"}}",
        limit.as_millis()
    );
    let mut response = axum::response::IntoResponse::into_response((
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        [
            (axum::http::header::CONTENT_TYPE, "application/problem+json"),
            (axum::http::header::RETRY_AFTER, "1"),
        ],
        body,
    ));
    response
        .headers_mut()
        .insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
    response
}

/// What a connection past the limit is told before it is closed.
const TOO_MANY_CONNECTIONS: &str = "HTTP/1.1 503 Service Unavailable\r\n\
    content-type: application/problem+json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 116\r\n\r\n\
    {\"type\":\"/problems/overloaded\",\"title\":\"Overloaded\",\"status\":503,\"detail\":\"too many open connections; retry in 1 s\"}";

/// Binds `address` (port 0 picks a free one) and returns the bound address with the future
/// that serves `app` until `shutdown` resolves, for the caller to spawn on its task tracker.
/// `name` labels the log lines. [`Limits::from_env`] applies.
pub async fn bind(
    name: &'static str,
    address: SocketAddr,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, impl Future<Output = ()> + Send + 'static)> {
    bind_with(name, address, app, shutdown, Limits::from_env()?).await
}

/// [`bind`] with explicit `limits`. On shutdown the listener closes, idle connections are
/// closed, and the future resolves once every request in flight has been answered.
pub async fn bind_with(
    name: &'static str,
    address: SocketAddr,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: Limits,
) -> std::io::Result<(SocketAddr, impl Future<Output = ()> + Send + 'static)> {
    let limit = limits.request_timeout;
    let app = app.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| async move {
            match tokio::time::timeout(limit, next.run(request)).await {
                Ok(response) => response,
                Err(_) => timed_out(name, limit),
            }
        },
    ));
    let listener = tokio::net::TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    tracing::info!(address = %bound, name, "listening");
    let serve = async move {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
        let graceful = GracefulShutdown::new();
        let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
        let service = TowerToHyperService::new(app);
        tokio::pin!(shutdown);
        loop {
            let (mut stream, _peer) = tokio::select! {
                _ = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // out of file descriptors, or a connection reset before it was taken:
                        // wait a moment instead of spinning
                        tracing::warn!(%error, name, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                metrics::counter!("http_server_connections_refused_total", "server" => name).increment(1);
                tokio::spawn(async move {
                    let _ = stream.write_all(TOO_MANY_CONNECTIONS.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
                continue;
            };
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service.clone());
            let connection = graceful.watch(connection.into_owned());
            tokio::spawn(async move {
                let _permit = permit;
                if let Err(error) = connection.await {
                    tracing::debug!(%error, name, "connection ended with an error");
                }
            });
        }
        drop(listener);
        graceful.shutdown().await;
    };
    Ok((bound, serve))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpStream;
    use tokio::sync::Notify;

    #[test]
    fn the_refusal_is_a_well_formed_problem() {
        let (head, body) = TOO_MANY_CONNECTIONS.split_once("\r\n\r\n").expect("head and body");
        assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
        let problem: serde_json::Value = serde_json::from_str(body).expect("JSON body");
        assert_eq!(problem["status"], 503);
    }

    async fn read_all(stream: &mut TcpStream) -> String {
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut answer)).await;
        String::from_utf8_lossy(&answer).into_owned()
    }

    #[tokio::test]
    async fn a_client_that_never_finishes_its_headers_is_disconnected() {
        let limits = Limits {
            header_read_timeout: Duration::from_millis(300),
            max_connections: 8,
            ..Limits::default()
        };
        let app = Router::new().route("/healthz", get(|| async { "ok" }));
        let (address, serve) =
            bind_with("test", "127.0.0.1:0".parse().expect("address"), app, std::future::pending(), limits)
                .await
                .expect("bind");
        tokio::spawn(serve);
        let mut slow = TcpStream::connect(address).await.expect("connect");
        slow.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n").await.expect("partial head");
        // without the timeout this read would wait forever (and the test fail at its limit)
        let started = tokio::time::Instant::now();
        let answer = read_all(&mut slow).await;
        assert!(started.elapsed() < Duration::from_secs(60), "still connected: {answer:?}");
        assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 408"), "{answer:?}");
        // a well-behaved client is served as before
        let mut fine = TcpStream::connect(address).await.expect("connect");
        fine.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .expect("request");
        assert!(read_all(&mut fine).await.starts_with("HTTP/1.1 200"));
    }

    #[tokio::test]
    async fn past_the_connection_limit_a_new_connection_is_refused_with_503() {
        let release = Arc::new(Notify::new());
        let entered = Arc::new(Semaphore::new(0));
        let app = {
            let (release, entered) = (release.clone(), entered.clone());
            Router::new().route(
                "/slow",
                get(move || {
                    let (release, entered) = (release.clone(), entered.clone());
                    async move {
                        entered.add_permits(1);
                        release.notified().await;
                        "done"
                    }
                }),
            )
        };
        let limits =
            Limits { header_read_timeout: Duration::from_secs(30), max_connections: 2, ..Limits::default() };
        let (address, serve) =
            bind_with("test", "127.0.0.1:0".parse().expect("address"), app, std::future::pending(), limits)
                .await
                .expect("bind");
        tokio::spawn(serve);
        let request = b"GET /slow HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut stream = TcpStream::connect(address).await.expect("connect");
            stream.write_all(request).await.expect("request");
            held.push(stream);
        }
        // both requests are in their handler: both connections hold their permits
        let _both = entered.acquire_many(2).await.expect("two requests in flight");
        let mut third = TcpStream::connect(address).await.expect("connect");
        third.write_all(request).await.expect("request");
        let answer = read_all(&mut third).await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
        assert!(answer.contains("retry-after: 1") && answer.contains("/problems/overloaded"), "{answer:?}");
        release.notify_waiters();
        for mut stream in held {
            assert!(read_all(&mut stream).await.starts_with("HTTP/1.1 200"));
        }
    }

    #[tokio::test]
    async fn a_request_past_the_timeout_is_answered_503_problem_and_others_are_not() {
        // long enough that a busy machine serves /healthz within it
        let limits = Limits { request_timeout: Duration::from_secs(1), ..Limits::default() };
        let app = Router::new()
            .route("/stuck", get(std::future::pending::<&'static str>))
            .route("/healthz", get(|| async { "ok" }));
        let (address, serve) =
            bind_with("test", "127.0.0.1:0".parse().expect("address"), app, std::future::pending(), limits)
                .await
                .expect("bind");
        tokio::spawn(serve);
        let mut stuck = TcpStream::connect(address).await.expect("connect");
        stuck.write_all(b"GET /stuck HTTP/1.1\r\nhost: x\r\n\r\n").await.expect("request");
        // without the timeout this read would wait for its own 60 s limit and find nothing
        let answer = read_all(&mut stuck).await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
        assert!(answer.contains("content-type: application/problem+json"), "{answer:?}");
        assert!(answer.contains("retry-after: 1"), "{answer:?}");
        let body: serde_json::Value =
            serde_json::from_str(answer.split_once("\r\n\r\n").expect("body").1).expect("JSON");
        assert_eq!((body["type"].as_str(), body["status"].as_u64()), (Some("/problems/timeout"), Some(503)));
        let mut fine = TcpStream::connect(address).await.expect("connect");
        fine.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .expect("request");
        let answer = read_all(&mut fine).await;
        assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"), "{answer:?}");
    }
}
