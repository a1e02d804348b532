//! The antifraude transactional hop on each Kafka client, interleaved in one run (issue #45):
//!
//! ```sh
//! cargo run --release -p antifraud --example client_bench -- [--seconds 20] [--rounds 2] [--rates 25,200]
//! ```
//!
//! Against the local stack. Per round the clients run in turn, the order flipped every round
//! (librdkafka, confluent, confluent, librdkafka, …), so a host that speeds up or slows down
//! during the run favours neither. Each case gets fresh topics (12 partitions) and a fresh
//! group, starts the exactly-once loop of `kafka::exactly_once` on the client with antifraude's
//! own transform and settings (fast profile, batches up to 500, no batch wait), offers
//! requests at the rate on an open-loop schedule for a warm-up and then for `--seconds`, and
//! measures the transactions committed in that window:
//! - the loop's own begin→commit time of each transaction (what `antifraud_transaction_seconds`
//!   records), p50 / p99 / mean, exact rather than from the histogram's buckets;
//! - the broker's requests per transaction, by API (`kafka.network:type=RequestMetrics`, read
//!   through JMX: the example starts the broker's management agent with `jcmd` and reads it
//!   with Kafka's `JmxTool`; Produce and Fetch include the load generator's and the loop's
//!   consumer's, the transactional APIs only the loop's). The agent (127.0.0.1, no
//!   authentication: the local stack only) stays until the broker restarts;
//! - this process's CPU per record (load generator included: the same in every case).
//!
//! `--orders offsets-first,records-first` also runs each client with the transaction's requests
//! in the order the loop had before #54 (records, then offsets: a wrapper of the seam defers the
//! offsets the loop sends first until after its records), interleaved the same way, so the two
//! orders are compared in one run with one binary.
//!
//! One JSON line per case, then a summary table: per client, order and rate the median over
//! rounds, and the ratios confluent / librdkafka and offsets-first / records-first.

mod common;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Parser;
use kafka::config::{consumer_config, producer_config, transactional_producer_config, OffsetCommit};
use kafka::exactly_once::{
    Bounds, Client, Committed, ConfluentClient, ConfluentConfig, LibrdkafkaClient, Options, Partition,
    Transform, TxnError,
};
use kafka::producer::{OutgoingRecord, Producer};
use kafka::rdkafka::message::OwnedMessage;
use kafka::Profile;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use antifraud::analysis::{Analyser, AnalysisError, Topics};
use antifraud::TransactionalClient;
use contracts::topics;
use testkit::{unique, TestTopics};

use common::request;

#[derive(Debug, Parser)]
struct Args {
    /// Seconds measured per case (after the warm-up).
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Seconds of load before the measured window (groups joined, producers registered,
    /// connections open).
    #[arg(long, default_value_t = 5)]
    warm_up: u64,
    /// Rounds; each runs every client at every rate.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Offered rates, requests per second.
    #[arg(long, value_delimiter = ',', default_value = "25,200")]
    rates: Vec<u64>,
    /// `linger.ms` of both clients' transactional producers (default: each client's in the
    /// fast profile, `Profile::transaction_linger` / `confluent_transaction_linger`).
    #[arg(long)]
    linger_ms: Option<u64>,
    /// Clients to run.
    #[arg(long, value_delimiter = ',', default_value = "librdkafka,confluent")]
    clients: Vec<String>,
    /// Orders of the transaction's requests: `offsets-first` (the loop's) and/or
    /// `records-first` (the order before #54).
    #[arg(long, value_delimiter = ',', default_value = "offsets-first")]
    orders: Vec<String>,
    /// The broker's JMX port (its management agent is started there if not running).
    #[arg(long, default_value_t = 9999)]
    jmx_port: u16,
    /// Kafka's jars (libs/ and tools/), as scripts/stack installs them.
    #[arg(long, env = "KAFKA_HOME", default_value_os_t = default_kafka_home())]
    kafka_home: PathBuf,
}

fn default_kafka_home() -> PathBuf {
    PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/pagamentos/kafka-4.3.1")
}

/// Antifraude's transform, timing each committed transaction while `recording`.
struct Timed {
    inner: Analyser,
    recording: Arc<AtomicBool>,
    took: Mutex<Vec<Duration>>,
    outputs: AtomicUsize,
}

impl Transform for Timed {
    type Error = AnalysisError;

    fn output(&self, record: &OwnedMessage) -> Result<OutgoingRecord, AnalysisError> {
        self.inner.output(record)
    }

