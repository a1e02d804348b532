//! Transactional consume-produce, krafka against rdkafka (issue #29, data for later): the
//! antifraude hop's shape. A loader produces to an input topic at `EVAL_TXN_RATE` records/s
//! (default 200, open loop) for `EVAL_TXN_SECONDS` (default 20); a processor in a KIP-848
//! group (`read_committed`, no auto-commit) consumes and, for each poll's records, runs one
//! transaction: begin, the input offsets, one output record per input record, commit (the
//! order and settings of crates/kafka's transactional producer for both clients). Per
//! transaction it records the begin → commit time; per record the time from its send at the
//! loader to the commit that made its output visible. Both clients run on the same broker,
//! topics of their own, the same loader (krafka's producer).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Result, ensure};
use krafka::consumer::{AutoOffsetReset, GroupProtocol, IsolationLevel};
use krafka::producer::TopicPartitionOffset;
use krafka::{Kafka, Record};

pub fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_micros() as u64
}

fn rate() -> u64 {
    std::env::var("EVAL_TXN_RATE").ok().and_then(|v| v.parse().ok()).unwrap_or(200)
}

fn seconds() -> u64 {
    std::env::var("EVAL_TXN_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(20)
}

/// Produce `rate × seconds` records on an open-loop schedule, each carrying its send time.
pub async fn load(kafka: Kafka, topic: String) -> Result<usize> {
    let producer = kafka.producer().linger(Duration::from_millis(1)).build().await?;
    let (rate, total) = (rate(), rate() * seconds());
    let started = Instant::now();
    let mut handles = Vec::new();
    for i in 0..total {
        let due = started + Duration::from_micros(i * 1_000_000 / rate);
        tokio::time::sleep_until(due.into()).await;
        handles.push(producer.enqueue(Record::new(topic.as_str(), now_us().to_string())).await?);
    }
    for handle in handles {
        let _metadata = handle.await?;
    }
    producer.close().await?;
    Ok(total as usize)
}

/// Latency statistics in milliseconds.
pub fn stats(name: &str, mut values: Vec<f64>) -> String {
    if values.is_empty() {
        return format!("{name}: none");
    }
    values.sort_by(f64::total_cmp);
    let q = |p: f64| values[((values.len() as f64 * p).ceil() as usize).clamp(1, values.len()) - 1];
    format!(
        "{name}: n={} p50={:.1}ms p90={:.1}ms p99={:.1}ms max={:.1}ms",
        values.len(),
        q(0.50),
        q(0.90),
        q(0.99),
        values[values.len() - 1]
    )
}

pub struct Outcome {
    pub records: usize,
    pub txn_ms: Vec<f64>,
    pub e2e_ms: Vec<f64>,
}

impl Outcome {
    pub fn print(&self, client: &str) {
        println!(
            "RESULT txn-{client} rate={}/s seconds={} records={} transactions={} records_per_txn={:.2} | {} | {}",
            rate(),
            seconds(),
            self.records,
            self.txn_ms.len(),
            self.records as f64 / self.txn_ms.len().max(1) as f64,
            stats("begin->commit", self.txn_ms.clone()),
            stats("send->committed", self.e2e_ms.clone())
        );
    }
}

/// krafka's processor.
pub async fn krafka_processor(
    kafka: Kafka,
    input: String,
    output: String,
    group: String,
    expect: usize,
) -> Result<Outcome> {
    let consumer = kafka
        .consumer(group.as_str())
        .group_protocol(GroupProtocol::Consumer)
        .auto_offset_reset(AutoOffsetReset::Earliest)
        .isolation_level(IsolationLevel::ReadCommitted)
        .enable_auto_commit(false)
        .fetch_max_wait(Duration::from_millis(100))
        .build()
        .await?;
    let producer = kafka
        .producer()
        .linger(Duration::from_millis(1))
        // as crates/kafka sets librdkafka's retry.backoff.ms: after a commit the coordinator
        // answers CONCURRENT_TRANSACTIONS until its markers are written; 100 ms (the default)
        // would be spent on most transactions
        .retry_backoff(Duration::from_millis(2))
        // krafka wants delivery_timeout >= linger + request_timeout (30 s)
        .transaction_timeout(Duration::from_secs(60))
        .delivery_timeout(Duration::from_secs(45))
        .build_transactional(format!("{group}-tx"))
        .await?;
    consumer.subscribe([input.as_str()]).await?;
    let mut outcome = Outcome { records: 0, txn_ms: Vec::new(), e2e_ms: Vec::new() };
    let deadline = Instant::now() + Duration::from_secs(seconds() + 60);
    while outcome.records < expect {
        ensure!(
            Instant::now() < deadline,
            "krafka processor: {} of {expect} after the deadline",
            outcome.records
        );
        let records = consumer.poll(Duration::from_millis(100)).await?;
        if records.is_empty() {
            continue;
        }
        let began = Instant::now();
        producer.begin()?;
        // the order crates/antifraud uses: offsets first, then the records
        let offsets: Vec<TopicPartitionOffset> =
            records.iter().map(|r| TopicPartitionOffset::new(&*r.topic, r.partition, r.offset + 1)).collect();
        let metadata =
            consumer.group_metadata().await.ok_or_else(|| anyhow::anyhow!("not a group member"))?;
        producer.send_offsets(&offsets, &metadata).await?;
        for record in &records {
            // commit waits for every send of the transaction and refuses if one failed
            let _handle = producer
                .enqueue(Record::new(output.as_str(), record.value.clone().unwrap_or_default()))
                .await?;
        }
        producer.commit().await?;
        let committed = now_us();
        outcome.txn_ms.push(began.elapsed().as_secs_f64() * 1000.0);
        for record in &records {
            let sent: u64 = record.value_str().unwrap_or("0").parse()?;
            outcome.e2e_ms.push(committed.saturating_sub(sent) as f64 / 1000.0);
        }
        outcome.records += records.len();
    }
    producer.close().await?;
    consumer.close().await?;
    Ok(outcome)
}

/// rdkafka's processor, with the settings of crates/kafka's transactional producer and
/// consumer (linger 1 ms here as for krafka, `retry.backoff.ms=2`, KIP-848, read_committed),
/// on a thread of its own: librdkafka's transactional calls block.
#[cfg(feature = "rdkafka")]
pub fn rdkafka_processor(
    bootstrap: String,
    input: String,
    output: String,
    group: String,
    expect: usize,
) -> Result<Outcome> {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", &group)
        .set("group.protocol", "consumer")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "100")
        .create()?;
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "1")
        .set("transactional.id", format!("{group}-tx"))
        .set("transaction.timeout.ms", "10000")
        .set("delivery.timeout.ms", "10000")
        .set("retry.backoff.ms", "2")
        .create()?;
    let timeout = Duration::from_secs(10);
    producer.init_transactions(timeout)?;
    consumer.subscribe(&[input.as_str()])?;
    let mut outcome = Outcome { records: 0, txn_ms: Vec::new(), e2e_ms: Vec::new() };
    let deadline = Instant::now() + Duration::from_secs(seconds() + 60);
    while outcome.records < expect {
        ensure!(
            Instant::now() < deadline,
            "rdkafka processor: {} of {expect} after the deadline",
            outcome.records
        );
        let mut batch = Vec::new();
        if let Some(message) = consumer.poll(Duration::from_millis(100)) {
            batch.push(message?.detach());
            // whatever else is already fetched, like krafka's poll returns
            while let Some(message) = consumer.poll(Duration::ZERO) {
                batch.push(message?.detach());
            }
        }
        if batch.is_empty() {
            continue;
        }
        let began = Instant::now();
        producer.begin_transaction()?;
        // as crates/kafka's transactional producer: offsets first (absorbs the coordinator's
        // CONCURRENT_TRANSACTIONS in 2 ms steps), then the records, then wait until no
        // delivery report is outstanding (rdkafka's commit flushes, and its flush polls for a
        // fixed 100 ms when one is)
        producer.send_offsets_to_transaction(
            &consumer.position()?,
            &consumer.group_metadata().ok_or_else(|| anyhow::anyhow!("no group metadata"))?,
            timeout,
        )?;
        for message in &batch {
            let payload = message.payload().unwrap_or_default();
            producer.send(BaseRecord::<(), [u8]>::to(&output).payload(payload)).map_err(|(e, _)| e)?;
        }
        while producer.in_flight_count() > 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
        producer.commit_transaction(timeout)?;
        let committed = now_us();
        outcome.txn_ms.push(began.elapsed().as_secs_f64() * 1000.0);
        for message in &batch {
            let sent: u64 = std::str::from_utf8(message.payload().unwrap_or_default())?.parse()?;
            outcome.e2e_ms.push(committed.saturating_sub(sent) as f64 / 1000.0);
        }
        outcome.records += batch.len();
    }
    Ok(outcome)
}
