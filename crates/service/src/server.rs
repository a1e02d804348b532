//! Serving a service's router: bind, then serve until shutdown, draining open requests.
//!
//! The HTTP edge is bounded, so a slow or hostile client cannot hold a service's resources:
//! a client that has not sent a request's whole head within [`Limits::header_read_timeout`]
//! is disconnected (slowloris); a connection with no request in flight for
//! [`Limits::idle_timeout`], whatever its protocol (silent since it connected, stopped halfway
//! through the HTTP/2 preface, an h2c connection with no open stream), is closed (HTTP/2: told
//! `GOAWAY` first, and cut one idle time later if it does not finish closing); HTTP/2 runs
//! with bounded streams, header lists and keep-alive pings. Past [`Limits::max_connections`]
//! open connections a new one is answered `503` with a problem document and `Retry-After` and
//! closed at once, counted in `http_server_connections_refused_total`, instead of waiting
//! unseen in the kernel's backlog: idle connections opened before any token is checked hold a
//! place for at most the idle time, and cannot lock the API out.
//!
//! A request not answered within [`Limits::request_timeout`] (30 s by default,
//! `PAGAMENTOS_HTTP_REQUEST_TIMEOUT_MS`) is abandoned (its handler dropped, an open database
//! transaction rolled back), counted in `http_server_requests_timed_out_total`, and answered
//! according to its [`Handoff`]: `503` `/problems/timeout` with `Retry-After` while nothing was
//! handed over (the request ends with its handler), `500` `/problems/outcome-unknown` without
//! `Retry-After` once the handler handed the request to what carries it out without it (a
//! group-commit writer, a transaction that may be committing): it may take effect after the
//! answer, so the client is told to look it up or retry with the same key, never to retry
//! blindly.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::sync::{watch, Semaphore};

/// Bounds of one HTTP listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest time a client may take to send a request's line and headers.
    pub header_read_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
    /// Longest time a request may take to be answered, from its head read to its response.
    pub request_timeout: Duration,
    /// Longest time a connection may stay open with no request in flight, whatever its
    /// protocol (before its first byte, between HTTP/1.1 requests, an HTTP/2 connection with no
    /// open stream).
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 1_024,
            request_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(10),
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

/// Whether a request has been handed over to what carries it out without its handler (a
/// group-commit writer task, a database transaction that may be committing when its handler is
/// dropped), read when the request times out: before the handoff, abandoning the handler
/// abandons the request (`503` `/problems/timeout`, retry at will); after it, the request may
/// still take effect, so the answer is `500` `/problems/outcome-unknown`.
///
/// An extractor: a handler takes it and calls [`Handoff::mark`] at the moment the handoff
/// happens. Outside [`bind`]'s routers (a router served on its own) it marks nothing anyone
/// reads.
#[derive(Debug, Clone, Default)]
pub struct Handoff(Arc<AtomicBool>);

impl Handoff {
    /// The request is handed over: from now on a timeout leaves its outcome unknown.
    pub fn mark(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`Self::mark`] was called.
    pub fn is_marked(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Handoff {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<Self>().cloned().unwrap_or_default())
    }
}

