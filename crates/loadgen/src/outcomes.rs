//! Final statuses, learnt from the outcome topics (`transferencias.liquidada`,
//! `transferencias.rejeitada`) rather than by polling: one reader assigned to every partition
//! at the high watermarks taken before the first transfer is sent, so no outcome of this run
//! can be missed and none from before it is read.

use std::time::{Duration, Instant};

use kafka::context::Context;
use kafka::rdkafka::consumer::{Consumer, StreamConsumer};
use kafka::rdkafka::message::Message;
use kafka::rdkafka::{Offset, TopicPartitionList};
use kafka::KafkaArgs;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use contracts::{topics, OutcomeEvent};

use crate::LoadgenError;

const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// One transfer's final status, when it was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub transfer_id: Uuid,
    pub settled: bool,
    pub seen: Instant,
}

/// The reader, positioned; [`Self::run`] streams what arrives.
pub struct OutcomeReader {
    consumer: StreamConsumer<Context>,
    settled_topic: String,
}

impl std::fmt::Debug for OutcomeReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutcomeReader").finish_non_exhaustive()
    }
}

fn kafka_error(what: &'static str) -> impl Fn(kafka::rdkafka::error::KafkaError) -> LoadgenError {
    move |error| LoadgenError::Kafka { what, detail: error.to_string() }
}

impl OutcomeReader {
    /// Assigns every partition of both outcome topics at its current high watermark.
    pub async fn open(args: &KafkaArgs, run: &str) -> Result<Self, LoadgenError> {
        let args = args.clone();
        let run = run.to_owned();
        tokio::task::spawn_blocking(move || Self::open_blocking(&args, &run))
            .await
            .map_err(|error| LoadgenError::Task(error.to_string()))?
    }

    fn open_blocking(args: &KafkaArgs, run: &str) -> Result<Self, LoadgenError> {
        let mut config = kafka::config::base_consumer_settings(args, "pagamentos-loadgen");
        config
            // never joins or commits: partitions are assigned by hand
            .set("group.id", args.group(&format!("pagamentos-loadgen-{run}")))
            .set("group.protocol", "classic")
            // librdkafka's `fetch.wait.max.ms` (500 ms) kept: the broker answers a fetch as soon
            // as one byte is readable (`fetch.min.bytes` 1), so the wait bounds only idle
            // fetches. 10 ms here had loadgen ask 100 times a second for nothing, the broker's
            // work and not the system's (interleaved runs at 200/s: latency no higher with 500)
            .set("enable.auto.commit", "false");
        let consumer: StreamConsumer<Context> =
            kafka::context::create(&config).map_err(kafka_error("create consumer"))?;
        let mut assignment = TopicPartitionList::new();
        for name in [topics::SETTLED, topics::REJECTED] {
            let topic = args.topic(name);
            let partitions = kafka::metadata::partitions(consumer.client(), &topic, METADATA_TIMEOUT)
                .map_err(kafka_error("metadata"))?;
            if partitions.is_empty() {
                return Err(LoadgenError::Kafka {
                    what: "find the outcome topics",
                    detail: format!(
                        "topic {topic} does not exist (run `pagamentos topics` or start the services)"
                    ),
                });
            }
            for partition in partitions {
                let (_, high) = consumer
                    .fetch_watermarks(&topic, partition, METADATA_TIMEOUT)
                    .map_err(kafka_error("watermarks"))?;
                assignment
                    .add_partition_offset(&topic, partition, Offset::Offset(high))
                    .map_err(kafka_error("assign"))?;
            }
        }
        consumer.assign(&assignment).map_err(kafka_error("assign"))?;
        Ok(Self { consumer, settled_topic: args.topic(topics::SETTLED) })
    }

    /// Sends every outcome read to `sink` until `stop`. Records that are not outcome events
    /// (another system's, a bad producer's) are skipped: loadgen only counts its own transfers.
    pub async fn run(self, sink: mpsc::UnboundedSender<Outcome>, stop: CancellationToken) {
        loop {
            let message = tokio::select! {
                () = stop.cancelled() => return,
                message = self.consumer.recv() => message,
            };
            let message = match message {
                Ok(message) => message,
                Err(error) => {
                    tracing::warn!(%error, "reading the outcome topics");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let seen = Instant::now();
            let settled = message.topic() == self.settled_topic;
            let Some(Ok(event)) = message.payload().map(|payload| OutcomeEvent::decode(settled, payload))
            else {
                continue;
            };
            if sink.send(Outcome { transfer_id: event.transfer_id(), settled, seen }).is_err() {
                return;
            }
        }
    }
}
