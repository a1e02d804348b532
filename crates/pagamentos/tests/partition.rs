//! Network partitions, made with a network namespace the test creates itself: deployment A
//! (`pagamentos all`) runs inside the namespace, deployment B (`pagamentos all` too) outside,
//! on the same databases and topics. A reaches Kafka and PostgreSQL only across a veth pair,
//! through two forwarders (one in the namespace on its loopback's `127.0.0.1:9092` and
//! `:5432`, where the broker's advertised address points, one on the host side); the test cuts
//! A off by a blackhole route inside the namespace (packets vanish: no reset, no refusal, as in
//! a real partition) and heals it by deleting the route.
//!
//! Under a steady stream of transfers, A is cut from Kafka, then from PostgreSQL, each time for
//! longer than the group session timeout and antifraude's transaction timeout (10 s each), so
//! B takes over A's partitions and A comes back a zombie. Afterwards: every accepted transfer is
//! final, none moved money twice, Σ balances is what was paid in, no dead letter was written,
//! `pagamentos verify` is clean and both deployments are ready again.
//!
//! It needs root (`ip netns`), which `scripts/test` has; it uses the shared broker and database
//! without disturbing them, so it runs with the rest.

use crate::common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use common::system::{free_port, System};
use contracts::topics;

/// Longer than the group session timeout and antifraude's `transaction.timeout.ms` (10 s).
const CUT: Duration = Duration::from_secs(25);
const ACCOUNTS: usize = 8;
const OPENING_CENTS: i64 = 1_000_000;

/// `ip <args>` (or `ip netns exec <ns> ip <args>`), which must succeed.
fn ip(args: &[&str]) {
    let output = std::process::Command::new("ip").args(args).output().expect("run ip");
    assert!(output.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr));
}

/// A network namespace with a veth pair to the host: the namespace is `10.201.<n>.2/29`; the
/// host side answers for Kafka on `.1` and for PostgreSQL on `.3`, so each can be cut alone.
struct Namespace {
    name: String,
    net: u8,
}

impl Namespace {
    fn create() -> Self {
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let net = (std::process::id() % 250) as u8 + 1;
        let namespace = Self { name: format!("pgm-{suffix}"), net };
        let (host_if, inner_if) = (format!("vh{suffix}"), format!("vn{suffix}"));
        ip(&["netns", "add", &namespace.name]);
        ip(&["link", "add", &host_if, "type", "veth", "peer", "name", &inner_if]);
        ip(&["link", "set", &inner_if, "netns", &namespace.name]);
        ip(&["addr", "add", &format!("{}/29", namespace.kafka_ip()), "dev", &host_if]);
        ip(&["addr", "add", &format!("{}/29", namespace.postgres_ip()), "dev", &host_if]);
        ip(&["link", "set", &host_if, "up"]);
        namespace.exec(&["addr", "add", &format!("10.201.{net}.2/29"), "dev", &inner_if]);
        namespace.exec(&["link", "set", &inner_if, "up"]);
        namespace.exec(&["link", "set", "lo", "up"]);
        namespace
    }

    fn kafka_ip(&self) -> String {
        format!("10.201.{}.1", self.net)
    }

    fn postgres_ip(&self) -> String {
        format!("10.201.{}.3", self.net)
    }

    /// `ip <args>` inside the namespace.
    fn exec(&self, args: &[&str]) {
        let mut all = vec!["netns", "exec", &self.name, "ip"];
        all.extend_from_slice(args);
        ip(&all);
    }

    fn cut(&self, address: &str) {
        self.exec(&["route", "add", "blackhole", &format!("{address}/32")]);
    }

    fn heal(&self, address: &str) {
        self.exec(&["route", "del", "blackhole", &format!("{address}/32")]);
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        // deleting the namespace deletes its end of the veth pair, and with it the host's
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// Copies bytes both ways between every connection accepted on `listener` and a new connection
/// to `target`, until `stop`.
async fn forward(listener: TcpListener, target: SocketAddr, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((mut inbound, _)) = accepted else { continue };
        let stop = stop.clone();
        tokio::spawn(async move {
            let Ok(mut outbound) = TcpStream::connect(target).await else { return };
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
            }
        });
    }
}

/// The forwarders of one namespace. Sockets belong to the namespace of the thread that creates
/// them: the namespace's side runs on a thread of its own that entered the namespace.
struct Forwarders {
    stop: CancellationToken,
    inside: Option<std::thread::JoinHandle<()>>,
}