    fn committed(&self, outputs: &[OutgoingRecord], took: Duration) {
        self.inner.committed(outputs, took);
        if self.recording.load(Ordering::SeqCst) {
            self.took.lock().expect("lock").push(took);
        }
        self.outputs.fetch_add(outputs.len(), Ordering::SeqCst);
    }
}

/// A client that times its transactional calls while `recording` (the steps of `took`); with
/// `records_first`, it holds the offsets the loop sends first and sends them after the records.
struct Stepped<C> {
    inner: C,
    recording: Arc<AtomicBool>,
    steps: Arc<Mutex<BTreeMap<&'static str, Vec<f64>>>>,
    records_first: bool,
    deferred: Option<Vec<(Partition, i64)>>,
}

/// Awaits `call`, recording how long it took under `step` while `recording`.
async fn timed<T>(
    recording: &AtomicBool,
    steps: &Mutex<BTreeMap<&'static str, Vec<f64>>>,
    step: &'static str,
    call: impl Future<Output = T>,
) -> T {
    let started = Instant::now();
    let result = call.await;
    if recording.load(Ordering::SeqCst) {
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        steps.lock().expect("lock").entry(step).or_default().push(ms);
    }
    result
}

impl<C: Client> Client for Stepped<C> {
    fn group(&self) -> &str {
        self.inner.group()
    }
    async fn receive(&mut self) -> Result<OwnedMessage, kafka::Error> {
        self.inner.receive().await
    }
    fn rebalances(&self) -> u64 {
        self.inner.rebalances()
    }
    async fn begin(&mut self) -> Result<(), TxnError> {
        self.deferred = None;
        timed(&self.recording, &self.steps, "begin", self.inner.begin()).await
    }
    async fn send(&mut self, records: &[OutgoingRecord]) -> Result<(), TxnError> {
        timed(&self.recording, &self.steps, "send", self.inner.send(records)).await?;
        match self.deferred.take() {
            Some(next) => {
                timed(&self.recording, &self.steps, "send_offsets", self.inner.send_offsets(&next)).await
            }
            None => Ok(()),
        }
    }
    async fn send_offsets(&mut self, next: &[(Partition, i64)]) -> Result<(), TxnError> {
        if self.records_first {
            self.deferred = Some(next.to_vec());
            return Ok(());
        }
        timed(&self.recording, &self.steps, "send_offsets", self.inner.send_offsets(next)).await
    }
    async fn commit(&mut self) -> Result<(), TxnError> {
        timed(&self.recording, &self.steps, "commit", self.inner.commit()).await
    }
    async fn abort(&mut self) -> Result<(), TxnError> {
        self.inner.abort().await
    }
    async fn renew(&mut self) -> Result<(), kafka::Error> {
        self.inner.renew().await
    }
    fn assignment(&mut self) -> Result<Vec<Partition>, kafka::Error> {
        self.inner.assignment()
    }
    async fn committed(
        &mut self,
        partitions: &[Partition],
    ) -> Result<Vec<(Partition, Committed)>, kafka::Error> {
        self.inner.committed(partitions).await
    }
    async fn bounds(&mut self, partitions: &[Partition]) -> Result<Vec<(Partition, Bounds)>, kafka::Error> {
        self.inner.bounds(partitions).await
    }
    async fn seek(&mut self, positions: &[(Partition, i64)]) -> Result<(), kafka::Error> {
        self.inner.seek(positions).await
    }
}

/// The broker's request counters by API (summed over versions).
fn requests(args: &Args) -> anyhow::Result<BTreeMap<String, f64>> {
    let classpath = format!("{}/libs/*:{}/tools/*", args.kafka_home.display(), args.kafka_home.display());
    let output = std::process::Command::new("java")
        .args(["-cp", &classpath, "org.apache.kafka.tools.JmxTool", "--jmx-url"])
        .arg(format!("service:jmx:rmi:///jndi/rmi://127.0.0.1:{}/jmxrmi", args.jmx_port))
        .args([
            "--object-name",
            "kafka.network:type=RequestMetrics,name=RequestsPerSec,request=*,version=*",
            "--attributes",
            "Count",
            "--one-time",
            "true",
        ])
        .output()
        .context("run JmxTool")?;
    let text = String::from_utf8_lossy(&output.stdout);
    // a header line of quoted names (which contain commas), then one line of numbers
    let (Some(header), Some(values)) =
        (text.lines().find(|line| line.starts_with("\"time\"")), text.lines().last())
    else {
        bail!("JmxTool printed no counters: {}", String::from_utf8_lossy(&output.stderr));
    };
    let names = header.split('"').skip(1).step_by(2).skip(1);
    let mut counts = BTreeMap::new();
    for (name, value) in names.zip(values.split(',').skip(1)) {
        // …,request=EndTxn,version=5:Count → "EndTxn v5" (inter-broker requests have versions
        // of their own, e.g. AddPartitionsToTxn v5 from a partition leader under KIP-890)
        let Some(rest) = name.split("request=").nth(1) else { continue };
        let api = rest.split(',').next().unwrap_or_default();
        let version = rest.split("version=").nth(1).and_then(|v| v.split(':').next()).unwrap_or("?");
        *counts.entry(format!("{api} v{version}")).or_insert(0.0) +=
            value.trim().parse::<f64>().unwrap_or(0.0);
    }
    Ok(counts)
}

/// Starts the broker's JMX agent on `args.jmx_port` unless it already answers.
fn jmx_ready(args: &Args) -> anyhow::Result<()> {
    if requests(args).is_ok() {
        return Ok(());
    }
    let pid = std::process::Command::new("pgrep").args(["-f", "kafka.Kafka"]).output()?;
    let pid = String::from_utf8_lossy(&pid.stdout)
        .lines()
        .next()
        .map(str::to_owned)
        .context("no broker process")?;
    let port = args.jmx_port;
    let started = std::process::Command::new("jcmd")
        .arg(&pid)
        .arg("ManagementAgent.start")
        .arg(format!("jmxremote.port={port}"))
        .arg(format!("jmxremote.rmi.port={port}"))
        .args(["jmxremote.authenticate=false", "jmxremote.ssl=false", "jmxremote.host=127.0.0.1"])
        .status()?;
    if !started.success() {
        bail!("jcmd ManagementAgent.start failed");
    }
    requests(args).map(drop)
}

/// CPU seconds this process has used.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or_default().split_whitespace().collect();
    let ticks: f64 = fields.get(11..13).map_or(0.0, |f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum());
    ticks / 100.0
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

#[derive(Debug, Clone)]
struct Case {
    client: TransactionalClient,
    records_first: bool,
    rate: u64,
    p50_ms: f64,
    p99_ms: f64,
    mean_ms: f64,
    cpu_ms_per_record: f64,
    requests_per_transaction: BTreeMap<String, f64>,
    /// p50 of each transactional call, ms.
    step_p50_ms: BTreeMap<&'static str, f64>,
}

// Over 100 lines on purpose: one measured case: the timing decorator, the broker's request counts
// and the CPU sample must bracket exactly the same span.
async fn run_case(
    args: &Args,
    client: TransactionalClient,
    records_first: bool,
    rate: u64,
    round: usize,
) -> anyhow::Result<Case> {
    let topics = TestTopics::plan(12).await;
    let input = topics.topic(topics::REQUESTED);
    let group = unique("client-bench");
    let transactional_id = unique("tx-client-bench");
    let linger = match (args.linger_ms, client) {
        (Some(ms), _) => Duration::from_millis(ms),
        (None, TransactionalClient::Librdkafka) => Profile::Fast.transaction_linger(),
        (None, TransactionalClient::Confluent) => Profile::Fast.confluent_transaction_linger(),
    };
    let timed = Arc::new(Timed {
        inner: Analyser::new(
            Topics { analysed: topics.topic(topics::ANALYSED), rejected: topics.topic(topics::REJECTED) },
            antifraud::scoring::Scorer {
                block_threshold_cents: antifraud::scoring::DEFAULT_BLOCK_THRESHOLD_CENTS,
            },
            group.clone(),
        ),
        recording: Arc::new(AtomicBool::new(false)),
        took: Mutex::new(Vec::new()),
        outputs: AtomicUsize::new(0),
    });
    let steps: Arc<Mutex<BTreeMap<&'static str, Vec<f64>>>> = Arc::default();
    let options = Options { batch_records_max: 500, batch_wait_max: Duration::ZERO, ..Options::default() };
    let shutdown = CancellationToken::new();
    let running = {
        let (timed, shutdown, topics) = (timed.clone(), shutdown.clone(), topics.args.clone());
        let (input, group, transactional_id) = (input.clone(), group.clone(), transactional_id.clone());
        let (recording, steps) = (timed.recording.clone(), steps.clone());
        tokio::spawn(async move {
            match client {
                TransactionalClient::Librdkafka => {
                    let consumer = kafka::consumer::subscribe(
                        &consumer_config(&topics, "antifraude", &group, OffsetCommit::InTransaction),
                        &[&input],
                    )?;
                    let client = LibrdkafkaClient::new(
                        consumer,
                        transactional_producer_config(&topics, "antifraude", &transactional_id, linger),
                    );
                    let mut client =
                        Stepped { inner: client, recording, steps, records_first, deferred: None };
                    kafka::exactly_once::run(&mut client, timed.as_ref(), &options, &shutdown).await?;
                }
                TransactionalClient::Confluent => {
                    let config =
                        ConfluentConfig::new(&topics, "antifraude", &group, &transactional_id, linger)?;
                    let client = ConfluentClient::subscribe(&config, &[&input]).await?;
                    let mut client =
                        Stepped { inner: client, recording, steps, records_first, deferred: None };
                    let ran =
                        kafka::exactly_once::run(&mut client, timed.as_ref(), &options, &shutdown).await;
                    client.inner.close().await;
                    ran?;
                }
            }
            anyhow::Ok(())
        })
    };

    let producer = Producer::new(&producer_config(&topics.args, "bench", Duration::ZERO))?;
    let warm_up = (rate * args.warm_up) as usize;
    let measured = (rate * args.seconds) as usize;
    let send = |from: usize, count: usize| {
        let (producer, input) = (producer.clone(), input.clone());
        async move {
            let start = tokio::time::Instant::now();
            let mut sends = Vec::with_capacity(count);
            for i in 0..count {
                tokio::time::sleep_until(start + Duration::from_micros(i as u64 * 1_000_000 / rate)).await;
                let (key, body) = request(from + i);
                let producer = producer.clone();
                let record = OutgoingRecord::new(&input, key, body);
                sends.push(tokio::spawn(async move { producer.send(&record).await.map(drop) }));
            }
            for sent in sends {
                sent.await??;
            }
            anyhow::Ok(())
        }
    };
    let wait_for = |outputs: usize| {
        let timed = timed.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            while timed.outputs.load(Ordering::SeqCst) < outputs {
                if Instant::now() > deadline {
                    bail!("{} of {outputs} outputs after 120 s", timed.outputs.load(Ordering::SeqCst));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            anyhow::Ok(())
        }
    };
    send(0, warm_up).await?;
    wait_for(warm_up).await?;

    let requests_before = requests(args)?;
    let cpu_before = cpu_seconds();
    timed.recording.store(true, Ordering::SeqCst);
    send(warm_up, measured).await?;
    wait_for(warm_up + measured).await?;
    timed.recording.store(false, Ordering::SeqCst);
    let cpu = cpu_seconds() - cpu_before;
    let requests_after = requests(args)?;

    shutdown.cancel();
    running.await??;

    let mut took: Vec<f64> =
        timed.took.lock().expect("lock").iter().map(|took| took.as_secs_f64() * 1000.0).collect();
    took.sort_by(f64::total_cmp);
    if took.is_empty() {
        bail!("no transaction measured");
    }
    let transactions = took.len() as f64;
    let requests_per_transaction: BTreeMap<String, f64> = requests_after
        .iter()
        .map(|(api, after)| {
            (api.clone(), (after - requests_before.get(api).copied().unwrap_or(0.0)) / transactions)
        })
        .filter(|(_, per)| *per > 0.0)
        .collect();
    let step_p50_ms: BTreeMap<&'static str, f64> = steps
        .lock()
        .expect("lock")
        .iter_mut()
        .map(|(step, times)| {
            times.sort_by(f64::total_cmp);
            (*step, quantile(times, 0.5))
        })
        .collect();
    let case = Case {
        client,
        records_first,
        rate,
        p50_ms: quantile(&took, 0.5),
        p99_ms: quantile(&took, 0.99),
        mean_ms: took.iter().sum::<f64>() / transactions,
        cpu_ms_per_record: cpu * 1000.0 / measured as f64,
        requests_per_transaction,
        step_p50_ms,
    };
    println!(
        "{}",
        json!({
            "round": round, "client": format!("{client:?}").to_lowercase(),
            "order": if records_first { "records-first" } else { "offsets-first" }, "rate_per_s": rate,
            "transactions": took.len(), "records": measured,
            "transaction_ms": {"p50": case.p50_ms, "p99": case.p99_ms, "mean": case.mean_ms},
            "cpu_ms_per_record": case.cpu_ms_per_record,
            "broker_requests_per_transaction": case.requests_per_transaction,
            "step_p50_ms": case.step_p50_ms,
        })
    );
    Ok(case)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[middle - 1] + values[middle]) / 2.0
    } else {
        values[middle]
    }
}

