//! The ambiguous commit: the connection to PostgreSQL breaks after `COMMIT` was sent and before
//! its answer came back. The transfer is committed, yet the service cannot know it; a plain
//! "unavailable, retry later" `503` would invite a client to send the transfer again. A proxy
//! between the service and PostgreSQL forwards `COMMIT` of a transaction that inserted a
//! transfer, then cuts both connections without passing the answer on.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::ConnectOptions as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use common::{spawn_app_with, transfer};

/// A PostgreSQL proxy that, once armed, cuts the next connection that sends `COMMIT` after
/// inserting a transfer, right after forwarding it.
struct CommitCutter {
    address: SocketAddr,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
}

impl CommitCutter {
    async fn start(upstream: (String, u16)) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let armed = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicUsize::new(0));
        let (armed_, cuts_) = (armed.clone(), cuts.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(upstream.clone()).await.expect("connect to PostgreSQL");
                tokio::spawn(relay(client, server, armed_.clone(), cuts_.clone()));
            }
        });
        Self { address, armed, cuts }
    }
}

/// Client → server is read message by message (startup message first, untyped); server →
/// client is copied as is until the gate closes. After a cut COMMIT the proxy waits for the
/// server's answer (swallowed) before it drops the connections: the commit is then done for
/// certain when the service sees end-of-file, and nothing races the test's count.
// Over 100 lines on purpose: the proxy's two directions share the gate and the startup handshake
// state.
async fn relay(client: TcpStream, server: TcpStream, armed: Arc<AtomicBool>, cuts: Arc<AtomicUsize>) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let gate = Arc::new(AtomicBool::new(false));
    let closed = gate.clone();
    let answered = Arc::new(tokio::sync::Notify::new());
    let server_answered = answered.clone();
    let down = tokio::spawn(async move {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let Ok(read) = from_server.read(&mut buffer).await else { return };
            // the gate closes before COMMIT is forwarded: its answer never reaches the client.
            // Counted here, before this task returns: returning drops the half that writes to
            // the client, which then reads end-of-file and may answer its caller at once.
            if closed.load(Ordering::SeqCst) {
                cuts.fetch_add(1, Ordering::SeqCst);
                server_answered.notify_one();
                return;
            }
            if read == 0 {
                return;
            }
            if to_client.write_all(&buffer[..read]).await.is_err() {
                return;
            }
        }
    });
    let mut started = false;
    // the prepared statements (by name) that insert a transfer: sqlx prepares a statement once
    // per connection (Parse, with its text) and then only binds it (Bind names it, no text), so
    // a connection that inserted a transfer before would otherwise never be cut
    let mut insert_statements: std::collections::HashSet<Vec<u8>> = std::collections::HashSet::new();
    let mut inserted_transfer = false;
    let mut commit_parsed = false;
    loop {
        let mut kind = [0u8; 1];
        if started && from_client.read_exact(&mut kind).await.is_err() {
            break;
        }
        let mut length = [0u8; 4];
        if from_client.read_exact(&mut length).await.is_err() {
            break;
        }
        let mut body = vec![0u8; (u32::from_be_bytes(length) as usize).saturating_sub(4)];
        if from_client.read_exact(&mut body).await.is_err() {
            break;
        }
        let text = String::from_utf8_lossy(&body);
        let (query, parse, sync) = (kind[0] == b'Q', kind[0] == b'P', kind[0] == b'S');
        let inserts = text.contains("INSERT INTO transferencia (");
        if query && inserts {
            inserted_transfer = true;
        }
        // Parse: statement name, NUL, query text; Bind: portal name, NUL, statement name, NUL, …
        let mut names = body.split(|byte| *byte == 0);
        if parse {
            // a Parse replaces what the name meant (the unnamed statement, "", most often)
            let name = names.next().unwrap_or_default().to_vec();
            if inserts {
                insert_statements.insert(name);
            } else {
                insert_statements.remove(&name);
            }
        }
        if started && kind[0] == b'B' {
            let _portal = names.next();
            if names.next().is_some_and(|statement| insert_statements.contains(statement)) {
                inserted_transfer = true;
            }
        }
        let commit = (query || parse) && text.contains("COMMIT");
        commit_parsed |= parse && commit;
        // a simple-query COMMIT is complete as sent; an extended-protocol one at its Sync
        let commit_point = (query && commit) || (sync && commit_parsed);
        let cut = commit_point && inserted_transfer && armed.swap(false, Ordering::SeqCst);
        if cut {
            gate.store(true, Ordering::SeqCst);
        }
        let mut message = Vec::with_capacity(5 + body.len());
        if started {
            message.push(kind[0]);
        }
        message.extend_from_slice(&length);
        message.extend_from_slice(&body);
        if to_server.write_all(&message).await.is_err() {
            break;
        }
        if cut {
            let _ = to_server.flush().await;
            // the server's answer means the COMMIT was executed; a failure detector bound only
            let _ = tokio::time::timeout(std::time::Duration::from_secs(60), answered.notified()).await;
            break; // both halves dropped: the client reads end-of-file instead of the answer
        }
        if commit_point {
            inserted_transfer = false;
            commit_parsed = false;
        }
        // the startup message (or an SSL request, refused here by sslmode=disable) is untyped
        started = started
            || u32::from_be_bytes(body[..4.min(body.len())].try_into().unwrap_or([0; 4])) != 80_877_103;
    }
    down.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_during_commit_is_an_unknown_outcome_and_the_same_key_finds_the_transfer() {
    let server: PgConnectOptions = testkit::admin_database_url().parse().expect("database url");
    let cutter = CommitCutter::start((server.get_host().to_owned(), server.get_port())).await;
    let port = cutter.address.port();
    // the service reaches its own test database through the proxy
    let app = spawn_app_with(move |args| {
        let direct: PgConnectOptions = args.database_url.parse().expect("database url");
        let proxied = direct.host("127.0.0.1").port(port).ssl_mode(PgSslMode::Disable);
        args.database_url = proxied.to_url_lossy().to_string();
    })
    .await;

    // through the proxy, untouched, transfers are accepted as usual; the pool's connections
    // prepare the insert on the way, so the cut below meets one that only binds it (the case
    // that made this test fail now and then: fresh-clone run 16)
    for n in 0..5 {
        let before =
            app.post_transfer(&transfer("CC-001", "CC-002", 100 + n), Some(&format!("before-{n}"))).await;
        assert_eq!(before.status(), 202);
    }

    cutter.armed.store(true, Ordering::SeqCst);
    let body = transfer("CC-001", "CC-002", 4_200);
    let lost = app.post_transfer(&body, Some("ambiguous")).await;
    assert_eq!(cutter.cuts.load(Ordering::SeqCst), 1, "the proxy cut the COMMIT");
    assert_eq!(lost.status(), 500, "not a 503 that clients retry blindly");
    assert_eq!(lost.headers()["content-type"], "application/problem+json");
    assert!(lost.headers().get("retry-after").is_none());
    let problem: Value = lost.json().await.expect("problem");
    assert_eq!(problem["type"], "/problems/outcome-unknown", "{problem}");
    assert!(problem["detail"].as_str().expect("detail").contains("same Idempotency-Key"), "{problem}");

    // the commit went through although nobody heard of it: exactly the hazard
    let written: i64 = sqlx::query_scalar("SELECT count(*) FROM transferencia WHERE valor_centavos = 4200")
        .fetch_one(&app.database.pool)
        .await
        .expect("count");
    assert_eq!(written, 1, "PostgreSQL executed the forwarded COMMIT");

    // the client does what the problem says: the same key answers with that transfer, once
    let retried = app.post_transfer(&body, Some("ambiguous")).await;
    assert_eq!(retried.status(), 202);
    assert_eq!(retried.headers()["idempotent-replayed"], "true");
    let transfer: Value = retried.json().await.expect("transfer");
    assert_eq!(transfer["valorEmCentavos"], 4_200);
    let (transfers, events): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM transferencia WHERE valor_centavos = 4200), \
                (SELECT count(*) FROM outbox_evento WHERE payload LIKE '%' || $1 || '%')",
    )
    .bind(transfer["id"].as_str().expect("id"))
    .fetch_one(&app.database.pool)
    .await
    .expect("counts");
    assert_eq!((transfers, events), (1, 1), "one transfer, one event");
    app.stop().await;
}