impl Forwarders {
    /// Inside: `127.0.0.1:9092` → host `kafka_ip`, `127.0.0.1:5432` → host `postgres_ip` (across
    /// the veth pair), and each of `http_ports` from the host's loopback into the namespace's
    /// (the test reaches A's HTTP ports as if A ran on the host). Host side: `kafka_ip` → the
    /// broker, `postgres_ip` → PostgreSQL.
    async fn start(namespace: &Namespace, http_ports: &[u16]) -> Self {
        let stop = CancellationToken::new();
        let kafka_port = free_port();
        let postgres_port = free_port();
        let kafka_hop: SocketAddr = format!("{}:{kafka_port}", namespace.kafka_ip()).parse().expect("addr");
        let postgres_hop: SocketAddr =
            format!("{}:{postgres_port}", namespace.postgres_ip()).parse().expect("addr");
        let broker: SocketAddr = testkit::bootstrap_servers()
            .split(',')
            .next()
            .expect("a bootstrap server")
            .replace("localhost", "127.0.0.1")
            .parse()
            .expect("KAFKA_BOOTSTRAP_SERVERS: host:port");
        tokio::spawn(forward(
            TcpListener::bind(kafka_hop).await.expect("bind kafka hop"),
            broker,
            stop.clone(),
        ));
        let postgres: SocketAddr = "127.0.0.1:5432".parse().expect("addr");
        tokio::spawn(forward(
            TcpListener::bind(postgres_hop).await.expect("bind postgres hop"),
            postgres,
            stop.clone(),
        ));
        // host listeners for A's HTTP ports, created here (in the host's namespace)
        let http: Vec<(std::net::TcpListener, u16)> = http_ports
            .iter()
            .map(|port| {
                let listener = std::net::TcpListener::bind(("127.0.0.1", *port)).expect("bind http port");
                listener.set_nonblocking(true).expect("nonblocking");
                (listener, *port)
            })
            .collect();
        let netns = std::fs::File::open(format!("/var/run/netns/{}", namespace.name)).expect("open netns");
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let inside_stop = stop.clone();
        let inside = std::thread::spawn(move || {
            // this thread only: the test's other threads stay in the host's namespace
            nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET).expect("enter the namespace");
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async move {
                let kafka = TcpListener::bind(broker).await.expect("bind 127.0.0.1:9092 in the namespace");
                let database = TcpListener::bind("127.0.0.1:5432").await.expect("bind 5432 in the namespace");
                tokio::spawn(forward(kafka, kafka_hop, inside_stop.clone()));
                tokio::spawn(forward(database, postgres_hop, inside_stop.clone()));
                for (listener, port) in http {
                    let listener = TcpListener::from_std(listener).expect("tokio listener");
                    let target: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
                    tokio::spawn(forward(listener, target, inside_stop.clone()));
                }
                ready_tx.send(()).expect("ready");
                inside_stop.cancelled().await;
            });
        });
        tokio::task::spawn_blocking(move || ready_rx.recv().expect("namespace forwarders"))
            .await
            .expect("join");
        Self { stop, inside: Some(inside) }
    }
}

impl Drop for Forwarders {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(inside) = self.inside.take() {
            let _ = inside.join();
        }
    }
}

/// `pagamentos all` for `system` inside `namespace`, its databases reached as `127.0.0.1`.
fn start_inside(system: &System, namespace: &Namespace) -> Child {
    let mut service = common::service(&system.topics, "all");
    system.env(&mut service);
    service.env("PAGAMENTOS_INSTANCE_ID", testkit::unique("inside"));
    let std = service.as_std();
    let mut command = Command::new("ip");
    command.args(["netns", "exec", &namespace.name]).arg(std.get_program()).args(std.get_args());
    for (key, value) in std.get_envs() {
        let Some(value) = value else { continue };
        let value = value.to_string_lossy().replace("@localhost:", "@127.0.0.1:");
        command.env(key, value);
    }
    command.stdout(Stdio::null()).stderr(Stdio::null()).kill_on_drop(true);
    command.spawn().expect("start pagamentos all in the namespace")
}