fn client_named(name: &str) -> anyhow::Result<TransactionalClient> {
    match name {
        "librdkafka" => Ok(TransactionalClient::Librdkafka),
        "confluent" => Ok(TransactionalClient::Confluent),
        other => bail!("--clients: {other} is not librdkafka or confluent"),
    }
}

fn order_named(name: &str) -> anyhow::Result<bool> {
    match name {
        "offsets-first" => Ok(false),
        "records-first" => Ok(true),
        other => bail!("--orders: {other} is not offsets-first or records-first"),
    }
}

fn order_name(records_first: bool) -> &'static str {
    if records_first {
        "records-first"
    } else {
        "offsets-first"
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let clients = args.clients.iter().map(|name| client_named(name)).collect::<anyhow::Result<Vec<_>>>()?;
    let orders = args.orders.iter().map(|name| order_named(name)).collect::<anyhow::Result<Vec<_>>>()?;
    jmx_ready(&args)?;
    let variants: Vec<(TransactionalClient, bool)> =
        clients.iter().flat_map(|client| orders.iter().map(move |order| (*client, *order))).collect();
    let mut cases = Vec::new();
    for round in 0..args.rounds {
        // the order of the variants flipped every round
        let mut this_round = variants.clone();
        if round % 2 == 1 {
            this_round.reverse();
        }
        for (client, records_first) in this_round {
            for &rate in &args.rates {
                cases.push(run_case(&args, client, records_first, rate, round).await?);
            }
        }
    }
    println!(
        "\n| rate | client | order | txn p50 ms | txn p99 ms | txn mean ms | CPU ms/record | p50 ms of begin, send, send_offsets, commit | requests/txn (round 0) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for &rate in &args.rates {
        let mut medians: BTreeMap<(String, bool), [f64; 4]> = BTreeMap::new();
        for &(client, records_first) in &variants {
            let of: Vec<&Case> = cases
                .iter()
                .filter(|case| {
                    case.client == client && case.records_first == records_first && case.rate == rate
                })
                .collect();
            let pick = |f: fn(&Case) -> f64| median(of.iter().map(|case| f(case)).collect());
            let row =
                [pick(|c| c.p50_ms), pick(|c| c.p99_ms), pick(|c| c.mean_ms), pick(|c| c.cpu_ms_per_record)];
            let transactional: Vec<String> = of[0]
                .requests_per_transaction
                .iter()
                .filter(|(api, _)| {
                    [
                        "AddPartitionsToTxn",
                        "AddPartitionsToTxnVerification",
                        "AddOffsetsToTxn",
                        "TxnOffsetCommit",
                        "EndTxn",
                        "Produce",
                    ]
                    .contains(&api.split(' ').next().unwrap_or_default())
                })
                .map(|(api, per)| format!("{api} {per:.2}"))
                .collect();
            let step = |name: &str| {
                median(of.iter().map(|case| case.step_p50_ms.get(name).copied().unwrap_or(0.0)).collect())
            };
            println!(
                "| {rate}/s | {client:?} | {} | {:.2} | {:.2} | {:.2} | {:.3} | {:.2}, {:.2}, {:.2}, {:.2} | {} |",
                order_name(records_first),
                row[0],
                row[1],
                row[2],
                row[3],
                step("begin"),
                step("send"),
                step("send_offsets"),
                step("commit"),
                transactional.join(", ")
            );
            medians.insert((format!("{client:?}"), records_first), row);
        }
        let ratio = |label: String, over: Option<&[f64; 4]>, under: Option<&[f64; 4]>| {
            if let (Some(over), Some(under)) = (over, under) {
                println!(
                    "| {rate}/s | {label} | | {:.2} | {:.2} | {:.2} | {:.2} | | |",
                    over[0] / under[0],
                    over[1] / under[1],
                    over[2] / under[2],
                    over[3] / under[3]
                );
            }
        };
        for &records_first in &orders {
            ratio(
                format!("confluent / librdkafka ({})", order_name(records_first)),
                medians.get(&("Confluent".into(), records_first)),
                medians.get(&("Librdkafka".into(), records_first)),
            );
        }
        for client in ["Librdkafka", "Confluent"] {
            ratio(
                format!("{client}: offsets-first / records-first"),
                medians.get(&(client.to_owned(), false)),
                medians.get(&(client.to_owned(), true)),
            );
        }
    }
    Ok(())
}
