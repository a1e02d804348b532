#![allow(dead_code)]
//! What the broker wrote, read from its log directory by Kafka's own `DumpLogSegments`: which
//! transactional offset commit passed a lost transfer's request, and what that transaction wrote.
//!
//! A transfer is lost when antifraude's group committed an offset past its request without an
//! analysis of it. The offset commits of a transaction are records on `__consumer_offsets`
//! (decoded with `--offsets-decoder`), its end a COMMIT or ABORT control record of the same
//! producer id on every partition it wrote, and its outputs the records that producer id wrote
//! on the output topics before those markers (`--print-data-log --deep-iteration`).
//!
//! librdkafka implements transactions version 1 (no KIP-890 part 2): every transaction of a
//! producer instance carries the same producer id and epoch, so (id, epoch) names the instance,
//! not one transaction. The transaction is found through the transaction log (`__transaction_state`,
//! `--transaction-log-decoder`): its PrepareCommit/PrepareAbort entry lists the partitions it
//! wrote, and the coordinator writes its markers between that entry and the CompleteCommit/
//! CompleteAbort that follows, before the producer's next transaction can end; on each partition
//! the transaction's records are that producer's records between its previous marker there and
//! the marker inside that window. (A Java client with transactions version 2 bumps the epoch at
//! every end instead: its markers carry epoch + 1; the same reading covers it.)
//!
//! The broker's log directory is found from the `scripts/stack` state whose broker advertises one
//! of the bootstrap addresses (the local stack's `.stack/`, or a chaos cluster's state directory
//! under `CARGO_TARGET_TMPDIR`); `PAGAMENTOS_KAFKA_LOG_DIRS` names it explicitly. Kafka 4 ships
//! `DumpLogSegments` in `kafka-tools` (`org.apache.kafka.tools.DumpLogSegments`), which the broker's
//! jars lack: `scripts/stack` installs it in a directory of its own beside them
//! (`PAGAMENTOS_KAFKA_TOOLS_JAR` names another). Nothing here panics: it runs on a failing test's way out, so
//! every problem is an `Err` or a note for the report.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// The Kafka version `scripts/stack` runs (its `KAFKA_VERSION`).
const KAFKA_VERSION: &str = "4.3.1";
const DUMP_CLASS: &str = "org.apache.kafka.tools.DumpLogSegments";
const OFFSETS_TOPIC: &str = "__consumer_offsets";
const TRANSACTION_TOPIC: &str = "__transaction_state";

/// One record batch as DumpLogSegments prints it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    pub base_offset: i64,
    pub last_offset: i64,
    pub producer_id: i64,
    pub producer_epoch: i64,
    pub transactional: bool,
    pub control: bool,
    pub create_time: i64,
    pub records: Vec<Record>,
}

/// One record of a batch (`--deep-iteration`): its key and payload as printed (JSON under the
/// offsets and transaction-log decoders; `<DELETE>` for a tombstone), or a control record's
/// `endTxnMarker` (COMMIT, ABORT).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Record {
    pub offset: i64,
    pub create_time: i64,
    pub key: Option<String>,
    pub payload: Option<String>,
    pub marker: Option<String>,
}

impl Batch {
    /// A control batch's marker: COMMIT or ABORT.
    pub fn marker(&self) -> Option<&str> {
        if !self.control {
            return None;
        }
        self.records.iter().find_map(|record| record.marker.as_deref())
    }
}

/// One partition's log: its directory name (`<topic>-<partition>`) and batches in log order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Log {
    pub name: String,
    pub topic: String,
    pub partition: i32,
    pub batches: Vec<Batch>,
}

/// `name: value` in a line of DumpLogSegments, `name` a whole word.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let pattern = format!("{name}: ");
    let mut from = 0;
    while let Some(found) = line[from..].find(&pattern) {
        let at = from + found;
        if at == 0 || line.as_bytes()[at - 1] == b' ' {
            let value = &line[at + pattern.len()..];
            return Some(value.split(' ').next().unwrap_or(value));
        }
        from = at + pattern.len();
    }
    None
}