/// Deployment B on the host: its own ports and instance id.
fn start_outside(system: &System, ports: [u16; 4]) -> Child {
    let mut command = common::service(&system.topics, "all");
    system.env(&mut command);
    command
        .env("TRANSFERENCIAS_LISTEN", format!("127.0.0.1:{}", ports[0]))
        .env("LEDGER_LISTEN", format!("127.0.0.1:{}", ports[1]))
        .env("ANTIFRAUDE_LISTEN", format!("127.0.0.1:{}", ports[2]))
        .env("NOTIFICACOES_LISTEN", format!("127.0.0.1:{}", ports[3]))
        .env("PAGAMENTOS_INSTANCE_ID", testkit::unique("outside"));
    command.spawn().expect("start pagamentos all outside")
}

/// A client for `/readyz` probes: a probe that hangs counts as not ready.
fn probe() -> reqwest::Client {
    common::system::admin_client(Some(Duration::from_secs(5)))
}

async fn ready(ports: &[u16], within: Duration) {
    let probe = probe();
    for port in ports {
        let url = format!("http://127.0.0.1:{port}/readyz");
        testkit::eventually(&format!("{url} ready"), within, || async {
            let response = probe.get(&url).send().await.ok()?;
            response.status().is_success().then_some(())
        })
        .await;
    }
}

/// Waits until one of `ports` answers `/readyz` with other than success (or not in time): the
/// deployment has noticed it is cut off.
async fn noticed(ports: &[u16], what: &str, within: Duration) -> String {
    let probe = probe();
    testkit::eventually(&format!("A's /readyz to notice the cut from {what}"), within, || async {
        for port in ports {
            let url = format!("http://127.0.0.1:{port}/readyz");
            match probe.get(&url).send().await {
                Ok(response) if response.status().is_success() => {}
                Ok(response) => {
                    let status = response.status();
                    return Some(format!("{url}: {status} {}", response.text().await.unwrap_or_default()));
                }
                Err(error) => return Some(format!("{url}: {error}")),
            }
        }
        None
    })
    .await
}

