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

    /// The HTTP/2 connection preface and an empty SETTINGS frame: an h2c client with prior
    /// knowledge, as any client may open before it sends a token.
    const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

    /// The frames in `bytes`: (type, flags, stream, payload).
    fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut frames = Vec::new();
        while bytes.len() >= 9 {
            let length = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
            let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff;
            let payload = bytes.get(9..9 + length).unwrap_or_default().to_vec();
            frames.push((bytes[3], bytes[4], stream, payload));
            bytes = bytes.get(9 + length..).unwrap_or_default();
        }
        frames
    }

    const GOAWAY: u8 = 0x7;
    const HEADERS: u8 = 0x1;

    async fn idle_server(idle: Duration) -> SocketAddr {
        let limits = Limits { idle_timeout: idle, ..Limits::default() };
        let app = Router::new().route(
            "/slow",
            get(move || async move {
                tokio::time::sleep(idle * 3).await;
                "done"
            }),
        );
        let (address, serve) =
            bind_with("test", "127.0.0.1:0".parse().expect("address"), app, std::future::pending(), limits)
                .await
                .expect("bind");
        tokio::spawn(serve);
        address
    }

    #[tokio::test]
    async fn an_idle_h2c_connection_is_told_goaway_and_closed_after_the_idle_time() {
        let idle = Duration::from_millis(500);
        let address = idle_server(idle).await;
        let mut h2c = TcpStream::connect(address).await.expect("connect");
        h2c.write_all(H2_PREFACE).await.expect("preface");
        let started = tokio::time::Instant::now();
        // without the idle limit this read waits for its own 60 s limit
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(60), h2c.read_to_end(&mut answer)).await;
        let elapsed = started.elapsed();
        assert!(elapsed >= idle && elapsed < Duration::from_secs(10), "closed after {elapsed:?}");
        let frames = frames(&answer);
        assert!(frames.iter().any(|frame| frame.0 == GOAWAY), "{frames:?}");
    }

    #[tokio::test]
    async fn a_connection_that_never_says_anything_is_closed_after_the_idle_time() {
        let idle = Duration::from_millis(500);
        let address = idle_server(idle).await;
        let mut silent = TcpStream::connect(address).await.expect("connect");
        let started = tokio::time::Instant::now();
        let answer = read_all(&mut silent).await;
        let elapsed = started.elapsed();
        assert!(elapsed >= idle && elapsed < Duration::from_secs(10), "closed after {elapsed:?}: {answer:?}");
        // a client that stops halfway through the preface too
        let mut halfway = TcpStream::connect(address).await.expect("connect");
        halfway.write_all(&H2_PREFACE[..20]).await.expect("part of the preface");
        let started = tokio::time::Instant::now();
        read_all(&mut halfway).await;
        assert!(started.elapsed() < Duration::from_secs(10), "closed after {:?}", started.elapsed());
    }

    #[tokio::test]
    async fn an_h2c_request_in_flight_longer_than_the_idle_time_is_answered() {
        let idle = Duration::from_millis(500);
        let address = idle_server(idle).await;
        let mut h2c = TcpStream::connect(address).await.expect("connect");
        h2c.write_all(H2_PREFACE).await.expect("preface");
        // GET /slow on stream 1, HPACK by hand: :method GET (indexed 2), :scheme http (6),
        // :path (name 4) "/slow", :authority (name 1) "x"; END_STREAM | END_HEADERS
        let block: &[u8] = b"\x82\x86\x04\x05/slow\x01\x01x";
        let mut frame = vec![0, 0, block.len() as u8, HEADERS, 0x5, 0, 0, 0, 1];
        frame.extend_from_slice(block);
        h2c.write_all(&frame).await.expect("request");
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(60), h2c.read_to_end(&mut answer)).await;
        let frames = frames(&answer);
        // :status 200 is entry 8 of HPACK's static table
        let response = frames.iter().position(|frame| frame.0 == HEADERS && frame.2 == 1);
        let response = response.unwrap_or_else(|| panic!("no response on stream 1: {frames:?}"));
        assert_eq!(frames[response].3.first(), Some(&0x88), "{frames:?}");
        // and once it was answered, the connection went idle and was closed
        let goaway = frames.iter().position(|frame| frame.0 == GOAWAY);
        assert!(goaway.is_some_and(|goaway| goaway > response), "{frames:?}");
    }

    #[tokio::test]
    async fn a_request_past_the_timeout_after_its_handoff_is_answered_outcome_unknown() {
        let limits = Limits { request_timeout: Duration::from_secs(1), ..Limits::default() };
        let app = Router::new().route(
            "/handed-over",
            axum::routing::post(|handoff: Handoff| async move {
                handoff.mark();
                std::future::pending::<&'static str>().await
            }),
        );
        let (address, serve) =
            bind_with("test", "127.0.0.1:0".parse().expect("address"), app, std::future::pending(), limits)
                .await
                .expect("bind");
        tokio::spawn(serve);
        let mut stream = TcpStream::connect(address).await.expect("connect");
        stream
            .write_all(b"POST /handed-over HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
            .await
            .expect("request");
        let answer = read_all(&mut stream).await;
        assert!(answer.starts_with("HTTP/1.1 500"), "{answer:?}");
        assert!(answer.contains("content-type: application/problem+json"), "{answer:?}");
        assert!(!answer.contains("retry-after"), "{answer:?}");
        let body: serde_json::Value =
            serde_json::from_str(answer.split_once("\r\n\r\n").expect("body").1).expect("JSON");
        assert_eq!(
            (body["type"].as_str(), body["status"].as_u64()),
            (Some("/problems/outcome-unknown"), Some(500))
        );
    }

    #[tokio::test]
    async fn shutdown_answers_the_requests_in_flight_and_closes_idle_connections() {
        let entered = Arc::new(Semaphore::new(0));
        let app = {
            let entered = entered.clone();
            Router::new().route(
                "/slow",
                get(move || {
                    let entered = entered.clone();
                    async move {
                        entered.add_permits(1);
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        "done"
                    }
                }),
            )
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (address, serve) = bind_with(
            "test",
            "127.0.0.1:0".parse().expect("address"),
            app,
            async move {
                let _ = stopped.await;
            },
            Limits::default(),
        )
        .await
        .expect("bind");
        let served = tokio::spawn(serve);
        let mut idle = TcpStream::connect(address).await.expect("connect");
        let mut h2c = TcpStream::connect(address).await.expect("connect");
        h2c.write_all(H2_PREFACE).await.expect("preface");
        let mut busy = TcpStream::connect(address).await.expect("connect");
        busy.write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n").await.expect("request");
        let _entered = entered.acquire().await.expect("in flight");
        let started = tokio::time::Instant::now();
        stop.send(()).expect("stop");
        assert!(read_all(&mut busy).await.starts_with("HTTP/1.1 200"));
        tokio::time::timeout(Duration::from_secs(5), served).await.expect("stopped").expect("serve");
        // well before the idle time (10 s): the idle connections did not hold the shutdown
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        assert!(!read_all(&mut idle).await.starts_with("HTTP/1.1 200"));
        let mut rest = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(5), h2c.read_to_end(&mut rest)).await.expect("closed");
    }
}