fn number(line: &str, name: &str) -> i64 {
    field(line, name).and_then(|value| value.parse().ok()).unwrap_or(-1)
}

/// `<topic>-<partition>` into its parts (a deleted partition's `…-<n>.<id>-delete` is none).
fn partition_of(name: &str) -> Option<(&str, i32)> {
    let (topic, partition) = name.rsplit_once('-')?;
    Some((topic, partition.parse().ok()?))
}

/// DumpLogSegments' text (any decoder, `--deep-iteration`) into one [`Log`] per partition
/// directory, the segments of one directory appended in the order they were dumped.
pub fn parse(text: &str) -> Vec<Log> {
    let mut logs: Vec<Log> = Vec::new();
    for line in text.lines() {
        if let Some(file) = line.strip_prefix("Dumping ") {
            let name = Path::new(file.trim())
                .parent()
                .and_then(Path::file_name)
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default();
            if logs.last().is_none_or(|log| log.name != name) {
                let (topic, partition) = partition_of(&name).unwrap_or((name.as_str(), -1));
                logs.push(Log {
                    topic: topic.to_owned(),
                    partition,
                    name: name.clone(),
                    batches: Vec::new(),
                });
            }
        } else if line.starts_with("baseOffset: ") {
            let Some(log) = logs.last_mut() else { continue };
            log.batches.push(Batch {
                base_offset: number(line, "baseOffset"),
                last_offset: number(line, "lastOffset"),
                producer_id: number(line, "producerId"),
                producer_epoch: number(line, "producerEpoch"),
                transactional: field(line, "isTransactional") == Some("true"),
                control: field(line, "isControl") == Some("true"),
                create_time: number(line, "CreateTime"),
                records: Vec::new(),
            });
        } else if let Some(rest) = line.strip_prefix("| ") {
            let Some(batch) = logs.last_mut().and_then(|log| log.batches.last_mut()) else { continue };
            // the key runs up to " payload: ", the payload to the end of the line
            let (key, payload) = match rest.find(" key: ") {
                Some(at) => {
                    let after = &rest[at + " key: ".len()..];
                    match after.find(" payload: ") {
                        Some(end) => (
                            Some(after[..end].to_owned()),
                            Some(after[end + " payload: ".len()..].to_owned()),
                        ),
                        None => (Some(after.to_owned()), None),
                    }
                }
                None => (None, rest.find("payload: ").map(|at| rest[at + "payload: ".len()..].to_owned())),
            };
            batch.records.push(Record {
                offset: number(rest, "offset"),
                create_time: number(rest, "CreateTime"),
                key,
                payload,
                marker: field(rest, "endTxnMarker").map(str::to_owned),
            });
        }
    }
    logs
}

/// How DumpLogSegments decodes a log's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoding {
    /// `__consumer_offsets`: `--offsets-decoder`.
    Offsets,
    /// `__transaction_state`: `--transaction-log-decoder`.
    TransactionLog,
    /// A topic of the application: `--print-data-log --deep-iteration` (payloads as text).
    Data,
}

/// The broker's log directories and a command line that runs DumpLogSegments.
#[derive(Debug, Clone)]
pub struct Broker {
    /// Where each node of the cluster keeps its partitions (one entry on the local stack).
    pub log_dirs: Vec<PathBuf>,
    classpath: String,
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"))
}

/// `key=value` of a properties file.
fn property(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once('=')?;
        (name.trim() == key).then(|| value.trim().to_owned())
    })
}

/// Every `server.properties` of a `scripts/stack` state directory (one broker, or each node of
/// a cluster).
fn node_properties(state: &Path) -> Vec<PathBuf> {
    let mut files = vec![state.join("kafka/server.properties")];
    if let Ok(nodes) = std::fs::read_dir(state.join("kafka-cluster")) {
        let mut nodes: Vec<PathBuf> = nodes.filter_map(|node| node.ok().map(|node| node.path())).collect();
        nodes.sort();
        files.extend(nodes.into_iter().map(|node| node.join("server.properties")));
    }
    files.retain(|file| file.is_file());
    files
}

