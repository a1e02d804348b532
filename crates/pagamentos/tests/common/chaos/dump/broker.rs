//! The broker's log directories, found from the `scripts/stack` state, and DumpLogSegments run
//! on a topic's partitions.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::segments::{parse, partition_of, Log};

/// The Kafka version `scripts/stack` runs (its `KAFKA_VERSION`).
const KAFKA_VERSION: &str = "4.3.1";
const DUMP_CLASS: &str = "org.apache.kafka.tools.DumpLogSegments";

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
