//! Evaluation of the pure-Rust `krafka` client's share consumer (KIP-932) against a real
//! Kafka 4.3 broker, for issue #29. Each scenario creates its own topic and share group, runs,
//! and prints one `RESULT` line with what it measured; the verdict is in
//! docs/architecture.md ("Kafka clients"). See README.md for how to run it.
//!
//! Absence is never inferred from a quiet period: once a scenario saw what it expected, a
//! marker record is produced and consumed (any other record on the way is a late
//! redelivery), and then the broker must report the share partition's start offset (SPSO)
//! at the marker: every record before it accepted or archived, none deliverable again.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use krafka::admin::{
    ConfigOp, ConfigResource, CreateTopicsOptions, DescribeShareGroupOffsetsOptions,
    IncrementalAlterConfigsOptions, NewTopic,
};
use krafka::share_consumer::{AcknowledgementMode, ShareConsumer};
use krafka::{ConsumerRecord, Kafka, Record};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Mutex;

mod txn;

const SCENARIO_DEADLINE: Duration = Duration::from_secs(240);
const POLL: Duration = Duration::from_millis(500);

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KRAFKA_EVAL_LOG")
                .unwrap_or_else(|_| "krafka=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut bootstrap = std::env::var("EVAL_KAFKA_BOOTSTRAP").unwrap_or("127.0.0.1:9192".into());
    if let Some(i) = args.iter().position(|a| a == "--bootstrap") {
        ensure!(i + 1 < args.len(), "--bootstrap needs an address");
        bootstrap = args.remove(i + 1);
        args.remove(i);
    }
    if args.first().map(String::as_str) == Some("hold") {
        return hold(&bootstrap, &args[1..]).await;
    }
    if args.is_empty() {
        eprintln!(
            "usage: krafka-eval [--bootstrap HOST:PORT] SCENARIO...\n\
             scenarios: a (two consumers, one partition), b (release, delivery-count limit),\n\
             c (broker SIGKILL + restart), d1 (consumer SIGKILL), d2 (lock expiry of a slow\n\
             consumer), e (reject), all (= a b e d1 d2 c),\n\
             txn-krafka, txn-rdkafka (transactional consume-produce; the latter needs --features rdkafka)\n\
             defaults to the evaluation broker 127.0.0.1:9192 (tools/krafka-eval/broker start)"
        );
        bail!("no scenario given");
    }
    let eval = Eval { bootstrap };
    let list: Vec<String> =
        if args == ["all"] { ["a", "b", "e", "d1", "d2", "c"].map(String::from).to_vec() } else { args };
    let mut failed = Vec::new();
    for scenario in &list {
        println!("=== scenario {scenario}");
        let started = Instant::now();
        let outcome = tokio::time::timeout(SCENARIO_DEADLINE, eval.run(scenario)).await;
        let outcome = outcome.unwrap_or_else(|_| Err(anyhow!("did not finish in {SCENARIO_DEADLINE:?}")));
        match outcome {
            Ok(()) => println!("=== scenario {scenario}: done in {:.1} s", started.elapsed().as_secs_f64()),
            Err(error) => {
                println!("=== scenario {scenario}: FAILED: {error:#}");
                failed.push(scenario.clone());
            }
        }
    }
    ensure!(failed.is_empty(), "failed scenarios: {failed:?}");
    Ok(())
}

struct Eval {
    bootstrap: String,
}

/// What the end check found.
struct EndCheck {
    /// Records delivered between the end of the scenario and the marker.
    late: usize,
    /// How long the broker took to report the partition settled up to the marker.
    drained: Option<Duration>,
}

impl std::fmt::Display for EndCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.drained {
            Some(d) => write!(
                f,
                "late_records_before_marker={} spso_reached_marker_after={:.2}s",
                self.late,
                d.as_secs_f64()
            ),
            None => write!(f, "late_records_before_marker={} spso_reached_marker=NO", self.late),
        }
    }
}