/// POSTs transfers at 20/s, alternating between the two APIs, each retried with its key until
/// answered; the accepted ids, and the answers that were neither 202 nor worth retrying.
async fn drive(
    http: reqwest::Client,
    apis: [String; 2],
    stop: CancellationToken,
) -> (Vec<String>, Vec<String>) {
    let accepted = Arc::new(Mutex::new(Vec::new()));
    let failed = Arc::new(Mutex::new(Vec::new()));
    let tracker = tokio_util::task::TaskTracker::new();
    let mut ticks = tokio::time::interval(Duration::from_millis(50));
    for n in 0usize.. {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = ticks.tick() => {}
        }
        let from = n % ACCOUNTS;
        let to = (n * 3 + 1) % ACCOUNTS;
        if from == to {
            continue;
        }
        let body = json!({"contaOrigem": format!("PART-{from}"), "contaDestino": format!("PART-{to}"),
            "valorEmCentavos": 100 + (n % 900) as i64, "moeda": "BRL"});
        let (http, apis, accepted, failed) = (http.clone(), apis.clone(), accepted.clone(), failed.clone());
        tracker.spawn(async move {
            let key = uuid::Uuid::new_v4().to_string();
            let started = Instant::now();
            for attempt in 0usize.. {
                if attempt > 0 {
                    tokio::time::sleep(Duration::from_millis(250)).await; // spacing retries
                }
                if started.elapsed() > Duration::from_secs(180) {
                    failed.lock().expect("lock").push(format!("{key}: no answer in 180 s"));
                    return;
                }
                let sent =
                    http.post(&apis[attempt % 2]).header("Idempotency-Key", &key).json(&body).send().await;
                let Ok(response) = sent else { continue };
                match response.status().as_u16() {
                    202 => {
                        let Ok(answer) = response.json::<Value>().await else { continue };
                        accepted.lock().expect("lock").push(answer["id"].as_str().expect("id").to_owned());
                        return;
                    }
                    409 | 500 | 502 | 503 | 504 => continue,
                    status => {
                        let text = response.text().await.unwrap_or_default();
                        failed.lock().expect("lock").push(format!("{key}: {status} {text}"));
                        return;
                    }
                }
            }
        });
    }
    tracker.close();
    tracker.wait().await;
    let accepted = accepted.lock().expect("lock").clone();
    let failed = failed.lock().expect("lock").clone();
    (accepted, failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deployment_cut_from_kafka_then_from_postgres_loses_and_doubles_nothing() {
    let system = System::new().await;
    let namespace = Namespace::create();
    let _forwarders = Forwarders::start(&namespace, &system.ports).await;
    let mut inside = start_inside(&system, &namespace);
    ready(&system.ports, Duration::from_secs(90)).await;
    let outside_ports = [free_port(), free_port(), free_port(), free_port()];
    let mut outside = start_outside(&system, outside_ports);
    ready(&outside_ports, Duration::from_secs(90)).await;
    for n in 0..ACCOUNTS {
        system.open_account(&format!("PART-{n}"), OPENING_CENTS).await;
    }

    let http = common::system::admin_client(Some(Duration::from_secs(3)));
    let apis =
        [system.api("/transferencias"), format!("http://127.0.0.1:{}/transferencias", outside_ports[0])];
    let stop = CancellationToken::new();
    let driver = tokio::spawn(drive(http, apis, stop.clone()));
    // wait for traffic to flow through both before cutting
    testkit::eventually("transfers settling", Duration::from_secs(60), || async {
        let settled: i64 =
            sqlx::query_scalar("SELECT count(*) FROM transferencia WHERE status = 'LIQUIDADA'")
                .fetch_one(&system.transfers_db.pool)
                .await
                .ok()?;
        (settled >= 20).then_some(())
    })
    .await;

    for (what, address) in [("Kafka", namespace.kafka_ip()), ("PostgreSQL", namespace.postgres_ip())] {
        eprintln!("[partition] A cut from {what} for {CUT:?}");
        let cut_at = Instant::now();
        namespace.cut(&address);
        // proof that the cut is real: A's own health check sees it
        let seen = noticed(&system.ports, what, CUT).await;
        eprintln!("[partition] after {:?}: {}", cut_at.elapsed(), seen.trim());
        tokio::time::sleep(CUT.saturating_sub(cut_at.elapsed())).await; // the fault's length
        namespace.heal(&address);
        eprintln!("[partition] A healed from {what}");
        ready(&system.ports, Duration::from_secs(120)).await;
    }
    stop.cancel();
    let (accepted, failed) = driver.await.expect("driver");
    assert!(failed.is_empty(), "POSTs that failed for good: {failed:?}");
    assert!(accepted.len() > 100, "only {} transfers accepted", accepted.len());

    // drained: every accepted transfer final
    system.all_decided().await;
    let rows: Vec<(String, String)> = sqlx::query_as("SELECT id::text, status FROM transferencia")
        .fetch_all(&system.transfers_db.pool)
        .await
        .expect("transfers");
    let known: HashSet<&String> = rows.iter().map(|(id, _)| id).collect();
    let unknown: Vec<&String> = accepted.iter().filter(|id| !known.contains(id)).collect();
    assert!(unknown.is_empty(), "accepted but not in the database: {unknown:?}");
    assert_eq!(rows.len(), accepted.iter().collect::<HashSet<_>>().len(), "transfers nobody was told of");

    let ledger = &system.ledger_db.pool;
    let doubled: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT transferencia_id FROM lancamento l
          WHERE NOT EXISTS (SELECT 1 FROM deposito d WHERE d.id = l.transferencia_id)
          GROUP BY transferencia_id HAVING count(*) <> 2) AS odd",
    )
    .fetch_one(ledger)
    .await
    .expect("entries per transfer");
    assert_eq!(doubled, 0, "transfers with other than one debit and one credit");
    let balances: i64 = sqlx::query_scalar("SELECT sum(saldo_centavos)::bigint FROM conta WHERE NOT emissor")
        .fetch_one(ledger)
        .await
        .expect("balances");
    assert_eq!(balances, ACCOUNTS as i64 * OPENING_CENTS, "money appeared or vanished");

    // no dead letter anywhere: the topics' end offsets, not a quiet window
    for topic in system.topics.names.iter().filter(|name| name.ends_with(topics::DEAD_LETTER_SUFFIX)) {
        assert_eq!(testkit::records_written(&system.topics.args, topic).await, 0, "dead letters on {topic}");
    }
    let (code, report) = system.verify().await;
    assert_eq!(code, 0, "pagamentos verify after the partitions:\n{report}");
    assert!(inside.try_wait().expect("status").is_none(), "A exited during the partitions");
    assert!(outside.try_wait().expect("status").is_none(), "B exited during the partitions");
    ready(&outside_ports, Duration::from_secs(30)).await;
    eprintln!("[partition] {} transfers accepted, all final, books balanced", accepted.len());
    inside.kill().await.expect("stop A");
    outside.kill().await.expect("stop B");
}
