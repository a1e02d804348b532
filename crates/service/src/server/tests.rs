//! The HTTP edge's limits, timeouts and drain, on real sockets.

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
    let limits =
        Limits { header_read_timeout: Duration::from_millis(300), max_connections: 8, ..Limits::default() };
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
    fine.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.expect("request");
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
    fine.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.expect("request");
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
    let _ = tokio::time::timeout(Duration::from_secs(5), h2c.read_to_end(&mut rest)).await.expect("closed");
}