impl Broker {
    /// The log directories of the broker(s) answering at `bootstrap` (comma-separated
    /// host:port), and DumpLogSegments' class path; `Err` says what was looked at.
    pub fn locate(bootstrap: &str) -> Result<Self, String> {
        let log_dirs = Self::log_dirs(bootstrap)?;
        let classpath = Self::classpath()?;
        Ok(Self { log_dirs, classpath })
    }

    fn log_dirs(bootstrap: &str) -> Result<Vec<PathBuf>, String> {
        if let Some(dirs) = std::env::var_os("PAGAMENTOS_KAFKA_LOG_DIRS") {
            let dirs: Vec<PathBuf> =
                std::env::split_paths(&dirs.to_string_lossy().replace(',', ":")).collect();
            return Ok(dirs);
        }
        let repository = std::env::var_os("CARGO_MANIFEST_DIR")
            .map(|package| PathBuf::from(package).join("../.."))
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."));
        let mut states: Vec<PathBuf> =
            std::env::var_os("PAGAMENTOS_STACK_DIR").map(PathBuf::from).into_iter().collect();
        states.push(repository.join(".stack"));
        let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        states.extend(["chaos-cluster3", "chaos-cluster3-netns"].map(|name| tmp.join(name)));
        let addresses: Vec<&str> = bootstrap.split(',').map(str::trim).filter(|a| !a.is_empty()).collect();
        let mut found = Vec::new();
        let mut looked = Vec::new();
        for state in &states {
            for file in node_properties(state) {
                looked.push(file.display().to_string());
                let Ok(text) = std::fs::read_to_string(&file) else { continue };
                let listeners = property(&text, "advertised.listeners")
                    .or_else(|| property(&text, "listeners"))
                    .unwrap_or_default();
                let serves = addresses.iter().any(|address| {
                    listeners.split(',').any(|listener| listener.rsplit("://").next() == Some(*address))
                });
                let dirs = property(&text, "log.dirs").or_else(|| property(&text, "log.dir"));
                if let (true, Some(dirs)) = (serves, dirs) {
                    found.extend(dirs.split(',').map(|dir| PathBuf::from(dir.trim())));
                }
            }
        }
        found.retain(|dir| dir.is_dir());
        found.dedup();
        if found.is_empty() {
            return Err(format!(
                "Kafka's log directory not found: no scripts/stack broker advertising {bootstrap} among {looked:?} \
                 (set PAGAMENTOS_KAFKA_LOG_DIRS to read another broker's)"
            ));
        }
        Ok(found)
    }