/// What the acknowledgement-commit callback saw.
#[derive(Default)]
struct AckStats {
    ok: AtomicU64,
    failed: AtomicU64,
    errors: std::sync::Mutex<BTreeMap<String, u64>>,
}

impl AckStats {
    fn summary(&self) -> String {
        format!(
            "acks_ok_requests={} acks_failed_requests={} ack_errors={:?}",
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            self.errors.lock().unwrap()
        )
    }
}

fn unique(prefix: &str) -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("krafka-eval-{prefix}-{}-{}", std::process::id(), nanos % 1_000_000_000)
}

fn value(record: &ConsumerRecord) -> String {
    record.value_str().unwrap_or("<none>").to_string()
}

fn short(error: &krafka::KrafkaError) -> String {
    let text = error.to_string();
    text.chars().take(90).collect()
}

impl Eval {
    async fn run(&self, scenario: &str) -> Result<()> {
        match scenario {
            "a" => self.parallel_one_partition().await,
            "b" => self.release_until_limit().await,
            "c" => self.broker_restart().await,
            "d1" => self.consumer_sigkill().await,
            "d2" => self.lock_expiry().await,
            "e" => self.reject().await,
            "txn-krafka" | "txn-rdkafka" => self.transactions(scenario.trim_start_matches("txn-")).await,
            other => bail!("unknown scenario {other}"),
        }
    }

    async fn connect(&self, client_id: &str) -> Result<Kafka> {
        Kafka::builder(self.bootstrap.clone())
            .client_id(client_id)
            .connect()
            .await
            .with_context(|| format!("connecting to {}", self.bootstrap))
    }

    /// A one-partition topic and a share group that starts at the earliest offset.
    async fn topic_and_group(
        &self,
        kafka: &Kafka,
        name: &str,
        group_configs: &[(&str, &str)],
    ) -> Result<(String, String)> {
        let topic = unique(name);
        let group = format!("{topic}-group");
        let admin = kafka.admin();
        let created = admin
            .create_topics([NewTopic::new(topic.clone(), 1, 1)?], CreateTopicsOptions::default())
            .await?;
        for (name, result) in created {
            result.with_context(|| format!("creating {name}"))?;
        }
        let mut ops = vec![ConfigOp::set("share.auto.offset.reset", "earliest")];
        ops.extend(group_configs.iter().map(|(k, v)| ConfigOp::set(*k, *v)));
        let altered = admin
            .incremental_alter_configs(
                [(ConfigResource::group(group.clone()), ops)],
                IncrementalAlterConfigsOptions::default(),
            )
            .await?;
        for (resource, result) in altered {
            result.with_context(|| format!("configuring {resource:?}"))?;
        }
        Ok((topic, group))
    }

    async fn produce(&self, kafka: &Kafka, topic: &str, prefix: &str, n: usize) -> Result<()> {
        let producer = kafka.producer().build().await?;
        let mut handles = Vec::with_capacity(n);
        for i in 0..n {
            handles.push(producer.enqueue(Record::new(topic, format!("{prefix}-{i}"))).await?);
        }
        producer.flush().await?;
        for handle in handles {
            let _metadata = handle.await?;
        }
        producer.close().await?;
        Ok(())
    }

    async fn share_consumer(
        &self,
        kafka: &Kafka,
        group: &str,
        topic: &str,
        max_poll: i32,
    ) -> Result<(ShareConsumer, Arc<AckStats>)> {
        let stats = Arc::new(AckStats::default());
        let seen = Arc::clone(&stats);
        let consumer = kafka
            .share_consumer(group)
            .acknowledgement_mode(AcknowledgementMode::Explicit)
            .max_poll_records(max_poll)
            .acknowledgement_commit_callback(move |commit| match &commit.result {
                Ok(()) => {
                    seen.ok.fetch_add(1, Ordering::Relaxed);
                }
                Err(error) => {
                    seen.failed.fetch_add(1, Ordering::Relaxed);
                    *seen.errors.lock().unwrap().entry(short(error)).or_default() += 1;
                }
            })
            .build()
            .await?;
        consumer.subscribe([topic]).await?;
        Ok((consumer, stats))
    }