/// What a request past [`Limits::request_timeout`] is answered (as problem+json): see
/// [`Handoff`].
fn timed_out(name: &'static str, limit: Duration, handoff: &Handoff) -> axum::response::Response {
    metrics::counter!("http_server_requests_timed_out_total", "server" => name).increment(1);
    let limit_ms = limit.as_millis() as u64;
    // by hand: no JSON library in this crate, and nothing in them needs escaping
    let (status, body) = if handoff.is_marked() {
        tracing::warn!(
            name,
            limit_ms,
            "request timed out after it was handed over: its outcome is unknown (answered outcome-unknown)"
        );
        let body = format!(
            "{{\"type\":\"/problems/outcome-unknown\",\"title\":\"Outcome unknown\",\"status\":500,\"detail\":\"the \
             request was not answered within {limit_ms} ms after it was handed over to be carried out: it may \
             or may not take effect. Do not send it again without its key: retry with the same \
             Idempotency-Key (or depositoId), which answers with the result if it took effect and applies it \
             once if not, or look the result up\"}}"
        );
        (axum::http::StatusCode::INTERNAL_SERVER_ERROR, body)
    } else {
        tracing::warn!(name, limit_ms, "request timed out; abandoned");
        let body = format!(
            "{{\"type\":\"/problems/timeout\",\"title\":\"Request timeout\",\"status\":503,\"detail\":\"the \
             request was not answered within {limit_ms} ms and was abandoned; it may or may not have taken \
             effect: look the result up, or retry (with the same Idempotency-Key where there is one)\"}}"
        );
        (axum::http::StatusCode::SERVICE_UNAVAILABLE, body)
    };
    let mut response = axum::response::IntoResponse::into_response((
        status,
        [(axum::http::header::CONTENT_TYPE, "application/problem+json")],
        body,
    ));
    let headers = response.headers_mut();
    if status == axum::http::StatusCode::SERVICE_UNAVAILABLE {
        headers.insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
    }
    headers.insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
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
// Over 100 lines on purpose: the accept loop and each connection's task share the limits, the
// connection semaphore and the shutdown watch; split, each part would take all of them.
pub async fn bind_with(
    name: &'static str,
    address: SocketAddr,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: Limits,
) -> std::io::Result<(SocketAddr, impl Future<Output = ()> + Send + 'static)> {
    let limit = limits.request_timeout;
    let app = app.layer(axum::middleware::from_fn(
        move |mut request: axum::extract::Request, next: axum::middleware::Next| async move {
            let handoff = Handoff::default();
            request.extensions_mut().insert(handoff.clone());
            match tokio::time::timeout(limit, next.run(request)).await {
                Ok(response) => response,
                Err(_) => timed_out(name, limit, &handoff),
            }
        },
    ));
    let listener = tokio::net::TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    tracing::info!(address = %bound, name, "listening");
    let serve = async move {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(HTTP2_MAX_CONCURRENT_STREAMS)
            .max_header_list_size(HTTP2_MAX_HEADER_LIST_SIZE)
            .keep_alive_interval(HTTP2_KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(HTTP2_KEEP_ALIVE_TIMEOUT);
        let connections = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
        let permits = Arc::new(Semaphore::new(connections));
        let (stop, stopping) = watch::channel(false);
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
            let activity = Activity::default();
            let service =
                TowerToHyperService::new(Tracked { inner: app.clone(), activity: activity.clone() });
            let connection =
                builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
            let mut stopping = stopping.clone();
            let idle = limits.idle_timeout;
            // closed gracefully when the server stops or once the connection has had no
            // request in flight for `idle`; cut when it is still open, and still idle, one
            // `idle` later: a peer that never finishes an HTTP/2 close (never acknowledges the
            // GOAWAY's ping), or never sends a byte, holds its place no longer
            tokio::spawn(async move {
                let _permit = permit;
                tokio::pin!(connection);
                let (mut closing, mut stopped) = (false, false);
                loop {
                    // the server stopping: idle connections are not waited for long
                    let idle = if stopped { idle.min(SHUTDOWN_IDLE_GRACE) } else { idle };
                    tokio::select! {
                        ended = connection.as_mut() => {
                            if let Err(error) = ended {
                                tracing::debug!(%error, name, "connection ended with an error");
                            }
                            break;
                        }
                        _ = stopping.wait_for(|stop| *stop), if !stopped => {
                            stopped = true;
                            if !closing {
                                connection.as_mut().graceful_shutdown();
                                closing = true;
                            }
                        }
                        _ = activity.idle_for(idle) => {
                            if closing {
                                tracing::debug!(name, "connection still idle after it was asked to close: cut");
                                break;
                            }
                            tracing::debug!(name, idle_ms = idle.as_millis() as u64, "connection idle: closing");
                            connection.as_mut().graceful_shutdown();
                            closing = true;
                        }
                    }
                }
            });
        }
        drop(listener);
        // every connection closes once its requests are answered (idle ones at once); each
        // holds its permit until it is gone
        let _ = stop.send(true);
        let _all_closed = permits.acquire_many(connections as u32).await;
    };
    Ok((bound, serve))
}

/// Once the server stops, how long a connection asked to close may stay open with no request
/// in flight (an HTTP/2 peer that does not acknowledge the `GOAWAY`'s ping) before it is cut.
const SHUTDOWN_IDLE_GRACE: Duration = Duration::from_secs(1);
/// Most streams (requests) one HTTP/2 connection may have open at once.
const HTTP2_MAX_CONCURRENT_STREAMS: u32 = 64;
/// Largest HTTP/2 header list (HTTP/1.1's heads are bounded by hyper's buffer likewise).
const HTTP2_MAX_HEADER_LIST_SIZE: u32 = 16 * 1024;
/// An HTTP/2 peer is pinged this often and dropped when it has not answered within
/// [`HTTP2_KEEP_ALIVE_TIMEOUT`]: a vanished peer does not hold its requests' streams.
const HTTP2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
const HTTP2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The requests in flight on one connection, and since when there are none.
#[derive(Debug, Clone)]
struct Activity(Arc<watch::Sender<usize>>);

impl Default for Activity {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(0)))
    }
}

impl Activity {
    fn begin(&self) -> InFlight {
        self.0.send_modify(|requests| *requests += 1);
        InFlight(self.clone())
    }

    /// Resolves once no request has been in flight for `idle` without a break.
    async fn idle_for(&self, idle: Duration) {
        let mut requests = self.0.subscribe();
        loop {
            if requests.wait_for(|requests| *requests == 0).await.is_err() {
                return;
            }
            if tokio::time::timeout(idle, requests.changed()).await.is_err() {
                return;
            }
        }
    }
}

/// One request in flight, until dropped.
struct InFlight(Activity);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0 .0.send_modify(|requests| *requests = requests.saturating_sub(1));
    }
}

/// The service of one connection: counts its requests in flight in `activity`.
#[derive(Debug, Clone)]
struct Tracked<S> {
    inner: S,
    activity: Activity,
}

impl<S, R> tower::Service<R> for Tracked<S>
where
    S: tower::Service<R>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let in_flight = self.activity.begin();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            drop(in_flight);
            answer
        })
    }
}

#[cfg(test)]
mod tests;