    fn classpath() -> Result<String, String> {
        let cache = std::env::var_os("PAGAMENTOS_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| home().join(".cache/pagamentos"));
        let libs = cache.join(format!("kafka-{KAFKA_VERSION}/libs"));
        if !libs.join(format!("kafka_2.13-{KAFKA_VERSION}.jar")).is_file() {
            return Err(format!(
                "Kafka's jars not found in {} (scripts/stack up installs them)",
                libs.display()
            ));
        }
        // scripts/stack installs kafka-tools beside the broker's jars, in a directory of its own
        let tools_dir = cache.join(format!("kafka-{KAFKA_VERSION}/tools"));
        let candidates = [
            std::env::var_os("PAGAMENTOS_KAFKA_TOOLS_JAR").map(PathBuf::from),
            Some(tools_dir.join(format!("kafka-tools-{KAFKA_VERSION}.jar"))),
        ];
        let Some(tools) = candidates.into_iter().flatten().find(|jar| jar.is_file()) else {
            return Err(format!(
                "kafka-tools-{KAFKA_VERSION}.jar (DumpLogSegments) not found in {}: `scripts/stack up` installs \
                 it, or set PAGAMENTOS_KAFKA_TOOLS_JAR",
                tools_dir.display()
            ));
        };
        Ok(format!("{}/*:{}", libs.display(), tools.display()))
    }

    /// The directories of `topic`'s partitions (of every partition of the internal topic
    /// `__consumer_offsets`, say), one per partition: on a cluster, the copy with the most data.
    pub fn partitions(&self, topic: &str) -> Vec<PathBuf> {
        let mut best: HashMap<i32, (u64, PathBuf)> = HashMap::new();
        for dir in &self.log_dirs {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            for entry in entries.filter_map(Result::ok) {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some((name_topic, partition)) = partition_of(&name) else { continue };
                if name_topic != topic {
                    continue;
                }
                let size: u64 = segments(&entry.path())
                    .iter()
                    .filter_map(|segment| std::fs::metadata(segment).ok())
                    .map(|metadata| metadata.len())
                    .sum();
                if best.get(&partition).is_none_or(|(largest, _)| size > *largest) {
                    best.insert(partition, (size, entry.path()));
                }
            }
        }
        let mut dirs: Vec<(i32, PathBuf)> =
            best.into_iter().map(|(partition, (_, dir))| (partition, dir)).collect();
        dirs.sort();
        dirs.into_iter().map(|(_, dir)| dir).collect()
    }

    /// Every partition of `topic` dumped and parsed (no partition directory: `Ok` of none).
    pub async fn dump_topic(&self, topic: &str, decoding: Decoding) -> Result<Vec<Log>, String> {
        let dirs = self.partitions(topic);
        if dirs.is_empty() {
            return Ok(Vec::new());
        }
        self.dump(&dirs, decoding).await
    }

    /// The segments (`*.log`, active one included) of the partition directories `dirs`.
    pub async fn dump(&self, dirs: &[PathBuf], decoding: Decoding) -> Result<Vec<Log>, String> {
        let files: Vec<String> =
            dirs.iter().flat_map(|dir| segments(dir)).map(|file| file.display().to_string()).collect();
        if files.is_empty() {
            return Ok(Vec::new());
        }
        let mut command = tokio::process::Command::new("java");
        command.args([
            "-Xmx512m",
            "-cp",
            self.classpath.as_str(),
            DUMP_CLASS,
            "--files",
            files.join(",").as_str(),
        ]);
        match decoding {
            Decoding::Offsets => command.arg("--offsets-decoder"),
            Decoding::TransactionLog => command.arg("--transaction-log-decoder"),
            Decoding::Data => command.args(["--print-data-log", "--deep-iteration"]),
        };
        let output =
            tokio::time::timeout(std::time::Duration::from_secs(300), command.kill_on_drop(true).output())
                .await
                .map_err(|_| format!("DumpLogSegments on {dirs:?} ran for 300 s"))?
                .map_err(|error| format!("java (DumpLogSegments): {error}"))?;
        if !output.status.success() {
            return Err(format!(
                "DumpLogSegments on {dirs:?} failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).lines().take(5).collect::<Vec<_>>().join(" / ")
            ));
        }
        Ok(parse(&String::from_utf8_lossy(&output.stdout)))
    }
}

/// A partition directory's segment files, oldest first.
fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| entry.path())
                .filter(|path| path.extension().is_some_and(|extension| extension == "log"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// How a transaction ended on one partition: its control record there.
#[derive(Debug, Clone, PartialEq)]
pub struct Marker {
    pub kind: String,
    pub offset: i64,
    pub epoch: i64,
    pub time: i64,
}

/// One offset-commit record on `__consumer_offsets` and how it took effect.
#[derive(Debug, Clone, PartialEq)]
pub struct OffsetCommit {
    /// The `__consumer_offsets` partition and the record's offset there.
    pub log: String,
    pub at: i64,
    pub producer_id: i64,
    pub producer_epoch: i64,
    pub transactional: bool,
    pub group: String,
    pub topic: String,
    pub partition: i32,
    /// The committed offset (the next one to read); `None` for a tombstone.
    pub offset: Option<i64>,
    pub commit_time: i64,
    /// The marker that ended its transaction on this partition (`None`: still open, or not
    /// transactional).
    pub end: Option<Marker>,
}

impl OffsetCommit {
    /// Where on its `__consumer_offsets` partition it took effect: a plain commit at its record,
    /// a transactional one at its COMMIT marker; `None` if it never did (aborted or open).
    pub fn effective(&self) -> Option<i64> {
        if !self.transactional {
            return Some(self.at);
        }
        self.end.as_ref().filter(|marker| marker.kind == "COMMIT").map(|marker| marker.offset)
    }
}

/// The marker after batch `index` of `log` from the same producer id: the end of that batch's
/// transaction on this partition (a producer has one transaction open at a time).
fn marker_after(log: &Log, index: usize) -> Option<Marker> {
    let producer = log.batches[index].producer_id;
    log.batches[index + 1..].iter().filter(|batch| batch.producer_id == producer && batch.control).find_map(
        |batch| {
            Some(Marker {
                kind: batch.marker()?.to_owned(),
                offset: batch.base_offset,
                epoch: batch.producer_epoch,
                time: batch.create_time,
            })
        },
    )
}

/// Every offset commit of `group` on `topic` in the dumped `__consumer_offsets` logs.
pub fn offset_commits(logs: &[Log], group: &str, topic: &str) -> Vec<OffsetCommit> {
    let mut commits = Vec::new();
    for log in logs {
        for (index, batch) in log.batches.iter().enumerate() {
            if batch.control {
                continue;
            }
            for record in &batch.records {
                let Some(key) =
                    record.key.as_deref().and_then(|key| serde_json::from_str::<serde_json::Value>(key).ok())
                else {
                    continue;
                };
                // OffsetCommitKey: record types 0 and 1
                let data = &key["data"];
                if !matches!(key["type"].as_str(), Some("0" | "1"))
                    || data["group"] != group
                    || data["topic"] != topic
                {
                    continue;
                }
                let value = record
                    .payload
                    .as_deref()
                    .and_then(|payload| serde_json::from_str::<serde_json::Value>(payload).ok());
                commits.push(OffsetCommit {
                    log: log.name.clone(),
                    at: record.offset,
                    producer_id: batch.producer_id,
                    producer_epoch: batch.producer_epoch,
                    transactional: batch.transactional,
                    group: group.to_owned(),
                    topic: topic.to_owned(),
                    partition: data["partition"].as_i64().unwrap_or(-1) as i32,
                    offset: value.as_ref().and_then(|value| value["data"]["offset"].as_i64()),
                    commit_time: value
                        .as_ref()
                        .and_then(|value| value["data"]["commitTimestamp"].as_i64())
                        .unwrap_or(record.create_time),
                    end: if batch.transactional { marker_after(log, index) } else { None },
                });
            }
        }
    }
    commits
}

/// One ending of a transaction, from the transaction log: its PrepareCommit or PrepareAbort
/// entry (the partitions it wrote) and when the coordinator finished writing its markers.
#[derive(Debug, Clone, PartialEq)]
pub struct TransactionEnd {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i64,
    pub commit: bool,
    pub partitions: BTreeSet<(String, i32)>,
    /// CreateTime of the Prepare entry: its markers are written after it…
    pub prepared_at: i64,
    /// …and before the Complete entry that follows it (`None`: not completed yet).
    pub completed_at: Option<i64>,
}

impl TransactionEnd {
    /// Whether a marker written at `time` (ms) lies within its markers' window.
    pub fn covers(&self, time: i64) -> bool {
        self.prepared_at <= time && self.completed_at.is_none_or(|completed| time <= completed)
    }
}

/// Every transaction end the dumped `__transaction_state` logs hold, in log order per id.
pub fn transaction_ends(logs: &[Log]) -> Vec<TransactionEnd> {
    let mut ends: Vec<TransactionEnd> = Vec::new();
    for log in logs {
        for batch in &log.batches {
            for record in &batch.records {
                let parse = |text: Option<&str>| {
                    text.and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
                };
                let (Some(key), Some(value)) =
                    (parse(record.key.as_deref()), parse(record.payload.as_deref()))
                else {
                    continue;
                };
                let Some(id) = key["data"]["transactionalId"].as_str() else { continue };
                let data = &value["data"];
                // TransactionState: 2 PrepareCommit, 3 PrepareAbort, 4 CompleteCommit, 5 CompleteAbort
                match data["transactionStatus"].as_i64() {
                    Some(status @ (2 | 3)) => {
                        let partitions = data["transactionPartitions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .flat_map(|entry| {
                                let topic = entry["topic"].as_str().unwrap_or_default().to_owned();
                                entry["partitionIds"]
                                    .as_array()
                                    .into_iter()
                                    .flatten()
                                    .filter_map(|id| id.as_i64())
                                    .map(move |id| (topic.clone(), id as i32))
                            })
                            .collect();
                        ends.push(TransactionEnd {
                            transactional_id: id.to_owned(),
                            producer_id: data["producerId"].as_i64().unwrap_or(-1),
                            producer_epoch: data["producerEpoch"].as_i64().unwrap_or(-1),
                            commit: status == 2,
                            partitions,
                            prepared_at: record.create_time,
                            completed_at: None,
                        });
                    }
                    Some(4 | 5) => {
                        if let Some(end) = ends
                            .iter_mut()
                            .rev()
                            .find(|end| end.transactional_id == id && end.completed_at.is_none())
                        {
                            end.completed_at = Some(record.create_time);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    ends
}

/// A record one transaction wrote on an output partition.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    pub log: String,
    pub offset: i64,
    pub producer_epoch: i64,
    pub payload: String,
    pub marker: Marker,
}

impl Written {
    /// The payload's `transferenciaId`.
    pub fn transfer(&self) -> Option<String> {
        let value: serde_json::Value = serde_json::from_str(&self.payload).ok()?;
        value["transferenciaId"].as_str().map(str::to_owned)
    }
}

/// What `producer_id` wrote on `log` in the transaction whose markers lie in `window` (its
/// first marker there inside the window; the records after its previous marker there), with
/// that marker; `None` when no marker of that producer id on `log` lies in the window.
pub fn written_in(
    log: &Log,
    producer_id: i64,
    window: &dyn Fn(i64) -> bool,
) -> Option<(Marker, Vec<Written>)> {
    let mut pending: Vec<&Batch> = Vec::new();
    for batch in log.batches.iter().filter(|batch| batch.producer_id == producer_id) {
        if !batch.control {
            pending.push(batch);
            continue;
        }
        let Some(kind) = batch.marker() else { continue };
        let marker = Marker {
            kind: kind.to_owned(),
            offset: batch.base_offset,
            epoch: batch.producer_epoch,
            time: batch.create_time,
        };
        if window(batch.create_time) {
            let written = pending
                .iter()
                .flat_map(|batch| {
                    let marker = marker.clone();
                    batch.records.iter().map(move |record| Written {
                        log: log.name.clone(),
                        offset: record.offset,
                        producer_epoch: batch.producer_epoch,
                        payload: record.payload.clone().unwrap_or_default(),
                        marker: marker.clone(),
                    })
                })
                .collect();
            return Some((marker, written));
        }
        pending.clear();
    }
    None
}

/// What the broker's logs say about one group's commits and one producer's outputs.
#[derive(Debug, Default)]
pub struct Evidence {
    pub offsets: Vec<Log>,
    pub transactions: Vec<Log>,
    pub outputs: Vec<Log>,
    /// What could not be read (each a line for the report).
    pub notes: Vec<String>,
}

/// The transactional commit of `group` on `topic`/`partition` that first moved the committed
/// offset past `offset`, and what its transaction wrote.
#[derive(Debug)]
pub struct Passing {
    pub commit: OffsetCommit,
    /// The group's committed offset on the partition just before it took effect (`None`: none).
    pub previous: Option<i64>,
    pub transaction: Option<TransactionEnd>,
    /// Per output partition the transaction wrote: its marker and records there.
    pub outputs: Vec<(String, Marker, Vec<Written>)>,
    pub notes: Vec<String>,
}

impl Evidence {
    /// Dumps `__consumer_offsets`, `__transaction_state` and the `outputs` topics of the broker
    /// at `bootstrap`; what fails becomes a note.
    pub async fn gather(bootstrap: &str, outputs: &[String]) -> Self {
        let mut evidence = Self::default();
        let broker = match Broker::locate(bootstrap) {
            Ok(broker) => broker,
            Err(error) => {
                evidence.notes.push(error);
                return evidence;
            }
        };
        evidence.notes.push(format!("reading the broker's log directories {:?}", broker.log_dirs));
        match broker.dump_topic(OFFSETS_TOPIC, Decoding::Offsets).await {
            Ok(logs) if logs.is_empty() => evidence.notes.push(format!("no {OFFSETS_TOPIC} partition there")),
            Ok(logs) => evidence.offsets = logs,
            Err(error) => evidence.notes.push(error),
        }
        match broker.dump_topic(TRANSACTION_TOPIC, Decoding::TransactionLog).await {
            Ok(logs) => evidence.transactions = logs,
            Err(error) => evidence.notes.push(error),
        }
        for topic in outputs {
            match broker.dump_topic(topic, Decoding::Data).await {
                Ok(logs) if logs.is_empty() => evidence.notes.push(format!("no partition of {topic} there")),
                Ok(logs) => evidence.outputs.extend(logs),
                Err(error) => evidence.notes.push(error),
            }
        }
        evidence
    }

    /// The commit that passed `offset` on `topic`/`partition` for `group` (see [`Passing`]):
    /// the first, in the order they took effect, whose offset is greater than `offset`.
    pub fn passing(&self, group: &str, topic: &str, partition: i32, offset: i64) -> Result<Passing, String> {
        let mut commits: Vec<OffsetCommit> = offset_commits(&self.offsets, group, topic)
            .into_iter()
            .filter(|commit| commit.partition == partition && commit.effective().is_some())
            .collect();
        commits.sort_by_key(|commit| (commit.log.clone(), commit.effective()));
        let Some(index) =
            commits.iter().position(|commit| commit.offset.is_some_and(|committed| committed > offset))
        else {
            return Err(format!(
                "no committed offset commit of {group} on {topic}/{partition} past {offset} in {OFFSETS_TOPIC} \
                 ({} took effect there; compacted away?)",
                commits.len()
            ));
        };
        let commit = commits[index].clone();
        let previous = index.checked_sub(1).and_then(|before| commits[before].offset);
        let mut passing =
            Passing { commit, previous, transaction: None, outputs: Vec::new(), notes: Vec::new() };
        let commit = &passing.commit;
        let Some(end) = commit.end.clone() else {
            passing.notes.push("a plain (non-transactional) commit: no transaction wrote it".into());
            return Ok(passing);
        };
        let (offsets_topic, offsets_partition) = partition_of(&commit.log).unwrap_or((OFFSETS_TOPIC, -1));
        let offsets_partition = (offsets_topic.to_owned(), offsets_partition);
        let ends = transaction_ends(&self.transactions);
        let candidates: Vec<&TransactionEnd> = ends
            .iter()
            .filter(|txn| {
                txn.producer_id == commit.producer_id && txn.partitions.contains(&offsets_partition)
            })
            .filter(|txn| txn.covers(end.time))
            .collect();
        let transaction = match candidates.as_slice() {
            [one] => Some((*one).clone()),
            [] => {
                passing.notes.push(format!(
                    "no entry of producer id {} in {TRANSACTION_TOPIC} ends a transaction around its marker \
                     (written at {}): its outputs are taken by marker time alone",
                    commit.producer_id, end.time
                ));
                None
            }
            several => {
                passing.notes.push(format!(
                    "{} transaction ends of producer id {} around its marker; taking the first",
                    several.len(),
                    commit.producer_id
                ));
                Some(several[0].clone())
            }
        };
        for log in &self.outputs {
            let wrote = match &transaction {
                Some(txn) => {
                    if !txn.partitions.contains(&(log.topic.clone(), log.partition)) {
                        continue;
                    }
                    written_in(log, commit.producer_id, &|time: i64| txn.covers(time))
                }
                None => written_in(log, commit.producer_id, &|time: i64| (time - end.time).abs() <= 5),
            };
            match wrote {
                Some((marker, written)) => passing.outputs.push((log.name.clone(), marker, written)),
                None if transaction.is_some() => passing.notes.push(format!(
                    "the transaction wrote {} but no marker of producer id {} lies in its window there",
                    log.name, commit.producer_id
                )),
                None => {}
            }
        }
        passing.transaction = transaction;
        Ok(passing)
    }
}

impl Passing {
    /// The report's lines; `transfer`: the lost transfer's id, looked for among the outputs.
    pub fn report(&self, transfer: Option<&str>) -> Vec<String> {
        let commit = &self.commit;
        let mut lines = vec![format!(
            "commit that passed it: {}/{} offset {} (previous committed {}: the commit claims [{}, {})), \
             {} at {}/{}, producer id {} epoch {}, {}",
            commit.topic,
            commit.partition,
            commit.offset.map_or("none".into(), |offset| offset.to_string()),
            self.previous.map_or("none".into(), |offset| offset.to_string()),
            self.previous.map_or("?".into(), |offset| offset.to_string()),
            commit.offset.map_or("?".into(), |offset| offset.to_string()),
            if commit.transactional { "TxnOffsetCommit" } else { "OffsetCommit" },
            commit.log,
            commit.at,
            commit.producer_id,
            commit.producer_epoch,
            match &commit.end {
                Some(marker) => format!(
                    "ended by {} marker at {}/{} (epoch {}, written at {})",
                    marker.kind, commit.log, marker.offset, marker.epoch, marker.time
                ),
                None => "no marker".into(),
            }
        )];
        if let Some(txn) = &self.transaction {
            lines.push(format!(
                "its transaction: transactional.id {}, {} of {:?} (prepared at {}, completed at {})",
                txn.transactional_id,
                if txn.commit { "commit" } else { "abort" },
                txn.partitions
                    .iter()
                    .map(|(topic, partition)| format!("{topic}-{partition}"))
                    .collect::<Vec<_>>(),
                txn.prepared_at,
                txn.completed_at.map_or("never".into(), |time| time.to_string())
            ));
        }
        let mut found = false;
        for (log, marker, written) in &self.outputs {
            let transfers: Vec<String> = written
                .iter()
                .map(|record| {
                    let id = record.transfer().unwrap_or_else(|| format!("? ({})", record.payload));
                    found |= transfer.is_some_and(|transfer| id == transfer);
                    format!("{}:{id}", record.offset)
                })
                .collect();
            lines.push(format!(
                "it wrote {} record(s) on {log} ({} marker at {}): {transfers:?}",
                written.len(),
                marker.kind,
                marker.offset
            ));
        }
        if self.outputs.is_empty() {
            lines.push("it wrote no record on the output topics".into());
        }
        if let Some(transfer) = transfer {
            lines.push(format!(
                "lost transfer {transfer} {} among that transaction's outputs",
                if found { "IS" } else { "is NOT" }
            ));
        }
        lines.extend(self.notes.iter().map(|note| format!("note: {note}")));
        lines
    }
}