    /// The share-partition start offset of partition 0: every offset below it is accepted or
    /// archived and will never be delivered again.
    async fn spso(&self, kafka: &Kafka, group: &str) -> Result<Option<i64>> {
        let offsets = kafka
            .admin()
            .describe_share_group_offsets(group, DescribeShareGroupOffsetsOptions::default())
            .await?;
        Ok(offsets.into_values().next().and_then(|r| r.ok()).map(|o| o.start_offset))
    }

    /// Wait (at most 30 s) until the broker's share-partition start offset reaches `end`:
    /// every offset below it accepted or archived. Returns how long it took, or `None`.
    async fn wait_drained(&self, kafka: &Kafka, group: &str, end: i64) -> Result<Option<Duration>> {
        let started = Instant::now();
        let limit = Duration::from_secs(30);
        loop {
            let spso = self.spso(kafka, group).await;
            match spso {
                Ok(Some(spso)) if spso >= end => return Ok(Some(started.elapsed())),
                _ if started.elapsed() >= limit => {
                    println!("  NOT DRAINED after {limit:?}: SPSO {spso:?}, wanted {end}");
                    return Ok(None);
                }
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The end check of every scenario. Once the scenario saw everything it expected, produce
    /// a marker and poll `consumer` until it arrives, counting every other record on the way
    /// (a redelivery of something the scenario settled); then wait until the broker's
    /// share-partition start offset reaches the marker, which says no record before the
    /// marker can be delivered again.
    async fn marker(
        &self,
        kafka: &Kafka,
        topic: &str,
        group: &str,
        consumer: &ShareConsumer,
    ) -> Result<EndCheck> {
        self.produce(kafka, topic, "marker", 1).await?;
        let mut others = 0;
        loop {
            match consumer.poll(POLL).await {
                Ok(records) => {
                    let mut marker = None;
                    for record in &records {
                        consumer.ack(record)?;
                        if value(record) == "marker-0" {
                            marker = Some(record.offset);
                        } else {
                            others += 1;
                            if others <= 5 {
                                println!(
                                    "  before the marker: {}@{} delivery_count {:?}",
                                    value(record),
                                    record.offset,
                                    record.delivery_count
                                );
                            }
                        }
                    }
                    if let Some(offset) = marker {
                        consumer.commit().await?;
                        // The broker persists the start offset one acknowledgement behind: it
                        // passes the last settled batch only when a later one is acquired. So
                        // SPSO == the marker's offset is the proof that every record before
                        // the marker is accepted or archived.
                        let drained = self.wait_drained(kafka, group, offset).await?;
                        return Ok(EndCheck { late: others, drained });
                    }
                }
                Err(error) => println!("  marker poll error: {error}"),
            }
        }
    }

    // ---------------------------------------------------------------------------------------
    // (a) two consumers, one partition, every record accepted once

    async fn parallel_one_partition(&self) -> Result<()> {
        let n: usize = std::env::var("EVAL_A_RECORDS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
        let admin_kafka = self.connect("eval-a-admin").await?;
        let (topic, group) = self.topic_and_group(&admin_kafka, "a", &[]).await?;
        self.produce(&admin_kafka, &topic, "a", n).await?;
        println!("  produced {n} to {topic}");
        let stop = Arc::new(AtomicBool::new(false));
        let seen: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
        let mut tasks = Vec::new();
        let mut stats = Vec::new();
        let mut consumers = Vec::new();
        let started = Instant::now();
        for member in 0..2 {
            let kafka = self.connect(&format!("eval-a-{member}")).await?;
            let (consumer, ack_stats) = self.share_consumer(&kafka, &group, &topic, 100).await?;
            stats.push(ack_stats);
            consumers.push((kafka, consumer.clone()));
            let (stop, seen) = (Arc::clone(&stop), Arc::clone(&seen));
            tasks.push(tokio::spawn(async move {
                let (mut count, mut redelivered, mut errors, mut polls) = (0u64, 0u64, 0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    match consumer.poll(POLL).await {
                        Ok(records) => {
                            if !records.is_empty() {
                                polls += 1;
                            }
                            let mut seen = seen.lock().await;
                            for record in &records {
                                *seen.entry(value(record)).or_default() += 1;
                                count += 1;
                                if record.delivery_count.unwrap_or(1) > 1 {
                                    redelivered += 1;
                                }
                                consumer.ack(record).expect("ack");
                            }
                        }
                        Err(_) => {
                            errors += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
                (count, redelivered, errors, polls)
            }));
        }
        let mut progress = Instant::now();
        loop {
            let distinct = seen.lock().await.keys().filter(|k| k.starts_with("a-")).count();
            if distinct >= n {
                break;
            }
            if progress.elapsed() >= Duration::from_secs(5) {
                progress = Instant::now();
                println!("  {:.1}s: {distinct} distinct", started.elapsed().as_secs_f64());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        println!("  all {n} consumed");
        let consumed_in = started.elapsed();
        // the acknowledgements of the last polls ride on the next fetch; commit sends them
        stop.store(true, Ordering::Relaxed);
        let mut per_member = Vec::new();
        for task in tasks {
            per_member.push(task.await?);
        }
        println!("  members stopped");
        for (_, consumer) in &consumers {
            println!("  commit: {:?}", consumer.commit().await?);
        }
        let end = self.marker(&admin_kafka, &topic, &group, &consumers[0].1).await?;
        for (_, consumer) in &consumers {
            consumer.close().await?;
        }
        let seen = seen.lock().await;
        let distinct = seen.keys().filter(|k| k.starts_with("a-")).count();
        let duplicates: u32 = seen.values().map(|c| c - 1).sum();
        println!(
            "RESULT a records={n} distinct={distinct} duplicates={duplicates} per_member(records,redelivered,poll_errors,nonempty_polls)={:?} \
             consumed_in={:.2}s rate={:.0}/s {end} {} | {}",
            per_member,
            consumed_in.as_secs_f64(),
            n as f64 / consumed_in.as_secs_f64(),
            stats[0].summary(),
            stats[1].summary()
        );
        ensure!(distinct == n && end.late == 0 && end.drained.is_some(), "lost or late records");
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // (b) and (e): per-record scripts of ACCEPT / RELEASE / REJECT

    async fn scripted(
        &self,
        name: &str,
        limit: &str,
        scripts: &[(&str, &[char])],
    ) -> Result<BTreeMap<String, Vec<(i16, f64)>>> {
        let kafka = self.connect(&format!("eval-{name}")).await?;
        let (topic, group) =
            self.topic_and_group(&kafka, name, &[("share.delivery.count.limit", limit)]).await?;
        let (consumer, stats) = self.share_consumer(&kafka, &group, &topic, 100).await?;
        self.produce(&kafka, &topic, name, scripts.len()).await?;
        let started = Instant::now();
        // record -> [(delivery count, seconds since start)]
        let mut deliveries: BTreeMap<String, Vec<(i16, f64)>> = BTreeMap::new();
        // a record is settled once accepted or rejected, or released at the delivery limit
        let limit_count: i16 = limit.parse()?;
        let mut settled = vec![false; scripts.len()];
        while settled.iter().any(|s| !s) {
            let records = consumer.poll(POLL).await?;
            for record in &records {
                let v = value(record);
                let index: usize = v.rsplit('-').next().unwrap_or("0").parse()?;
                let attempts = deliveries.entry(v).or_default();
                let count = record.delivery_count.unwrap_or(-1);
                attempts.push((count, (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0));
                let script = scripts[index].1;
                let action = script[(attempts.len() - 1).min(script.len() - 1)];
                match action {
                    'A' => consumer.ack(record)?,
                    'R' => consumer.release(record)?,
                    'X' => consumer.reject(record)?,
                    other => bail!("bad action {other}"),
                }
                settled[index] = action != 'R' || count >= limit_count;
            }
            if !records.is_empty() {
                for (partition, result) in consumer.commit().await? {
                    if let Err(error) = result {
                        println!("  commit {partition:?}: {error}");
                    }
                }
            }
        }
        let settled_at = started.elapsed();
        let end = self.marker(&kafka, &topic, &group, &consumer).await?;
        consumer.close().await?;
        println!(
            "RESULT {name} delivery_count_limit={limit} deliveries(record -> [(delivery_count, t_s)])={deliveries:?} \
             settled_at={:.2}s {end} {}",
            settled_at.as_secs_f64(),
            stats.summary()
        );
        ensure!(end.late == 0 && end.drained.is_some(), "records delivered after they were settled");
        Ok(deliveries)
    }

    async fn release_until_limit(&self) -> Result<()> {
        // b-0 is released on every delivery: the limit (4) archives it after the 4th.
        // b-1 is released once and accepted on its second delivery; b-2 accepted at once.
        let d = self.scripted("b", "4", &[("b-0", &['R']), ("b-1", &['R', 'A']), ("b-2", &['A'])]).await?;
        let counts =
            |k: &str| d.get(k).map(|v| v.iter().map(|(c, _)| *c).collect::<Vec<_>>()).unwrap_or_default();
        let gaps: Vec<f64> = d
            .get("b-0")
            .map(|v| v.windows(2).map(|w| ((w[1].1 - w[0].1) * 1000.0).round()).collect())
            .unwrap_or_default();
        println!(
            "RESULT b summary b-0 counts={:?} b-1 counts={:?} b-2 counts={:?} release->redelivery gaps ms={gaps:?}",
            counts("b-0"),
            counts("b-1"),
            counts("b-2")
        );
        ensure!(counts("b-0") == vec![1, 2, 3, 4], "b-0 must be delivered 4 times with counts 1..4");
        ensure!(counts("b-1") == vec![1, 2], "b-1 must be delivered twice");
        ensure!(counts("b-2") == vec![1], "b-2 must be delivered once");
        Ok(())
    }

    async fn reject(&self) -> Result<()> {
        // e-0 rejected at once; e-1 released then rejected; e-2 accepted.
        let d = self.scripted("e", "4", &[("e-0", &['X']), ("e-1", &['R', 'X']), ("e-2", &['A'])]).await?;
        let n = |k: &str| d.get(k).map_or(0, Vec::len);
        println!("RESULT e summary deliveries e-0={} e-1={} e-2={}", n("e-0"), n("e-1"), n("e-2"));
        ensure!(n("e-0") == 1 && n("e-1") == 2 && n("e-2") == 1, "a rejected record was delivered again");
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // (d) a consumer that holds its records: SIGKILLed (d1) or too slow (d2)

    async fn holder(
        &self,
        group: &str,
        topic: &str,
        expect: usize,
        hold_secs: u64,
    ) -> Result<(
        tokio::process::Child,
        tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
        usize,
        Instant,
    )> {
        let mut child = tokio::process::Command::new(std::env::current_exe()?)
            .args([
                "--bootstrap",
                &self.bootstrap,
                "hold",
                topic,
                group,
                &expect.to_string(),
                &hold_secs.to_string(),
            ])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().context("child stdout")?).lines();
        loop {
            let line = lines.next_line().await?.context("holder exited before acquiring")?;
            if let Some(n) = line.strip_prefix("ACQUIRED ") {
                return Ok((child, lines, n.trim().parse()?, Instant::now()));
            }
            if line == "SUBSCRIBED" {
                let kafka = self.connect("eval-d-producer").await?;
                self.produce(&kafka, topic, "d", expect).await?;
            }
        }
    }

    /// Consume with a fresh member until the broker says everything is settled; returns when
    /// the first and last record arrived (after `since`) and the delivery counts seen.
    /// A second member, joined and assigned the partition before the first one fails.
    async fn second_member(
        &self,
        kafka: &Kafka,
        group: &str,
        topic: &str,
    ) -> Result<(ShareConsumer, Arc<AckStats>)> {
        let (consumer, stats) = self.share_consumer(kafka, group, topic, 500).await?;
        while consumer.assignment().is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok((consumer, stats))
    }

    async fn take_over(
        &self,
        consumer: &ShareConsumer,
        n: i64,
        since: Instant,
    ) -> Result<(Option<f64>, f64, BTreeMap<i16, u32>, usize)> {
        let (mut first, mut last, mut counts, mut total) = (None, 0.0, BTreeMap::new(), 0);
        let mut distinct = std::collections::HashSet::new();
        while (distinct.len() as i64) < n {
            let records = consumer.poll(POLL).await?;
            for record in &records {
                distinct.insert(value(record));
                let t = since.elapsed().as_secs_f64();
                first.get_or_insert(t);
                last = t;
                total += 1;
                *counts.entry(record.delivery_count.unwrap_or(-1)).or_insert(0) += 1;
                consumer.ack(record)?;
            }
            if !records.is_empty() {
                consumer.commit().await?;
            }
        }
        Ok((first, last, counts, total))
    }

    async fn consumer_sigkill(&self) -> Result<()> {
        let m = 50;
        let kafka = self.connect("eval-d1").await?;
        let (topic, group) = self.topic_and_group(&kafka, "d1", &[]).await?;
        let (mut child, _lines, acquired, acquired_at) = self.holder(&group, &topic, m, 3600).await?;
        let (consumer, stats) = self.second_member(&kafka, &group, &topic).await?;
        let pid = child.id().context("child pid")?;
        std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status()?;
        let killed_at = Instant::now();
        child.wait().await?;
        let (first, last, counts, total) = self.take_over(&consumer, m as i64, killed_at).await?;
        let end = self.marker(&kafka, &topic, &group, &consumer).await?;
        let lock = consumer.acquisition_lock_timeout();
        consumer.close().await?;
        println!(
            "RESULT d1 produced={m} acquired_by_killed={acquired} kill_after_acquire={:.2}s taken_over={total} \
             first_redelivery_after_kill={:?}s last_after_kill={last:.2}s delivery_counts={counts:?} lock={lock:?} {end} {}",
            (killed_at - acquired_at).as_secs_f64(),
            first.map(|f| (f * 100.0).round() / 100.0),
            stats.summary()
        );
        ensure!(
            end.late == 0 && end.drained.is_some(),
            "records redelivered after a consumer SIGKILL was recovered"
        );
        Ok(())
    }

    async fn lock_expiry(&self) -> Result<()> {
        let m = 50;
        let lock_ms = std::env::var("EVAL_D2_LOCK_MS").unwrap_or("6000".into());
        let kafka = self.connect("eval-d2").await?;
        let (topic, group) =
            self.topic_and_group(&kafka, "d2", &[("share.record.lock.duration.ms", &lock_ms)]).await?;
        // the holder keeps heartbeating but settles only after 20 s, past the lock
        let (mut child, mut lines, acquired, acquired_at) = self.holder(&group, &topic, m, 20).await?;
        let (consumer, stats) = self.second_member(&kafka, &group, &topic).await?;
        let (first, last, counts, total) = self.take_over(&consumer, m as i64, acquired_at).await?;
        let mut holder_said = Vec::new();
        while let Some(line) = lines.next_line().await? {
            holder_said.push(line);
        }
        child.wait().await?;
        let end = self.marker(&kafka, &topic, &group, &consumer).await?;
        consumer.close().await?;
        println!(
            "RESULT d2 lock_ms={lock_ms} produced={m} acquired_by_slow={acquired} taken_over={total} \
             first_redelivery_after_acquire={:?}s last={last:.2}s delivery_counts={counts:?} {end} {} \
             slow_member_late_ack={holder_said:?}",
            first.map(|f| (f * 100.0).round() / 100.0),
            stats.summary()
        );
        ensure!(
            end.late == 0 && end.drained.is_some(),
            "records redelivered after a lock expiry was recovered"
        );
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // transactional consume-produce latency (data for later, not a share-group scenario)

    async fn transactions(&self, client: &str) -> Result<()> {
        let kafka = self.connect(&format!("eval-txn-{client}")).await?;
        let (input, group) = self.topic_and_group(&kafka, &format!("txn-{client}-in"), &[]).await?;
        let output = format!("{input}-out");
        for (name, result) in kafka
            .admin()
            .create_topics([NewTopic::new(output.clone(), 1, 1)?], CreateTopicsOptions::default())
            .await?
        {
            result.with_context(|| format!("creating {name}"))?;
        }
        let loader = tokio::spawn(txn::load(self.connect("eval-txn-loader").await?, input.clone()));
        let expect = {
            let rate: usize = std::env::var("EVAL_TXN_RATE").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
            let seconds: usize =
                std::env::var("EVAL_TXN_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
            rate * seconds
        };
        let outcome = match client {
            "krafka" => txn::krafka_processor(kafka, input, output, group, expect).await?,
            #[cfg(feature = "rdkafka")]
            "rdkafka" => {
                let bootstrap = self.bootstrap.clone();
                tokio::task::spawn_blocking(move || {
                    txn::rdkafka_processor(bootstrap, input, output, group, expect)
                })
                .await??
            }
            other => bail!("txn-{other}: not built in (cargo build --release --features rdkafka)"),
        };
        ensure!(loader.await?? == expect, "the loader sent a different count");
        outcome.print(client);
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // (c) the broker is SIGKILLed mid-consumption and started again

    async fn broker_restart(&self) -> Result<()> {
        let n: usize = std::env::var("EVAL_C_RECORDS").ok().and_then(|v| v.parse().ok()).unwrap_or(6_000);
        let per_record = Duration::from_micros(
            std::env::var("EVAL_C_RECORD_US").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000),
        );
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("broker");
        let admin_kafka = self.connect("eval-c-admin").await?;
        let (topic, group) = self.topic_and_group(&admin_kafka, "c", &[]).await?;
        self.produce(&admin_kafka, &topic, "c", n).await?;
        let stop = Arc::new(AtomicBool::new(false));
        // value -> deliveries; (seconds since start, record) of every delivery
        let seen: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
        let timeline: Arc<Mutex<Vec<(f64, i16)>>> = Arc::default();
        let errors: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
        let started = Instant::now();
        let mut tasks = Vec::new();
        let mut consumers = Vec::new();
        let mut stats = Vec::new();
        for member in 0..2 {
            let kafka = self.connect(&format!("eval-c-{member}")).await?;
            let (consumer, ack_stats) = self.share_consumer(&kafka, &group, &topic, 50).await?;
            stats.push(ack_stats);
            consumers.push((kafka, consumer.clone()));
            let (stop, seen, timeline, errors) =
                (Arc::clone(&stop), Arc::clone(&seen), Arc::clone(&timeline), Arc::clone(&errors));
            tasks.push(tokio::spawn(async move {
                let mut count = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    match consumer.poll(POLL).await {
                        Ok(records) => {
                            for record in &records {
                                tokio::time::sleep(per_record).await; // the "work"
                                *seen.lock().await.entry(value(record)).or_default() += 1;
                                timeline.lock().await.push((
                                    started.elapsed().as_secs_f64(),
                                    record.delivery_count.unwrap_or(-1),
                                ));
                                count += 1;
                                consumer.ack(record).expect("ack");
                            }
                        }
                        Err(error) => {
                            *errors.lock().await.entry(short(&error)).or_default() += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
                count
            }));
        }
        // kill the broker a third of the way through
        loop {
            if seen.lock().await.len() >= n / 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let status = std::process::Command::new(&script).arg("kill").status()?;
        ensure!(status.success(), "broker kill failed");
        let killed_at = started.elapsed().as_secs_f64();
        let distinct_at_kill = seen.lock().await.len();
        tokio::time::sleep(Duration::from_secs(2)).await; // the broker stays down 2 s
        let status = std::process::Command::new(&script).arg("start").status()?;
        ensure!(status.success(), "broker start failed");
        let ready_at = started.elapsed().as_secs_f64();
        loop {
            let distinct = seen.lock().await.keys().filter(|k| k.starts_with("c-")).count();
            if distinct >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let all_at = started.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let mut per_member = Vec::new();
        for task in tasks {
            per_member.push(task.await?);
        }
        for (_, consumer) in &consumers {
            let _ = consumer.commit().await?;
        }
        let end = self.marker(&admin_kafka, &topic, &group, &consumers[0].1).await?;
        for (_, consumer) in &consumers {
            consumer.close().await?;
        }
        let timeline = timeline.lock().await;
        let first_after_ready = timeline.iter().map(|(t, _)| *t).find(|t| *t > ready_at);
        let redelivered = timeline.iter().filter(|(_, c)| *c > 1).count();
        let (gap, gap_from) = timeline
            .windows(2)
            .map(|w| (w[1].0 - w[0].0, w[0].0))
            .fold((0.0, 0.0), |best, g| if g.0 > best.0 { g } else { best });
        let seen = seen.lock().await;
        let duplicates: u32 = seen.values().map(|c| c - 1).sum();
        println!(
            "RESULT c records={n} distinct={} duplicates={duplicates} per_member={per_member:?} distinct_at_kill={distinct_at_kill} \
             killed_at={killed_at:.2}s broker_ready_at={ready_at:.2}s first_record_after_ready_at={:?} longest_gap={gap:.2}s_from_{gap_from:.2}s \
             delivered_with_count_above_1={redelivered} all_consumed_at={all_at:.2}s \
             {end} poll_errors={:?} {} | {}",
            seen.len(),
            first_after_ready.map(|t| (t * 100.0).round() / 100.0),
            errors.lock().await,
            stats[0].summary(),
            stats[1].summary()
        );
        ensure!(
            seen.len() == n && end.late == 0 && end.drained.is_some(),
            "records lost or late over a broker restart"
        );
        Ok(())
    }
}

/// Child process of scenario d: join, let the parent produce, acquire `expect` records, print
/// how many, hold them `hold_secs` (or until SIGKILL), then accept them and print the commit
/// outcome the client reports.
async fn hold(bootstrap: &str, args: &[String]) -> Result<()> {
    let [topic, group, expect, hold_secs] = args else {
        bail!("hold TOPIC GROUP EXPECT HOLD_SECS");
    };
    let expect: usize = expect.parse()?;
    let kafka = Kafka::builder(bootstrap.to_string()).client_id("eval-holder").connect().await?;
    let consumer = kafka
        .share_consumer(group)
        .acknowledgement_mode(AcknowledgementMode::Explicit)
        .max_poll_records(500)
        .build()
        .await?;
    consumer.subscribe([topic]).await?;
    // wait for the assignment before the parent produces, so this member acquires first
    while consumer.assignment().is_empty() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("SUBSCRIBED");
    let records = loop {
        let records = consumer.poll(POLL).await?;
        if !records.is_empty() {
            break records;
        }
    };
    println!("ACQUIRED {}", records.len());
    let _ = expect;
    tokio::time::sleep(Duration::from_secs(hold_secs.parse()?)).await;
    for record in &records {
        consumer.ack(record)?;
    }
    let results = consumer.commit().await?;
    let outcome: Vec<String> = results
        .iter()
        .map(|(tp, r)| {
            format!(
                "{}-{}: {}",
                tp.topic.len(),
                tp.partition,
                r.as_ref().map_or_else(|e| e.to_string(), |_| "ok".into())
            )
        })
        .collect();
    println!("LATE ACK {outcome:?}");
    consumer.close().await?;
    Ok(())
}
